"""megatron-core on a CPU-only torch (tandem.engine.megatron.cpu_adapter).

These tests pin what the adapter adapts in megatron-core: they fail when a megatron-core release moves
or renames it, or stops needing it. When one fails after a megatron-core upgrade, check the adapter
against the new release, fix it, and add the release to cpu_adapter.TESTED_VERSIONS.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("megatron.core")

from megatron.core.tensor_parallel import random as mrandom

from tandem.engine.megatron import cpu_adapter

needs_cpu_only = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the adapter is installed only where CUDA is unavailable"
)

UPGRADE_HINT = (
    "re-run tests/engine/test_megatron_cpu.py, check src/tandem/engine/megatron/cpu_adapter.py against "
    "this megatron-core release, then update cpu_adapter.TESTED_VERSIONS"
)


def _megatron_version() -> str:
    import megatron.core

    return getattr(megatron.core, "__version__", None) or importlib.metadata.version("megatron-core")


# --- megatron-core still has what the adapter adapts ------------------------------------------------


def test_megatron_core_version_is_one_the_adapter_was_tested_against():
    version = _megatron_version()
    assert version in cpu_adapter.TESTED_VERSIONS, (
        f"megatron-core {version} is not in cpu_adapter.TESTED_VERSIONS={cpu_adapter.TESTED_VERSIONS}: "
        + UPGRADE_HINT
    )


@pytest.mark.parametrize(
    "name",
    [
        "_CUDA_RNG_STATE_TRACKER",
        "_CUDA_RNG_STATE_TRACKER_INITIALIZED",
        "CudaRNGStatesTracker",
        "get_cuda_rng_tracker",
        "_get_cuda_rng_state",  # replaced by install(): activation checkpointing saves the CUDA RNG state
        "_set_cuda_rng_state",
    ],
)
def test_megatron_rng_names_the_adapter_sets_exist(name):
    assert hasattr(mrandom, name), (
        f"megatron.core.tensor_parallel.random.{name} is gone; use_cpu_rng_tracker() sets or relies on it: "
        + UPGRADE_HINT
    )


def test_megatron_rng_tracker_keeps_its_bookkeeping_fields():
    """CPURNGStatesTracker.add/fork use the base class's `states_` and `seeds_`."""
    tracker = mrandom.CudaRNGStatesTracker()
    assert isinstance(tracker.states_, dict), UPGRADE_HINT
    assert isinstance(tracker.seeds_, set), UPGRADE_HINT


def test_megatron_still_creates_cuda_literal_tensors():
    """CudaLiteralsOnCpu exists for tensors megatron-core creates with a literal device="cuda"."""
    from megatron.core.optimizer.optimizer import FP32Optimizer
    from megatron.core.pipeline_parallel import schedules

    for function in (FP32Optimizer.__init__, schedules.forward_backward_no_pipelining):
        source = inspect.getsource(function)
        assert "device='cuda'" in source or 'device="cuda"' in source, (
            f"{function.__qualname__} no longer creates a tensor with a literal device='cuda'. "
            "cpu_adapter.CudaLiteralsOnCpu may no longer be needed for it: check where megatron-core "
            "now places that tensor, and remove or narrow the mode if nothing else needs it; " + UPGRADE_HINT
        )


@needs_cpu_only
def test_use_cpu_rng_tracker_makes_megatron_return_the_cpu_tracker(monkeypatch):
    # restore megatron's process-global tracker after the test
    monkeypatch.setattr(mrandom, "_CUDA_RNG_STATE_TRACKER", mrandom._CUDA_RNG_STATE_TRACKER)
    monkeypatch.setattr(
        mrandom, "_CUDA_RNG_STATE_TRACKER_INITIALIZED", mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED
    )
    cpu_adapter.use_cpu_rng_tracker()
    tracker = mrandom.get_cuda_rng_tracker()
    assert isinstance(tracker, cpu_adapter.CPURNGStatesTracker), (
        f"get_cuda_rng_tracker() returned {type(tracker).__name__}: " + UPGRADE_HINT
    )
    assert isinstance(tracker, mrandom.CudaRNGStatesTracker)
    assert mrandom.get_cuda_rng_tracker() is tracker


# --- CPURNGStatesTracker ----------------------------------------------------------------------------


def test_cpu_tracker_fork_draws_from_its_own_stream_and_advances_it():
    tracker = cpu_adapter.CPURNGStatesTracker()
    tracker.add("a", 5)
    torch.manual_seed(1234)
    outer_before = torch.get_rng_state()
    with tracker.fork("a"):
        x = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), outer_before)
    with tracker.fork("a"):
        y = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), outer_before)

    g = torch.Generator().manual_seed(5)
    assert torch.equal(x, torch.rand(3, generator=g))
    assert torch.equal(y, torch.rand(3, generator=g))
    assert not torch.equal(x, y)
    # the global stream outside the forks is where it was: its next draw is the seed's first
    assert torch.equal(torch.rand(3), torch.rand(3, generator=torch.Generator().manual_seed(1234)))


def test_cpu_tracker_fork_restores_the_outer_state_when_the_block_raises():
    tracker = cpu_adapter.CPURNGStatesTracker()
    tracker.add("a", 5)
    before = torch.get_rng_state()
    with pytest.raises(RuntimeError, match="boom"), tracker.fork("a"):
        torch.rand(2)
        raise RuntimeError("boom")
    assert torch.equal(torch.get_rng_state(), before)


def test_cpu_tracker_streams_are_independent():
    tracker = cpu_adapter.CPURNGStatesTracker()
    tracker.add("a", 5)
    tracker.add("b", 6)
    with tracker.fork("a"):
        a = torch.rand(3)
    with tracker.fork("b"):
        b = torch.rand(3)
    assert torch.equal(a, torch.rand(3, generator=torch.Generator().manual_seed(5)))
    assert torch.equal(b, torch.rand(3, generator=torch.Generator().manual_seed(6)))


def test_cpu_tracker_rejects_a_name_or_seed_added_twice():
    tracker = cpu_adapter.CPURNGStatesTracker()
    tracker.add("a", 5)
    with pytest.raises(ValueError, match="already tracked"):
        tracker.add("a", 6)
    with pytest.raises(ValueError, match="already tracked"):
        tracker.add("b", 5)


def test_cpu_tracker_fork_of_an_unknown_name_raises_key_error():
    tracker = cpu_adapter.CPURNGStatesTracker()
    with pytest.raises(KeyError, match="not tracked"), tracker.fork("missing"):
        pass


# --- CudaLiteralsOnCpu ------------------------------------------------------------------------------


def test_cuda_literals_land_on_the_cpu_inside_the_mode():
    t = torch.ones(2)
    with cpu_adapter.CudaLiteralsOnCpu():
        zeros = torch.zeros(2, device="cuda")
        literal = torch.tensor([1.0], device=torch.device("cuda"))
        indexed = torch.empty(1, device="cuda:0")
        moved = t.cuda()
        to_str = t.to("cuda")
        to_kwarg = t.to(device="cuda")
        to_dtype = t.to("cuda", torch.float64)
    for out in (zeros, literal, indexed, moved, to_str, to_kwarg, to_dtype):
        assert out.device.type == "cpu"
    assert torch.equal(zeros, torch.zeros(2))
    assert torch.equal(literal, torch.tensor([1.0]))
    assert torch.equal(moved, t)
    assert torch.equal(to_str, t)
    assert to_dtype.dtype == torch.float64


def test_cpu_devices_are_left_alone_inside_the_mode():
    with cpu_adapter.CudaLiteralsOnCpu():
        t = torch.zeros(2, device="cpu", dtype=torch.float64)
        u = t.to(torch.float32)
    assert t.device.type == "cpu" and t.dtype == torch.float64
    assert u.dtype == torch.float32


@needs_cpu_only
def test_cuda_literals_raise_outside_the_mode():
    with cpu_adapter.CudaLiteralsOnCpu():
        pass
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(1, device="cuda")


# --- install ----------------------------------------------------------------------------------------


@needs_cpu_only
def test_install_answers_cpu_for_current_device_and_is_idempotent():
    code = textwrap.dedent(
        """
        import torch
        from megatron.core.tensor_parallel import random as mrandom
        from tandem.engine.megatron import cpu_adapter

        cpu_adapter.install()
        first = (torch.cuda.current_device, torch.cuda.synchronize, mrandom.get_cuda_rng_tracker())
        cpu_adapter.install()
        second = (torch.cuda.current_device, torch.cuda.synchronize, mrandom.get_cuda_rng_tracker())
        assert all(a is b for a, b in zip(first, second)), "second install() changed something"
        assert isinstance(second[2], cpu_adapter.CPURNGStatesTracker)
        torch.cuda.synchronize()
        print(torch.cuda.current_device())
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("cpu"), result.stdout


def test_megatron_router_still_reads_te_general_gemm_and_without_te_defines_it():
    """engine/megatron/without_te.py (every device): megatron's router gate reads `te_general_gemm`, which only
    a Transformer Engine import defines; when this fails, megatron stopped reading it and the module can go."""
    from megatron.core.transformer.moe import moe_utils

    from tandem.engine.megatron import without_te

    assert "te_general_gemm is not None" in inspect.getsource(moe_utils.RouterGatingLinearFunction.forward)
    without_te.install()
    assert hasattr(moe_utils, "te_general_gemm")
    weight = torch.randn(4, 8, dtype=torch.float64)
    inputs = torch.randn(3, 8, dtype=torch.float64)
    logits = moe_utils.router_gating_linear(inputs, weight, None, torch.float64)
    torch.testing.assert_close(logits, inputs @ weight.T)
