"""How many GPUs each node has, for trainer.workers_per_node=auto (config/derived.py `choose_workers_per_node`).

Counted when the config is resolved, before any worker starts: a local Ray (trainer.ray_address unset) will
see this machine's GPUs, so they are counted here without starting it; a cluster (`ray_address`, or
RAY_ADDRESS) is asked, per node. torch and Ray are imported only when a count is needed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any


def gpus_per_node(address: str | None) -> tuple[int, str]:
    """(GPUs per node, where they were counted) for workers started by Ray at `address` (None: a local Ray)."""
    if address is None and not os.environ.get("RAY_ADDRESS"):
        import torch

        return torch.cuda.device_count(), "on this machine"
    from tandem.controller import init_ray

    init_ray(address=address)
    import ray

    return fewest_gpus(ray.nodes()), "per node in the Ray cluster"


def fewest_gpus(nodes: Iterable[Mapping[str, Any]]) -> int:
    """The GPUs of the alive node with the fewest among those that have any (`ray.nodes()` rows); 0 if none has.
    A head node without GPUs does not count: it holds no rank."""
    counts = [int(node.get("Resources", {}).get("GPU", 0)) for node in nodes if node.get("Alive", True)]
    return min((c for c in counts if c > 0), default=0)
