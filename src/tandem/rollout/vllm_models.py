"""What vLLM takes: of a model folder, and of the engine arguments a user passes (rollout.engine_kwargs).

Read from config.json alone, without importing vLLM, so that the trainer's start-up checks can ask before
any worker starts, and the engine itself before vLLM fails on a model deep in its own start-up. The
numbers are vLLM 0.32's (tests/rollout/test_vllm_models.py compares them with the installed vLLM).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tandem.models.config_overrides import text_config

if TYPE_CHECKING:
    from tandem.rollout.base import RolloutSpec

# vLLM's CPU attention (CPUAttentionBackend.get_supported_head_sizes)
CPU_ATTENTION_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# vLLM's CPU MLA kernel compiles for one latent cache size: kv_lora_rank 512 + qk_rope_head_dim 64
CPU_MLA_LATENT_SIZE = 576
CPU_MLA_BACKEND = "CPU_MLA"
# vLLM 0.32's CPU rotary kernel (_C.rotary_embedding, what RotaryEmbedding.forward_cpu calls) rotates a query
# of [tokens, heads, dim] wrongly (measured: only the first token's first head comes out right; a query of
# [tokens, heads * dim], every other family's, is right). Its MLA layer passes such a query, so MLA models on
# a CPU take vLLM's PyTorch rotary instead: without it a tiny DeepSeek-V3 with default RoPE differs from
# transformers by 2e-3 in log-prob, with it by 5e-7. DeepSeek's yarn RoPE (DeepseekScalingRotaryEmbedding)
# is computed in PyTorch on a CPU anyway.
CPU_MLA_CUSTOM_OPS = ("-rotary_embedding",)

# DeepSeek-V3's router: transformers always computes it so; vLLM reads it from these fields (and computes a
# softmax router without the correction bias where they are missing)
DEEPSEEK_V3_ROUTER = {"topk_method": "noaux_tc", "scoring_func": "sigmoid"}

# vLLM engine arguments Tandem sets itself -> where their value comes from
TANDEM_ENGINE_ARGS = {
    "model": "actor.model_path",
    "tokenizer": "actor.tokenizer_path",
    "dtype": "the actor's compute dtype (actor.fsdp.param_dtype / the megatron engine's)",
    "max_model_len": "data.max_prompt_length + data.max_response_length",
    "tensor_parallel_size": "rollout.tensor_parallel",
    "gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "seed": "trainer.seed",
    "logprobs_mode": "Tandem's log-probs (processed_logprobs, what the trainer recomputes)",
    "enable_sleep_mode": "the hybrid layout's sleep / wake",
    "distributed_executor_backend": "rollout.tensor_parallel (vLLM's external launcher in Tandem's ranks)",
    "enable_lora": "actor.lora.rollout_sync",
    "max_lora_rank": "actor.lora.rank",
    "max_loras": "actor.lora.rollout_sync",
    # the model config the rollout builds is the one the actor trains (a rollout-only change is a silent mismatch)
    "hf_overrides": "actor.override_config",
}


# vLLM engine arguments older vLLM releases took (and verl's example scripts still pass) -> today's name and value
RENAMED_ENGINE_ARGS = {
    # later vLLM releases replaced the flag by a cache size: disabled is a size of 0
    "disable_mm_preprocessor_cache": ("mm_processor_cache_gb", lambda disabled: 0 if disabled else None),
}


def current_engine_kwargs(engine_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """rollout.engine_kwargs with the older vLLM names of RENAMED_ENGINE_ARGS given as today's (a value that
    asks for vLLM's default is left out)."""
    current = {}
    for name, value in engine_kwargs.items():
        if name in RENAMED_ENGINE_ARGS:
            new_name, convert = RENAMED_ENGINE_ARGS[name]
            if new_name not in engine_kwargs and (converted := convert(value)) is not None:
                current[new_name] = converted  # where both are given, today's name wins
        else:
            current[name] = value
    return current


def engine_kwargs_problems(engine_kwargs: Mapping[str, Any]) -> list[str]:
    """rollout.engine_kwargs that Tandem sets itself, and (where vLLM is installed) names vLLM's engine does not
    take, one line each naming the key and what to do."""
    engine_kwargs = current_engine_kwargs(engine_kwargs)
    problems = [
        f"rollout.engine_kwargs.{name}: Tandem sets this vLLM argument itself from {TANDEM_ENGINE_ARGS[name]}; "
        "remove it from rollout.engine_kwargs"
        for name in sorted(set(engine_kwargs) & set(TANDEM_ENGINE_ARGS))
    ]
    known = vllm_engine_arg_names() if engine_kwargs else None
    for name in sorted(set(engine_kwargs) - set(TANDEM_ENGINE_ARGS) - (known or set(engine_kwargs))):
        close = difflib.get_close_matches(name, sorted(known or ()), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        problems.append(
            f"rollout.engine_kwargs.{name}: not an argument of the installed vLLM's engine (vllm.EngineArgs){hint}; "
            "fix or remove it"
        )
    return problems


def vllm_engine_arg_names() -> set[str] | None:
    """The argument names of the installed vLLM's engine (EngineArgs' fields), or None without vLLM."""
    if importlib.util.find_spec("vllm") is None:
        return None
    from vllm.engine.arg_utils import EngineArgs

    return {f.name for f in dataclasses.fields(EngineArgs)}


def is_mla(config: Mapping[str, Any]) -> bool:
    """Multi-head latent attention (DeepSeek-V2 / V3 and their kin): the config has a kv_lora_rank."""
    return config.get("kv_lora_rank") is not None


def default_engine_kwargs(config: Mapping[str, Any] | None, device_type: str) -> dict[str, Any]:
    """vLLM arguments a model needs on a device beyond vLLM's defaults: on a CPU, MLA models take
    CPU_MLA attention (vLLM prefers its AMX MLA backend where the CPU has AMX, which refuses fp32 weights
    and, in bf16, an in-place weight reload) and vLLM's PyTorch rotary embedding (CPU_MLA_CUSTOM_OPS)."""
    if config is not None and device_type == "cpu" and is_mla(config):
        return {
            "attention_backend": CPU_MLA_BACKEND,
            "compilation_config": {"custom_ops": list(CPU_MLA_CUSTOM_OPS)},
        }
    return {}


def model_problems(config: Mapping[str, Any] | None, device_type: str | None) -> list[str]:
    """What vLLM would refuse (or compute differently from transformers) in a model's config.json, one line
    each naming the field; `device_type` "cpu" adds the limits of vLLM's CPU kernels (None: unknown yet)."""
    if config is None:
        return []
    problems = []
    if config.get("model_type") == "deepseek_v3":
        for field, value in DEEPSEEK_V3_ROUTER.items():
            if config.get(field) != value:
                problems.append(
                    f"config.json's {field} is {config.get(field)!r}; DeepSeek-V3's router (transformers', and "
                    f"every released checkpoint's config.json) is {field}={value!r}: vLLM reads the field and "
                    "would route otherwise. Add it to config.json"
                )
    if device_type != "cpu":
        return problems
    if is_mla(config):
        latent = config["kv_lora_rank"] + (config.get("qk_rope_head_dim") or 0)
        if latent != CPU_MLA_LATENT_SIZE:
            problems.append(
                f"kv_lora_rank + qk_rope_head_dim = {latent}: vLLM's CPU MLA attention takes "
                f"{CPU_MLA_LATENT_SIZE} only (512 + 64, DeepSeek's); on a CPU use rollout.engine=hf"
            )
        return problems
    heads = config.get("num_attention_heads")
    head_dim = config.get("head_dim") or (config["hidden_size"] // heads if heads else None)
    if head_dim is not None and head_dim not in CPU_ATTENTION_HEAD_SIZES:
        problems.append(
            f"head size {head_dim}: vLLM's CPU attention takes head sizes {list(CPU_ATTENTION_HEAD_SIZES)}; "
            "on a CPU use rollout.engine=hf"
        )
    return problems


def check_buildable(spec: RolloutSpec) -> list[str]:
    """What vLLM would refuse later, after the workers started (`VLLMRollout.check_buildable`): engine arguments
    Tandem sets itself, and the model folder as vLLM reads it (a missing router field; on a CPU, what vLLM's CPU
    kernels take; a max_model_len beyond the model's positions); the fix for the model's is rollout.engine=hf.
    The rollout builds the actor's model, so its folder is named actor.model_path."""
    problems = engine_kwargs_problems(spec.engine_kwargs)
    config = text_config(spec.model_path, dict(spec.override_config or {})) if spec.model_path else None
    model = model_problems(config, spec.device.type if spec.device is not None else None)
    length = spec.max_model_len
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
    return problems + [f"actor.model_path={spec.model_path} for vLLM: {problem}" for problem in model]
