"""A reward function sees the agent loop's whole trajectory: a batch made by AgentLoop (on a
scripted model, no vLLM) goes through the RewardManager to a custom reward file that reports back
what it was given."""

import json

import numpy as np
import pytest
import torch

from tandem.data.prompts import collate_prompts
from tandem.models.tiny import IM_END, build_tokenizer
from tandem.rewards import RewardManager
from tandem.rollout import SamplingParams
from tandem.rollout.agent import AgentLoop, AgentSettings
from tandem.rollout.async_engine import TurnEngine, TurnOutput, TurnRequest
from tandem.tools import build_toolset

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>'
WIDTH = 200

# Reports, as scorer fields, what it was called with; scores the exact final answer.
SCORER = """
import json


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    info = extra_info or {}
    trajectory = info.get("trajectory")
    fields = {"score": float(solution_str == ground_truth), "solution_str": solution_str, "i": info.get("i")}
    if trajectory is None:
        return {**fields, "trajectory_keys": ""}
    messages = trajectory["messages"]
    return {
        **fields,
        "trajectory_keys": ",".join(sorted(trajectory)),
        "roles": ",".join(m["role"] for m in messages),
        "tool_calls": json.dumps([m.get("tool_calls") for m in messages if m["role"] == "assistant"]),
        "tool_results": json.dumps([m["content"] for m in messages if m["role"] == "tool"]),
        "num_turns": trajectory["num_turns"],
        "num_tool_calls": trajectory["num_tool_calls"],
        "finish": trajectory["finish"],
        "final_answer": trajectory["final_answer"],
    }
"""


class Scripted(TurnEngine):
    """Answers each turn with the next text, ended by <|im_end|>."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns = tokenizer, list(turns)

    async def generate(self, request: TurnRequest) -> TurnOutput:
        text = self.turns.pop(0)
        ids = [
            *self.tokenizer(text, add_special_tokens=False)["input_ids"],
            self.tokenizer.convert_tokens_to_ids(IM_END),
        ]
        return TurnOutput(ids, [-1.0] * len(ids), "stop", 0.0)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def agent_batch(tokenizer):
    """What the agent loop gives the controller for one prompt: a calculator call, then "408"."""
    messages = [{"role": "user", "content": "12*34"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    item = {
        "input_ids": tokenizer(rendered, add_special_tokens=False)["input_ids"],
        "raw_prompt": messages,
        "data_source": "tool_arith",
        "ground_truth": "408",
        "extra_info": {"i": 7},
        "index": 0,
    }
    loop = AgentLoop(
        tokenizer,
        [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)],
        settings=AgentSettings(max_assistant_turns=3),
        tools=build_toolset(["calculator"]),
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Scripted(tokenizer, [CALL, "408"])
    return loop.generate(
        lambda: model, collate_prompts([item], tokenizer.pad_token_id), SamplingParams(max_tokens=WIDTH)
    )


def test_the_reward_function_sees_the_trajectory_and_scores_the_final_answer(tokenizer, tmp_path):
    (tmp_path / "reward.py").write_text(SCORER)
    batch = agent_batch(tokenizer)
    result = RewardManager(tokenizer, custom_reward_file=tmp_path / "reward.py", num_workers=0)(batch)

    assert result.extra["error"].tolist() == [""]
    # solution_str is the final answer alone, not the decoded trajectory (call, tool result, answer)
    assert result.extra["solution_str"].tolist() == ["408"]
    assert result.scores.tolist() == [1.0]
    keys = set(result.extra["trajectory_keys"][0].split(","))
    assert keys >= {"messages", "num_turns", "num_tool_calls", "finish", "final_answer"}
    assert result.extra["roles"].tolist() == ["user,assistant,tool,assistant"]
    tool_calls = [
        [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12*34"}}}],
        None,
    ]
    assert json.loads(result.extra["tool_calls"][0]) == tool_calls
    assert json.loads(result.extra["tool_results"][0]) == ["408"]
    np.testing.assert_array_equal(result.extra["num_turns"], [2.0])
    np.testing.assert_array_equal(result.extra["num_tool_calls"], [1.0])
    assert result.extra["finish"].tolist() == ["answer"]
    assert result.extra["final_answer"].tolist() == ["408"]
    # the prompt's own extra_info is kept beside the trajectory
    np.testing.assert_array_equal(result.extra["i"], [7.0])
    # the score sits on the model's last token (the final turn's <|im_end|>), not on an inserted one
    last_model_token = int(torch.nonzero(batch["response_mask"][0]).max())
    expected = torch.zeros(1, WIDTH)
    expected[0, last_model_token] = 1.0
    assert torch.equal(result.token_level_scores, expected)


def test_without_a_trajectory_column_the_reward_function_gets_the_decoded_response(tokenizer, tmp_path):
    (tmp_path / "reward.py").write_text(SCORER)
    batch = agent_batch(tokenizer)
    single_turn = batch.exclude("trajectory")
    result = RewardManager(tokenizer, custom_reward_file=tmp_path / "reward.py", num_workers=0)(single_turn)
    decoded = tokenizer.decode(
        batch["responses"][0][batch["response_mask"][0].bool()], skip_special_tokens=True
    )
    assert decoded == CALL + "408"  # the model's tokens of both turns, what the synchronous path would score
    assert result.extra["solution_str"].tolist() == [decoded]
    assert result.extra["trajectory_keys"].tolist() == [""]
    assert result.scores.tolist() == [0.0]
