"""The engine's face (engine/__init__.py, TrainEngine): what roles/ and trainer/ reach an engine through.

LoRA: `without_adapter()` is the engine's model with its adapters off, frozen (the base model's forward), and
`save_adapter(folder)` writes the adapters `adapter_state()` holds as a PEFT folder and returns their bytes;
an engine without adapters (an FSDP engine at rank 0, any megatron engine) refuses both, naming the fix.
Pre-flight: `check_buildable(strategy, settings, folders)` goes to the strategy's engine."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tandem.config.schema import FSDPConfig, LoraConfig, MegatronConfig
from tandem.engine import check_buildable
from tandem.engine.megatron import MegatronEngine
from tandem.models.tiny import save_tiny

from .fsdp_scenarios import logits_fn, make_engine, rollout_batch, spawn, train

LORA = LoraConfig(rank=4, alpha=8.0)


def run_rank(rank: int, world: int, init_method: str, model_path: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    try:
        out = Path(out_dir)
        engine = make_engine(model_path, "lm", lora=LORA)
        train(engine, "lm", rollout_batch(6, seed=2), world, rank)  # B != 0: the adapters change the outputs
        probe = rollout_batch(3, seed=1)
        reference = engine.without_adapter()
        result = {
            "adapters": {k: v.clone() for k, v in engine.adapter_state().items()},
            "bytes": engine.save_adapter(out / "adapter"),
            "with_adapters": engine.forward(probe, logits_fn, 2)["logits"],
            "without": reference.forward(probe, logits_fn, 2)["logits"],
            "same_layout": (reference.dp_rank, reference.dp_size) == (engine.dp_rank, engine.dp_size),
        }
        try:
            reference.train_step(probe, lambda output, micro: (output.logits.sum(), {}), 2)
        except RuntimeError as error:
            result["reference_trains"] = str(error)
        plain = make_engine(model_path, "lm", optim=None)
        result["base"] = plain.forward(probe, logits_fn, 2)["logits"]
        for what in ("without_adapter", "save_adapter"):
            try:
                getattr(plain, what)(*([out / "none"] if what == "save_adapter" else []))
            except RuntimeError as error:
                result[what] = str(error)
        torch.save(result, out / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def face(tmp_path_factory):
    path = save_tiny(tmp_path_factory.mktemp("face") / "tiny")
    out = tmp_path_factory.mktemp("face_out")
    return spawn(run_rank, 1, path, out)[0], out, path


def test_save_adapter_writes_the_adapters_as_a_peft_folder(face):
    from safetensors.torch import load_file

    result, out, path = face
    saved = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    adapters = result["adapters"]
    assert saved.keys() == adapters.keys() and len(saved) > 0
    for name, tensor in adapters.items():
        torch.testing.assert_close(saved[name], tensor, rtol=0, atol=0)
    assert result["bytes"] == sum(t.numel() * t.element_size() for t in adapters.values())
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (4, 8.0, str(path))


def test_without_adapter_is_the_base_model_frozen(face):
    result, _, _ = face
    torch.testing.assert_close(result["without"], result["base"], rtol=0, atol=1e-5)
    assert (result["without"] - result["with_adapters"]).abs().max() > 1e-4  # the adapters do change it
    assert result["same_layout"]
    assert "LoRA actor's reference" in result["reference_trains"]


def test_an_engine_without_adapters_refuses_the_lora_calls(face):
    result, _, _ = face
    assert "trains no LoRA adapters (actor.lora.rank=0)" in result["without_adapter"]
    assert "trains no LoRA adapters (actor.lora.rank=0)" in result["save_adapter"]
    megatron = object.__new__(MegatronEngine)  # the calls refuse before reading any other state
    megatron.lora = None  # actor.lora.rank=0 (engine/megatron/lora.py builds them otherwise)
    for call in (megatron.without_adapter, lambda: megatron.save_adapter("unused")):
        with pytest.raises(RuntimeError, match=r"trains no LoRA adapters \(actor.lora.rank=0\)"):
            call()


def test_check_buildable_goes_to_the_strategy_engine(tmp_path):
    path = str(save_tiny(tmp_path / "tiny"))  # 4 attention heads, 4 layers
    folders = {"actor.model_path": path, "critic.model_path": path}
    assert check_buildable("fsdp", FSDPConfig(), folders) == []  # no sequence parallel: nothing read
    problems = check_buildable("fsdp", FSDPConfig(sequence_parallel=8), folders)
    assert len(problems) == 1 and problems[0].startswith(f"actor.model_path={path}: ")  # the folder once
    assert "num_attention_heads=4 is not a multiple of 8" in problems[0]
    megatron = check_buildable("megatron", MegatronConfig(virtual_pipeline=3), folders)
    assert megatron[-1] == (  # (after a line on megatron-core, where it is not installed)
        f"actor.model_path={path}: num_hidden_layers=4 is not a multiple of actor.megatron.pipeline_parallel x "
        "virtual_pipeline = 3 (each model chunk holds the same number of layers)"
    )
    with pytest.raises(ValueError, match="unknown engine strategy 'deepspeed'"):
        check_buildable("deepspeed", FSDPConfig(), folders)
