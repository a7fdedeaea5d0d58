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

import functools
import logging
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from tandem.algos.core import ENTROPY_LOGIT_FLOOR

logger = logging.getLogger(__name__)

STATS = ("log_probs", "entropy", "sum_pi_squared")
AUTO_MIN_VOCAB = 32768  # "auto" chunks the head of vocabularies this large (real LLMs), not tiny test models
AUTO_CHUNK_LOGITS = 2**25  # "auto" on a CPU: about this many logits per chunk (128 MiB in float32)
# "auto" on CUDA: 4x more. Each chunk's matmuls read the whole head weight [V, H]: at 220 rows one bf16 matmul
# does about 220 FLOPs a byte of W read, under the ~300 an H100 / H200 needs to be compute-bound (989 TFLOP/s
# over 3.35-4.8 TB/s), so W's reads, not the FLOPs, would set the head's time; at 883 rows (Qwen) they do not.
# Its [chunk, V] buffers (0.25 GiB in bf16) are small on a GPU. Not yet timed on a GPU (issue 33).
AUTO_CHUNK_LOGITS_CUDA = 2**27


def chunk_tokens(
    setting: int | str | None, vocab_size: int, device: torch.device | None = None
) -> int | None:
    """`fsdp.lm_head_chunk_tokens` for a model with `vocab_size` entries on `device`: tokens per chunk, or None
    (full logits). "auto": None below AUTO_MIN_VOCAB, else AUTO_CHUNK_LOGITS / vocab_size tokens on a CPU (220
    for Qwen's 151 936; bench/lm_head.py measured 256 there: 1.5x faster updates with 1/8 of the memory) and
    AUTO_CHUNK_LOGITS_CUDA / vocab_size on CUDA (883)."""
    if setting == "auto":
        if vocab_size < AUTO_MIN_VOCAB:
            return None
        logits = AUTO_CHUNK_LOGITS_CUDA if device is not None and device.type == "cuda" else AUTO_CHUNK_LOGITS
        return max(1, logits // vocab_size)
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
    """The output embedding's weight [V, H] (and bias [V]) as the forward left them, the chunk size, and
    whether each chunk's arithmetic runs compiled (`actor.fsdp.lm_head_compile`)."""

    weight: Tensor
    bias: Tensor | None
    chunk: int
    compiled: bool = False

    def zero_term(self) -> Tensor:
        """0 x the head's parameters: added to a loss, it gives them a (zero) gradient on every rank even
        when a micro-batch picked no rows, so the ranks' gradient reductions stay the same."""
        term = self.weight.sum() * 0.0
        return term + self.bias.sum() * 0.0 if self.bias is not None else term


def _chunk_stats(
    logits: Tensor, labels: Tensor, scale: float, want: tuple[str, ...]
) -> tuple[Tensor, Tensor]:
    """One chunk's logits [rows, V] -> (logsumexp(z) [rows], [len(want), rows] of the numbers), z = logits / scale
    in float32. Shifted by each row's max z, as log_probs_from_logits and entropy_from_logits are (exp never
    overflows; the entropy's sum of p z multiplies no huge z); exp(z - max) is made once for all numbers."""
    z = logits.float() / scale
    top = z.amax(dim=-1, keepdim=True)
    z.sub_(top).clamp_(min=ENTROPY_LOGIT_FLOOR)  # the floor: entropy_from_logits' guard against -inf logits
    unnormed = z.exp()
    total = unnormed.sum(dim=-1)
    lse = total.log()  # of the shifted z
    out = []
    for name in want:
        if name == "log_probs":
            out.append(z.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse)
        elif name == "entropy":
            out.append(lse - (unnormed * z).sum(dim=-1) / total)
        else:
            out.append(unnormed.square().sum(dim=-1) / total.square())
    return lse + top.squeeze(-1), torch.stack(out)


def _chunk_grad(
    logits: Tensor,
    labels: Tensor,
    lse: Tensor,
    values: Tensor,
    upstream: Tensor,
    scale: float,
    want: tuple[str, ...],
    compiled: bool,
) -> Tensor:
    """d(sum_k upstream_k . number_k) / d logits for one chunk, in the logits' dtype, from the closed forms
    (p = softmax(z), z = logits / scale, g the upstream gradient of each number):
      d log p_y / dz = onehot(y) - p;   d H / dz = -p (log p + H);   d sum p^2 / dz = 2 p (p - sum p^2).
    `values` and `upstream`: [len(want), rows], the forward's numbers and their gradients."""
    value = {name: v.unsqueeze(-1) for name, v in zip(want, values)}
    grad_of = {name: g.unsqueeze(-1) for name, g in zip(want, upstream.float())}
    # in place on fresh tensors: eagerly one [rows, V] float32 buffer (and p) instead of a temporary a term
    grad = (logits.float() / scale).sub_(lse.unsqueeze(-1))  # log p, which becomes the gradient
    p = grad.exp()
    if "entropy" in want:
        grad.add_(value["entropy"]).mul_(-grad_of["entropy"])
    else:
        grad.zero_()
    if "log_probs" in want:
        grad.sub_(grad_of["log_probs"])
    if "sum_pi_squared" in want:
        grad.add_((p - value["sum_pi_squared"]).mul_(2 * grad_of["sum_pi_squared"]))
    grad.mul_(p)
    del p  # eagerly: freed before the cast below makes the low-precision copy
    if "log_probs" in want:
        if compiled:  # a compare fuses into the one kernel inductor makes of this function
            hit = torch.arange(logits.shape[-1], device=logits.device) == labels.unsqueeze(-1)
            grad = grad + torch.where(hit, grad_of["log_probs"], 0.0)
        else:  # eagerly: touch one entry a row, not all of them
            grad.scatter_add_(1, labels.unsqueeze(-1), grad_of["log_probs"])
    return grad.div_(scale).to(logits.dtype)


@functools.cache
def _compiled(fn):
    """`fn` compiled with inductor (one per process): on CUDA each chunk's float32 arithmetic becomes a
    kernel or two that read the matmul's low-precision logits and write only the per-row numbers (forward)
    or the low-precision gradient (backward), instead of eager's dozen [rows, V] float32 passes."""
    return torch.compile(fn, fullgraph=True)


def compile_wanted(setting: bool | str, device: torch.device, vocab_size: int) -> bool:
    """`fsdp.lm_head_compile`: true, false, or auto: on CUDA; on a CPU for a real vocabulary (>= AUTO_MIN_VOCAB,
    the ones `auto` chunks) where a C++ compiler is found, which inductor needs there. bench/lm_head.py: 2.5x
    faster updates in bf16 there. A tiny model whose head is chunked by hand (the tests) stays eager: its
    start-up would pay a compile of several seconds for a head that takes milliseconds."""
    if setting != "auto":
        return bool(setting)
    if device.type == "cuda":
        return True
    compiler = os.environ.get("CXX") or next(filter(shutil.which, ("g++", "c++", "clang++")), None)
    return device.type == "cpu" and vocab_size >= AUTO_MIN_VOCAB and compiler is not None


def compile_head(
    setting: bool | str, chunk: int, vocab_size: int, dtype: torch.dtype, device: torch.device
) -> float | None:
    """`fsdp.lm_head_compile` for a chunked head: None when it is off; else the chunk functions compiled now
    (`warm_up_compiled`), logged, and the seconds that took. Under auto a compile that fails (no Triton, no C++
    compiler) is a warning and the head runs eager (None); under true it is an error naming the key."""
    if not compile_wanted(setting, device, vocab_size):
        return None
    start = time.perf_counter()
    try:
        warm_up_compiled(chunk, vocab_size, dtype, device)
    except Exception as error:  # inductor's failures have no common type
        if setting != "auto":
            raise RuntimeError(
                f"actor.fsdp.lm_head_compile=true: torch.compile of the LM head's chunk arithmetic failed on "
                f"{device.type} ({type(error).__name__}: {error}); set actor.fsdp.lm_head_compile=false"
            ) from error
        logger.warning(
            "actor.fsdp.lm_head_compile=auto: torch.compile of the LM head's chunk arithmetic failed on %s "
            "(%s: %s); the head runs eager",
            device.type,
            type(error).__name__,
            error,
        )
        return None
    seconds = time.perf_counter() - start
    logger.info(
        "fsdp.lm_head_compile: the LM head's chunk arithmetic compiled in %.1f s (%d-token chunks, vocabulary %d)",
        seconds,
        chunk,
        vocab_size,
    )
    return seconds


def warm_up_compiled(chunk: int, vocab_size: int, dtype: torch.dtype, device: torch.device) -> None:
    """Compile the chunk functions now, for logits of `dtype` on `device`, so that no step's time holds the
    compile: a chunk of `chunk` rows, then one of another size and temperature (torch then compiles them
    once more with both dynamic, as every later chunk needs), then one of a single row (sizes 0 and 1 are
    never dynamic in torch.compile); the forward's numbers and the backward's gradient each."""
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for rows, scale in ((chunk, 1.0), (chunk + 1, 0.5), (1, 1.0)):
            logits = torch.randn(rows, vocab_size, generator=gen, device=device).to(dtype)
            labels = torch.randint(0, vocab_size, (rows,), generator=gen, device=device)
            lse, values = _compiled(_chunk_stats)(logits, labels, scale, STATS)
            _compiled(_chunk_grad)(logits, labels, lse, values, torch.ones_like(values), scale, STATS, True)


def _row_spans(rows: int, chunk: int) -> list[slice]:
    """`chunk` rows at a time; a last span of one row joins the one before it: a compiled chunk function
    would compile once more for a single row (sizes 0 and 1 are never dynamic in torch.compile)."""
    starts = list(range(0, rows, chunk))
    if len(starts) > 1 and rows - starts[-1] == 1:
        starts.pop()
    return [slice(start, end) for start, end in zip(starts, [*starts[1:], rows])]


@functools.cache
def _matmul_adds_into_float32(device_type: str) -> bool:
    """Whether a bf16 matmul can add into a float32 tensor in the matmul itself here (`torch.addmm`'s out_dtype,
    cuBLAS's float32 epilogue; CUDA only in torch 2.13): probed once on small tensors, False where it fails."""
    if device_type != "cuda":
        return False
    try:
        total = torch.ones(4, 4, device=device_type)
        a, b = torch.randn(4, 8, device=device_type), torch.randn(8, 4, device=device_type)
        torch.addmm(total, a.bfloat16(), b.bfloat16(), out_dtype=torch.float32, out=total)
        return bool(torch.allclose(total, 1 + a.bfloat16().float() @ b.bfloat16().float(), atol=1e-3))
    except (RuntimeError, TypeError, NotImplementedError):
        return False


class _FusedHeadStats(torch.autograd.Function):
    """The per-token numbers of softmax(W h + b) / scale, a chunk of rows at a time, with a backward of its own.

    Forward makes each chunk's logits, reduces them and drops them, keeping only logsumexp per row. Backward
    makes a chunk's logits once more and turns them into the gradient with respect to the logits from the
    closed forms (`_chunk_grad`), then multiplies it into the hidden states' and the head's gradients.
    Against autograd through a checkpoint (what this replaced), at most one [chunk, V] float32 buffer and
    its temporaries are live at a time, and none with `compiled` (the chunk functions under torch.compile:
    the arithmetic runs fused, reading the logits once or twice). Compiled, every number is computed (the
    fused kernel reads the same logits; one graph instead of one per choice of numbers) and the unasked ones
    are dropped, their upstream gradients taken as zero."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, scale, chunk, want, compiled):
        rows = hidden.shape[0]
        computed = STATS if compiled else want
        stats = _compiled(_chunk_stats) if compiled else _chunk_stats
        out = hidden.new_empty((len(computed), rows), dtype=torch.float32)
        lse = hidden.new_empty(rows, dtype=torch.float32)
        for part in _row_spans(rows, chunk):
            lse[part], out[:, part] = stats(
                F.linear(hidden[part], weight, bias), labels[part], scale, computed
            )
        ctx.save_for_backward(hidden, weight, bias, labels, lse, out)
        ctx.scale, ctx.chunk, ctx.want, ctx.computed, ctx.compiled = scale, chunk, want, computed, compiled
        return out[[computed.index(name) for name in want]]

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, labels, lse, values = ctx.saved_tensors
        upstream = grad_out.new_zeros(values.shape)
        upstream[[ctx.computed.index(name) for name in ctx.want]] = grad_out
        grad_of_logits = _compiled(_chunk_grad) if ctx.compiled else _chunk_grad
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        # The head's weight gradient summed over the chunks: a bf16 running sum rounds at every chunk (64 chunks:
        # twice the error of one bf16 matmul over all rows). On CUDA the matmul adds into a float32 sum itself;
        # on a CPU the sum stays in the weight's dtype (a float32 sum there cost 40 % more head time in bf16).
        sum_dtype = torch.float32 if _matmul_adds_into_float32(weight.device.type) else weight.dtype
        grad_weight = torch.zeros_like(weight, dtype=sum_dtype) if need_weight else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if bias is not None and need_bias else None
        for part in _row_spans(hidden.shape[0], ctx.chunk):
            h = hidden[part]
            grad = grad_of_logits(
                F.linear(h, weight, bias),
                labels[part],
                lse[part],
                values[:, part].contiguous(),  # [3, rows]: as laid out as the compiled function saw them
                upstream[:, part].contiguous(),
                ctx.scale,
                ctx.computed,
                ctx.compiled,
            )  # in the logits' dtype, the weight's
            if grad_hidden is not None:
                grad_hidden[part] = grad @ weight
            if grad_weight is not None and grad_weight.dtype != weight.dtype:
                torch.addmm(grad_weight, grad.T, h, out_dtype=torch.float32, out=grad_weight)
            elif grad_weight is not None:
                grad_weight.addmm_(grad.T, h)
            if grad_bias is not None:
                grad_bias += grad.sum(0, dtype=torch.float32)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None


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
            self.hidden, head.weight, head.bias, labels.long(), self.scale, head.chunk, want, head.compiled
        )
        return dict(zip(want, stacked))
