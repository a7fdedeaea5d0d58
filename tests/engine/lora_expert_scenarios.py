"""What each spawned rank does in the FSDP2 expert-LoRA test (tests/engine/test_lora_experts.py): an FSDP2 engine
on a tiny Qwen3-MoE starts from a PEFT adapter folder whose B is not 0 (adapters on the attention, the routers and
the fused expert tensors), trains two steps and exports; the parent compares with PEFT, and 1 rank with 2. And the
megatron engine's expert adapters against FSDP2's (`megatron_rank`), at expert parallel 1 and 2."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tandem.config.schema import ActorLoraConfig, LoraConfig, MegatronConfig

from . import megatron_lora_scenarios as mls
from .fsdp_scenarios import PROBE_SHARDS, gather_state, logits_fn, make_engine, rollout_batch, shard, train
from .lora_scenarios import raw_state
from .ranks import start_ranks


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


# megatron's expert adapters (engine/megatron/lora.py ExpertAdapters) against FSDP2's PEFT layers: verl's megatron
# targets, which reach every expert's linear_fc1 / linear_fc2 (PEFT: the fused gate_up_proj and down_proj) and
# no router; PEFT's kaiming draw of A on both engines; no balance term (1 and 2 data-parallel ranks cut the
# micro-batches differently, and the term is a mean over each)
EXPERT_LORA = LoraConfig(
    rank=4,
    alpha=8.0,
    init_a="kaiming",
    target_modules=["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
)


def megatron_rank(rank: int, world: int, init_method: str, model_path: str, out_dir: str) -> None:
    """Megatron with expert parallel = `world` (1 rank: then FSDP2 in the same process) on the tiny Qwen3-MoE:
    two steps of the actor's loss (megatron_lora_scenarios.record); the 2-rank run saves and resumes, then takes
    the same steps at TP=2 x EP=2."""
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=300)
    )
    torch.set_num_threads(1)
    try:
        out, paths = Path(out_dir), (model_path, model_path)
        args = {"lora": EXPERT_LORA, "router_aux_loss_coef": 0.0}
        parallel = MegatronConfig(expert_parallel=world)
        result = {"megatron": mls.record("megatron", parallel, paths, out, rank, resume=world > 1, **args)}
        if (
            world > 1
        ):  # then TP=2 (sequence parallel, as megatron requires for MoE) with EP=2 on the same ranks
            tp2ep2 = MegatronConfig(tensor_parallel=2, sequence_parallel=True, expert_parallel=2)
            mls._reset_parallel_state(tp2ep2)
            result["tp2ep2"] = mls.record("megatron", tp2ep2, paths, out, rank, name="-tp2ep2", **args)
        if world == 1:
            result["fsdp"] = mls.record("fsdp", parallel, paths, out, rank, **args)
            # all-linear on megatron: the same adapters (PEFT's all-linear would adapt the routers too)
            every = mls.make_engine(
                "megatron", model_path, parallel, replace(EXPERT_LORA, target_modules=["all-linear"])
            )
            result["all_linear"] = sorted(every.adapter_state())
            del every
            try:  # a router named: refused by name
                mls.make_engine(
                    "megatron", model_path, parallel, replace(EXPERT_LORA, target_modules=["q_proj", "gate"])
                )
            except ValueError as error:
                result["router_error"] = str(error)
        torch.save(result, out / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_megatron(world: int, model_path: str, out_dir: Path) -> list[dict]:
    out_dir.mkdir(parents=True, exist_ok=True)
    init_method = f"file://{out_dir / f'store-{uuid.uuid4().hex}'}"
    start_ranks(megatron_rank, (world, init_method, model_path, str(out_dir)), world)
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world)]
