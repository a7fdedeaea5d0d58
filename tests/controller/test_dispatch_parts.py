"""A method's own grouping of rows into data-parallel parts (`dispatch(mode, parts=...)`): every Batch
argument is cut by it, the outputs come back in row order, and the call's keywords reach it."""

import pytest
import torch

from tandem.batch import Batch
from tandem.controller.dispatch import Dispatch, dispatch, dispatch_parts, plan_call


def reversed_halves(batch, num_parts, call):
    """Part 0: the last rows, backwards; part 1: the first ones (`call["first"]` of them)."""
    first = call["first"]
    return [list(range(len(batch) - 1, first - 1, -1)), list(range(first))]


def test_parts_cut_every_batch_argument_and_the_merge_restores_row_order():
    rows = Batch.from_dict({"x": torch.arange(5)})
    same = Batch.from_dict({"y": torch.arange(5) * 10})
    plan = plan_call(Dispatch.DP, 2, (rows,), {"other": same, "first": 2}, parts=reversed_halves)
    (args0, kw0), (args1, kw1) = plan.rank_calls
    assert args0[0]["x"].tolist() == [4, 3, 2] and args1[0]["x"].tolist() == [0, 1]
    assert kw0["other"]["y"].tolist() == [40, 30, 20] and kw1["other"]["y"].tolist() == [0, 10]
    assert kw0["first"] == kw1["first"] == 2  # plain values reach every rank as they are
    outputs = [Batch.from_dict({"out": a[0]["x"] + 100}) for a, _ in plan.rank_calls]
    assert plan.gather(outputs)["out"].tolist() == [100, 101, 102, 103, 104]


def test_without_parts_the_split_is_even_and_contiguous():
    plan = plan_call(Dispatch.DP, 2, (Batch.from_dict({"x": torch.arange(5)}),), {})
    assert [call[0][0]["x"].tolist() for call in plan.rank_calls] == [[0, 1, 2], [3, 4]]


def test_the_decorator_records_parts_and_refuses_them_where_nothing_is_split():
    @dispatch(Dispatch.MP, parts=reversed_halves)
    def method(batch):
        return batch

    assert dispatch_parts(method) is reversed_halves
    with pytest.raises(TypeError, match="ONE_TO_ALL.* takes no parts"):
        dispatch(Dispatch.ONE_TO_ALL, parts=reversed_halves)
