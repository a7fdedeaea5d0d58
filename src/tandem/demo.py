"""The runtime demo: SFT warm start in this process, then GRPO steps on Ray worker processes.

Builds a tiny Qwen2 model and tokenizer, writes the synthetic addition task, warm-starts the
model with plain SFT steps, then starts the distributed runtime: one worker group of 2 Ray
processes, each holding an FSDP2 shard of the actor, the reference policy and a Hugging Face
rollout engine (the hybrid engine). The controller (this process) runs a few GRPO steps, one
worker-group call per phase. The trainer loop with checkpoints, validation schedule and
trackers replaces this with `tandem quickstart` in a later change.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tandem.algos import agg_loss, compute_advantages, log_probs_from_logits
from tandem.algos.importance import mismatch_metrics
from tandem.batch import Batch
from tandem.config import TandemConfig, load_config
from tandem.data import (
    PromptDataset,
    SFTDataset,
    StatefulSampler,
    collate_prompts,
    collate_sft,
    save_tiny,
    write_splits,
)
from tandem.data.tiny import save_tokenizer
from tandem.rewards import RewardManager, reward_manager_from_config
from tandem.roles.common import arrange_for_update
from tandem.roles.layout import WorkerGroups, build_worker_groups
from tandem.rollout import PROMPT_INDEX, SamplingParams

DEMO_OVERRIDES = [
    "data.train_batch_size=8",
    "data.max_prompt_length=32",
    "data.max_response_length=4",
    "rollout.n=4",
    "actor.ppo_mini_batch_size=4",  # two optimizer steps per GRPO step
    "actor.micro_batch_size_per_rank=8",
    "actor.optim.lr=1e-5",
    "rollout.log_prob_micro_batch_size_per_rank=16",
    "reference.log_prob_micro_batch_size_per_rank=16",
    "trainer.workers_per_node=2",
    "trainer.device=cpu",
]


def sft_warm_start(model: Any, tokenizer: Any, files: Sequence[Path], cfg: TandemConfig, steps: int) -> float:
    """A few plain SFT steps (loss on response tokens) so that sampling yields some right answers."""
    dataset = SFTDataset(
        files, tokenizer, max_length=cfg.data.max_prompt_length + cfg.data.max_response_length
    )
    sampler = StatefulSampler(len(dataset), batch_size=32, seed=cfg.trainer.seed)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = iter(())
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        indices = next(batches, None)
        if indices is None:
            batches = iter(sampler)
            indices = next(batches)
        batch = collate_sft([dataset[i] for i in indices], tokenizer.pad_token_id)
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
        ).logits[:, :-1]
        token_log_probs = log_probs_from_logits(logits, batch["input_ids"][:, 1:])
        loss = agg_loss(-token_log_probs, batch["loss_mask"][:, 1:], "token-mean")
        optim.zero_grad()
        loss.backward()
        optim.step()
    return float(loss.detach())


def grpo_step(
    groups: WorkerGroups, rewards: RewardManager, prompts: Batch, cfg: TandemConfig, step: int
) -> dict:
    """One GRPO step, each phase one call on a worker group: rollout -> rewards -> old and reference
    log-probs (at the same time) -> group advantages -> the actor's PPO update."""
    prompts = prompts.union(Batch.from_dict({PROMPT_INDEX: torch.arange(len(prompts))}))
    prompts["uid"] = [uuid.uuid4().hex for _ in range(len(prompts))]
    r = cfg.rollout
    sampling = SamplingParams(
        max_tokens=cfg.data.max_response_length,
        n=r.n,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        seed=cfg.trainer.seed * 100_003 + step,
    )
    batch = groups.actor.generate(prompts, sampling)
    result = rewards(batch)
    old = groups.actor.compute_log_probs.async_(batch)
    ref = groups.ref.compute_ref_log_probs.async_(batch) if groups.ref else None
    batch = batch.union(old.result())
    if ref is not None:
        batch = batch.union(ref.result())
    advantages, _ = compute_advantages(
        cfg.algorithm.adv_estimator,
        token_level_rewards=result.token_level_scores,
        response_mask=batch["response_mask"],
        index=batch["uid"],
        norm_adv_by_std=cfg.algorithm.norm_adv_by_std,
    )
    batch["advantages"] = advantages
    mismatch = mismatch_metrics(batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"])
    update = arrange_for_update(batch, groups.actor.world_size, cfg.derived.actor_mini_batches_per_step)
    metrics = groups.actor.update_actor(update)[0]
    mask = batch["response_mask"].float()
    return {
        "reward_mean": float(result.scores.mean()),
        "reward_errors": int(result.metrics["reward/error_count"]),
        "advantage_abs_mean": float((advantages.abs() * mask).sum() / mask.sum()),
        "pg_loss": metrics["actor/pg_loss"],
        "kl_loss": metrics.get("actor/kl_loss", 0.0),
        "grad_norm": metrics["actor/grad_norm"],
        "rollout_vs_trainer_max_ratio": mismatch["mismatch_max_ratio"],
    }


def accuracy(groups: WorkerGroups, rewards: RewardManager, prompts: Batch, cfg: TandemConfig) -> float:
    """Greedy exact-match on the validation prompts, generated by the workers' rollout engines."""
    greedy = SamplingParams(max_tokens=cfg.data.max_response_length, temperature=0.0)
    return float(rewards(groups.actor.generate(prompts, greedy)).scores.mean())


def run(
    out_dir: str | Path = "runs/demo", overrides: Sequence[str] = (), sft_steps: int = 400, rl_steps: int = 8
) -> dict:
    """Run the demo and return its numbers (also printed)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    start = time.perf_counter()
    torch.manual_seed(0)
    out = Path(out_dir)
    model_dir = save_tiny(out / "tiny-model")
    sft_dir = out / "sft-model"
    cfg = load_config("grpo", [*DEMO_OVERRIDES, f"actor.model_path={sft_dir}", *overrides])
    files = write_splits("addition", out / "data", n_train=256, n_val=32, seed=cfg.data.seed, digits=1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    say(f"tiny Qwen2 ({sum(p.numel() for p in model.parameters()) / 1e6:.2f} M params) in {model_dir}")
    say(f"addition task: {files['train']}, {files['val']}")

    def load_prompts(path: Path) -> PromptDataset:
        return PromptDataset(
            [path], tokenizer, max_prompt_length=cfg.data.max_prompt_length, truncation=cfg.data.truncation
        )

    train, val = load_prompts(files["train"]), load_prompts(files["val"])
    val_prompts = collate_prompts([val[i] for i in range(len(val))], tokenizer.pad_token_id)
    numbers: dict[str, Any] = {
        "sft_final_loss": sft_warm_start(model, tokenizer, [files["train"]], cfg, sft_steps)
    }
    model.save_pretrained(sft_dir)
    save_tokenizer(tokenizer, sft_dir)
    say(
        f"SFT: {sft_steps} steps in this process, final loss {numbers['sft_final_loss']:.4f}; model in {sft_dir}"
    )

    groups = build_worker_groups(cfg)
    try:
        say(
            f"workers: {', '.join(f'{g.name} x {g.world_size}' for g in groups.unique())} "
            f"(Ray processes, FSDP2 over gloo), rollout engine: {cfg.rollout.engine}"
        )
        with reward_manager_from_config(cfg, tokenizer) as rewards:
            numbers["accuracy_after_sft"] = accuracy(groups, rewards, val_prompts, cfg)
            sampler = iter(StatefulSampler(len(train), cfg.data.train_batch_size, seed=cfg.data.seed))
            for step in range(1, rl_steps + 1):
                prompts = collate_prompts([train[i] for i in next(sampler)], tokenizer.pad_token_id)
                step_numbers = grpo_step(groups, rewards, prompts, cfg, step)
                timings = groups.actor.pop_metrics()
                step_numbers["weight_sync_s"] = max(t.get("timing_s/weight_sync", 0.0) for t in timings)
                say(f"GRPO step {step}: " + "  ".join(f"{k} {fmt(v)}" for k, v in step_numbers.items()))
                numbers.update({f"step{step}_{k}": v for k, v in step_numbers.items()})
            numbers["accuracy_after_rl"] = accuracy(groups, rewards, val_prompts, cfg)
    finally:
        groups.shutdown()
    numbers["samples_per_step"] = cfg.derived.samples_per_step
    numbers["seconds"] = round(time.perf_counter() - start, 1)
    for key in ("accuracy_after_sft", "accuracy_after_rl", "samples_per_step", "seconds"):
        say(f"{key:<20}{fmt(numbers[key])}")
    return numbers


def say(line: str) -> None:
    print(f"[demo] {line}", flush=True)


def fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
