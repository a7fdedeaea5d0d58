"""Loss aggregation: a (B, T) per-token loss -> this micro-batch's scalar contribution.

Contract. `agg_loss` returns this micro-batch's CONTRIBUTION to the loss of the global
mini-batch: summing the returned values over all micro-batches of a mini-batch and over all
data-parallel ranks gives exactly the loss of the whole global mini-batch (as if aggregated in
one call), and so does the gradient. Hence the normalisers are GLOBAL counts over the whole
mini-batch, passed by the caller (`global_counts(mask)` on the mini-batch before it is split;
counts of shards add up, so ranks may also all-reduce their shards' counts with a sum). When a
global count is None, the local one is used: right for a single micro-batch on a single rank.

Consequences for the caller:
- Accumulate gradients over micro-batches by plain `backward()` on each contribution, with no
  division by the number of micro-batches.
- Data-parallel gradient reduction must SUM over ranks. FSDP / DDP average instead, so either
  multiply each contribution by the data-parallel world size or set the reduction to sum.

Definitions (the same everywhere, including `global_counts`):
- a token counts when its mask is non-zero: global_num_tokens = #(mask != 0).
- a sequence counts when it has at least one valid token: global_num_seqs = #(rows with a
  valid token). All-padding rows (e.g. rows added to pad a batch to a divisor of the world size)
  contribute 0 to every mode and do not dilute the mean.
- modes:
    token-mean:               sum_{i,t} m l / global_num_tokens
    seq-mean-token-sum:       sum_i (sum_t m l) / global_num_seqs
    seq-mean-token-mean:      sum_i (sum_t m l / n_i) / global_num_seqs   (n_i = valid tokens of row i)
    seq-mean-token-sum-norm:  sum_i (sum_t m l) / (global_num_seqs * norm_length)   (Dr. GRPO)
  norm_length defaults to loss_mat.shape[-1]; pass the configured max response length when
  micro-batches may be padded to different lengths, or the contract breaks.
Each mode's spec (tandem/algo_options.py) names the counts it divides by; `agg_loss` passes it those.
A zero count (an all-padding batch) gives a loss of 0, not NaN; inf / NaN losses at padding are
ignored (value and gradient). A float16 / bfloat16 loss is summed and returned in float32.
"""

from __future__ import annotations

from torch import Tensor

from tandem.algos.core import upcast, zero_padding
from tandem.algos.registry import AGG_MODES

Count = int | float | Tensor | None


def global_counts(mask: Tensor) -> dict[str, int]:
    """{global_num_tokens: #(m != 0), global_num_seqs: #(rows with a valid token)} of a mini-batch."""
    valid = mask != 0
    return {
        "global_num_tokens": int(valid.sum().item()),
        "global_num_seqs": int(valid.any(dim=-1).sum().item()),
    }


def _count(given: Count, local: Tensor) -> Tensor | float:
    value = local if given is None else given
    if isinstance(value, Tensor):
        return value.clamp(min=1)
    return max(float(value), 1.0)


def _masked(loss_mat: Tensor, mask: Tensor) -> Tensor:
    return zero_padding(loss_mat * mask.to(loss_mat.dtype), mask)


@AGG_MODES.register("token-mean")
def token_mean(loss_mat: Tensor, mask: Tensor, *, global_num_tokens: Count = None) -> Tensor:
    """sum_{i,t} m l / global_num_tokens."""
    return _masked(loss_mat, mask).sum() / _count(global_num_tokens, (mask != 0).sum())


@AGG_MODES.register("seq-mean-token-sum")
def seq_mean_token_sum(loss_mat: Tensor, mask: Tensor, *, global_num_seqs: Count = None) -> Tensor:
    """sum_i (sum_t m l) / global_num_seqs."""
    return _masked(loss_mat, mask).sum() / _count(global_num_seqs, (mask != 0).any(dim=-1).sum())


@AGG_MODES.register("seq-mean-token-mean")
def seq_mean_token_mean(loss_mat: Tensor, mask: Tensor, *, global_num_seqs: Count = None) -> Tensor:
    """sum_i (sum_t m l / n_i) / global_num_seqs; rows with n_i = 0 contribute 0."""
    n_tokens = (mask != 0).sum(dim=-1).clamp(min=1).to(loss_mat.dtype)
    per_seq = _masked(loss_mat, mask).sum(dim=-1) / n_tokens
    return per_seq.sum() / _count(global_num_seqs, (mask != 0).any(dim=-1).sum())


@AGG_MODES.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(
    loss_mat: Tensor,
    mask: Tensor,
    *,
    global_num_seqs: Count = None,
    norm_length: int | None = None,
) -> Tensor:
    """sum_i (sum_t m l) / (global_num_seqs * norm_length), norm_length = max response length (Dr. GRPO)."""
    length = loss_mat.shape[-1] if norm_length is None else norm_length
    if length <= 0:
        raise ValueError(f"norm_length must be positive, got {length}")
    num_seqs = _count(global_num_seqs, (mask != 0).any(dim=-1).sum())
    return _masked(loss_mat, mask).sum() / (num_seqs * float(length))


def agg_loss(
    loss_mat: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    *,
    global_num_tokens: Count = None,
    global_num_seqs: Count = None,
    norm_length: int | None = None,
) -> Tensor:
    """Aggregate a (B, T) per-token loss by `mode` (see the module docstring for each formula)."""
    if loss_mat.shape != mask.shape:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} differ in shape")
    entry = AGG_MODES.entry(mode)
    counts = {
        "global_num_tokens": global_num_tokens,
        "global_num_seqs": global_num_seqs,
        "norm_length": norm_length,
    }
    return entry.fn(upcast(loss_mat), mask, **{name: counts[name] for name in entry.spec.counts})
