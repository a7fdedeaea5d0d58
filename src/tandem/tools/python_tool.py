"""The built-in ``python`` tool: run a snippet in a fresh Python process and return what it printed.

What it does: each call starts ``sys.executable -I`` (isolated mode: no user site-packages, no
PYTHON* variables, the script's directory not on sys.path) in a session and process group of its
own, with a new empty temporary directory as its working directory (deleted afterwards), stdout
and stderr written to files beside that directory, stdin from /dev/null, and a minimal environment
(PATH, HOME = the working directory, a UTF-8 locale). Before the code runs, resource limits are
set: CPU seconds (RLIMIT_CPU, the wall limit rounded up), address space (RLIMIT_AS) and the size of
any file written (RLIMIT_FSIZE, which also caps what it prints). At the wall-clock limit, when the
call is cancelled, and after a normal exit too, the whole process group is killed and reaped.

What it does NOT isolate -- it is not a security sandbox: the code runs as the trainer's user,
can reach the network, can read (and write) any file that user can reach through an absolute
path (checkpoints, datasets, credentials in the home directory), can signal or inspect that user's
other processes, and can escape the process group kill by starting a new session. The number of
processes is not limited (RLIMIT_NPROC counts all of the user's processes, so no safe value
exists). For code from a model you do not trust, run the trainer in a container or VM.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import sys
import tempfile
from typing import Any, ClassVar

from tandem.tools.base import Tool
from tandem.tools.names import PYTHON

MAX_CODE_CHARS = 100_000  # the code travels as a command-line argument (Linux caps one at 128 KiB)

# Runs in the child: set the limits, then run the code as __main__ with a traceback that starts
# at the code (not at this wrapper).
_WRAPPER = """\
import resource, sys, traceback
for _name, _value in zip(("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_FSIZE"), sys.argv[1:4]):
    resource.setrlimit(getattr(resource, _name), (int(_value), int(_value)))
_code = sys.argv[4]
sys.argv = ["-c"]
try:
    exec(compile(_code, "<code>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
except Exception as _error:
    traceback.print_exception(type(_error), _error, _error.__traceback__.tb_next)
    sys.exit(1)
"""


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
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-c",
            _WRAPPER,
            *map(str, limits),
            code,
            cwd=workdir,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        try:
            return await asyncio.wait_for(process.wait(), self.timeout_s)
        except TimeoutError:
            raise TimeoutError(f"the code did not finish within {self.timeout_s:g} s") from None
        finally:  # also when the toolset cancels the call
            await _kill_group(process)  # and children it left running


def _read(path: str) -> str:
    with open(path, "rb") as f:
        return f.read().decode("utf-8", errors="replace")


async def _kill_group(process: Any) -> None:
    """Kill the process group (the code's children too) and reap the process: no zombie stays."""
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(process.pid, signal.SIGKILL)  # the group id is the pid: start_new_session
    if process.returncode is None:
        await asyncio.shield(process.wait())


def _output(stdout: str, stderr: str, returncode: int) -> str:
    parts = [part.rstrip("\n") for part in (stdout, stderr) if part.strip()]
    if returncode != 0:
        parts.append(_exit_status(returncode))
    return "\n".join(parts) if parts else "(no output)"
