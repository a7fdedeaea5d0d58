"""Hugging Face causal LMs (Qwen2, Qwen3, Llama incl. Llama 3's scaled RoPE, Mixtral, Qwen3-MoE) <-> megatron-core's
GPTModel: config and weights.

Weights move one megatron parameter at a time. Each megatron parameter of this rank is a `Slot`: its
megatron name, the Hugging Face names it is made of, and how tensor parallelism cuts it:

  kind   megatron parameter                              Hugging Face parameters, TP cut
  col    embedding / output layer [V, H]                 one, split on dim 0 (vocabulary)
  row    linear_proj [H, heads*d], linear_fc2 [H, F]      one, split on dim 1 (input)
  qkv    linear_qkv [(q+2kv) heads*d, H] (+ bias)         q, k, v: per query group [its q heads; k; v],
                                                        groups split over ranks
  fc1    linear_fc1 [2F, H]                              gate, up: rank r holds [gate_r; up_r]
  rep    norms, a value head, a MoE router [E, H]          one, the same on every rank

Qwen3's per-head q/k RMSNorms (`self_attn.q_norm` / `k_norm`, [head_dim]) are megatron's
`self_attention.q_layernorm` / `k_layernorm` (TransformerConfig qk_layernorm; kind rep: every TP rank
normalises its own heads with the same weight, and megatron sums their gradients over the TP ranks).
Llama 3's RoPE (`rope_type: llama3`) keeps the weights as they are: its scaled frequencies are
transformers' own (`rotary_inv_freq`), set on megatron's rotary embedding after it is built.

Mixture-of-experts layers (Mixtral, Qwen3-MoE): megatron's expert j on expert-parallel rank r is global
expert e = r x E / EP + j (`Slot.expert`). Its `linear_fc1` is cut from row e of the model's fused
`mlp.experts.gate_up_proj` [E, 2F, H] (gate rows, then up rows: kind fc1), its `linear_fc2` from row e
of `mlp.experts.down_proj` [E, H, F] (kind row); experts are not split by TP (expert tensor parallel 1).

Pure tensor code (no torch.distributed, no megatron import): the engine gathers the shards, this file
says how they fit together; tests/engine/test_megatron_convert.py checks both directions.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from tandem.models.tp_cuts import Cut

Kind = Literal["col", "row", "qkv", "fc1", "rep"]
SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mixtral", "qwen3_moe")
QK_NORM_MODEL_TYPES = ("qwen3", "qwen3_moe")  # an RMSNorm over each query / key head before RoPE
ROPE_TYPES = ("default", "llama3")


@dataclass(frozen=True)
class Shapes:
    """The attention geometry the qkv conversion needs."""

    num_heads: int
    num_query_groups: int
    head_dim: int

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_query_groups


@dataclass(frozen=True)
class Slot:
    """One megatron parameter of this rank and the Hugging Face parameters it holds a cut of."""

    megatron: str
    hf: tuple[str, ...]
    kind: Kind
    expert: int | None = None  # a MoE expert's global index: its row of the fused Hugging Face tensors


def shapes_of(hf_config: Any) -> Shapes:
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return Shapes(heads, getattr(hf_config, "num_key_value_heads", None) or heads, head_dim)


def num_experts(hf_config: Any) -> int | None:
    """Experts per MoE layer (None for a dense model)."""
    return getattr(hf_config, "num_local_experts", None) or getattr(hf_config, "num_experts", None)


def check_supported(
    hf_config: Any,
    tensor_parallel: int,
    pipeline_parallel: int,
    expert_parallel: int = 1,
    sequence_parallel: bool = False,
) -> None:
    """Errors for what the converter or the parallel layout cannot take, naming the field and the fix: one
    ValueError that lists the architecture's features megatron is not built for (FSDP2 trains them), then the
    sizes the layout does not divide."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"actor.strategy=megatron builds {', '.join(SUPPORTED_MODEL_TYPES)} models; this folder's "
            f"config.json has model_type={model_type!r}; use actor.strategy=fsdp for it"
        )
    unbuilt = []  # the architecture: megatron here has no module for it
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        unbuilt.append(f"hidden_act={hf_config.hidden_act!r} (megatron's gated MLP here is SiLU)")
    rope_type = rope_parameters(hf_config).get("rope_type", "default")
    if rope_type not in ROPE_TYPES:
        unbuilt.append(f"rope_parameters.rope_type={rope_type!r} (RoPE types built: {', '.join(ROPE_TYPES)})")
    partial = rope_parameters(hf_config).get(
        "partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", 1.0)
    )
    if partial not in (None, 1.0):
        unbuilt.append(f"partial_rotary_factor={partial} (RoPE on every channel of a head only)")
    if (
        getattr(hf_config, "use_sliding_window", False)
        or "sliding_attention" in (getattr(hf_config, "layer_types", None) or ())
        or (model_type in ("mixtral", "qwen3_moe") and getattr(hf_config, "sliding_window", None))
    ):
        unbuilt.append("a sliding window (use_sliding_window / sliding_window / layer_types)")
    if getattr(hf_config, "router_jitter_noise", 0.0):
        unbuilt.append(
            f"router_jitter_noise={hf_config.router_jitter_noise} (megatron's router adds no noise)"
        )
    if getattr(hf_config, "mlp_bias", False):
        unbuilt.append("mlp_bias=true")
    dense_layers = getattr(hf_config, "mlp_only_layers", None) or []
    sparse_step = getattr(hf_config, "decoder_sparse_step", 1)
    if dense_layers or sparse_step not in (None, 1):
        unbuilt.append(
            f"dense MLP layers between the MoE layers (mlp_only_layers={list(dense_layers)}, "
            f"decoder_sparse_step={sparse_step}; every layer must be a MoE layer)"
        )
    problems = []  # the layout: other sizes would do
    experts = num_experts(hf_config)
    if experts is None and expert_parallel > 1:
        problems.append(f"actor.megatron.expert_parallel={expert_parallel} with a dense model (no experts)")
    if experts is not None and experts % expert_parallel:
        problems.append(
            f"num_local_experts={experts} is not a multiple of actor.megatron.expert_parallel={expert_parallel}"
        )
    if experts is not None and tensor_parallel > 1 and not sequence_parallel:
        problems.append(
            f"a mixture-of-experts model with actor.megatron.tensor_parallel={tensor_parallel} needs "
            "actor.megatron.sequence_parallel=true (megatron-core refuses MoE layers under TP without it)"
        )
    shapes = shapes_of(hf_config)
    if shapes.num_query_groups % tensor_parallel:
        problems.append(
            f"num_key_value_heads={shapes.num_query_groups} is not a multiple of "
            f"actor.megatron.tensor_parallel={tensor_parallel}"
        )
    if hf_config.vocab_size % tensor_parallel:
        problems.append(
            f"vocab_size={hf_config.vocab_size} is not a multiple of actor.megatron.tensor_parallel="
            f"{tensor_parallel} (pad the vocabulary, as most released models do)"
        )
    if experts is None and hf_config.intermediate_size % tensor_parallel:  # experts are whole on a rank
        problems.append(
            f"intermediate_size={hf_config.intermediate_size} is not a multiple of tensor_parallel={tensor_parallel}"
        )
    if hf_config.num_hidden_layers % pipeline_parallel:
        problems.append(
            f"num_hidden_layers={hf_config.num_hidden_layers} is not a multiple of "
            f"actor.megatron.pipeline_parallel={pipeline_parallel}"
        )
    messages = []
    if unbuilt:
        messages.append(
            f"actor.strategy=megatron does not build this {model_type} model: "
            + "; ".join(unbuilt)
            + "; use actor.strategy=fsdp for it"
        )
    if problems:
        messages.append(
            "actor.strategy=megatron cannot cut this model over its layout: " + "; ".join(problems)
        )
    if messages:
        raise ValueError(". ".join(messages))


def moe_config_kwargs(hf_config: Any, expert_parallel: int) -> dict[str, Any]:
    """megatron TransformerConfig fields of a mixture-of-experts model ({} for a dense one). Top-k of the
    router logits, then a softmax over those k: Mixtral's (and Qwen3-MoE's with norm_topk_prob) softmax over
    all experts renormalised over its top k; without norm_topk_prob, the softmax over all experts and its top
    k as they are (megatron's pre-softmax). megatron adds no load-balancing loss of its own: the engine adds
    Tandem's (engine/moe.py)."""
    experts = num_experts(hf_config)
    if experts is None:
        return {}
    return {
        "num_moe_experts": experts,
        "moe_router_topk": hf_config.num_experts_per_tok,
        "moe_ffn_hidden_size": expert_intermediate_size(hf_config),
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "moe_grouped_gemm": False,  # grouped GEMM needs Transformer Engine or CUTLASS kernels
        "moe_router_pre_softmax": not renormalises_top_k(hf_config),
        "expert_model_parallel_size": expert_parallel,
        "expert_tensor_parallel_size": 1,
    }


def expert_intermediate_size(hf_config: Any) -> int:
    """One expert's MLP width: Qwen3-MoE's `moe_intermediate_size`, Mixtral's `intermediate_size`."""
    return getattr(hf_config, "moe_intermediate_size", None) or hf_config.intermediate_size


def renormalises_top_k(hf_config: Any) -> bool:
    """Whether the router's top-k probabilities are renormalised to sum to 1 (Mixtral always)."""
    return bool(getattr(hf_config, "norm_topk_prob", True))


def qk_norm(hf_config: Any) -> bool:
    """Whether each query and key head is RMS-normalised before RoPE (Qwen3's q_norm / k_norm)."""
    return hf_config.model_type in QK_NORM_MODEL_TYPES


def attention_bias(hf_config: Any) -> bool:
    """Qwen2 always has q/k/v biases; Llama-family configs say so in `attention_bias`."""
    return hf_config.model_type == "qwen2" or bool(getattr(hf_config, "attention_bias", False))


def transformer_config_kwargs(hf_config: Any) -> dict[str, Any]:
    """megatron TransformerConfig fields that describe the Hugging Face architecture."""
    shapes = shapes_of(hf_config)
    return {
        "num_layers": hf_config.num_hidden_layers,
        "hidden_size": hf_config.hidden_size,
        "ffn_hidden_size": hf_config.intermediate_size,
        "num_attention_heads": shapes.num_heads,
        "num_query_groups": shapes.num_query_groups,
        "kv_channels": shapes.head_dim,
        "normalization": "RMSNorm",
        "layernorm_epsilon": hf_config.rms_norm_eps,
        "gated_linear_unit": True,
        "activation_func": torch.nn.functional.silu,
        "add_bias_linear": False,
        "add_qkv_bias": attention_bias(hf_config),
        "qk_layernorm": qk_norm(hf_config),
    }


def rope_parameters(hf_config: Any) -> dict[str, Any]:
    return dict(getattr(hf_config, "rope_parameters", None) or {})


def rotary_base(hf_config: Any) -> float:
    return float(rope_parameters(hf_config).get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))


def rotary_inv_freq(hf_config: Any) -> Tensor | None:
    """RoPE's inverse frequencies [head_dim / 2] of a scaled RoPE (llama3), as transformers computes them; None
    for the default RoPE, which megatron's rotary embedding computes alike. megatron's own llama3 scaling
    (GPTModel's rope_scaling) takes the factor only, its low / high frequency factors and original context
    fixed at Llama 3.1's 1, 4 and 8192 (the released Llama 3.x checkpoints' values; another original context, as
    in the tests' tiny models, would get other frequencies): these take every value from the config."""
    rope_type = rope_parameters(hf_config).get("rope_type", "default")
    if rope_type == "default":
        return None
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[rope_type](copy.deepcopy(hf_config), torch.device("cpu"))
    if attention_factor != 1.0:  # scales cos / sin: megatron's rotary embedding has no such factor
        raise ValueError(
            f"rope_type={rope_type!r} scales attention by {attention_factor}; not built on megatron"
        )
    return inv_freq.float()


def slots(
    hf_config: Any,
    *,
    head: str,
    layer_offset: int,
    num_local_layers: int,
    first_stage: bool,
    last_stage: bool,
    expert_rank: int = 0,
    expert_parallel: int = 1,
) -> list[Slot]:
    """This pipeline stage's megatron parameters, in model order, with their Hugging Face sources.

    Layers are numbered from 0 on every stage in megatron; `layer_offset` is the stage's first global
    layer. A tied causal LM's last stage (when it is not also the first) holds a copy of the
    embedding as its output layer. A MoE model's layers hold this expert-parallel rank's experts: for
    each layer, every local expert's fc1, then every local expert's fc2."""
    tied = head == "lm" and bool(getattr(hf_config, "tie_word_embeddings", False))
    bias, norms = attention_bias(hf_config), qk_norm(hf_config)
    out: list[Slot] = []
    if first_stage:
        out.append(Slot("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "col"))
    for local in range(num_local_layers):
        m, h = f"decoder.layers.{local}", f"model.layers.{layer_offset + local}"
        attn = f"{h}.self_attn"
        out += [
            Slot(f"{m}.input_layernorm.weight", (f"{h}.input_layernorm.weight",), "rep"),
            Slot(
                f"{m}.self_attention.linear_qkv.weight",
                (f"{attn}.q_proj.weight", f"{attn}.k_proj.weight", f"{attn}.v_proj.weight"),
                "qkv",
            ),
        ]
        if bias:
            out.append(
                Slot(
                    f"{m}.self_attention.linear_qkv.bias",
                    (f"{attn}.q_proj.bias", f"{attn}.k_proj.bias", f"{attn}.v_proj.bias"),
                    "qkv",
                )
            )
        if norms:
            out += [
                Slot(f"{m}.self_attention.q_layernorm.weight", (f"{attn}.q_norm.weight",), "rep"),
                Slot(f"{m}.self_attention.k_layernorm.weight", (f"{attn}.k_norm.weight",), "rep"),
            ]
        out += [
            Slot(f"{m}.self_attention.linear_proj.weight", (f"{attn}.o_proj.weight",), "row"),
            Slot(f"{m}.pre_mlp_layernorm.weight", (f"{h}.post_attention_layernorm.weight",), "rep"),
        ]
        experts = num_experts(hf_config)
        if experts is None:
            out += [
                Slot(
                    f"{m}.mlp.linear_fc1.weight",
                    (f"{h}.mlp.gate_proj.weight", f"{h}.mlp.up_proj.weight"),
                    "fc1",
                ),
                Slot(f"{m}.mlp.linear_fc2.weight", (f"{h}.mlp.down_proj.weight",), "row"),
            ]
            continue
        out.append(Slot(f"{m}.mlp.router.weight", (f"{h}.mlp.gate.weight",), "rep"))
        local = experts // expert_parallel
        for fc, hf_name, kind in (("linear_fc1", "gate_up_proj", "fc1"), ("linear_fc2", "down_proj", "row")):
            out += [
                Slot(
                    f"{m}.mlp.experts.local_experts.{j}.{fc}.weight",
                    (f"{h}.mlp.experts.{hf_name}",),
                    kind,
                    expert=expert_rank * local + j,
                )
                for j in range(local)
            ]
    if last_stage:
        out.append(Slot("decoder.final_layernorm.weight", ("model.norm.weight",), "rep"))
        if head == "value":
            out += [
                Slot("output_layer.weight", ("score.weight",), "rep"),
                Slot("output_layer.bias", ("score.bias",), "rep"),
            ]
        elif not tied:
            out.append(Slot("output_layer.weight", ("lm_head.weight",), "col"))
        elif not first_stage:
            out.append(Slot("output_layer.weight", ("model.embed_tokens.weight",), "col"))
    return out


def to_shard(slot: Slot, hf: list[Tensor], shapes: Shapes, tp_rank: int, tp_size: int) -> Tensor:
    """This TP rank's cut of `slot` from the full Hugging Face tensors `hf` (in `slot.hf` order). An
    expert's: its row of the fused tensors, whole (pass the expert tensor-parallel rank / size, 0 / 1)."""
    if slot.expert is not None:
        hf = [t[slot.expert] for t in hf]
        if slot.kind == "fc1":  # [2F, H]: gate rows, then up rows
            hf = list(hf[0].chunk(2, dim=0))
    if slot.kind == "rep":
        return hf[0]
    if slot.kind == "col":
        return hf[0].chunk(tp_size, dim=0)[tp_rank]
    if slot.kind == "row":
        return hf[0].chunk(tp_size, dim=1)[tp_rank]
    if slot.kind == "fc1":
        gate, up = (t.chunk(tp_size, dim=0)[tp_rank] for t in hf)
        return torch.cat([gate, up], dim=0)
    return fuse_qkv(*hf, shapes).chunk(tp_size, dim=0)[tp_rank]


def from_shards(slot: Slot, shards: list[Tensor], shapes: Shapes) -> list[Tensor]:
    """The full Hugging Face tensors (in `slot.hf` order) from every TP rank's cut, in rank order. An
    expert's: its row of the fused tensor (the engine stacks the experts' rows)."""
    if slot.expert is not None and slot.kind == "fc1":
        halves = [s.chunk(2, dim=0) for s in shards]
        return [torch.cat([torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])])]
    if slot.kind == "rep":
        return [shards[0]]
    if slot.kind == "col":
        return [torch.cat(shards, dim=0)]
    if slot.kind == "row":
        return [torch.cat(shards, dim=1)]
    if slot.kind == "fc1":
        halves = [s.chunk(2, dim=0) for s in shards]
        return [torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])]
    return list(split_qkv(torch.cat(shards, dim=0), shapes))


def tp_cuts(slot: Slot, hf_shapes: list[tuple[int, ...]], tp_rank: int, tp_size: int) -> list[Cut | None]:
    """What TP rank `tp_rank` holds of each of `slot`'s Hugging Face tensors (their whole shapes in `hf_shapes`),
    as `from_shards` of its cut alone (with `local_shapes`) returns them; None: the whole tensor."""
    if slot.kind == "rep" or tp_size == 1 or slot.expert is not None:
        return [None] * len(hf_shapes)
    dim = 1 if slot.kind == "row" else 0
    return [Cut(dim, tp_rank * (shape[dim] // tp_size), shape[dim] // tp_size) for shape in hf_shapes]


def local_shapes(shapes: Shapes, tp_size: int) -> Shapes:
    """The attention geometry of one TP rank's heads and query groups."""
    return Shapes(shapes.num_heads // tp_size, shapes.num_query_groups // tp_size, shapes.head_dim)


def fuse_qkv(q: Tensor, k: Tensor, v: Tensor, shapes: Shapes) -> Tensor:
    """[q; k; v] by rows -> megatron's layout: per query group, its q heads then its k then its v."""
    g, d = shapes.num_query_groups, shapes.head_dim
    rest = q.shape[1:]
    q = q.reshape(g, shapes.heads_per_group * d, *rest)
    k = k.reshape(g, d, *rest)
    v = v.reshape(g, d, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def split_qkv(fused: Tensor, shapes: Shapes) -> tuple[Tensor, Tensor, Tensor]:
    """Inverse of `fuse_qkv`."""
    g, d, per = shapes.num_query_groups, shapes.head_dim, shapes.heads_per_group
    rest = fused.shape[1:]
    grouped = fused.reshape(g, (per + 2) * d, *rest)
    q, k, v = grouped.split([per * d, d, d], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)
