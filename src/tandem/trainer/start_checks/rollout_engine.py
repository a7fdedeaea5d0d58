"""What the rollout engine the config names runs with on this install: every start-up check that depends on
which rollout engine it is (rollout.engine, vLLM's reading of the model folder and of rollout.engine_kwargs, a
LoRA adapter sync, a vision-language model's images), kept in this one module."""

from __future__ import annotations

import torch

from tandem.config.modes import rollout_tensor_parallel_problems
from tandem.config.schema import TandemConfig
from tandem.roles.rollout import rollout_spec
from tandem.rollout import availability_problems
from tandem.rollout import check_buildable as check_rollout_buildable
from tandem.rollout_options import engines_with, facts, resolve_engine


def rollout_engine_problems(cfg: TandemConfig, purpose: str = "rl") -> list[str]:
    """The rollout engine this release does not have yet or this install lacks, a tensor-parallel rollout the
    layout cannot hold, what vLLM would refuse later, and an adapter sync the engine cannot take; one line each.
    `purpose`: "rl", or "sft" (no rollout engine is built, vLLM's model checks are skipped)."""
    # the rollout engine through its face: the spec the workers will build (its device not chosen yet where
    # trainer.device=auto), the engine's own check (vLLM: what it would refuse of the model folder)
    device = torch.device("cpu") if cfg.trainer.device == "cpu" else None
    spec = rollout_spec(cfg, device)
    problems = check_rollout_buildable(spec) if purpose != "sft" else availability_problems(spec.engine)
    if cfg.rollout.tensor_parallel > 1:
        problems += rollout_tensor_parallel_problems(cfg)
    if cfg.actor.lora.syncs_adapters and not facts(spec.engine).serves_adapters:
        problems.append(
            f"actor.lora.rollout_sync=adapter needs vLLM's LoRA support ({' or '.join(engines_with('serves_adapters'))}), "
            f"and the rollout engine resolves to {spec.engine} (rollout.engine={cfg.rollout.engine}); use "
            "actor.lora.rollout_sync=merged"
        )
    return problems


def vision_language_rollout_problems(cfg: TandemConfig, what: str) -> list[str]:
    """A vision-language actor's images are rolled out by vLLM's batched generate alone; `what` names the model."""
    r = cfg.rollout
    if not facts(resolve_engine(r.engine)).images or r.mode != "sync" or r.layout != "hybrid":
        return [
            f"{what}: its images are rolled out by vLLM's batched generate (rollout.engine=vllm, "
            "rollout.mode=sync, rollout.layout=hybrid)"
        ]
    return []
