"""megatron-core's parallel state (tensor, pipeline, virtual pipeline, expert and context parallel groups) over
the default process group: built once per process, shared by every megatron engine of it; and this rank's place in
it, `ParallelLayout`, built once by each engine and passed to its parts (the schedule, the build, weights out)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist


@dataclass(frozen=True)
class ParallelLayout:
    """This rank's place in megatron's layout: ranks and sizes of each kind of parallelism and their process
    groups. The engine builds it once (`parallel_layout`) and passes it to the parts that need it, as torchtitan
    passes its parallel dims; no part reads the engine for these."""

    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    vp_size: int  # virtual pipeline stages (model chunks) per pipeline rank
    dp_rank: int
    dp_size: int
    cp_rank: int
    cp_size: int
    ep_rank: int
    ep_size: int
    sequence_parallel: bool  # megatron's sequence parallel (on only with TP > 1)
    tp_group: Any
    pp_group: Any
    dp_group: Any
    cp_group: Any  # None without context parallel
    ep_group: Any  # None without expert parallel
    pp_ranks: tuple[int, ...]  # the pipeline group's global ranks, stage order

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1


def parallel_layout(
    tensor_parallel: int,
    pipeline_parallel: int,
    seed: int,
    virtual_pipeline: int = 1,
    expert_parallel: int = 1,
    context_parallel: int = 1,
    sequence_parallel: bool = False,
) -> ParallelLayout:
    """megatron's parallel state (`init_parallel_state`) and this rank's place in it."""
    from megatron.core import parallel_state as ps

    init_parallel_state(
        tensor_parallel, pipeline_parallel, seed, virtual_pipeline, expert_parallel, context_parallel
    )
    pp_group = ps.get_pipeline_model_parallel_group()
    return ParallelLayout(
        tp_rank=ps.get_tensor_model_parallel_rank(),
        tp_size=tensor_parallel,
        pp_rank=ps.get_pipeline_model_parallel_rank(),
        pp_size=pipeline_parallel,
        vp_size=virtual_pipeline,
        dp_rank=ps.get_data_parallel_rank(),
        dp_size=ps.get_data_parallel_world_size(),
        # context parallel: the ranks of a CP group hold the same rows, each a share of every row's columns
        cp_rank=ps.get_context_parallel_rank(),
        cp_size=context_parallel,
        ep_rank=ps.get_expert_model_parallel_rank(),
        ep_size=expert_parallel,
        sequence_parallel=sequence_parallel and tensor_parallel > 1,
        tp_group=ps.get_tensor_model_parallel_group(),
        pp_group=pp_group,
        dp_group=ps.get_data_parallel_group(),
        cp_group=ps.get_context_parallel_group() if context_parallel > 1 else None,
        ep_group=ps.get_expert_model_parallel_group() if expert_parallel > 1 else None,
        pp_ranks=tuple(dist.get_process_group_ranks(pp_group)),
    )


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
