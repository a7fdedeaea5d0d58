"""The base class of worker classes: holds the context and says how the rank takes part in MP dispatch."""

from __future__ import annotations

from tandem.controller.context import WorkerContext


class Worker:
    """A worker object; one per rank, built by the worker group as `worker_cls(ctx, *args, **kwargs)`.

    Subclasses that shard the model (tensor / pipeline parallel) override `dispatch_info` so that
    `Dispatch.MP` calls send the same data to all ranks of one data-parallel group and keep the output
    of exactly one of them.
    """

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx

    def dispatch_info(self) -> tuple[int, int, bool]:
        """(dp_rank, dp_size, collect): plain data parallel unless a subclass says otherwise."""
        return self.ctx.rank, self.ctx.world_size, True

    def replica_info(self) -> tuple[int, int, bool]:
        """(replica, replicas, collect) for Dispatch.REPLICA: every rank its own inference engine unless a
        subclass says that several ranks hold one (a tensor-parallel engine)."""
        return self.ctx.rank, self.ctx.world_size, True
