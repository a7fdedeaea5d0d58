"""A tiny model, the addition task and configs for the trainer tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tandem.config import load_config
from tandem.config.schema import TandemConfig
from tandem.data import write_splits
from tandem.models.tiny import save_tiny

REWARDS = Path(__file__).with_name("rewards_for_tests.py")
NOT_COMPARABLE = (  # wall-clock and memory numbers
    "timing_s/",
    "timing_share/",
    "perf/tokens_per_s",
    "perf/generated_tokens_per_s",
    "perf/peak_flops_per_device",  # torch.mm measured by each worker
    "perf/mfu/",
    "memory/",
    "rollout/seconds",
    "rollout/tokens_per_second",
)


def by_step(history):
    return {m["step"]: m for m in history}


def as_if_killed_after(run: Path, copy: Path, last_step: int) -> None:
    """`copy`: run folder `run` as a run killed after checkpoint `last_step` would have left it (the same files
    but the later checkpoints; the metrics rows of the later steps stay, which a resumed run must drop and
    write again)."""
    later = lambda folder, names: (  # noqa: E731
        [n for n in names if n.startswith("global_step_") and int(n.split("_")[-1]) > last_step]
        if folder.endswith("checkpoints")
        else []
    )
    shutil.copytree(run, copy, ignore=later)


def assert_same_steps(resumed: dict, straight: dict, steps, skip: tuple[str, ...] = ()) -> None:
    """The resumed run logged each of `steps` as the uninterrupted run did: every comparable metric."""
    assert set(steps) <= set(resumed) and set(steps) <= set(straight)
    for step in steps:
        keys = {
            k for k in straight[step] if not k.startswith(NOT_COMPARABLE) and not any(s in k for s in skip)
        }
        assert keys <= set(resumed[step]), sorted(keys - set(resumed[step]))
        for key in sorted(keys):
            a, b = resumed[step][key], straight[step][key]
            assert a == pytest.approx(b, rel=1e-6, abs=1e-7), f"step {step} {key}: resumed {a} vs {b}"


def make_assets(root: Path, **model_kwargs) -> dict[str, Path]:
    """A tiny model folder (`model_kwargs` for models.tiny.build_model) and the addition task (16 train, 8 val
    prompts)."""
    files = write_splits("addition", root / "data", n_train=16, n_val=8, seed=0, digits=1)
    return {"model": save_tiny(root / "model", **model_kwargs), **files}


def run_config(assets: dict[str, Path], out: Path, preset: str, *overrides: str) -> TandemConfig:
    """`preset` on 2 CPU ranks: 4 prompts x 4 samples of <= 6 tokens a step, 2 mini-batches, fp32."""
    return load_config(
        preset,
        [
            f"actor.model_path={assets['model']}",
            f"data.train_files=[{assets['train']}]",
            f"data.val_files=[{assets['val']}]",
            "data.max_prompt_length=32",
            "data.max_response_length=6",
            "data.train_batch_size=4",
            "rollout.n=4",
            "actor.ppo_mini_batch_size=2",
            "actor.micro_batch_size_per_rank=4",
            "actor.optim.lr=1e-3",
            "critic.optim.lr=1e-3",
            "trainer.workers_per_node=2",
            "trainer.device=cpu",
            f"trainer.output_dir={out}",
            "trainer.loggers=[jsonl]",
            "trainer.progress_bar=false",
            "reward.num_workers=0",
            *overrides,
        ],
        require_data=True,
    )


def custom_reward(name: str) -> list[str]:
    return [f"reward.custom_reward_file={REWARDS}", f"reward.custom_reward_function={name}"]


# what a rank of a rollout TP=2 engine receives halved of the tiny Mixtral (2 KV heads: one each); the experts,
# the routers and the norms arrive whole
MOE_HALVED = (".q_proj.", ".k_proj.", ".v_proj.", ".o_proj.weight", "embed_tokens.weight")


def shard_bytes(model_dir: Path, halved: tuple[str, ...]) -> tuple[int, int]:
    """(float32 bytes of the model folder, the tied head once; what one rank of a 2-rank engine receives when
    the tensors whose names contain one of `halved` arrive halved and the rest whole)."""
    tensors = load_file(model_dir / "model.safetensors")
    whole = sum(t.numel() * 4 for t in tensors.values())
    return whole, sum(t.numel() * 4 // (2 if any(h in n for h in halved) else 1) for n, t in tensors.items())
