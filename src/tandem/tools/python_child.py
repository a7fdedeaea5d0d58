"""The program the python tool starts (``python -I -c <this file's text> CPU AS FSIZE CODE``), and the
process-tree walk both sides use.

The started process is a supervisor: it makes itself a child subreaper (Linux ``prctl``), so that a
process below it whose parent ends is re-parented to it rather than to init, and forks the worker that
sets the resource limits and runs the code. When the worker ends, however it ends (normal exit,
``sys.exit``, ``os._exit``, killed by a limit), the supervisor kills every process still below it --
children in the worker's process group, children that started a session of their own, double-forked
orphans -- reaps them, and exits as the worker did (its exit code, or the same signal).

The python tool kills the same tree from outside when the call times out or is cancelled
(`kill_descendants` of the supervisor, which is not running user code and stays up to reap).

Standard library only: it runs in a fresh ``-I`` interpreter, where Tandem may not be importable.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import sys
import time
import traceback

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
KILL_PASSES = 200  # each pass kills what the last one missed (children forked meanwhile)


def descendants(root: int, *, zombies: bool = False) -> list[int]:
    """The processes below `root` (not the zombies among them, unless asked), from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, parent = f.read().rsplit(")", 1)[1].split()[:2]  # the name may hold ")"
        except (OSError, ValueError, IndexError):  # ended meanwhile
            continue
        if zombies or state not in ("Z", "X"):
            children.setdefault(int(parent), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def kill_descendants(root: int) -> None:
    """SIGKILL every process below `root` until a pass finds none alive (one forked meanwhile is
    found by the next pass; a killed one takes a moment to turn into a zombie)."""
    signalled: set[int] = set()
    for _ in range(KILL_PASSES):
        alive = descendants(root)
        if not alive:
            return
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                os.kill(pid, signal.SIGKILL)
        if signalled.issuperset(alive):  # all already signalled: give them time to die
            time.sleep(0.005)
        signalled.update(alive)


def _become_subreaper() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: orphans of the code's children go to init
        return


def _run_code(limits: list[str], code: str) -> None:
    """In the worker: set the limits, run the code as __main__ with a traceback that starts at the code."""
    for name, value in zip(("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_FSIZE"), limits, strict=True):
        resource.setrlimit(getattr(resource, name), (int(value), int(value)))
    sys.argv = ["-c"]
    try:
        exec(compile(code, "<code>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except Exception as error:
        traceback.print_exception(type(error), error, error.__traceback__.tb_next)
        sys.exit(1)
    sys.exit(0)


def _exit_like(status: int) -> None:
    """End this process as the worker ended: its exit code, or killed by the same signal."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code  # a signal whose default is not to end the process
    os._exit(code)


def main(argv: list[str]) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a worker killed by SIGXCPU writes no core file
    _become_subreaper()
    worker = os.fork()
    if worker == 0:
        _run_code(argv[:3], argv[3])  # never returns: the worker exits through sys.exit
    _, status = os.waitpid(worker, 0)
    kill_descendants(os.getpid())
    while True:  # reap the killed ones: no zombie is left to init
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    _exit_like(status)


if __name__ == "__main__":
    main(sys.argv[1:])
