"""Checkpoints of a run: one folder per step, written atomically, the last k kept, the newest found.

    <root>/global_step_4/            a complete checkpoint (it has the COMPLETE marker)
        actor/ critic/               the engines' sharded state (torch.distributed.checkpoint)
        trainer_state.pt             step, data sampler position, RNG states, KL controller, ...
        config.yaml                  the run's config
        MANIFEST.json                every file above with its size (and a checksum for small files)
    <root>/.partial-global_step_6/   a checkpoint being written (or left by a crash): never read
    <root>/latest_checkpointed_iteration.txt   the step of the newest complete checkpoint (verl's file)

`actor/huggingface/` holds the actor's Hugging Face folder (trainer/checkpoint_hf.py), where verl's tools look.
verl's `trainer.default_local_dir` is the folder `<root>` is here. Tandem itself never reads the iteration
file: resume trusts the COMPLETE markers and the manifests (below); the file is kept equal to what
`resume=auto` picks, written atomically after each checkpoint is complete and after old ones are deleted,
and rewritten when `resume=auto` falls back past a damaged newest checkpoint.

A checkpoint is written under a `.partial-` name and renamed when complete, so a crash mid-write
leaves the previous checkpoint as the newest complete one. The manifest is written last, before the
COMPLETE marker; a checkpoint damaged later (a shard deleted, a file cut short by a full disk or a
partial copy) fails its manifest check: `resume=auto` then falls back to the newest intact checkpoint
with a warning, and a damaged checkpoint named explicitly is an error naming the file. With several machines, `root` must be
on a file system every worker sees (workers write their shards there).
"""

from __future__ import annotations

import hashlib
import json
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
MANIFEST = "MANIFEST.json"
LATEST_ITERATION = "latest_checkpointed_iteration.txt"  # verl's name; holds the step, as verl writes it
CHECKSUM_MAX_BYTES = 64 << 20  # files up to this size get a sha256 in the manifest (shards: size only)
_STEP_DIR = re.compile(rf"^{PREFIX}(\d+)$")


class CheckpointError(FileNotFoundError):
    """A checkpoint named explicitly is not complete or is damaged (the CLI exits 2 with the message)."""


class CheckpointManager:
    """Finds, writes and prunes the checkpoints under `root` (see the module docstring)."""

    def __init__(self, root: str | Path, keep: int | None = None) -> None:
        if keep is not None and keep < 1:
            raise ValueError(f"trainer.max_checkpoints_to_keep must be >= 1 or null, got {keep}")
        self.root = Path(root)
        self.keep = keep

    def checkpoints(self) -> list[tuple[int, Path]]:
        """Complete checkpoints (they hold the COMPLETE marker), oldest first, as (step, folder)."""
        if not self.root.is_dir():
            return []
        found = []
        for path in self.root.iterdir():
            match = _STEP_DIR.match(path.name)
            if match and (path / COMPLETE).is_file():
                found.append((int(match.group(1)), path))
        return sorted(found)

    def latest(self) -> Path | None:
        """The newest complete checkpoint that passes its manifest check, or None. A newer one that
        fails it is skipped with a warning that says what is wrong with it."""
        for _, path in reversed(self.checkpoints()):
            problems = verify(path)
            if not problems:
                return path
            logger.warning(
                "checkpoint %s is damaged (%s); falling back to an older one", path, "; ".join(problems)
            )
        return None

    def resolve(self, resume: str) -> Path | None:
        """trainer.resume -> the checkpoint to load: auto = the newest intact one here (or None),
        disable = None, else that folder, which must be a complete, intact checkpoint."""
        if resume == "disable":
            return None
        if resume == "auto":
            latest = self.latest()
            if latest is None and self.checkpoints():
                raise CheckpointError(
                    f"every checkpoint under {self.root} is damaged (see the warnings above); "
                    "use trainer.resume=disable to train afresh, or restore one from a backup"
                )
            try:  # verl's tools then read the checkpoint this resumes from
                self.record_latest(None if latest is None else checkpoint_step(latest))
            except OSError as err:  # a read-only copy of a run folder (tandem eval) still resolves
                logger.warning("could not update %s: %s", self.root / LATEST_ITERATION, err)
            return latest
        path = Path(resume).expanduser()
        if not (path / COMPLETE).is_file() or not (path / TRAINER_STATE).is_file():
            raise CheckpointError(
                f"trainer.resume={resume!r} is not a complete Tandem checkpoint (a complete one holds "
                f"{COMPLETE} and {TRAINER_STATE}); use a global_step_N folder, auto or disable"
            )
        problems = verify(path)
        if problems:
            raise CheckpointError(
                f"checkpoint {path} is damaged: {'; '.join(problems)}. Name an older checkpoint, or use "
                "trainer.resume=auto (the newest intact one)"
            )
        return path

    def remove_partial(self) -> None:
        """Delete folders (and iteration files) left by writes that never finished."""
        if not self.root.is_dir():
            return
        for path in self.root.glob(f"{PARTIAL}*"):
            if path.is_dir():
                logger.warning("removing the unfinished checkpoint %s (a write was interrupted)", path)
                shutil.rmtree(path, ignore_errors=True)
            else:  # an iteration file never renamed into place: the one in place is whole
                path.unlink(missing_ok=True)

    @contextmanager
    def writing(self, step: int) -> Iterator[Path]:
        """Yield an empty folder to fill; on success it becomes `global_step_<step>` (replacing an older
        one of that step), old checkpoints beyond `keep` are deleted and the iteration file names the
        newest. On error it is removed."""
        final = self.root / f"{PREFIX}{step}"
        partial = self.root / f"{PARTIAL}{final.name}"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            yield partial
            write_manifest(partial)
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
        # Newer checkpoints exist only after a resume from an older one: the newest intact one stays the latest.
        newer = [s for s, path in self.checkpoints() if s > step and not verify(path)]
        self.record_latest(newer[-1] if newer else step)

    def prune(self) -> None:
        """Delete the oldest complete checkpoints beyond `keep`."""
        if self.keep is None:
            return
        for _, path in self.checkpoints()[: -self.keep]:
            shutil.rmtree(path, ignore_errors=True)

    def record_latest(self, step: int | None) -> None:
        """latest_checkpointed_iteration.txt := `step` (written whole or not at all); None removes it."""
        tracker = self.root / LATEST_ITERATION
        if step is None:
            tracker.unlink(missing_ok=True)
            return
        if tracker.is_file() and tracker.read_text().strip() == str(step):
            return
        temporary = tracker.with_name(f"{PARTIAL}{LATEST_ITERATION}")
        with temporary.open("w") as f:
            f.write(str(step))  # no newline, as verl writes it (its reader takes int() of the whole file)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, tracker)
        _fsync_dir(self.root)


def checkpoint_step(folder: Path) -> int:
    """The step of a global_step_N folder (from its name)."""
    match = _STEP_DIR.match(folder.name)
    if match is None:
        raise CheckpointError(f"{folder} is not a {PREFIX}N checkpoint folder")
    return int(match.group(1))


def write_manifest(folder: Path) -> None:
    """Every file under `folder` with its size, and a sha256 where the file is small enough to hash cheaply."""
    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name not in (MANIFEST, COMPLETE):
            size = path.stat().st_size
            entry: dict[str, Any] = {"size": size}
            if size <= CHECKSUM_MAX_BYTES:
                entry["sha256"] = _sha256(path)
            files[path.relative_to(folder).as_posix()] = entry
    (folder / MANIFEST).write_text(json.dumps({"version": 1, "files": files}, indent=1) + "\n")


def verify(folder: Path) -> list[str]:
    """What is wrong with a complete checkpoint, by its manifest: missing, short or changed files.
    [] when it is intact, or when it has no manifest (written before manifests existed: nothing to check)."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return []
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError) as err:
        return [f"{MANIFEST} is unreadable ({err})"]
    problems = []
    for name, entry in files.items():
        path = folder / name
        if not path.is_file():
            problems.append(f"{name} is missing")
            continue
        size = path.stat().st_size
        if size != entry["size"]:
            problems.append(f"{name} has {size} bytes, the manifest says {entry['size']}")
        elif "sha256" in entry and _sha256(path) != entry["sha256"]:
            problems.append(f"{name} does not match its checksum")
    return problems


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
