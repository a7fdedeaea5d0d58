"""Context parallel (CP) for megatron-core's local layers: each sequence split over the CP ranks of a group,
attention over the whole sequence by all-gathering the keys and values.

megatron-core runs context parallelism only inside Transformer Engine's attention (its local
`DotProductAttention` refuses it), and Transformer Engine needs CUDA. Everything else of megatron's CP is
used as it is: the CP process groups of its parallel state, its rotary embedding's share of positions per
CP rank, and its DDP, which sums gradients over data x context parallel ranks.

The split is megatron's load-balanced one, for each sequence: a sequence of L columns (a multiple of
2 x CP: packing aligns them, `plan_packing(align=)`) is cut into 2 x CP equal chunks and CP rank r holds
chunks r and 2 CP - 1 - r, one early and one late, so that every rank does the same causal-attention
work; a rank's columns of a row are its chunks of every sequence in turn (`sequence_columns`), the same
count on every rank. `ContextParallelAttention` is megatron's local attention over this rank's queries and
every rank's keys and values, all-gathered in rank order (their gradients reduce-scattered back to their
owners); the engine gives it the mask rows of its own columns against the keys in that order. Rotary
positions are each column's own (`RowRotary`: megatron's rotary embedding slices one range of positions
for all rows; here each row has its own columns). The model's outputs are all-gathered over the group at
the end and put back in column order (`gather_columns`): every rank of a group computes the same loss on
whole rows, and backward keeps each rank's own columns' gradient.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.transformer.dot_product_attention import DotProductAttention
from torch import Tensor, nn


def sequence_columns(starts: Tensor, rank: int, size: int) -> Tensor:
    """[rows, width / size]: the columns CP rank `rank` of `size` holds of each row, where `starts` [rows, width]
    marks each sequence's first column (column 0 always counts as one): chunks `rank` and 2 `size` - 1 -
    `rank` of each sequence's 2 `size`, sequence after sequence."""
    rows, width = starts.shape
    out = []
    for row in range(rows):
        bounds = [0, *(int(c) for c in torch.nonzero(starts[row]).flatten() if c > 0), width]
        columns = []
        for begin, end in itertools.pairwise(bounds):
            if (end - begin) % (2 * size):
                raise ValueError(
                    f"context parallel: a sequence of {end - begin} columns (row {row}, from column {begin}) "
                    f"does not split into 2 x {size} chunks"
                )
            chunk = (end - begin) // (2 * size)
            for first in (begin + rank * chunk, begin + (2 * size - 1 - rank) * chunk):
                columns.append(torch.arange(first, first + chunk, device=starts.device))
        out.append(torch.cat(columns))
    return torch.stack(out)


def _all_gather(local: Tensor, group: Any) -> Tensor:
    """Every CP rank's [s_local, ...] as [size x s_local, ...], rank after rank."""
    gathered = local.new_empty((dist.get_world_size(group) * local.shape[0], *local.shape[1:]))
    dist.all_gather_into_tensor(gathered, local.contiguous(), group=group)
    return gathered


class _GatherSequence(torch.autograd.Function):
    """[s_local, ...] on every CP rank -> [size x s_local, ...] in rank order; backward: the gradients of every
    rank's use of a rank's positions, summed on that rank (reduce-scatter)."""

    @staticmethod
    def forward(ctx: Any, local: Tensor, group: Any) -> Tensor:
        ctx.group = group
        return _all_gather(local, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        local = grad.new_empty((grad.shape[0] // dist.get_world_size(ctx.group), *grad.shape[1:]))
        dist.reduce_scatter_tensor(local, grad.contiguous(), group=ctx.group)
        return local, None


def _along_columns(index: Tensor, like: Tensor) -> Tensor:
    """[b, n] column indices expanded over `like`'s trailing dimensions (for gather on dim 1)."""
    return index.view(*index.shape, *([1] * (like.dim() - 2))).expand(*index.shape, *like.shape[2:])


class _GatherColumns(torch.autograd.Function):
    """[b, s_local, ...] -> [b, s, ...] in column order (`order` [b, s]: the column of each gathered position,
    rank after rank); backward: this rank's own columns (`columns` [b, s_local]), as every rank of the group
    computes the same loss from the gathered outputs."""

    @staticmethod
    def forward(ctx: Any, local: Tensor, group: Any, columns: Tensor, order: Tensor) -> Tensor:
        ctx.columns = columns
        gathered = _all_gather(local.transpose(0, 1), group).transpose(0, 1)
        return gathered.gather(1, _along_columns(order.argsort(dim=1), gathered)).contiguous()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        return grad.gather(1, _along_columns(ctx.columns, grad)), None, None, None


def gather_sequence(local: Tensor, group: Any) -> Tensor:
    """Sequence-first [s_local, ...] of every CP rank as [size x s_local, ...], rank after rank (autograd:
    reduce-scatter)."""
    return _GatherSequence.apply(local, group)


def gather_columns(local: Tensor, group: Any, columns: Tensor, order: Tensor) -> Tensor:
    """Batch-first model outputs [b, s_local, ...] as whole rows [b, s, ...] (autograd: own columns)."""
    return _GatherColumns.apply(local, group, columns, order)


class RowRotary(nn.Module):
    """megatron's rotary embedding at each row's own columns: set `columns` [b, s_local] (this CP rank's) before
    each forward of the model; returns [s_local, b, 1, dim]. RoPE is relative, so each sequence of a packed
    row sees the same rotations as alone."""

    def __init__(self, rotary: nn.Module) -> None:
        super().__init__()
        self.rotary = rotary
        self.columns: Tensor | None = None

    def get_rotary_seq_len(self, *args: Any, **kwargs: Any) -> int:
        return self.rotary.get_rotary_seq_len(*args, **kwargs)

    def forward(
        self, max_seq_len: int, offset: int = 0, packed_seq: bool = False, cp_group: Any = None
    ) -> Tensor:
        if self.columns is None:
            raise RuntimeError("RowRotary: the engine sets this CP rank's columns before each forward")
        emb = self.rotary.get_emb(max_seq_len, offset)  # [s, 1, 1, dim]: every column of a row
        return emb[self.columns.transpose(0, 1)].squeeze(2)


class ContextParallelAttention(DotProductAttention):
    """megatron's local attention for this CP rank's queries against the whole sequence's keys and values.

    `attention_mask` [b, 1, s_local, s] (True = not attended): this rank's columns' rows, against the keys in
    the order they are gathered (rank after rank)."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        local = copy.copy(config)  # megatron's local attention refuses CP; here it sees whole sequences
        local.context_parallel_size = 1
        super().__init__(local, *args, **kwargs)
        self.cp_group = ps.get_context_parallel_group()

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
        if attention_mask is None or tuple(attention_mask.shape[-2:]) != (query.shape[0], key.shape[0]):
            raise ValueError(
                "ContextParallelAttention takes the mask of this rank's rows against every key [b, 1, s_local, s]"
            )
        return super().forward(
            query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params
        )
