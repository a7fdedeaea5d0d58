"""param_dtype=auto on a CPU (engine/auto_dtype.py): bfloat16 only where the measured bf16 matmul rate is
clearly above fp32's, float32 without a measurement where the CPU has no native bf16, the test suite's pin,
and FSDP2 ranks that measured differently agreeing on float32."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tandem.engine import auto_dtype
from tandem.engine.base import resolve_param_dtype
from tandem.models.tiny import save_tiny

from .fsdp_scenarios import file_store, logits_fn, make_engine, rollout_batch
from .ranks import start_ranks


@pytest.fixture
def unpinned(monkeypatch):
    """The probe as a user gets it: no TANDEM_AUTO_CPU_DTYPE (conftest pins float32), nothing cached."""
    monkeypatch.delenv(auto_dtype.ENV, raising=False)
    auto_dtype._probe.cache_clear()
    yield
    auto_dtype._probe.cache_clear()


def fake_rates(monkeypatch, fp32: float, bf16: float) -> list[torch.dtype]:
    timed: list[torch.dtype] = []

    def rate(dtype, *args, **kwargs):
        timed.append(dtype)
        return {torch.float32: fp32, torch.bfloat16: bf16}[dtype]

    monkeypatch.setattr(auto_dtype, "matmul_rate", rate)
    return timed


def test_no_native_bf16_is_float32_without_timing(unpinned, monkeypatch):
    monkeypatch.setattr(auto_dtype, "native_bf16", lambda: False)
    timed = fake_rates(monkeypatch, 1e11, 1e13)
    assert auto_dtype.cpu_auto_dtype() == torch.float32
    assert timed == []  # emulated bf16 is hundreds of times slower: not even measured


@pytest.mark.parametrize(
    ("bf16_rate", "expected"),
    [(4e11, torch.bfloat16), (1.3e11, torch.bfloat16), (1.2e11, torch.float32), (1e9, torch.float32)],
)
def test_native_bf16_is_chosen_only_when_clearly_faster(unpinned, monkeypatch, bf16_rate, expected):
    monkeypatch.setattr(auto_dtype, "native_bf16", lambda: True)
    timed = fake_rates(monkeypatch, 1e11, bf16_rate)
    assert auto_dtype.MARGIN == 1.3
    assert auto_dtype.cpu_auto_dtype() == expected
    assert auto_dtype.cpu_auto_dtype() == expected  # measured once per process
    assert sorted(map(str, timed)) == ["torch.bfloat16", "torch.float32"]


def test_the_probe_makes_the_same_choice_on_a_loaded_host(unpinned, monkeypatch):
    """The choice decides every number of a run, so the host's load must not move it. A made-up host whose
    bf16 matmul does a quarter of fp32's work (4x the rate: bfloat16) and whose process the OS deschedules
    for 0.1 s in each bf16 matmul, as other runs take the cores: by the wall clock bf16 measured slower than
    fp32 and the probe chose float32 (a seeded run then differed from the one before it); by CPU time it
    chooses bfloat16, as on an idle host."""
    monkeypatch.setattr(auto_dtype, "native_bf16", lambda: True)
    m, k, n = auto_dtype.PROBE_SHAPE
    quarter, weights, real_mm = torch.ones(m // 4, k), torch.ones(k, n), torch.mm

    def host_mm(a, b):
        if a.dtype != torch.bfloat16:
            return real_mm(a, b)
        time.sleep(0.1)  # off the CPU: wall time passes, this process's CPU time does not
        return real_mm(quarter, weights)

    monkeypatch.setattr(torch, "mm", host_mm)
    threads = torch.get_num_threads()
    assert auto_dtype.cpu_auto_dtype() == torch.bfloat16
    assert torch.get_num_threads() == threads  # measured on one thread, the process's threads given back


def test_pin_overrides_the_probe(monkeypatch):
    monkeypatch.setattr(auto_dtype, "_probe", lambda: pytest.fail("the pin must skip the probe"))
    monkeypatch.setenv(auto_dtype.ENV, "bfloat16")
    assert resolve_param_dtype("auto", torch.device("cpu")) == torch.bfloat16
    assert resolve_param_dtype("auto", torch.device("cpu"), cpu_probe=False) == torch.float32  # megatron
    assert resolve_param_dtype("float32", torch.device("cpu")) == torch.float32  # only auto measures
    monkeypatch.setenv(auto_dtype.ENV, "fp16")
    with pytest.raises(ValueError, match="TANDEM_AUTO_CPU_DTYPE='fp16': use float32 or bfloat16"):
        auto_dtype.cpu_auto_dtype()


def test_matmul_rate_is_measured():
    rate = auto_dtype.matmul_rate(torch.float32, (64, 64, 64), repeats=2)
    assert 1e6 < rate < 1e14  # FLOP/s of a real matmul on any CPU
    assert isinstance(auto_dtype.native_bf16(), bool)


# ---------------------------------------------------------------------------- ranks agree (spawned, gloo)
def agree_worker(rank: int, init_method: str, model_path: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=2, timeout=timedelta(seconds=120)
    )
    try:
        result = {}
        # (rank 0's probe, rank 1's probe): a rank that measured fp32 as the faster keeps everyone in fp32
        for picks in (("bfloat16", "float32"), ("bfloat16", "bfloat16")):
            os.environ[auto_dtype.ENV] = picks[rank]
            engine = make_engine(model_path, "lm", optim=None)
            probe = rollout_batch(2, seed=1).split([1, 1])[rank]
            result[picks] = (engine.param_dtype, engine.forward(probe, logits_fn, 1)["logits"])
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ranks_agree_on_the_probes_choice(tmp_path):
    model = save_tiny(tmp_path / "model")
    args = (file_store(tmp_path), str(model), str(tmp_path))
    start_ranks(agree_worker, args, 2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for rank in ranks:
        assert rank[("bfloat16", "float32")][0] == torch.float32
        assert rank[("bfloat16", "bfloat16")][0] == torch.bfloat16
    # bf16 on the CPU computes the same model: its logits within bf16's rounding of the fp32 ones
    for rank in ranks:
        fp32, bf16 = rank[("bfloat16", "float32")][1], rank[("bfloat16", "bfloat16")][1]
        assert not torch.equal(fp32, bf16)
        torch.testing.assert_close(bf16, fp32, rtol=0, atol=0.1)
