"""Where a tool's synchronous code runs: a daemon thread of its own per call (`ToolThreads`).

Why a thread and not a process that could be killed: a user's tool is a function of the trainer's own
process; it may use what its module loaded (a model, a client, a cache) and objects that do not pickle,
and a process per call would cost far more than most tools take. Why not the event loop's default
executor (``asyncio.to_thread``): ``asyncio.run`` joins that executor's threads when the loop ends, so
one call that never returns would hold the rollout -- and the training step -- until the worker timeout.

What happens to a call past its time limit: the model gets the timeout result at once and the
trajectory goes on; the thread cannot be stopped (Python has no safe way to kill a thread) and runs on
in the background; its result is dropped when it ends. Being a daemon thread, it holds neither the end
of the rollout nor the exit of the worker process. The damage is bounded: while `MAX_OVERDUE_CALLS`
calls of one tool are still running past their limit, further calls of that tool are refused at once
(a timeout result saying so) rather than starting yet another thread that may hang too; each overdue
call that ends frees its place.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Callable
from typing import Any

MAX_OVERDUE_CALLS = 4  # per tool: threads still running past their time limit before calls are refused


class ToolExit(Exception):
    """A tool raised SystemExit (or, in its thread, KeyboardInterrupt); ``original`` is what it raised.

    It travels as an ordinary Exception because asyncio ends the event loop on a SystemExit or
    KeyboardInterrupt that leaves a task, however the task's awaiter handles it (see `contained`)."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


class ToolOverdue(TimeoutError):
    """A call refused because earlier calls of its tool are still running past their time limit."""


async def contained(awaitable: Any) -> Any:
    """Await a tool's coroutine; a SystemExit it raises comes out as a `ToolExit`.

    asyncio's task step stores a SystemExit or KeyboardInterrupt raised by the task's coroutine in the
    task and then re-raises it out of the event loop (``Task.__step``, ``Handle._run``): ``asyncio.run``
    ends with it, whoever awaits the task. ``asyncio.wait_for`` runs what it is given in a task of its
    own, so the exception must be caught inside that task, by this coroutine. A KeyboardInterrupt is
    let through: a real Ctrl-C lands in whatever code the main thread runs, a tool's included, and must
    still stop the worker (in a tool's thread no signal lands: there `ToolThreads` contains it)."""
    try:
        return await awaitable
    except SystemExit as error:
        raise ToolExit(error) from None


class ToolThreads:
    """Runs the synchronous code of one tool, a daemon thread per call (see the module docstring)."""

    def __init__(self, tool_name: str, max_overdue: int = MAX_OVERDUE_CALLS) -> None:
        self.tool_name = tool_name
        self.max_overdue = max_overdue
        self.overdue = 0  # calls abandoned at their limit whose thread still runs
        self._lock = threading.Lock()

    async def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in a new daemon thread; its result, or what it raised (SystemExit and
        KeyboardInterrupt as a `ToolExit`). Cancelled (the call's time limit), the thread runs on."""
        with self._lock:
            if self.overdue >= self.max_overdue:
                raise ToolOverdue(
                    f"tool '{self.tool_name}' was not run: {self.overdue} earlier calls of it are still "
                    "running past their time limit"
                )
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        state = {"finished": False, "abandoned": False}

        def target() -> None:
            try:
                outcome: tuple[bool, Any] = (True, fn(*args, **kwargs))
            except BaseException as error:
                outcome = (False, error if isinstance(error, Exception) else ToolExit(error))
            with self._lock:
                state["finished"] = True
                if state["abandoned"]:  # nobody waits for it any more
                    self.overdue -= 1
                    return
            with contextlib.suppress(RuntimeError):  # the event loop has closed meanwhile
                loop.call_soon_threadsafe(_settle, future, outcome)

        threading.Thread(target=target, name=f"tool {self.tool_name}", daemon=True).start()
        try:
            return await future
        except asyncio.CancelledError:  # timed out or cancelled: the thread runs on, counted
            with self._lock:
                if not state["finished"]:
                    state["abandoned"] = True
                    self.overdue += 1
            raise


def _settle(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    if future.done():  # cancelled meanwhile
        return
    ok, value = outcome
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


async def call_tool_code(threads: ToolThreads, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Call `fn`, a tool's function or method: a coroutine function is awaited in the event loop, any
    other callable runs in a thread of `threads` (an awaitable it returns is then awaited too)."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    value = await threads.run(fn, *args, **kwargs)
    return await value if inspect.isawaitable(value) else value
