"""Sequence packing ("remove padding") and token-balanced grouping of samples.

Packing. The real tokens of a padded batch [B, T] (each row's real tokens contiguous: prompts
left-padded, responses right-padded) are laid out back to back in rows of `width` tokens,
longest sequence first into the first row with room. Position ids restart at 0 for every
sequence and the model is called WITHOUT an attention mask: transformers then reads the
sequence boundaries from the position ids and keeps each sequence to itself, which it only does
with use_cache=False (DESIGN.md). The free slots at the end of a row hold the pad id with
positions 0, 1, ... of their own (a sequence of their own), and nothing reads their outputs.
Rows are as wide as the longest sequence, not one long row: attention without a varlen kernel
costs (row width)^2 per row, so one row of everything would cost more than the padding saved.

Grouping. `balanced_groups` / `budget_groups` / `equal_count_groups` split sample indices into
groups whose token sums are as even as a greedy longest-first assignment gets them: micro-batches
under a token budget, and data-parallel shares with the same number of samples each.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Packing:
    """Where each real token of a padded [B, T] batch sits in the packed [rows, width] one."""

    shape: tuple[int, int]  # (B, T): the padded batch
    packed_shape: tuple[int, int]  # (rows, width): the packed batch
    source: Tensor  # [N] flat index b*T + t of every real token in the padded batch
    target: Tensor  # [N] flat index row*width + col of the same token in the packed batch

    @property
    def num_tokens(self) -> int:
        return int(self.source.numel())

    def pack(self, padded: Tensor, fill: float | int = 0) -> Tensor:
        """[B, T, ...] -> [rows, width, ...]; free slots hold `fill`."""
        self._check(padded, self.shape, "pack")
        rest = padded.shape[2:]
        out = padded.new_full((self.packed_shape[0] * self.packed_shape[1], *rest), fill)
        out[self.target] = padded.reshape(-1, *rest)[self.source]
        return out.view(*self.packed_shape, *rest)

    def unpack(self, packed: Tensor, fill: float | int = 0) -> Tensor:
        """[rows, width, ...] -> [B, T, ...]; padding positions hold `fill` (differentiable)."""
        self._check(packed, self.packed_shape, "unpack")
        rest = packed.shape[2:]
        out = packed.new_full((self.shape[0] * self.shape[1], *rest), fill)
        out = out.index_put((self.source,), packed.reshape(-1, *rest)[self.target])
        return out.view(*self.shape, *rest)

    def packed_index(self) -> Tensor:
        """[B, T]: the flat packed index of each padded position, -1 on padding."""
        index = torch.full((self.shape[0] * self.shape[1],), -1, dtype=torch.long, device=self.source.device)
        index[self.source] = self.target
        return index.view(self.shape)

    @staticmethod
    def _check(tensor: Tensor, shape: tuple[int, int], op: str) -> None:
        if tuple(tensor.shape[:2]) != shape:
            raise ValueError(
                f"Packing.{op}: expected a tensor of shape {shape} + (...), got {tuple(tensor.shape)}"
            )


def plan_packing(attention_mask: Tensor, width: int | None = None, align: int = 1) -> Packing:
    """Pack the real tokens of `attention_mask` [B, T] into rows of `width` (default: the longest
    sequence), first fit by decreasing length. A row's real tokens must be contiguous. `align`: every
    sequence starts at a multiple of it and takes a multiple of it (the rest free slots), and the width is
    one (context parallel splits each sequence into equal chunks)."""
    mask = attention_mask != 0
    batch_size, seq_len = mask.shape
    lengths = mask.sum(-1)
    starts = mask.long().argmax(-1)  # first real token (0 for an empty row)
    positions = torch.arange(seq_len, device=mask.device)
    inside = (positions >= starts[:, None]) & (positions < (starts + lengths)[:, None])
    if not torch.equal(inside, mask):
        bad = int(torch.nonzero((inside != mask).any(-1))[0])
        raise ValueError(
            f"plan_packing: row {bad} of the attention mask has a gap between real tokens; packing needs "
            "each row's real tokens next to each other (left-padded prompt ++ right-padded response)"
        )
    lengths_list = [-(-n // align) * align for n in lengths.tolist()]  # the slots each sequence takes
    longest = max(lengths_list, default=0)
    width = longest if width is None else -(-width // align) * align
    if longest > width:
        raise ValueError(f"plan_packing: a sequence of {longest} tokens does not fit in rows of {width}")
    width = max(width, 1)
    fill: list[int] = []  # tokens used per packed row
    offsets = [0] * batch_size
    rows = [0] * batch_size
    for i in sorted(range(batch_size), key=lambda i: -lengths_list[i]):
        length = lengths_list[i]
        if length == 0:
            continue
        row = next((r for r, used in enumerate(fill) if used + length <= width), len(fill))
        if row == len(fill):
            fill.append(0)
        rows[i], offsets[i] = row, fill[row]
        fill[row] += length
    row_of = torch.tensor(rows, dtype=torch.long, device=mask.device)
    offset_of = torch.tensor(offsets, dtype=torch.long, device=mask.device)
    sample, column = torch.nonzero(mask, as_tuple=True)  # row-major: each sample's tokens in order
    within = column - starts[sample]
    source = sample * seq_len + column
    target = row_of[sample] * width + offset_of[sample] + within
    return Packing((batch_size, seq_len), (max(len(fill), 1), width), source, target)


def pack_model_inputs(
    input_ids: Tensor, attention_mask: Tensor, pad_id: int, align: int = 1, one_row: bool = False
) -> tuple[dict[str, Tensor], Packing]:
    """Packed `input_ids` and `position_ids` [rows, width] (no attention mask) and their layout (`align`: as
    `plan_packing`'s). `one_row`: every sequence in a single row (for attention kernels that cost the sum of
    the sequences' n^2, not the row's width^2)."""
    width = int(attention_mask.sum()) if one_row else None
    packing = plan_packing(attention_mask, width=width, align=align)
    ids = packing.pack(input_ids, fill=pad_id)
    real_positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    # Free slots count 0, 1, ... from where they start: a sequence of their own that nothing attends to.
    slots = torch.arange(packing.packed_shape[0] * packing.packed_shape[1], device=input_ids.device)
    free = torch.ones_like(slots, dtype=torch.bool)
    free[packing.target] = False
    run_start = torch.where(free & ~torch.roll(free, 1), slots, 0)
    run_start[0] = 0
    free_positions = slots - torch.cummax(run_start, 0).values
    positions = packing.pack(real_positions).view(-1)
    positions = torch.where(free, free_positions, positions)
    return {"input_ids": ids, "position_ids": positions.view(packing.packed_shape)}, packing


def balanced_groups(lengths: Sequence[int], num_groups: int) -> list[list[int]]:
    """Indices of `lengths` in `num_groups` groups with even token sums: longest first, each to the
    group with the fewest tokens so far (ties: the lower group). Indices ascend within a group."""
    if num_groups < 1:
        raise ValueError(f"balanced_groups: num_groups must be >= 1, got {num_groups}")
    heap = [(0, g) for g in range(num_groups)]
    groups: list[list[int]] = [[] for _ in range(num_groups)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        tokens, g = heapq.heappop(heap)
        groups[g].append(i)
        heapq.heappush(heap, (tokens + int(lengths[i]), g))
    return [sorted(g) for g in groups]


def budget_groups(lengths: Sequence[int], max_tokens: int, min_groups: int = 1) -> list[list[int]]:
    """Few groups (at least `min_groups`, none empty) of at most `max_tokens` tokens, balanced where the
    budget allows. Greedy: one more group than the optimum in rare cases."""
    if max_tokens < 1:
        raise ValueError(f"budget_groups: max_tokens must be >= 1, got {max_tokens}")
    too_long = [i for i, n in enumerate(lengths) if n > max_tokens]
    if too_long:
        i = too_long[0]
        raise ValueError(
            f"sample {i} has {lengths[i]} tokens, more than the micro-batch budget of {max_tokens} "
            "(actor.max_tokens_per_micro_batch); raise it to at least the longest prompt + response"
        )
    if not lengths:
        return []
    count = min(max(min_groups, math.ceil(sum(lengths) / max_tokens)), len(lengths))
    while True:
        # Balanced if that fits the budget, else first fit (tighter): fewer micro-batches win over balance.
        for groups in (balanced_groups(lengths, count), _first_fit_groups(lengths, count, max_tokens)):
            groups = [g for g in groups if g]
            if all(sum(lengths[i] for i in g) <= max_tokens for g in groups) and len(groups) >= min(
                min_groups, len(lengths)
            ):
                return groups
        count += 1


def _first_fit_groups(lengths: Sequence[int], count: int, max_tokens: int) -> list[list[int]]:
    """Longest first into the first of `count` groups with room; what fits nowhere goes to the last."""
    groups: list[list[int]] = [[] for _ in range(count)]
    tokens = [0] * count
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        g = next((g for g in range(count) if tokens[g] + lengths[i] <= max_tokens), count - 1)
        groups[g].append(i)
        tokens[g] += int(lengths[i])
    return [sorted(g) for g in groups]


def equal_count_groups(lengths: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
    """Groups of exactly `sizes[g]` indices with even token sums: longest first, each to the group with
    the fewest tokens that still has room. Indices ascend within a group."""
    if sum(sizes) != len(lengths):
        raise ValueError(f"equal_count_groups: sizes {list(sizes)} do not add up to {len(lengths)} samples")
    groups: list[list[int]] = [[] for _ in sizes]
    tokens = [0] * len(sizes)
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        g = min((g for g in range(len(sizes)) if len(groups[g]) < sizes[g]), key=lambda g: (tokens[g], g))
        groups[g].append(i)
        tokens[g] += int(lengths[i])
    return [sorted(g) for g in groups]
