"""The megatron engine's state in host memory between calls: parameters, gradient buffers and optimizer state,
each part its own switch (actor.megatron.param_offload / grad_offload / optimizer_offload, and
reference.megatron_param_offload for the reference's engine).

A part's tensors keep their identity. Each tensor that owns its storage (megatron DDP's parameter and gradient
buffers, or the parameters themselves where no buffer holds them; the optimizer's master weights and Adam moments)
is copied into a host buffer and its storage resized to 0, then resized back and copied in: every view into it
(DDP's per-parameter views, `main_grad`, the optimizer's references) stays valid and the values come back bit for
bit; a part that no call wrote since it came back (a forward, the weights read out) leaves without a copy, its
host copy still holding its values. Gradient buffers are freed without a copy and come back zeroed, as megatron-core's own
`DistributedDataParallel.offload_grad_buffers` does: every update zeroes them before its first backward
(`zero_grad_buffer`), so their values between calls are dead. Host buffers are pinned on CUDA and kept for the
next offload of the same part.

`StateOffload.on_device(parts)` holds the parts on the device for the calls inside; when the outermost use ends,
the switched parts go back to host memory. On a CPU device nothing moves (the state is in host memory already).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

logger = logging.getLogger(__name__)

PARTS = ("params", "grads", "optimizer")
FORWARD = frozenset({"params"})  # what a forward (or reading the weights out) needs on the device
TRAIN = frozenset(PARTS)  # what an update needs
# Device types whose memory is not the host's: only their state moves. (A test adds "cpu" to run the moves on a
# CPU-only machine, where the "device" copy and the host copy are both in CPU memory.)
DEVICE_TYPES_WITH_OWN_MEMORY = {"cuda"}

_logged_cpu = False


class StateOffload:
    """Moves parts of one engine's state between its device and host memory (see the module docstring).

    Args:
        device: the engine's device.
        models: the model chunks the schedule runs (DDP-wrapped when trainable: their buffers hold the
            parameters, under the distributed optimizer, and the gradients).
        chunks: the bare model chunks (their parameters, where no DDP buffer holds them).
        optimizer: megatron's optimizer, or None (a frozen engine).
        switched: the parts kept in host memory between calls.
    """

    def __init__(
        self,
        device: torch.device,
        models: list[nn.Module],
        chunks: list[nn.Module],
        optimizer: Any,
        switched: Iterable[str],
    ) -> None:
        global _logged_cpu
        self.device = device
        self._models = models
        self._chunks = chunks
        self._optimizer = optimizer
        switched = frozenset(switched)
        if unknown := switched - TRAIN:
            raise ValueError(f"offload parts {sorted(unknown)}: each must be one of {list(PARTS)}")
        if optimizer is None:  # a frozen engine has no gradients and no optimizer state
            switched &= FORWARD
        if switched and not self.moves:
            if not _logged_cpu:
                logger.info(
                    "megatron offload (%s) on device %s: nothing to move, the state is in host memory already",
                    ", ".join(p for p in PARTS if p in switched),
                    device,
                )
                _logged_cpu = True
            switched = frozenset()
        self.switched = switched
        # part -> (device tensor, its host copy (None: a gradient buffer, freed), its storage's bytes)
        self._parked: dict[str, list[tuple[Tensor, Tensor | None, int]]] = {}
        # a part that is back: (device tensor, host buffer) pairs, the buffers reused by its next offload
        self._spare: dict[str, list[tuple[Tensor, Tensor | None]]] = {}
        # parts back whose values are still their host copies' (nothing wrote them since): they leave uncopied
        self._clean: set[str] = set()
        self._depth = 0  # nesting of on_device

    @property
    def moves(self) -> bool:
        """Whether this device's state can move to host memory at all."""
        return self.device.type in DEVICE_TYPES_WITH_OWN_MEMORY

    @property
    def parked(self) -> frozenset[str]:
        """The parts in host memory now."""
        return frozenset(self._parked)

    def host_copies(self, part: str) -> list[tuple[Tensor, Tensor | None]]:
        """(device tensor, host copy) of a parked part; for tests and memory accounting."""
        return [(tensor, host) for tensor, host, _ in self._parked.get(part, [])]

    @contextlib.contextmanager
    def on_device(self, parts: frozenset[str], writes: bool) -> Iterator[None]:
        """`parts` on the device for the calls inside; when the outermost use ends, the switched parts go back to
        host memory (a nested use brings in what it lacks and leaves the rest to the outermost). `writes`: the
        calls inside may change them (an update, a load); a part no call wrote leaves without a copy, its host
        copy is still its value (a forward, reading the weights out)."""
        self.onload(parts)
        if writes:
            self.changed(parts)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.offload(self.switched)

    def offload(self, parts: Iterable[str]) -> None:
        """`parts` to host memory (those on the device); a no-op where nothing moves."""
        parts = [p for p in PARTS if p in set(parts) and p not in self._parked]
        if not parts or not self.moves:
            return
        owners = self._owners()
        for part in parts:
            spare = {_storage_key(tensor): host for tensor, host in self._spare.pop(part, [])}
            clean = part in self._clean
            self._clean.discard(part)
            entries = []
            for tensor in owners[part]:
                host = spare.get(_storage_key(tensor))
                if part == "grads":  # gradients between calls are dead (module docstring): freed, not copied
                    host = None
                elif host is None or host.shape != tensor.shape or host.dtype != tensor.dtype:
                    host = torch.empty(
                        tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=self.device.type == "cuda"
                    )
                    host.copy_(tensor, non_blocking=True)
                elif not clean:
                    host.copy_(tensor, non_blocking=True)
                entries.append((tensor, host, tensor.untyped_storage().nbytes()))
            self._parked[part] = entries
        self._synchronize()  # the copies have landed before the storage goes
        for part in parts:
            for tensor, _, _ in self._parked[part]:
                tensor.untyped_storage().resize_(0)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # back to the driver: the rollout engine allocates outside torch's cache

    def onload(self, parts: Iterable[str]) -> None:
        """`parts` back on the device (those in host memory), with the values they left with (gradients: 0)."""
        parts = [p for p in PARTS if p in set(parts) and p in self._parked]
        for part in parts:
            entries = self._parked.pop(part)
            for tensor, host, nbytes in entries:
                tensor.untyped_storage().resize_(nbytes)
                if host is None:
                    tensor.zero_()
                else:
                    tensor.copy_(host, non_blocking=True)
            self._spare[part] = [(tensor, host) for tensor, host, _ in entries]
            self._clean.add(part)
        if parts:
            self._synchronize()

    def changed(self, parts: Iterable[str]) -> None:
        """`parts` may be written now: their next offload copies them out again."""
        self._clean -= set(parts)

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _owners(self) -> dict[str, list[Tensor]]:
        """Each part's tensors on the device that own their storage, each storage once over all parts: DDP's
        parameter buffers or the parameters (params), DDP's gradient buffers (grads), the optimizer's own
        master weights and state (optimizer; under float32 its parameters are the model's, counted in params).
        Views into a buffer are covered by the buffer; a part in host memory (storage of size 0) is skipped."""
        seen: set[int] = set()
        out: dict[str, list[Tensor]] = {part: [] for part in PARTS}

        def add(part: str, tensor: Any) -> None:
            if not isinstance(tensor, Tensor) or tensor.device.type != self.device.type:
                return
            storage = tensor.untyped_storage()
            if storage.nbytes() == 0 or storage.data_ptr() in seen:
                return
            if tensor.storage_offset() == 0 and tensor.numel() * tensor.element_size() == storage.nbytes():
                seen.add(storage.data_ptr())
                out[part].append(tensor)

        buffers = [buffer for model in self._models for buffer in _ddp_buffers(model)]
        for buffer in buffers:
            add("params", getattr(buffer, "param_data", None))
        for chunk in self._chunks:
            for param in chunk.parameters():
                add("params", param.data)
        for buffer in buffers:
            add("grads", getattr(buffer, "grad_data", None))
        if self._optimizer is not None:
            for optimizer in getattr(self._optimizer, "chained_optimizers", [self._optimizer]):
                inner = getattr(optimizer, "optimizer", None)
                if inner is None:
                    continue
                for group in inner.param_groups:
                    for param in group["params"]:
                        add("optimizer", param.data)
                for state in inner.state.values():
                    for value in state.values():
                        add("optimizer", value)
        return out


def _ddp_buffers(model: nn.Module) -> list[Any]:
    """megatron DDP's parameter-and-gradient buffers of a model chunk, dense and expert ones (none for a bare
    chunk, whose `buffers` is nn.Module's method)."""
    out = []
    for name in ("buffers", "expert_parallel_buffers"):
        found = getattr(model, name, None)
        if isinstance(found, list):
            out += found
    return out


def _storage_key(tensor: Tensor) -> int:
    """The identity of a tensor's storage, the same for every alias (`param.data` is a new tensor each time) and
    across a resize."""
    return tensor.untyped_storage()._cdata
