"""The megatron engine's checkpoints (megatron's distributed checkpointing).

`Checkpoints` is a part of `MegatronEngine` (engine.py), kept apart for length: what it reads and writes of the
engine is `CheckpointHost` (checked by tests/engine/test_host_contracts.py); it holds the state on the device
while it reads or writes it (`on_device`, `_offload`: offload.py)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import torch.distributed as dist
from torch import nn

from tandem.engine.base import load_engine_state, save_engine_state
from tandem.engine.megatron.offload import FORWARD, TRAIN, StateOffload


class CheckpointHost(Protocol):
    """What `Checkpoints` reads (and writes: the step counters) of the MegatronEngine it is part of."""

    chunks: list[nn.Module]
    optimizer: Any  # megatron's optimizer, None for a frozen engine
    global_step: int
    _schedule_step: int
    _scope: Callable[[], AbstractContextManager[Any]]  # the CPU adapter's mode (a no-op on CUDA)
    _offload: StateOffload

    def on_device(self, train: bool = False) -> AbstractContextManager[None]: ...

    def _check_onloaded(self, what: str) -> None: ...

    def _set_lr(self) -> None: ...


class Checkpoints:
    """save / load of a MegatronEngine (every rank writes and reads its shards)."""

    def _model_keys(self) -> list[str]:
        """The checkpoint's model entries, one per chunk (megatron's names: model, or model0, model1, ...);
        the tensors inside carry global layer numbers, so a checkpoint reloads under another layout."""
        return ["model"] if len(self.chunks) == 1 else [f"model{c}" for c in range(len(self.chunks))]

    def _sharded_state(self, is_loading: bool, weights_only: bool = False) -> dict[str, Any]:
        state: dict[str, Any] = {
            key: chunk.sharded_state_dict()
            for key, chunk in zip(self._model_keys(), self.chunks, strict=True)
        }
        if self.optimizer is not None and not weights_only:
            models = state["model"] if len(self.chunks) == 1 else dict(state)
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
        with self.on_device(train=self.optimizer is not None), self._scope():
            dist_checkpointing.save(self._sharded_state(is_loading=False), str(path))
        if dist.get_rank() == 0:
            save_engine_state(path, {"global_step": self.global_step, "schedule_step": self._schedule_step})
        dist.barrier()

    def save_weights(self, path: str | Path) -> None:
        """The model's weights alone as a megatron distributed checkpoint (dist_start.py's format, what verl's
        dist_checkpointing_path names): no optimizer state, no step counters. `path` must be new or empty."""
        from megatron.core import dist_checkpointing

        path = Path(path)
        if dist.get_rank() == 0:
            path.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        with self.on_device(), self._scope():
            dist_checkpointing.save(self._sharded_state(is_loading=False, weights_only=True), str(path))
        dist.barrier()

    def load(self, path: str | Path, weights_only: bool = False) -> None:
        from megatron.core import dist_checkpointing

        path = Path(path)
        extra = load_engine_state(path)
        self._check_onloaded("load")
        parts = TRAIN if self.optimizer is not None and not weights_only else FORWARD
        with self._offload.on_device(parts, writes=True), self._scope():
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
