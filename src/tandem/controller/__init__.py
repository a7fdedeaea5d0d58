"""The single controller: worker groups over Ray actors (or in-process), resource pools, dispatch modes.

init_ray(num_cpus=4)
pool = ResourcePool(nnodes=1, workers_per_node=2, cpus_per_worker=1, name="actor")
critic = WorkerGroup.ray(CriticWorker, pool, name="critic", share=0.5, args=(cfg,))
ref = WorkerGroup.ray(RefWorker, pool, name="ref", share=0.5, args=(cfg,))
values = critic.compute_values.async_(batch)       # both run at once
ref_log_probs = ref.compute_log_probs(batch)
batch = batch.union(values.result()).union(ref_log_probs)
"""

from __future__ import annotations

import os

from tandem.controller.context import WorkerContext
from tandem.controller.dispatch import Dispatch, dispatch
from tandem.controller.errors import DispatchError, WorkerError, WorkerTimeoutError
from tandem.controller.group import GroupFuture, WorkerGroup
from tandem.controller.resources import ResourcePool
from tandem.controller.worker import Worker

__all__ = [
    "Dispatch",
    "DispatchError",
    "GroupFuture",
    "ResourcePool",
    "Worker",
    "WorkerContext",
    "WorkerError",
    "WorkerGroup",
    "WorkerTimeoutError",
    "dispatch",
    "init_ray",
]


def init_ray(num_cpus: int | None = None, address: str | None = None, **ray_init_kwargs) -> None:
    """Start Ray for this process once (later calls do nothing); no dashboard, RAY_AUTH_MODE=disabled by default.

    `address=None` starts a local single-node Ray of this run's own with `num_cpus` logical CPUs (default:
    all cores), even when another job's Ray runs on the machine (Ray's own None joins the newest one);
    only a RAY_ADDRESS in the environment (set by `ray job submit`, or by you) is joined instead.
    `address="auto"` joins the cluster this machine is part of, started beforehand with
    `ray start --head` (and `ray start --address=HEAD:6379` on the other machines); `num_cpus` must
    then be None, as each node's `ray start` said what it offers. Other keywords go to `ray.init`.
    """
    if address is not None and num_cpus is not None:
        raise ValueError(
            f"init_ray(num_cpus={num_cpus}, address={address!r}): num_cpus only applies to a local Ray; "
            "a cluster's CPUs are set by `ray start --num-cpus` on each node"
        )
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # read by the Ray processes this starts
    import ray

    if ray.is_initialized():
        return
    ray_init_kwargs.setdefault("include_dashboard", False)
    if address is None and not os.environ.get("RAY_ADDRESS"):
        address = "local"  # a new instance: Ray's None would join any Ray already running here
    ray.init(address=address, num_cpus=num_cpus, **ray_init_kwargs)
