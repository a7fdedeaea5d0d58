"""The agent loop's tool turns on a scripted model (no vLLM): calls of one turn run concurrently,
and a tool that outlives its time limit is an error observation counted as a timeout."""

import asyncio
import json
import time

import pytest

from tandem.rollout import SamplingParams
from tandem.tools import ToolSet, tool
from tandem.trainer.metrics import agent_metrics

from .test_agent import ScriptedModel, one_prompt, tool_loop

SLEEP_S = 0.3


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def sleepers(intervals: dict[str, list[float]]) -> ToolSet:
    """Two async tools that sleep SLEEP_S and record (start, end) under their name."""

    async def nap(name: str, tag: str) -> str:
        start = time.perf_counter()
        await asyncio.sleep(SLEEP_S)
        intervals[name] = [start, time.perf_counter()]
        return f"{name} woke {tag}"

    @tool
    async def sleep_a(tag: str) -> str:
        """Sleeps, then answers."""
        return await nap("sleep_a", tag)

    @tool
    async def sleep_b(tag: str) -> str:
        """Sleeps, then answers."""
        return await nap("sleep_b", tag)

    return ToolSet([sleep_a, sleep_b])


def test_calls_of_one_turn_run_concurrently_and_answer_in_call_order(tokenizer):
    intervals: dict[str, list[float]] = {}
    model = ScriptedModel(tokenizer, [call("sleep_a", tag="first") + call("sleep_b", tag="second"), "done"])
    loop = tool_loop(tokenizer, sleepers(intervals), max_parallel_calls=2, max_assistant_turns=3)
    out = loop.generate(lambda: model, one_prompt(tokenizer), SamplingParams(max_tokens=300))

    (a_start, a_end), (b_start, b_end) = intervals["sleep_a"], intervals["sleep_b"]
    # Each started before the other ended: the two sleeps overlapped in time.
    assert max(a_start, b_start) < min(a_end, b_end)

    messages = out["trajectory"][0]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert messages[2] == {"role": "tool", "content": "sleep_a woke first", "name": "sleep_a"}
    assert messages[3] == {"role": "tool", "content": "sleep_b woke second", "name": "sleep_b"}
    assert messages[1]["tool_calls"] == [
        {"type": "function", "function": {"name": "sleep_a", "arguments": {"tag": "first"}}},
        {"type": "function", "function": {"name": "sleep_b", "arguments": {"tag": "second"}}},
    ]
    # The second turn read both results, in call order, rendered by the chat template.
    second_context = tokenizer.decode(model.contexts[1])
    assert second_context.endswith(
        "<|im_start|>tool\nsleep_a woke first<|im_end|>\n"
        "<|im_start|>tool\nsleep_b woke second<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (out["agent_tool_calls"][0], out["agent_tool_errors"][0], out["agent_turns"][0]) == (2, 0, 2)
    # tool_seconds adds each call's own time: at least two sleeps, whatever the overlap
    assert out["agent_tool_seconds"][0] >= 2 * SLEEP_S


def test_a_tool_past_its_timeout_is_a_counted_error_and_the_trajectory_goes_on(tokenizer):
    @tool(timeout_s=0.05)
    async def stuck(x: int) -> str:
        """Answers far too late."""
        await asyncio.sleep(5)
        return "late"

    @tool
    def echo(x: int) -> str:
        """Echoes x."""
        return f"x={x}"

    turns = [call("stuck", x=1) + call("echo", x=2), "408"]
    model = ScriptedModel(tokenizer, turns)
    loop = tool_loop(tokenizer, ToolSet([stuck, echo]), max_parallel_calls=2, max_assistant_turns=3)
    started = time.perf_counter()
    out = loop.generate(lambda: model, one_prompt(tokenizer), SamplingParams(max_tokens=300))
    assert time.perf_counter() - started < 2.5  # the 5 s sleep was cut at the time limit

    trajectory = out["trajectory"][0]
    messages = trajectory["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert messages[2] == {
        "role": "tool",
        "content": "error: the tool did not answer within 0.05 s",
        "name": "stuck",
    }
    assert messages[3] == {"role": "tool", "content": "x=2", "name": "echo"}
    # The trajectory went on to a second turn that answered.
    assert trajectory["finish"] == "answer" and trajectory["final_answer"] == "408"
    assert trajectory["num_turns"] == 2 and trajectory["num_tool_calls"] == 2
    assert trajectory["num_tool_errors"] == 1
    assert out["agent_tool_timeouts"].tolist() == [1.0]
    assert out["agent_tool_errors"].tolist() == [1.0]
    assert out["agent_tool_calls"].tolist() == [2.0]
    assert out["agent_turns"].tolist() == [2.0]
    assert "did not answer within 0.05 s" in tokenizer.decode(model.contexts[1])
    # ... and the count reaches the step's metrics.
    metrics = agent_metrics(out)
    assert metrics["agent/tool_timeouts"] == 1.0
    assert metrics["agent/tool_errors"] == 1.0
    assert metrics["agent/tool_error_ratio"] == pytest.approx(0.5)
