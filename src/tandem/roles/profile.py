"""`trainer.profile`: torch.profiler traces of chosen worker calls, on chosen ranks, in chosen steps.

The controller tells every worker group the step it starts (`RoleWorker.profile_step`, only when
`trainer.profile.steps` is set); a worker call of a chosen phase, on a chosen rank, during a chosen step,
runs under `torch.profiler.profile` and writes one Chrome trace:

    <output_dir>/step<N>/<group>_rank<R>_<phase>.pt.trace.json

which Perfetto (ui.perfetto.dev) and TensorBoard's profiler plugin (a log folder of `*.pt.trace.json`) open.
With `trainer.profile.tool=nsys` the same chosen call opens one Nsight Systems capture range instead
(cudaProfilerStart / Stop, which `nsys profile --capture-range=cudaProfilerApi` records), inside an NVTX range
named `<group>_rank<R>_<phase>_step<N>`; the worker runs under nsys by Ray's runtime_env (roles/layout.py).
With `steps` empty nothing is set up, and a call's only cost is one attribute test.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from tandem.config.schema import ProfileConfig

logger = logging.getLogger(__name__)

ACTIVITIES = {"cpu": ProfilerActivity.CPU, "cuda": ProfilerActivity.CUDA}


class PhaseProfiler:
    """One worker's side of `trainer.profile` (see the module docstring)."""

    def __init__(self, cfg: ProfileConfig, group: str, rank: int) -> None:
        self.cfg = cfg
        self.group = group
        self.rank = rank
        self.enabled = bool(cfg.steps) and (not cfg.ranks or rank in cfg.ranks)
        self.step = 0
        self.folder: Path | None = None
        self.activities = [ACTIVITIES["cpu"]] if "cpu" in cfg.activities else []
        if "cuda" in cfg.activities and torch.cuda.is_available():
            self.activities.append(ACTIVITIES["cuda"])
        self.activities = self.activities or [ACTIVITIES["cpu"]]  # cuda alone asked for on a CPU machine

    def set_step(self, step: int, folder: str) -> None:
        self.step, self.folder = step, Path(folder)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Run the block under the profiler when this rank, step and phase are chosen."""
        chosen = (
            self.enabled and self.step in self.cfg.steps and (not self.cfg.phases or name in self.cfg.phases)
        )
        if not chosen or self.folder is None:
            yield
            return
        if self.cfg.tool == "nsys":
            with nsight_capture(f"{self.group}_rank{self.rank}_{name}_step{self.step}"):
                yield
            return
        with profile(
            activities=self.activities,
            record_shapes=True,
            profile_memory=self.cfg.memory,
            with_stack=self.cfg.with_stack,
        ) as prof:
            yield
        path = self.folder / f"step{self.step}" / f"{self.group}_rank{self.rank}_{name}.pt.trace.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        logger.info("profile of %s written to %s", name, path)


@contextmanager
def nsight_capture(label: str) -> Iterator[None]:
    """One Nsight Systems capture range around the block, marked by an NVTX range `label`. Untested on a GPU
    here: on the CPU machines the suite runs on, layout.py refuses tool=nsys before a worker starts."""
    torch.cuda.synchronize()  # the kernels queued before the range stay out of it
    torch.cuda.profiler.start()
    torch.cuda.nvtx.range_push(label)
    try:
        yield
    finally:
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        torch.cuda.profiler.stop()
        logger.info("nsight capture range %s closed", label)


def profiled(method: Callable) -> Callable:
    """A worker method run under its worker's `PhaseProfiler` (attribute `_profiler`), as the phase named
    like the method. Put it under `@dispatch`."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._profiler.phase(method.__name__):
            return method(self, *args, **kwargs)

    return run
