"""megatron-core on a CPU-only torch (gloo): what megatron assumes a GPU for, redirected.

megatron-core places tensors with `torch.cuda.current_device()` and keeps its tensor-parallel RNG
streams as CUDA generator states (`tensor_parallel.random`). On a machine without CUDA both raise.
`install()` (called by the megatron engine only when its device is the CPU) makes
`torch.cuda.current_device()` answer "cpu" in this process, swaps megatron's RNG tracker for one
that keeps CPU generator states, and makes its save / restore of the CUDA RNG state (activation
checkpointing) a no-op. Nothing is changed where CUDA is available: there megatron runs as
it is. tests/engine/test_megatron_cpu.py fails when a megatron-core release moves what this adapts.

Mixture-of-experts layers (expert parallel) need two more, both in `_adapt_moe`: the all-to-all token
dispatcher copies its token counts to the host on a side CUDA stream (streams and events here are
stand-ins that run inline: a CPU has one stream); and it turns those counts into the host lists
`all_to_all_single` takes only for tensors on a GPU (`maybe_move_tensor_to_cpu` skips CPU tensors, so
their split sizes stayed tensors and gloo's all-to-all refused them). (The Transformer Engine GEMM its
router reads is not CPU-specific: without_te.py.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

TESTED_VERSIONS = ("0.16.1",)  # megatron-core releases this adapter was written and tested against

_installed = False


def install() -> None:
    """Adapt megatron-core to this CPU-only process (idempotent; a no-op where CUDA is available)."""
    global _installed
    if _installed or torch.cuda.is_available():
        return
    torch.cuda.current_device = _cpu_device  # megatron: tensor(..., device=torch.cuda.current_device())
    torch.cuda.synchronize = _no_sync  # megatron's timers and p2p communication synchronise
    use_cpu_rng_tracker()
    # Activation checkpointing saves and restores the CUDA RNG state around each recomputed layer; there is
    # none on the CPU (the CPU generator and the tracker's streams are saved beside it, unchanged).
    from megatron.core.tensor_parallel import random as mrandom

    mrandom._get_cuda_rng_state = _no_cuda_rng_state
    mrandom._set_cuda_rng_state = _set_no_cuda_rng_state
    _adapt_moe()
    _installed = True


class _InlineStream:
    """A CUDA stream / event stand-in: work is already done in order on the CPU."""

    def wait_stream(self, other: object) -> None:
        return None

    def record_event(self, *args: object) -> _InlineStream:
        return self

    def record(self, *args: object) -> None:
        return None

    def synchronize(self) -> None:
        return None


_STREAM = _InlineStream()


def _adapt_moe() -> None:
    from megatron.core.transformer.moe import token_dispatcher

    # The dispatcher's class-wide side stream, made before it would call torch.cuda.Stream() (a class other
    # libraries in the process annotate with: it is left alone).
    token_dispatcher.MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = _STREAM
    torch.cuda.current_stream = lambda *args, **kwargs: _STREAM
    torch.cuda.stream = lambda stream: contextlib.nullcontext()
    token_dispatcher.maybe_move_tensor_to_cpu = _to_host


def _to_host(tensor: object, as_numpy: bool = False, record_stream: bool = False) -> object:
    """megatron's `maybe_move_tensor_to_cpu` for tensors already on the CPU: the same host values."""
    if torch.is_tensor(tensor):
        return tensor.numpy() if as_numpy else tensor
    return tensor


def _cpu_device() -> str:
    return "cpu"


def _no_sync(device: object = None) -> None:
    return None


def _no_cuda_rng_state(*args: object, **kwargs: object) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8)


def _set_no_cuda_rng_state(*args: object, **kwargs: object) -> None:
    return None


def use_cpu_rng_tracker() -> None:
    """Make megatron's tensor-parallel RNG tracker a `CPURNGStatesTracker` (empty until seeded)."""
    from megatron.core.tensor_parallel import random as mrandom

    mrandom._CUDA_RNG_STATE_TRACKER = CPURNGStatesTracker()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True


def _megatron_tracker_base() -> type:
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    return CudaRNGStatesTracker


class CPURNGStatesTracker(_megatron_tracker_base()):
    """megatron's RNG tracker with CPU generator states: `fork(name)` runs its block on the named
    stream of the CPU default generator (dropout inside tensor-parallel regions draws from it)."""

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_ or name in self.states_:
            raise ValueError(f"RNG stream {name!r} or seed {seed} is already tracked")
        self._is_initialized = True
        self.seeds_.add(seed)
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        if name not in self.states_:
            raise KeyError(f"RNG stream {name!r} is not tracked; call model_parallel_cuda_manual_seed first")
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)


class CudaLiteralsOnCpu(TorchFunctionMode):
    """Inside this mode, what megatron-core puts on the GPU by name lands on the CPU: tensors created
    with a literal `device="cuda"` (its schedules' token counters, its optimizers' buffers) and
    `tensor.cuda()` (its pipeline-parallel embedding copy). The engine runs megatron calls inside it
    on the CPU; a function mode costs a Python call per torch op, so it is scoped to those calls."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if kwargs.get("pin_memory"):  # pinned host memory is a staging area for GPU copies (context parallel)
            kwargs["pin_memory"] = False
        device = kwargs.get("device")
        if device is not None and _is_cuda(device):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


def _is_cuda(device: object) -> bool:
    if isinstance(device, str | torch.device):
        return torch.device(device).type == "cuda"
    return False
