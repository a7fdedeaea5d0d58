"""Context parallel (CP) for megatron-core's local layers: each sequence split over the CP ranks of a group,
attention over the whole sequence by all-gathering the keys and values.

megatron-core runs context parallelism only inside Transformer Engine's attention (its local
`DotProductAttention` refuses it), and Transformer Engine needs CUDA. Everything else of megatron's CP is
used as it is: the CP process groups of its parallel state, its rotary embedding's share of positions per
CP rank, and its DDP, which sums gradients over data x context parallel ranks.

The split is megatron's load-balanced one: a row of `width` columns (a multiple of 2 x CP) is cut into
2 x CP equal chunks and CP rank r holds chunks r and 2 CP - 1 - r, one early and one late, so that every
rank does the same causal-attention work. The engine splits whole rows (`zigzag_columns`): a row holding
one sequence is split exactly as megatron splits each sequence; a packed row of several is balanced as a
row. `ContextParallelAttention` is megatron's local attention over this rank's queries and every rank's
keys and values (all-gathered in sequence order; their gradients reduce-scattered back to their owners),
its mask rows the rank's own columns of the full-row mask the engine passes. The model's outputs are
all-gathered over the group at the end (`gather_columns`): every rank of a group computes the same loss
on whole rows, and backward keeps each rank's own columns' gradient.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.transformer.dot_product_attention import DotProductAttention
from torch import Tensor


def zigzag_columns(width: int, rank: int, size: int, device: torch.device | None = None) -> Tensor:
    """The columns of a row of `width` (a multiple of 2 x `size`) that CP rank `rank` holds, in its order:
    chunk `rank`, then chunk 2 `size` - 1 - `rank`."""
    if width % (2 * size):
        raise ValueError(f"context parallel: a row of {width} columns does not split into 2 x {size} chunks")
    chunk = width // (2 * size)
    starts = (rank * chunk, (2 * size - 1 - rank) * chunk)
    return torch.cat([torch.arange(s, s + chunk, device=device) for s in starts])


def _gathered_chunks(size: int) -> list[int]:
    """The global chunk index at each chunk position of an all-gather of every rank's columns."""
    return [c for rank in range(size) for c in (rank, 2 * size - 1 - rank)]


def _all_gather_in_order(local: Tensor, group: Any) -> Tensor:
    """Every CP rank's [s_local, ...] all-gathered and put in sequence order: [s, ...]."""
    size = dist.get_world_size(group)
    gathered = local.new_empty((size * local.shape[0], *local.shape[1:]))
    dist.all_gather_into_tensor(gathered, local.contiguous(), group=group)
    order = torch.tensor(_gathered_chunks(size), device=local.device).argsort()
    return gathered.view(2 * size, -1, *local.shape[1:]).index_select(0, order).flatten(0, 1)


class _GatherSequence(torch.autograd.Function):
    """[s_local, ...] on every CP rank -> [s, ...] in sequence order; backward: the gradients of every
    rank's use of a rank's positions, summed on that rank (reduce-scatter)."""

    @staticmethod
    def forward(ctx: Any, local: Tensor, group: Any) -> Tensor:
        ctx.group, ctx.size = group, dist.get_world_size(group)
        return _all_gather_in_order(local, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        size = ctx.size
        chunks = torch.tensor(_gathered_chunks(size), device=grad.device)
        gathered = grad.reshape(2 * size, -1, *grad.shape[1:]).index_select(0, chunks).flatten(0, 1)
        local = grad.new_empty((gathered.shape[0] // size, *grad.shape[1:]))
        dist.reduce_scatter_tensor(local, gathered.contiguous(), group=ctx.group)
        return local, None


class _GatherColumns(torch.autograd.Function):
    """[b, s_local, ...] -> [b, s, ...] in column order; backward: this rank's own columns (every rank of
    the group computes the same loss from the gathered outputs)."""

    @staticmethod
    def forward(ctx: Any, local: Tensor, group: Any) -> Tensor:
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        full = _all_gather_in_order(local.transpose(0, 1), group).transpose(0, 1)
        ctx.columns = zigzag_columns(full.shape[1], rank, size, local.device)
        return full.contiguous()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad.index_select(1, ctx.columns), None


def gather_sequence(local: Tensor, group: Any) -> Tensor:
    """Sequence-first [s_local, ...] of every CP rank as the whole sequence [s, ...] (autograd: reduce-scatter)."""
    return _GatherSequence.apply(local, group)


def gather_columns(local: Tensor, group: Any) -> Tensor:
    """Batch-first model outputs [b, s_local, ...] as whole rows [b, s, ...] (autograd: own columns)."""
    return _GatherColumns.apply(local, group)


class ContextParallelAttention(DotProductAttention):
    """megatron's local attention for this CP rank's queries against the whole sequence's keys and values.

    `attention_mask` is the full rows' mask [b, 1, s, s] (True = not attended); the queries' rows of it are
    this rank's columns."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        local = copy.copy(config)  # megatron's local attention refuses CP; here it sees whole sequences
        local.context_parallel_size = 1
        super().__init__(local, *args, **kwargs)
        self.cp_group = ps.get_context_parallel_group()
        self.cp_rank, self.cp_size = ps.get_context_parallel_rank(), ps.get_context_parallel_world_size()

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> Tensor:
        key, value = gather_sequence(key, self.cp_group), gather_sequence(value, self.cp_group)
        rows = zigzag_columns(key.shape[0], self.cp_rank, self.cp_size, query.device)
        if attention_mask is None or attention_mask.shape[-2] != key.shape[0]:
            raise ValueError("ContextParallelAttention takes the whole rows' attention mask [b, 1, s, s]")
        mask = attention_mask.index_select(-2, rows)
        return super().forward(query, key, value, mask, attn_mask_type, attention_bias, packed_seq_params)
