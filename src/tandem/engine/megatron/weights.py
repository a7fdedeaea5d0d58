"""`MegatronEngine`'s weights out: whole tensors in Hugging Face names (`state_dict_iter`), each rank's cut for
a tensor-parallel rollout engine (`state_dict_cuts`) and a Hugging Face folder (`export_hf`); each megatron
parameter's TP shards gathered on its stage (convert.py), then sent from that stage to the others.

`WeightsOut` is a part the engine builds once, after its model, over explicit arguments (the layout, the chunks
and what the build made of them); it reads nothing of the engine but the `on_device` it is given."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from tandem.engine import hf_io
from tandem.engine.megatron import convert
from tandem.engine.megatron.experts import stack_experts
from tandem.engine.megatron.parallel import ParallelLayout
from tandem.models.tp_cuts import Cut

if TYPE_CHECKING:
    from tandem.engine.megatron.build import ChunkMap


class WeightsOut:
    """state_dict_iter / state_dict_cuts / export_hf of a MegatronEngine.

    Args:
        layout: this rank's place in megatron's layout (parallel.py).
        chunks: this rank's model chunks, one per virtual stage.
        chunk_map: each chunk's parameters (build.py).
        adapters: each chunk's LoRA adapters by megatron weight name ([] without LoRA), folded into the weights.
        hf_config: the model's Hugging Face config.
        shapes: its attention shapes (convert.py).
        hf_shapes: each Hugging Face weight's whole shape.
        hf_class: the Hugging Face model class export_hf writes.
        export_config: the folder's config as read (before Tandem's changes), written by export_hf.
        model_path: the folder (export_hf copies its tokenizer and generation files).
        param_dtype: the parameters' dtype (stages that do not hold a tensor receive it in this dtype).
        device: the engine's device.
        on_device: the engine's `on_device` (the parameters on the device while they are read; refuses on an
            offloaded engine).
    """

    def __init__(
        self,
        layout: ParallelLayout,
        chunks: list[nn.Module],
        chunk_map: ChunkMap,
        *,
        adapters: list[dict[str, Any]],
        hf_config: Any,
        shapes: convert.Shapes,
        hf_shapes: dict[str, tuple],
        hf_class: type,
        export_config: dict[str, Any],
        model_path: str,
        param_dtype: torch.dtype,
        device: torch.device,
        on_device: Callable[[], AbstractContextManager[None]],
    ) -> None:
        self.layout, self.chunks, self.chunk_map, self.adapters = layout, chunks, chunk_map, adapters
        self.hf_config, self.shapes, self.hf_shapes, self.hf_class = hf_config, shapes, hf_shapes, hf_class
        self.export_config, self.model_path = export_config, model_path
        self.param_dtype, self.device, self.on_device = param_dtype, device, on_device

    @torch.no_grad()
    def state_dict_iter(self) -> Iterator[tuple[str, Tensor]]:
        """(HF name, full tensor on the engine's device), one megatron parameter at a time: its TP cuts
        gathered on its stage, then sent from that stage to the others. Same names as FSDPEngine's (a tied
        lm_head left out). Collective: every rank must iterate to the end. The parameters stay on the device
        until the iteration ends (megatron.param_offload)."""
        with self.on_device():
            for name, tensor, _, _ in self._stream_weights(None):
                yield name, tensor

    def state_dict_cuts(
        self, cuts_of: Callable[[str, tuple[int, ...]], list[Cut | None]]
    ) -> Iterator[tuple[str, Tensor, Cut | None, torch.Size]]:
        """(HF name, this rank's cut of the tensor, the cut, the whole shape), as FSDPEngine.state_dict_cuts:
        for a tensor-parallel rollout engine whose rank r is this engine's TP rank r (rollout.tensor_parallel =
        actor.megatron.tensor_parallel). Where this TP rank's own cut of a parameter is the rollout's (heads,
        MLP columns and rows, a vocabulary that splits alike), it is taken as it is: no TP gather; other
        tensors are gathered and cut. Pipeline stages send their cuts to the others (same TP rank)."""
        if self.layout.tp_rank != dist.get_rank() % self.layout.tp_size:
            raise RuntimeError(
                f"state_dict_cuts: rank {dist.get_rank()} is megatron TP rank {self.layout.tp_rank}, not rank "
                f"{dist.get_rank() % self.layout.tp_size} of a rollout engine over {self.layout.tp_size} consecutive "
                "ranks"
            )
        with self.on_device():
            yield from self._stream_weights(cuts_of)

    def _stream_weights(
        self, cuts_of: Callable[[str, tuple[int, ...]], list[Cut | None]] | None
    ) -> Iterator[tuple[str, Tensor, Cut | None, torch.Size]]:
        """state_dict_iter (`cuts_of` None: whole tensors) and state_dict_cuts."""
        yielded = set()
        experts: dict[str, list[Tensor]] = {}  # a fused MoE tensor: this rank's experts' rows so far
        local_experts = (convert.num_experts(self.hf_config) or 0) // self.layout.ep_size
        me = dist.get_rank()
        for chunk, stage in ((c, s) for c in range(self.layout.vp_size) for s in range(self.layout.pp_size)):
            for slot in self.chunk_map.slots(stage, chunk):
                expert = slot.expert is not None  # one row of a fused [E, ...] tensor, whole on this rank
                shapes = [self.hf_shapes[name][1:] if expert else self.hf_shapes[name] for name in slot.hf]
                wanted = (
                    [None] * len(slot.hf)
                    if cuts_of is None or expert
                    else [cuts_of(name, tuple(self.hf_shapes[name]))[me] for name in slot.hf]
                )
                held = convert.tp_cuts(slot, shapes, self.layout.tp_rank, self.layout.tp_size)
                if stage == self.layout.pp_rank:
                    shard = self.chunks[chunk].get_parameter(slot.megatron).detach()
                    adapters = self.adapters[chunk].get(slot.megatron) if self.adapters else None
                    if adapters is not None:  # LoRA: the adapters folded into this shard (lora.py)
                        shard = shard + adapters.delta().to(shard.dtype)
                    if expert:
                        full = convert.from_shards(slot, [shard], self.shapes)
                    elif wanted == held:  # this TP rank's own cut is what is wanted: no gather
                        full = convert.from_shards(
                            slot, [shard], convert.local_shapes(self.shapes, self.layout.tp_size)
                        )
                    else:
                        full = [
                            _narrow(t, cut)
                            for t, cut in zip(self._gather_tp(slot, shard), wanted, strict=True)
                        ]
                else:
                    full = [
                        torch.empty(_cut_shape(shape, cut), dtype=self.param_dtype, device=self.device)
                        for shape, cut in zip(shapes, wanted, strict=True)
                    ]
                if self.layout.pp_size > 1:
                    for tensor in full:
                        dist.broadcast(tensor, src=self.layout.pp_ranks[stage], group=self.layout.pp_group)
                if expert:
                    rows = experts.setdefault(slot.hf[0], [])
                    rows.append(full[0])
                    if len(rows) < local_experts:
                        continue
                    full = [stack_experts(experts.pop(slot.hf[0]), self.layout.ep_group, self.layout.ep_size)]
                for name, tensor, cut in zip(slot.hf, full, wanted, strict=True):
                    if name not in yielded:  # the last stage's copy of a tied embedding
                        yielded.add(name)
                        yield name, tensor, cut, torch.Size(self.hf_shapes[name])

    def _gather_tp(self, slot: convert.Slot, shard: Tensor) -> list[Tensor]:
        if slot.kind == "rep":
            return [shard]
        if self.layout.tp_size == 1:
            return convert.from_shards(slot, [shard], self.shapes)
        shards = [torch.empty_like(shard) for _ in range(self.layout.tp_size)]
        dist.all_gather(shards, shard.contiguous(), group=self.layout.tp_group)
        return convert.from_shards(slot, shards, self.shapes)

    def export_hf(self, path: str | Path, dtype: torch.dtype | None = None) -> None:
        """A Hugging Face folder in `path` (global rank 0 writes; every rank must call)."""
        dtype = dtype or hf_io.export_dtype(self.hf_config)
        writer = dist.get_rank() == 0
        with self.on_device():  # on a CPU device the tensors below may be the parameters themselves
            state = {
                name: tensor.to("cpu", dtype=dtype if tensor.is_floating_point() else tensor.dtype)
                for name, tensor in self.state_dict_iter()
                if writer
            }
            if writer:
                config = type(self.hf_config).from_dict(self.export_config)
                hf_io.save_folder(
                    self.hf_class, config, state, path, dtype=dtype, source_path=self.model_path
                )
        dist.barrier()


def _narrow(tensor: Tensor, cut: Cut | None) -> Tensor:
    return tensor if cut is None else tensor.narrow(cut.dim, cut.start, cut.length)


def _cut_shape(shape: tuple[int, ...], cut: Cut | None) -> tuple[int, ...]:
    return (
        tuple(shape) if cut is None else tuple(cut.length if d == cut.dim else n for d, n in enumerate(shape))
    )
