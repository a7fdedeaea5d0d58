"""How `FSDPEngine` (engine.py) builds its model: the Hugging Face model read on rank 0 (meta elsewhere), LoRA
adapters injected, every decoder layer and the root `fully_shard`-ed, the weights broadcast into the shards;
`fsdp.torch_compile`'s per-layer compile and warm-up; the start-up probes that switch packing and the
chunked LM head off for a model they would change the numbers of.

`ModelBuild` is a part of `FSDPEngine`, kept apart for length: it reads the engine's `rank`, `world_size`,
`device`, `config`, `head`, `lora`, `param_dtype`, `packing`, `optimizer`, `lm_head_chunk` and calls its
`_model_forward`."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from tandem.batch import Batch
from tandem.config.schema import FSDPConfig
from tandem.engine import hf_io, kernels
from tandem.engine.base import DTYPES
from tandem.engine.fsdp import lora as lora_layers

logger = logging.getLogger(__name__)

VALUE_HEAD = ("score",)  # a value model's head (transformers' token classifiers): trained whole under LoRA
_warned_cpu_offload = False


class ModelBuild:
    """The model's construction, compile and start-up probes of an FSDPEngine."""

    def _build_model(
        self, fsdp: FSDPConfig, offload: CPUOffloadPolicy | None, activation_checkpointing: bool, seed: int
    ) -> tuple[torch.nn.Module, type, list[str]]:
        is_source = self.rank == 0
        if is_source:
            model = hf_io.load_pretrained(self.model_path, self.config, self.head, seed)
            full_state = model.state_dict()  # references; survive the sharding below
        else:
            model = hf_io.build_on_meta(self.config, self.head)
            full_state = {}
        hf_class = type(model)  # fully_shard swaps in a subclass; export writes the original
        if fsdp.liger:  # fused elementwise kernels, in place; parameter names unchanged (engine/kernels.py)
            kernels.apply_liger(model)
        if self.lora is not None:  # adapters in place, before the state is taken and the layers are sharded
            lora_layers.inject(model, self.lora, seed, whole=VALUE_HEAD if self.head == "value" else ())
            if is_source:
                full_state = model.state_dict()
        state_keys = hf_io.persistent_keys(model)
        if activation_checkpointing:
            hf_io.enable_activation_checkpointing(model)

        mp_policy = MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=DTYPES[fsdp.reduce_dtype])
        shard_kwargs: dict[str, Any] = {
            "mesh": init_device_mesh(self.device.type, (self.world_size,)),  # sharded over every rank
            "mp_policy": mp_policy,
        }
        if offload is not None:
            shard_kwargs["offload_policy"] = offload
        layers = hf_io.decoder_layers(model)
        if not layers:
            logger.warning(
                "no decoder layers found in %s: sharding the whole model as one unit", hf_class.__name__
            )
        for layer in layers:
            fully_shard(layer, **shard_kwargs)
        # Root last: embeddings, final norm and heads (tied lm_head / embed_tokens stay one parameter).
        fully_shard(model, **shard_kwargs)

        if not is_source:
            # Sharded parameters live on the CPU under CPU offload; buffers always on the compute device.
            model.to_empty(device="cpu" if offload is not None else self.device)
            _move_buffers(model, self.device)
        with torch.no_grad():
            for buffer in model.buffers():
                dist.broadcast(buffer, src=0)
        set_model_state_dict(
            model,
            full_state,
            options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
        )
        del full_state
        return model, hf_class, state_keys

    def _compile_layers(self) -> float:
        """`fsdp.torch_compile`: each decoder layer compiled in place (`Module.compile`, so the parameter names
        stay the HF ones and FSDP2's hooks stay on the layers), with dynamic shapes: packed rows are one
        [1, tokens] row whose length changes every micro-batch. Compiling happens on a layer's first calls
        with a new grad mode / train flag; a warm-up pays it here (a training pass with its backward, and a
        no-grad pass), timed and logged, so no step's time holds it. Returns the warm-up's seconds.

        Sizes 0 and 1 are never dynamic in torch.compile: padded micro-batches warm up with 2 rows and with 1,
        and the engine's dummy passes are 2 tokens long. A shape the warm-up did not foresee compiles on first
        use (torch recompiles by itself, up to its recompile limit)."""
        layers = hf_io.decoder_layers(self.model)
        if not layers:
            raise ValueError(
                f"fsdp.torch_compile=true: no decoder layers found in {self._hf_class.__name__} to compile; "
                "set fsdp.torch_compile=false"
            )
        for layer in layers:
            layer.compile(dynamic=True)
        start = time.perf_counter()
        # two sequences: one packed [1, 11] row, or a padded [2, 7] batch (its first row padded)
        lengths = (4, 7)
        mask = torch.tensor([[1] * n + [0] * (max(lengths) - n) for n in lengths], device=self.device)
        ids = (torch.arange(mask.numel(), device=self.device).view(mask.shape) * 3 + 1) % self.vocab_size
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        warm = Batch({"input_ids": ids * mask, "attention_mask": mask, "position_ids": positions})
        # Packed micro-batches are always one row; padded ones are 1 row or more, two graphs.
        shapes = [warm] if self.packing else [warm, warm.slice(0, 1)]
        for micro in shapes:
            if self.optimizer is not None:
                self.model.train()
                self._model_forward(micro).zero_loss().backward()
                for param in self.model.parameters():
                    param.grad = None
            self.model.eval()
            with torch.no_grad():
                self._model_forward(micro)
        self.model.reshard()
        seconds = time.perf_counter() - start
        logger.info(
            "fsdp.torch_compile: %d decoder layers of %s compiled in %.1f s (warm-up, %s)",
            len(layers),
            self._hf_class.__name__,
            seconds,
            "training and no-grad passes" if self.optimizer is not None else "no-grad pass",
        )
        return seconds

    def _offload_policy(self, cpu_offload: bool) -> CPUOffloadPolicy | None:
        global _warned_cpu_offload
        if not cpu_offload:
            return None
        if self.device.type != "cuda":
            if not _warned_cpu_offload:
                logger.info("fsdp.cpu_offload on device %s: nothing to offload, ignored", self.device)
                _warned_cpu_offload = True
            return None
        return CPUOffloadPolicy()

    @torch.no_grad()
    def _chunked_head_works(self) -> bool:
        """Whether this model's logits are exactly its output embedding of the last hidden states (no
        soft-capping or scaling after it): a probe's logits both ways. Otherwise the plain head, warned."""
        ids = torch.arange(6, device=self.device).view(1, 6) * 5 % self.vocab_size
        positions = torch.arange(6, device=self.device).view(1, 6)
        probe = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": positions})
        self.model.eval()
        plain = self._model_forward(probe, packed=False, chunk=None).logits.float()
        chunked = self._model_forward(probe, packed=False, chunk=self.lm_head_chunk)
        remade = F.linear(chunked.logits, chunked.head.weight, chunked.head.bias).float()
        self.model.reshard()
        agree, difference = self._probe_agrees(remade, plain)
        if agree:
            return True
        logger.warning(
            "actor.fsdp.lm_head_chunk_tokens is ignored for %s: its logits are not its output embedding of the "
            "last hidden states (%.3g apart: soft-capping or a logit scale?); the full logits are used",
            self._hf_class.__name__,
            difference,
        )
        return False

    @torch.no_grad()
    def _packing_works(self) -> bool:
        """Whether this model keeps packed sequences apart: two probe sequences run packed and padded must
        give the same outputs. Models whose attention ignores restarting position ids would let
        packed sequences attend to each other silently; those run padded, with a warning."""
        lengths = (5, 3, 2)  # packed: [5] and [3, 2]: the 2-token sequence shares a row with the 3-token one
        width = max(lengths)
        mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths], device=self.device)
        ids = torch.arange(len(lengths) * width, device=self.device).view(mask.shape) * 7 % self.vocab_size
        probe = Batch(
            {
                "input_ids": ids * mask,
                "attention_mask": mask,
                "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            }
        )
        self.model.eval()
        padded = self._model_forward(probe, packed=False, chunk=None).logits.float()
        packed = self._model_forward(probe, packed=True, chunk=None)
        unpacked = packed.packing.unpack(packed.logits.float())
        self.model.reshard()  # the sharded root parameters again: the optimizer is built from them next
        real = mask.bool()
        agree, difference = self._probe_agrees(unpacked[real], padded[real])
        if agree:
            return True
        logger.warning(
            "sequence packing is off for %s: packed sequences gave outputs %.3g away from padded ones (its "
            "attention does not separate sequences by position ids); set actor.sequence_packing=false to "
            "silence this",
            self._hf_class.__name__,
            difference,
        )
        return False

    def _probe_agrees(self, actual: Tensor, expected: Tensor) -> tuple[bool, float]:
        """(whether a start-up probe's two outputs agree up to this engine's dtype, their largest difference)."""
        difference = float((actual - expected).abs().max())
        tolerance = 1e-4 if self.param_dtype == torch.float32 else 5e-2
        return difference <= tolerance * max(1.0, float(expected.abs().max())), difference


def _move_buffers(model: torch.nn.Module, device: torch.device) -> None:
    for module in model.modules():
        for name, buffer in module.named_buffers(recurse=False):
            if buffer is not None and buffer.device != device:
                module._buffers[name] = buffer.to(device)
