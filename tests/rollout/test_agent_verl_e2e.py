"""verl's multi-turn GSM8K setup end to end on the real stack: verl-format rows (tools_kwargs,
interaction_kwargs, agent_name) and verl's tool YAML, GRPO with rollout.mode=async on vLLM for 2 steps.

The random tiny model never writes a tool call, so it is first fitted (plain PyTorch, seconds) to
answer every prompt with one fixed call, ``calc_gsm8k_reward(answer="3")``. The GSM8K tool's step
rewards are 0.0 or -0.05 per call, never positive, and -0.05 for every row whose answer is not 3 (7 of
the 8). The reward function scores 0, so a step's score is its tool reward alone: reward/score_mean
must equal reward/tool_reward_mean, which must be below 0 (measured: -0.01875 = -0.05 x 3 / 8)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tandem.config import load_config
from tandem.models.tiny import IM_END, save_tiny
from tandem.tools import build_toolset
from tandem.trainer import RLTrainer

from .test_vllm import TINY_VLLM

sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
from verl_rows import TOOL_NAME, TOOL_YAML, gsm8k_rows, write_parquet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CALL = f'<tool_call>{{"name": "{TOOL_NAME}", "arguments": {{"answer": "3"}}}}</tool_call>'
ZERO_REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"


def fit_to_call(folder: Path, prompts: list[list[dict]]) -> None:
    """Train the model in `folder` until it answers each prompt with CALL, then save it there."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    schemas = build_toolset([], TOOL_YAML).schemas()
    answer = tokenizer(CALL, add_special_tokens=False)["input_ids"] + [
        tokenizer.convert_tokens_to_ids(IM_END)
    ]
    rows, starts = [], []
    for messages in prompts:
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, tools=schemas
        )
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        rows.append(prompt + answer)
        starts.append(len(prompt))
    width = max(map(len, rows))
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    labels = ids.clone()
    for i, (row, start) in enumerate(zip(rows, starts)):
        labels[i, :start] = -100
        labels[i, len(row) :] = -100
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(300):  # ~140 steps to a loss of 0.01 (right padding: no position reads a pad)
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.01:
            break
    assert loss.item() < 0.05, f"the tiny model did not learn the call (loss {loss.item():.3f})"
    model.save_pretrained(folder)


def test_grpo_on_verl_rows_and_verls_tool_yaml_puts_the_tools_step_rewards_in_the_score(ray_local, tmp_path):
    rows = gsm8k_rows(8, interaction=False)
    train = write_parquet(tmp_path / "train.parquet", rows)
    (tmp_path / "zero.py").write_text(ZERO_REWARD)
    model = save_tiny(tmp_path / "model", stop_at_im_end=True, **TINY_VLLM)
    fit_to_call(model, [row["prompt"] for row in rows])
    cfg = load_config(
        "grpo",
        [
            f"actor.model_path={model}",
            f"data.train_files=[{train}]",
            "data.max_prompt_length=64",
            "data.max_response_length=400",
            "data.train_batch_size=4",
            "rollout.n=2",
            "actor.ppo_mini_batch_size=4",
            "actor.micro_batch_size_per_rank=8",
            "rollout.engine=vllm",
            "rollout.mode=async",
            f"rollout.multi_turn.tool_file={TOOL_YAML}",
            "rollout.multi_turn.max_assistant_turns=3",
            f"reward.custom_reward_file={tmp_path / 'zero.py'}",
            "reward.num_workers=0",
            "trainer.workers_per_node=1",
            "trainer.device=cpu",
            "trainer.loggers=[jsonl]",
            "trainer.progress_bar=false",
            "trainer.total_training_steps=2",
            f"trainer.output_dir={tmp_path}",
        ],
        require_data=True,
    )
    history = RLTrainer(cfg).fit()
    steps = [m for m in history if "reward/tool_reward_mean" in m]
    assert len(steps) == 2
    for m in steps:
        assert m["agent/tool_calls_per_sample"] > 0
        # every call is 0.0 or -0.05, and -0.05 where the row's answer is not 3: below 0
        assert m["reward/tool_reward_mean"] <= -0.05 / 8 + 1e-9
        assert m["reward/score_mean"] == pytest.approx(m["reward/tool_reward_mean"], abs=1e-6)
        # the score is what the advantages saw: the step's sequence scores average to the same number
        assert m["score/mean"] == pytest.approx(m["reward/tool_reward_mean"], abs=1e-5)
