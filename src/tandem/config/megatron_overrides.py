"""What of megatron-core's own configs a user may set: `actor.megatron.override_transformer_config` (fields of
megatron's TransformerConfig) and `actor.megatron.override_optimizer_config` (fields of its OptimizerConfig).

A key is passed through to megatron unless it is one of these:
- set by Tandem: the layout (parallel sizes), the precision, the model's shape (read from the Hugging Face
  folder) and what the engine needs to be correct (`variable_seq_lengths`, `batch_p2p_comm`, ...): an error
  naming the Tandem key that sets it, or the reason;
- not built by Tandem (a pipeline layout string): an error with the reason;
- of no effect (a kernel choice for parts Tandem does not build, such as Transformer Engine's attention
  backends or DeepEP's token dispatcher): accepted, and the build logs that it is ignored and why;
- CUDA-only (fused kernels, CPU optimizer offload): passed through on CUDA; on the CPU the build turns it
  off and logs so, since the torch paths compute the same numbers.
A key megatron's config does not have is an error naming it (checked when megatron-core is importable, and
again when the engine is built).

These are rules both sides read: the config check (config/checks/megatron.py) and the megatron engine's build
(engine/megatron/build.py, `resolved_overrides`); the engine imports no config check.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import TYPE_CHECKING, Any

from tandem.config.errors import closest

if TYPE_CHECKING:
    from tandem.config.schema import MegatronConfig

logger = logging.getLogger(__name__)

_LAYOUT = "Tandem sets it from actor.megatron.{} (the engines of one process share megatron's parallel state)"
_MODEL = "Tandem reads the model's shape from its Hugging Face config.json"
_PRECISION = "Tandem sets the precision from actor.megatron.param_dtype"

TRANSFORMER_SET_BY_TANDEM: dict[str, str] = {
    "tensor_model_parallel_size": _LAYOUT.format("tensor_parallel"),
    "pipeline_model_parallel_size": _LAYOUT.format("pipeline_parallel"),
    "virtual_pipeline_model_parallel_size": _LAYOUT.format("virtual_pipeline"),
    "context_parallel_size": _LAYOUT.format("context_parallel"),
    "expert_model_parallel_size": _LAYOUT.format("expert_parallel"),
    "expert_tensor_parallel_size": "Tandem keeps each expert whole on a rank (expert tensor parallel 1)",
    "sequence_parallel": _LAYOUT.format("sequence_parallel"),
    "params_dtype": _PRECISION,
    "pipeline_dtype": _PRECISION,
    "bf16": _PRECISION,
    "fp16": _PRECISION,
    "variable_seq_lengths": "Tandem's micro-batches differ in length (token budget, packing); the engine sets it",
    "batch_p2p_comm": "Tandem sends pipeline activations one at a time (batched sends can swap activation and "
    "gradient between two stages); the engine sets it",
    "use_cpu_initialization": "the engine builds on the CPU and copies the Hugging Face weights in",
    "perform_initialization": "the engine's CPU initialisation marks tensor-parallel weights; it sets it",
    "hidden_dropout": "Tandem trains without dropout (RL log-probs must be deterministic)",
    "attention_dropout": "Tandem trains without dropout (RL log-probs must be deterministic)",
    **{
        name: _MODEL
        for name in (
            "num_layers",
            "hidden_size",
            "ffn_hidden_size",
            "num_attention_heads",
            "num_query_groups",
            "kv_channels",
            "layernorm_epsilon",
            "normalization",
            "activation_func",
            "gated_linear_unit",
            "add_bias_linear",
            "add_qkv_bias",
            "qk_layernorm",
            "num_moe_experts",
            "moe_ffn_hidden_size",
            "moe_router_topk",
            "moe_router_pre_softmax",
            "moe_router_load_balancing_type",
            "moe_aux_loss_coeff",
        )
    },
}

# the layer split over pipeline stages: Tandem's build (engine/megatron/build.py `ChunkMap.layers`) asks megatron
# for each stage's layers, an even split or one with the first / last stage's sizes; a layout string places
# layers by the current rank alone, which the weights' cuts for the other stages cannot ask
TRANSFORMER_NOT_BUILT: dict[str, str] = {
    "pipeline_model_parallel_layout": "Tandem splits the decoder layers evenly, or with "
    "num_layers_in_first_pipeline_stage / num_layers_in_last_pipeline_stage; a layout string is not built. "
    "Use those two keys"
}

TRANSFORMER_NO_EFFECT: dict[str, str] = {
    "attention_backend": "Tandem's layers use megatron-core's own attention, not Transformer Engine's backends",
    "moe_token_dispatcher_type": "Tandem dispatches tokens to experts with alltoall (megatron needs it for "
    "micro-batches of different lengths); the same numbers",
    "moe_enable_deepep": "Tandem dispatches tokens with alltoall, not DeepEP; the same numbers",
    "moe_grouped_gemm": "Tandem's experts are megatron's per-expert MLPs (their weights are converted one "
    "expert at a time); the same numbers",
}

# kernels that need CUDA (and some Apex or Transformer Engine): passed through on CUDA, off on the CPU
CUDA_ONLY = frozenset(
    {
        "gradient_accumulation_fusion",
        "apply_rope_fusion",
        "masked_softmax_fusion",
        "bias_activation_fusion",
        "bias_dropout_fusion",
        "persist_layer_norm",
        "moe_permute_fusion",
        "moe_shared_expert_overlap",
        "cross_entropy_loss_fusion",
        # OptimizerConfig's
        "optimizer_cpu_offload",
        "overlap_cpu_optimizer_d2h_h2d",
        "use_precision_aware_optimizer",
    }
)

OPTIMIZER_SET_BY_TANDEM: dict[str, str] = {
    **{
        name: "Tandem sets it from actor.optim.*"
        for name in ("optimizer", "lr", "min_lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps")
    },
    "clip_grad": "Tandem clips after its non-finite check, from actor.grad_clip",
    "use_distributed_optimizer": "Tandem sets it from actor.megatron.distributed_optimizer",
    "bf16": _PRECISION,
    "fp16": _PRECISION,
    "params_dtype": _PRECISION,
}


def megatron_fields(kind: str) -> set[str] | None:
    """The field names of megatron-core's TransformerConfig (`kind` "transformer") or OptimizerConfig
    ("optimizer"); None when megatron-core is not importable."""
    try:
        with warnings.catch_warnings():  # megatron warns at import that Apex / Transformer Engine are absent
            warnings.simplefilter("ignore")
            if kind == "transformer":
                from megatron.core.transformer import TransformerConfig as config_class
            else:
                from megatron.core.optimizer import OptimizerConfig as config_class
    except ImportError:
        return None
    return {f.name for f in dataclasses.fields(config_class)}


def override_problems(kind: str, overrides: dict[str, Any], fields: set[str] | None) -> list[tuple[str, str]]:
    """(key, message) for each key of `overrides` (kind "transformer" or "optimizer") megatron-core lacks or
    Tandem refuses. `fields`: megatron's field names (None: not checked)."""
    section = f"actor.megatron.override_{kind}_config"
    set_by_tandem = TRANSFORMER_SET_BY_TANDEM if kind == "transformer" else OPTIMIZER_SET_BY_TANDEM
    not_built = TRANSFORMER_NOT_BUILT if kind == "transformer" else {}
    config_name = "TransformerConfig" if kind == "transformer" else "OptimizerConfig"
    out = []
    for name in overrides:
        key = f"{section}.{name}"
        if name in set_by_tandem:
            out.append((key, f"{key}: {set_by_tandem[name]}; it cannot be overridden"))
        elif name in not_built:
            out.append((key, f"{key}: {not_built[name]}"))
        elif fields is not None and name not in fields:
            near = closest(name, fields)
            hint = f"; did you mean '{near}'?" if near else ""
            out.append((key, f"{key}: megatron-core's {config_name} has no field '{name}'{hint}"))
    return out


def resolved_overrides(kind: str, megatron: MegatronConfig, on_cuda: bool) -> dict[str, Any]:
    """The overrides an engine passes to megatron's TransformerConfig / OptimizerConfig: the refused keys
    raise ValueError (a config built without load_config), the no-effect ones and, off CUDA, the CUDA-only
    ones are dropped with a log line saying why."""
    overrides = dict(
        megatron.override_transformer_config if kind == "transformer" else megatron.override_optimizer_config
    )
    problems = override_problems(kind, overrides, megatron_fields(kind))
    if problems:
        raise ValueError("; ".join(message for _, message in problems))
    for name in [n for n in overrides if n in TRANSFORMER_NO_EFFECT]:
        logger.info(
            "actor.megatron.override_%s_config.%s ignored: %s", kind, name, TRANSFORMER_NO_EFFECT[name]
        )
        del overrides[name]
    cuda_only = sorted(n for n in overrides if n in CUDA_ONLY and overrides[n])
    if cuda_only and not on_cuda:
        logger.info(
            "actor.megatron.override_%s_config: %s off on the CPU (CUDA kernels; the torch path computes the "
            "same)",
            kind,
            ", ".join(cuda_only),
        )
        for name in cuda_only:
            overrides[name] = False
    return overrides
