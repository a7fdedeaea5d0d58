"""Packed attention that computes only inside each sequence (`actor.fsdp.attn_implementation`).

A packed micro-batch (data/packing.py) lays several sequences back to back. transformers' sdpa keeps
them apart with a dense block-diagonal mask, so a row of width W computes all W^2 scores, not the
sum of n^2 over its sequences (issue 33 measured cuDNN attention at 22 % of a 1.5 B update's GPU time).
The kernels here are told where each sequence starts (`cu_seq_lens`, cumulative lengths, the names
transformers' flash-attention path already passes down the model) and compute sum n^2 only:

- `varlen`: torch's own flash kernel over ragged sequences (`torch.nn.attention.varlen.varlen_attn`);
  CUDA only, no extra package.
- `flex_attention`: torch's `flex_attention` with a document-causal block mask (blocks outside every
  sequence's causal triangle are skipped); compiled on CUDA. On the CPU it runs eager and has no
  backward (torch 2.13), so it serves forward-only engines there.
- `sdpa_split`: sdpa on each sequence in turn; any device, with gradients; a Python loop per layer.

Each is registered in transformers' attention and mask interfaces as "tandem_<name>". A forward with no
`cu_seq_lens_q` (padded micro-batches, the start-up probes' padded half) runs transformers' sdpa with the
mask transformers made; for a packed forward (no attention mask) that mask is None and not built.

`resolve` turns the setting into the kernel a model is built with: `auto` takes flash-attn's own varlen
kernel where the package is installed on CUDA, else `varlen` where its probe runs, else `flex_attention`,
else sdpa. The order is by expected speed, not timed at start-up: a timed race would make the choice, and so
the numbers, move between runs; bench/gpu.py times each of them. On the CPU `auto` keeps sdpa, today's path.
The two flash kernels take fp16 / bf16 only: a model computing in float32 on CUDA gets `flex_attention` (or
sdpa) from auto, and an error naming the key when one of them is asked for.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

logger = logging.getLogger(__name__)

KERNELS = ("varlen", "flex_attention", "sdpa_split")  # Tandem's packed kernels, as the config names them
PREFIX = "tandem_"  # their names in transformers' attention interface
VARLEN_KERNELS = ("flash_attention_2", *(PREFIX + name for name in KERNELS))  # one packed row, no mask
HALF_DTYPES = (torch.float16, torch.bfloat16)


def transformers_name(kernel: str) -> str:
    """The name a Tandem kernel is registered under in transformers (registering it if not yet done)."""
    _register()
    return PREFIX + kernel


def sequence_bounds(position_ids: Tensor) -> tuple[Tensor, int]:
    """Cumulative sequence lengths [n + 1] (int32) of packed `position_ids` [rows, width] read row after row,
    and the longest sequence: a sequence starts wherever the position is 0 (every packed row starts one)."""
    flat = position_ids.reshape(-1)
    starts = torch.nonzero(flat == 0).flatten()
    cu = torch.cat([starts, starts.new_tensor([flat.numel()])]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max()) if len(starts) else 0


def varlen_kwargs(position_ids: Tensor) -> dict[str, Tensor | int]:
    """The keyword arguments a packed forward passes the model (transformers' FlashAttentionKwargs)."""
    cu, longest = sequence_bounds(position_ids)
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}


def resolve(
    choice: str,
    device: torch.device,
    dtype: torch.dtype = torch.bfloat16,
    key: str = "actor.fsdp.attn_implementation",
) -> str:
    """transformers' attn_implementation for `choice` on `device`, for a model computing in `dtype` (see the
    module docstring for `auto`). A kernel asked for where it cannot run is an error naming `key` and what to
    set instead."""
    from transformers.utils import is_flash_attn_2_available

    cuda = device.type == "cuda"
    flash = cuda and is_flash_attn_2_available()
    half = dtype in HALF_DTYPES  # what the flash kernels take
    if choice == "auto":
        if not cuda:
            return "sdpa"
        if flash and half:
            return "flash_attention_2"
        for kernel in ("varlen", "flex_attention") if half else ("flex_attention",):
            if _runs(kernel, device):
                return transformers_name(kernel)
        return "sdpa"
    if choice in ("flash_attention_2", "varlen") and cuda and not half:
        raise ValueError(
            f"{key}={choice}: flash attention takes float16 / bfloat16 only and this model computes in {dtype} "
            f"(actor.fsdp.param_dtype); set {key}=flex_attention, sdpa_split or auto (which picks flex_attention "
            "there), or param_dtype=bfloat16"
        )
    if choice == "flash_attention_2" and not flash:
        raise ValueError(
            f"{key}=flash_attention_2 needs a CUDA device and the flash-attn package (device here: "
            f"{device.type}, flash-attn importable: {is_flash_attn_2_available()}); install flash-attn on a GPU "
            f"machine, or set {key}=varlen (CUDA, torch's own kernel) or sdpa"
        )
    if choice == "varlen" and not cuda:
        raise ValueError(
            f"{key}=varlen runs on CUDA only (torch's flash kernel; device here: {device.type}); set {key}="
            "sdpa_split or sdpa on the CPU"
        )
    if choice in KERNELS:
        if not _runs(choice, device):
            raise ValueError(f"{key}={choice}: its probe failed on {device} (see the log); set {key}=sdpa")
        return transformers_name(choice)
    return choice


def check_trainable(implementation: str, device: torch.device, key: str) -> None:
    """flex_attention has no backward on the CPU (torch 2.13): a trained engine there is an error."""
    if implementation == PREFIX + "flex_attention" and device.type == "cpu":
        raise ValueError(
            f"{key}=flex_attention trains on CUDA only (torch's flex_attention has no backward on the CPU); "
            f"set {key}=sdpa_split or sdpa"
        )


# ---------------------------------------------------------------------------- kernels
# Each takes q [B, H, S, D], k and v [B, Hkv, S, D], the bounds over the B * S positions read row after row,
# the longest sequence and the softmax scale, and returns [B, S, H, D] (transformers' attention output).


def _varlen(q: Tensor, k: Tensor, v: Tensor, cu: Tensor, longest: int, scale: float | None) -> Tensor:
    from torch.nn.attention.varlen import varlen_attn

    b, h, s, d = q.shape
    flat = [t.transpose(1, 2).reshape(b * s, t.shape[1], d) for t in (q, k, v)]
    accepted = _parameters(varlen_attn)
    # torch 2.9-2.11 name causality is_causal and take as many key / value heads as query heads; 2.12 on
    # take a window (-1, 0) and enable_gqa
    options: dict = {"window_size": (-1, 0)} if "window_size" in accepted else {"is_causal": True}
    if k.shape[1] != h:
        if "enable_gqa" in accepted:
            options["enable_gqa"] = True
        else:
            flat[1:] = [t.repeat_interleave(h // k.shape[1], dim=1) for t in flat[1:]]
    if scale is not None and "scale" in accepted:
        options["scale"] = scale
    elif scale is not None and abs(scale - d**-0.5) > 1e-6 * scale:
        raise ValueError(
            f"this torch's varlen_attn takes no scale; the model asks for {scale} (not 1/sqrt({d}))"
        )
    return varlen_attn(*flat, cu, cu, longest, longest, **options).view(b, s, h, d)


@functools.cache
def _parameters(function: Callable) -> frozenset[str]:
    return frozenset(inspect.signature(function).parameters)


def _one_row(t: Tensor) -> Tensor:
    """[B, H, S, D] -> [1, H, B * S, D]: the rows read one after the other."""
    b, h, s, d = t.shape
    return t if b == 1 else t.transpose(0, 1).reshape(1, h, b * s, d)


def _from_one_row(out: Tensor, b: int, s: int) -> Tensor:
    """[1, H, B * S, D] -> [B, S, H, D]."""
    h, d = out.shape[1], out.shape[3]
    return out.view(h, b, s, d).permute(1, 2, 0, 3)


class _LastBounds:
    """What a forward's layers share: every layer gets the same `cu` tensor, so the block mask and the
    bounds on the host are made once per forward (by the first layer) and kept until another `cu` comes.
    The cache holds that `cu` itself: a freed one's id and memory could be reused by the next forward's."""

    def __init__(self) -> None:
        self.cu: Tensor | None = None
        self.value: object = None

    def get(self, cu: Tensor, make: Callable[[], object]) -> object:
        if cu is not self.cu:
            self.cu, self.value = cu, make()
        return self.value


_block_masks = _LastBounds()
_host_bounds = _LastBounds()
_compiled_flex: Callable | None = None


def _document_mask(cu: Tensor, total: int):
    from torch.nn.attention.flex_attention import create_block_mask

    lengths = (cu[1:] - cu[:-1]).long()
    document = torch.repeat_interleave(
        torch.arange(len(lengths), device=cu.device), lengths, output_size=total
    )

    def causal_within_document(batch, head, q_index, kv_index):
        return (document[q_index] == document[kv_index]) & (q_index >= kv_index)

    # compiled on CUDA: uncompiled, the mask is made as one [total, total] boolean tensor first
    return create_block_mask(
        causal_within_document, None, None, total, total, device=cu.device, _compile=cu.is_cuda
    )


def _flex(q: Tensor, k: Tensor, v: Tensor, cu: Tensor, longest: int, scale: float | None) -> Tensor:
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    b, h, s, _ = q.shape
    mask = _block_masks.get(cu, lambda: _document_mask(cu, b * s))
    run = flex_attention
    if q.device.type == "cuda":  # eager flex materialises the scores; compiled it is a fused kernel
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention, dynamic=True)
        run = _compiled_flex
    out = run(_one_row(q), _one_row(k), _one_row(v), block_mask=mask, scale=scale, enable_gqa=k.shape[1] != h)
    return _from_one_row(out, b, s)


def _split(q: Tensor, k: Tensor, v: Tensor, cu: Tensor, longest: int, scale: float | None) -> Tensor:
    b, h, s, _ = q.shape
    bounds = _host_bounds.get(cu, cu.tolist)
    q, k, v = (_one_row(t) for t in (q, k, v))
    gqa = k.shape[1] != h
    parts = [
        F.scaled_dot_product_attention(
            q[:, :, a:e], k[:, :, a:e], v[:, :, a:e], is_causal=True, scale=scale, enable_gqa=gqa
        )
        for a, e in itertools.pairwise(bounds)
    ]
    return _from_one_row(torch.cat(parts, dim=2), b, s)


_KERNEL_FUNCTIONS = {"varlen": _varlen, "flex_attention": _flex, "sdpa_split": _split}


# ---------------------------------------------------------------------------- transformers' interfaces
def _attention_function(kernel: Callable) -> Callable:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attention(
        module: torch.nn.Module,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        sliding_window: int | None = None,
        cu_seq_lens_q: Tensor | None = None,
        max_length_q: int | None = None,
        **kwargs,
    ) -> tuple[Tensor, None]:
        if cu_seq_lens_q is None:
            return sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )
        unsupported = {
            "dropout": dropout,
            "sliding_window": sliding_window,
            **{name: kwargs.get(name) for name in ("softcap", "s_aux")},
        }
        given = [name for name, setting in unsupported.items() if setting]
        if given:
            raise ValueError(
                f"{type(module).__name__} asks for {', '.join(given)}, which Tandem's packed attention kernels "
                "do not do; set actor.fsdp.attn_implementation=sdpa for this model"
            )
        longest = max_length_q if max_length_q is not None else int((cu_seq_lens_q.diff()).max())
        return kernel(query, key, value, cu_seq_lens_q, longest, scaling), None

    return attention


def _packed_mask(*args, attention_mask: Tensor | None = None, **kwargs) -> Tensor | None:
    """sdpa's mask where the forward gave an attention mask (padded rows); none for a packed forward."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


_registered = False


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    for name, kernel in _KERNEL_FUNCTIONS.items():
        AttentionInterface.register(PREFIX + name, _attention_function(kernel))
        AttentionMaskInterface.register(PREFIX + name, _packed_mask)
    _registered = True


@functools.cache
def _runs(kernel: str, device: torch.device) -> bool:
    """Whether `kernel` runs on `device` and agrees with sdpa on two short sequences (forward and, on CUDA,
    backward). A failure is logged with its reason and the kernel is passed over. Once per process: the
    engines a worker builds (actor, reference, critic) share the answer."""
    generator = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    q, k, v = (torch.randn(1, 4, 24, 64, generator=generator).to(device, dtype) for _ in range(3))
    cu = torch.tensor([0, 10, 24], dtype=torch.int32, device=device)
    try:
        if device.type == "cuda":
            q.requires_grad_(True)
        out = _KERNEL_FUNCTIONS[kernel](q, k, v, cu, 14, None)
        expected = torch.cat(
            [
                F.scaled_dot_product_attention(q[:, :, a:e], k[:, :, a:e], v[:, :, a:e], is_causal=True)
                for a, e in ((0, 10), (10, 24))
            ],
            dim=2,
        ).transpose(1, 2)
        if q.requires_grad:
            out.float().sum().backward()
        difference = float((out.float() - expected.float()).abs().max())
        if difference > (2e-2 if dtype == torch.bfloat16 else 1e-5):
            logger.warning(
                "attention kernel %s is %.3g away from sdpa on %s: not used", kernel, difference, device
            )
            return False
        return True
    except Exception as error:
        logger.info(
            "attention kernel %s does not run on %s: %s: %s", kernel, device, type(error).__name__, error
        )
        return False
