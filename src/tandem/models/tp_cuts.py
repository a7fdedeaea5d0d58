"""Which part of each Hugging Face tensor a rank of a tensor-parallel vLLM engine keeps: the weight sync
then delivers each rank that part alone instead of the whole tensor (shard-only sync).

vLLM's loaders take whole checkpoint tensors and cut them themselves (`weight_loader`: a `narrow` along
the layer's parallel dimension at the rank's offset). For the decoder families below the cut follows from
the config alone, the way vLLM computes it:

- column-parallel (q/k/v projections, gate/up): rows, the rank's heads or its 1/k of the intermediate
  size; keys and values of a model with fewer KV heads than ranks are replicated, rank r keeping head
  r // (k / kv_heads);
- row-parallel (o_proj, down_proj weights): columns, 1/k of the input;
- vocabulary-parallel (embeddings, LM head): rows, 1/k of the vocabulary padded to a multiple of 64,
  clipped to the real vocabulary;
- everything else (norms, row-parallel biases, mixture-of-experts tensors): whole.

The engine still calls vLLM's loader with a tensor of the whole shape (`loader_input`): the rank's part
in place and NaN everywhere else, so a cut that disagreed with vLLM's would poison the rollout's log-probs
at once rather than load stale or uninitialised numbers. Architectures outside `SHARDED_FAMILIES` are
synced whole.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Cut:
    """The part of a tensor a rank keeps: `length` entries along `dim` from `start`."""

    dim: int
    start: int
    length: int


# model_type -> decoder families whose vLLM layers shard as above (Llama's module names and layout)
SHARDED_FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3", "mixtral"})
VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE
COLUMN = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROW = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
VOCAB = ("embed_tokens.weight", "lm_head.weight")


class TensorParallelCuts:
    """The cut of every tensor for every rank of a worker group whose consecutive `tensor_parallel` ranks
    share one vLLM engine (rank q is that engine's rank q % tensor_parallel)."""

    def __init__(self, hf_config: Any, tensor_parallel: int, world_size: int) -> None:
        self.tp, self.world_size = tensor_parallel, world_size
        heads = hf_config.num_attention_heads
        self.kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
        self.head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
        self.vocab = hf_config.vocab_size
        for what, count in (("attention heads", heads), ("intermediate size", hf_config.intermediate_size)):
            if count % tensor_parallel:
                raise ValueError(
                    f"rollout.tensor_parallel={tensor_parallel} does not divide the model's {what} ({count}); "
                    "vLLM cannot split it: pick a rollout.tensor_parallel that divides it"
                )
        if self.kv_heads % tensor_parallel and tensor_parallel % self.kv_heads:
            raise ValueError(
                f"rollout.tensor_parallel={tensor_parallel} and the model's {self.kv_heads} KV heads: one must "
                "divide the other for vLLM to split or replicate them"
            )

    @classmethod
    def for_model(cls, hf_config: Any, tensor_parallel: int, world_size: int) -> TensorParallelCuts | None:
        """The cuts, or None where shard-only sync does not apply (one rank per engine, or an architecture
        whose vLLM layout is not known here: synced whole)."""
        if tensor_parallel == 1:
            return None
        if hf_config.model_type not in SHARDED_FAMILIES:
            logger.info(
                "rollout.tensor_parallel=%d: %s is synced whole (shard-only sync knows %s)",
                tensor_parallel,
                hf_config.model_type,
                sorted(SHARDED_FAMILIES),
            )
            return None
        return cls(hf_config, tensor_parallel, world_size)

    def cut(self, name: str, shape: tuple[int, ...], tp_rank: int) -> Cut | None:
        """What engine rank `tp_rank` keeps of the tensor `name` of `shape`; None: all of it."""
        module = name.rsplit(".", 1)[0]
        if module.endswith(COLUMN[:3]):
            if module.endswith("q_proj"):
                size = shape[0] // self.tp
                return Cut(0, tp_rank * size, size)
            if self.kv_heads >= self.tp:
                size = shape[0] // self.tp
                return Cut(0, tp_rank * size, size)
            owner = tp_rank // (self.tp // self.kv_heads)  # replicated: one KV head per rank
            return Cut(0, owner * self.head_dim, self.head_dim)
        if module.endswith(COLUMN[3:]):
            size = shape[0] // self.tp
            return Cut(0, tp_rank * size, size)
        if name.endswith(ROW):
            size = shape[1] // self.tp
            return Cut(1, tp_rank * size, size)
        if name.endswith(VOCAB):
            padded = -(-self.vocab // VOCAB_PADDING) * VOCAB_PADDING
            per_rank = padded // self.tp
            start = min(tp_rank * per_rank, self.vocab)
            return Cut(0, start, min(start + per_rank, self.vocab) - start)
        return None

    def cuts(self, name: str, shape: tuple[int, ...]) -> list[Cut | None]:
        """The cut of every rank of the worker group, rank by rank."""
        return [self.cut(name, shape, rank % self.tp) for rank in range(self.world_size)]


def loader_input(piece: Tensor, cut: Cut | None, shape: tuple[int, ...]) -> Tensor:
    """A tensor of the whole `shape` for vLLM's loader: `piece` where `cut` says, NaN elsewhere (see the
    module docstring); `piece` itself when the cut is everything."""
    if cut is None:
        return piece
    whole = torch.full(shape, float("nan"), dtype=piece.dtype, device=piece.device)
    whole.narrow(cut.dim, cut.start, cut.length).copy_(piece)
    return whole
