"""The process side of a worker group: torch.distributed set-up and the Ray actor that hosts one rank."""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from tandem.controller.context import WorkerContext

DEFAULT_PG_TIMEOUT_S = 1800.0  # torch.distributed collectives give up after this (finite: no silent hang)


def thread_env(num_threads: int) -> dict[str, str]:
    """Environment that caps OpenMP / MKL / BLAS threads; only effective before torch is imported."""
    n = str(num_threads)
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n}


def free_port() -> int:
    """A TCP port that was free a moment ago (the usual race: someone may take it before torch binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def init_distributed(ctx: WorkerContext, master_addr: str, master_port: int, timeout_s: float) -> None:
    """Join the group's default torch.distributed process group (collective: all ranks at once)."""
    os.environ.update(
        {
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "RANK": str(ctx.rank),
            "WORLD_SIZE": str(ctx.world_size),
            "LOCAL_RANK": str(ctx.local_rank),
        }
    )
    import torch
    import torch.distributed as dist

    torch.set_num_threads(ctx.num_threads)
    if ctx.device == "cuda":
        torch.cuda.set_device(0)  # Ray sets CUDA_VISIBLE_DEVICES: this rank's GPU is device 0
    dist.init_process_group(
        backend="nccl" if ctx.device == "cuda" else "gloo",
        init_method="env://",
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def redirect_output(path: Path) -> None:
    """Send this process's stdout and stderr (Python's and C's, and those of the processes it starts)
    to `path`, appended: the libraries' start-up noise and progress bars stay off the controller's
    console, and a worker's own traceback and last words are kept in the run folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}\n".encode())
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


class Shared:
    """An argument that several ranks receive: put into the object store once, fetched by each host."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref


class WorkerHost:
    """One rank of a Ray worker group: joins the process group, builds the worker, runs its methods."""

    def __init__(self, group_name: str, rank: int, log_dir: str | None = None) -> None:
        self._label = f"{group_name}:{rank}"
        self._worker: Any = None
        if log_dir is not None:
            redirect_output(Path(log_dir) / f"{group_name}_rank{rank}.log")

    def __repr__(self) -> str:  # Ray puts this into its log prefixes and errors
        return f"WorkerHost({self._label})"

    def address(self) -> tuple[str, int]:
        """This node's IP and a free port: rank 0's become MASTER_ADDR / MASTER_PORT."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def setup(
        self,
        ctx: WorkerContext,
        master_addr: str,
        master_port: int,
        timeout_s: float,
        worker_cls: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> int:
        """Join the process group and build `worker_cls(ctx, *args, **kwargs)`; returns the process id."""
        init_distributed(ctx, master_addr, master_port, timeout_s)
        self._worker = worker_cls(ctx, *args, **kwargs)
        return os.getpid()

    def execute(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._worker is None:
            raise RuntimeError(f"{self._label}: the worker was not built (setup failed or was not called)")
        args = tuple(_resolve(a) for a in args)
        kwargs = {k: _resolve(v) for k, v in kwargs.items()}
        return getattr(self._worker, method)(*args, **kwargs)


def _resolve(value: Any) -> Any:
    if isinstance(value, Shared):
        import ray

        return ray.get(value.ref)
    return value
