"""Split / merge of worker-group calls, without Ray: the pure functions behind every dispatch mode."""

import pytest
import torch

from tandem.batch import Batch
from tandem.controller import Dispatch, DispatchError, dispatch
from tandem.controller.dispatch import RankLayout, dispatch_mode, merge_outputs, plan_call


def rows(n: int) -> Batch:
    return Batch({"x": torch.arange(float(n))}, {"uid": [f"u{i}" for i in range(n)]}, {"step": 3})


def fake_worker(rank_args: tuple, tag: int) -> Batch:
    """What a rank would return: its rows' x doubled and the rank that computed them."""
    (batch,) = rank_args
    return Batch({"y": batch["x"] * 2, "rank": torch.full((len(batch),), tag)}, {"uid": batch["uid"]})


def test_decorator_stores_the_mode_and_undecorated_is_one_to_all():
    class W:
        @dispatch(Dispatch.DP)
        def score(self):
            pass

        def info(self):
            pass

    assert dispatch_mode(W.score) is Dispatch.DP
    assert dispatch_mode(W().score) is Dispatch.DP
    assert dispatch_mode(W.info) is Dispatch.ONE_TO_ALL


def test_decorator_without_a_mode_says_how_to_write_it():
    with pytest.raises(TypeError, match=r"@dispatch\(Dispatch.DP\)"):

        @dispatch
        def score(self):
            pass


def test_one_to_all_and_rank_zero_send_the_same_arguments_everywhere():
    b = rows(3)
    for mode in (Dispatch.ONE_TO_ALL, Dispatch.RANK_ZERO):
        plan = plan_call(mode, 3, (b, 1), {"k": "v"})
        assert all(args[0] is b and args[1] == 1 and kwargs == {"k": "v"} for args, kwargs in plan.rank_calls)
    assert plan_call(Dispatch.ONE_TO_ALL, 3, (), {}).gather(["a", "b", "c"]) == ["a", "b", "c"]
    assert plan_call(Dispatch.RANK_ZERO, 3, (), {}).gather(["a", "b", "c"]) == "a"


def test_dp_uneven_split_and_merge_restore_the_order():
    b = rows(5)
    plan = plan_call(Dispatch.DP, 2, (b,), {})
    parts = [args[0] for args, _ in plan.rank_calls]
    assert [p["x"].tolist() for p in parts] == [[0.0, 1.0, 2.0], [3.0, 4.0]]
    # gather gets the outputs in rank order and puts every row back where it came from
    merged = plan.gather([fake_worker(args, r) for r, (args, _) in enumerate(plan.rank_calls)])
    assert merged["y"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert merged["rank"].tolist() == [0, 0, 0, 1, 1]
    assert list(merged["uid"]) == [f"u{i}" for i in range(5)]


def test_dp_one_row_over_two_ranks_gives_an_empty_part():
    plan = plan_call(Dispatch.DP, 2, (rows(1),), {})
    assert [len(args[0]) for args, _ in plan.rank_calls] == [1, 0]
    merged = plan.gather([fake_worker(args, r) for r, (args, _) in enumerate(plan.rank_calls)])
    assert merged["y"].tolist() == [0.0] and list(merged["uid"]) == ["u0"]


def test_dp_splits_keyword_batches_alike_and_passes_other_arguments_unchanged():
    b, other = rows(5), Batch({"z": torch.arange(5) * 10})
    plan = plan_call(Dispatch.DP, 2, (b, 0.5), {"other": other, "name": "n"})
    for args, kwargs in plan.rank_calls:
        assert args[1] == 0.5 and kwargs["name"] == "n"
        assert (kwargs["other"]["z"] == args[0]["x"].long() * 10).all()  # row i of both stays together


def test_dp_rejects_batches_of_different_lengths():
    with pytest.raises(DispatchError, match=r"same number of rows.*argument 0=5 rows.*other=4 rows"):
        plan_call(Dispatch.DP, 2, (rows(5),), {"other": rows(4)})


def test_dp_outputs_that_are_not_batches():
    plan = plan_call(Dispatch.DP, 2, (rows(5),), {})
    assert plan.gather([None, None]) is None
    assert plan.gather([3, 2]) == [3, 2]
    with pytest.raises(DispatchError, match="mix Batch"):
        plan.gather([rows(3), None])


def test_dp_without_batch_arguments_concatenates_batch_outputs_in_rank_order():
    plan = plan_call(Dispatch.DP, 2, (), {})
    assert merge_outputs([rows(2), rows(1)], plan.partition)["x"].tolist() == [0.0, 1.0, 0.0]


def test_mp_dp2_over_4_ranks_sends_a_dp_group_the_same_rows_and_keeps_one_output_each():
    # ranks (0, 1) form data-parallel group 0 and (2, 3) group 1; tensor-parallel rank 1 is collected
    infos = [(0, 2, False), (0, 2, True), (1, 2, False), (1, 2, True)]
    layout = RankLayout.from_dispatch_info(infos)
    assert layout.dp_ranks == (0, 0, 1, 1) and layout.collectors == (1, 3)
    plan = plan_call(Dispatch.MP, 4, (rows(5),), {}, layout)
    parts = [args[0]["x"].tolist() for args, _ in plan.rank_calls]
    assert parts == [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0], [3.0, 4.0], [3.0, 4.0]]
    merged = plan.gather([fake_worker(args, r) for r, (args, _) in enumerate(plan.rank_calls)])
    assert merged["y"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert merged["rank"].tolist() == [1, 1, 1, 3, 3]  # the collectors' outputs only


def test_mp_without_a_layout_is_an_error():
    with pytest.raises(DispatchError, match="RankLayout"):
        plan_call(Dispatch.MP, 2, (rows(2),), {})
    with pytest.raises(DispatchError, match=r"workers' replica_info\(\)"):
        plan_call(Dispatch.REPLICA, 2, (rows(2),), {})


def test_replica_sends_the_ranks_of_one_engine_the_same_rows():
    # 4 ranks, engines of 2 ranks each (rollout.tensor_parallel=2): the first rank of each answers
    layout = RankLayout.from_dispatch_info([(0, 2, True), (0, 2, False), (1, 2, True), (1, 2, False)])
    plan = plan_call(Dispatch.REPLICA, 4, (rows(3),), {}, layout)
    assert [args[0]["x"].tolist() for args, _ in plan.rank_calls] == [[0.0, 1.0], [0.0, 1.0], [2.0], [2.0]]
    merged = plan.gather([fake_worker(args, r) for r, (args, _) in enumerate(plan.rank_calls)])
    assert merged["rank"].tolist() == [0, 0, 2]
    with pytest.raises(DispatchError, match=r"rank 1's replica_info\(\) returned"):
        RankLayout.from_dispatch_info([(0, 1, True), (0, 1)], method="replica_info")


@pytest.mark.parametrize(
    "infos, message",
    [
        (
            [(0, 2, True), (0, 2, True), (1, 2, True), (1, 2, False)],
            r"group 0 .* ranks \[0, 1\] said collect",
        ),
        ([(0, 2, True), (0, 2, False), (1, 2, False), (1, 2, False)], r"group 1 .* none of ranks \[2, 3\]"),
        ([(0, 2, True), (0, 2, False), (0, 2, False), (0, 2, False)], r"no rank has dp_rank \[1\]"),
        ([(0, 2, True), (1, 3, True)], "disagree on dp_size"),
        ([(0, 1, True), (1, 1, True)], "out of range"),
        ([(0, 1)], r"must return \(dp_rank: int, dp_size: int, collect: bool\)"),
    ],
)
def test_mp_layout_errors_name_the_ranks(infos, message):
    with pytest.raises(DispatchError, match=message):
        RankLayout.from_dispatch_info(infos, group="worker group 'actor'")
