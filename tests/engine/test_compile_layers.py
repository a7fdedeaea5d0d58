"""`actor.fsdp.torch_compile` (engine/fsdp/build.py): when `auto` compiles the decoder layers, what a failed
compile does under auto and under true, and compiled layers with LoRA adapters and activation checkpointing
equal the eager engine (a forward, an optimizer step, the weights after it), float32 on 1 CPU rank.

Inductor's own code is checked elsewhere (test_lm_head.py: 2 ranks compiled = 1 eager). Here the layers compile
with torch.compile's `aot_eager` backend: the same capture of the layers under FSDP2's hooks, the same
AOTAutograd graphs for forward and backward (where LoRA's extra matmuls and the checkpointed recompute meet the
compiler), run by eager kernels; inductor's C++ codegen would add a minute or two of this CPU per case, and it
is not what runs on a GPU (Triton) either."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tandem.config.schema import FSDPConfig, LoraConfig
from tandem.engine import hf_io
from tandem.engine.fsdp import build
from tandem.engine.fsdp import engine as engine_module
from tandem.engine.fsdp.build import compile_layers_wanted
from tandem.models.tiny import save_tiny

from .fsdp_scenarios import gather_state, make_engine, rollout_batch, spawn
from .lm_head_scenarios import OPTIM, make_loss_fn, stats_fn

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")


def test_auto_compiles_the_layers_on_cuda_without_sequence_parallel():
    assert compile_layers_wanted("auto", CUDA, 1)
    assert not compile_layers_wanted("auto", CUDA, 2)  # Ulysses' all-to-all in compiled layers: untested
    assert not compile_layers_wanted("auto", CPU, 1)  # 0.78x-0.99x of eager on a CPU (bench/README.md)
    assert compile_layers_wanted(True, CPU, 1)
    assert not compile_layers_wanted(False, CUDA, 1)


def run_engine(model_path, torch_compile, device=CPU, dtype="float32", attention="auto", **kwargs) -> dict:
    """An engine's start, a forward (log-probs, entropy), one training step and the weights after it, and the
    graphs torch.compile made after the start (graphs_after_warm_up: the warm-up should have made them all)."""
    from torch._dynamo.utils import counters

    fsdp = FSDPConfig(torch_compile=torch_compile, param_dtype=dtype, attn_implementation=attention)
    engine = make_engine(str(model_path), "lm", optim=OPTIM, fsdp=fsdp, device=device, packing=True, **kwargs)
    graphs = counters["stats"]["unique_graphs"]
    batch = rollout_batch(6, seed=5)
    result = {"engine": engine, "forward": engine.forward(batch, stats_fn, 2)}
    step = engine.train_step(batch, make_loss_fn(batch["response_mask"].sum()), 3)
    result["step"] = dataclasses.asdict(step)
    result["state"] = gather_state(engine)
    for seed in (7, 8):  # two more steps: other rows, other lengths
        batch = rollout_batch(5 + seed % 3, seed=seed)
        engine.train_step(batch, make_loss_fn(batch["response_mask"].sum()), 5 + seed % 3)
    result["graphs_after_warm_up"] = counters["stats"]["unique_graphs"] - graphs
    return result


def assert_same_run(got: dict, expected: dict, tolerance: float = 1e-5) -> None:
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(
            got["forward"][key], expected["forward"][key], rtol=tolerance, atol=tolerance
        )
    assert got["step"]["grad_norm"] == pytest.approx(expected["step"]["grad_norm"], rel=tolerance)
    assert got["state"].keys() == expected["state"].keys()
    for name, tensor in expected["state"].items():
        torch.testing.assert_close(got["state"][name], tensor, rtol=tolerance, atol=tolerance / 10, msg=name)


def failing_backend(graph, example_inputs):
    raise RuntimeError("no compiler here (a test's backend)")


def test_a_failed_compile_under_auto_runs_eager_and_under_true_is_an_error(
    one_rank, compiles, monkeypatch, caplog
):
    """The backend fails inside the warm-up's first forward, after FSDP2 has unsharded the layer: under auto
    the layers go back to eager and the engine then computes what an eager one does; under true the error
    names the key."""
    monkeypatch.setattr(build, "_LAYER_BACKEND", failing_backend)
    # auto compiles on this CPU too
    monkeypatch.setattr(engine_module, "compile_layers_wanted", lambda setting, *_: setting in (True, "auto"))
    eager = run_engine(one_rank, False)
    with caplog.at_level(logging.WARNING):
        fallen = run_engine(one_rank, "auto")
    assert "actor.fsdp.torch_compile=auto: torch.compile of the decoder layers" in caplog.text
    assert "no compiler here" in caplog.text
    assert fallen["engine"].compile_seconds is None
    assert all(layer._compiled_call_impl is None for layer in hf_io.decoder_layers(fallen["engine"].model))
    assert_same_run(fallen, eager)
    with pytest.raises(
        RuntimeError, match=r"(?s)actor.fsdp.torch_compile=true: .* set actor.fsdp.torch_compile=false"
    ):
        run_engine(one_rank, True)


def test_compiled_layers_with_lora_and_checkpointing_equal_eager(one_rank, compiles, monkeypatch):
    """What auto turns on for every CUDA user, with the options it must work with (issue 33, item 2): the
    adapters' matmuls and the recompute in backward inside the compiled layers change no number (both in one
    case: each alone compiled as cleanly here, and the pair is what a memory-bound LoRA run uses), and the
    start-up warm-up compiled every graph the steps need. The attention is sdpa_split, a varlen kernel as
    CUDA's are: one packed row, no mask (the sdpa path's guards are the 2-rank test's, test_lm_head.py)."""
    kwargs = {"lora": LoraConfig(rank=4), "activation_checkpointing": True, "attention": "sdpa_split"}
    monkeypatch.setattr(build, "_LAYER_BACKEND", "aot_eager")
    eager = run_engine(one_rank, False, **kwargs)
    graphs = compiles()
    compiled = run_engine(one_rank, True, **kwargs)
    assert compiled["engine"].compile_seconds > 0
    assert compiles() > graphs  # the layers were captured, not run eager
    assert all(
        layer._compiled_call_impl is not None for layer in hf_io.decoder_layers(compiled["engine"].model)
    )
    assert compiled["graphs_after_warm_up"] == 0
    assert_same_run(compiled, eager)


def cuda_worker(rank: int, world: int, init_method: str, model_path: str, out_dir: str) -> None:
    """On CUDA, what auto runs for every GPU user: the layers compiled by inductor (Triton) with the attention
    auto picks (flex_attention in float32, varlen in bf16), against eager layers; and the graphs compiled after
    the start-up warm-up (none expected)."""
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=world, device_id=device)
    try:
        results = {}
        for dtype in ("float32", "bfloat16"):
            for setting in (False, "auto"):
                run = run_engine(model_path, setting, device, dtype)
                engine = run.pop("engine")
                run["compiled"] = engine.compile_seconds
                run["attention"] = engine.config._attn_implementation
                results[(dtype, setting)] = run
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_auto_compiles_the_layers_on_cuda_and_they_equal_eager(tmp_path):
    model = save_tiny(tmp_path / "model")
    results = spawn(cuda_worker, 1, model, tmp_path / "out")[0]
    for dtype, tolerance in (("float32", 1e-5), ("bfloat16", 3e-2)):
        eager, compiled = results[(dtype, False)], results[(dtype, "auto")]
        assert eager["compiled"] is None and compiled["compiled"] > 0
        assert compiled["attention"] == eager["attention"]
        assert compiled["graphs_after_warm_up"] == 0
        assert_same_run(compiled, eager, tolerance)
