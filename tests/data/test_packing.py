"""Sequence packing layouts and token-balanced grouping, against layouts worked out by hand."""

from __future__ import annotations

import pytest
import torch

from tandem.data.packing import (
    balanced_groups,
    budget_groups,
    equal_count_groups,
    pack_model_inputs,
    plan_packing,
)

# Three samples in a padded [3, 6] batch: lengths 3 (left and right padding), 6 (full), 2.
MASK = torch.tensor(
    [
        [0, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1],
        [0, 0, 1, 1, 0, 0],
    ]
)
IDS = torch.tensor(
    [
        [0, 11, 12, 13, 0, 0],
        [21, 22, 23, 24, 25, 26],
        [0, 0, 31, 32, 0, 0],
    ]
)


def test_pack_longest_first_into_rows_as_wide_as_the_longest():
    inputs, packing = pack_model_inputs(IDS, MASK, pad_id=0)
    # Row 0: sample 1 alone (6 tokens). Row 1: sample 0 (3) then sample 2 (2), one free slot.
    assert packing.packed_shape == (2, 6)
    assert inputs["input_ids"].tolist() == [[21, 22, 23, 24, 25, 26], [11, 12, 13, 31, 32, 0]]
    # Positions restart per sequence; the free slot starts a "sequence" of its own at 0.
    assert inputs["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5], [0, 1, 2, 0, 1, 0]]
    assert packing.num_tokens == 11


def test_aligned_packing_starts_and_sizes_every_sequence_in_multiples():
    """align=4 (context parallel 2: 2 x 2 chunks per sequence): lengths 3, 6, 2 take 4, 8, 4 slots."""
    inputs, packing = pack_model_inputs(IDS, MASK, pad_id=0, align=4)
    # Row 0: sample 1 (6 tokens + 2 free). Row 1: sample 0 (3 + 1 free), sample 2 at column 4 (2 + 2 free).
    assert packing.packed_shape == (2, 8)
    assert inputs["input_ids"].tolist() == [[21, 22, 23, 24, 25, 26, 0, 0], [11, 12, 13, 0, 31, 32, 0, 0]]
    assert inputs["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 0, 1], [0, 1, 2, 0, 0, 1, 0, 1]]
    assert torch.equal(packing.unpack(packing.pack(IDS)), IDS * MASK)


def test_unpack_inverts_pack_and_fills_padding():
    packing = plan_packing(MASK)
    values = torch.arange(18, dtype=torch.float32).view(3, 6) + 1
    round_trip = packing.unpack(packing.pack(values), fill=-1)
    assert torch.equal(round_trip, torch.where(MASK.bool(), values, torch.tensor(-1.0)))
    # Trailing dimensions (vocab, value head) travel along.
    wide = torch.randn(3, 6, 5)
    assert torch.equal(packing.unpack(packing.pack(wide))[MASK.bool()], wide[MASK.bool()])


def test_packed_index_maps_every_real_position_and_marks_padding():
    index = plan_packing(MASK).packed_index()
    assert index.tolist() == [
        [-1, 6, 7, 8, -1, -1],
        [0, 1, 2, 3, 4, 5],
        [-1, -1, 9, 10, -1, -1],
    ]


def test_unpack_is_differentiable():
    packing = plan_packing(MASK)
    packed = torch.randn(*packing.packed_shape, requires_grad=True)
    packing.unpack(packed).sum().backward()
    # Every slot that holds a real token gets gradient 1, the free slot 0.
    assert packed.grad.tolist() == [[1.0] * 6, [1.0] * 5 + [0.0]]


def test_a_gap_inside_a_row_is_refused_with_the_row():
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    with pytest.raises(ValueError, match="row 1 of the attention mask has a gap"):
        plan_packing(mask)


def test_an_empty_row_takes_no_slot():
    mask = torch.tensor([[0, 0, 0], [1, 1, 0]])
    packing = plan_packing(mask)
    assert packing.packed_shape == (1, 2)
    assert packing.packed_index().tolist() == [[-1, -1, -1], [0, 1, -1]]


def test_balanced_groups_longest_first_to_the_lightest():
    # 9 -> g0, 7 -> g1, 5 -> g1 (7 < 9), 4 -> g0 (9 < 12), 1 -> g1 (12 < 13)
    assert balanced_groups([5, 9, 1, 7, 4], 2) == [[1, 4], [0, 2, 3]]
    assert balanced_groups([3, 3], 3) == [[0], [1], []]


def test_budget_groups_fewest_under_the_budget():
    lengths = [6, 5, 4, 3, 2]  # 20 tokens
    groups = budget_groups(lengths, 10)
    assert len(groups) == 2
    assert all(sum(lengths[i] for i in g) <= 10 for g in groups)
    assert sorted(i for g in groups for i in g) == list(range(5))
    # min_groups (the count another rank needs) splits further; never an empty group.
    assert len(budget_groups(lengths, 10, min_groups=4)) == 4
    assert len(budget_groups([1, 1], 10, min_groups=5)) == 2
    # Balancing 6 4 | 5 3 2 greedily gives 6 3 2 = 11 > 10: first fit then finds 6 4 | 5 3 2.
    assert budget_groups(lengths, 10) == [[0, 2], [1, 3, 4]]


def test_budget_groups_names_the_sample_that_cannot_fit():
    with pytest.raises(ValueError, match=r"sample 2 has 12 tokens.*budget of 10.*max_tokens_per_micro_batch"):
        budget_groups([3, 4, 12], 10)


def test_equal_count_groups_keep_sizes_and_balance_tokens():
    lengths = [10, 1, 1, 1, 9, 1]
    groups = equal_count_groups(lengths, [3, 3])
    assert [len(g) for g in groups] == [3, 3]
    assert sorted(sum(lengths[i] for i in g) for g in groups) == [11, 12]
    # A plain contiguous split would give 12 and 11 as well here; this one would give 20 and 3:
    assert equal_count_groups([10, 9, 8, 1, 1, 1], [3, 3]) == [[0, 3, 4], [1, 2, 5]]
    with pytest.raises(ValueError, match="do not add up"):
        equal_count_groups([1, 2], [3])
