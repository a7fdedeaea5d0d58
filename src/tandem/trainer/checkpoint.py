"""Checkpoints of a run: one folder per step, written atomically, the last k kept, the newest found.

    <root>/global_step_4/            a complete checkpoint (it has the COMPLETE marker)
        actor/ critic/               the engines' sharded state (torch.distributed.checkpoint)
        trainer_state.pt             step, data sampler position, RNG states, KL controller, ...
        config.yaml                  the run's config
    <root>/.partial-global_step_6/   a checkpoint being written (or left by a crash): never read

A checkpoint is written under a `.partial-` name and renamed when complete, so a crash mid-write
leaves the previous checkpoint as the newest complete one. With several machines, `root` must be
on a file system every worker sees (workers write their shards there).
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)

PREFIX = "global_step_"
PARTIAL = ".partial-"
COMPLETE = "COMPLETE"
TRAINER_STATE = "trainer_state.pt"
_STEP_DIR = re.compile(rf"^{PREFIX}(\d+)$")


class CheckpointManager:
    """Finds, writes and prunes the checkpoints under `root` (see the module docstring)."""

    def __init__(self, root: str | Path, keep: int | None = None) -> None:
        if keep is not None and keep < 1:
            raise ValueError(f"trainer.max_checkpoints_to_keep must be >= 1 or null, got {keep}")
        self.root = Path(root)
        self.keep = keep

    def checkpoints(self) -> list[tuple[int, Path]]:
        """Complete checkpoints, oldest first, as (step, folder)."""
        if not self.root.is_dir():
            return []
        found = []
        for path in self.root.iterdir():
            match = _STEP_DIR.match(path.name)
            if match and (path / COMPLETE).is_file():
                found.append((int(match.group(1)), path))
        return sorted(found)

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        found = self.checkpoints()
        return found[-1][1] if found else None

    def resolve(self, resume: str) -> Path | None:
        """trainer.resume -> the checkpoint to load: auto = the newest here (or None), disable = None,
        else that folder, which must be a complete checkpoint."""
        if resume == "disable":
            return None
        if resume == "auto":
            return self.latest()
        path = Path(resume).expanduser()
        if not (path / COMPLETE).is_file() or not (path / TRAINER_STATE).is_file():
            raise FileNotFoundError(
                f"trainer.resume={resume!r} is not a complete Tandem checkpoint (a complete one holds "
                f"{COMPLETE} and {TRAINER_STATE}); use a global_step_N folder, auto or disable"
            )
        return path

    def remove_partial(self) -> None:
        """Delete folders left by writes that never finished."""
        if not self.root.is_dir():
            return
        for path in self.root.glob(f"{PARTIAL}*"):
            logger.warning("removing the unfinished checkpoint %s (a write was interrupted)", path)
            shutil.rmtree(path, ignore_errors=True)

    @contextmanager
    def writing(self, step: int) -> Iterator[Path]:
        """Yield an empty folder to fill; on success it becomes `global_step_<step>` (replacing an older
        one of that step) and old checkpoints beyond `keep` are deleted. On error it is removed."""
        final = self.root / f"{PREFIX}{step}"
        partial = self.root / f"{PARTIAL}{final.name}"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            yield partial
            (partial / COMPLETE).write_text(f"{step}\n")
            _fsync_tree(partial)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        _fsync_dir(self.root)
        self.prune()

    def prune(self) -> None:
        """Delete the oldest complete checkpoints beyond `keep`."""
        if self.keep is None:
            return
        for _, path in self.checkpoints()[: -self.keep]:
            shutil.rmtree(path, ignore_errors=True)


def save_trainer_state(folder: Path, state: dict[str, Any]) -> None:
    """`state` plus the controller's RNG states, into folder/trainer_state.pt."""
    torch.save({**state, "rng": rng_state()}, folder / TRAINER_STATE)


def load_trainer_state(folder: Path) -> dict[str, Any]:
    """What save_trainer_state wrote; the controller's RNG states are restored."""
    state = torch.load(folder / TRAINER_STATE, weights_only=False)
    restore_rng(state.pop("rng"))
    return state


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _fsync_tree(folder: Path) -> None:
    """Flush every file under `folder` to disk, so the rename publishes complete data."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
