"""The FSDP2 engine's checkpoints (torch.distributed.checkpoint) and its offload to host memory.

`Checkpoints` and `HostOffload` are parts `FSDPEngine` (engine.py) builds once its model and optimizer are
built, over explicit arguments: they read nothing of the engine. The engine's step counter goes in and out
as an argument and a return value (`save(path, global_step)`, `load(...) -> step`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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

from tandem.engine.base import load_engine_state, save_engine_state


class Checkpoints:
    """save / load of an FSDPEngine: the sharded model and optimizer state (every rank), the step and the
    schedule (rank 0).

    Args: `model` the sharded model; `optimizer` / `scheduler` None for a frozen engine; `adapters_only`
    LoRA trains (a checkpoint then holds only what trains); `rank` this rank in the default group."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        scheduler: Any,
        adapters_only: bool,
        rank: int,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler  # torch's LRScheduler, None for a frozen engine
        self.adapters_only = adapters_only
        self.rank = rank

    def save(self, path: str | Path, global_step: int) -> None:
        """The checkpoint in folder `path`, with the engine's `global_step`."""
        path = Path(path)
        dcp.save(self._checkpoint_state(), checkpoint_id=path)
        if self.rank == 0:
            extra = {"global_step": global_step}
            if self.scheduler is not None:
                extra["scheduler"] = self.scheduler.state_dict()
            save_engine_state(path, extra)
        dist.barrier()

    def load(self, path: str | Path, weights_only: bool = False) -> int | None:
        """What `save` wrote, into the model (and optimizer and schedule); returns the saved step for the
        engine to take, or None with `weights_only` (the step and the schedule stay the engine's)."""
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
        if weights_only:
            return None
        step = int(extra["global_step"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(extra["scheduler"])
        return step

    def _state_options(self) -> StateDictOptions:
        """With LoRA a checkpoint holds what trains (the adapters; a value model's head too) and its optimizer
        state: the frozen weights are the model folder's, which every engine is built from, so they are
        neither written nor read (strict=False: the state names only what trains)."""
        return StateDictOptions(ignore_frozen_params=self.adapters_only, strict=not self.adapters_only)

    def _checkpoint_state(self, weights_only: bool = False) -> dict[str, Any]:
        options = self._state_options()
        if self.optimizer is None or weights_only:
            return {"model": get_model_state_dict(self.model, options=options)}
        model_state, optim_state = get_state_dict(self.model, self.optimizer, options=options)
        return {"model": model_state, "optim": optim_state}


class HostOffload:
    """offload / onload (GPU) of an FSDPEngine: parameters, gradients and optimizer state to host memory and
    back. `offloaded` is what the engine's calls check.

    Args: `model` the sharded model; `optimizer` None for a frozen engine; `device` the compute device;
    `cpu_offload` fsdp.cpu_offload is in effect (the state lives in host memory already: nothing to move)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        device: torch.device,
        cpu_offload: bool,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.device = device
        self.cpu_offload = cpu_offload
        self.offloaded = False
        self._moved: list[tuple[dict, str]] = []  # optimizer-state entries moved by offload()

    def offload(self) -> None:
        """Parameters, gradients and optimizer state to host memory; a no-op on the CPU and under
        fsdp.cpu_offload (they live there already). forward / train_step refuse until `onload`."""
        if self.device.type != "cuda" or self.cpu_offload or self.offloaded:
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
                        self._moved.append((state, key))
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        self.offloaded = True

    def onload(self) -> None:
        if not self.offloaded:
            return
        self.model.to(self.device)
        for state, key in self._moved:
            state[key] = state[key].to(self.device, non_blocking=True)
        self._moved = []
        torch.cuda.synchronize(self.device)
        self.offloaded = False


def _holds_optimizer_state(path: Path) -> bool:
    """Whether a torch.distributed.checkpoint folder holds an optimizer's state (keys under "optim")."""
    metadata = dcp.FileSystemReader(str(path)).read_metadata()
    return any(key.startswith("optim") for key in metadata.state_dict_metadata)
