"""What a worker knows about its place in the group: given to every worker class's constructor."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class WorkerContext:
    """Set by the worker group before the worker object is built.

    When the worker object is constructed, torch.distributed's default process group is already
    initialised over the group's ranks (gloo on CPU, NCCL on GPU; world size 1 in-process), the
    MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE / LOCAL_RANK environment variables are set, and
    torch's intra-op thread count is `num_threads`.
    """

    group_name: str  # e.g. "actor_rollout_ref"; used in error messages
    rank: int  # global rank in this worker group
    world_size: int  # ranks in this worker group
    local_rank: int  # rank on this node
    node_rank: int  # index of this worker's node in the resource pool
    device: str  # "cpu" or "cuda" (on GPU, the one visible device is cuda:0 ... see `torch_device`)
    num_threads: int  # torch intra-op threads of this worker
    backend: str  # "ray" or "inprocess"

    @property
    def torch_device(self) -> torch.device:
        if self.device == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
