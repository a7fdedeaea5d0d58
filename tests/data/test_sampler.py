import itertools

import pytest

from tandem.data import StatefulSampler


def take(sampler: StatefulSampler, n: int) -> list[list[int]]:
    """The next ``n`` batches, running into further epochs as a trainer loop does."""
    out: list[list[int]] = []
    while len(out) < n:
        out.extend(itertools.islice(iter(sampler), n - len(out)))
    return out


def test_epoch_is_a_permutation_in_full_batches():
    sampler = StatefulSampler(10, 3, seed=1)
    assert len(sampler) == 3
    epoch = list(sampler)
    assert [len(b) for b in epoch] == [3, 3, 3]
    assert len(set(itertools.chain(*epoch))) == 9
    assert sampler.state_dict()["epoch"] == 1 and sampler.state_dict()["position"] == 0
    assert list(sampler) != epoch  # a new order each epoch
    assert StatefulSampler(10, 3, seed=1).order(1) == sampler.order(1)
    assert StatefulSampler(10, 3, seed=2).order(0) != sampler.order(0)


def test_no_shuffle_and_keep_last():
    sampler = StatefulSampler(7, 3, shuffle=False, drop_last=False)
    assert len(sampler) == 3
    assert list(sampler) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(sampler) == [[0, 1, 2], [3, 4, 5], [6]]


@pytest.mark.parametrize("consumed", [0, 1, 2, 3, 4, 7, 8])
def test_resume_equals_uninterrupted(consumed):
    """10 items in batches of 3 (3 batches an epoch): stop after ``consumed`` batches, including
    mid-epoch (1, 2, 4, 7) and exactly at epoch boundaries (3), then resume in a new sampler."""
    uninterrupted = take(StatefulSampler(10, 3, seed=4), 12)

    first = StatefulSampler(10, 3, seed=4)
    seen = take(first, consumed)
    state = first.state_dict()
    resumed = StatefulSampler(10, 3, seed=4)
    resumed.load_state_dict(state)
    assert seen + take(resumed, 12 - consumed) == uninterrupted


def test_state_at_epoch_boundary_points_at_next_epoch():
    sampler = StatefulSampler(6, 2, seed=0)
    batches = iter(sampler)
    for _ in range(3):
        next(batches)
    # the epoch's last batch was handed out; the for loop has not asked for more yet
    assert (sampler.state_dict()["epoch"], sampler.state_dict()["position"]) == (1, 0)
    resumed = StatefulSampler(6, 2, seed=0)
    resumed.load_state_dict(sampler.state_dict())
    assert list(resumed) == [sampler.order(1)[i : i + 2] for i in (0, 2, 4)]


def test_mismatched_state_and_bad_sizes():
    state = StatefulSampler(10, 3, seed=4).state_dict()
    with pytest.raises(ValueError, match="saved with num_items=10 but now has num_items=11"):
        StatefulSampler(11, 3, seed=4).load_state_dict(state)
    with pytest.raises(ValueError, match="saved with seed=4"):
        StatefulSampler(10, 3, seed=5).load_state_dict(state)
    with pytest.raises(ValueError, match="fewer than one batch"):
        StatefulSampler(2, 3)
    with pytest.raises(ValueError, match="empty"):
        StatefulSampler(0, 3)
