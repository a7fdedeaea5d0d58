"""Start the spawned ranks of the engine tests from one forkserver per test session.

A rank started with `spawn` is a fresh interpreter that imports torch, transformers, megatron-core and Tandem's
engine before its first line of work: about 11 CPU-seconds a rank, and the suite starts dozens of ranks. The
forkserver imports them once (FORKSERVER_PRELOAD) and forks each rank from itself, a process that has run nothing
else (no threads, no CUDA, no process group), so a rank starts as clean as a spawned one, in a fraction of a
second. sys.path and the working directory come from the test process at each start, as with `spawn`; the
environment is the forkserver's, taken when it started: a variable a rank needs is passed in its arguments or
set inside it. So are its stdout and stderr (whichever test's capture was open then): each rank writes its own
to a file, which the test process prints into the running test's output once the ranks are done.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch.multiprocessing as mp

# Imported by the forkserver before it forks any rank; a module that cannot be imported is skipped there
FORKSERVER_PRELOAD = [
    "torch",
    "torch.distributed",
    "transformers",
    "megatron.core",
    "tandem.config",
    "tandem.engine",
    "tandem.roles.actor",
    "tandem.roles.critic",
]


def forkserver() -> multiprocessing.context.ForkServerContext:
    """The session's forkserver as a multiprocessing context, for a test's own Process or Event; what a process
    it starts prints goes to the forkserver's stdout and stderr (see above), not to the test's capture."""
    multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)  # no effect once the forkserver runs
    return multiprocessing.get_context("forkserver")


def start_ranks(fn: Callable, args: tuple, nprocs: int) -> None:
    """Run `fn(rank, *args)` in `nprocs` processes forked from the session's forkserver; wait for all. A rank's
    exception is raised here (torch.multiprocessing's ProcessRaisedException), a signal that killed it as
    ProcessExitedException, as `torch.multiprocessing.spawn` does; what the ranks printed goes to stderr here."""
    multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)  # no effect once the forkserver runs
    logs = Path(tempfile.mkdtemp(prefix="ranks-"))
    try:
        mp.start_processes(
            _logged, args=(fn, str(logs), *args), nprocs=nprocs, join=True, start_method="forkserver"
        )
    finally:
        for rank in range(nprocs):
            log = logs / f"rank{rank}.log"
            text = log.read_text(errors="replace") if log.is_file() else ""
            if text:
                sys.stderr.write(f"----- rank {rank} of {fn.__name__} -----\n{text}")
        shutil.rmtree(logs, ignore_errors=True)


def _logged(rank: int, fn: Callable, logs: str, *args) -> None:
    """In the rank: stdout and stderr (Python's and the C++ libraries') into logs/rank{rank}.log, then fn."""
    log = os.open(Path(logs) / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    fn(rank, *args)
