"""Log-probabilities and entropy from vocabulary-parallel logits, without gathering the vocabulary.

Under tensor parallelism rank r holds logits[..., r V/tp : (r+1) V/tp]. With m = max over all ranks
and S = sum over all ranks of exp(l - m):
  log p(y) = (l_y - m) - log S              (l_y lives on one rank; the others add 0)
  H        = log S - sum_v p_v (l_v - m)
Each sum is an all-reduce over the tensor-parallel group whose backward is the identity: every rank
computes the same loss from the reduced values, so each rank's gradient is its own slice's (megatron's
`reduce_from_tensor_model_parallel_region`). That holds only if what goes INTO a reduce is local: the
entropy is therefore log S - T / S with T = sum over all ranks of exp(l - m) (l - m), not a sum of
p_v (l_v - m) with p_v = exp(l_v - m) / S (S would carry other ranks' logits into the reduced terms and
their gradient would be lost).
"""

from __future__ import annotations

import torch.distributed as dist
from torch import Tensor


class VocabParallel:
    """The vocabulary-parallel counterparts of algos.core's log_probs_from_logits, entropy_from_logits, ..."""

    def __init__(self, group: dist.ProcessGroup, rank: int, size: int) -> None:
        self.group, self.rank, self.size = group, rank, size

    def _reduce(self, value: Tensor) -> Tensor:
        from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

        return reduce_from_tensor_model_parallel_region(value, group=self.group)

    def _shifted(self, logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(logits - global max, their exp, S = the global sum of that exp), in float32."""
        logits = logits.float()
        top = logits.detach().max(dim=-1).values
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=self.group)
        shifted = logits - top.unsqueeze(-1)
        exp = shifted.exp()
        return shifted, exp, self._reduce(exp.sum(-1))

    def log_probs(self, logits: Tensor, labels: Tensor) -> Tensor:
        """log p(labels) [M] from this rank's slice [M, V/tp] of the logits."""
        shifted, _, total = self._shifted(logits)
        width = shifted.shape[-1]
        local = labels - self.rank * width
        here = (local >= 0) & (local < width)
        picked = shifted.gather(-1, local.clamp(0, width - 1).unsqueeze(-1)).squeeze(-1)
        return self._reduce(picked * here) - total.log()

    def entropy(self, logits: Tensor) -> Tensor:
        """Entropy [M] of softmax(logits) from this rank's slice [M, V/tp]."""
        shifted, exp, total = self._shifted(logits)
        return total.log() - self._reduce((exp * shifted).sum(-1)) / total

    def sum_pi_squared(self, logits: Tensor) -> Tensor:
        """sum_v p_v^2 [M] = (sum over all ranks of exp(l - m)^2) / S^2, from this rank's slice [M, V/tp]."""
        _, exp, total = self._shifted(logits)
        return self._reduce(exp.square().sum(-1)) / total.square()
