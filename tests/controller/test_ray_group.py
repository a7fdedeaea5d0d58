"""Worker groups over real Ray actors: rendezvous, dispatch, overlap, and failures that must not hang.

Two groups of 2 ranks share one pool (share=0.5 each) for the whole module; the failure tests build
their own groups on a second pool, because a failure shuts its group down.
"""

import time

import pytest
import torch

from tandem.batch import Batch
from tandem.controller import ResourcePool, WorkerError, WorkerGroup, WorkerTimeoutError

from . import toy_workers
from .toy_workers import BrokenInit, ToyWorker, pids_still_there

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def rows(n: int) -> Batch:
    return Batch({"x": torch.arange(float(n))}, {"uid": [f"u{i}" for i in range(n)]})


@pytest.fixture(scope="module")
def ray_env(ray_local):
    # the actors cannot import the tests' package: ship the toy workers' code with the calls
    ray_local.cloudpickle.register_pickle_by_value(toy_workers)
    yield ray_local
    ray_local.cloudpickle.unregister_pickle_by_value(toy_workers)


@pytest.fixture(scope="module")
def pool(ray_env):
    p = ResourcePool(nnodes=1, workers_per_node=2, cpus_per_worker=1, name="shared")
    yield p
    p.remove()


@pytest.fixture(scope="module")
def scorer(pool):
    """Plain data parallel over 2 ranks."""
    g = WorkerGroup.ray(ToyWorker, pool, name="scorer", kwargs={"scale": 2.0}, share=0.5)
    yield g
    g.shutdown()


@pytest.fixture(scope="module")
def tensor_parallel(pool):
    """2 ranks that form one data-parallel group (tensor parallel 2), colocated with `scorer`."""
    g = WorkerGroup.ray(ToyWorker, pool, name="tp", kwargs={"tp": 2}, share=0.5)
    yield g
    g.shutdown()


@pytest.fixture(scope="module")
def spare_pool(ray_env):
    p = ResourcePool(nnodes=1, workers_per_node=2, cpus_per_worker=1, name="spare")
    yield p
    p.remove()


def test_ranks_rendezvous_and_get_their_environment(scorer):
    infos = scorer.info()
    assert [i["rank"] for i in infos] == [0, 1] and scorer.world_size == 2
    assert all(i["backend"] == "ray" and i["dist_world_size"] == 2 for i in infos)
    assert [i["env"]["RANK"] for i in infos] == ["0", "1"]
    assert [i["env"]["LOCAL_RANK"] for i in infos] == ["0", "1"]
    assert infos[0]["env"]["MASTER_ADDR"] == infos[1]["env"]["MASTER_ADDR"]
    # share 0.5 of a 1-CPU bundle: one thread, set in torch and in the OpenMP environment
    assert all(
        i["torch_threads"] == i["ctx_threads"] == 1 and i["env"]["OMP_NUM_THREADS"] == "1" for i in infos
    )
    assert scorer.rank_sum() == [3.0, 3.0]  # all_reduce of 1 + 2 across the two processes
    assert scorer.rank_sum_once() == 3.0


def test_dp_uneven_split_comes_back_in_order(scorer):
    out = scorer.score(rows(5), offset=1.0)
    assert out["score"].tolist() == [1.0, 3.0, 5.0, 7.0, 9.0]
    assert out["rank"].tolist() == [0, 0, 0, 1, 1]
    assert list(out["uid"]) == [f"u{i}" for i in range(5)]
    assert scorer.count_rows(rows(5), other=rows(5)) == [6, 4]
    assert scorer.consume(rows(4)) is None


def test_mp_sends_one_dp_group_the_same_rows_and_collects_one_rank(tensor_parallel):
    out = tensor_parallel.score_mp(rows(5))
    assert out["rows_all_ranks"].tolist() == [10.0] * 5  # both ranks saw all 5 rows
    assert out["rank"].tolist() == [0] * 5  # only rank 0 (collect=True) was kept


def test_replica_dispatch_keeps_its_own_layout(tensor_parallel):
    """The same group splits MP calls by dispatch_info (one group of 2) and REPLICA calls by replica_info
    (every rank its own engine here): each mode asks its own method, once."""
    assert tensor_parallel.replicas == 2 and tensor_parallel.dp_size == 1
    out = tensor_parallel.score_replica(rows(5))
    assert out["rank"].tolist() == [0, 0, 0, 1, 1]
    assert tensor_parallel.score_mp(rows(5))["rank"].tolist() == [0] * 5


def test_calls_on_two_groups_overlap(scorer, tensor_parallel, tmp_path):
    marker = tmp_path / "written-by-the-other-group"
    waiting = scorer.wait_for_file.async_(str(marker), 30.0)
    assert not waiting.done()
    # if the first call had to finish before this one started, it would time out and say False
    tensor_parallel.touch.async_(str(marker)).result()
    assert waiting.result() == [True, True]


def test_result_timeout_only_stops_waiting(scorer):
    future = scorer.sleep.async_(1.0)
    with pytest.raises(TimeoutError, match="still running"):
        future.result(timeout=0.05)
    assert future.result() == [0, 1]
    assert scorer.broken is None


def test_inprocess_gives_the_same_results_as_ray(scorer):
    local = WorkerGroup.inprocess(ToyWorker, name="local", kwargs={"scale": 2.0})
    try:
        batch = rows(7)
        over_ray, in_process = scorer.score(batch, offset=0.5), local.score(batch, offset=0.5)
        assert torch.equal(over_ray["score"], in_process["score"])
        assert list(over_ray["uid"]) == list(in_process["uid"])
        assert local.rank_sum_once() == 1.0 and local.count_rows(batch, other=batch) == [14]
    finally:
        local.shutdown()


def test_unknown_method_names_the_worker_class(scorer):
    with pytest.raises(AttributeError, match="ToyWorker has no public method 'nope'"):
        scorer.nope.async_()


def test_a_raising_rank_fails_the_call_at_once_and_breaks_the_group(spare_pool):
    group = WorkerGroup.ray(ToyWorker, spare_pool, name="raiser")
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        group.fail("disk full")
    # liveness, not speed: the torch.distributed timeout would be 30 min
    assert time.monotonic() - start < 20
    err = info.value
    assert err.rank == 1 and err.error_type == "ValueError" and err.method == "ToyWorker.fail()"
    assert (
        "worker group 'raiser': rank 1 failed in ToyWorker.fail(): ValueError: rank 1 says: disk full"
        in str(err)
    )
    assert "toy_workers.py" in err.worker_traceback
    with pytest.raises(WorkerError, match="'raiser' is broken.*disk full"):
        group.info()
    group.shutdown()  # idempotent after the failure shut it down


def test_a_dying_rank_fails_the_call_while_the_other_blocks_in_a_collective(spare_pool):
    group = WorkerGroup.ray(ToyWorker, spare_pool, name="crasher")
    pids = [i["pid"] for i in group.info()]
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        group.exit_or_all_reduce()
    assert time.monotonic() - start < 20  # rank 0 is stuck in all_reduce: only failure detection ends this
    assert info.value.rank == 1 and info.value.error_type == "WorkerDied"
    assert "rank 1 failed in ToyWorker.exit_or_all_reduce(): WorkerDied: the worker process died" in str(
        info.value
    )
    assert pids_still_there(pids) == []  # the stuck rank was killed too, nothing left behind


def test_call_timeout_names_the_ranks_still_running(spare_pool):
    group = WorkerGroup.ray(
        ToyWorker,
        spare_pool,
        name="sleeper",
        call_timeout_s=1.0,
        call_timeout_name="trainer.worker_timeout_s",
    )
    pids = [i["pid"] for i in group.info()]
    with pytest.raises(  # the message names the key the user sets, not an internal name
        WorkerTimeoutError, match=r"ToyWorker.sleep\(\) did not finish within trainer.worker_timeout_s=1 s"
    ) as info:
        group.sleep(60)
    assert isinstance(info.value, TimeoutError) and "ranks still running: [0, 1]" in str(info.value)
    assert group.broken is info.value
    assert pids_still_there(pids) == []


def test_constructor_failure_names_the_rank(spare_pool):
    with pytest.raises(
        WorkerError, match=r"rank 1 failed in BrokenInit.__init__\(\): RuntimeError: cannot load the model"
    ):
        WorkerGroup.ray(BrokenInit, spare_pool, name="broken-init")


def test_a_pool_that_cannot_fit_says_what_it_needs_and_what_there_is(ray_env):
    with pytest.raises(
        RuntimeError, match=r"pool 'huge' needs 1 node\(s\) x 2 worker\(s\) x \(100 CPU\).*cluster has 4 CPU"
    ):
        ResourcePool(nnodes=1, workers_per_node=2, cpus_per_worker=100, name="huge")


def test_dp_more_ranks_than_rows_sends_an_empty_part(scorer):
    one = scorer.score(rows(1))  # rank 1 gets an empty part
    assert one["score"].tolist() == [0.0] and one["rank"].tolist() == [0]
