"""In-process backend of `WorkerGroup`: the worker object lives in the controller's process (world size 1).

For one-process runs and debugging: no Ray, no subprocesses, breakpoints work. torch.distributed gets
a world-size-1 process group so engines that call collectives run unchanged; several in-process
groups share it, and the last one to shut down destroys it if this module created it.
"""

from __future__ import annotations

import os
import threading
import traceback
from typing import Any

import torch

from tandem.batch import Batch
from tandem.controller.context import WorkerContext
from tandem.controller.dispatch import RankCall
from tandem.controller.errors import WorkerError
from tandem.controller.host import DEFAULT_PG_TIMEOUT_S, free_port, init_distributed

_pg_lock = threading.Lock()
_pg_users = 0  # live in-process groups
_pg_created_here = False


def _acquire_process_group(ctx: WorkerContext) -> None:
    global _pg_users, _pg_created_here
    import torch.distributed as dist

    with _pg_lock:
        if dist.is_initialized():
            if dist.get_world_size() != 1:
                raise RuntimeError(
                    f"in-process worker group '{ctx.group_name}' needs a world-size-1 process group, but "
                    f"torch.distributed is already initialised with world size {dist.get_world_size()}; "
                    "use WorkerGroup.ray for several ranks"
                )
        else:
            init_distributed(ctx, "127.0.0.1", free_port(), DEFAULT_PG_TIMEOUT_S)
            _pg_created_here = True
        _pg_users += 1


def _release_process_group() -> None:
    global _pg_users, _pg_created_here
    import torch.distributed as dist

    with _pg_lock:
        _pg_users -= 1
        if _pg_users == 0 and _pg_created_here:
            if dist.is_initialized():
                dist.destroy_process_group()
            _pg_created_here = False


class DoneCall:
    """A call that already ran: its per-rank results, or the error it raised."""

    def __init__(self, results: list[Any] | None, error: WorkerError | None) -> None:
        self.results = results
        self.error = error

    def wait(self, timeout: float | None) -> bool:
        if self.error is not None:
            raise self.error
        return True


class InProcessBackend:
    """One worker object in this process."""

    world_size = 1

    def __init__(self, worker: Any, ctx: WorkerContext, worker_name: str) -> None:
        self.worker = worker
        self.ctx = ctx
        self.group = ctx.group_name
        self.worker_name = worker_name
        self.device = ctx.device
        self._released = False

    @classmethod
    def start(
        cls,
        worker_cls: type,
        *,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        num_threads: int | None,
        device: str,
    ) -> InProcessBackend:
        if device not in ("cpu", "cuda"):
            raise ValueError(f"worker group '{name}': device must be 'cpu' or 'cuda', got {device!r}")
        if num_threads is not None:
            torch.set_num_threads(num_threads)  # process-wide: the controller shares these threads
        ctx = WorkerContext(
            group_name=name,
            rank=0,
            world_size=1,
            local_rank=0,
            node_rank=0,
            device=device,
            num_threads=torch.get_num_threads(),
            backend="inprocess",
        )
        _acquire_process_group(ctx)
        os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
        try:
            worker = worker_cls(ctx, *args, **kwargs)
        except Exception as exc:
            _release_process_group()
            raise _worker_error(name, f"{worker_cls.__name__}.__init__()", exc) from exc
        return cls(worker, ctx, worker_cls.__name__)

    def submit(self, method: str, rank_calls: list[RankCall]) -> DoneCall:
        (args, kwargs), *rest = rank_calls
        assert not rest, "in-process groups have one rank"
        # the worker gets its own Batch containers, as over Ray: pop/setitem must not reach the caller's
        args = tuple(_own_containers(a) for a in args)
        kwargs = {k: _own_containers(v) for k, v in kwargs.items()}
        try:
            out = getattr(self.worker, method)(*args, **kwargs)
        except Exception as exc:
            err = _worker_error(self.group, f"{self.worker_name}.{method}()", exc)
            err.__cause__ = exc
            return DoneCall(None, err)
        return DoneCall([_own_containers(out)], None)

    def kill(self) -> None:
        if not self._released:
            self._released = True
            self.worker = None
            _release_process_group()


def _own_containers(value: Any) -> Any:
    """A Batch with new dicts over the same tensors (cheap: no data is copied)."""
    if isinstance(value, Batch):
        return Batch(
            dict(value.tensors.items()), dict(value.non_tensors), dict(value.meta), batch_size=len(value)
        )
    return value


def _worker_error(group: str, label: str, exc: Exception) -> WorkerError:
    tb = "".join(traceback.format_exception(exc))
    return WorkerError(group, label, 0, type(exc).__name__, str(exc), tb)
