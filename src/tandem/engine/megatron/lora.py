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
A mixture-of-experts model's experts (target_modules naming gate_proj / up_proj / down_proj, or verl's
linear_fc1 / linear_fc2): PEFT (0.21) adapts the Hugging Face model's fused expert tensors (gate_up_proj [E, 2F, H],
down_proj [E, H, F]) with one ParamWrapper each, A [E r, in] and B [out, r E]: expert e's update is
(alpha / r) B_e A_e with A_e = A's rows e r .. (e + 1) r and B_e = B's columns e, e + E, ... (PEFT's reshapes in
`get_delta_weight`; r is the layer's own rank, 2 x lora.rank on gate_up_proj, which PEFT converts from the two
projections it fuses, alpha doubled with it). That is one LoRA of rank r per expert, so each megatron local
expert's linear_fc1 / linear_fc2 gets its own (A_e, B_e) (`ExpertAdapters`): the same update, computed as the
dense adapters are, whole on its expert-parallel rank (experts are not cut by TP). Each expert adapter is reduced,
counted in the gradient norm and checkpointed as its expert's weight is (megatron's attributes on that weight);
`adapter_state` gathers the experts of every expert-parallel rank back into PEFT's fused A and B, so the folder
is the FSDP2 engine's. verl's megatron LoRA adapts each expert's linear_fc1 / linear_fc2 too (its own A per
linear, drawn per linear; here PEFT's draw of the fused A, so both engines start alike). A router's adapter
(target_modules=all-linear puts one on `mlp.gate`, PEFT's ParamWrapper over its weight) is refused by name:
megatron's router computes its logits inside its forward, where no hook reaches, and verl builds none there; so on
a mixture-of-experts model all-linear names the projections of megatron's four linears (`megatron_targets`), as
verl's megatron all-linear does.

The base weights are frozen (no gradient, no optimizer state: megatron's DDP and optimizer skip them); the
adapters are children of the attention / MLP module beside the linear they adapt (`linear_qkv_lora`, ...), so
megatron's distributed checkpoint saves and reloads them with the model (B / A cut along their TP axis, any
layout) and the optimizer's state with them. Weights out (weights.py) fold each adapter into its linear's TP shard
(`delta`), so the rollout and an export get the plain architecture's weights, as FSDP2's merged weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from tandem.config.lora_names import MEGATRON_TARGETS
from tandem.engine.megatron import convert

ADAPTER = "default"  # PEFT's name for the one adapter
SUFFIX = "_lora"  # the adapters' module beside the linear they adapt: linear_qkv -> linear_qkv_lora
ADAPTED_KINDS = ("qkv", "fc1", "row")


def megatron_targets(settings: Any, hf_config: Any) -> Any:
    """`actor.lora` as megatron builds it: on a mixture-of-experts model, target_modules=all-linear as the
    projections megatron's linears hold (q/k/v/o_proj, gate/up/down_proj: the experts' too), not the routers PEFT's
    all-linear adapts as well. Unchanged on a dense model and with an adapter folder (its own config places the
    adapters)."""
    if convert.num_experts(hf_config) is None or "all-linear" not in settings.target_modules:
        return settings
    if getattr(settings, "adapter_path", None) is not None:
        return settings
    linears = [name for names in MEGATRON_TARGETS.values() for name in names]
    rest = [name for name in settings.target_modules if name != "all-linear" and name not in linears]
    return dataclasses.replace(settings, target_modules=[*linears, *rest])


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


class ExpertAdapters(nn.Module):
    """The LoRA adapter of one local expert's linear_fc1 or linear_fc2: expert `expert`'s (A_e [r, in], B_e [out, r])
    of the PEFT layer `hf_module` over the fused tensor of `num_experts` experts (whole: experts are not cut by TP).
    `weight` is the expert linear's weight: each adapter tensor takes its megatron attributes (expert-parallel
    gradient reduction, tensor-parallel marks for the gradient norm)."""

    def __init__(
        self,
        hf_module: str,
        expert: int,
        num_experts: int,
        lora_a: Tensor,
        lora_b: Tensor,
        scale: float,
        weight: Tensor,
        tp_group: Any,
    ) -> None:
        super().__init__()
        self.hf_module, self.expert, self.num_experts, self.scale = hf_module, expert, num_experts, scale
        self.tp_group = tp_group  # the expert linear's (expert tensor parallel, size 1): checkpoint replicas
        self.enabled = True
        self.lora_A = nn.Parameter(lora_a)
        self.lora_B = nn.Parameter(lora_b)
        for param in (self.lora_A, self.lora_B):
            for attr in ("allreduce", "tensor_model_parallel", "partition_dim", "partition_stride"):
                if hasattr(weight, attr):
                    setattr(param, attr, getattr(weight, attr))

    def forward(self, x: Tensor) -> Tensor:
        """The adapter's term of the expert linear's output for its tokens `x` [tokens, in]."""
        return F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scale

    @torch.no_grad()
    def delta(self) -> Tensor:
        """(alpha / r) B_e A_e: the update of this expert's weight (megatron's layout, [out, in])."""
        return self.scale * (self.lora_B @ self.lora_A)

    def sharded_state_dict(
        self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None
    ) -> dict[str, Any]:
        """megatron's distributed-checkpoint entries: replicated over TP (megatron's SequentialMLP places them
        at the expert's global index, as its expert weights)."""
        from megatron.core.transformer.utils import (
            ensure_metadata_has_dp_cp_group,
            make_sharded_tensors_for_checkpoint,
        )

        metadata = ensure_metadata_has_dp_cp_group(metadata)
        return make_sharded_tensors_for_checkpoint(
            self.state_dict(prefix="", keep_vars=True),
            prefix,
            {},
            sharded_offsets,
            tp_group=self.tp_group,
            dp_cp_group=metadata["dp_cp_group"],
        )


def expert_factors(layer: nn.Module, expert: int) -> tuple[Tensor, Tensor]:
    """Expert `expert`'s (A_e [r, in], B_e [out, r]) of PEFT's ParamWrapper `layer` over a fused [E, out, in]
    tensor, as PEFT's `get_delta_weight` reshapes them: A [E r, in] -> [E, r, in], B [out, r E] -> [out, r, E]."""
    a, b = layer.lora_A[ADAPTER].weight.detach(), layer.lora_B[ADAPTER].weight.detach()
    experts = layer.num_experts
    return a.reshape(experts, -1, a.shape[-1])[expert], b.reshape(b.shape[0], -1, experts)[:, :, expert]


def fuse_experts(factors: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """PEFT's fused (A [E r, in], B [out, r E]) of every expert's (A_e, B_e), in expert order (`expert_factors`'s
    inverse)."""
    a = torch.cat([f[0] for f in factors], dim=0)
    b = torch.stack([f[1] for f in factors], dim=-1)
    return a, b.reshape(b.shape[0], -1)


def _hook(adapters: nn.Module):
    def add(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        if not adapters.enabled:
            return None
        x = args[0] if args else kwargs["input_"]
        out, bias = output
        return out + adapters(x).to(out.dtype), bias

    return add


def _owners(layers: dict[str, nn.Module]) -> dict[str, str]:
    """{a Hugging Face tensor's plain name: the PEFT layer that adapts it}: a linear's weight, or the parameter a
    ParamWrapper adapts (`mlp.experts.base_layer` -> `mlp.experts.gate_up_proj`)."""
    from peft.tuners.lora.layer import ParamWrapper

    from tandem.engine.fsdp.lora import hf_name

    return {
        hf_name(f"{name}.{layer.parameter_name}")
        if isinstance(layer, ParamWrapper)
        else f"{name}.weight": name
        for name, layer in layers.items()
    }


def _attach_expert(
    chunk: nn.Module, slot: convert.Slot, name: str, layer: nn.Module, hf_shape: tuple, dtype: torch.dtype
) -> ExpertAdapters:
    """Expert `slot.expert`'s adapter of PEFT layer `layer` (`name`) on the chunk's local expert linear of `slot`."""
    if (layer.num_experts, layer.out_features, layer.in_features) != tuple(hf_shape):
        raise ValueError(
            f"actor.lora: PEFT's adapter {name} is over a [{layer.num_experts}, {layer.out_features}, "
            f"{layer.in_features}] (experts, out, in) tensor, {slot.hf[0]} is {list(hf_shape)}: megatron's experts "
            "take a fused tensor stored [experts, out, in] (engine/megatron/convert.py)"
        )
    a, b = expert_factors(layer, slot.expert)
    path = slot.megatron.removesuffix(".weight")
    linear = chunk.get_submodule(path)
    weight = chunk.get_parameter(slot.megatron)
    adapters = ExpertAdapters(
        name,
        slot.expert,
        layer.num_experts,
        a.to(dtype).clone(),
        b.to(dtype).clone(),
        float(layer.scaling[ADAPTER]),
        weight,
        getattr(linear, "tp_group", None),
    ).to(weight.device)
    parent, leaf = path.rsplit(".", 1)
    chunk.get_submodule(parent).add_module(leaf + SUFFIX, adapters)
    linear.register_forward_hook(_hook(adapters), with_kwargs=True)
    return adapters


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
) -> dict[str, nn.Module]:
    """Adapters on model `chunk`'s linears from the PEFT layers of `peft_model` (the Hugging Face model with
    PEFT injected: engine/fsdp/lora.py `inject`; `hf_shapes` its weights' shapes by their plain names), cut for
    TP rank `tp_rank`; every parameter of the chunk frozen but the adapters. Returns {the megatron weight's name:
    its adapters} (`LinearAdapters`, or `ExpertAdapters` on a local expert's linear).

    A PEFT layer whose weight this chunk holds in a linear megatron has no adapter for (the output layer, a
    router) is an error naming it."""
    from tandem.engine.fsdp.lora import lora_layers

    layers = lora_layers(peft_model)
    owner = _owners(layers)  # the Hugging Face tensor -> its LoRA layer
    chunk.requires_grad_(False)
    local = convert.local_shapes(shapes, tp_size)
    found: dict[str, nn.Module] = {}
    for slot in slots:
        held = [owner.get(name) for name in slot.hf]
        if not any(held):
            continue
        if slot.kind not in ADAPTED_KINDS or not slot.megatron.endswith(".weight"):
            raise ValueError(
                f"actor.lora.target_modules puts an adapter on {[n for n in held if n]}, which megatron holds in "
                f"{slot.megatron}: adapters are built on the attention and MLP projections and the experts only "
                "(q/k/v/o_proj, gate/up/down_proj; verl's linear_qkv, linear_proj, linear_fc1, linear_fc2), not on "
                "a router or the output layer; leave it out of target_modules (all-linear names the projections "
                "alone on megatron) or, a linear, add it to actor.lora.exclude_modules"
            )
        if slot.expert is not None:
            found[slot.megatron] = _attach_expert(
                chunk, slot, held[0], layers[held[0]], hf_shapes[slot.hf[0]], dtype
            )
            continue
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
    adapters: list[dict[str, nn.Module]],
    tp_group: Any,
    tp_size: int,
    pp_group: Any,
    pp_size: int,
    ep_group: Any = None,
    ep_size: int = 1,
) -> dict[str, Tensor]:
    """Every adapter, whole, under the names of a PEFT adapter file (`base_model.model.<module>.lora_A.weight`),
    on every rank: the TP cuts gathered, the experts of every expert-parallel rank fused back into PEFT's A and B
    (`fuse_experts`), the pipeline stages' adapters exchanged (collective)."""
    state: dict[str, Tensor] = {}
    experts: dict[str, dict[int, tuple[Tensor, Tensor]]] = {}  # PEFT layer -> expert -> (A_e, B_e)
    for chunk in adapters:
        for linear in chunk.values():
            if isinstance(linear, ExpertAdapters):
                pair = (
                    linear.lora_A.detach().to("cpu", copy=True),
                    linear.lora_B.detach().to("cpu", copy=True),
                )
                experts.setdefault(linear.hf_module, {})[linear.expert] = pair
                continue
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
    if ep_size > 1:  # each expert-parallel rank holds its own experts
        ranks: list[Any] = [None] * ep_size
        dist.all_gather_object(ranks, experts, group=ep_group)
        experts = {}
        for held in ranks:
            for module, pairs in held.items():
                experts.setdefault(module, {}).update(pairs)
    for module, pairs in experts.items():
        a, b = fuse_experts([pairs[e] for e in sorted(pairs)])
        state[f"base_model.model.{module}.lora_A.weight"] = a
        state[f"base_model.model.{module}.lora_B.weight"] = b
    if pp_size > 1:
        stages: list[Any] = [None] * pp_size
        dist.all_gather_object(stages, state, group=pp_group)
        state = {name: t for stage in stages for name, t in stage.items()}
    return state


def expert_adapters(adapters: list[dict[str, nn.Module]]) -> list[str]:
    """The PEFT layers (Hugging Face names) of this rank's expert adapters, sorted."""
    return sorted(
        {a.hf_module for chunk in adapters for a in chunk.values() if isinstance(a, ExpertAdapters)}
    )


def _gather(tensor: Tensor, dim: int, group: Any, size: int) -> Tensor:
    parts = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


@contextmanager
def disabled(adapters: list[dict[str, nn.Module]]) -> Iterator[None]:
    """The base model's forward while open: every adapter's term left out."""
    every = [linear for chunk in adapters for linear in chunk.values()]
    for linear in every:
        linear.enabled = False
    try:
        yield
    finally:
        for linear in every:
            linear.enabled = True
