"""The LM head a chunk of tokens at a time, from the hidden states (`actor.fsdp.lm_head_chunk_tokens`).

A causal LM's last layer turns each position's hidden state h [H] into logits z = W h (+ b) [V]. The
roles need, per response token, log softmax(z / T)[y], and sometimes the entropy or sum_v pi_v^2 of
softmax(z / T). The plain path makes z for every position of a micro-batch, prompt included, and the
roles upcast the response rows to float32: with a real vocabulary (150 k) that [tokens, V] tensor, and
its gradient in backward, is a step's memory peak.

Chunked, the model stops at h (its output embedding hands back its input during that forward: see
`hidden_states_out`), the roles pick the rows they need (`ModelOutput.at`), and `HeadRows` makes z for
`chunk` rows at a time, reduces each chunk to the per-token numbers and drops it. In training, backward
makes a chunk's z again instead of keeping it and forms its gradient in place from closed forms
(`_FusedHeadStats`), so the update pays one more head matmul per response token and holds at most one
chunk's [chunk, V] float32 at a time. The numbers are the plain path's up to float32 rounding (the
matmul's blocking differs with its shape); tests compare both, values and gradients.

Only for models whose logits are exactly `output_embeddings(h)`: the engine checks that on a probe at
start-up and keeps the plain path, with a warning, for any model that post-processes its logits
(soft-capping, a logit scale).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from tandem.algos.core import entropy_from_logits, sum_pi_squared_from_logits

STATS = ("log_probs", "entropy", "sum_pi_squared")
AUTO_MIN_VOCAB = 32768  # "auto" chunks the head of vocabularies this large (real LLMs), not tiny test models
AUTO_CHUNK_LOGITS = 2**25  # "auto": about this many logits per chunk (128 MiB in float32)


def chunk_tokens(setting: int | str | None, vocab_size: int) -> int | None:
    """`fsdp.lm_head_chunk_tokens` for a model with `vocab_size` entries: tokens per chunk, or None (full
    logits). "auto": None below AUTO_MIN_VOCAB, else AUTO_CHUNK_LOGITS / vocab_size tokens (220 for
    Qwen's 151 936; bench/lm_head.py measured 256 there: 1.5x faster updates with 1/8 of the memory)."""
    if setting == "auto":
        return max(1, AUTO_CHUNK_LOGITS // vocab_size) if vocab_size >= AUTO_MIN_VOCAB else None
    return setting


def _passthrough(hidden: Tensor) -> Tensor:
    # transformers hands the head a view of the hidden states; a copy ([tokens, H], small next to the
    # logits) keeps FSDP's backward hook off a view (FSDP2 warns about views of its outputs).
    return hidden.clone()


@contextmanager
def hidden_states_out(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """While open, `model`'s output embedding returns its input, so the model's "logits" are its last
    hidden states (after the final norm). An instance attribute hides the class's forward; the module,
    its parameters and FSDP's hooks on the model stay as they are. Yields the output embedding."""
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embedding (get_output_embeddings() is None)")
    head.forward = _passthrough
    try:
        yield head
    finally:
        del head.forward


@dataclass
class ChunkedHead:
    """The output embedding's weight [V, H] (and bias [V]) as the forward left them, and the chunk size."""

    weight: Tensor
    bias: Tensor | None
    chunk: int

    def zero_term(self) -> Tensor:
        """0 x the head's parameters: added to a loss, it gives them a (zero) gradient on every rank even
        when a micro-batch picked no rows, so the ranks' gradient reductions stay the same."""
        term = self.weight.sum() * 0.0
        return term + self.bias.sum() * 0.0 if self.bias is not None else term


def _chunk_stats(logits: Tensor, lse: Tensor, labels: Tensor, want: tuple[str, ...]) -> Tensor:
    """[len(want), rows] of one chunk's float32 logits / scale and their logsumexp `lse`."""
    out = []
    for name in want:
        if name == "log_probs":  # log_probs_from_logits' own arithmetic, on the logsumexp made once
            out.append(logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse)
        elif name == "entropy":
            out.append(entropy_from_logits(logits))
        else:
            out.append(sum_pi_squared_from_logits(logits))
    return torch.stack(out)


class _FusedHeadStats(torch.autograd.Function):
    """The per-token numbers of softmax(W h + b) / scale, a chunk of rows at a time, with a backward of its own.

    Forward makes each chunk's logits, reduces them and drops them, keeping only logsumexp per row. Backward
    makes a chunk's logits once more and turns them in place into the gradient with respect to the logits,
    from the closed forms (p = softmax(z), z the logits / scale, g the upstream gradient of each number):
      d log p_y / dz = onehot(y) - p;   d H / dz = -p (log p + H);   d sum p^2 / dz = 2 p (p - sum p^2),
    then multiplies it into the hidden states' and the head's gradients. Against autograd through a
    checkpoint (what this replaced), one [chunk, V] float32 buffer is live in backward instead of the
    several autograd keeps (the float copy, the scaled logits, the softmax, the log-softmax), and the
    elementwise work is one pass over it."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, scale, chunk, want):
        rows = hidden.shape[0]
        out = hidden.new_empty((len(want), rows), dtype=torch.float32)
        lse = hidden.new_empty(rows, dtype=torch.float32)
        for start in range(0, rows, chunk):
            part = slice(start, start + chunk)
            logits = F.linear(hidden[part], weight, bias).float().div_(scale)
            lse[part] = torch.logsumexp(logits, dim=-1)
            out[:, part] = _chunk_stats(logits, lse[part], labels[part], want)
        ctx.save_for_backward(hidden, weight, bias, labels, lse, out)
        ctx.scale, ctx.chunk, ctx.want = scale, chunk, want
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, labels, lse, out = ctx.saved_tensors
        scale, want = ctx.scale, ctx.want
        upstream = dict(zip(want, grad_out.float()))
        value = dict(zip(want, out))
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros_like(weight) if need_weight else None
        grad_bias = torch.zeros_like(bias) if bias is not None and need_bias else None
        for start in range(0, hidden.shape[0], ctx.chunk):
            part = slice(start, start + ctx.chunk)
            h = hidden[part]
            # the chunk's log-softmax, which becomes d(numbers)/dz in place
            grad = F.linear(h, weight, bias).float().div_(scale).sub_(lse[part, None])
            p = grad.exp()
            if "entropy" in want:
                grad.add_(value["entropy"][part, None]).mul_(-upstream["entropy"][part, None])
            else:
                grad.zero_()
            if "log_probs" in want:
                grad.sub_(upstream["log_probs"][part, None])
            if "sum_pi_squared" in want:
                factor = 2 * upstream["sum_pi_squared"][part, None]
                grad.add_((p - value["sum_pi_squared"][part, None]).mul_(factor))
            grad.mul_(p)
            del p
            if "log_probs" in want:
                grad.scatter_add_(1, labels[part, None], upstream["log_probs"][part, None])
            grad = grad.div_(scale).to(weight.dtype)  # d(numbers) / d(W h + b)
            if grad_hidden is not None:
                grad_hidden[part] = grad @ weight
            if grad_weight is not None:
                grad_weight.addmm_(grad.T, h)
            if grad_bias is not None:
                grad_bias += grad.sum(0)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


@dataclass
class HeadRows:
    """Hidden states of some positions [M, H] standing in for their logits / `scale` [M, V]."""

    hidden: Tensor
    head: ChunkedHead
    scale: float  # the sampling temperature the logits are divided by

    def stats(
        self, labels: Tensor, *, entropy: bool = False, sum_pi_squared: bool = False
    ) -> dict[str, Tensor]:
        """log_probs of `labels` [M] (and the entropy, sum_v pi_v^2 when asked) of softmax(logits / scale),
        each [M] float32, computed `head.chunk` rows at a time."""
        want = tuple(n for n, on in zip(STATS, (True, entropy, sum_pi_squared)) if on)
        head = self.head
        stacked = _FusedHeadStats.apply(
            self.hidden, head.weight, head.bias, labels.long(), self.scale, head.chunk, want
        )
        return dict(zip(want, stacked))
