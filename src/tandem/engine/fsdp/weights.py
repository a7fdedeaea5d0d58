"""`FSDPEngine`'s weights out: full tensors one at a time (`state_dict_iter`, LoRA adapters folded in), each
rank's cut for a tensor-parallel rollout (`state_dict_cuts`, engine/fsdp/reshard.py), the adapters alone
(`adapter_state`) and a Hugging Face folder (`export_hf`).

`WeightsOut` is a part `FSDPEngine` (engine.py) builds once its model is built, over explicit arguments: it
reads nothing of the engine, which delegates these calls to it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import chain
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor, Shard

from tandem.config.schema import LoraConfig
from tandem.engine import hf_io
from tandem.engine.fsdp import lora as lora_layers
from tandem.engine.fsdp import reshard
from tandem.engine.fsdp.build import BuildFacts
from tandem.engine.fsdp.vision import VisionTower
from tandem.models.tp_cuts import Cut

ADAPTER_FOLDER = "lora_adapter"  # an export's PEFT adapter folder, inside the merged model's folder


def full_tensor(tensor: Tensor, device: torch.device) -> Tensor:
    """A full local tensor of a parameter or buffer (a collective for a sharded one), gathered on `device`."""
    if isinstance(tensor, DTensor):
        if tensor.device != device:  # CPU-offloaded shards: gather on the compute device
            tensor = tensor.to(device)
        tensor = tensor.full_tensor()
    return tensor.detach()


class WeightsOut:
    """state_dict_iter / state_dict_cuts / adapter_state / save_adapter / vision_adapters / expert_adapters /
    export_hf of an FSDPEngine's sharded model.

    Args: `model` the sharded model; `facts` the engine's build facts (rank, device, head, config, folder);
    `lora` actor.lora when adapters train, else None; `state_keys` the HF state_dict's names (what
    state_dict_iter yields); `vision` the vision tower of a vision-language model, else None; `hf_class` the
    model's Hugging Face class (export writes it, not FSDP2's subclass); `export_config` the config as the user
    wrote it (dropout included)."""

    def __init__(
        self,
        model: torch.nn.Module,
        facts: BuildFacts,
        lora: LoraConfig | None,
        state_keys: set[str],
        vision: VisionTower | None,
        hf_class: type,
        export_config: dict[str, Any],
    ) -> None:
        self.model = model
        self.facts = facts
        self.lora = lora
        self.state_keys = state_keys
        self.vision = vision
        self.hf_class = hf_class
        self.export_config = export_config

    @torch.no_grad()
    def state_dict_iter(self) -> Iterator[tuple[str, Tensor]]:
        """(HF name, full float32 tensor on the engine's device), one tensor gathered at a time.

        Names are those of the HF model's `state_dict()` minus tied duplicates (the tied
        `lm_head.weight` is left out: it is `model.embed_tokens.weight`). Collective: every rank
        must iterate to the end; each rank receives every full tensor."""
        if self.lora is None:
            for name, tensor in self._named_state():
                yield name, self._full(tensor)
        else:  # the plain model's names, each adapter folded into its weight
            yield from lora_layers.merged_weights(self._named_state(), self.model, self._full)

    @torch.no_grad()
    def state_dict_cuts(
        self, cuts_of: Callable[[str, tuple[int, ...]], list[Cut | None]]
    ) -> Iterator[tuple[str, Tensor, Cut | None, torch.Size]]:
        """(HF name, this rank's cut of the tensor, the cut, the whole tensor's shape), one tensor at a time.
        `cuts_of(name, shape)`: every rank's cut of that tensor (None: whole), as a tensor-parallel rollout
        engine over consecutive ranks keeps them (models/tp_cuts.py). Each rank
        receives its cut alone (engine/fsdp/reshard.py: one all-to-all from the FSDP2 row shards); a tensor no
        rank cuts is gathered whole. Collective, like `state_dict_iter`; not with LoRA adapters."""
        if self.lora is not None:
            raise RuntimeError(
                "state_dict_cuts: LoRA adapters are merged from whole tensors (state_dict_iter)"
            )
        for name, tensor in self._named_state():
            every = cuts_of(name, tuple(tensor.shape))
            mine = every[self.facts.rank]
            if not isinstance(tensor, DTensor):
                piece = (
                    tensor.detach()
                    if mine is None
                    else tensor.detach().narrow(mine.dim, mine.start, mine.length)
                )
            elif all(cut is None for cut in every):
                piece = self._full(tensor)
            else:
                if tensor.placements != (Shard(0),):
                    raise RuntimeError(
                        f"state_dict_cuts: {name} is laid out {tensor.placements}, not FSDP2's Shard(0)"
                    )
                piece = reshard.gather_cut(
                    tensor.to_local().to(self.facts.device),
                    tensor.shape,
                    every,
                    tensor.device_mesh.get_group(),
                )
            yield name, piece, mine, tensor.shape

    def _named_state(self) -> Iterator[tuple[str, Tensor]]:
        """The parameters (tied duplicates once) and persistent buffers, the checkpoint's tensors."""
        params = self.model.named_parameters()  # drops tied duplicates
        # non-persistent buffers (rotary inv_freq) are not part of a checkpoint
        return ((n, t) for n, t in chain(params, self.model.named_buffers()) if n in self.state_keys)

    @torch.no_grad()
    def adapter_state(self) -> dict[str, Tensor]:
        """actor.lora's adapters, full, under the names of a PEFT adapter file (collective: every rank calls and
        receives them all)."""
        if self.lora is None:
            raise RuntimeError("adapter_state: this engine trains no LoRA adapters (actor.lora.rank=0)")
        return lora_layers.adapter_state(self.model.named_parameters(), self._full)

    def save_adapter(self, path: str | Path) -> int:
        """actor.lora's adapters as a PEFT adapter folder in `path`, written by every rank (collective: each rank
        gathers them all; give each its own folder). Returns the adapters' size in bytes."""
        adapters = self.adapter_state()
        lora_layers.save_adapter(path, self.lora, adapters, self.facts.model_path)
        return sum(t.numel() * t.element_size() for t in adapters.values())

    def vision_adapters(self) -> list[str]:
        """The LoRA layers inside a vision-language model's vision tower (none for a text model)."""
        if self.vision is None or self.lora is None:
            return []
        tower = {id(module) for module in self.vision.visual.modules()}
        return [name for name, layer in lora_layers.lora_layers(self.model).items() if id(layer) in tower]

    def expert_adapters(self) -> list[str]:
        """The LoRA layers on a mixture-of-experts model's fused expert tensors and routers (PEFT's ParamWrapper,
        engine/fsdp/lora.py `fused_adapters`)."""
        return lora_layers.fused_adapters(self.model) if self.lora is not None else []

    def _full(self, tensor: Tensor) -> Tensor:
        """`full_tensor` on this engine's compute device."""
        return full_tensor(tensor, self.facts.device)

    def export_hf(self, path: str | Path, dtype: torch.dtype | None = None) -> None:
        """A Hugging Face folder in `path` (rank 0 writes; every rank must call).

        Weights are written in `dtype`, by default the dtype the source folder declares, with
        the source's config (dropout as the user had it) and its tokenizer / generation files.
        A "value" engine writes a token-classification model with one label."""
        dtype = dtype or hf_io.export_dtype(self.facts.config)
        state: dict[str, Tensor] = {}
        for name, tensor in self.state_dict_iter():
            if self.facts.rank == 0:
                state[name] = tensor.to("cpu", dtype=dtype if tensor.is_floating_point() else tensor.dtype)
        if self.facts.rank == 0:
            config = type(self.facts.config).from_dict(self.export_config)
            hf_io.save_folder(
                self.hf_class, config, state, path, dtype=dtype, source_path=self.facts.model_path
            )
        if (
            self.lora is not None and self.facts.head == "lm"
        ):  # and the adapters alone, as PEFT saves them, inside
            adapters = self.adapter_state()
            if self.facts.rank == 0:
                lora_layers.save_adapter(
                    Path(path) / ADAPTER_FOLDER, self.lora, adapters, self.facts.model_path
                )
        dist.barrier()
