"""Tools that exit or hang, of every kind (async and sync functions, verl-style stateful classes and
foreign objects): each is an error result and the event loop goes on; a real Ctrl-C still stops it."""

import asyncio
import sys
import threading

import pytest

from tandem.tools import ToolSet, tool
from tandem.tools.stateful import ForeignTool, StatefulTool, ToolSession
from tandem.tools.threads import MAX_OVERDUE_CALLS, ToolThreads

SCHEMA = {
    "type": "function",
    "function": {"name": "probe", "parameters": {"type": "object", "properties": {}}},
}


@tool
def sync_exit() -> str:
    """sys.exit() in a sync tool."""
    sys.exit(2)


@tool
async def async_exit() -> str:
    """sys.exit() in an async tool."""
    sys.exit(2)


class SyncStatefulExit(StatefulTool):
    def execute(self, instance_id, parameters, **kwargs):
        sys.exit(2)


class AsyncStatefulExit(StatefulTool):
    async def execute(self, instance_id, parameters, **kwargs):
        sys.exit(2)


class ForeignExit:
    def execute(self, instance_id, parameters, **kwargs):
        sys.exit(2)


def exiting_tools():
    return [
        sync_exit,
        async_exit,
        SyncStatefulExit(tool_schema=SCHEMA),
        AsyncStatefulExit(tool_schema=SCHEMA),
        ForeignTool(ForeignExit(), SCHEMA),
    ]


@pytest.mark.parametrize("exiting", exiting_tools(), ids=lambda t: type(t).__name__ + "-" + t.name)
@pytest.mark.parametrize("through", ["toolset", "session"])
def test_a_tool_that_calls_sys_exit_is_an_error_result_and_the_loop_goes_on(exiting, through):
    toolset = ToolSet([exiting])

    async def calls():
        # without containment, asyncio re-raises the SystemExit out of the loop: asyncio.run ends with it
        session = ToolSession(toolset, {})
        run = toolset.run if through == "toolset" else session.run
        results = [await run(exiting.name, {}) for _ in range(2)]
        await session.close()
        return results

    for result in asyncio.run(calls()):
        assert (result.text, result.error) == ("error: SystemExit: 2", "raised")


def test_keyboard_interrupt_in_a_tools_thread_is_its_own_error_but_in_the_loop_it_stops_the_run():
    @tool
    def sync_interrupt() -> str:
        """No signal lands in a thread: this is the tool's own raise."""
        raise KeyboardInterrupt

    @tool
    async def async_interrupt() -> str:
        """In the event loop a KeyboardInterrupt may be a real Ctrl-C: it must stop the run."""
        raise KeyboardInterrupt

    toolset = ToolSet([sync_interrupt, async_interrupt])
    result = asyncio.run(toolset.run("sync_interrupt", {}))
    assert (result.text, result.error) == ("error: KeyboardInterrupt", "raised")
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(toolset.run("async_interrupt", {}))


def hanging_tools(release: threading.Event):
    @tool(timeout_s=0.2)
    def hangs() -> str:
        """A sync tool that does not return until the test lets it."""
        release.wait()
        return "late"

    return hangs


@pytest.mark.timeout(120)  # before the fix, asyncio.run waited for the thread for ever
def test_a_hanging_sync_tool_is_cut_at_its_limit_and_asyncio_run_does_not_wait_for_its_thread():
    release = threading.Event()
    hangs = hanging_tools(release)
    toolset = ToolSet([hangs])
    try:
        result = asyncio.run(toolset.run("hangs", {}))  # returns: the loop did not join the thread
        assert (result.text, result.error) == ("error: the tool did not answer within 0.2 s", "timeout")
        assert hangs.threads.overdue == 1
        alive = [t for t in threading.enumerate() if t.name == "tool hangs"]
        assert len(alive) == 1 and alive[0].daemon  # it runs on, and holds no exit of the process
    finally:
        release.set()
    alive[0].join(30)
    assert hangs.threads.overdue == 0  # an overdue call that ends frees its place


@pytest.mark.timeout(120)
def test_overdue_threads_of_a_tool_are_bounded_then_its_calls_are_refused():
    release = threading.Event()
    hangs = hanging_tools(release)
    toolset = ToolSet([hangs])

    async def calls(n):
        return await asyncio.gather(*(toolset.run("hangs", {}) for _ in range(n)))

    try:
        results = asyncio.run(calls(MAX_OVERDUE_CALLS)) + asyncio.run(calls(2))
        texts = [r.text for r in results]
        assert (
            texts[:MAX_OVERDUE_CALLS] == ["error: the tool did not answer within 0.2 s"] * MAX_OVERDUE_CALLS
        )
        refused = (
            f"error: tool 'hangs' was not run: {MAX_OVERDUE_CALLS} earlier calls of it are still running "
            "past their time limit"
        )
        assert texts[MAX_OVERDUE_CALLS:] == [refused, refused]
        assert [r.error for r in results] == ["timeout"] * (MAX_OVERDUE_CALLS + 2)
        assert len([t for t in threading.enumerate() if t.name == "tool hangs"]) == MAX_OVERDUE_CALLS
    finally:
        release.set()
    for thread in [t for t in threading.enumerate() if t.name == "tool hangs"]:
        thread.join(30)
    assert hangs.threads.overdue == 0
    assert asyncio.run(toolset.run("hangs", {})).text == "late"  # called again once they ended


@pytest.mark.timeout(120)
def test_a_stateful_tools_hanging_sync_execute_times_out_and_its_instance_is_still_released():
    release, released = threading.Event(), []

    class Stuck(StatefulTool):
        def execute(self, instance_id, parameters, **kwargs):
            release.wait()
            return "late", 0.0, {}

        def release(self, instance_id, **kwargs):
            released.append(instance_id)

    stuck = Stuck(tool_schema=SCHEMA)
    toolset = ToolSet([stuck], timeout_s=0.2)

    async def trajectory():
        async with ToolSession(toolset, {}) as session:
            return await session.run("probe", {})

    try:
        result = asyncio.run(trajectory())
        assert (result.text, result.error) == ("error: the tool did not answer within 0.2 s", "timeout")
        assert len(released) == 1 and stuck.threads.overdue == 1
    finally:
        release.set()


def test_calc_reward_and_release_that_exit_are_logged_and_the_trajectory_ends(caplog):
    class ExitsAtTheEnd(StatefulTool):
        async def execute(self, instance_id, parameters, **kwargs):
            return "ok", 0.5, {}

        def calc_reward(self, instance_id, **kwargs):
            sys.exit(3)

        async def release(self, instance_id, **kwargs):
            sys.exit(4)

    toolset = ToolSet([ExitsAtTheEnd(tool_schema=SCHEMA)])

    async def trajectory():
        session = ToolSession(toolset, {})
        result = await session.run("probe", {})
        return result, await session.close()

    result, rewards = asyncio.run(trajectory())
    assert (result.text, result.reward, rewards) == ("ok", 0.5, {})
    assert "calc_reward failed (SystemExit: 3)" in caplog.text
    assert "failed (SystemExit: 4)" in caplog.text


def test_tool_threads_give_back_what_the_function_raised_or_returned():
    threads = ToolThreads("t")

    def divide(a, b):
        return a / b

    assert asyncio.run(threads.run(divide, 6, b=3)) == 2.0
    with pytest.raises(ZeroDivisionError):
        asyncio.run(threads.run(divide, 1, 0))
    assert threads.overdue == 0
