"""The foundation demo: every layer built so far, by hand, in one process.

Builds a tiny Qwen2 model and tokenizer, writes the synthetic addition task, warm-starts the
model with a few SFT steps, then runs ONE GRPO step written out by hand: sample n responses per
prompt, score them with the reward manager, group advantages, PPO clip loss, an optimizer step.
The real trainer (Ray workers, FSDP2, the rollout engine, the loop) replaces this with
`tandem quickstart` in a later change; the numbers printed here come from real computation.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tandem.algos import agg_loss, compute_advantages, global_counts, log_probs_from_logits, policy_loss
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
from tandem.rewards import RewardManager, reward_manager_from_config

DEMO_OVERRIDES = [
    "data.train_batch_size=8",
    "data.max_prompt_length=32",
    "data.max_response_length=4",
    "rollout.n=4",
    "actor.ppo_mini_batch_size=8",
    "actor.micro_batch_size_per_rank=32",
    "trainer.workers_per_node=1",
]


def response_mask_from(responses: torch.Tensor, eos_id: int, pad_id: int) -> torch.Tensor:
    """1 on generated tokens up to and including the first EOS, 0 after it (and on padding)."""
    is_eos = responses == eos_id
    after_eos = (is_eos.cumsum(-1) - is_eos.long()) > 0
    return (~after_eos & (responses != pad_id)).long()


def sequence_log_probs(model: Any, batch: Batch) -> torch.Tensor:
    """Log-probs of the response tokens under `model`, from one forward over prompt + response."""
    input_ids = torch.cat([batch["input_ids"], batch["responses"]], dim=1)
    attention_mask = torch.cat([batch["attention_mask"], batch["response_mask"]], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    ).logits
    prompt_len, response_len = batch["input_ids"].shape[1], batch["responses"].shape[1]
    # the logit at position p predicts token p + 1
    response_logits = logits[:, prompt_len - 1 : prompt_len - 1 + response_len]
    return log_probs_from_logits(response_logits, batch["responses"])


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


@torch.no_grad()
def generate(model: Any, tokenizer: Any, prompts: Batch, cfg: TandemConfig, greedy: bool) -> Batch:
    """n samples per prompt with HF generate (the rollout engine arrives with the runtime)."""
    batch = prompts if greedy else prompts.repeat(cfg.rollout.n)
    out = model.generate(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        do_sample=not greedy,
        temperature=None if greedy else cfg.rollout.temperature,
        top_p=None if greedy else cfg.rollout.top_p,
        top_k=None,
        max_new_tokens=cfg.data.max_response_length,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    responses = out[:, batch["input_ids"].shape[1] :]
    pad = cfg.data.max_response_length - responses.shape[1]
    responses = torch.nn.functional.pad(responses, (0, pad), value=tokenizer.pad_token_id)
    mask = response_mask_from(responses, tokenizer.eos_token_id, tokenizer.pad_token_id)
    return batch.union(Batch.from_dict({"responses": responses, "response_mask": mask}))


def accuracy(model: Any, tokenizer: Any, rewards: RewardManager, prompts: Batch, cfg: TandemConfig) -> float:
    return float(rewards(generate(model, tokenizer, prompts, cfg, greedy=True)).scores.mean())


def grpo_step(model: Any, tokenizer: Any, rewards: RewardManager, prompts: Batch, cfg: TandemConfig) -> dict:
    """One GRPO step by hand: rollout → rewards → old log-probs → advantages → PPO loss → update."""
    prompts["uid"] = [uuid.uuid4().hex for _ in range(len(prompts))]
    batch = generate(model, tokenizer, prompts, cfg, greedy=False)
    result = rewards(batch)
    with torch.no_grad():
        old_log_probs = sequence_log_probs(model, batch)
    advantages, _ = compute_advantages(
        cfg.algorithm.adv_estimator,
        token_level_rewards=result.token_level_scores,
        response_mask=batch["response_mask"],
        index=batch["uid"],
        norm_adv_by_std=cfg.algorithm.norm_adv_by_std,
    )
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.actor.optim.lr)
    log_probs = sequence_log_probs(model, batch)
    loss, metrics = policy_loss(
        cfg.actor.policy_loss,
        old_log_probs,
        log_probs,
        advantages,
        batch["response_mask"],
        loss_agg_mode=cfg.actor.loss_agg_mode,
        clip_ratio_low=cfg.actor.clip_ratio_low,
        clip_ratio_high=cfg.actor.clip_ratio_high,
        clip_ratio_c=cfg.actor.clip_ratio_c,
        agg_kwargs=global_counts(batch["response_mask"]),
    )
    optim.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.actor.grad_clip)
    optim.step()
    with torch.no_grad():
        new_log_probs = sequence_log_probs(model, batch)
    mask = batch["response_mask"].float()
    return {
        "samples": len(batch),
        "reward_mean": float(result.scores.mean()),
        "reward_errors": int(result.metrics["reward/error_count"]),
        "reward_timeouts": int(result.metrics["reward/timeout_count"]),
        "advantage_abs_mean": float((advantages.abs() * mask).sum() / mask.sum()),
        "pg_loss": float(loss.detach()),
        "grad_norm": float(grad_norm),
        "pg_clipfrac": float(metrics["pg_clipfrac"]),
        "kl_after_update": float(((old_log_probs - new_log_probs) * mask).sum() / mask.sum()),
    }


def run(out_dir: str | Path = "runs/demo", overrides: Sequence[str] = (), sft_steps: int = 400) -> dict:
    """Run the demo and return its numbers (also printed)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    start = time.perf_counter()
    torch.manual_seed(0)
    cfg = load_config("grpo", [*DEMO_OVERRIDES, *overrides])
    out = Path(out_dir)
    model_dir = save_tiny(out / "tiny-model")
    files = write_splits("addition", out / "data", n_train=256, n_val=32, seed=cfg.data.seed, digits=1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    print(
        f"[demo] tiny Qwen2 ({sum(p.numel() for p in model.parameters()) / 1e6:.2f} M params) in {model_dir}"
    )
    print(f"[demo] addition task: {files['train']}, {files['val']}")

    def load_prompts(path: Path) -> PromptDataset:
        return PromptDataset(
            [path], tokenizer, max_prompt_length=cfg.data.max_prompt_length, truncation=cfg.data.truncation
        )

    train, val = load_prompts(files["train"]), load_prompts(files["val"])
    val_prompts = collate_prompts([val[i] for i in range(len(val))], tokenizer.pad_token_id)
    with reward_manager_from_config(cfg, tokenizer) as rewards:
        numbers: dict[str, Any] = {
            "accuracy_before_sft": accuracy(model, tokenizer, rewards, val_prompts, cfg)
        }
        numbers["sft_final_loss"] = sft_warm_start(model, tokenizer, [files["train"]], cfg, sft_steps)
        numbers["accuracy_after_sft"] = accuracy(model, tokenizer, rewards, val_prompts, cfg)
        sampler = StatefulSampler(len(train), cfg.data.train_batch_size, seed=cfg.data.seed)
        indices = next(iter(sampler))
        prompts = collate_prompts([train[i] for i in indices], tokenizer.pad_token_id)
        numbers.update(grpo_step(model, tokenizer, rewards, prompts, cfg))
    numbers["seconds"] = round(time.perf_counter() - start, 1)
    width = max(len(k) for k in numbers)
    for key, value in numbers.items():
        print(
            f"[demo] {key:<{width}}  {value:.4g}"
            if isinstance(value, float)
            else f"[demo] {key:<{width}}  {value}"
        )
    return numbers
