"""verl-format multi-turn rows through the agent loop (a scripted model, no vLLM) and the reward
manager: the row's tools_kwargs reach verl's GSM8K tool from its YAML, its interaction_kwargs the
GSM8K interaction; the step rewards are summed into the score as the term tool_reward."""

import json
import sys
from pathlib import Path

import pytest

from tandem.data import PromptDataset, collate_prompts
from tandem.rewards import RewardManager, ToolRewardTerm
from tandem.rollout import SamplingParams
from tandem.rollout.agent import AgentLoop, AgentSettings
from tandem.tools import build_interaction, build_toolset

from .test_agent import ScriptedModel, stops

sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
from verl_rows import INTERACTION_YAML, TOOL_NAME, TOOL_YAML, gsm8k_row, write_parquet


def call(answer: str) -> str:
    return f"<tool_call>{json.dumps({'name': TOOL_NAME, 'arguments': {'answer': answer}})}</tool_call>"


def verl_batch(tmp_path, tokenizer, tools, **row_kwargs):
    """One verl-format row (1+2, ground truth 3) read as the trainer reads it."""
    path = write_parquet(tmp_path / "rows.parquet", [gsm8k_row("1+2", "3", 0, **row_kwargs)])
    data = PromptDataset(path, tokenizer, max_prompt_length=400, tools=tools.schemas())
    return collate_prompts([data[0]], tokenizer.pad_token_id)


def loop(tokenizer, tools, interaction=None):
    settings = AgentSettings(max_assistant_turns=5, max_user_turns=2)
    return AgentLoop(
        tokenizer,
        stops(tokenizer),
        settings=settings,
        tools=tools,
        interaction=interaction,
        pad_token_id=tokenizer.pad_token_id,
    )


@pytest.fixture
def tools():
    return build_toolset([], TOOL_YAML)


def test_tools_kwargs_and_interaction_kwargs_reach_the_tool_and_the_user_and_the_score(
    tmp_path, tokenizer, tools
):
    prompts = verl_batch(tmp_path, tokenizer, tools)
    interaction = build_interaction(None, INTERACTION_YAML)
    model = ScriptedModel(tokenizer, [call("5"), call("3"), "It is 3.", "So #### 3"])
    out = loop(tokenizer, tools, interaction).generate(lambda: model, prompts, SamplingParams(max_tokens=400))

    trajectory = out["trajectory"][0]
    # wrong (0 vs 0: -0.05), right (1 > 0: 0.0); the create_kwargs' ground truth 3 judged them
    assert trajectory["tool_rewards"] == [-0.05, 0.0]
    assert trajectory["tool_scores"] == {TOOL_NAME: 1.0}
    # the interaction (strict, ground truth from interaction_kwargs): "It is 3." lacks ####, then right
    assert trajectory["turn_scores"] == [0.0, 1.0]
    roles = [m["role"] for m in trajectory["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant", "user", "assistant"]
    assert trajectory["messages"][2]["content"] == "parsed answer '5': reward 0.0"
    assert trajectory["final_answer"] == "So #### 3" and out["agent_finish"][0] == "answer"
    assert tools[TOOL_NAME].instances == {} and interaction.interactions["gsm8k"].instances == {}  # released

    rewards = RewardManager(tokenizer, terms=[ToolRewardTerm()], num_workers=0)
    result = rewards(out)
    assert result.extra["scorer_score"][0] == 1.0  # gsm8k scorer on the final answer
    assert result.extra["tool_reward"][0] == pytest.approx(-0.05)
    assert result.scores[0].item() == pytest.approx(0.95)
    assert result.metrics["reward/tool_reward_mean"] == pytest.approx(-0.05)


def test_a_single_turn_agent_row_runs_no_tools(tmp_path, tokenizer, tools):
    prompts = verl_batch(tmp_path, tokenizer, tools, agent_name="single_turn_agent")
    model = ScriptedModel(tokenizer, [call("3")])
    out = loop(tokenizer, tools).generate(lambda: model, prompts, SamplingParams(max_tokens=400))
    trajectory = out["trajectory"][0]
    assert out["agent_turns"][0] == 1 and out["agent_tool_calls"][0] == 0
    assert trajectory["tool_rewards"] == [] and trajectory["tool_scores"] == {}
    assert (
        RewardManager(tokenizer, terms=[ToolRewardTerm()], num_workers=0)(out).extra["tool_reward"][0] == 0.0
    )
