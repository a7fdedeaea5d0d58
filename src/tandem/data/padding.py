"""Padding token lists into rectangular tensors."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from tandem.batch import Batch

# A rollout batch's prompt-side columns, with what pads them on the left ("pad": the tokenizer's pad id)
PROMPT_SIDE = {"prompts": "pad", "input_ids": "pad", "attention_mask": 0, "position_ids": 0}


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


def concat_left_padded(batches: Sequence[Batch], pad_id: int) -> Batch:
    """Rollout batches as one, the prompt side of each (the PROMPT_SIDE columns it has) left-padded to
    the widest prompt, so that every row's response starts at the same column."""
    width = max(b["prompts"].shape[1] for b in batches)
    padded = []
    for batch in batches:
        extra = width - batch["prompts"].shape[1]
        if extra:
            batch = batch.select(*batch.keys())
            for key, value in PROMPT_SIDE.items():
                if key in batch:
                    batch[key] = F.pad(batch[key], (extra, 0), value=pad_id if value == "pad" else value)
        padded.append(batch)
    return Batch.concat(padded)
