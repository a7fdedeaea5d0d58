"""Argument names people bring from TRL, and the Tandem key to use instead.

Only used to word the "unknown key" error: TRL's flat `GRPOConfig` / `TrainingArguments` names are
not read as Tandem's. verl's keys are read as Tandem's (config/verl/translate.py, config/verl/keys.py).
"""

from __future__ import annotations

# TRL argument -> (Tandem key, note)
TRL: dict[str, tuple[str, str]] = {
    "model_name_or_path": ("actor.model_path", ""),
    "learning_rate": ("actor.optim.lr", ""),
    "weight_decay": ("actor.optim.weight_decay", ""),
    "lr_scheduler_type": ("actor.optim.lr_scheduler", ""),
    "warmup_steps": ("actor.optim.warmup_steps", ""),
    "warmup_ratio": ("actor.optim.warmup_ratio", ""),
    "max_grad_norm": ("actor.grad_clip", ""),
    "gradient_checkpointing": ("actor.activation_checkpointing", ""),
    "per_device_train_batch_size": ("actor.micro_batch_size_per_rank", "samples per forward on one rank"),
    "gradient_accumulation_steps": (
        "actor.ppo_mini_batch_size",
        "accumulation steps are derived from it and actor.micro_batch_size_per_rank",
    ),
    "num_generations": ("rollout.n", ""),
    "max_prompt_length": ("data.max_prompt_length", ""),
    "max_completion_length": ("data.max_response_length", ""),
    "temperature": ("rollout.temperature", ""),
    "top_p": ("rollout.top_p", ""),
    "top_k": ("rollout.top_k", ""),
    "use_vllm": ("rollout.engine", "set rollout.engine=vllm"),
    "beta": ("actor.kl_loss_coef", "with actor.use_kl_loss=true"),
    "epsilon": ("actor.clip_ratio_low", ""),
    "epsilon_high": ("actor.clip_ratio_high", ""),
    "num_iterations": ("actor.ppo_epochs", ""),
    "loss_type": ("actor.loss_agg_mode", ""),
    "scale_rewards": ("algorithm.norm_adv_by_std", ""),
    "num_train_epochs": ("trainer.total_epochs", ""),
    "max_steps": ("trainer.total_training_steps", ""),
    "save_steps": ("trainer.save_freq", ""),
    "eval_steps": ("trainer.test_freq", ""),
    "save_total_limit": ("trainer.max_checkpoints_to_keep", ""),
    "report_to": ("trainer.loggers", ""),
    "output_dir": ("trainer.output_dir", ""),
    "run_name": ("trainer.experiment_name", ""),
    "seed": ("trainer.seed", ""),
    "bf16": ("actor.fsdp.param_dtype", "set actor.fsdp.param_dtype=bfloat16"),
}


def foreign_key_hint(key: str, valid: tuple[str, ...]) -> str | None:
    """`unknown key ...: that is TRL's name; in Tandem use ...`, or None for a key TRL does not have."""
    if key in TRL:
        return _hint(key, "TRL", *TRL[key])
    return None


def _hint(key: str, source: str, target: str, note: str) -> str:
    where = f"'{target}'" if " " not in target else target
    return f"unknown key '{key}': that is {source}'s name; in Tandem use {where}" + (
        f" ({note})" if note else ""
    )
