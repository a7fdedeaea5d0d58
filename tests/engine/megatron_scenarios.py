"""What each spawned rank does in the megatron engine tests; the parent compares with FSDP and transformers.

A layout (tensor_parallel, pipeline_parallel) over `world` gloo ranks builds the real roles (Actor,
Reference, Critic, RewardModel) on MegatronEngine and records, on every rank: the full weights the engine
streams out, the logits (vocabulary slices gathered), the actor's log-probs and entropy, the reference's
log-probs (a frozen engine), the SFT negative log-likelihood, the critic's values, the reward model's scores, one optimizer step of the actor's and the critic's
real loss functions (loss, grad norm, weights after), an export, and a checkpoint resumed into a fresh
engine. Each data-parallel rank takes its own share of the rows, as Dispatch.MP hands them out.
Each rank writes `rank{r}.pt` into the output folder.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from roles.roles_helpers import rollout_rows  # tests/ is on sys.path (pytest's rootdir)
from tandem.batch import Batch
from tandem.config import load_config
from tandem.config.schema import FSDPConfig, MegatronConfig, OptimConfig, TandemConfig
from tandem.engine import EngineSpec, build_engine
from tandem.models.tp_cuts import TensorParallelCuts
from tandem.roles.actor import Actor
from tandem.roles.common import MODEL_INPUTS, global_counts, response_log_probs
from tandem.roles.critic import Critic
from tandem.roles.reference import Reference
from tandem.roles.reward_model import RewardModel
from tandem.roles.sft import SFT

from .ranks import start_ranks

PROMPT, RESPONSE = 5, 7
# (prompt tokens, response tokens) per sample; an empty response included.
LENGTHS = [(5, 7), (2, 3), (4, 0), (3, 7), (1, 1), (5, 4)]
OPTIM = OptimConfig(lr=1e-3, weight_decay=0.01, warmup_steps=1, lr_scheduler="cosine", min_lr_ratio=0.1)
TOTAL_STEPS = 10
GRAD_CLIP = 0.5  # below the first step's norm: clipping is part of what is compared
BUDGET = 24  # tokens per micro-batch: several micro-batches per step


def role_config(model_path: str, critic_path: str) -> TandemConfig:
    """The actor's PPO loss with every term on (KL to a reference, entropy bonus, truncated IS)."""
    return load_config(
        "ppo",
        [
            f"actor.model_path={model_path}",
            f"critic.model_path={critic_path}",
            "trainer.device=cpu",
            "data.train_batch_size=2",
            f"data.max_prompt_length={PROMPT}",
            f"data.max_response_length={RESPONSE}",
            "rollout.n=3",
            "actor.ppo_mini_batch_size=2",
            "actor.use_kl_loss=true",
            "actor.kl_loss_coef=0.1",
            "actor.entropy_coeff=0.01",
            "rollout.is_correction=token",
            "actor.router_aux_loss_coef=0.5",  # mixture-of-experts models: a balance term that moves the update
        ],
    )


def rollout_batch(seed: int = 0) -> Batch:
    """Rollout-shaped rows with the keys updates read (left-padded prompts, right-padded responses)."""
    return rollout_rows(LENGTHS, PROMPT, RESPONSE, seed)


def make_engine(strategy: str, model_path: str, head: str, parallel: MegatronConfig, optim=OPTIM, **kwargs):
    budget = kwargs.pop("budget", BUDGET)
    return build_engine(
        EngineSpec(
            strategy=strategy,
            model_path=model_path,
            head=head,
            device=torch.device("cpu"),
            optim=optim,
            fsdp=FSDPConfig(),
            megatron=parallel,
            grad_clip=GRAD_CLIP,
            total_training_steps=TOTAL_STEPS,
            packing=kwargs.pop("packing", True),
            max_tokens_per_micro_batch=budget,
            router_aux_loss_coef=kwargs.pop("router_aux_loss_coef", 0.5),
            **kwargs,
        )
    )


# The invariant batch: 16 rows of uneven lengths, so that both micro-batch kinds make several pipeline groups
# (the interleaved schedule's steady state, where a stage sends and receives both ways at once).
INVARIANT_LENGTHS = [(5, 7), (1, 2), (3, 7), (2, 5), (4, 1), (5, 6), (2, 7), (1, 3)] * 2
# (name, packing, token budget or None for a fixed number of rows, rows per micro-batch of the update)
MICRO_BATCHES = (("budget", True, BUDGET, 2), ("fixed", False, None, 2))


def invariant_config(model_path: str) -> TandemConfig:
    """GRPO's actor loss with a KL loss (k3) to a reference, no entropy bonus: with zero advantages and the policy
    that made the old log-probs, every loss term and its gradient is zero."""
    return load_config(
        "grpo",
        [
            f"actor.model_path={model_path}",
            "trainer.device=cpu",
            "data.train_batch_size=4",
            f"data.max_prompt_length={PROMPT}",
            f"data.max_response_length={RESPONSE}",
            "rollout.n=4",
            "actor.ppo_mini_batch_size=4",
            "actor.use_kl_loss=true",
            "actor.kl_loss_coef=0.1",
            "actor.kl_loss_type=low_var_kl",
            "actor.entropy_coeff=0",
            "actor.use_dynamic_bsz=false",  # the engines below get their own token budget, or none
            "rollout.log_prob_micro_batch_size_per_rank=3",  # the forward's micro-batches differ from the update's
        ],
    )


def zero_advantage_invariant(strategy: str, parallel: MegatronConfig, model_path: str) -> dict:
    """Per micro-batch kind: old log-probs from a forward, then one update with zero advantages whose reference
    and old log-probs are those: the update's log-probs must equal the old ones (`lp_diff`, the largest
    difference at a response token), so KL loss, ppo_kl and the gradient are 0 to float rounding. The engine's
    learning rate is 0, so the weights stay; it then takes a step with random advantages on the same micro-batches
    (`step`: loss and gradient norm), compared across layouts with FSDP2's."""
    cfg = invariant_config(model_path)
    batch = rollout_rows(INVARIANT_LENGTHS, PROMPT, RESPONSE, seed=3)
    result = {}
    for name, packing, budget, micro in MICRO_BATCHES:
        # learning rate 0: the first step's gradient is rounding noise, which Adam's first step would scale up to
        # a move of about lr in every weight; the step after it is compared by its loss and gradient norm
        optim = dataclasses.replace(OPTIM, lr=0.0)
        engine = make_engine(
            strategy,
            model_path,
            "lm",
            parallel,
            optim,
            budget=budget,
            packing=packing,
            router_aux_loss_coef=0.0,
        )
        share = batch.chunk(engine.dp_size)[engine.dp_rank]
        actor = Actor(engine, cfg)
        old = actor.compute_log_probs(share, with_entropy=False)["old_log_probs"]
        advantages = share["advantages"]
        for key in ("old_log_probs", "ref_log_probs", "rollout_log_probs"):
            share[key] = old
        share["advantages"] = torch.zeros_like(advantages)
        inner = actor._loss_fn(global_counts(engine, share["response_mask"]), share)

        def loss_fn(output, micro: Batch, inner=inner, temperature=actor.temperature):
            loss, metrics = inner(output, micro)
            log_probs, _ = response_log_probs(output, micro["responses"], temperature, with_entropy=False)
            mask = micro["response_mask"].bool()
            diff = (log_probs.detach() - micro["old_log_probs"])[mask].abs()
            metrics["lp_diff"] = float(diff.max()) if diff.numel() else 0.0
            return loss, metrics

        zero = dataclasses.asdict(engine.train_step(share, loss_fn, micro))
        result[name] = {
            "old_log_probs": old,
            "grad_norm": zero["grad_norm"],
            **{key: max(abs(v) for v in zero["metrics"][key]) for key in ("kl_loss", "ppo_kl", "lp_diff")},
        }
        share["advantages"] = advantages
        result[name]["step"] = step(actor, engine, share)
    return result


def transformers_logits(model_path: str, batch: Batch) -> torch.Tensor:
    """The unsharded transformers model's float32 logits of `batch` [b, T, V]: what the engines are held to."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
            use_cache=False,
        ).logits


def full_logits(engine):
    """A forward function returning every position's logits over the whole vocabulary [b, T, V] (0 where a
    packed forward computed nothing): a tensor-parallel engine's vocabulary slices are gathered."""

    def fn(output, micro: Batch) -> dict[str, torch.Tensor]:
        b, width = output.shape
        values, where = output.at(torch.arange(width).expand(b, width))
        vp = output.vocab_parallel
        if vp is not None:
            slices = [torch.empty_like(values) for _ in range(vp.size)]
            dist.all_gather(slices, values.contiguous(), group=vp.group)
            values = torch.cat(slices, dim=-1)
        out = values.new_zeros(b, width, values.shape[-1])
        out[where] = values
        return {"logits": out}

    return fn


def weights(engine) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in engine.state_dict_iter()}


def step(role, engine, batch: Batch) -> dict:
    """One optimizer step of `role`'s real loss on `batch` (this rank's share)."""
    counts = global_counts(engine, batch["response_mask"])
    loss_fn = (
        role._loss_fn(counts, batch) if isinstance(role, Actor) else role._loss_fn(counts)
    )  # run_update's
    result = engine.train_step(batch, loss_fn, 2)
    return dataclasses.asdict(result)


def run_roles(strategy: str, parallel: MegatronConfig, cfg: TandemConfig, out: Path, resume: bool) -> dict:
    """Every number the tests compare, for one engine strategy / layout on this rank."""
    batch = rollout_batch()
    actor_engine = make_engine(strategy, cfg.actor.model_path, "lm", parallel)
    share = batch.chunk(actor_engine.dp_size)[actor_engine.dp_rank]
    actor = Actor(actor_engine, cfg)
    result: dict = {"dispatch_info": actor_engine.dispatch_info(), "state0": weights(actor_engine)}
    if (
        strategy == "megatron" and actor_engine.layout.tp_size > 1
    ):  # into a rollout engine of the same TP size
        cuts = TensorParallelCuts(actor_engine.config, actor_engine.layout.tp_size, dist.get_world_size())
        result["cuts0"] = {n: (p.clone(), c) for n, p, c, _ in actor_engine.state_dict_cuts(cuts.cuts)}
    if strategy == "megatron":  # which norms the layers were built with (sequence parallel: marked ones)
        chunks = actor_engine.chunks
        result["sequence_parallel"] = chunks[0].config.sequence_parallel
        result["norms"] = {
            type(m).__name__ for c in chunks for m in c.modules() if "Norm" in type(m).__name__
        }
        result["chunk_layers"] = [len(c.decoder.layers) for c in chunks]
    result["invariant"] = zero_advantage_invariant(strategy, parallel, cfg.actor.model_path)
    result["log_probs"] = actor.compute_log_probs(share).tensors.to_dict()
    result["logits"] = actor_engine.forward(share.select(*MODEL_INPUTS), full_logits(actor_engine), 2)[
        "logits"
    ]
    result["sft_nll"] = SFT(actor_engine, cfg).nll(share)["nll_sum"]
    reference = Reference(make_engine(strategy, cfg.actor.model_path, "lm", parallel, optim=None), cfg)
    result["ref_log_probs"] = reference.compute_ref_log_probs(share)["ref_log_probs"]
    result["actor_step"] = step(actor, actor_engine, share)
    recomputing = make_engine(strategy, cfg.actor.model_path, "lm", parallel, activation_checkpointing=True)
    result["checkpointed_actor_step"] = step(Actor(recomputing, cfg), recomputing, share)
    del recomputing
    result["lr_after"] = actor_engine.scheduler_step()
    result["state1"] = weights(actor_engine)

    critic_engine = make_engine(strategy, cfg.critic.model_path, "value", parallel)
    critic = Critic(critic_engine, cfg)
    result["critic_state0"] = weights(critic_engine)
    result["values"] = critic.compute_values(share).tensors.to_dict()
    result["rm_scores"] = RewardModel(critic_engine, cfg).compute_scores(share)["rm_scores"]
    result["critic_step"] = step(critic, critic_engine, share)
    result["critic_state1"] = weights(critic_engine)
    if not resume:
        return result

    actor_engine.export_hf(out / "export")
    actor_engine.save(out / "ckpt")
    later = rollout_batch(seed=1).chunk(actor_engine.dp_size)[actor_engine.dp_rank]
    result["continued_step"] = step(actor, actor_engine, later)
    result["continued_state"] = weights(actor_engine)
    resumed = make_engine(strategy, cfg.actor.model_path, "lm", parallel)
    resumed.load(out / "ckpt")
    result["resumed_global_step"] = resumed.global_step
    result["resumed_lr"] = resumed.lr
    result["resumed_step"] = step(Actor(resumed, cfg), resumed, later)
    result["resumed_state"] = weights(resumed)
    # One row for the whole step: with 2 data-parallel ranks one of them has none and runs a dummy row
    # (under expert parallel it must still join every all-to-all, adding nothing)
    one = rollout_batch(seed=2)[:1]
    result["one_row_step"] = step(
        Actor(resumed, cfg), resumed, one.split(rows_per_rank(1, resumed))[resumed.dp_rank]
    )
    return result


def rows_per_rank(rows: int, engine) -> list[int]:
    return [rows if r == 0 else 0 for r in range(engine.dp_size)]


def worker(
    rank: int,
    world: int,
    init_method: str,
    strategy: str,
    layout: tuple,
    paths: tuple[str, str],
    out_dir: str,
):
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=300)
    )
    torch.set_num_threads(1)
    try:
        cfg = role_config(*paths)
        tp, pp, sp, vp, ep, cp, overrides = (*layout, *(False, 1, 1, 1, {})[len(layout) - 2 :])
        parallel = MegatronConfig(
            override_transformer_config=overrides,
            tensor_parallel=tp,
            pipeline_parallel=pp,
            sequence_parallel=sp,
            virtual_pipeline=vp,
            expert_parallel=ep,
            context_parallel=cp,
        )
        out = Path(out_dir)
        result = run_roles(strategy, parallel, cfg, out, resume=True)
        torch.save(result, out / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_layout(name: str, layouts: dict, paths: tuple[str, str], factory: Any, prefix: str) -> dict:
    """A test module's `layout` fixture: layout `name` of `layouts` run in a fresh folder of `factory`."""
    out = factory.mktemp(f"{prefix}_{name}")
    parallel, world = layouts[name]
    return {"name": name, "ranks": run(parallel, world, paths, out), "out": out}


def run(
    layout: tuple, world: int, paths: tuple[str, str], out_dir: Path, strategy: str = "megatron"
) -> list[dict]:
    """Spawn `world` ranks with megatron (tensor, pipeline[, sequence_parallel[, virtual_pipeline[, expert]]]) `layout`
    (or FSDP); each rank's results."""
    out_dir.mkdir(parents=True, exist_ok=True)
    init_method = f"file://{out_dir / f'store-{uuid.uuid4().hex}'}"
    start_ranks(worker, (world, init_method, strategy, layout, paths, str(out_dir)), world)
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world)]


def gpu_worker(rank: int, init_method: str, model_path: str, out_dir: str) -> None:
    """One CUDA rank (NCCL): bfloat16 compute, a training step, offload and onload (GPU only)."""
    dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=1)
    try:
        device = torch.device("cuda", 0)
        engine = build_engine(
            EngineSpec(
                strategy="megatron",
                model_path=model_path,
                head="lm",
                device=device,
                optim=OPTIM,
                fsdp=FSDPConfig(),
                megatron=MegatronConfig(),
                grad_clip=GRAD_CLIP,
                total_training_steps=TOTAL_STEPS,
                packing=True,
                max_tokens_per_micro_batch=BUDGET,
            )
        )
        batch = rollout_batch()
        logits = full_logits(engine)
        result: dict = {"logits": engine.forward(batch.select(*MODEL_INPUTS), logits, 2)["logits"].float()}
        result["param_dtypes"] = {p.dtype for model in engine.models for p in model.parameters()}
        counts = global_counts(engine, batch["response_mask"])
        cfg = role_config(model_path, model_path)
        result["step"] = dataclasses.asdict(
            engine.train_step(batch, Actor(engine, cfg)._loss_fn(counts, batch), 2)
        )
        before = engine.forward(batch.select(*MODEL_INPUTS), logits, 2)["logits"]
        allocated = torch.cuda.memory_allocated(device)
        engine.offload()
        result["freed_bytes"] = allocated - torch.cuda.memory_allocated(device)
        try:
            engine.forward(batch.select(*MODEL_INPUTS), logits, 2)
        except RuntimeError as err:
            result["offloaded_forward_error"] = str(err)
        engine.onload()
        after = engine.forward(batch.select(*MODEL_INPUTS), logits, 2)["logits"]
        result["onload_unchanged"] = torch.equal(before, after)
        result["step_after_onload"] = dataclasses.asdict(
            engine.train_step(batch, Actor(engine, cfg)._loss_fn(counts, batch), 2)
        )
        torch.save(result, Path(out_dir) / "gpu-rank0.pt")
    finally:
        dist.destroy_process_group()


def run_gpu(model_path: str, out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    init_method = f"file://{out_dir / f'store-{uuid.uuid4().hex}'}"
    start_ranks(gpu_worker, (init_method, model_path, str(out_dir)), 1)
    return torch.load(out_dir / "gpu-rank0.pt", weights_only=False)
