"""Tools the model calls in the agent loop, and the set that runs them.

`ToolSet.run` never raises for anything a tool or the model's call does wrong: an unknown name,
bad arguments, an exception (SystemExit too), a timeout or a non-text result each become a
`ToolResult` whose text the model reads (``error: ...``) and whose ``error`` field the agent loop
counts. The time limit holds for every kind of tool: a coroutine is cancelled at it; synchronous code
runs in a thread that is left behind at it (tools/threads.py says what happens to that thread).
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tandem.tools.threads import ToolExit, ToolOverdue, contained

TRUNCATE_SIDES = ("left", "right", "middle")
ERRORS = ("unknown_tool", "bad_arguments", "raised", "timeout", "bad_result")
# JSON schema type -> the Python types json.loads gives for it (bool is not an integer here).
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


class ToolConfigError(ValueError):
    """A tool or interaction file that cannot be used; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class ToolResult:
    """What one tool call gave: the text the model reads and, on failure, which kind (`ERRORS`)."""

    text: str
    error: str | None  # None on success
    seconds: float  # wall time of the call
    truncated: bool = False  # the text was cut to the toolset's max_result_chars
    reward: float | None = None  # a stateful tool's step reward (tools/stateful.py); None: it gave none


class BadToolResult(TypeError):
    """A tool gave something other than what its kind returns (a stateful tool's ``execute``: (text, step
    reward, metrics))."""


class Tool(ABC):
    """A function the model may call: a name, a description and a JSON schema of its arguments.

    ``parameters`` is an OpenAI-style schema of the arguments object:
    ``{"type": "object", "properties": {...}, "required": [...]}``. ``timeout_s`` is the tool's
    wall-clock limit per call (None: the toolset's)."""

    name: str
    description: str
    parameters: dict[str, Any]
    timeout_s: float | None = None

    @abstractmethod
    async def call(self, **arguments: Any) -> str:
        """Run the tool on the (already checked) arguments; return the text the model reads."""

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-calling entry the chat template lists."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def json_type_name(value: Any) -> str:
    """The JSON type of a parsed JSON value: "string", "integer", ... (a Python type name otherwise)."""
    if isinstance(value, bool):
        return "boolean"
    for name in ("string", "integer", "number", "array", "object", "null"):
        if isinstance(value, _JSON_TYPES[name]):
            return name
    return type(value).__name__


def _matches(value: Any, declared: Any) -> bool:
    """Whether `value` has the declared JSON type (a name or a list of names; unknown names pass)."""
    names = declared if isinstance(declared, list) else [declared]
    for name in names:
        types = _JSON_TYPES.get(name)
        if types is None or (
            isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        ):
            return True
    return False


def check_arguments(tool: Tool, arguments: Any) -> str | None:
    """None when `arguments` fit the tool's schema (keys and top-level JSON types), else what is wrong."""
    where = f"tool '{tool.name}'"
    if not isinstance(arguments, dict):
        return f"the arguments of {where} must be a JSON object, got {json_type_name(arguments)}"
    properties = tool.parameters.get("properties", {})
    for key in tool.parameters.get("required", []):
        if key not in arguments:
            kind = properties.get(key, {}).get("type")
            return f"{where} needs argument '{key}'" + (f" ({kind})" if isinstance(kind, str) else "")
    if tool.parameters.get("additionalProperties") is not True:
        for key in arguments:
            if key not in properties:
                return f"{where} has no argument '{key}'; its arguments: {', '.join(properties) or 'none'}"
    for key, value in arguments.items():
        declared = properties.get(key, {}).get("type")
        if declared is not None and not _matches(value, declared):
            wanted = " or ".join(declared) if isinstance(declared, list) else declared
            return f"argument '{key}' of {where} must be {wanted}, got {json_type_name(value)}"
    return None


def truncate(text: str, limit: int, side: str) -> str:
    """`text` cut to at most `limit` characters: "right" keeps the start, "left" the end, "middle"
    both ends around a marker such as ``...[1234 characters cut]...`` (plain cut if it does not fit)."""
    if len(text) <= limit:
        return text
    if side == "right":
        return text[:limit]
    if side == "left":
        return text[len(text) - limit :]
    # The marker's length depends on the count it shows: try counts of fewer and fewer digits.
    for digits in range(len(str(len(text))), 0, -1):
        marker_len = len("...[ characters cut]...") + digits
        kept = limit - marker_len
        if kept < 2:  # no room for both ends next to the marker
            break
        cut = len(text) - kept
        if len(str(cut)) == digits:
            head = kept - kept // 2
            return f"{text[:head]}...[{cut} characters cut]...{text[len(text) - kept // 2 :]}"
    return text[:limit]


class ToolSet:
    """The tools of a rollout: their schemas for the chat template, and `run` for the agent loop.

    ``timeout_s`` is the wall-clock limit of a call (a tool's own ``timeout_s`` wins);
    every text a call gives, results and errors alike, is cut to ``max_result_chars`` characters
    on ``truncate_side`` (left, right or middle)."""

    def __init__(
        self,
        tools: list[Tool],
        timeout_s: float = 10.0,
        max_result_chars: int = 256,
        truncate_side: str = "middle",
    ) -> None:
        if truncate_side not in TRUNCATE_SIDES:
            raise ValueError(
                f"truncate_side must be one of {', '.join(TRUNCATE_SIDES)}, got {truncate_side!r}"
            )
        if max_result_chars < 1:
            raise ValueError(f"max_result_chars must be >= 1, got {max_result_chars}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            if not isinstance(tool, Tool):
                raise TypeError(f"a ToolSet holds Tool instances, got {tool!r} ({type(tool).__name__})")
            if not isinstance(getattr(tool, "name", None), str) or not tool.name:
                raise ValueError(f"{type(tool).__name__} has no name: set its `name` to a non-empty string")
            params = getattr(tool, "parameters", None)
            if not isinstance(params, dict) or params.get("type") != "object":
                raise ValueError(
                    f'tool \'{tool.name}\': parameters must be a JSON schema dict with "type": "object", '
                    f"got {params!r}"
                )
            if tool.name in self._tools:
                raise ValueError(f"two tools are named '{tool.name}': tool names must be unique, rename one")
            self._tools[tool.name] = tool
        self.timeout_s = float(timeout_s)
        self.max_result_chars = int(max_result_chars)
        self.truncate_side = truncate_side

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def schemas(self) -> list[dict[str, Any]]:
        """The tools' OpenAI function-calling entries, in order."""
        return [tool.schema() for tool in self._tools.values()]

    async def run(self, name: str, arguments: Any) -> ToolResult:
        """Call tool `name`; whatever goes wrong comes back as an error result, never an exception."""
        start = time.perf_counter()
        tool = self._tools.get(name)
        if tool is None:
            available = ", ".join(self._tools) or "none"
            return self.failure(
                f"error: unknown tool {name!r}; available tools: {available}", "unknown_tool", start
            )
        problem = check_arguments(tool, arguments)
        if problem is not None:
            return self.failure(f"error: {problem}", "bad_arguments", start)
        value, failed = await self.attempt(tool, lambda: tool.call(**arguments), start)
        if failed is not None:
            return failed
        if not isinstance(value, str):
            return self.failure(
                f"error: tool '{name}' returned {type(value).__name__}, not str", "bad_result", start
            )
        return self.success(value, start)

    async def attempt(
        self, tool: Tool, call: Callable[[], Awaitable[Any]], start: float
    ) -> tuple[Any, ToolResult | None]:
        """(what `call()` gave, None), or (None, the error result) when it raised, timed out at the tool's
        limit or was refused; the one place a tool's fault becomes a result. A cancelled rollout or a
        Ctrl-C is not the tool's fault: it propagates."""
        limit = self.limit(tool)
        try:
            return await asyncio.wait_for(contained(call()), limit), None
        except (asyncio.CancelledError, KeyboardInterrupt):  # the rollout is stopped: not the tool's fault
            raise
        except ToolOverdue as error:
            return None, self.failure(f"error: {error}", "timeout", start)
        except TimeoutError:  # asyncio.TimeoutError is TimeoutError since Python 3.11
            return None, self.timed_out(limit, start)
        except BadToolResult as error:
            return None, self.failure(f"error: {error}", "bad_result", start)
        except BaseException as error:  # SystemExit too (as a ToolExit): a tool must not end the rollout
            return None, self.failure(f"error: {describe(error)}", "raised", start)

    def limit(self, tool: Tool) -> float:
        """The wall-clock limit of a call of `tool`: its own ``timeout_s``, else the toolset's."""
        return tool.timeout_s if tool.timeout_s is not None else self.timeout_s

    def timed_out(self, limit: float, start: float) -> ToolResult:
        """The result of a call cut at its time limit of `limit` seconds."""
        return self.failure(f"error: the tool did not answer within {limit:g} s", "timeout", start)

    def success(self, text: str, start: float, reward: float | None = None) -> ToolResult:
        """The result of a call that began at `start` (perf_counter) and gave `text`."""
        return self._result(text, None, start, reward)

    def failure(self, text: str, error: str, start: float) -> ToolResult:
        """The error result (`ERRORS` kind `error`) of a call that began at `start`."""
        return self._result(text, error, start, None)

    def _result(self, text: str, error: str | None, start: float, reward: float | None) -> ToolResult:
        cut = truncate(text, self.max_result_chars, self.truncate_side)
        return ToolResult(
            cut, error, time.perf_counter() - start, truncated=len(cut) < len(text), reward=reward
        )


def describe(error: BaseException) -> str:
    """ "ValueError: first line of the message" ("ValueError" when there is none); a `ToolExit` is
    described as what the tool raised ("SystemExit: 2")."""
    if isinstance(error, ToolExit):
        error = error.original
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
