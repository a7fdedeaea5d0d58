"""Micro-batches for the engines: cut a rank's rows by sample count or by token budget, a dummy row for a
rank with none, and the per-micro-batch outputs put back in row order. Shared by every TrainEngine."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import Tensor

from tandem.batch import Batch, Partition
from tandem.data.packing import budget_groups


def split_micro_batches(
    batch: Batch,
    micro_batch_size: int,
    *,
    max_tokens: int | None,
    packing: bool,
    agree: Callable[[int], int] | None = None,
) -> tuple[list[Batch], Partition | None]:
    """This rank's micro-batches and the plan that restores row order (None for an empty shard).

    `micro_batch_size` samples each, or, with a `max_tokens` budget, the fewest micro-batches under it
    (a row costs its real tokens when `packing`, its padded width otherwise). `agree(count)` returns
    the count every rank must use (the largest over the ranks whose passes are collective together)."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    if max_tokens is None:
        groups = [
            range(i, min(i + micro_batch_size, len(batch))) for i in range(0, len(batch), micro_batch_size)
        ]
    else:
        lengths = token_lengths(batch, packing)
        groups = budget_groups(lengths, max_tokens)
        count = agree(len(groups)) if agree is not None else len(groups)
        if count > len(groups):
            groups = budget_groups(lengths, max_tokens, min_groups=count)
    if not len(batch):
        return [], None
    return batch.partition(groups)


def token_lengths(batch: Batch, packing: bool) -> list[int]:
    """Tokens each row costs: its real tokens when packed, the padded width otherwise."""
    if not len(batch):
        return []
    if packing:
        return batch["attention_mask"].sum(-1).tolist()
    return [batch["input_ids"].shape[1]] * len(batch)


def real_token_count(micro: Batch) -> int:
    """Real (not padding) tokens of a micro-batch."""
    if "attention_mask" in micro:
        return int(micro["attention_mask"].sum())
    return int(micro["input_ids"].numel())


def merge_outputs(parts: list[dict[str, Tensor]], plan: Partition | None) -> Batch:
    """Per-micro-batch outputs (in micro-batch order) as one Batch in the input's row order."""
    if not parts:
        return Batch()
    if plan is None:  # an empty shard: its 0-row outputs
        return Batch(parts[0])
    return plan.merge([Batch(part) for part in parts])


def to_cpu(outputs: dict[str, Tensor]) -> dict[str, Tensor]:
    return {key: value.detach().cpu() for key, value in outputs.items()}


def dummy_like(batch: Batch) -> Batch:
    """One row of zeros in `batch`'s shapes and dtypes (attention mask all ones, so outputs are finite)."""
    if "input_ids" not in batch:
        ids = torch.zeros(1, 1, dtype=torch.long)
        return Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    tensors = {
        key: torch.zeros((1, *value.shape[1:]), dtype=value.dtype) for key, value in batch.tensors.items()
    }
    if "attention_mask" in tensors:
        tensors["attention_mask"] = torch.ones_like(tensors["attention_mask"])
    non_tensors = {key: np.array([None], dtype=object) for key in batch.non_tensors}
    return Batch(tensors, non_tensors, batch.meta)


# what moves the memory of a training pass, in the order to try (docs/tuning.md, "When it does not fit")
OUT_OF_MEMORY_FIXES = (
    "lower actor.max_tokens_per_micro_batch (with actor.use_dynamic_bsz=false: the "
    "*micro_batch_size_per_rank keys)",
    "set actor.activation_checkpointing=true",
    "lower rollout.gpu_memory_utilization or raise rollout.tensor_parallel (vLLM's share of each GPU)",
    "use more GPUs (trainer.workers_per_node, trainer.nnodes)",
    "set actor.fsdp.cpu_offload=true",
)


@contextmanager
def explain_out_of_memory(
    phase: str, step: int, micro: Batch, index: int, count: int, max_tokens: int | None
) -> Iterator[None]:
    """Re-raise a CUDA out-of-memory error of micro-batch `index` (of `count`) in `phase` (forward or update)
    of training step `step` as one that says which micro-batch it was and the keys that lower the memory."""
    try:
        yield
    except torch.OutOfMemoryError as error:
        tokens, rows = real_token_count(micro), len(micro)
        width = micro["input_ids"].shape[-1] if "input_ids" in micro else 0
        budget = f"actor.max_tokens_per_micro_batch={max_tokens}" if max_tokens else "no token budget"
        first = str(error).strip().splitlines()[0] if str(error).strip() else "out of memory"
        raise torch.OutOfMemoryError(
            f"CUDA out of memory in the {phase} after {step} optimizer step(s), micro-batch {index + 1} of {count}: "
            f"{tokens} tokens in {rows} sequence(s), rows {width} wide ({budget}). To fit: "
            + "; or ".join(OUT_OF_MEMORY_FIXES)
            + ". What takes GPU memory and which key moves it: docs/tuning.md (Tuning: memory and "
            f"throughput). torch: {first}"
        ) from error
