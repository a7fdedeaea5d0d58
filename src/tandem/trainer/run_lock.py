"""One run per run folder: an exclusive lock held by the controller for the whole run.

Two `tandem train` commands with the same output folder would delete each other's checkpoints,
resume from each other's state and interleave their metrics. The lock is `<run dir>/.lock`: an
advisory `flock` on it, and the holder's host, pid and command written in it for the message a
second run prints. The kernel drops a `flock` when its process dies, however it dies, so on the
same host a lock file left by a killed run is taken over (with a warning naming the dead holder).
A lock file written on another host is not taken over: this host cannot tell whether that run is
alive (and a file system shared between hosts may not carry `flock` between them); the message
says which file to delete once that run is known to be gone.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

LOCK_NAME = ".lock"


class RunLockedError(RuntimeError):
    """Another process holds the run folder (the CLI exits 2 with this message)."""


def _describe(holder: dict[str, Any]) -> str:
    started = holder.get("started")
    since = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(started)) if started else ""
    command = f" ({holder['command']})" if holder.get("command") else ""
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}{since}{command}"


def _read_holder(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    if not text.strip():
        return None
    try:
        holder = json.loads(text)
    except json.JSONDecodeError:
        return {"host": "?", "pid": "?", "command": f"unreadable lock file: {text[:80]!r}"}
    return holder if isinstance(holder, dict) else None


class RunLock:
    """`with RunLock(run_dir):` holds the run folder for the block; a second holder gets RunLockedError."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = _read_holder(self.path) or {}
                raise RunLockedError(
                    f"run folder {self.run_dir} is in use by another Tandem run: {_describe(holder)}. "
                    "Wait for it to finish, or give this run another trainer.experiment_name "
                    "(or trainer.output_dir)"
                ) from None
            # The holder before us may have unlinked the file between our open and our flock:
            # then we hold a lock on a file nobody else will open; start again on the new one.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        try:
            self._take_over(_read_holder(self.path))
            me = {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started": time.time(),
                "command": _argv(),
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _take_over(self, holder: dict[str, Any] | None) -> None:
        """A lock file with a holder in it but no flock: a run that died without cleaning up."""
        if holder is None:
            return
        if holder.get("host") != socket.gethostname():
            raise RunLockedError(
                f"run folder {self.run_dir} is locked by a run on another host: {_describe(holder)}; "
                f"this host cannot tell whether it still runs. If it does not, delete {self.path}"
            )
        logger.warning(
            "run folder %s: taking over the lock of %s, which is no longer running (it did not exit cleanly)",
            self.run_dir,
            _describe(holder),
        )

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            self.path.unlink(missing_ok=True)  # unlinked while held: the next run makes a fresh file
        finally:
            os.close(fd)  # drops the flock

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _argv() -> str:
    return " ".join(Path(sys.argv[0]).name if i == 0 else a for i, a in enumerate(sys.argv))[:300]
