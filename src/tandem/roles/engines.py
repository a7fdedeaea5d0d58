"""A role's training engine from the config, in one place: the engine spec (engine/base.py `EngineSpec`) of
its model (the actor's strategy, parallel sizes, packing and token budget for every role) and the engine
built from it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from tandem.config.schema import OptimConfig, TandemConfig
from tandem.engine import build_engine
from tandem.engine.base import EngineSpec, Head, TrainEngine
from tandem.train_engine_options import facts

# Micro-batch token budgets when actor.max_tokens_per_micro_batch is None: on a CPU a budget past the
# caches is slower (bench/README.md: 2048 tokens 1.5x faster than 16384 on W1); a GPU wants large ones.
DEFAULT_TOKEN_BUDGET = {"cpu": 2048, "cuda": 16384}


def token_budget(cfg: TandemConfig, device: torch.device) -> int | None:
    """Tokens per micro-batch on one rank (None: micro-batches by sample count, use_dynamic_bsz off)."""
    a, d = cfg.actor, cfg.data
    if not a.use_dynamic_bsz:
        return None
    if a.max_tokens_per_micro_batch is not None:
        return a.max_tokens_per_micro_batch
    longest = d.max_prompt_length + d.max_response_length  # SFT rows are at most as long (data.max_length)
    return max(
        DEFAULT_TOKEN_BUDGET.get(device.type, DEFAULT_TOKEN_BUDGET["cuda"]), longest, d.max_length or 0
    )


def role_engine(
    cfg: TandemConfig,
    device: torch.device,
    model_path: str | None,
    head: Head,
    optim: OptimConfig | None,
    grad_clip: float | None,
    total_training_steps: int | None,
    group_name: str,
    lora: Any = None,
    param_offload: bool = False,
    override_config: dict[str, Any] | None = None,
    override_key: str = "actor.override_config",
    attn_implementation: str | None = None,
    freeze_vision_tower: bool = False,
) -> TrainEngine:
    """One role's engine (`optim` None: a frozen one, the reference or the reward model); every role shares
    the actor's strategy and settings. `group_name`: the worker group, named by the error of a role without
    a model. The critic follows actor.megatron's offload switches; a frozen engine has parameters alone to keep
    in host memory between calls, under its own switch `param_offload` (reference.megatron_param_offload).
    `override_config`: attributes set on the model's config before it is built (the setting `override_key`);
    `attn_implementation`: the role's own attention kernel (None: actor.fsdp.attn_implementation);
    `freeze_vision_tower`: the actor's actor.freeze_vision_tower."""
    if not model_path:
        raise ValueError(f"worker group {group_name!r}: a role needs a model_path, got {model_path!r}")
    a = cfg.actor
    megatron = a.megatron
    if optim is None:
        megatron = replace(megatron, param_offload=param_offload, grad_offload=False, optimizer_offload=False)
    fsdp = a.fsdp if attn_implementation is None else replace(a.fsdp, attn_implementation=attn_implementation)
    spec = EngineSpec(
        model_path=model_path,
        head=head,
        device=device,
        optim=optim,
        grad_clip=grad_clip,
        total_training_steps=total_training_steps,
        strategy=a.strategy,
        fsdp=fsdp,
        megatron=megatron,
        activation_checkpointing=a.activation_checkpointing and optim is not None,
        seed=cfg.trainer.seed,
        packing=a.sequence_packing,
        max_tokens_per_micro_batch=token_budget(cfg, device),
        router_aux_loss_coef=a.router_aux_loss_coef,
        # the trained policy's routers record and replay (actor.router_replay); a reference routes itself
        router_replay=a.router_replay != "off" and head == "lm" and optim is not None,
        lora=lora,
        freeze_vision_tower=freeze_vision_tower,
        override_config=override_config or {},
        override_key=override_key,
        **start_checkpoint(cfg, head, optim),
    )
    return build_engine(spec)


def start_checkpoint(cfg: TandemConfig, head: Head, optim: OptimConfig | None) -> dict[str, str | None]:
    """The megatron distributed checkpoint a role's weights start from (EngineSpec's dist_checkpoint and the
    setting's name): the actor's, also the reference's (the initial policy) and SFT's, for a causal LM; the
    critic's own for a trained value model; none for the reward model (its folder's trained head)."""
    if not facts(cfg.actor.strategy).dist_checkpoint:
        return {}
    if head == "lm":
        return {"dist_checkpoint": cfg.actor.megatron.dist_checkpoint}
    if optim is not None:
        return {
            "dist_checkpoint": cfg.critic.megatron_dist_checkpoint,
            "dist_checkpoint_key": "critic.megatron_dist_checkpoint",
        }
    return {}
