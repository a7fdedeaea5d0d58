"""Resource pools: Ray placement groups that reserve CPUs / GPUs for the ranks of worker groups."""

from __future__ import annotations

import contextlib
import math
from typing import Any

from tandem.controller import cleanup


class ResourcePool:
    """`nnodes` x `workers_per_node` slots ("bundles") of `cpus_per_worker` CPUs and `gpus_per_worker` GPUs.

    Each node's bundles form one Ray placement group with strategy STRICT_PACK, so the ranks of one
    node really share a machine (and, on GPUs, NVLink). Rank r of a group built on the pool lives in
    bundle r % workers_per_node of node r // workers_per_node.

    Colocation: several worker groups can live on one pool, side by side in the same bundles. Each
    group asks for a fraction of every bundle, `WorkerGroup.ray(..., share=0.5)`: e.g. the actor and
    the reference policy with share=0.5 each get one process per bundle and half of its CPUs/GPU
    each (Ray accounting; processes are not isolated). The shares of the groups that are alive on a
    pool at the same time must add up to at most 1, or the last group's actors cannot be placed.

    The placement groups are reserved when the pool is built (waiting up to `ready_timeout_s`);
    `remove()` frees them and kills whatever still runs in them.
    """

    release_order = 1

    def __init__(
        self,
        nnodes: int = 1,
        workers_per_node: int = 1,
        cpus_per_worker: float = 1,
        gpus_per_worker: float = 0,
        *,
        name: str = "pool",
        ready_timeout_s: float = 60.0,
    ) -> None:
        if nnodes < 1 or workers_per_node < 1:
            raise ValueError(
                f"resource pool '{name}': nnodes and workers_per_node must be >= 1, "
                f"got {nnodes} and {workers_per_node}"
            )
        if cpus_per_worker < 0 or gpus_per_worker < 0 or cpus_per_worker + gpus_per_worker == 0:
            raise ValueError(
                f"resource pool '{name}': each worker needs some CPUs or GPUs, got "
                f"cpus_per_worker={cpus_per_worker}, gpus_per_worker={gpus_per_worker}"
            )
        import ray
        from ray.util.placement_group import placement_group

        if not ray.is_initialized():
            raise RuntimeError(
                f"resource pool '{name}' needs Ray: call tandem.controller.init_ray() first "
                "(or ray.init(); address='auto' joins a cluster started with `ray start --head`)"
            )
        self.name = name
        self.nnodes = nnodes
        self.workers_per_node = workers_per_node
        self.cpus_per_worker = float(cpus_per_worker)
        self.gpus_per_worker = float(gpus_per_worker)

        self._check_fits()
        bundle = {k: v for k, v in (("CPU", self.cpus_per_worker), ("GPU", self.gpus_per_worker)) if v > 0}
        self._groups = [
            placement_group([dict(bundle) for _ in range(workers_per_node)], strategy="STRICT_PACK")
            for _ in range(nnodes)
        ]
        cleanup.track(self)
        ready, _ = ray.wait([pg.ready() for pg in self._groups], num_returns=nnodes, timeout=ready_timeout_s)
        if len(ready) < nnodes:
            free = _cpu_gpu(ray.available_resources())
            self.remove()
            raise RuntimeError(
                f"{self._needs()}; only {len(ready)} of its {nnodes} placement group(s) could be "
                f"placed within {ready_timeout_s:g} s. The cluster has {_cpu_gpu(ray.cluster_resources())}, "
                f"of which {free} are free: other pools or actors hold the rest. Remove them, "
                "use fewer or smaller workers, or give Ray more resources."
            )

    @property
    def world_size(self) -> int:
        return self.nnodes * self.workers_per_node

    @property
    def device(self) -> str:
        """ "cuda" when the workers get GPUs, else "cpu"."""
        return "cuda" if self.gpus_per_worker > 0 else "cpu"

    @property
    def removed(self) -> bool:
        return not self._groups

    def placement(self, rank: int) -> tuple[Any, int, int, int]:
        """(placement group, bundle index, node rank, local rank) of `rank`."""
        if self.removed:
            raise RuntimeError(f"resource pool '{self.name}' was removed")
        node_rank, local_rank = divmod(rank, self.workers_per_node)
        return self._groups[node_rank], local_rank, node_rank, local_rank

    def remove(self) -> None:
        """Free the placement groups (idempotent); actors still in them are killed by Ray."""
        groups, self._groups = self._groups, []
        cleanup.untrack(self)
        if not groups:
            return
        import ray
        from ray.util.placement_group import remove_placement_group

        if not ray.is_initialized():  # Ray already shut down: it freed everything itself
            return
        for pg in groups:
            with contextlib.suppress(Exception):  # already gone
                remove_placement_group(pg)

    release = remove

    def __repr__(self) -> str:
        return (
            f"ResourcePool('{self.name}', nnodes={self.nnodes}, workers_per_node={self.workers_per_node}, "
            f"cpus_per_worker={self.cpus_per_worker:g}, gpus_per_worker={self.gpus_per_worker:g})"
        )

    def _needs(self) -> str:
        gpu = f" + {self.gpus_per_worker:g} GPU" if self.gpus_per_worker else ""
        return (
            f"resource pool '{self.name}' needs {self.nnodes} node(s) x {self.workers_per_node} worker(s) "
            f"x ({self.cpus_per_worker:g} CPU{gpu}), each node's workers packed on one Ray node"
        )

    def _check_fits(self) -> None:
        """Fail at once when no arrangement of the live nodes could ever hold the pool (no waiting)."""
        import ray

        per_node_cpu = self.workers_per_node * self.cpus_per_worker
        per_node_gpu = self.workers_per_node * self.gpus_per_worker
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        fits = 0
        for res in nodes:
            counts = []
            if per_node_cpu > 0:
                counts.append(math.floor(res.get("CPU", 0) / per_node_cpu + 1e-9))
            if per_node_gpu > 0:
                counts.append(math.floor(res.get("GPU", 0) / per_node_gpu + 1e-9))
            fits += min(counts)
        if fits < self.nnodes:
            listing = "; ".join(_cpu_gpu(res) for res in nodes) or "no live nodes"
            raise RuntimeError(
                f"{self._needs()}; the Ray cluster has {_cpu_gpu(ray.cluster_resources())} "
                f"(per node: {listing}), room for {fits} such node group(s). Use fewer or smaller "
                "workers, or give Ray more (init_ray(num_cpus=...), or `ray start --num-cpus/--num-gpus`)."
            )


def _cpu_gpu(resources: dict[str, float]) -> str:
    return f"{resources.get('CPU', 0):g} CPU, {resources.get('GPU', 0):g} GPU"
