"""Spawned ranks of test_weight_bus, and its 2-node Ray driver (`python weight_bus_worker.py TEMP_DIR`:
its own Ray cluster, one actor per node; prints one JSON line)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from tandem.roles.weight_bus import WeightBus, WeightBusError

BUCKET = 4096


def mixed(seed: int) -> list[tuple[str, torch.Tensor]]:
    """fp32, bf16, int64 and bool; 0-d, empty, non-contiguous, and one tensor larger than BUCKET.
    Buckets with BUCKET bytes and 16-byte offsets: [a b c] [big] [d e f t empty] [g] = 4."""
    g = torch.Generator().manual_seed(seed)
    return [
        ("a", torch.randn(3, 5, generator=g)),  # 60 B
        ("b", torch.randn(7, generator=g).bfloat16()),  # 14 B
        ("c", torch.tensor(-(2**40) - seed)),  # int64 0-d
        ("big", torch.randn(40, 40, generator=g)),  # 6400 B > BUCKET: alone
        ("d", torch.tensor(float(seed) + 0.25)),  # fp32 0-d
        ("e", torch.randn(2, 3, 4, generator=g).bfloat16()),
        ("f", torch.randint(-(2**62), 2**62, (10,), generator=g)),
        ("t", torch.randn(16, 8, generator=g).t()),  # non-contiguous, 512 B
        ("empty", torch.empty(0, 3)),
        ("mask", torch.rand(5, generator=g) > 0.5),  # bool, 5 B
        ("g", torch.randn(900, generator=g)),  # 3600 B: does not fit after the above, a bucket of its own
    ]


def kib_tensors() -> list[tuple[str, torch.Tensor]]:
    """10 fp32 tensors of 1 KiB: 3 buckets of 4 KiB (4 + 4 + 2)."""
    return [(f"layer.{i}", torch.full((256,), float(i))) for i in range(10)]


def failing(after: int):
    """A weights iterator that raises after `after` tensors (a trainer whose gather failed)."""
    yield from kib_tensors()[:after]
    raise RuntimeError("gather failed on trainer rank 0")


def three_ranks(rank: int, world: int, address: str, out_dir: str) -> None:
    """Sync 0: mixed; sync 1: kib_tensors; sync 2: aborted by the source; sync 3: mixed again."""
    out = {}
    with WeightBus(address, rank, world, bucket_bytes=BUCKET, timeout_s=60) as bus:
        if rank == 0:
            out["stats"] = [bus.send(mixed(0)), bus.send(kib_tensors())]
            try:
                bus.send(failing(after=5))
            except RuntimeError as e:
                out["abort"] = str(e)
            out["stats"].append(bus.send(mixed(1)))
        else:
            out["syncs"] = [[(n, t.clone()) for n, t in bus.receive()] for _ in range(2)]
            got = []
            try:
                got.extend(name for name, _ in bus.receive())
            except WeightBusError as e:
                out["abort"] = str(e)
            out["before_abort"] = got
            out["syncs"].append([(n, t.clone()) for n, t in bus.receive()])
    torch.save(out, Path(out_dir) / f"rank{rank}.pt")


def idle_receiver(address: str, seconds: float, started) -> None:
    """Joins the bus as rank 1 and then never receives; exits after `seconds`."""
    started.set()
    WeightBus(address, 1, 2, timeout_s=30)
    time.sleep(seconds)


def dying_receiver(address: str) -> None:
    """Joins the bus as rank 1 and dies before receiving anything."""
    WeightBus(address, 1, 2, timeout_s=30)
    os._exit(3)


# --------------------------------------------------------------------------- 2 Ray nodes (a script)


def cluster_main(temp_dir: str) -> None:
    import ray
    from ray.cluster_utils import Cluster

    node_args = {"num_cpus": 1, "temp_dir": temp_dir, "object_store_memory": 80 * 1024**2}
    Path(ray._private.utils.get_ray_address_file(None)).parent.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(
        initialize_head=True, head_node_args={**node_args, "include_dashboard": False, "resources": {"a": 1}}
    )
    try:
        cluster.add_node(**node_args, resources={"b": 1})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)

        @ray.remote(num_cpus=1)
        class Rank:
            def __init__(self, rank: int):
                self.rank, self.bus = rank, None

            def node(self) -> str:
                return ray.get_runtime_context().get_node_id()

            def address(self) -> str:
                from tandem.roles.weight_bus import free_address

                return free_address()

            def join(self, address: str) -> None:
                from tandem.roles.weight_bus import WeightBus

                self.bus = WeightBus(address, self.rank, 2, bucket_bytes=4096, timeout_s=30)

            def send(self) -> dict:
                return self.bus.send(mixed(0))

            def receive(self) -> list:
                return [(name, tensor.clone()) for name, tensor in self.bus.receive()]

        source = Rank.options(resources={"a": 1}).remote(0)
        receiver = Rank.options(resources={"b": 1}).remote(1)
        address = ray.get(source.address.remote())
        ray.get([source.join.remote(address), receiver.join.remote(address)])
        stats, got = ray.get([source.send.remote(), receiver.receive.remote()])
        same = [n == m and torch.equal(t, u) for (n, t), (m, u) in zip(got, mixed(0))]
        report = {
            "nodes": ray.get([source.node.remote(), receiver.node.remote()]),
            "address": address,
            "stats": stats,
            "received": len(got),
            "equal": all(same) and len(got) == len(mixed(0)),
        }
        ray.shutdown()
    finally:
        cluster.shutdown()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    cluster_main(sys.argv[1])
