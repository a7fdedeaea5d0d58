"""The modules megatron-core's local layer spec lacks for Tandem's models: a value head, and norms that
work under megatron's sequence parallel (the layers' norms, and Qwen3's per-head q/k norms).

The local spec (no Transformer Engine, no Apex: what runs on a CPU, and on GPUs without those) builds its
norms with `WrappedTorchNorm`, which refuses `sequence_parallel=True`: under sequence parallel each TP
rank normalises only its share of the tokens, so a norm weight's gradient is partial on every rank and
megatron must sum it over the TP group; it does that for parameters marked `sequence_parallel`, and
torch's norm is not marked. `SequenceParallelRMSNorm` is torch's RMSNorm with that mark: the same
numbers, the gradient summed where megatron sums Apex's / Transformer Engine's norms.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


class ValueHead(nn.Module):
    """A 1-wide linear value head in place of GPTModel's output layer (replicated on every TP rank)."""

    def __init__(self, hidden_size: int, dtype: torch.dtype, sequence_parallel: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(1, dtype=dtype))
        self.sequence_parallel = sequence_parallel

    def forward(self, hidden: Tensor, weight: Tensor | None = None, **_: Any) -> tuple[Tensor, None]:
        if self.sequence_parallel:
            # [s / tp, b, h] -> [s, b, h]. Every TP rank computes the same loss from all positions: backward
            # keeps this rank's positions' gradient (a split, not the reduce-scatter of a column-parallel layer).
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return nn.functional.linear(hidden, self.weight, self.bias), None


class SequenceParallelRMSNorm(nn.RMSNorm):
    """torch's RMSNorm, its weight marked for megatron's sum over the TP ranks under sequence parallel."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
        super().__init__(hidden_size, eps=eps)
        self.weight.sequence_parallel = bool(config.sequence_parallel)


class HeadRMSNorm(nn.RMSNorm):
    """torch's RMSNorm over one attention head's channels (Qwen3's q / k norms) under sequence parallel, where
    megatron's local spec refuses torch norms. Attention sees whole sequences of this TP rank's heads, so
    nothing is split by sequence; megatron sums these weights' gradients over the TP ranks by their names
    (`q_layernorm` / `k_layernorm`, with TransformerConfig.qk_layernorm)."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
        super().__init__(hidden_size, eps=eps)


def layer_spec(
    sequence_parallel: bool,
    num_layers: int,
    num_experts: int | None = None,
    context_parallel: bool = False,
    qk_layernorm: bool = False,
) -> Any:
    """GPTModel's decoder spec: megatron's local layer spec with RMSNorm (MoE layers of `num_experts` experts,
    each its own MLP, when given; an RMSNorm on each query and key head with `qk_layernorm`); under sequence
    parallel, with `SequenceParallelRMSNorm` for the layers' norms and the final norm (`num_layers`: this
    stage's) and `HeadRMSNorm` for the q / k norms; under context parallel, with `ContextParallelAttention`
    (context_parallel.py)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    spec = get_gpt_layer_local_spec(
        num_experts=num_experts, moe_grouped_gemm=False, qk_layernorm=qk_layernorm, normalization="RMSNorm"
    )
    attention = spec.submodules.self_attention.submodules
    if context_parallel:
        from tandem.engine.megatron.context_parallel import ContextParallelAttention

        attention.core_attention = ContextParallelAttention
    if not sequence_parallel:
        return spec
    if qk_layernorm:
        attention.q_layernorm = attention.k_layernorm = HeadRMSNorm
    spec.submodules.input_layernorm = SequenceParallelRMSNorm
    spec.submodules.pre_mlp_layernorm = SequenceParallelRMSNorm
    return TransformerBlockSubmodules(layer_specs=[spec] * num_layers, layer_norm=SequenceParallelRMSNorm)
