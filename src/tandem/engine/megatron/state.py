"""The megatron engine's checkpoints (megatron's distributed checkpointing) and its offload to host memory.

`CheckpointAndOffload` is a part of `MegatronEngine` (engine.py), kept apart for length: it reads the engine's
model chunks (`chunks`, the DDP-wrapped `models`), `optimizer`, `vp_size`, `device`, step counters and
`_scope` (the CPU adapter's mode)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from tandem.engine.base import load_engine_state, save_engine_state


class CheckpointAndOffload:
    """save / load (every rank writes and reads its shards) and offload / onload (GPU) of a MegatronEngine."""

    def _model_keys(self) -> list[str]:
        """The checkpoint's model entries, one per chunk (megatron's names: model, or model0, model1, ...);
        the tensors inside carry global layer numbers, so a checkpoint reloads under another layout."""
        return ["model"] if self.vp_size == 1 else [f"model{c}" for c in range(self.vp_size)]

    def _sharded_state(self, is_loading: bool, weights_only: bool = False) -> dict[str, Any]:
        state: dict[str, Any] = {
            key: chunk.sharded_state_dict()
            for key, chunk in zip(self._model_keys(), self.chunks, strict=True)
        }
        if self.optimizer is not None and not weights_only:
            models = state["model"] if self.vp_size == 1 else dict(state)
            # megatron 0.16's default format for the distributed optimizer (CUDA), fully_sharded_model_space,
            # is refused by its own checkpointing ("ShardedTensor.flattened_range is not supported");
            # fully_reshardable also keeps checkpoints loadable under another layout
            metadata = {"distrib_optim_sharding_type": "fully_reshardable"}
            state["optimizer"] = self.optimizer.sharded_state_dict(
                models, is_loading=is_loading, metadata=metadata
            )
        return state

    def save(self, path: str | Path) -> None:
        """megatron's distributed checkpoint (every rank writes its shards) + the step counters."""
        from megatron.core import dist_checkpointing

        path = Path(path)
        if dist.get_rank() == 0:
            path.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        with self._scope():
            dist_checkpointing.save(self._sharded_state(is_loading=False), str(path))
        if dist.get_rank() == 0:
            save_engine_state(path, {"global_step": self.global_step, "schedule_step": self._schedule_step})
        dist.barrier()

    def load(self, path: str | Path, weights_only: bool = False) -> None:
        from megatron.core import dist_checkpointing

        path = Path(path)
        extra = load_engine_state(path)
        with self._scope():
            state = dist_checkpointing.load(self._sharded_state(True, weights_only), str(path))
            for key, chunk in zip(self._model_keys(), self.chunks, strict=True):
                chunk.load_state_dict(state[key])
            if self.optimizer is not None and not weights_only:
                if "optimizer" not in state:
                    raise ValueError(f"{path} holds no optimizer state (saved by a frozen engine)")
                self.optimizer.load_state_dict(state["optimizer"])
        if weights_only:  # the weights alone: the step and the schedule stay this engine's
            return
        self.global_step = int(extra["global_step"])
        self._schedule_step = int(extra["schedule_step"])
        if self.optimizer is not None:
            self._set_lr()

    # ------------------------------------------------------------------ memory
    def offload(self) -> None:
        """Parameters, gradient buffers and optimizer state to host memory (GPU); a no-op on the CPU.
        forward / train_step refuse until `onload`."""
        if self.device.type != "cuda" or self._is_offloaded:
            return
        for tensor in self._device_tensors():
            host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True)
            host.copy_(tensor, non_blocking=True)
            self._cpu_copies.append((tensor, host))
        torch.cuda.synchronize(self.device)
        for tensor, _ in self._cpu_copies:
            tensor.untyped_storage().resize_(0)
        torch.cuda.empty_cache()
        self._is_offloaded = True

    def onload(self) -> None:
        if not self._is_offloaded:
            return
        for tensor, host in self._cpu_copies:
            tensor.untyped_storage().resize_(host.numel() * host.element_size())
            tensor.copy_(host, non_blocking=True)
        torch.cuda.synchronize(self.device)
        self._cpu_copies = []
        self._is_offloaded = False

    def _device_tensors(self) -> list[Tensor]:
        """Every CUDA tensor that owns its storage: DDP's parameter / gradient buffers (or the parameters),
        the optimizer's master weights and moments. Views into a buffer are covered by the buffer."""
        seen: set[int] = set()
        out: list[Tensor] = []

        def add(tensor: Any) -> None:
            if isinstance(tensor, Tensor) and tensor.is_cuda and tensor.untyped_storage().size() > 0:
                key = tensor.untyped_storage().data_ptr()
                if (
                    key not in seen
                    and tensor.storage_offset() == 0
                    and tensor.numel() * tensor.element_size() == tensor.untyped_storage().size()
                ):
                    seen.add(key)
                    out.append(tensor)

        for model in self.models:
            for buffer in getattr(model, "buffers", []) or []:
                add(getattr(buffer, "param_data", None))
                add(getattr(buffer, "grad_data", None))
        for chunk in self.chunks:
            for param in chunk.parameters():
                add(param.data)
        if self.optimizer is not None:
            for optimizer in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
                inner = getattr(optimizer, "optimizer", None)
                if inner is None:
                    continue
                for group in inner.param_groups:
                    for param in group["params"]:
                        add(param.data)
                for state in inner.state.values():
                    for value in state.values():
                        add(value)
        return out
