"""What each spawned rank does in the megatron LoRA tests (tests/engine/test_megatron_lora.py): a megatron engine
with adapters of rank 4 on every linear of the tiny model (TP = world size, no data parallel) takes two steps of
the real actor's loss and writes its adapters as a PEFT folder (the 2-rank run also saves and resumes); the 1-rank
run then does the same on the FSDP2 engine, whose adapters start from the same draw. The 2-rank run then takes
the same two steps in the other 2-rank layouts (`LAYOUTS`: sequence parallel, pipeline, virtual pipeline), each in
the same processes, megatron's parallel state rebuilt between them. Each rank writes `rank{r}.pt`."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tandem.config.schema import FSDPConfig, LoraConfig, MegatronConfig
from tandem.engine import EngineSpec, build_engine
from tandem.roles.actor import Actor
from tandem.roles.common import MODEL_INPUTS

from . import megatron_scenarios as sc
from .ranks import start_ranks

LORA = LoraConfig(rank=4, alpha=8.0, init_a="kaiming")  # one draw on both engines (auto: xavier on megatron)
# the 2-rank run's other layouts, after TP=2: name -> megatron settings (the tiny model has 4 layers)
LAYOUTS = {
    "tp2sp": MegatronConfig(tensor_parallel=2, sequence_parallel=True),
    "pp2": MegatronConfig(pipeline_parallel=2),
    "pp2vp2": MegatronConfig(pipeline_parallel=2, virtual_pipeline=2),  # 2 chunks of 1 layer per stage
}


def frozen(engine) -> dict[str, torch.Tensor]:
    """Every parameter that does not train, by its in-engine name (the base model's weights)."""
    models = engine.chunks if hasattr(engine, "chunks") else [engine.model]
    return {
        f"{i}.{name}": p.detach().clone()
        for i, model in enumerate(models)
        for name, p in model.named_parameters()
        if not p.requires_grad
    }


def make_engine(strategy: str, model_path: str, parallel: MegatronConfig, lora: LoraConfig = LORA, **kwargs):
    """megatron_scenarios' engine with LoRA; FSDP2 in float32 as megatron computes on a CPU (its "auto" may pick
    bfloat16 on a CPU with fast bf16 matmuls). `kwargs`: more EngineSpec fields."""
    return build_engine(
        EngineSpec(
            strategy=strategy,
            model_path=model_path,
            head="lm",
            device=torch.device("cpu"),
            optim=sc.OPTIM,
            fsdp=FSDPConfig(param_dtype="float32"),
            megatron=parallel,
            grad_clip=sc.GRAD_CLIP,
            total_training_steps=sc.TOTAL_STEPS,
            packing=True,
            max_tokens_per_micro_batch=sc.BUDGET,
            lora=lora,
            **kwargs,
        )
    )


def adapters(engine) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in engine.adapter_state().items()}


def record(
    strategy: str,
    parallel: MegatronConfig,
    paths: tuple[str, str],
    out: Path,
    rank: int,
    resume: bool = False,
    name: str = "",
    lora: LoraConfig = LORA,
    **kwargs,
) -> dict:
    """Every number the tests compare, for one engine on this rank (its data-parallel share of the rows)."""
    cfg = sc.role_config(*paths)
    engine = make_engine(strategy, cfg.actor.model_path, parallel, lora, **kwargs)
    actor = Actor(engine, cfg)
    batch, later = (
        rows.chunk(engine.dp_size)[engine.dp_rank] for rows in (sc.rollout_batch(), sc.rollout_batch(seed=1))
    )
    probe = batch.select(*MODEL_INPUTS)
    logits = sc.full_logits(engine)
    models = engine.chunks if strategy == "megatron" else [engine.model]
    result: dict = {
        "trainable": sorted(n for m in models for n, p in m.named_parameters() if p.requires_grad),
        "optimizer_params": sum(
            p.numel() for g in engine.optimizer.param_groups for p in g["params"] if p.requires_grad
        ),
        "logits0": engine.forward(probe, logits, 2)["logits"],
        "base_logits0": engine.without_adapter().forward(probe, logits, 2)["logits"],
        "adapters0": adapters(engine),
        "expert_adapters": engine.expert_adapters(),
        "base0": frozen(engine),
    }
    if strategy == "megatron":  # the layout built: (PP, sequence parallel, each chunk's layers)
        layout = engine.layout
        result["built"] = (layout.pp_size, layout.sequence_parallel, [len(c.decoder.layers) for c in models])
    result["step1"] = sc.step(actor, engine, batch)
    engine.scheduler_step()
    result["step2"] = sc.step(actor, engine, later)
    engine.scheduler_step()
    result["adapters2"] = adapters(engine)
    result["merged2"] = sc.weights(engine)
    result["logits2"] = engine.forward(probe, logits, 2)["logits"]
    result["log_probs2"] = actor.compute_log_probs(batch).tensors.to_dict()
    result["base_logits2"] = engine.without_adapter().forward(probe, logits, 2)["logits"]
    result["base2"] = frozen(engine)
    result["adapter_bytes"] = engine.save_adapter(out / f"{strategy}{name}-adapter{rank}")
    if resume:  # a checkpoint resumed into a fresh engine takes the continuing engine's step
        engine.save(out / "ckpt")
        result["continued"] = sc.step(actor, engine, batch)
        result["continued_adapters"] = adapters(engine)
        resumed = make_engine(strategy, cfg.actor.model_path, parallel, lora, **kwargs)
        resumed.load(out / "ckpt")
        result["resumed"] = sc.step(Actor(resumed, cfg), resumed, batch)
        result["resumed_adapters"] = adapters(resumed)
    return result


def worker(rank: int, world: int, init_method: str, paths: tuple[str, str], out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=300)
    )
    torch.set_num_threads(1)
    try:
        out = Path(out_dir)
        tp = MegatronConfig(tensor_parallel=world)
        result = {"megatron": record("megatron", tp, paths, out, rank, resume=world > 1)}
        if world == 1:
            result["fsdp"] = record("fsdp", tp, paths, out, rank)
        else:
            result["layouts"] = {}
            for name, parallel in LAYOUTS.items():
                _reset_parallel_state(parallel)
                result["layouts"][name] = record("megatron", parallel, paths, out, rank, name=f"-{name}")
        torch.save(result, out / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _reset_parallel_state(parallel: MegatronConfig) -> None:
    """megatron's parallel state is built once per process (engine/megatron/parallel.py); the next layout's
    sizes need it built again over the same gloo ranks (no engine of the last layout is used after this)."""
    import gc

    from megatron.core import parallel_state as ps

    gc.collect()
    want = (parallel.tensor_parallel, parallel.pipeline_parallel, parallel.virtual_pipeline)
    have = (
        ps.get_tensor_model_parallel_world_size(),
        ps.get_pipeline_model_parallel_world_size(),
        ps.get_virtual_pipeline_model_parallel_world_size() or 1,
    )
    if want != have:
        ps.destroy_model_parallel()


def run(world: int, paths: tuple[str, str], out_dir: Path) -> list[dict]:
    """`world` ranks (megatron TP = world); each rank's results."""
    out_dir.mkdir(parents=True, exist_ok=True)
    init_method = f"file://{out_dir / f'store-{uuid.uuid4().hex}'}"
    start_ranks(worker, (world, init_method, paths, str(out_dir)), world)
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world)]
