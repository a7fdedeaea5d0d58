"""update_order: a contiguous data-parallel split then holds every rank's part of each mini-batch."""

from tandem.roles.common import update_order


def test_each_rank_gets_its_part_of_every_mini_batch():
    # 8 rows, 2 mini-batches [0..3] [4..7], 2 ranks: rank 0 gets 0,1 | 4,5 and rank 1 gets 2,3 | 6,7
    assert update_order(8, 2, 2) == [0, 1, 4, 5, 2, 3, 6, 7]
    assert update_order(8, 1, 2) == list(range(8))  # one rank: nothing moves
    assert update_order(6, 2, 1) == list(range(6))  # one mini-batch: the plain split
    # uneven: 7 rows -> mini-batches [0..3] [4..6]; their parts larger first, as Batch.chunk cuts them
    assert update_order(7, 2, 2) == [0, 1, 4, 5, 2, 3, 6]
