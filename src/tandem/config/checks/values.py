"""Single settings, section by section: ranges, positive counts, files that must exist."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from tandem.config.checks.algorithm import check_policy_loss_keys
from tandem.config.checks.common import at_least, non_finite, within
from tandem.config.checks.rollout import check_sampling
from tandem.config.errors import Problems
from tandem.models.chat_template import template_kwargs_problems
from tandem.rollout_options import named
from tandem.train_engine_options import engines_with as train_engines_with
from tandem.train_engine_options import facts as train_engine

if TYPE_CHECKING:
    from tandem.config.schema import TandemConfig


def check_values(cfg: TandemConfig, problems: Problems) -> None:
    """Every setting on its own (and the few that bound one another within a section)."""
    for key, value in non_finite(cfg):  # loaded configs cannot hold these; one built in Python can
        problems.add(key, f"{key}={value}: only finite numbers are allowed")
    check_counts(cfg, problems)
    check_chat_template_kwargs(cfg, problems)
    check_trainer_values(cfg, problems)
    check_sampling(cfg, problems)
    check_optimizers(cfg, problems)
    check_model_values(cfg, problems)
    check_reward_values(cfg, problems)


def check_counts(cfg: TandemConfig, problems: Problems) -> None:
    """Sizes, counts and steps that must be >= 1, in every section."""
    d, a, r, c, t = cfg.data, cfg.actor, cfg.rollout, cfg.critic, cfg.trainer
    for key, value in [
        ("data.max_prompt_length", d.max_prompt_length),
        ("data.max_response_length", d.max_response_length),
        ("data.train_batch_size", d.train_batch_size),
        ("data.val_batch_size", d.val_batch_size),
        ("data.max_length", d.max_length),
        ("actor.ppo_mini_batch_size", a.ppo_mini_batch_size),
        ("actor.micro_batch_size_per_rank", a.micro_batch_size_per_rank),
        ("actor.max_tokens_per_micro_batch", a.max_tokens_per_micro_batch),
        ("actor.ppo_epochs", a.ppo_epochs),
        ("actor.fsdp.sequence_parallel", a.fsdp.sequence_parallel),
        (
            "actor.fsdp.lm_head_chunk_tokens",
            None if a.fsdp.lm_head_chunk_tokens == "auto" else a.fsdp.lm_head_chunk_tokens,
        ),
        ("actor.megatron.tensor_parallel", a.megatron.tensor_parallel),
        ("actor.megatron.pipeline_parallel", a.megatron.pipeline_parallel),
        ("actor.megatron.virtual_pipeline", a.megatron.virtual_pipeline),
        ("actor.megatron.context_parallel", a.megatron.context_parallel),
        ("actor.megatron.expert_parallel", a.megatron.expert_parallel),
        ("rollout.n", r.n),
        ("rollout.val.n", r.val.n),
        ("rollout.tensor_parallel", r.tensor_parallel),
        ("rollout.log_prob_micro_batch_size_per_rank", r.log_prob_micro_batch_size_per_rank),
        ("reference.log_prob_micro_batch_size_per_rank", cfg.reference.log_prob_micro_batch_size_per_rank),
        ("reward.reward_model.micro_batch_size_per_rank", cfg.reward.reward_model.micro_batch_size_per_rank),
        ("trainer.total_epochs", t.total_epochs),
        ("trainer.total_training_steps", t.total_training_steps),
        ("trainer.nnodes", t.nnodes),
        ("trainer.workers_per_node", t.workers_per_node),
        ("trainer.max_checkpoints_to_keep", t.max_checkpoints_to_keep),
        ("rollout.nnodes", r.nnodes),
        ("rollout.workers_per_node", r.workers_per_node),
        ("rollout.weight_bucket_mb", r.weight_bucket_mb),
    ]:
        at_least(problems, key, value, 1)
    for name in ("ppo_mini_batch_size", "micro_batch_size_per_rank", "ppo_epochs"):
        if getattr(c, name) != getattr(a, name):  # an inherited bad value is the actor's problem, said once
            at_least(problems, f"critic.{name}", getattr(c, name), 1)


def check_chat_template_kwargs(cfg: TandemConfig, problems: Problems) -> None:
    """data.chat_template_kwargs: the template's own variables (models/chat_template.py), and only where a template
    renders (not with data.chat_template=plain or none). Whether the template reads a name is not known until it
    renders: a name it does not read changes nothing, as in verl."""
    d = cfg.data
    for message in template_kwargs_problems("data.chat_template_kwargs", d.chat_template_kwargs):
        problems.add("data.chat_template_kwargs", message)
    if d.chat_template_kwargs and d.chat_template in ("plain", "none"):
        problems.add(
            ("data.chat_template_kwargs", "data.chat_template"),
            f"data.chat_template_kwargs {d.chat_template_kwargs} are variables of the tokenizer's chat template, "
            f"which data.chat_template={d.chat_template} does not use: set data.chat_template=auto, or drop them",
        )


def check_trainer_values(cfg: TandemConfig, problems: Problems) -> None:
    """trainer.*: schedules, workers, streaming queue, profiling, resume."""
    t = cfg.trainer
    for key, value in [("trainer.save_freq", t.save_freq), ("trainer.test_freq", t.test_freq)]:
        if value == 0 or value < -1:
            problems.add(key, f"{key}={value}: use a number of steps >= 1, or -1 for never")
    at_least(problems, "trainer.critic_warmup", t.critic_warmup, 0)
    if t.backend == "inprocess" and t.nnodes * t.workers_per_node != 1:
        problems.add(
            "trainer.backend",
            f"trainer.backend=inprocess runs one rank in this process, but trainer.nnodes x "
            f"trainer.workers_per_node = {t.nnodes * t.workers_per_node}; set trainer.workers_per_node=1 "
            "and trainer.nnodes=1, or use trainer.backend=ray",
        )
    if t.cpus_per_worker <= 0:
        problems.add("trainer.cpus_per_worker", f"trainer.cpus_per_worker={t.cpus_per_worker} must be > 0")
    if t.max_staleness < 0:
        problems.add(
            "trainer.max_staleness",
            f"trainer.max_staleness={t.max_staleness} must be >= 0 (0 = train only on samples of the current weights)",
        )
    if t.stream_queue_batches < 1:
        problems.add(
            "trainer.stream_queue_batches",
            f"trainer.stream_queue_batches={t.stream_queue_batches} must be >= 1 (2 lets the pool generate the "
            "next batch while one trains)",
        )
    if cfg.trainer.worker_timeout_s <= 0:
        problems.add(
            "trainer.worker_timeout_s",
            f"trainer.worker_timeout_s={cfg.trainer.worker_timeout_s} must be > 0 seconds",
        )
    prof = t.profile
    if any(step < 1 for step in prof.steps) or any(rank < 0 for rank in prof.ranks):
        problems.add(
            ("trainer.profile.steps", "trainer.profile.ranks"),
            f"trainer.profile.steps={prof.steps} must be training steps >= 1 and trainer.profile.ranks="
            f"{prof.ranks} ranks >= 0 ([] = every rank)",
        )
    if prof.tool == "nsys" and t.device == "cpu":
        problems.add(
            ("trainer.profile.tool", "trainer.device"),
            "trainer.profile.tool=nsys profiles CUDA kernels with Nsight Systems, and trainer.device=cpu; use "
            "trainer.profile.tool=torch (torch.profiler traces) on a CPU run",
        )
    if prof.steps and not prof.activities:
        problems.add(
            "trainer.profile.activities", "trainer.profile.activities is empty: give cpu and/or cuda"
        )
    if t.peak_flops is not None and t.peak_flops <= 0:
        problems.add(
            "trainer.peak_flops",
            f"trainer.peak_flops={t.peak_flops} must be > 0 FLOP/s (e.g. 989e12 for an H100 in bf16), or null "
            "to look it up / measure it",
        )
    if t.resume not in ("auto", "disable") and not Path(t.resume).expanduser().exists():
        problems.add(
            "trainer.resume",
            f"trainer.resume='{t.resume}' is not a checkpoint path; use auto, "
            "disable, or an existing checkpoint folder",
        )


def check_optimizers(cfg: TandemConfig, problems: Problems) -> None:
    """actor.optim and critic.optim, and the gradient clipping of both."""
    a, c = cfg.actor, cfg.critic
    for name, optim in (("actor", a.optim), ("critic", c.optim)):
        if optim.lr <= 0:
            problems.add(f"{name}.optim.lr", f"{name}.optim.lr={optim.lr} must be > 0")
        at_least(problems, f"{name}.optim.weight_decay", optim.weight_decay, 0)
        for i, beta in enumerate(optim.betas):
            within(problems, f"{name}.optim.betas[{i}]", beta, 0, 1, "[)")
        if optim.eps <= 0:
            problems.add(f"{name}.optim.eps", f"{name}.optim.eps={optim.eps} must be > 0")
        at_least(problems, f"{name}.optim.warmup_steps", optim.warmup_steps, 0)
        within(problems, f"{name}.optim.warmup_ratio", optim.warmup_ratio, 0, 1, "[)")
        within(problems, f"{name}.optim.min_lr_ratio", optim.min_lr_ratio, 0, 1, "[]")
    for key, clip in (("actor.grad_clip", a.grad_clip), ("critic.grad_clip", c.grad_clip)):
        if clip is not None and clip <= 0:
            problems.add(key, f"{key}={clip} must be > 0; use null for no clipping")


def check_router_replay(cfg: TandemConfig, problems: Problems) -> None:
    """actor.router_replay: R3 needs the rollout engine's routing, which no rollout engine here returns (the hf
    engine records none; vLLM 0.32 returns it only from its Model Runner V2, which needs Triton, and on vLLM's
    CPU build Triton's CPU backend, which released triton lacks: tests/rollout/test_vllm_routed_experts.py fails
    when that changes); R2 records in the old-log-prob pass, which bypass mode does not run, and is not built
    with recomputed layers under pipeline parallel (the megatron engine refuses it as well)."""
    mode = cfg.actor.router_replay
    if mode == "R3":
        problems.add(
            "actor.router_replay",
            "actor.router_replay=R3 replays the experts the rollout engine routed each token to; Tandem's rollout "
            "engines do not return them (the hf engine records no routing; vLLM returns routed experts only from "
            "its Model Runner V2, which needs Triton, on vLLM's CPU build Triton's CPU backend, and Tandem's vLLM "
            "engine does not ask for them; there is no SGLang engine): use R2 (the old-log-prob pass's routing) "
            "or off",
        )
    if mode == "R2" and cfg.algorithm.rollout_correction.bypass_mode:
        problems.add(
            "actor.router_replay",
            "actor.router_replay=R2 replays the routing of the old-log-prob pass, which "
            "algorithm.rollout_correction.bypass_mode=true does not run: turn one of them off",
        )
    stages = cfg.actor.megatron.pipeline_parallel if train_engine(cfg.actor.strategy).pipeline else 1
    recompute = cfg.actor.megatron.override_transformer_config.get("recompute_granularity")
    if mode == "R2" and stages > 1 and (cfg.actor.activation_checkpointing or recompute):
        # a recomputed router (in backward) would replay the experts of the micro-batch whose forward ran last
        what = (
            "actor.activation_checkpointing=true"
            if cfg.actor.activation_checkpointing
            else f"actor.megatron.override_transformer_config.recompute_granularity={recompute}"
        )
        problems.add(
            "actor.router_replay",
            f"actor.router_replay=R2 with {what} and actor.megatron.pipeline_parallel={stages} is not built (a "
            "layer recomputed in backward would replay another micro-batch's experts): turn one of them off",
        )


def check_model_values(cfg: TandemConfig, problems: Problems) -> None:
    """The actor's and the critic's own settings: LoRA, clip ratios, loss coefficients."""
    a, c = cfg.actor, cfg.critic
    at_least(problems, "actor.router_aux_loss_coef", a.router_aux_loss_coef, 0)
    check_router_replay(cfg, problems)
    for role, lora in (("actor", a.lora), ("critic", c.lora)):
        at_least(problems, f"{role}.lora.rank", lora.rank, 0)
        if lora.rank <= 0:
            continue
        if lora.alpha <= 0:
            problems.add(f"{role}.lora.alpha", f"{role}.lora.alpha={lora.alpha} must be > 0")
        within(problems, f"{role}.lora.dropout", lora.dropout, 0, 1, "[)")
        if not lora.target_modules:
            problems.add(
                f"{role}.lora.target_modules", f"{role}.lora.target_modules is empty; use [all-linear]"
            )
        # megatron: the actor's adapters sit inside megatron's linears (engine/megatron/lora.py), without dropout
        engine = train_engine(a.strategy)
        if not engine.critic_lora and role == "critic":
            problems.add(
                ("critic.lora.rank", "actor.strategy"),
                f"critic.lora.rank={lora.rank} with actor.strategy={a.strategy}: LoRA on {a.strategy} is built for "
                f"the actor; train the critic whole (critic.lora.rank=0) or use actor.strategy="
                f"{' or '.join(train_engines_with('critic_lora'))}",
            )
        elif not engine.lora_dropout and lora.dropout > 0:
            problems.add(
                ("actor.lora.dropout", "actor.strategy"),
                f"actor.lora.dropout={lora.dropout} with actor.strategy={a.strategy}: dropout on the adapters is "
                "built on FSDP2 only; set it to 0 or use actor.strategy="
                + " or ".join(train_engines_with("lora_dropout")),
            )
    if a.lora.syncs_adapters:
        engine = named(cfg.rollout.engine)  # None for auto: the start-up check asks the engine it resolves to
        if engine is not None and not engine.serves_adapters:
            problems.add(
                ("actor.lora.rollout_sync", "rollout.engine"),
                "actor.lora.rollout_sync=adapter needs vLLM's LoRA support (rollout.engine=vllm or auto); "
                f"the {cfg.rollout.engine} engine takes merged weights: use rollout_sync=merged",
            )
        if a.lora.rank > 512:
            problems.add(
                "actor.lora.rank",
                f"actor.lora.rank={a.lora.rank} with rollout_sync=adapter: vLLM serves ranks up to 512",
            )
    if (
        a.policy_loss == "cispo"
    ):  # clips a detached weight, not the loss: low >= 1 leaves no lower clip (verl's 10)
        at_least(
            problems, "actor.clip_ratio_low", a.clip_ratio_low, 0, " (cispo: 1 or more means no lower clip)"
        )
    else:
        within(problems, "actor.clip_ratio_low", a.clip_ratio_low, 0, 1, "[)")
    at_least(problems, "actor.clip_ratio_high", a.clip_ratio_high, 0)
    if a.clip_ratio_c <= 1:
        problems.add(
            "actor.clip_ratio_c",
            f"actor.clip_ratio_c={a.clip_ratio_c} must be > 1: it bounds the loss "
            "of negative-advantage tokens at clip_ratio_c * advantage (3.0 is usual)",
        )
    for key, tau in (("actor.tau_pos", a.tau_pos), ("actor.tau_neg", a.tau_neg)):
        if tau <= 0:
            problems.add(
                key, f"{key}={tau} must be > 0: it is sapo's gate temperature (1.0 / 1.05 are usual)"
            )
    check_policy_loss_keys(cfg, problems)
    at_least(problems, "actor.kl_loss_coef", a.kl_loss_coef, 0)
    at_least(problems, "critic.cliprange_value", c.cliprange_value, 0)


def check_reward_values(cfg: TandemConfig, problems: Problems) -> None:
    """reward.*: workers, timeout, the custom scorer file, the reward model, the shaping terms."""
    at_least(problems, "reward.num_workers", cfg.reward.num_workers, 0)
    if cfg.reward.timeout_s <= 0:
        problems.add("reward.timeout_s", f"reward.timeout_s={cfg.reward.timeout_s} must be > 0 seconds")
    box = cfg.reward.sandbox_fusion
    if box.max_concurrent < 1 or box.memory_limit_mb < 0:
        problems.add(
            ("reward.sandbox_fusion.max_concurrent", "reward.sandbox_fusion.memory_limit_mb"),
            f"reward.sandbox_fusion.max_concurrent={box.max_concurrent} must be >= 1 and memory_limit_mb="
            f"{box.memory_limit_mb} >= 0 (0 = no limit)",
        )
    if box.url is not None and not box.url.startswith(("http://", "https://")):
        problems.add(
            "reward.sandbox_fusion.url",
            f"reward.sandbox_fusion.url={box.url!r} is not an http(s) URL; give Sandbox Fusion's run_code "
            "endpoint (https://<host>/run_code), or null to run programs locally",
        )
    if cfg.reward.custom_reward_file and not Path(cfg.reward.custom_reward_file).expanduser().is_file():
        problems.add(
            "reward.custom_reward_file",
            f"reward.custom_reward_file: '{cfg.reward.custom_reward_file}' "
            "does not exist (relative paths start at the current folder)",
        )
    rm = cfg.reward.reward_model
    if rm.enable and not rm.model_path:
        problems.add(
            ("reward.reward_model.enable", "reward.reward_model.model_path"),
            "reward.reward_model.enable=true needs reward.reward_model.model_path",
        )
    _check_reward_manager(cfg, problems)
    _check_reward_terms(cfg, problems)


# verl's keys of the reward manager, named beside Tandem's in the messages
_VERL_MANAGER = "verl: reward_manager.name / reward_model.reward_manager"
_VERL_CLASS = (
    "verl: reward_manager.source=importlib reward_manager.module.path=FILE reward_manager.name=CLASS"
)
_BATCH_ARGUMENTS = ("data_sources", "solution_strs", "ground_truths", "extra_infos")  # rewards/scoring.py's


def _check_reward_manager(cfg: TandemConfig, problems: Problems) -> None:
    """reward.manager / manager_source / manager_file / manager_kwargs: verl's batch manager, or a class of yours."""
    r = cfg.reward
    if r.manager_source == "importlib":
        if not r.manager_file:
            problems.add(
                ("reward.manager_source", "reward.manager_file"),
                "reward.manager_source=importlib loads the class reward.manager names from reward.manager_file: "
                f"set reward.manager_file=path/to/file.py ({_VERL_CLASS})",
            )
        elif (
            not r.manager_file.startswith("pkg://")
            and not Path(r.manager_file.removeprefix("file://")).is_file()
        ):
            problems.add(
                "reward.manager_file",
                f"reward.manager_file: '{r.manager_file}' does not exist (relative paths start at the current folder)",
            )
        if not r.manager.isidentifier():
            problems.add(
                ("reward.manager", "reward.manager_source"),
                f"reward.manager={r.manager!r} must name the class in reward.manager_file ({_VERL_MANAGER})",
            )
        return
    if r.manager not in ("naive", "batch"):
        problems.add(
            "reward.manager",
            f"reward.manager={r.manager!r} is not a reward manager Tandem has ({_VERL_MANAGER}): naive calls your "
            "function once per sample (as verl's naive, dapo, gdpo and prime do), batch once per batch with lists. "
            "A class of your own: reward.manager_source=importlib reward.manager_file=path/to/file.py "
            f"reward.manager=ClassName ({_VERL_CLASS}); a class your reward file registers with verl's @register "
            "is not seen",
        )
        return
    if r.manager_file:
        problems.add(
            ("reward.manager_file", "reward.manager_source"),
            "reward.manager_file is read with reward.manager_source=importlib only (verl's reward_manager.module.path "
            "with reward_manager.source=importlib); set that, or drop reward.manager_file",
        )
    if r.manager == "naive" and r.manager_kwargs:
        problems.add(
            ("reward.manager_kwargs", "reward.manager"),
            f"reward.manager_kwargs {sorted(r.manager_kwargs)} (verl's reward_model.reward_kwargs) go to a batch "
            "function's calls (reward.manager=batch) or a class of your own; the per-sample manager takes none, as "
            "verl's naive manager refuses them. Pass your function's arguments in reward.custom_reward_kwargs",
        )
    if r.manager == "batch":
        if not r.custom_reward_file:
            problems.add(
                ("reward.manager", "reward.custom_reward_file"),
                "reward.manager=batch calls your function once per batch with lists: set reward.custom_reward_file "
                "(verl: custom_reward_function.path); the built-in scorers score one sample per call",
            )
        clash = sorted(set(_BATCH_ARGUMENTS) & (set(r.manager_kwargs) | set(r.custom_reward_kwargs)))
        if clash:
            problems.add(
                ("reward.manager_kwargs", "reward.custom_reward_kwargs"),
                f"reward kwargs {clash} are the batch call's own arguments {_BATCH_ARGUMENTS}: rename them",
            )


def _check_reward_terms(cfg: TandemConfig, problems: Problems) -> None:
    over, fmt = cfg.reward.overlong, cfg.reward.format
    if over.enable:
        if over.max_length is not None:
            at_least(problems, "reward.overlong.max_length", over.max_length, 1)
        at = over.max_length or cfg.data.max_response_length  # where the penalty is whole
        at_key = "reward.overlong.max_length" if over.max_length else "data.max_response_length"
        if not 0 < over.buffer_len < at:
            problems.add(
                ("reward.overlong.buffer_len", at_key),
                f"reward.overlong.buffer_len={over.buffer_len} must be > 0 and below {at_key}={at}: the "
                f"penalty ramps over the last buffer_len tokens. Lower buffer_len or raise {at_key}",
            )
        at_least(problems, "reward.overlong.penalty_factor", over.penalty_factor, 0)
    if fmt.enable:
        try:
            re.compile(fmt.pattern)
        except re.error as err:
            problems.add(
                "reward.format.pattern",
                f"reward.format.pattern={fmt.pattern!r} is not a valid regular expression: {err}",
            )
