"""The in-process backend: the same calls as over Ray, one worker in the test's own process."""

import pytest
import torch
import torch.distributed as dist

from tandem.batch import Batch
from tandem.controller import WorkerError, WorkerGroup

from .toy_workers import BrokenInit, ToyWorker


def rows(n: int) -> Batch:
    return Batch({"x": torch.arange(float(n))}, {"uid": [f"u{i}" for i in range(n)]})


@pytest.fixture
def group():
    g = WorkerGroup.inprocess(ToyWorker, name="solo", kwargs={"scale": 2.0})
    yield g
    g.shutdown()


def test_worker_sees_a_world_size_1_process_group(group):
    (info,) = group.info()
    assert info["backend"] == "inprocess" and info["world_size"] == 1 and info["dist_world_size"] == 1
    assert info["env"]["RANK"] == "0" and info["env"]["WORLD_SIZE"] == "1"
    assert group.rank_sum() == [1.0]  # a real all_reduce over the one rank
    assert group.rank_sum_once() == 1.0


def test_dispatch_modes_work_with_one_rank(group):
    out = group.score(rows(3), offset=1.0)
    assert out["score"].tolist() == [1.0, 3.0, 5.0] and list(out["uid"]) == ["u0", "u1", "u2"]
    assert group.score_mp(rows(2))["rows_all_ranks"].tolist() == [2.0, 2.0]
    assert group.count_rows(rows(2), other=rows(2)) == [4]
    b = rows(2)
    assert group.consume(b) is None
    assert "x" in b  # the worker popped from its own copy


def test_async_call_is_already_done(group):
    future = group.rank_sum.async_()
    assert future.done() and future.result() == [1.0]
    assert group.call_async("score", rows(1)).result()["score"].tolist() == [0.0]


def test_unknown_method_names_the_worker_class(group):
    with pytest.raises(AttributeError, match="ToyWorker has no public method 'nope'"):
        group.nope()
    with pytest.raises(AttributeError, match="ToyWorker has no public method '_private'"):
        group.call("_private")


def test_a_raising_method_becomes_a_worker_error_and_breaks_the_group(group):
    with pytest.raises(WorkerError) as info:
        group.fail("disk full")
    err = info.value
    assert err.rank == 0 and err.error_type == "ValueError" and "rank 0 says: disk full" in str(err)
    assert "toy_workers.py" in err.worker_traceback and "'solo'" in str(err)
    with pytest.raises(WorkerError, match="'solo' is broken.*disk full"):
        group.info()


def test_groups_share_the_process_group_and_the_last_one_destroys_it():
    was_initialised = dist.is_initialized()
    first = WorkerGroup.inprocess(ToyWorker, name="first")
    second = WorkerGroup.inprocess(ToyWorker, name="second")
    assert first.rank_sum() == second.rank_sum() == [1.0]
    first.shutdown()
    assert second.rank_sum() == [1.0]
    second.shutdown()
    second.shutdown()  # idempotent
    assert dist.is_initialized() == was_initialised
    with pytest.raises(WorkerError, match="'second' was shut down"):
        second.info()


def test_constructor_failure_is_a_worker_error():
    was_initialised = dist.is_initialized()
    with pytest.raises(
        WorkerError, match=r"rank 0 failed in BrokenInit.__init__\(\): RuntimeError: cannot load"
    ):
        WorkerGroup.inprocess(BrokenInit, name="broken")
    assert dist.is_initialized() == was_initialised  # released again


def test_init_ray_rejects_num_cpus_for_a_cluster():
    from tandem.controller import init_ray

    with pytest.raises(ValueError, match="num_cpus only applies to a local Ray"):
        init_ray(num_cpus=2, address="auto")


def test_importing_the_controller_does_not_import_ray():
    import subprocess
    import sys

    code = "import sys, tandem.controller; print('ray' in sys.modules)"
    assert (
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "False"
    )
