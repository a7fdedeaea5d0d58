"""engine/megatron/context_parallel.py's split, by hand: each sequence of a row in 2 x CP equal chunks, CP rank r
holding chunks r and 2 CP - 1 - r of every one (megatron's load-balanced split, per sequence). The attention
and the gathers are checked against transformers and FSDP2 in test_megatron.py (layouts cp2, tp2spcp2)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from tandem.engine.megatron.context_parallel import sequence_columns


def test_every_sequence_of_a_row_is_split_in_its_own_zigzag():
    starts = torch.zeros(2, 12, dtype=torch.bool)
    starts[0, 8] = True  # row 0: sequences at columns 0-7 and 8-11
    # row 1: one sequence over the whole row
    rank0, rank1 = (sequence_columns(starts, rank, 2) for rank in (0, 1))
    # row 0: 0-7 in chunks of 2 -> rank 0 takes 0,1 and 6,7; 8-11 in chunks of 1 -> 8 and 11
    assert rank0.tolist() == [[0, 1, 6, 7, 8, 11], [0, 1, 2, 9, 10, 11]]
    assert rank1.tolist() == [[2, 3, 4, 5, 9, 10], [3, 4, 5, 6, 7, 8]]
    # every column of every row on exactly one rank
    assert torch.equal(torch.cat([rank0, rank1], dim=1).sort(dim=1).values, torch.arange(12).expand(2, 12))


def test_a_sequence_that_does_not_split_evenly_is_named():
    starts = torch.zeros(1, 8, dtype=torch.bool)
    starts[0, 3] = True
    with pytest.raises(
        ValueError, match=r"a sequence of 3 columns \(row 0, from column 0\) does not split into 2 x 2"
    ):
        sequence_columns(starts, 0, 2)
