"""trainer.profile.tool=nsys (Nsight Systems): verl's global_profiler keys, the options each Ray worker runs under,
the refusal on a machine without CUDA, and the capture range a chosen call opens.

This machine has no GPU: the capture range's CUDA calls (cudaProfilerStart / Stop, NVTX) are replaced by recorders
in the last test, which checks when the profiler opens and closes them; what Nsight records is untested here.
"""

from __future__ import annotations

import pytest
import torch

from tandem.config import ConfigError, load_config
from tandem.config.schema import NSIGHT_WORKER_OPTIONS
from tandem.config.verl.translate import translate_overrides
from tandem.roles.layout import build_worker_groups, nsight_options
from tandem.roles.profile import PhaseProfiler

NSYS = ["global_profiler.tool=nsys", "global_profiler.steps=[1,2]"]


def test_verls_nsys_keys_become_tandems_profile_keys():
    translation = translate_overrides(
        [
            *NSYS,
            "global_profiler.global_tool_config.nsys.worker_nsight_options.capture-range=nvtx",
            "global_profiler.global_tool_config.nsys.controller_nsight_options.trace=cuda",  # the controller's
            "global_profiler.global_tool_config.nsys.discrete=True",
        ]
    )
    assert translation.problems == []
    assert translation.overrides == [
        "trainer.profile.tool=nsys",
        "trainer.profile.memory=false",
        "trainer.profile.steps=[1, 2]",
        "trainer.profile.nsight_options.capture-range=nvtx",
    ]
    memory = translate_overrides(["global_profiler.tool=torch_memory"]).overrides
    assert memory == ["trainer.profile.tool=torch", "trainer.profile.memory=true"]


def test_each_worker_runs_under_verls_nsight_options_with_the_users_over_them():
    cfg = load_config(
        "verl",
        [*NSYS, "global_profiler.global_tool_config.nsys.worker_nsight_options.cuda-memory-usage=false"],
    )
    assert cfg.trainer.profile.tool == "nsys"
    assert nsight_options(cfg, "cuda") == {**NSIGHT_WORKER_OPTIONS, "cuda-memory-usage": "false"}
    assert NSIGHT_WORKER_OPTIONS["capture-range"] == "cudaProfilerApi"  # what the profiler's start() opens
    assert nsight_options(load_config("verl", ["global_profiler.tool=nsys"]), "cuda") is None  # no steps: off


def test_nsys_without_a_gpu_is_refused_as_hardware():
    with pytest.raises(ConfigError, match=r"trainer.profile.tool=nsys .* trainer.device=cpu"):
        load_config("verl", [*NSYS, "trainer.device=cpu"])
    cfg = load_config("verl", [*NSYS, "trainer.backend=inprocess"])  # device auto: no CUDA on this machine
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match="hardware limit") as info:
        build_worker_groups(cfg)
    assert "trainer.profile.tool=torch" in str(info.value)


def test_a_chosen_call_opens_one_capture_range_named_by_group_rank_phase_and_step(monkeypatch, tmp_path):
    calls: list[str] = []  # stand-ins for the CUDA calls (no GPU here)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: calls.append("sync"))
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append("start"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append("stop"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: calls.append(f"push {name}"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append("pop"))
    cfg = load_config("verl", [*NSYS, "trainer.profile.phases=[update_actor]"]).trainer.profile
    profiler = PhaseProfiler(cfg, "actor_rollout", rank=0)
    for step in (1, 3):
        profiler.set_step(step, str(tmp_path))
        for phase in ("generate", "update_actor"):
            with profiler.phase(phase):
                calls.append(f"run {phase}")
    assert calls == [
        "run generate",
        *("sync", "start", "push actor_rollout_rank0_update_actor_step1"),
        "run update_actor",
        *("sync", "pop", "stop"),
        "run generate",  # step 3 is not chosen
        "run update_actor",
    ]
    assert not list(tmp_path.iterdir())  # no torch.profiler trace beside it
