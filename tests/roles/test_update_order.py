"""update_order: a contiguous data-parallel split then holds every rank's part of each mini-batch."""

import torch

from tandem.batch import Batch
from tandem.roles.common import balanced_parts, mini_batch_parts, update_order


def test_each_rank_gets_its_part_of_every_mini_batch():
    # 8 rows, 2 mini-batches [0..3] [4..7], 2 ranks: rank 0 gets 0,1 | 4,5 and rank 1 gets 2,3 | 6,7
    assert update_order(8, 2, 2) == [0, 1, 4, 5, 2, 3, 6, 7]
    assert update_order(8, 1, 2) == list(range(8))  # one rank: nothing moves
    assert update_order(6, 2, 1) == list(range(6))  # one mini-batch: the plain split
    # uneven: 7 rows -> mini-batches [0..3] [4..6]; their parts larger first, as Batch.chunk cuts them
    assert update_order(7, 2, 2) == [0, 1, 4, 5, 2, 3, 6]


def test_token_lengths_balance_each_mini_batch_over_the_ranks():
    # One mini-batch of 4 rows with tokens 9 8 1 2: a plain split gives rank 0 rows 0,1 (17 tokens) and
    # rank 1 rows 2,3 (3); balanced: 9+1 | 8+2 -> rows 0,2 | 1,3.
    assert update_order(4, 2, 1, [9, 8, 1, 2]) == [0, 2, 1, 3]
    # Two mini-batches: rows never leave their mini-batch, each rank still gets 2 rows of each.
    order = update_order(8, 2, 2, [9, 8, 1, 2, 5, 5, 5, 5])
    rank0, rank1 = order[:4], order[4:]
    assert set(rank0[:2]) | set(rank1[:2]) == {0, 1, 2, 3}
    assert set(rank0[2:]) | set(rank1[2:]) == {4, 5, 6, 7}
    assert update_order(8, 1, 2, [9, 8, 1, 2, 5, 5, 5, 5]) == list(range(8))  # one rank: unchanged


def test_balanced_parts_and_restore():
    mask = torch.zeros(6, 10, dtype=torch.long)
    for row, tokens in enumerate([10, 9, 8, 1, 1, 1]):
        mask[row, :tokens] = 1
    batch = Batch.from_dict({"attention_mask": mask, "row": torch.arange(6)})
    shards, partition = batch.partition(balanced_parts(batch, 2))
    assert [len(s) for s in shards] == [3, 3]
    assert sorted(int(s["attention_mask"].sum()) for s in shards) == [12, 18]  # a plain split: 27 and 3
    assert torch.equal(partition.merge(shards)["row"], torch.arange(6))
    assert balanced_parts(batch, 1) == [list(range(6))]


def test_mini_batch_parts_are_update_order_split_evenly():
    mask = torch.zeros(8, 10, dtype=torch.long)
    for row, tokens in enumerate([9, 8, 1, 2, 5, 5, 5, 5]):
        mask[row, :tokens] = 1
    batch = Batch.from_dict({"attention_mask": mask})
    order = update_order(8, 2, 2, [9, 8, 1, 2, 5, 5, 5, 5])
    assert mini_batch_parts(batch, 2, {"mini_batches": 2}) == [order[:4], order[4:]]
    assert mini_batch_parts(batch, 1, {"mini_batches": 2}) == [list(range(8))]


def test_balance_batch_false_keeps_the_rollout_order():
    # trainer.balance_batch=false (Batch.meta): contiguous parts, each mini-batch's rows in the rollout's order
    mask = torch.zeros(8, 10, dtype=torch.long)
    for row, tokens in enumerate([9, 8, 1, 2, 5, 5, 5, 5]):
        mask[row, :tokens] = 1
    batch = Batch.from_dict({"attention_mask": mask}, meta={"balance_batch": False})
    assert balanced_parts(batch, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # rank 0: the first halves of mini-batches 0 (rows 0-3) and 1 (rows 4-7); rank 1 the second halves
    assert mini_batch_parts(batch, 2, {"mini_batches": 2}) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    balanced = Batch.from_dict({"attention_mask": mask}, meta={"balance_batch": True})
    assert mini_batch_parts(balanced, 2, {"mini_batches": 2})[0] != [0, 1, 4, 5]  # by tokens: 9+1 | 8+2
