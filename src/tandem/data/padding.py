"""Padding token lists into rectangular tensors."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pad_sequences(sequences: Sequence[Sequence[int]], pad_value: int, side: str) -> torch.Tensor:
    """A ``[N, longest]`` int64 tensor, each row padded with ``pad_value`` on ``side``."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    if not sequences:
        raise ValueError("cannot pad an empty list of sequences")
    width = max(len(s) for s in sequences)
    out = torch.full((len(sequences), width), pad_value, dtype=torch.long)
    for i, seq in enumerate(sequences):
        if not seq:
            continue
        row = torch.as_tensor(seq, dtype=torch.long)
        if side == "left":
            out[i, width - len(seq) :] = row
        else:
            out[i, : len(seq)] = row
    return out


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only: ``cumsum(mask) - 1``, clipped at 0 (so left
    padding gets position 0 and the first real token too)."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)
