"""The megatron engine's checkpoints (megatron's distributed checkpointing).

`Checkpoints` is a part the engine builds once, after its model and optimizer, over explicit arguments (the
chunks, the optimizer, the offload part: offload.py); it holds the state on the device while it reads or writes
it. The engine's step counters go in as arguments of `save` and come back as `load`'s return value."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import nn

from tandem.engine.base import load_engine_state, save_engine_state
from tandem.engine.megatron.offload import FORWARD, TRAIN, StateOffload


class Checkpoints:
    """save / load of a MegatronEngine (every rank writes and reads its shards).

    Args:
        chunks: this rank's model chunks, one per virtual stage.
        optimizer: megatron's optimizer, None for a frozen engine.
        offload: the engine's state between device and host memory (offload.py): `load` holds what it writes on
            the device.
        scope: the context megatron's checkpointing runs in (the CPU adapter's mode; a no-op on CUDA).
        on_device: the engine's `on_device` (refuses on an offloaded engine).
        check_onloaded: the engine's check that it is not offloaded, naming the call.
    """

    def __init__(
        self,
        chunks: list[nn.Module],
        optimizer: Any,
        offload: StateOffload,
        *,
        scope: Callable[[], AbstractContextManager[Any]],
        on_device: Callable[..., AbstractContextManager[None]],
        check_onloaded: Callable[[str], None],
    ) -> None:
        self.chunks, self.optimizer, self.offload = chunks, optimizer, offload
        self.scope, self.on_device, self.check_onloaded = scope, on_device, check_onloaded

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

    def save(self, path: str | Path, global_step: int, schedule_step: int) -> None:
        """megatron's distributed checkpoint (every rank writes its shards) + the engine's step counters."""
        from megatron.core import dist_checkpointing

        path = Path(path)
        if dist.get_rank() == 0:
            path.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        with self.on_device(train=self.optimizer is not None), self.scope():
            dist_checkpointing.save(self._sharded_state(is_loading=False), str(path))
        if dist.get_rank() == 0:
            save_engine_state(path, {"global_step": global_step, "schedule_step": schedule_step})
        dist.barrier()

    def save_weights(self, path: str | Path) -> None:
        """The model's weights alone as a megatron distributed checkpoint (dist_start.py's format, what verl's
        dist_checkpointing_path names): no optimizer state, no step counters. `path` must be new or empty."""
        from megatron.core import dist_checkpointing

        path = Path(path)
        if dist.get_rank() == 0:
            path.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        with self.on_device(), self.scope():
            dist_checkpointing.save(self._sharded_state(is_loading=False, weights_only=True), str(path))
        dist.barrier()

    def load(self, path: str | Path, weights_only: bool = False) -> tuple[int, int] | None:
        """What `save` wrote into the chunks (and the optimizer, unless `weights_only`). Returns the saved
        (global_step, schedule_step) for the engine to take; None with `weights_only` (the step and the schedule
        stay the engine's)."""
        from megatron.core import dist_checkpointing

        path = Path(path)
        extra = load_engine_state(path)
        self.check_onloaded("load")
        parts = TRAIN if self.optimizer is not None and not weights_only else FORWARD
        with self.offload.on_device(parts, writes=True), self.scope():
            state = dist_checkpointing.load(self._sharded_state(True, weights_only), str(path))
            for key, chunk in zip(self._model_keys(), self.chunks, strict=True):
                chunk.load_state_dict(state[key])
            if self.optimizer is not None and not weights_only:
                if "optimizer" not in state:
                    raise ValueError(f"{path} holds no optimizer state (saved by a frozen engine)")
                self.optimizer.load_state_dict(state["optimizer"])
        if weights_only:
            return None
        return int(extra["global_step"]), int(extra["schedule_step"])
