"""A tiny model, the addition task and configs for the trainer tests."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file

from tandem.config import load_config
from tandem.config.schema import TandemConfig
from tandem.data import save_tiny, write_splits

REWARDS = Path(__file__).with_name("rewards_for_tests.py")


def make_assets(root: Path, **model_kwargs) -> dict[str, Path]:
    """A tiny model folder (`model_kwargs` for data.tiny.build_model) and the addition task (16 train, 8 val
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
