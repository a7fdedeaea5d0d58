"""The agent loop end to end on the real stack: a short SFT warm start on the calculator task's
demonstrations (multi-turn SFT with tools, 2 Ray ranks), then GRPO with rollout.mode=async on vLLM,
the built-in calculator and the try_again interaction. The warm start only teaches the call's
format (the random tiny model never writes one), so the run has tool calls, tool results and
user turns to mask. Checks numbers: finite updates, agent metrics, rollout log-probs of the model's
tokens equal to the actor's, and a resumed run equal to an uninterrupted one."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tandem.config import load_config
from tandem.data import write_splits
from tandem.models.tiny import save_tiny
from tandem.trainer import RLTrainer, SFTTrainer
from tandem.trainer.tracking import read_jsonl

from .trainer_helpers import as_if_killed_after, assert_same_steps, by_step

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

AGENT = [
    "rollout.mode=async",
    "rollout.engine=vllm",
    "rollout.multi_turn.tools=[calculator]",
    "rollout.multi_turn.interaction=try_again",
    "rollout.multi_turn.max_assistant_turns=3",
    "rollout.multi_turn.max_user_turns=1",
]
SHARED = [
    "data.max_prompt_length=48",
    "data.max_response_length=112",
    "trainer.workers_per_node=2",
    "trainer.device=cpu",
    "trainer.loggers=[jsonl]",
    "trainer.progress_bar=false",
    *AGENT,
]


@pytest.fixture(scope="module")
def warm_start(ray_local, tmp_path_factory):
    """The tiny model after 40 SFT steps on one-digit calculator demonstrations, and the task."""
    root = tmp_path_factory.mktemp("agent")
    files = write_splits("tool_multiply", root / "data", n_train=64, n_val=8, seed=0, digits=1)
    model = save_tiny(root / "model", stop_at_im_end=True)
    cfg = load_config(
        "sft",
        [
            *SHARED,
            f"actor.model_path={model}",
            f"data.train_files=[{files['train']}]",
            "data.train_batch_size=16",
            "actor.ppo_mini_batch_size=16",
            "actor.micro_batch_size_per_rank=8",
            "actor.optim.lr=3e-3",
            "actor.optim.lr_scheduler=constant",
            "actor.optim.warmup_ratio=0",
            "trainer.total_training_steps=40",
            f"trainer.output_dir={root}",
            "trainer.experiment_name=sft",
        ],
        require_data=True,
    )
    trainer = SFTTrainer(cfg)
    history = trainer.fit()
    assert history[-1]["sft/loss"] < 0.5 * history[0]["sft/loss"]
    return {"model": trainer.hf_dir, **files}


def grpo(assets, out, experiment, *overrides):
    return load_config(
        "grpo",
        [
            *SHARED,
            f"actor.model_path={assets['model']}",
            f"data.train_files=[{assets['train']}]",
            f"data.val_files=[{assets['val']}]",
            "data.train_batch_size=4",
            "rollout.n=4",
            "actor.ppo_mini_batch_size=2",
            "actor.micro_batch_size_per_rank=4",
            "actor.optim.lr=1e-4",
            f"trainer.output_dir={out}",
            f"trainer.experiment_name={experiment}",
            "reward.num_workers=0",
            *overrides,
        ],
        require_data=True,
    )


def test_grpo_on_the_agent_loop_trains_counts_tools_and_resumes_exactly(warm_start, tmp_path):
    def config(experiment):
        return grpo(
            warm_start,
            tmp_path,
            experiment,
            "trainer.total_training_steps=4",
            "trainer.save_freq=2",
            "trainer.test_freq=4",
            f"trainer.rollout_data_dir={tmp_path / 'tandem' / experiment / 'rollouts'}",
        )

    straight = by_step(RLTrainer(config("straight")).fit())
    assert {1, 2, 3, 4} <= set(straight)
    calls = sum(straight[s]["agent/tool_calls_per_sample"] for s in (1, 2, 3, 4))
    assert calls > 0, "the warm start taught no tool call: more SFT steps"
    for step in (1, 2, 3, 4):
        m = straight[step]
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["actor/grad_norm"])
        assert 1 <= m["agent/turns/mean"] <= 3 and m["agent/turns/max"] <= 3
        assert 0 <= m["agent/tool_use_ratio"] <= 1 and m["agent/tool_errors"] >= 0
        assert m["agent/inserted_tokens/mean"] >= 0 and m["agent/generated_tokens/mean"] > 0
        assert 0 <= m["agent/finish_max_turns_ratio"] + m["agent/finish_budget_ratio"] <= 1
        # the rollout's log-probs of the model's tokens equal the FSDP2 actor's (fp32): masks and
        # positions of multi-turn trajectories line up in every role
        assert m["rollout_mismatch/max_ratio"] == pytest.approx(1.0, abs=1e-3)
        assert m["rollout_mismatch/min_ratio"] == pytest.approx(1.0, abs=1e-3)
    assert "val/agent/tool_use_ratio" in straight[4] and "val/acc" in straight[4]
    inserted = sum(straight[s]["agent/inserted_tokens/mean"] for s in (1, 2, 3, 4))
    assert inserted > 0  # tool results or "try again" were inserted and masked out

    as_if_killed_after(tmp_path / "tandem/straight", tmp_path / "tandem/resumed", 2)
    resumed = by_step(RLTrainer(config("resumed")).fit())
    assert {3, 4} <= set(resumed) and not {1, 2} & set(resumed)
    assert_same_steps(resumed, straight, (3, 4), skip=("tool_seconds",))
    check_agent_dumps(tmp_path / "tandem", straight)
    from view.browser import check_real_trajectory  # tests/view/browser.py

    check_real_trajectory(tmp_path / "tandem/straight")  # an opened trajectory in headless Chromium


def check_agent_dumps(root: Path, straight: dict) -> None:
    """The straight run's dumps show the trajectories turn by turn; the resumed run's dump of each step
    equals the straight one's (steps 3 and 4 written again, not appended)."""
    dumps = {
        run: {s: read_jsonl(root / run / "rollouts" / f"{s}.jsonl") for s in (1, 2, 3, 4)}
        for run in ("straight", "resumed")
    }
    assert sorted(p.name for p in (root / "resumed" / "rollouts").iterdir()) == [
        f"{s}.jsonl" for s in (1, 2, 3, 4)
    ]
    calls = 0
    for step, rows in dumps["straight"].items():
        assert len(rows) == 16 and [r["sample"] for r in rows] == list(range(16))
        m = straight[step]
        assert sum(r["score"] for r in rows) / 16 == pytest.approx(m["score/mean"], abs=1e-6)
        assert sum(r["num_turns"] for r in rows) / 16 == pytest.approx(m["agent/turns/mean"], abs=1e-6)
        for row in rows:
            assistant = [t for t in row["turns"] if t["role"] == "assistant"]
            assert len(assistant) == row["num_turns"] and row["output"].startswith(assistant[0]["text"])
            tools = [t for t in row["turns"] if t["role"] == "tool"]
            assert row["turns"][0]["role"] == "assistant"  # the prompt's messages are not turns
            # a tool message per call run, parsed or not (an unparsable call is answered with its error);
            # the calls of a last turn (out of turns or tokens) are not run
            parsed = sum(len(t["tool_calls"]) for t in assistant)
            assert parsed >= sum(t["error"] != "bad_call" for t in tools)
            assert all(t["timed_out"] is False for t in tools)
            assert row["rollout_mismatch"] < 1e-3 and len(row["tokens"]) == len(row["token_mismatch"])
            calls += len(tools)
    assert calls == pytest.approx(16 * sum(straight[s]["agent/tool_calls_per_sample"] for s in (1, 2, 3, 4)))
    for step in (1, 2, 3, 4):
        for a, b in zip(dumps["resumed"][step], dumps["straight"][step], strict=True):
            assert a.keys() == b.keys()
            for key in a:
                if isinstance(a[key], float):
                    assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (step, key)
                elif key not in ("token_mismatch",):
                    assert a[key] == b[key], (step, key)


def test_ppo_critic_learns_values_on_multi_turn_trajectories(warm_start, tmp_path):
    """The critic reads the same trajectories (tool results inside, masked out of every loss)."""
    cfg = load_config(
        "ppo",
        [
            *SHARED,
            f"actor.model_path={warm_start['model']}",
            f"data.train_files=[{warm_start['train']}]",
            "data.train_batch_size=4",
            "actor.ppo_mini_batch_size=2",
            "actor.micro_batch_size_per_rank=4",
            "critic.optim.lr=1e-3",
            "trainer.total_training_steps=2",
            f"trainer.output_dir={tmp_path}",
            "reward.num_workers=0",
        ],
        require_data=True,
    )
    history = by_step(RLTrainer(cfg).fit())
    for step in (1, 2):
        m = history[step]
        assert math.isfinite(m["critic/vf_loss"]) and m["critic/grad_norm"] > 0
        assert math.isfinite(m["actor/pg_loss"]) and m["agent/inserted_tokens/mean"] >= 0
