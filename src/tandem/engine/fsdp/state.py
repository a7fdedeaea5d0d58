"""The FSDP2 engine's checkpoints (torch.distributed.checkpoint) and its offload to host memory.

`CheckpointAndOffload` is a part of `FSDPEngine` (engine.py), kept apart for length: what it reads and writes
of the engine is `StateHost` (checked by tests/engine/test_host_contracts.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from tandem.config.schema import LoraConfig
from tandem.engine.base import load_engine_state, save_engine_state


class StateHost(Protocol):
    """What `CheckpointAndOffload` reads (and writes: the step counter, the offload marks) of its FSDPEngine."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    scheduler: Any  # torch's LRScheduler, None for a frozen engine
    lora: LoraConfig | None
    rank: int
    device: torch.device
    global_step: int
    _cpu_offload: bool  # fsdp.cpu_offload in effect: the state lives in host memory already
    _is_offloaded: bool
    _offloaded: list[tuple[dict, str]]  # optimizer-state entries moved by offload()


class CheckpointAndOffload:
    """save / load (sharded, every rank) and offload / onload (GPU) of an FSDPEngine."""

    def save(self, path: str | Path) -> None:
        path = Path(path)
        dcp.save(self._checkpoint_state(), checkpoint_id=path)
        if self.rank == 0:
            extra = {"global_step": self.global_step}
            if self.scheduler is not None:
                extra["scheduler"] = self.scheduler.state_dict()
            save_engine_state(path, extra)
        dist.barrier()

    def load(self, path: str | Path, weights_only: bool = False) -> None:
        path = Path(path)
        extra = load_engine_state(path)
        state = self._checkpoint_state(weights_only)
        if "optim" in state and not _holds_optimizer_state(path):
            raise ValueError(
                f"{path} holds no optimizer state (saved by a frozen engine); load its weights alone "
                "(weights_only=True) or resume from a checkpoint of a trained engine"
            )
        dcp.load(state, checkpoint_id=path)
        options = self._state_options()
        if "optim" not in state:
            set_model_state_dict(self.model, state["model"], options=options)
        else:
            set_state_dict(
                self.model,
                self.optimizer,
                model_state_dict=state["model"],
                optim_state_dict=state["optim"],
                options=options,
            )
        if weights_only:  # the weights alone: the step and the schedule stay this engine's
            return
        self.global_step = int(extra["global_step"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(extra["scheduler"])

    def _state_options(self) -> StateDictOptions:
        """With LoRA a checkpoint holds what trains (the adapters; a value model's head too) and its optimizer
        state: the frozen weights are the model folder's, which every engine is built from, so they are
        neither written nor read (strict=False: the state names only what trains)."""
        adapters_only = self.lora is not None
        return StateDictOptions(ignore_frozen_params=adapters_only, strict=not adapters_only)

    def _checkpoint_state(self, weights_only: bool = False) -> dict[str, Any]:
        options = self._state_options()
        if self.optimizer is None or weights_only:
            return {"model": get_model_state_dict(self.model, options=options)}
        model_state, optim_state = get_state_dict(self.model, self.optimizer, options=options)
        return {"model": model_state, "optim": optim_state}

    # ------------------------------------------------------------------ memory
    def offload(self) -> None:
        """Parameters, gradients and optimizer state to host memory; a no-op on the CPU and under
        fsdp.cpu_offload (they live there already). forward / train_step refuse until `onload`."""
        if self.device.type != "cuda" or self._cpu_offload or self._is_offloaded:
            return
        cpu = torch.device("cpu")
        # FSDP2 re-points its sharded parameters (and their gradients) after `.to()`.
        self.model.to(cpu)
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                for key, value in state.items():
                    # Only what is on the GPU: AdamW keeps its `step` counters on the CPU on purpose.
                    if isinstance(value, Tensor) and value.device.type == "cuda":
                        state[key] = value.to(cpu, non_blocking=True)
                        self._offloaded.append((state, key))
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        self._is_offloaded = True

    def onload(self) -> None:
        if not self._is_offloaded:
            return
        self.model.to(self.device)
        for state, key in self._offloaded:
            state[key] = state[key].to(self.device, non_blocking=True)
        self._offloaded = []
        torch.cuda.synchronize(self.device)
        self._is_offloaded = False


def _holds_optimizer_state(path: Path) -> bool:
    """Whether a torch.distributed.checkpoint folder holds an optimizer's state (keys under "optim")."""
    metadata = dcp.FileSystemReader(str(path)).read_metadata()
    return any(key.startswith("optim") for key in metadata.state_dict_metadata)
