import math

import pytest
import torch

from tandem.rollout import SamplingParams
from tandem.rollout.sampling import choose_tokens, filter_top_k_top_p, row_generators

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])
LOGITS = PROBS.log()[None]


def kept(logits: torch.Tensor) -> list[int]:
    return logits[0].isfinite().nonzero().flatten().tolist()


@pytest.mark.parametrize(
    "top_k, top_p, expected",
    [
        (-1, 1.0, [0, 1, 2, 3]),
        (2, 1.0, [0, 1]),
        (4, 1.0, [0, 1, 2, 3]),
        (10, 1.0, [0, 1, 2, 3]),  # k above the vocabulary is no filter
        (-1, 0.6, [0, 1]),  # 0.5 < 0.6, 0.5 + 0.3 reaches it
        (-1, 0.3, [0]),  # the most likely token always stays
        (-1, 0.9, [0, 1, 2]),
        # top-p acts on top-k's renormalised probabilities (0.526, 0.316, 0.158): 0.842 >= 0.83 drops
        # token 2, which the raw probabilities (0.5 + 0.3 = 0.8 < 0.83) would keep.
        (3, 0.83, [0, 1]),
    ],
)
def test_filter_top_k_top_p(top_k, top_p, expected):
    assert kept(filter_top_k_top_p(LOGITS, top_k, top_p)) == expected
    # The order of the vocabulary does not matter.
    perm = torch.tensor([2, 0, 3, 1])
    assert sorted(perm[kept(filter_top_k_top_p(LOGITS[:, perm], top_k, top_p))].tolist()) == expected


def test_top_k_keeps_ties():
    assert kept(filter_top_k_top_p(torch.tensor([[1.0, 2.0, 2.0, 0.0]]), top_k=1)) == [1, 2]


def test_sampled_log_prob_is_the_unfiltered_tempered_one():
    sampling = SamplingParams(max_tokens=1, temperature=0.5, top_k=2, seed=0)
    logits = LOGITS.expand(64, -1)
    tokens, log_probs = choose_tokens(logits, sampling, row_generators(0, torch.arange(64), logits.device))
    assert set(tokens.tolist()) == {0, 1}
    expected = (LOGITS[0] / 0.5).log_softmax(-1)[tokens]
    torch.testing.assert_close(log_probs, expected)


def test_greedy_log_prob_is_at_temperature_one():
    tokens, log_probs = choose_tokens(LOGITS, SamplingParams(max_tokens=1, temperature=0))
    assert tokens.tolist() == [0]
    assert log_probs.item() == pytest.approx(math.log(0.5), abs=1e-6)


@pytest.mark.parametrize("seeded", [True, False])
def test_draws_follow_softmax_of_logits_over_temperature(seeded):
    rows, temperature = 4000, 2.0
    sampling = SamplingParams(max_tokens=1, temperature=temperature, seed=7 if seeded else None)
    generators = row_generators(7, torch.arange(rows), torch.device("cpu")) if seeded else None
    tokens, _ = choose_tokens(LOGITS.expand(rows, -1), sampling, generators)
    frequencies = torch.bincount(tokens, minlength=4).float() / rows
    expected = (LOGITS[0] / temperature).softmax(-1)  # sqrt of PROBS, renormalised
    torch.testing.assert_close(frequencies, expected, atol=0.03, rtol=0)


def test_inactive_rows_are_skipped_and_do_not_advance_their_stream():
    sampling = SamplingParams(max_tokens=1, temperature=1.0, seed=0)
    logits = LOGITS.expand(3, -1)
    generators = row_generators(0, torch.arange(3), torch.device("cpu"))
    active = torch.tensor([True, False, True])
    choose_tokens(logits, sampling, generators, active)
    fresh = row_generators(0, torch.arange(3), torch.device("cpu"))
    assert torch.equal(generators[1].get_state(), fresh[1].get_state())
    assert not torch.equal(generators[0].get_state(), fresh[0].get_state())


def test_row_streams_depend_on_seed_and_global_row_only():
    whole = row_generators(11, torch.arange(6), torch.device("cpu"))
    tail = row_generators(11, torch.arange(3, 6), torch.device("cpu"))
    for a, b in zip(whole[3:], tail):
        assert torch.equal(torch.rand(4, generator=a), torch.rand(4, generator=b))
    other_seed = row_generators(12, torch.arange(6), torch.device("cpu"))
    assert not torch.equal(torch.rand(4, generator=whole[0]), torch.rand(4, generator=other_seed[0]))
