"""Faulty tools through the agent loop on a scripted model (no vLLM): a tool that exits, a sync tool
that hangs and python code that forks each give the model an error observation, counted in the
metrics, and the trajectory goes on; a trajectory over its time limit ends with what it has."""

import asyncio
import json
import sys
import threading
import time

import pytest

from tandem.rollout import SamplingParams
from tandem.rollout.async_engine import TurnRequest
from tandem.tools import PythonTool, ToolSet, tool
from tandem.trainer.metrics import agent_metrics

from .test_agent import ScriptedModel, one_prompt, tool_loop


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@tool
def leave(code: int) -> str:
    """Ends the program (a user's tool calling sys.exit)."""
    sys.exit(code)


def faulty_tools(release: threading.Event) -> ToolSet:
    @tool(timeout_s=0.3)
    def wait_forever(x: int) -> str:
        """A sync tool that never returns (until the test ends)."""
        release.wait()
        return "late"

    return ToolSet([leave, wait_forever, PythonTool(timeout_s=1.0)], max_result_chars=2000)


# 20 plain children that would write a file after the call's limit, and a parent that never ends
FORK_AND_HANG = """\
import os, time
for i in range(20):
    if os.fork() == 0:
        time.sleep(2)
        open(os.path.join({folder!r}, str(i)), 'w').write('outlived the call')
        os._exit(0)
time.sleep(60)
"""


@pytest.mark.timeout(120)  # before the fixes: SystemExit out of asyncio.run, or a wait for ever
def test_an_exiting_a_hanging_and_a_forking_tool_are_counted_errors_and_the_trajectory_answers(
    tokenizer, tmp_path
):
    release = threading.Event()
    turns = [
        call("leave", code=2),
        call("wait_forever", x=1),
        call("python", code=FORK_AND_HANG.format(folder=str(tmp_path))),
        "408",
    ]
    model = ScriptedModel(tokenizer, turns)
    loop = tool_loop(tokenizer, faulty_tools(release), max_assistant_turns=5)
    try:
        out = loop.generate(lambda: model, one_prompt(tokenizer), SamplingParams(max_tokens=2000))
    finally:
        release.set()
    trajectory = out["trajectory"][0]
    observations = [m["content"] for m in trajectory["messages"] if m["role"] == "tool"]
    assert observations == [
        "error: SystemExit: 2",
        "error: the tool did not answer within 0.3 s",
        "error: the tool did not answer within 1 s",
    ]
    # each observation reached the model's next turn
    for i, text in enumerate(observations, start=1):
        assert f"<|im_start|>tool\n{text}<|im_end|>" in tokenizer.decode(model.contexts[i])
    assert (trajectory["finish"], trajectory["final_answer"]) == ("answer", "408")
    metrics = agent_metrics(out)
    assert metrics["agent/tool_calls_per_sample"] == 3.0
    assert metrics["agent/tool_errors"] == 3.0
    assert metrics["agent/tool_timeouts"] == 2.0  # the hanging function and the python call
    assert metrics["agent/turns/mean"] == 4.0
    assert metrics["agent/finish_time_limit_ratio"] == 0.0
    time.sleep(3)  # past the children's sleep: none outlived the python call
    assert list(tmp_path.iterdir()) == []


class StallingModel(ScriptedModel):
    """Its turns after the given ones never finish (an engine stuck, or a context too long to wait for)."""

    async def generate(self, request: TurnRequest):
        if not self.turns:
            self.contexts.append(list(request.prompt_ids))
            await asyncio.Event().wait()
        return await super().generate(request)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stuck_in", ["tool", "generation"])
def test_a_trajectory_over_its_time_limit_ends_with_what_it_has(tokenizer, stuck_in):
    @tool(timeout_s=60)
    async def slow(x: int) -> str:
        """Answers within its own limit, but after the trajectory's."""
        await asyncio.sleep(30)
        return "late"

    @tool
    def echo(x: int) -> str:
        """Echoes x."""
        return f"x={x}"

    turns = [call("echo", x=1), call("slow", x=2)] if stuck_in == "tool" else [call("echo", x=1)]
    model = StallingModel(tokenizer, turns)
    loop = tool_loop(tokenizer, ToolSet([slow, echo]), max_assistant_turns=5, trajectory_timeout_s=1.0)
    out = loop.generate(lambda: model, one_prompt(tokenizer), SamplingParams(max_tokens=300))
    trajectory = out["trajectory"][0]
    assert trajectory["finish"] == "time_limit"
    roles = [m["role"] for m in trajectory["messages"]]
    # what it had: the first call and its answer; then the second call (cut while it ran) or nothing
    assert roles == (
        ["user", "assistant", "tool", "assistant"] if stuck_in == "tool" else ["user", "assistant", "tool"]
    )
    assert trajectory["messages"][2]["content"] == "x=1"
    # the tokens are those of the finished turns and the inserted answer, masked as always
    kept = tokenizer.decode(out["responses"][0][out["attention_mask"][0, -300:].bool()])
    assert kept.startswith(call("echo", x=1) + "<|im_end|>\n<|im_start|>tool\nx=1<|im_end|>")
    assert kept.endswith(
        call("slow", x=2) + "<|im_end|>" if stuck_in == "tool" else "<|im_start|>assistant\n"
    )
    metrics = agent_metrics(out)
    assert metrics["agent/finish_time_limit_ratio"] == 1.0
    assert metrics["agent/tool_calls_per_sample"] == 1.0  # the cut call was never answered
    assert metrics["agent/tool_errors"] == 0.0


def test_the_trajectory_time_limit_must_be_positive(tokenizer):
    with pytest.raises(ValueError, match="trajectory_timeout_s must be > 0"):
        tool_loop(tokenizer, trajectory_timeout_s=0)
