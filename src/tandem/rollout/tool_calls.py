"""Tool calls in a model's turn, in the format its chat template defines.

``hermes`` (Qwen2.5, Qwen3, Hermes and most open chat templates): each call is a JSON object
``{"name": ..., "arguments": {...}}`` between ``<tool_call>`` and ``</tool_call>``. A block that is
not such an object is kept as a `ToolCall` with ``error`` set, so that the agent loop can answer
the model with what was wrong instead of dropping the call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_FORMATS = ("hermes",)
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
UNCLOSED = "a <tool_call> block is not closed with </tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for; ``error`` says why it cannot be run (then name may be "")."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def as_message_entry(self) -> dict[str, Any]:
        """The call as an OpenAI-style ``tool_calls`` entry of an assistant message."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def parse_tool_calls(text: str, fmt: str = "hermes") -> list[ToolCall]:
    """The tool calls in ``text`` in order; [] when it holds none (the turn is an answer).

    Blocks are read left to right, each up to the first ``</tool_call>`` after its opening: a block
    whose JSON is valid is a call even when its arguments hold the text ``<tool_call>`` (code that
    prints it); one that is not valid and holds a second opening was never closed, so it is an error
    call and reading goes on from that second opening (a later, well-formed call is not lost)."""
    if fmt != "hermes":
        raise ValueError(f"unknown tool call format {fmt!r}; known: {', '.join(TOOL_CALL_FORMATS)}")
    calls: list[ToolCall] = []
    position = text.find(HERMES_OPEN)
    while position >= 0:
        start = position + len(HERMES_OPEN)
        end = text.find(HERMES_CLOSE, start)
        if end < 0:  # opened and never closed: the model meant to call
            calls.append(ToolCall("", error=UNCLOSED))
            break
        body = text[start:end]
        call = _hermes_call(body)
        inner = body.find(HERMES_OPEN)
        if call.error is not None and inner >= 0:
            calls.append(ToolCall("", error=UNCLOSED))
            position = start + inner
            continue
        calls.append(call)
        position = text.find(HERMES_OPEN, end + len(HERMES_CLOSE))
    return calls


def _hermes_call(body: str) -> ToolCall:
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall("", error=f"the tool call is not valid JSON ({e.msg} at char {e.pos})")
    if not isinstance(payload, dict):
        return ToolCall("", error=f"the tool call must be a JSON object, got {type(payload).__name__}")
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall("", error='the tool call has no "name" string')
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as e:
            return ToolCall(name, error=f'"arguments" is a string that is not valid JSON ({e.msg})')
    if not isinstance(arguments, dict):
        return ToolCall(name, error=f'"arguments" must be a JSON object, got {type(arguments).__name__}')
    return ToolCall(name, arguments)
