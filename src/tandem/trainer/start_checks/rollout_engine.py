"""What the rollout engine the config names runs with on this install: every start-up check that depends on
which rollout engine it is (rollout.engine, vLLM's reading of the model folder and of rollout.engine_kwargs, a
LoRA adapter sync, a vision-language model's images), kept in this one module."""

from __future__ import annotations

from tandem.config.modes import rollout_tensor_parallel_problems
from tandem.config.schema import TandemConfig
from tandem.rollout import LATER_ENGINES, resolve_engine
from tandem.rollout.vllm_models import engine_kwargs_problems, model_problems, text_config


def rollout_engine_problems(cfg: TandemConfig, purpose: str = "rl") -> list[str]:
    """The rollout engine this release does not have yet or this install lacks, a tensor-parallel rollout the
    layout cannot hold, what vLLM would refuse later, and an adapter sync the engine cannot take; one line each.
    `purpose`: "rl", or "sft" (no rollout engine is built, vLLM's model checks are skipped)."""
    problems = []
    if cfg.rollout.engine in LATER_ENGINES:
        problems.append(f"rollout.engine={cfg.rollout.engine} is not available yet; use vllm or hf")
    if cfg.rollout.engine == "vllm" and resolve_engine("auto") != "vllm":
        problems.append("rollout.engine=vllm but vllm is not installed; see README (Installing) or use hf")
    if cfg.rollout.tensor_parallel > 1:
        problems += rollout_tensor_parallel_problems(cfg)
    if resolve_engine(cfg.rollout.engine) == "vllm" and purpose != "sft":
        problems += vllm_problems(cfg)
    lora = cfg.actor.lora
    if lora.syncs_adapters and resolve_engine(cfg.rollout.engine) != "vllm":
        problems.append(
            "actor.lora.rollout_sync=adapter needs vLLM's LoRA support, and vllm is not installed (the rollout "
            "engine resolves to hf); use actor.lora.rollout_sync=merged"
        )
    return problems


def vllm_problems(cfg: TandemConfig) -> list[str]:
    """What vLLM would refuse later, after the workers started: engine arguments Tandem sets itself, and the
    actor's model folder as vLLM reads it (a missing router field; on trainer.device=cpu, what vLLM's CPU
    kernels take); the fix for the model's is rollout.engine=hf."""
    problems = engine_kwargs_problems(cfg.rollout.engine_kwargs)
    device = "cpu" if cfg.trainer.device == "cpu" else None  # auto: the engine checks once it knows
    config = text_config(cfg.actor.model_path, cfg.actor.override_config) if cfg.actor.model_path else None
    model = model_problems(config, device)
    length = cfg.data.max_prompt_length + cfg.data.max_response_length  # the engine's max_model_len
    positions = (config or {}).get("max_position_embeddings")
    rope = (config or {}).get("rope_scaling") or {}
    if positions is not None and rope.get("rope_type", rope.get("type")) not in (None, "default", "llama3"):
        positions *= rope.get("factor", 1)  # vLLM's derived length of a scaled RoPE (yarn, dynamic, linear)
    if positions is not None and length > positions:
        model.append(
            f"data.max_prompt_length + data.max_response_length = {length} is more than its "
            f"max_position_embeddings={positions}, and vLLM refuses a longer max_model_len: lower them (or, where "
            "the model's positions reach further, raise max_position_embeddings in config.json)"
        )
    return problems + [f"actor.model_path={cfg.actor.model_path} for vLLM: {problem}" for problem in model]


def vision_language_rollout_problems(cfg: TandemConfig, what: str) -> list[str]:
    """A vision-language actor's images are rolled out by vLLM's batched generate alone; `what` names the model."""
    r = cfg.rollout
    if resolve_engine(r.engine) != "vllm" or r.mode != "sync" or r.layout != "hybrid":
        return [
            f"{what}: its images are rolled out by vLLM's batched generate (rollout.engine=vllm, "
            "rollout.mode=sync, rollout.layout=hybrid)"
        ]
    return []
