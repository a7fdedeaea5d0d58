"""Batch sizes and parallelism: every size must split evenly over the ranks that share it; micro-batch
sizes set where a token budget replaces them are a warning."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tandem.config.derived import data_parallel_size
from tandem.config.errors import Problems
from tandem.rollout_options import engines_with, named
from tandem.train_engine_options import facts as train_engine
from tandem.train_engine_options import model_parallel_size, settings

if TYPE_CHECKING:
    from tandem.config.schema import TandemConfig

logger = logging.getLogger(__name__)


def _divisors(n: int) -> str:
    return ", ".join(str(k) for k in range(1, n + 1) if n % k == 0) if n > 0 else "none"


def check_batch_sizes(cfg: TandemConfig, problems: Problems) -> None:
    world, dp = data_parallel_size(cfg)
    if dp == 0 or min(cfg.data.train_batch_size, cfg.rollout.n, world) < 1:
        return  # reported by check_parallel / check_values
    prompts, n = cfg.data.train_batch_size, cfg.rollout.n
    ranks = f"{dp} data-parallel ranks (trainer.nnodes x trainer.workers_per_node = {world}"
    ranks += ")" if dp == world else f", divided by the model-parallel size {world // dp})"
    if (prompts * n) % dp:
        problems.add(
            ("data.train_batch_size", "rollout.n", "trainer.workers_per_node"),
            f"data.train_batch_size={prompts} prompts x rollout.n={n} = {prompts * n} samples per step "
            f"does not split evenly over {ranks}. Make train_batch_size * n a multiple of {dp}",
        )
    roles = [("actor", cfg.actor.ppo_mini_batch_size, cfg.actor.micro_batch_size_per_rank)]
    critic = ("critic", cfg.critic.ppo_mini_batch_size, cfg.critic.micro_batch_size_per_rank)
    if cfg.critic.enable is True and critic[1:] != roles[0][1:]:  # the same sizes break the same rules
        roles.append(critic)
    for role, mini, micro in roles:
        if mini is None or micro is None or mini < 1 or micro < 1:
            continue
        if prompts % mini:
            problems.add(
                (f"{role}.ppo_mini_batch_size", "data.train_batch_size"),
                f"{role}.ppo_mini_batch_size={mini} does not divide data.train_batch_size={prompts} "
                f"(both count prompts), so a step would not split into whole mini-batches. "
                f"Use one of: {_divisors(prompts)}",
            )
            continue
        if (mini * n) % dp:
            problems.add(
                (f"{role}.ppo_mini_batch_size", "rollout.n", "trainer.workers_per_node"),
                f"{role} mini-batch of {role}.ppo_mini_batch_size={mini} prompts x rollout.n={n} = "
                f"{mini * n} samples does not split evenly over {ranks}. "
                f"Make {role}.ppo_mini_batch_size * rollout.n a multiple of {dp}",
            )
            continue
        per_rank = mini * n // dp
        if not cfg.actor.use_dynamic_bsz and per_rank % micro:
            problems.add(
                (f"{role}.micro_batch_size_per_rank", f"{role}.ppo_mini_batch_size"),
                f"{role}.micro_batch_size_per_rank={micro} does not divide the per-rank mini-batch of "
                f"{per_rank} samples ({role}.ppo_mini_batch_size={mini} x rollout.n={n} / {dp} ranks). "
                f"Use one of: {_divisors(per_rank)}, or set actor.use_dynamic_bsz=true",
            )
    budget = cfg.actor.max_tokens_per_micro_batch
    if cfg.actor.use_dynamic_bsz and budget is not None:
        # an SFT row is at most data.max_length tokens (set only in SFT configs), a rollout sample prompt + response
        if cfg.data.max_length is not None:
            longest, length_key, length = cfg.data.max_length, "data.max_length", "data.max_length"
        else:
            longest = cfg.data.max_prompt_length + cfg.data.max_response_length
            length_key, length = (
                "data.max_response_length",
                "data.max_prompt_length + data.max_response_length",
            )
        if budget < longest:
            problems.add(
                ("actor.max_tokens_per_micro_batch", length_key),
                f"actor.max_tokens_per_micro_batch={budget} cannot hold one full-length sample "
                f"({length} = {longest} tokens). Raise it to at least {longest}",
            )
    warning = unused_micro_batch_warning(cfg, problems)
    if warning is not None:
        logger.warning("%s", warning)


def _micro_batch_keys(cfg: TandemConfig) -> dict[str, int | None]:
    """The sample-count micro-batch sizes of the roles this config runs (a token budget replaces each)."""
    keys = {
        "actor.micro_batch_size_per_rank": cfg.actor.micro_batch_size_per_rank,
        "rollout.log_prob_micro_batch_size_per_rank": cfg.rollout.log_prob_micro_batch_size_per_rank,
    }
    if cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward:
        keys["reference.log_prob_micro_batch_size_per_rank"] = (
            cfg.reference.log_prob_micro_batch_size_per_rank
        )
    if cfg.critic.enable is True:
        keys["critic.micro_batch_size_per_rank"] = cfg.critic.micro_batch_size_per_rank
    if cfg.reward.reward_model.enable:
        keys["reward.reward_model.micro_batch_size_per_rank"] = (
            cfg.reward.reward_model.micro_batch_size_per_rank
        )
    return keys


def unused_micro_batch_warning(cfg: TandemConfig, problems: Problems) -> str | None:
    """With actor.use_dynamic_bsz on, the micro-batch sizes the user set are not used: a warning naming them,
    else None. "Set" is what `problems` noted: the overrides (config_from_dict passes their notes to the
    checks; a key of the user's own YAML file is not seen here, nor a preset's). verl's use_dynamic_bsz is
    off by default, so a verl script's micro-batch sizes land here."""
    if not cfg.actor.use_dynamic_bsz:
        return None
    set_here = []
    for key, value in _micro_batch_keys(cfg).items():
        note = problems.note_for(key)
        if note is not None and not note.startswith("in preset"):
            set_here.append(f"{key}={value} ({note})")
    if not set_here:
        return None
    budget = cfg.actor.max_tokens_per_micro_batch
    budget_text = f"{budget} tokens" if budget is not None else "null: the default for the device"
    return (
        f"{', '.join(set_here)} {'is' if len(set_here) == 1 else 'are'} not used: actor.use_dynamic_bsz=true "
        f"(Tandem's default; verl's is false) cuts every role's micro-batches by a token budget per rank "
        f"(actor.max_tokens_per_micro_batch={budget_text}), and the token budget wins. To cut "
        "micro-batches by these sample counts instead, set actor.use_dynamic_bsz=false"
    )


def check_parallel(cfg: TandemConfig, problems: Problems) -> None:
    world = cfg.trainer.nnodes * cfg.trainer.workers_per_node
    if world < 1:
        return
    a, r = cfg.actor, cfg.rollout
    # the training engine's sizes, in its own section (actor.fsdp or actor.megatron)
    training, section = train_engine(a.strategy), settings(a)
    where = f"actor.{training.section}"
    sizes = {name: getattr(section, name) for name in training.model_parallel}
    size = model_parallel_size(a)
    if size >= 1 and world % size:
        what = (
            f"{where}.{next(iter(sizes))}={size}"
            if len(sizes) == 1
            else f"{where} {' x '.join(f'{k}={v}' for k, v in sizes.items())} = {size}"
        )
        problems.add(
            (*(f"{where}.{k}" for k in sizes), "trainer.workers_per_node"),
            f"{what} does not divide the world size {world} (trainer.nnodes x trainer.workers_per_node)",
        )
    if training.pipeline and section.virtual_pipeline > 1 and section.pipeline_parallel == 1:
        problems.add(
            (f"{where}.virtual_pipeline", f"{where}.pipeline_parallel"),
            f"{where}.virtual_pipeline={section.virtual_pipeline} needs {where}.pipeline_parallel > 1 "
            "(model chunks interleave over the pipeline stages)",
        )
    # experts are not split by TP (expert tensor parallel 1): their ranks are a pipeline stage's
    stages = section.pipeline_parallel if training.pipeline else 1
    expert_pool = world // max(1, stages)
    if (
        training.expert_parallel
        and section.expert_parallel >= 1
        and world % max(1, stages) == 0
        and expert_pool % section.expert_parallel
    ):
        problems.add(
            (f"{where}.expert_parallel", "trainer.workers_per_node"),
            f"{where}.expert_parallel={section.expert_parallel} does not divide world size / "
            f"pipeline_parallel = {expert_pool}",
        )
    if r.tensor_parallel >= 1 and world % r.tensor_parallel:
        problems.add(
            ("rollout.tensor_parallel", "trainer.workers_per_node"),
            f"rollout.tensor_parallel={r.tensor_parallel} does not divide the world size {world}: "
            "each inference engine spans tensor_parallel ranks",
        )
    engine = named(r.engine)  # None for auto: the start-up check asks the engine it resolves to
    if engine is not None and not engine.tensor_parallel and r.tensor_parallel != 1:
        problems.add(
            ("rollout.tensor_parallel", "rollout.engine"),
            f"rollout.engine={r.engine} generates on each rank alone: set rollout.tensor_parallel=1 or use "
            + " or ".join(engines_with("tensor_parallel")),
        )
    if engine is not None and not engine.cpu and cfg.trainer.device == "cpu":
        problems.add(
            ("rollout.engine", "trainer.device"),
            f"rollout.engine={r.engine} has no CPU path: use rollout.engine={' or '.join(engines_with('cpu'))} "
            "on trainer.device=cpu",
        )
