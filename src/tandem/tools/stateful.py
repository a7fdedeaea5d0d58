"""Tools with a state per trajectory (verl's ``BaseTool`` life cycle), and the session that runs them.

A `StatefulTool` is created once per trajectory, on its first call there, with the row's
``extra_info.tools_kwargs[tool_name]["create_kwargs"]``; each call is ``execute``, which returns the
text the model reads, a step reward and metrics; when the trajectory ends the session asks
``calc_reward`` and ``release``s the instance, on every path (answer, error, timeout, cancelled).
Each method, ``async`` or plain, runs under the toolset's time limit as a plain tool's call does: a
coroutine is cancelled at it, a plain method runs in a thread of the tool's own that is left behind at
it (tools/threads.py); a SystemExit it raises is an error result, not the end of the rollout.

verl's ``ToolAgentLoop`` creates and releases an instance around every single call; verl's
``BaseTool`` says an instance lives for a trajectory, and its GSM8K tool compares each answer with
the previous one of the same instance ("no better than before": -0.05). Tandem keeps the instance
for the trajectory, so that comparison means what the tool says.

Plain `Tool`s (``@tool`` functions, the built-ins) have no state: a session runs them through
`ToolSet.run` and ignores their tools_kwargs.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
import uuid
from typing import Any

from tandem.tools.base import BadToolResult, Tool, ToolResult, ToolSet, check_arguments, describe
from tandem.tools.threads import ToolThreads, call_tool_code, contained

logger = logging.getLogger(__name__)

# The parts of a row's extra_info.tools_kwargs[tool_name] (verl's names).
LIFE_CYCLE_KWARGS = ("create_kwargs", "execute_kwargs", "calc_reward_kwargs", "release_kwargs")


async def maybe_await(value: Any) -> Any:
    """`value`, awaited when a method returned an awaitable (verl's tools are async; sync ones work too)."""
    return await value if inspect.isawaitable(value) else value


class StatefulTool(Tool):
    """verl's ``BaseTool`` life cycle: ``create`` / ``execute`` / ``calc_reward`` / ``release`` per instance.

    Built as verl builds a tool from its YAML entry: ``config`` (the entry's ``config`` dict) and
    ``tool_schema`` (the entry's OpenAI function schema, a plain dict here) which gives ``name``,
    ``description`` and ``parameters``. Methods may be ``async`` or plain. Subclasses implement
    ``execute``; ``create`` / ``calc_reward`` / ``release`` default to nothing / 0.0 / nothing."""

    def __init__(
        self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None
    ) -> None:
        self.config = dict(config or {})
        if tool_schema is not None:
            function = tool_schema.get("function", tool_schema)
            self.name = function["name"]
            self.description = function.get("description", "")
            self.parameters = function.get("parameters") or {"type": "object", "properties": {}}

    async def create(self, instance_id: str, **create_kwargs: Any) -> Any:
        """Start the state of one trajectory (`create_kwargs`: the row's `tools_kwargs[name]["create_kwargs"]`)."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **execute_kwargs: Any) -> Any:
        """One call: ``(text, step_reward, metrics)``; text may be an object with a ``.text`` (verl's ToolResponse)."""
        raise NotImplementedError(f"{type(self).__name__} must implement execute(instance_id, parameters)")

    async def calc_reward(self, instance_id: str, **calc_reward_kwargs: Any) -> float:
        """The instance's reward at the end of the trajectory (verl's ``calc_reward``)."""
        return 0.0

    async def release(self, instance_id: str, **release_kwargs: Any) -> None:
        """Drop the instance's state."""

    @property
    def threads(self) -> ToolThreads:
        """Where this tool's plain (not ``async``) methods run; made on first use (a subclass may skip
        ``__init__``)."""
        if "_threads" not in self.__dict__:
            self.__dict__["_threads"] = ToolThreads(self.name)
        return self.__dict__["_threads"]

    async def invoke(self, method: Any, /, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)`` awaited: in the event loop if ``async``, else in a thread of `threads`."""
        return await call_tool_code(self.threads, method, *args, **kwargs)

    async def call(self, **arguments: Any) -> str:
        """One call in an instance of its own (`ToolSet.run` outside a trajectory): create, execute, release."""
        instance_id = uuid.uuid4().hex
        await self.invoke(self.create, instance_id)
        try:
            text, _, _ = unpack_execute(await self.invoke(self.execute, instance_id, arguments), self.name)
            return text
        finally:
            await self.invoke(self.release, instance_id)


class ForeignTool(StatefulTool):
    """An object of another class with verl's tool methods (``execute``, and optionally ``create``,
    ``calc_reward``, ``release``), as a `StatefulTool`; its name and schema come from the YAML entry."""

    def __init__(self, target: Any, tool_schema: dict[str, Any]) -> None:
        super().__init__(getattr(target, "config", None), tool_schema)
        self.target = target

    async def create(self, instance_id: str, **create_kwargs: Any) -> Any:
        if not hasattr(self.target, "create"):
            return None
        extra = {}
        if "create_kwargs" not in create_kwargs and _takes_any_keyword(self.target.create):
            # verl's agent loop passes them as one dict (create(create_kwargs={...})): a class written
            # for it reads them there, one written for verl's BaseTool as keywords; both get them
            extra["create_kwargs"] = dict(create_kwargs)
        return await self.invoke(self.target.create, instance_id, **create_kwargs, **extra)

    async def execute(self, instance_id: str, parameters: dict[str, Any], **execute_kwargs: Any) -> Any:
        return await self.invoke(self.target.execute, instance_id, parameters, **execute_kwargs)

    async def calc_reward(self, instance_id: str, **calc_reward_kwargs: Any) -> float:
        if hasattr(self.target, "calc_reward"):
            return await self.invoke(self.target.calc_reward, instance_id, **calc_reward_kwargs)
        return 0.0

    async def release(self, instance_id: str, **release_kwargs: Any) -> None:
        if hasattr(self.target, "release"):
            await self.invoke(self.target.release, instance_id, **release_kwargs)

    def __repr__(self) -> str:
        return f"ForeignTool({self.name!r}, {type(self.target).__qualname__})"


def _takes_any_keyword(method: Any) -> bool:
    """Whether `method` has a ``**kwargs`` parameter."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin)
        return False
    return any(p.kind is p.VAR_KEYWORD for p in parameters)


def unpack_execute(value: Any, name: str) -> tuple[str, float | None, dict[str, Any]]:
    """(text, step reward, metrics) of what ``execute`` returned; a `BadToolResult` saying what is wrong otherwise."""
    if not (isinstance(value, tuple | list) and len(value) == 3):
        raise BadToolResult(
            f"tool '{name}': execute must return (text, step_reward, metrics), got {type(value).__name__}"
        )
    text, reward, metrics = value
    if not isinstance(text, str):
        text = getattr(text, "text", None)
        text = "" if text is None and hasattr(value[0], "text") else text
    if not isinstance(text, str):
        raise BadToolResult(
            f"tool '{name}': execute's text must be a str (or have .text), got {type(value[0]).__name__}"
        )
    if reward is not None and (
        isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward)
    ):
        raise BadToolResult(
            f"tool '{name}': execute's step reward must be a finite number or None, got {reward!r}"
        )
    return text, None if reward is None else float(reward), dict(metrics or {})


class ToolSession:
    """The tools of one trajectory: `run` calls a tool (creating its instance on the first call), `close`
    asks each instance's reward and releases it. Like `ToolSet.run`, neither raises for what a tool does
    wrong: `run` gives an error result, `close` logs the failure and goes on with the next instance.

    ``tools_kwargs`` is the row's ``extra_info.tools_kwargs``: {tool name: {create_kwargs: {...},
    execute_kwargs: {...}, calc_reward_kwargs: {...}, release_kwargs: {...}}}."""

    def __init__(self, toolset: ToolSet, tools_kwargs: dict[str, Any] | None = None) -> None:
        self.toolset = toolset
        self.tools_kwargs = tools_kwargs if isinstance(tools_kwargs, dict) else {}
        self.instances: dict[str, str] = {}  # tool name -> instance id, in creation order
        self.rewards: dict[str, float] = {}  # tool name -> calc_reward at close
        self._creating: dict[str, asyncio.Lock] = {}

    def _kwargs(self, name: str, part: str) -> dict[str, Any]:
        entry = self.tools_kwargs.get(name)
        value = entry.get(part) if isinstance(entry, dict) else None
        return dict(value) if isinstance(value, dict) else {}

    async def run(self, name: str, arguments: Any) -> ToolResult:
        """Call tool `name` in this trajectory's instance; a `ToolResult` whose ``reward`` is the step reward."""
        tool = self.toolset.get(name)
        if not isinstance(tool, StatefulTool):
            return await self.toolset.run(name, arguments)
        start = time.perf_counter()
        problem = check_arguments(tool, arguments)
        if problem is not None:
            return self.toolset.failure(f"error: {problem}", "bad_arguments", start)
        value, failed = await self.toolset.attempt(tool, lambda: self._execute(tool, arguments), start)
        if failed is not None:
            return failed
        text, reward, _ = value
        return self.toolset.success(text, start, reward)

    async def _execute(self, tool: StatefulTool, arguments: dict[str, Any]) -> tuple[str, float | None, dict]:
        lock = self._creating.setdefault(tool.name, asyncio.Lock())
        async with lock:  # two calls of one turn create one instance
            if tool.name not in self.instances:
                instance_id = uuid.uuid4().hex
                self.instances[tool.name] = instance_id  # before create: a failed create is released too
                await tool.invoke(tool.create, instance_id, **self._kwargs(tool.name, "create_kwargs"))
        instance_id = self.instances[tool.name]
        value = await tool.invoke(
            tool.execute, instance_id, arguments, **self._kwargs(tool.name, "execute_kwargs")
        )
        return unpack_execute(value, tool.name)

    async def close(self) -> dict[str, float]:
        """Each instance's ``calc_reward``, then its ``release`` (always, each under the toolset's time
        limit); the rewards by tool name. A failure is logged; the next instance goes on."""
        instances, self.instances = list(self.instances.items()), {}
        try:
            for name, instance_id in instances:
                await self._calc_reward(self.toolset[name], instance_id)
        finally:  # cancelled or not, every instance is released
            for name, instance_id in instances:
                await self._release(self.toolset[name], instance_id)
        return self.rewards

    async def _calc_reward(self, tool: StatefulTool, instance_id: str) -> None:
        kwargs = self._kwargs(tool.name, "calc_reward_kwargs")
        try:
            reward = await asyncio.wait_for(
                contained(tool.invoke(tool.calc_reward, instance_id, **kwargs)), self.toolset.limit(tool)
            )
            self.rewards[tool.name] = float(reward)
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except BaseException as error:
            logger.warning(
                "tool '%s': calc_reward failed (%s); its reward is left out", tool.name, describe(error)
            )

    async def _release(self, tool: StatefulTool, instance_id: str) -> None:
        kwargs = self._kwargs(tool.name, "release_kwargs")
        try:
            await asyncio.wait_for(
                contained(tool.invoke(tool.release, instance_id, **kwargs)), self.toolset.limit(tool)
            )
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except BaseException as error:
            logger.warning(
                "tool '%s': release of instance %s failed (%s)", tool.name, instance_id, describe(error)
            )

    async def __aenter__(self) -> ToolSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
