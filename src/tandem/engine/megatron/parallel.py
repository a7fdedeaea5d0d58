"""megatron-core's parallel state (tensor, pipeline, virtual pipeline, expert and context parallel groups) over
the default process group: built once per process, shared by every megatron engine of it."""

from __future__ import annotations

from typing import Any, Protocol

import torch.distributed as dist


class ParallelLayout(Protocol):
    """This rank's place in the layout, as an engine's parts read it (the start of their host contracts)."""

    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    vp_size: int  # virtual pipeline stages (model chunks) per pipeline rank
    ep_size: int


def megatron_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("megatron.core") is not None


def init_parallel_state(
    tensor_parallel: int,
    pipeline_parallel: int,
    seed: int,
    virtual_pipeline: int = 1,
    expert_parallel: int = 1,
    context_parallel: int = 1,
) -> None:
    """megatron's parallel state over the default group (once per process; later calls must agree)."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel as mtp

    world = dist.get_world_size()
    if world % (tensor_parallel * pipeline_parallel * context_parallel):
        raise ValueError(
            f"actor.megatron tensor_parallel={tensor_parallel} x pipeline_parallel={pipeline_parallel} x "
            f"context_parallel={context_parallel} does not divide the worker group's {world} ranks"
        )
    if ps.model_parallel_is_initialized() and not _groups_alive(ps):
        # Left by an earlier process group of this process (an in-process worker group shut down since).
        ps.destroy_model_parallel()
    want = (tensor_parallel, pipeline_parallel, virtual_pipeline, expert_parallel, context_parallel)
    if ps.model_parallel_is_initialized():
        have = (
            ps.get_tensor_model_parallel_world_size(),
            ps.get_pipeline_model_parallel_world_size(),
            ps.get_virtual_pipeline_model_parallel_world_size() or 1,
            ps.get_expert_model_parallel_world_size(),
            ps.get_context_parallel_world_size(),
        )
        if have != want:
            raise ValueError(
                f"this process already runs megatron with (tensor, pipeline, virtual pipeline, expert, context) "
                "parallel "
                f"{have}; every engine of a worker shares it, got {want}"
            )
        return
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tensor_parallel,
        pipeline_model_parallel_size=pipeline_parallel,
        virtual_pipeline_model_parallel_size=virtual_pipeline if virtual_pipeline > 1 else None,
        expert_model_parallel_size=expert_parallel,
        expert_tensor_parallel_size=1,  # experts whole on each rank (convert.py)
        context_parallel_size=context_parallel,
    )
    mtp.model_parallel_cuda_manual_seed(seed)


def _groups_alive(ps: Any) -> bool:
    """Whether megatron's groups belong to the current default process group (not to a destroyed one)."""
    try:
        dist.get_process_group_ranks(ps.get_tensor_model_parallel_group())
    except (KeyError, ValueError, RuntimeError):
        return False
    return True
