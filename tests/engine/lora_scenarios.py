"""What each spawned rank does in the LoRA engine tests (tests/engine/test_lora.py): an FSDP2 engine with
adapters on every linear of the tiny model trains two steps, saves, resumes, exports, and records what the
parent compares (with transformers and PEFT, and 1 rank with 2)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tandem.config.schema import LoraConfig
from tandem.engine.fsdp import lora as lora_layers
from tandem.engine.fsdp.weights import full_tensor

from .fsdp_scenarios import PROBE_SHARDS, gather_state, logits_fn, make_engine, rollout_batch, shard, train

LORA = LoraConfig(rank=4, alpha=8.0)


def raw_state(engine) -> dict[str, torch.Tensor] | None:
    """Every parameter under its in-engine name (base_layer, lora_A / lora_B), full; rank 0 keeps it."""
    state = {name: full_tensor(p, engine.device).clone() for name, p in engine.model.named_parameters()}
    return state if engine.rank == 0 else None


def adapter_record(engine) -> dict:
    """What trains (names), how many parameters the optimizer holds, and every parameter before training."""
    return {
        "trainable": sorted(n for n, p in engine.model.named_parameters() if p.requires_grad),
        "optimizer_params": sum(p.numel() for g in engine.optimizer.param_groups for p in g["params"]),
        "raw0": raw_state(engine),
    }


def run_rank(rank: int, world: int, init_method: str, model_path: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    try:
        out = Path(out_dir)
        engine = make_engine(model_path, "lm", lora=LORA)
        probe = shard(rollout_batch(5, seed=1), PROBE_SHARDS[world], rank)
        result = {**adapter_record(engine), "logits0": engine.forward(probe, logits_fn, 2)["logits"]}
        result["step1"] = train(engine, "lm", rollout_batch(6, seed=2), world, rank)
        engine.scheduler_step()
        result["step2"] = train(engine, "lm", rollout_batch(6, seed=3), world, rank)
        result["raw2"] = raw_state(engine)
        result["merged2"] = gather_state(engine)
        result["logits2"] = engine.forward(probe, logits_fn, 2)["logits"]
        result["base_logits2"] = lora_layers.WithoutAdapter(engine).forward(probe, logits_fn, 2)["logits"]
        engine.export_hf(out / "export")

        engine.save(out / "ckpt")
        result["checkpoint_bytes"] = sum(f.stat().st_size for f in (out / "ckpt").iterdir())
        result["model_bytes"] = (Path(model_path) / "model.safetensors").stat().st_size
        result["continued"] = train(engine, "lm", rollout_batch(6, seed=4), world, rank)
        resumed = make_engine(model_path, "lm", lora=LORA)
        resumed.load(out / "ckpt")
        result["resumed"] = train(resumed, "lm", rollout_batch(6, seed=4), world, rank)
        result["continued_state"] = gather_state(engine)
        result["resumed_state"] = gather_state(resumed)
        torch.save(result, out / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_value_rank(rank: int, world: int, init_method: str, model_path: str, out_dir: str) -> None:
    """A critic with adapters (critic.lora): its value head (new, random) trains whole; two steps, export."""
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    try:
        out = Path(out_dir)
        engine = make_engine(model_path, "value", lora=LORA)
        probe = shard(rollout_batch(5, seed=1), PROBE_SHARDS[world], rank)
        result = adapter_record(engine)
        result["step1"] = train(engine, "value", rollout_batch(6, seed=2), world, rank)
        result["step2"] = train(engine, "value", rollout_batch(6, seed=3), world, rank)
        result["raw2"] = raw_state(engine)
        result["values2"] = engine.forward(probe, logits_fn, 2)["logits"]
        engine.export_hf(out / "export")
        torch.save(result, out / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
