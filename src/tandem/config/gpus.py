"""How many GPUs each node has, for trainer.workers_per_node=auto (config/derived.py `choose_workers_per_node`).

Counted when the config is resolved, before any worker starts: a local Ray (trainer.ray_address unset) will
see this machine's GPUs, so they are counted here without starting it; a cluster (`ray_address`, or
RAY_ADDRESS) is asked, per node. Ray is imported only when a cluster is asked; torch only where its build
cannot be read from its files (ROCm), so `tandem config` starts in a second.
"""

from __future__ import annotations

import ast
import ctypes
import importlib.util
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def gpus_per_node(address: str | None) -> tuple[int, str]:
    """(GPUs per node, where they were counted) for workers started by Ray at `address` (None: a local Ray)."""
    if address is None and not os.environ.get("RAY_ADDRESS"):
        return local_gpus(), "on this machine"
    from tandem.controller import init_ray

    init_ray(address=address)
    import ray

    return fewest_gpus(ray.nodes()), "per node in the Ray cluster"


def local_gpus() -> int:
    """torch.cuda.device_count(), without importing torch where it is not loaded yet: 0 for a torch built
    without CUDA (its torch/version.py says so), the CUDA driver's count for a CUDA build (cuDeviceGetCount,
    which applies CUDA_VISIBLE_DEVICES as torch does; 0 without a driver or a device); a ROCm build is asked
    itself."""
    build = None if "torch" in sys.modules else _torch_build()
    if build == "cpu":
        return 0
    if build == "cuda":
        return driver_gpus()
    import torch

    return torch.cuda.device_count()


def _torch_build() -> str | None:
    """The build of the installed torch, "cuda", "hip" or "cpu", read from torch/version.py's literals
    (None where they cannot be read: torch then answers itself)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return "cpu"  # no torch: nothing could use a GPU, and torch.cuda would not exist
    try:
        tree = ast.parse((Path(spec.submodule_search_locations[0]) / "version.py").read_text())
    except (OSError, SyntaxError):
        return None
    found = {}
    for node in tree.body:  # `cuda: Optional[str] = None`, `hip: Optional[str] = None`
        literal = isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Constant)
        if literal and isinstance(node.target, ast.Name):
            found[node.target.id] = node.value.value
    if "cuda" not in found or "hip" not in found:
        return None
    return "cuda" if found["cuda"] else "hip" if found["hip"] else "cpu"


def driver_gpus() -> int:
    """The GPUs the CUDA driver (libcuda) shows this process; 0 without a driver, or where it finds none."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def fewest_gpus(nodes: Iterable[Mapping[str, Any]]) -> int:
    """The GPUs of the alive node with the fewest among those that have any (`ray.nodes()` rows); 0 if none has.
    A head node without GPUs does not count: it holds no rank."""
    counts = [int(node.get("Resources", {}).get("GPU", 0)) for node in nodes if node.get("Alive", True)]
    return min((c for c in counts if c > 0), default=0)
