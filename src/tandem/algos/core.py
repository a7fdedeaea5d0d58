"""Masked statistics, group statistics by id, and log-probs / entropy from logits.

Tensors are (B, T) over response tokens; `mask` is float or bool, 1 = real token, 0 = padding.
Every reduction treats an empty selection as 0 (never NaN), and whatever sits at padding
(inf, NaN: e.g. -inf log-probs of pad tokens) never reaches a result or a gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

GroupIndex = np.ndarray | Sequence | Tensor

# Rows of logits upcast to float32 at a time when the logits are bf16 / fp16.
LOGITS_CHUNK_ROWS = 1024


LOW_PRECISION = (torch.float16, torch.bfloat16)


def upcast(x: Tensor) -> Tensor:
    """x in float32 when it is float16 / bfloat16 (exp() of a log-ratio overflows fp16 at 11), else x."""
    return x.float() if x.dtype in LOW_PRECISION else x


def _as_float_mask(mask: Tensor, like: Tensor) -> Tensor:
    return mask.to(like.dtype if like.is_floating_point() else torch.float32)


def zero_padding(x: Tensor, mask: Tensor) -> Tensor:
    """x where mask != 0, else 0: where(), not multiply, since inf * 0 is NaN (and so is its gradient)."""
    return torch.where(mask != 0, x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum_i x_i * m_i (over `dim`, or over everything when dim is None)."""
    prod = zero_padding(x * _as_float_mask(mask, x), mask)
    return prod.sum() if dim is None else prod.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum_i x_i m_i / sum_i m_i; 0 where the mask selects nothing."""
    m = _as_float_mask(mask, x)
    count = m.sum() if dim is None else m.sum(dim=dim)
    return masked_sum(x, m, dim) / count.clamp(min=1e-8)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Var = sum m (x - mean)^2 / (n - 1) over the whole tensor (/ n when biased); 0 when n <= 1."""
    m = _as_float_mask(mask, x)
    mean = masked_mean(x, m)
    n = m.sum()
    sq = masked_sum((x - mean) ** 2, m)
    denom = n - 1 if unbiased else n
    return torch.where(n > 1, sq / denom.clamp(min=1e-8), torch.zeros_like(sq))


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(x - mean) / sqrt(var + eps) with batch-wide masked mean/var (unbiased); 0 at padding."""
    m = _as_float_mask(mask, x)
    mean = masked_mean(x, m)
    var = masked_var(x, m, unbiased=True)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return zero_padding(out * m, m)


def group_ids(index: GroupIndex, batch_size: int) -> tuple[Tensor, int]:
    """Map group ids (str / int, any order) to dense ids 0..G-1: np.unique(index, return_inverse)."""
    if isinstance(index, Tensor):
        arr = index.detach().cpu().numpy()
    else:
        arr = np.asarray(index)
    if arr.ndim != 1 or arr.shape[0] != batch_size:
        raise ValueError(
            f"`index` must hold one group id per sample: expected shape ({batch_size},), got {arr.shape}"
        )
    try:
        _, inverse = np.unique(arr, return_inverse=True)
    except TypeError as err:
        raise ValueError(f"`index` mixes id types that cannot be compared ({err}); use one type") from None
    inverse = torch.as_tensor(inverse.reshape(-1), dtype=torch.long)
    num_groups = int(inverse.max().item()) + 1 if batch_size else 0
    return inverse, num_groups


def group_min(values: Tensor, index: GroupIndex) -> Tensor:
    """Per-sample minimum of `values` over the sample's group: min_{j: g_j = g_i} v_j."""
    inverse, num_groups = group_ids(index, values.shape[0])
    inverse = inverse.to(values.device)
    out = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    return out.scatter_reduce(0, inverse, values, reduce="amin", include_self=False)[inverse]


def group_sum(values: Tensor, index: GroupIndex) -> Tensor:
    """Per-sample sum of `values` [B, ...] over the sample's group: s_i = sum_{j: g_j = g_i} v_j."""
    inverse, num_groups = group_ids(index, values.shape[0])
    inverse = inverse.to(values.device)
    total = torch.zeros(num_groups, *values.shape[1:], dtype=values.dtype, device=values.device)
    return total.index_add_(0, inverse, values)[inverse]


def group_stats(scores: Tensor, index: GroupIndex) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample (group mean, unbiased group std, group size); std = 0 for a group of one."""
    # Shift by the group minimum: a group of equal scores then has mean == score and std == 0 exactly.
    low = group_min(scores, index)
    shifted = scores - low
    count = group_sum(torch.ones_like(scores), index)
    mean_shifted = group_sum(shifted, index) / count
    sq = group_sum((shifted - mean_shifted) ** 2, index)
    var = torch.where(count > 1, sq / (count - 1).clamp(min=1), torch.zeros_like(sq))
    return low + mean_shifted, var.sqrt(), count


def _rowwise_float32(fn, logits: Tensor, *rest: Tensor, chunk_rows: int) -> Tensor:
    """Apply fn to chunks of rows upcast to float32, so only one chunk's float32 copy exists at once."""
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    flat_rest = [r.reshape(-1) for r in rest]
    outs = [
        fn(flat[i : i + chunk_rows].float(), *(r[i : i + chunk_rows] for r in flat_rest))
        for i in range(0, flat.shape[0], chunk_rows)
    ]
    return torch.cat(outs).reshape(logits.shape[:-1]) if outs else flat.new_zeros(logits.shape[:-1]).float()


def _gather_log_softmax(logits: Tensor, labels: Tensor) -> Tensor:
    return F.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def log_probs_from_logits(logits: Tensor, labels: Tensor, chunk_rows: int = LOGITS_CHUNK_ROWS) -> Tensor:
    """log pi(y) = log_softmax(z)[y] = z_y - logsumexp(z); (..., V), (...) -> (...)."""
    labels = labels.long()
    if logits.dtype in (torch.float32, torch.float64):
        # gather + logsumexp keeps no (..., V) log-softmax tensor around.
        picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)
    # bf16 / fp16: a log-softmax in low precision loses digits; upcast a chunk of rows at a time.
    return _rowwise_float32(_gather_log_softmax, logits, labels, chunk_rows=chunk_rows)


# exp(-1e4) is 0 in float32 and float64: flooring z there changes no value.
ENTROPY_LOGIT_FLOOR = -1e4


def _entropy_fp(logits: Tensor) -> Tensor:
    # Entropy is shift-invariant: subtract the max so that p * z never multiplies a huge z.
    z = logits - logits.amax(dim=-1, keepdim=True).detach()
    # Masked vocabulary entries (-inf logits) would give p * z = 0 * -inf = NaN; in place, no copy.
    z.clamp_(min=ENTROPY_LOGIT_FLOOR)
    return torch.logsumexp(z, dim=-1) - (F.softmax(z, dim=-1) * z).sum(dim=-1)


def entropy_from_logits(logits: Tensor, chunk_rows: int = LOGITS_CHUNK_ROWS) -> Tensor:
    """H = logsumexp(z) - sum softmax(z) * z, computed on z - max(z); (..., V) -> (...); -inf logits allowed."""
    if logits.dtype in (torch.float32, torch.float64):
        return _entropy_fp(logits)
    return _rowwise_float32(_entropy_fp, logits, chunk_rows=chunk_rows)


def _sum_pi_squared_fp(logits: Tensor) -> Tensor:
    return torch.exp(torch.logsumexp(2 * logits, dim=-1) - 2 * torch.logsumexp(logits, dim=-1))


def sum_pi_squared_from_logits(logits: Tensor, chunk_rows: int = LOGITS_CHUNK_ROWS) -> Tensor:
    """sum_v softmax(z)_v^2 = exp(logsumexp(2 z) - 2 logsumexp(z)); (..., V) -> (...); -inf logits allowed.

    The collision probability of the token distribution, which the optimal token baseline needs
    (algos/token_baseline.py): 1 - 2 pi(y) + sum_v pi_v^2 = ||e_y - pi||^2.
    """
    if logits.dtype in (torch.float32, torch.float64):
        return _sum_pi_squared_fp(logits)
    return _rowwise_float32(_sum_pi_squared_fp, logits, chunk_rows=chunk_rows)
