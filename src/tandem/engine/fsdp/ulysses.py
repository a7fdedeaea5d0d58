"""Ulysses sequence parallelism for the FSDP2 engine (`actor.fsdp.sequence_parallel = k`).

The k ranks of a sequence-parallel group receive the same micro-batches (the engine's `dispatch_info`
gives them one data-parallel share) and each runs the model on 1/k of every row's columns: the
embeddings, MLPs, norms and, with the plain head, the LM head see only the local tokens, so activations
shrink k-fold. Attention needs the whole sequence: before it, an all-to-all trades the local columns of
all heads for all columns of H/k heads; each rank attends over the full rows for its heads; a second
all-to-all trades back. The ranks of a group all exchange with each other, twice per layer, a tensor
the size of the layer's q, k, v and output (DeepSpeed-Ulysses, arXiv:2309.14509; verl's
`ulysses_sequence_parallel_size`).

Plugged in as a transformers attention function (`AttentionInterface`, name ULYSSES): no transformers
class is patched. The engine passes the full rows' attention mask as a 4D boolean tensor (transformers
hands a 4D mask to the attention function unchanged) and the group as the `tandem_sp` keyword, which
transformers forwards to every attention call, activation-checkpoint recomputation included. The mask
comes from the full rows: a key is visible to a query of the same segment (position ids restarting at
0 start a new one: packed sequences), at or before it, and real (attention mask 1); every query sees at
least itself, so padding gives finite numbers that nothing reads.

The model's outputs (logits, values, or the last hidden states for the chunked LM head) are gathered
over the group, so every rank of a group holds the full micro-batch's outputs and the roles run
unchanged: each rank computes the same loss. In backward the gather hands each rank the gradient of
its own columns only, so a rank's parameter gradients are its tokens' share and the group's sum is the
whole; the engine scales the loss by the world size to undo FSDP's average over all ranks. The chunked
head is applied to the gathered hidden states on every rank of the group: its gradient is scaled by
1/k there (`scale_grad`), so the group's sum counts it once.

GQA: the query heads must divide by k; key/value heads that do not are repeated up to k first (k a
multiple of them), anything else is refused at start-up. Inside a rank, attention is torch's sdpa with
the boolean mask: O(width^2) mask memory per row (a variable-length flash kernel would avoid it; not
built). Sliding-window layers apply their window to the mask; soft-capped attention is refused.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.distributed.device_mesh import init_device_mesh
from transformers import AttentionInterface

from tandem.config.schema import FSDPConfig

logger = logging.getLogger(__name__)

ULYSSES = "tandem_ulysses"  # the attention implementation name the engine loads models with


@dataclass(frozen=True)
class SequenceParallel:
    """One rank's sequence-parallel group: `size` ranks, this one at `rank` (its columns' slot)."""

    group: Any  # torch.distributed ProcessGroup
    size: int
    rank: int

    def local(self, tensor: Tensor) -> Tensor:
        """This rank's columns of `tensor` [rows, width, ...] (width a multiple of size)."""
        return tensor.chunk(self.size, dim=1)[self.rank]


def sequence_parallel_groups(
    fsdp: FSDPConfig, device: torch.device, world_size: int
) -> tuple[SequenceParallel | None, Any]:
    """(this rank's sequence-parallel group, its data-parallel group) for fsdp.sequence_parallel = k: a
    (dp, sp) mesh, ranks dp_rank * k .. dp_rank * k + k - 1 splitting each row. (None, None) for k = 1:
    plain data parallel over the whole world."""
    size = fsdp.sequence_parallel
    if size < 1 or world_size % size:
        raise ValueError(
            f"actor.fsdp.sequence_parallel={size} must be >= 1 and divide the world size {world_size}"
        )
    if size == 1:
        return None, None
    # auto compiles nothing under sequence parallel (build.compile_layers_wanted); true is refused
    if fsdp.torch_compile is True:
        raise ValueError(
            "actor.fsdp.torch_compile=true with actor.fsdp.sequence_parallel > 1 is not supported (the "
            "attention's all-to-all inside compiled layers is untested); turn one of them off"
        )
    mesh = init_device_mesh(device.type, (world_size // size, size), mesh_dim_names=("dp", "sp"))
    sp = SequenceParallel(mesh["sp"].get_group(), size, mesh["sp"].get_local_rank())
    return sp, mesh["dp"].get_group()


def sp_attention(fsdp: FSDPConfig, resolved: str) -> str:
    """The attention implementation to load models with under sequence parallel (ULYSSES, sdpa on each
    rank's heads); a forced kernel other than sdpa is refused."""
    if fsdp.attn_implementation not in ("auto", "sdpa"):
        raise ValueError(
            f"actor.fsdp.attn_implementation={fsdp.attn_implementation} with actor.fsdp.sequence_parallel="
            f"{fsdp.sequence_parallel}: sequence-parallel attention runs sdpa on each rank's heads; set "
            "attn_implementation=auto or sdpa"
        )
    if resolved != "sdpa":
        logger.info(
            "actor.fsdp.sequence_parallel: attention runs as sdpa over each rank's heads, not %s", resolved
        )
    return ULYSSES


def check_heads(config: Any, size: int, key: str = "actor.fsdp.sequence_parallel") -> None:
    """Refuse a model whose attention heads cannot be split `size` ways, naming the numbers and `key`."""
    config = config.get_text_config()  # a vision-language config keeps them in its text part
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if heads % size:
        raise ValueError(
            f"{key}={size}: the model's num_attention_heads={heads} is not a multiple of {size}; each rank "
            f"attends with heads / {size} heads. Use a sequence_parallel that divides {heads}"
        )
    if kv_heads % size and size % kv_heads:
        raise ValueError(
            f"{key}={size}: num_key_value_heads={kv_heads} neither divides by {size} nor divides it (then "
            f"each rank would get a whole, repeated key/value head); use a sequence_parallel that divides "
            f"{kv_heads} or is a multiple of it"
        )


def full_mask(position_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
    """[rows, 1, W, W] bool: which keys each query of the full rows sees (see the module docstring)."""
    width = position_ids.shape[1]
    segment = (position_ids == 0).long().cumsum(-1)
    column = torch.arange(width, device=position_ids.device)
    causal = column[None, :] <= column[:, None]  # [q, k]
    visible = (segment[:, :, None] == segment[:, None, :]) & causal
    if attention_mask is not None:
        visible &= attention_mask.bool()[:, None, :]
    visible |= torch.eye(width, dtype=torch.bool, device=position_ids.device)
    return visible[:, None]


def pad_columns(tensor: Tensor, size: int, fill: int) -> Tensor:
    """`tensor` [rows, W] with columns of `fill` appended up to a multiple of `size`."""
    extra = -tensor.shape[1] % size
    return F.pad(tensor, (0, extra), value=fill) if extra else tensor


def sp_forward(
    model: torch.nn.Module, inputs: dict[str, Tensor], *, sp: SequenceParallel, pad_id: int
) -> Tensor:
    """`model`'s outputs [rows, W, ...] ("logits") for full rows `inputs` (input_ids, and position_ids /
    attention_mask when given), each rank of the group running 1/k of the columns; gathered over the group."""
    ids = inputs["input_ids"]
    width = ids.shape[1]
    positions = inputs.get("position_ids")
    if positions is None:
        positions = torch.arange(width, device=ids.device).expand_as(ids)
    real = inputs.get("attention_mask")
    # Columns appended up to a multiple of k: pad tokens at position 0 (each its own segment), not real.
    positions = pad_columns(positions, sp.size, 0)
    real = pad_columns(real if real is not None else torch.ones_like(ids), sp.size, 0)
    local = model(
        input_ids=sp.local(pad_columns(ids, sp.size, pad_id)),
        position_ids=sp.local(positions),
        attention_mask=full_mask(positions, real),
        use_cache=False,
        tandem_sp=sp,
    ).logits
    return gather_columns(local, sp)[:, :width]


class _AllToAll(torch.autograd.Function):
    """Split `x` along `scatter_dim` over the group, gather the received pieces along `gather_dim`."""

    @staticmethod
    def forward(ctx, x: Tensor, sp: SequenceParallel, scatter_dim: int, gather_dim: int) -> Tensor:
        ctx.sp, ctx.dims = sp, (scatter_dim, gather_dim)
        sent = torch.stack(x.chunk(sp.size, dim=scatter_dim)).contiguous()  # [size, ...]: piece j to rank j
        received = torch.empty_like(sent)
        dist.all_to_all_single(received, sent, group=sp.group)
        return torch.cat(received.unbind(0), dim=gather_dim)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:
        scatter_dim, gather_dim = ctx.dims
        return _AllToAll.apply(grad, ctx.sp, gather_dim, scatter_dim), None, None, None


class _GatherColumns(torch.autograd.Function):
    """Every rank's columns of `x` [rows, W/size, ...] concatenated; backward keeps the local columns'
    gradient only (each rank computes the same loss from the gathered tensor)."""

    @staticmethod
    def forward(ctx, x: Tensor, sp: SequenceParallel) -> Tensor:
        ctx.sp = sp
        parts = [torch.empty_like(x) for _ in range(sp.size)]
        dist.all_gather(parts, x.contiguous(), group=sp.group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return ctx.sp.local(grad).contiguous(), None


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, scale: float) -> Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return grad * ctx.scale, None


def gather_columns(x: Tensor, sp: SequenceParallel) -> Tensor:
    return _GatherColumns.apply(x, sp)


def scale_grad(x: Tensor | None, scale: float) -> Tensor | None:
    """`x` unchanged, its gradient times `scale`."""
    return None if x is None else _ScaleGrad.apply(x, scale)


def ulysses_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    tandem_sp: SequenceParallel | None = None,
    **_: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-function contract: q [b, H, S/k, D], k / v [b, Hkv, S/k, D] of the local
    columns, the full rows' 4D boolean mask; returns the output [b, S/k, H, D] of the local columns."""
    if tandem_sp is None or attention_mask is None or attention_mask.dtype != torch.bool:
        raise RuntimeError(
            f"attention {ULYSSES!r} runs only inside the FSDP2 engine with fsdp.sequence_parallel > 1 "
            "(it passes the group and the full rows' boolean mask)"
        )
    if softcap is not None:
        raise NotImplementedError(
            f"{type(module).__name__} soft-caps its attention scores: not supported with sequence parallel; "
            "set actor.fsdp.sequence_parallel=1"
        )
    sp = tandem_sp
    if key.shape[1] % sp.size:  # fewer key/value heads than ranks: repeat each up to one per rank
        repeat = sp.size // key.shape[1]
        key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
    # all columns of H/k heads (and of Hkv/k key/value heads)
    query, key, value = (_AllToAll.apply(t, sp, 1, 2) for t in (query, key, value))
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    mask = attention_mask
    if sliding_window is not None:
        column = torch.arange(mask.shape[-1], device=mask.device)
        mask = mask & ((column[:, None] - column[None, :]) < sliding_window)
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling
    )  # [b, H/k, S, D]
    # back to the local columns of all heads: [b, S/k, H, D]
    return _AllToAll.apply(out.transpose(1, 2), sp, 1, 2), None


AttentionInterface.register(ULYSSES, ulysses_attention)
