"""Low-rank adapters (LoRA) on the megatron engine: only the adapters train (`actor.lora` with
actor.strategy=megatron).

The adapters are PEFT's on the Hugging Face model, placed inside megatron's fused linears. The engine reads the
folder into a Hugging Face model on every rank anyway (build.py); PEFT is injected into that model with the FSDP2
engine's own call (engine/fsdp/lora.py `inject`: target_modules, exclude_modules, the seed, an adapter folder to
start from), so the adapters start bit-equal to the FSDP2 engine's. Each adapted Hugging Face linear (q_proj,
k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj) keeps its own A [r, in] and B [out, r], and the megatron
linear that holds its weight computes W x + (alpha / r) B A x for its rows:

  megatron linear   its Hugging Face linears   tensor parallel (exact: no term is computed twice or left out)
  linear_qkv        q_proj, k_proj, v_proj     column: A whole on every rank, B cut by rows as megatron cuts the
  linear_fc1        gate_proj, up_proj         weight (the rank's query groups / MLP columns). A x is the same
                                               on every rank; each rank's B makes its own output rows.
  linear_proj       o_proj                     row: A cut by columns as the weight is (each rank holds part of
  linear_fc2        down_proj                  the input), A x summed over the TP ranks; B whole on every rank.

The other way round (column: A cut; row: B cut) would need the input gathered (column) or leave each rank with
a part of the rank-r sum that the base output's reduction does not include; this way each side's communication
is one all-reduce of the r-wide A x (row: forward; column: its gradient, backward). Under sequence parallel a
column adapter gathers its input's sequence pieces (backward: the piece's own gradient) and a row adapter's
output is cut to the rank's piece of the sequence, as the base layer's reduce-scatter leaves it.

Where we differ from verl (megatron-bridge): verl's fused LoRA puts one A on linear_qkv (and one on linear_fc1),
shared by q, k and v. Here q, k and v each keep their own A, PEFT's layout on the Hugging Face model: a PEFT
folder written here loads in PEFT and in vLLM as the FSDP2 engine's does, one folder starts either engine
(actor.lora.adapter_path), and the rollout's adapter sync is the FSDP2 path's. verl's megatron names in
target_modules (linear_qkv, linear_proj, linear_fc1, linear_fc2) name those linears (config/lora_names.py).
A mixture-of-experts model's experts take no adapters: PEFT would adapt the Hugging Face model's fused [E, ...]
expert tensors, which this engine does not carry (FSDP2's merge does), so build.py refuses them by name
(engine/fsdp/lora.py `refuse_fused_adapters`); verl's megatron LoRA adapts every expert's linear_fc1 / linear_fc2.

The base weights are frozen (no gradient, no optimizer state: megatron's DDP and optimizer skip them); the
adapters are children of the attention / MLP module beside the linear they adapt (`linear_qkv_lora`, ...), so
megatron's distributed checkpoint saves and reloads them with the model (B / A cut along their TP axis, any
layout) and the optimizer's state with them. Weights out (weights.py) fold each adapter into its linear's TP shard
(`delta`), so the rollout and an export get the plain architecture's weights, as FSDP2's merged weights.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from tandem.engine.megatron import convert

ADAPTER = "default"  # PEFT's name for the one adapter
SUFFIX = "_lora"  # the adapters' module beside the linear they adapt: linear_qkv -> linear_qkv_lora
ADAPTED_KINDS = ("qkv", "fc1", "row")


class LinearAdapters(nn.Module):
    """The LoRA adapters of one megatron linear: one (A, B) per adapted Hugging Face linear among those whose
    weights the megatron linear holds (`hf_modules`, in the slot's order; each `parts[i]` says which).

    Column kinds (qkv, fc1): A [r, in] whole, B [rows of this TP rank, r]. Row kind: A [r, in / tp], B [out, r]."""

    def __init__(
        self,
        kind: convert.Kind,
        hf_modules: list[str],
        parts: list[int],
        lora_a: list[Tensor],
        lora_b: list[Tensor],
        rows: list[int],
        scale: float,
        shapes: convert.Shapes,
        tp_group: Any,
        tp_size: int,
        sequence_parallel: bool,
    ) -> None:
        super().__init__()
        from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

        self.kind = kind
        self.hf_modules = hf_modules
        self.parts = parts
        self.rows = rows  # each of the slot's Hugging Face tensors' rows on this rank (column kinds)
        self.scale = scale
        self.shapes = shapes  # this rank's attention geometry (qkv)
        self.tp_group, self.tp_size, self.sequence_parallel = tp_group, tp_size, sequence_parallel
        self.enabled = True
        self.lora_A = nn.ParameterList([nn.Parameter(a) for a in lora_a])
        self.lora_B = nn.ParameterList([nn.Parameter(b) for b in lora_b])
        # what megatron's gradient norm counts on every TP rank (the cut ones) or on TP rank 0 only (the rest)
        for param in self.lora_A if kind == "row" else self.lora_B:
            set_tensor_model_parallel_attributes(param, True, 1 if kind == "row" else 0, 1)

    def _fused_b(self) -> Tensor:
        """This rank's rows of the linear's output x the adapters' ranks: each B in its own columns, placed in
        the rows of its Hugging Face tensor as megatron lays them out (zeros where an adapter is absent)."""
        widths = [b.shape[1] for b in self.lora_B]
        blocks = []
        for i, rows in enumerate(self.rows):
            cols = [
                b if self.parts[j] == i else b.new_zeros(rows, widths[j]) for j, b in enumerate(self.lora_B)
            ]
            blocks.append(torch.cat(cols, dim=1))
        if self.kind == "qkv":
            return convert.fuse_qkv(*blocks, self.shapes)
        return torch.cat(blocks, dim=0)

    def forward(self, x: Tensor) -> Tensor:
        """The adapters' term of the linear's output for its input `x` [s(/tp), b, in(/tp)]."""
        from megatron.core import tensor_parallel as mtp

        if self.kind == "row":
            h = F.linear(x, self.lora_A[0])
            if self.tp_size > 1:
                h = mtp.reduce_from_tensor_model_parallel_region(h, group=self.tp_group)
            out = F.linear(h, self.lora_B[0]) * self.scale
            if self.sequence_parallel:
                out = mtp.scatter_to_sequence_parallel_region(out, group=self.tp_group)
            return out
        if self.sequence_parallel:
            x = mtp.gather_from_sequence_parallel_region(
                x, tensor_parallel_output_grad=False, group=self.tp_group
            )
        h = torch.cat([F.linear(x, a) for a in self.lora_A], dim=-1)
        if self.tp_size > 1:  # the gradient of A x summed over the ranks' output rows
            h = mtp.copy_to_tensor_model_parallel_region(h, group=self.tp_group)
        return F.linear(h, self._fused_b()) * self.scale

    @torch.no_grad()
    def delta(self) -> Tensor:
        """(alpha / r) B A as this rank's shard of the linear's weight (its layout and cut)."""
        if self.kind == "row":
            return self.scale * (self.lora_B[0] @ self.lora_A[0])
        return self.scale * (self._fused_b() @ torch.cat(list(self.lora_A), dim=0))

    def sharded_state_dict(
        self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None
    ) -> dict[str, Any]:
        """megatron's distributed-checkpoint entries: the cut tensors along their TP axis, the rest replicated."""
        from megatron.core.transformer.utils import (
            ensure_metadata_has_dp_cp_group,
            make_sharded_tensors_for_checkpoint,
        )

        metadata = ensure_metadata_has_dp_cp_group(metadata)
        cut, axis = ("lora_A", 1) if self.kind == "row" else ("lora_B", 0)
        axes = {f"{cut}.{i}": axis for i in range(len(self.parts))}
        return make_sharded_tensors_for_checkpoint(
            self.state_dict(prefix="", keep_vars=True),
            prefix,
            axes,
            sharded_offsets,
            tp_group=self.tp_group,
            dp_cp_group=metadata["dp_cp_group"],
        )


def _hook(adapters: LinearAdapters):
    def add(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        if not adapters.enabled:
            return None
        x = args[0] if args else kwargs["input_"]
        out, bias = output
        return out + adapters(x).to(out.dtype), bias

    return add


def attach(
    chunk: nn.Module,
    slots: list[convert.Slot],
    peft_model: nn.Module,
    hf_shapes: dict[str, tuple],
    shapes: convert.Shapes,
    tp_rank: int,
    tp_size: int,
    tp_group: Any,
    sequence_parallel: bool,
    dtype: torch.dtype,
) -> dict[str, LinearAdapters]:
    """Adapters on model `chunk`'s linears from the PEFT layers of `peft_model` (the Hugging Face model with
    PEFT injected: engine/fsdp/lora.py `inject`; `hf_shapes` its weights' shapes by their plain names), cut for
    TP rank `tp_rank`; every parameter of the chunk
    frozen but the adapters. Returns {the megatron weight's name: its adapters}.

    A PEFT layer whose weight this chunk holds in a linear megatron has no adapter for (the output layer, a
    router) is an error naming it."""
    from tandem.engine.fsdp.lora import lora_layers

    layers = lora_layers(peft_model)
    owner = {f"{name}.weight": name for name in layers}  # the Hugging Face weight -> its LoRA layer
    chunk.requires_grad_(False)
    local = convert.local_shapes(shapes, tp_size)
    found: dict[str, LinearAdapters] = {}
    for slot in slots:
        held = [owner.get(name) for name in slot.hf]
        if not any(held):
            continue
        if slot.kind not in ADAPTED_KINDS or slot.expert is not None or not slot.megatron.endswith(".weight"):
            raise ValueError(
                f"actor.lora.target_modules puts an adapter on {[n for n in held if n]}, which megatron holds in "
                f"{slot.megatron}: adapters are built on the attention and MLP projections only (q/k/v/o_proj, "
                "gate/up/down_proj; verl's linear_qkv, linear_proj, linear_fc1, linear_fc2); leave it out of "
                "target_modules or add it to actor.lora.exclude_modules"
            )
        parts, lora_a, lora_b, modules = [], [], [], []
        for i, name in enumerate(held):
            if name is None:
                continue
            layer = layers[name]
            a, b = layer.lora_A[ADAPTER].weight.detach(), layer.lora_B[ADAPTER].weight.detach()
            if slot.kind == "row":
                a = a.chunk(tp_size, dim=1)[tp_rank]
            else:
                b = b.chunk(tp_size, dim=0)[tp_rank]
            parts.append(i)
            modules.append(name)
            lora_a.append(a.to(dtype).clone())
            lora_b.append(b.to(dtype).clone())
            scale = float(layer.scaling[ADAPTER])
        rows = [hf_shapes[name][0] // tp_size for name in slot.hf]  # column kinds: each tensor's rows here
        device = chunk.get_parameter(slot.megatron).device
        adapters = LinearAdapters(
            slot.kind,
            modules,
            parts,
            lora_a,
            lora_b,
            rows,
            scale,
            local,
            tp_group,
            tp_size,
            sequence_parallel,
        ).to(device)
        path, leaf = slot.megatron.removesuffix(".weight").rsplit(".", 1)
        chunk.get_submodule(path).add_module(leaf + SUFFIX, adapters)
        chunk.get_submodule(f"{path}.{leaf}").register_forward_hook(_hook(adapters), with_kwargs=True)
        found[slot.megatron] = adapters
    return found


def adapter_state(
    adapters: list[dict[str, LinearAdapters]], tp_group: Any, tp_size: int, pp_group: Any, pp_size: int
) -> dict[str, Tensor]:
    """Every adapter, whole, under the names of a PEFT adapter file (`base_model.model.<module>.lora_A.weight`),
    on every rank: the TP cuts gathered, the pipeline stages' adapters exchanged (collective)."""
    state: dict[str, Tensor] = {}
    for chunk in adapters:
        for linear in chunk.values():
            for j, module in enumerate(linear.hf_modules):
                a, b = linear.lora_A[j].detach(), linear.lora_B[j].detach()
                if tp_size > 1:
                    a, b = (
                        (_gather(a, 1, tp_group, tp_size), b)
                        if linear.kind == "row"
                        else (a, _gather(b, 0, tp_group, tp_size))
                    )
                state[f"base_model.model.{module}.lora_A.weight"] = a.to("cpu", copy=True)
                state[f"base_model.model.{module}.lora_B.weight"] = b.to("cpu", copy=True)
    if pp_size > 1:
        stages: list[Any] = [None] * pp_size
        dist.all_gather_object(stages, state, group=pp_group)
        state = {name: t for stage in stages for name, t in stage.items()}
    return state


def _gather(tensor: Tensor, dim: int, group: Any, size: int) -> Tensor:
    parts = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


@contextmanager
def disabled(adapters: list[dict[str, LinearAdapters]]) -> Iterator[None]:
    """The base model's forward while open: every adapter's term left out."""
    every = [linear for chunk in adapters for linear in chunk.values()]
    for linear in every:
        linear.enabled = False
    try:
        yield
    finally:
        for linear in every:
            linear.enabled = True
