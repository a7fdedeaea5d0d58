"""What each spawned rank does in the FSDP2 expert-LoRA test (tests/engine/test_lora_experts.py): an FSDP2 engine
on a tiny Qwen3-MoE starts from a PEFT adapter folder whose B is not 0 (adapters on the attention, the routers and
the fused expert tensors), trains two steps and exports; the parent compares with PEFT, and 1 rank with 2."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tandem.config.schema import ActorLoraConfig

from .fsdp_scenarios import PROBE_SHARDS, gather_state, logits_fn, make_engine, rollout_batch, shard, train
from .lora_scenarios import raw_state


def run_rank(rank: int, world: int, init_method: str, model_path: str, out_dir: str) -> None:
    """`model_path`: the tiny MoE folder, with its PEFT adapter folder in `<model_path>/adapter`."""
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    try:
        out = Path(out_dir)
        lora = ActorLoraConfig(rank=4, alpha=8.0, adapter_path=str(Path(model_path) / "adapter"))
        # the load-balancing loss is a mean over each micro-batch's tokens, which 1 and 2 ranks cut differently
        engine = make_engine(model_path, "lm", lora=lora, router_aux_loss_coef=0.0)
        probe = shard(rollout_batch(5, seed=1), PROBE_SHARDS[world], rank)
        result = {
            "merged0": gather_state(engine),
            "raw0": raw_state(engine),
            "experts": engine.expert_adapters(),
        }
        result["step1"] = train(engine, "lm", rollout_batch(6, seed=2), world, rank)
        engine.scheduler_step()
        result["step2"] = train(engine, "lm", rollout_batch(6, seed=3), world, rank)
        result["raw2"] = raw_state(engine)
        result["merged2"] = gather_state(engine)
        result["logits2"] = engine.forward(probe, logits_fn, 2)["logits"]
        engine.export_hf(out / "export")
        torch.save(result, out / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
