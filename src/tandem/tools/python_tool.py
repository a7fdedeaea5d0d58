"""The built-in ``python`` tool: run a snippet in a fresh Python process and return what it printed.

What it does: each call starts ``sys.executable -I`` (isolated mode: no user site-packages, no
PYTHON* variables, the script's directory not on sys.path) in a session and process group of its
own, with a new empty temporary directory as its working directory (deleted afterwards), stdout
and stderr written to files beside that directory, stdin from /dev/null, and a minimal environment
(PATH, HOME = the working directory, a UTF-8 locale). That process is a supervisor
(`tandem.tools.python_child`): a child subreaper that forks the worker running the code under
resource limits: CPU seconds (RLIMIT_CPU, the wall limit rounded up), address space (RLIMIT_AS) and
the size of any file written (RLIMIT_FSIZE, which also caps what it prints).

Nothing the call started outlives it, on every path: when the code ends (however: exit, ``os._exit``,
a limit's signal), the supervisor kills every process below it; at the wall-clock limit and when the
call is cancelled, this tool does (a walk of /proc's parent links from the supervisor), then kills the
process group and reaps. Below the supervisor are the code's plain children, children that started a
session of their own (``setsid``, ``start_new_session``) and double-forked daemons (re-parented to the
subreaper). What escapes: a process started through another service (``ssh``, ``systemd-run``, a
container daemon), and anything once the code kills the supervisor itself.

What it does NOT isolate -- it is not a security sandbox: the code runs as the trainer's user,
can reach the network, can read (and write) any file that user can reach through an absolute
path (checkpoints, datasets, credentials in the home directory), and can signal or inspect that
user's other processes (the supervisor included). The number of processes is not limited
(RLIMIT_NPROC counts all of the user's processes, so no safe value exists). For code from a model
you do not trust, run the trainer in a container or VM.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from tandem.tools import python_child
from tandem.tools.base import Tool
from tandem.tools.names import PYTHON

MAX_CODE_CHARS = 100_000  # the code travels as a command-line argument (Linux caps one at 128 KiB)
POLL_S = 0.02  # how often a call looks whether its process has ended
REAP_GRACE_S = 5.0  # how long the supervisor may take to reap what was killed before it is killed too

# The supervisor's program (python_child.py), passed with -c: the -I interpreter may not import Tandem.
_CHILD = Path(python_child.__file__).read_text()


def _exit_status(code: int) -> str:
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"exit code {code} (killed by {signal.Signals(-code).name})"
    except ValueError:
        return f"exit code {code}"


class PythonTool(Tool):
    """Runs Python code in a fresh, resource-limited process (see the module docstring for what
    it does not isolate). ``timeout_s`` is the wall-clock limit, enforced by this tool itself."""

    name = PYTHON
    description = (
        "Run Python 3 code in a fresh process and return what it prints (stdout, then stderr). "
        "Nothing carries over between calls: print what you need."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "The Python code to run"}},
        "required": ["code"],
    }

    def __init__(
        self,
        timeout_s: float = 10.0,
        *,
        memory_bytes: int = 1 << 30,
        file_bytes: int = 1 << 20,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"python tool: timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.memory_bytes = int(memory_bytes)
        self.file_bytes = int(file_bytes)

    async def call(self, code: str) -> str:  # type: ignore[override]
        if len(code) > MAX_CODE_CHARS:
            raise ValueError(f"the code is {len(code)} characters long; at most {MAX_CODE_CHARS}")
        if "\0" in code:
            raise ValueError("the code holds a NUL character")
        with tempfile.TemporaryDirectory(prefix="tandem-python-", ignore_cleanup_errors=True) as root:
            workdir = os.path.join(root, "work")
            os.mkdir(workdir)
            # Output goes to files, not pipes: RLIMIT_FSIZE bounds them, and a child that keeps a
            # pipe open cannot delay the end of the call.
            stdout_path, stderr_path = os.path.join(root, "stdout"), os.path.join(root, "stderr")
            with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
                returncode = await self._run(code, workdir, stdout, stderr)
            return _output(_read(stdout_path), _read(stderr_path), returncode)

    async def _run(self, code: str, workdir: str, stdout: Any, stderr: Any) -> int:
        limits = (math.ceil(self.timeout_s), self.memory_bytes, self.file_bytes)
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": workdir, "LC_ALL": "C.UTF-8"}
        # Started synchronously (asyncio's own subprocess start forks synchronously too): no await lies
        # between the start and the try, so a cancellation cannot land before the kill is armed.
        process = subprocess.Popen(
            [sys.executable, "-I", "-c", _CHILD, *map(str, limits), code],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        try:
            await asyncio.wait_for(_ended(process.pid), self.timeout_s)
        except TimeoutError:
            raise TimeoutError(f"the code did not finish within {self.timeout_s:g} s") from None
        finally:  # shielded: a second cancellation cannot stop the kill half-way
            await asyncio.shield(_close(process))
        return int(process.returncode)


def _read(path: str) -> str:
    with open(path, "rb") as f:
        return f.read().decode("utf-8", errors="replace")


def _has_ended(pid: int) -> bool:
    """Whether child `pid` has ended; it is left a zombie (not reaped), so neither its pid nor its
    process group id can be taken by another process meanwhile."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already (by a child watcher that waits for any child)
        return True


async def _ended(pid: int) -> None:
    while not _has_ended(pid):
        await asyncio.sleep(POLL_S)


async def _close(process: subprocess.Popen) -> None:
    """Kill everything the call started and reap its process, on every path (ended, timed out, cancelled).

    The supervisor (`python_child`) is stopped, so that it can neither exit nor fork while every process
    below it is killed. Then it is let go to reap them (nothing is left to init) and exit, within
    `REAP_GRACE_S`; one stopped before it forked the worker is killed instead (nothing is below it). Its
    process group is killed last, for a member the walk missed (where no subreaper could be set)."""
    pid = process.pid
    try:
        if not _has_ended(pid):
            os.kill(pid, signal.SIGSTOP)
            python_child.kill_descendants(pid)
            forked = python_child.descendants(pid, zombies=True)
            os.kill(pid, signal.SIGCONT if forked else signal.SIGKILL)
        for _ in range(math.ceil(REAP_GRACE_S / POLL_S)):
            if _has_ended(pid):
                break
            await asyncio.sleep(POLL_S)
    finally:  # also when the event loop ends first
        if not _has_ended(pid):
            process.kill()
        with contextlib.suppress(ProcessLookupError):  # the group is gone already
            os.killpg(pid, signal.SIGKILL)  # the group id is the pid: start_new_session
        process.wait()


def _output(stdout: str, stderr: str, returncode: int) -> str:
    parts = [part.rstrip("\n") for part in (stdout, stderr) if part.strip()]
    if returncode != 0:
        parts.append(_exit_status(returncode))
    return "\n".join(parts) if parts else "(no output)"
