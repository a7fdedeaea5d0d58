"""Start-up checks: every rule names the keys involved and says how to fix them."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tandem.config.derived import compute_derived, data_parallel_size, gen_prompts_per_round
from tandem.config.errors import Problems, closest

if TYPE_CHECKING:
    from tandem.algos.registry import Registry
    from tandem.config.schema import TandemConfig

_DATA_SUFFIXES = (".parquet", ".jsonl", ".json")


def validate_config(cfg: TandemConfig, *, require_data: bool = False) -> TandemConfig:
    """Fill in inherited values, check every rule, compute `cfg.derived`; raise ConfigError listing all.
    Returns `cfg` (changed in place)."""
    problems = Problems()
    finalize(cfg, problems, require_data=require_data)
    problems.raise_if_any()
    return cfg


def finalize(cfg: TandemConfig, problems: Problems, *, require_data: bool = False) -> None:
    """Resolve `auto` / `None = the actor's` values in place, check every rule, then compute `cfg.derived`."""
    cfg._derived = None
    regs = _registries()
    info = _estimator_info(cfg.algorithm.adv_estimator, regs)
    resolve(cfg, info)
    before = len(problems.items)
    check_names(cfg, problems, regs)
    check_values(cfg, problems)
    check_algorithm(cfg, problems, info)
    check_batch_sizes(cfg, problems)
    check_parallel(cfg, problems)
    check_multi_turn(cfg, problems)
    if require_data:
        check_data(cfg, problems)
    check_rollout_correction(cfg, problems)
    if len(problems.items) == before:
        cfg._derived = compute_derived(cfg, estimator_info=info)
        _check_old_log_probs_for_correction(cfg, problems)


def resolve(cfg: TandemConfig, info: dict[str, Any]) -> None:
    """Fill in settings that default to another setting, so consumers never see `auto` or None."""
    critic = cfg.critic
    if critic.enable == "auto":
        critic.enable = bool(info.get("needs_critic", False))
    if critic.model_path is None:
        if critic.tokenizer_path is None:  # the actor's folder: the actor's tokenizer, wherever it is
            critic.tokenizer_path = cfg.actor.tokenizer_path
        critic.model_path = cfg.actor.model_path
    if critic.ppo_mini_batch_size is None:
        critic.ppo_mini_batch_size = cfg.actor.ppo_mini_batch_size
    if critic.micro_batch_size_per_rank is None:
        critic.micro_batch_size_per_rank = cfg.actor.micro_batch_size_per_rank
    if critic.ppo_epochs is None:
        critic.ppo_epochs = cfg.actor.ppo_epochs
    # rollout.is_correction / is_threshold: the older names, copied into algorithm.rollout_correction
    # (a conflict between the two is reported by check_rollout_correction).
    rc, r = cfg.algorithm.rollout_correction, cfg.rollout
    if r.is_correction in ("token", "sequence") and rc.rollout_is is None:
        rc.rollout_is = r.is_correction
        if rc.rollout_is_threshold == 2.0:
            rc.rollout_is_threshold = r.is_threshold
    # One step stale: truncated IS against the rollout's log-probs is on unless chosen otherwise.
    if cfg.trainer.async_mode != "synchronous" and rc.rollout_is is None:
        rc.rollout_is = "token"


# --- registry names -----------------------------------------------------------------------------


def _registries() -> dict[str, Registry]:
    import tandem.algos  # noqa: F401 - importing registers the built-in names
    from tandem.algos import registry

    return {
        "adv": registry.ADV_ESTIMATORS,
        "loss": registry.POLICY_LOSSES,
        "kl": registry.KL_ESTIMATORS,
        "agg": registry.AGG_MODES,
        "ctrl": registry.KL_CONTROLLERS,
        "is": registry.IS_LEVELS,
    }


def _estimator_info(name: str, regs: dict[str, Registry]) -> dict[str, Any]:
    return dict(regs["adv"].info(name)) if name in regs["adv"] else {}


def _check_name(
    problems: Problems, key: str, value: str, registry: Registry, extra: tuple[str, ...] = ()
) -> None:
    known = [*extra, *registry.names()]
    if value in known:
        return
    match = closest(str(value), known)
    hint = f" Did you mean '{match}'?" if match else ""
    problems.add(key, f"{key}: '{value}' is not a known {registry.kind}.{hint} Known: {', '.join(known)}.")


def check_names(cfg: TandemConfig, problems: Problems, regs: dict[str, Registry]) -> None:
    _check_name(problems, "algorithm.adv_estimator", cfg.algorithm.adv_estimator, regs["adv"])
    _check_name(problems, "actor.policy_loss", cfg.actor.policy_loss, regs["loss"])
    _check_name(problems, "actor.loss_agg_mode", cfg.actor.loss_agg_mode, regs["agg"])
    _check_name(problems, "critic.loss_agg_mode", cfg.critic.loss_agg_mode, regs["agg"])
    _check_name(problems, "actor.kl_loss_type", cfg.actor.kl_loss_type, regs["kl"])
    _check_name(problems, "algorithm.kl_penalty", cfg.algorithm.kl_penalty, regs["kl"])
    _check_name(problems, "algorithm.kl_ctrl.type", cfg.algorithm.kl_ctrl.type, regs["ctrl"])
    _check_name(problems, "rollout.is_correction", cfg.rollout.is_correction, regs["is"], extra=("none",))


# --- rollout correction -------------------------------------------------------------------------

_RC = "algorithm.rollout_correction"


def check_rollout_correction(cfg: TandemConfig, problems: Problems) -> None:
    """algorithm.rollout_correction: known names, sane bounds, and agreement with the older rollout.is_* keys."""
    from tandem.algos.rollout_correction import parse_rollout_rs

    rc, r = cfg.algorithm.rollout_correction, cfg.rollout
    threshold_ok = _read_is_threshold(rc, problems)  # first: the rules below compare it as a number
    if r.is_threshold <= 0:
        problems.add("rollout.is_threshold", f"rollout.is_threshold={r.is_threshold} must be > 0")
    if r.is_correction in ("token", "sequence") and (
        rc.rollout_is != r.is_correction or (threshold_ok and rc.rollout_is_threshold != r.is_threshold)
    ):
        problems.add(
            ("rollout.is_correction", f"{_RC}.rollout_is"),
            f"rollout.is_correction={r.is_correction} (threshold {r.is_threshold}) and {_RC}.rollout_is="
            f"{rc.rollout_is} (threshold {rc.rollout_is_threshold}) disagree: rollout.is_* are the older "
            f"names; set only {_RC}.rollout_is and {_RC}.rollout_is_threshold",
        )
    if rc.rollout_is is not None and rc.rollout_is not in ("token", "sequence"):
        hint = " (use null to turn it off)" if str(rc.rollout_is).lower() == "none" else ""
        problems.add(
            f"{_RC}.rollout_is", f"{_RC}.rollout_is={rc.rollout_is!r}: use token, sequence or null{hint}"
        )
    low, high = rc.rollout_is_band_low, rc.rollout_is_band_high
    if (low is None) != (high is None):
        problems.add(
            (f"{_RC}.rollout_is_band_low", f"{_RC}.rollout_is_band_high"),
            f"the IcePop band needs both {_RC}.rollout_is_band_low and rollout_is_band_high (e.g. 0.5 and 5.0), "
            f"got {low} and {high}",
        )
    elif low is not None and high is not None and not 0 <= low <= 1 <= high:
        problems.add(
            (f"{_RC}.rollout_is_band_low", f"{_RC}.rollout_is_band_high"),
            f"{_RC}.rollout_is_band_low={low} / rollout_is_band_high={high}: need 0 <= low <= 1 <= high, "
            "or the band drops tokens the rollout and the trainer agree on (ratio 1)",
        )
    needs_is = [
        k
        for k in ("rollout_is_band_low", "rollout_is_batch_normalize")
        if getattr(rc, k) not in (None, False)
    ]
    if rc.rollout_is is None and needs_is:
        problems.add(
            f"{_RC}.{needs_is[0]}",
            f"{_RC}.{needs_is[0]} acts on IS weights: set {_RC}.rollout_is=token or sequence",
        )
    if rc.rollout_rs is not None:
        try:
            parse_rollout_rs(rc.rollout_rs, rc.rollout_rs_threshold, key=_RC)
        except ValueError as e:
            problems.add((f"{_RC}.rollout_rs", f"{_RC}.rollout_rs_threshold"), str(e))
    _check_bypass_mode(cfg, problems)


def _read_is_threshold(rc: Any, problems: Problems) -> bool:
    """rollout_is_threshold as a number; verl's "lower_upper" (IcePop) is copied into the band keys and
    leaves upper as the threshold. False, with a problem, when it is malformed or the band keys disagree."""
    from tandem.algos.rollout_correction import parse_rollout_is_threshold

    key, given = f"{_RC}.rollout_is_threshold", rc.rollout_is_threshold
    try:
        threshold, band = parse_rollout_is_threshold(given, key=_RC)
    except ValueError as e:
        problems.add(key, str(e))
        return False
    if band is not None:
        names = [f"{_RC}.rollout_is_band_low", f"{_RC}.rollout_is_band_high"]
        set_keys = [rc.rollout_is_band_low, rc.rollout_is_band_high]
        clash = [f"{n}={v}" for n, v, b in zip(names, set_keys, band) if v is not None and v != b]
        if clash:
            problems.add(
                (key, *names),
                f"{key}={given!r} sets the IcePop band to [{band[0]}, {band[1]}], but {' and '.join(clash)}: "
                "give the band one way, as lower_upper in rollout_is_threshold or as the two band keys",
            )
            return False
        if rc.rollout_is is None:
            problems.add(
                (key, f"{_RC}.rollout_is"),
                f"{key}={given!r} is an IcePop band, which acts on IS weights: set {_RC}.rollout_is=token "
                "or sequence",
            )
            return False
        rc.rollout_is_band_low, rc.rollout_is_band_high = band
    rc.rollout_is_threshold = threshold
    return True


def _check_bypass_mode(cfg: TandemConfig, problems: Problems) -> None:
    rc = cfg.algorithm.rollout_correction
    if rc.loss_type not in ("ppo_clip", "reinforce"):
        problems.add(f"{_RC}.loss_type", f"{_RC}.loss_type={rc.loss_type!r}: use ppo_clip or reinforce")
    elif rc.loss_type == "reinforce" and not rc.bypass_mode:
        problems.add(
            (f"{_RC}.loss_type", f"{_RC}.bypass_mode"),
            f"{_RC}.loss_type=reinforce is bypass mode's loss: set {_RC}.bypass_mode=true, or keep the "
            "old-log-prob pass and set actor.policy_loss=reinforce instead",
        )
    elif (
        rc.bypass_mode
        and rc.loss_type == "reinforce"
        and cfg.actor.policy_loss not in ("vanilla", "reinforce")
    ):
        problems.add(
            (f"{_RC}.loss_type", "actor.policy_loss"),
            f"{_RC}.loss_type=reinforce replaces the policy loss, but actor.policy_loss={cfg.actor.policy_loss}: "
            f"use loss_type=ppo_clip to keep {cfg.actor.policy_loss} (its ratio to the rollout policy is the "
            "correction), or leave actor.policy_loss=vanilla",
        )
    if not rc.bypass_mode:
        return
    if rc.rollout_is_batch_normalize:
        problems.add(
            (f"{_RC}.rollout_is_batch_normalize", f"{_RC}.bypass_mode"),
            f"{_RC}.rollout_is_batch_normalize needs every IS weight of the batch before the loss, but in "
            "bypass mode they come from the policy being updated, one micro-batch at a time (a mean per "
            "micro-batch would change with how samples are cut): set it to false, or bypass_mode=false",
        )
    if cfg.actor.calculate_sum_pi_squared:
        problems.add(
            ("actor.calculate_sum_pi_squared", f"{_RC}.bypass_mode"),
            "actor.calculate_sum_pi_squared comes from the old-log-prob pass, which "
            f"{_RC}.bypass_mode=true skips: set bypass_mode=false (the optimal token baseline needs the pass)",
        )


def _check_old_log_probs_for_correction(cfg: TandemConfig, problems: Problems) -> None:
    rc = cfg.algorithm.rollout_correction
    wanted = [k for k in ("rollout_rs", "rollout_is_batch_normalize") if getattr(rc, k) not in (None, False)]
    if wanted and cfg.derived.old_log_probs_from_update:
        problems.add(
            (f"{_RC}.{wanted[0]}", "actor.old_log_probs_from_update"),
            f"{_RC}.{wanted[0]} needs the old log-probs of the whole batch before the update, but they come "
            "from the update itself (actor.old_log_probs_from_update=true, one optimizer step per step): set "
            "actor.old_log_probs_from_update=false (one more forward pass)",
        )


# --- single values ------------------------------------------------------------------------------


def _at_least(problems: Problems, key: str, value: float | None, low: float, what: str = "") -> None:
    if value is not None and value < low:
        problems.add(key, f"{key}={value} must be >= {low}{what}")


def _within(problems: Problems, key: str, value: float, low: float, high: float, how: str) -> None:
    ok = {"[]": low <= value <= high, "(]": low < value <= high, "[)": low <= value < high}[how]
    if not ok:
        problems.add(key, f"{key}={value} must be in {how[0]}{low}, {high}{how[1]}")


def _non_finite(obj: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """(dotted key, value) of every nan / inf float, lists and tuples included."""
    for f in dataclasses.fields(obj):
        if f.name.startswith("_"):
            continue
        value, key = getattr(obj, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from _non_finite(value, f"{key}.")
        items = enumerate(value) if isinstance(value, list | tuple) else [(None, value)]
        for i, item in items:
            if isinstance(item, float) and not math.isfinite(item):
                yield (key if i is None else f"{key}[{i}]"), item


def check_values(cfg: TandemConfig, problems: Problems) -> None:
    d, a, r, c, t = cfg.data, cfg.actor, cfg.rollout, cfg.critic, cfg.trainer
    for key, value in _non_finite(cfg):  # loaded configs cannot hold these; one built in Python can
        problems.add(key, f"{key}={value}: only finite numbers are allowed")
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
        _at_least(problems, key, value, 1)
    for name in ("ppo_mini_batch_size", "micro_batch_size_per_rank", "ppo_epochs"):
        if getattr(c, name) != getattr(a, name):  # an inherited bad value is the actor's problem, said once
            _at_least(problems, f"critic.{name}", getattr(c, name), 1)
    for key, value in [("trainer.save_freq", t.save_freq), ("trainer.test_freq", t.test_freq)]:
        if value == 0 or value < -1:
            problems.add(key, f"{key}={value}: use a number of steps >= 1, or -1 for never")
    _at_least(problems, "trainer.critic_warmup", t.critic_warmup, 0)
    _at_least(problems, "reward.num_workers", cfg.reward.num_workers, 0)
    if t.backend == "inprocess" and t.nnodes * t.workers_per_node != 1:
        problems.add(
            "trainer.backend",
            f"trainer.backend=inprocess runs one rank in this process, but trainer.nnodes x "
            f"trainer.workers_per_node = {t.nnodes * t.workers_per_node}; set trainer.workers_per_node=1 "
            "and trainer.nnodes=1, or use trainer.backend=ray",
        )
    if t.cpus_per_worker <= 0:
        problems.add("trainer.cpus_per_worker", f"trainer.cpus_per_worker={t.cpus_per_worker} must be > 0")
    if t.async_mode != "synchronous":
        mode = f"trainer.async_mode={t.async_mode}"
        if r.layout != "separate":
            problems.add(
                ("trainer.async_mode", "rollout.layout"),
                f"{mode} generates while the trainer trains, which needs the rollout "
                "engines in a pool of their own: set rollout.layout=separate",
            )
        if cfg.algorithm.dynamic_sampling.enable:
            problems.add(
                ("trainer.async_mode", "algorithm.dynamic_sampling.enable"),
                f"{mode} draws one round of prompts per step; dynamic sampling's "
                "extra rounds are not supported with it yet: use trainer.async_mode=synchronous",
            )
    if t.async_mode == "streaming" and r.mode != "async":
        problems.add(
            ("trainer.async_mode", "rollout.mode"),
            "trainer.async_mode=streaming runs every sample as a coroutine on the asynchronous engine, so that "
            "a prompt group starts as soon as there is room: set rollout.mode=async (with no tools it is "
            "single-turn generation, the same tokens as rollout.mode=sync)",
        )
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
    if r.layout == "separate" and t.backend == "inprocess":
        problems.add(
            ("rollout.layout", "trainer.backend"),
            "rollout.layout=separate puts the rollout engines in worker processes of their own, but "
            "trainer.backend=inprocess runs everything in this process: use trainer.backend=ray",
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
    if cfg.reward.timeout_s <= 0:
        problems.add("reward.timeout_s", f"reward.timeout_s={cfg.reward.timeout_s} must be > 0 seconds")
    if r.temperature <= 0:
        problems.add(
            "rollout.temperature",
            f"rollout.temperature={r.temperature}: training rollouts must "
            "sample (temperature > 0, usually 1.0); greedy decoding gives a group no variety. "
            "For greedy validation set rollout.val.temperature=0 instead",
        )
    _at_least(problems, "rollout.val.temperature", r.val.temperature, 0)
    if r.val.n > 1 and r.val.temperature == 0:
        problems.add(
            ("rollout.val.n", "rollout.val.temperature"),
            f"rollout.val.n={r.val.n} with "
            "rollout.val.temperature=0 gives identical greedy samples: set rollout.val.n=1 or a temperature > 0",
        )
    _within(problems, "rollout.top_p", r.top_p, 0, 1, "(]")
    _within(problems, "rollout.val.top_p", r.val.top_p, 0, 1, "(]")
    if r.top_k == 0 or r.top_k < -1:
        problems.add("rollout.top_k", f"rollout.top_k={r.top_k}: use -1 (off) or a number of tokens >= 1")
    _within(problems, "rollout.gpu_memory_utilization", r.gpu_memory_utilization, 0, 1, "(]")
    if r.cpu_kv_cache_gib < 1:
        problems.add(
            "rollout.cpu_kv_cache_gib",
            f"rollout.cpu_kv_cache_gib must be >= 1 (GiB), got {r.cpu_kv_cache_gib}",
        )
    for name, optim in (("actor", a.optim), ("critic", c.optim)):
        if optim.lr <= 0:
            problems.add(f"{name}.optim.lr", f"{name}.optim.lr={optim.lr} must be > 0")
        _at_least(problems, f"{name}.optim.weight_decay", optim.weight_decay, 0)
        for i, beta in enumerate(optim.betas):
            _within(problems, f"{name}.optim.betas[{i}]", beta, 0, 1, "[)")
        if optim.eps <= 0:
            problems.add(f"{name}.optim.eps", f"{name}.optim.eps={optim.eps} must be > 0")
        _at_least(problems, f"{name}.optim.warmup_steps", optim.warmup_steps, 0)
        _within(problems, f"{name}.optim.warmup_ratio", optim.warmup_ratio, 0, 1, "[)")
        _within(problems, f"{name}.optim.min_lr_ratio", optim.min_lr_ratio, 0, 1, "[]")
    for key, clip in (("actor.grad_clip", a.grad_clip), ("critic.grad_clip", c.grad_clip)):
        if clip is not None and clip <= 0:
            problems.add(key, f"{key}={clip} must be > 0; use null for no clipping")
    _at_least(problems, "actor.router_aux_loss_coef", a.router_aux_loss_coef, 0)
    for role, lora in (("actor", a.lora), ("critic", c.lora)):
        _at_least(problems, f"{role}.lora.rank", lora.rank, 0)
        if lora.rank <= 0:
            continue
        if lora.alpha <= 0:
            problems.add(f"{role}.lora.alpha", f"{role}.lora.alpha={lora.alpha} must be > 0")
        _within(problems, f"{role}.lora.dropout", lora.dropout, 0, 1, "[)")
        if not lora.target_modules:
            problems.add(
                f"{role}.lora.target_modules", f"{role}.lora.target_modules is empty; use [all-linear]"
            )
        if a.strategy == "megatron":
            problems.add(
                (f"{role}.lora.rank", "actor.strategy"),
                f"{role}.lora.rank={lora.rank} with actor.strategy=megatron: LoRA is built on FSDP2 only; "
                "use actor.strategy=fsdp",
            )
    if a.lora.syncs_adapters:
        if cfg.rollout.engine == "hf":
            problems.add(
                ("actor.lora.rollout_sync", "rollout.engine"),
                "actor.lora.rollout_sync=adapter needs vLLM's LoRA support (rollout.engine=vllm or auto); "
                "the hf engine takes merged weights: use rollout_sync=merged",
            )
        if cfg.rollout.layout == "separate":
            problems.add(
                ("actor.lora.rollout_sync", "rollout.layout"),
                "actor.lora.rollout_sync=adapter is built for rollout.layout=hybrid; the separate pool's "
                "weight bus sends merged weights: use rollout_sync=merged",
            )
        if a.lora.rank > 512:
            problems.add(
                "actor.lora.rank",
                f"actor.lora.rank={a.lora.rank} with rollout_sync=adapter: vLLM serves ranks up to 512",
            )
    _within(problems, "actor.clip_ratio_low", a.clip_ratio_low, 0, 1, "[)")
    _at_least(problems, "actor.clip_ratio_high", a.clip_ratio_high, 0)
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
    _check_policy_loss_keys(cfg, problems)
    _at_least(problems, "actor.kl_loss_coef", a.kl_loss_coef, 0)
    _at_least(problems, "critic.cliprange_value", c.cliprange_value, 0)
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
    _check_reward_terms(cfg, problems)
    if t.resume not in ("auto", "disable") and not Path(t.resume).expanduser().exists():
        problems.add(
            "trainer.resume",
            f"trainer.resume='{t.resume}' is not a checkpoint path; use auto, "
            "disable, or an existing checkpoint folder",
        )


def _check_reward_terms(cfg: TandemConfig, problems: Problems) -> None:
    over, fmt = cfg.reward.overlong, cfg.reward.format
    if over.enable:
        if not 0 < over.buffer_len < cfg.data.max_response_length:
            problems.add(
                ("reward.overlong.buffer_len", "data.max_response_length"),
                f"reward.overlong.buffer_len={over.buffer_len} must be > 0 and below "
                f"data.max_response_length={cfg.data.max_response_length}: the penalty ramps over the "
                "last buffer_len tokens. Lower buffer_len or raise max_response_length",
            )
        _at_least(problems, "reward.overlong.penalty_factor", over.penalty_factor, 0)
    if fmt.enable:
        try:
            re.compile(fmt.pattern)
        except re.error as err:
            problems.add(
                "reward.format.pattern",
                f"reward.format.pattern={fmt.pattern!r} is not a valid regular expression: {err}",
            )


# --- algorithm combinations ---------------------------------------------------------------------


def _check_policy_loss_keys(cfg: TandemConfig, problems: Problems) -> None:
    """The keys of clip_cov, kl_cov and dro (verl's actor.policy_loss.* keys, flat under actor)."""
    a = cfg.actor
    _within(problems, "actor.clip_cov_ratio", a.clip_cov_ratio, 0, 1, "(]")
    _within(problems, "actor.kl_cov_ratio", a.kl_cov_ratio, 0, 1, "(]")
    if a.clip_cov_lb >= a.clip_cov_ub:
        problems.add(
            ("actor.clip_cov_lb", "actor.clip_cov_ub"),
            f"actor.clip_cov_lb={a.clip_cov_lb} must be below actor.clip_cov_ub={a.clip_cov_ub}: "
            "clip_cov drops tokens whose covariance lies between them (1.0 and 5.0 are verl's defaults)",
        )
    _at_least(problems, "actor.ppo_kl_coef", a.ppo_kl_coef, 0)
    if a.policy_loss == "dro" and a.dro_beta is None:
        problems.add(
            "actor.dro_beta",
            "actor.policy_loss=dro needs actor.dro_beta, the weight of its quadratic log-ratio penalty "
            "beta/2 (logp - old)^2; it has no default: set e.g. actor.dro_beta=0.1",
        )
    elif a.dro_beta is not None and a.dro_beta <= 0:
        problems.add("actor.dro_beta", f"actor.dro_beta={a.dro_beta} must be > 0 (null when dro is unused)")


def _check_reward_components(cfg: TandemConfig, problems: Problems, info: dict[str, Any]) -> None:
    """gdpo's algorithm.gdpo_reward_keys / gdpo_reward_weights (verl's names)."""
    alg, est = cfg.algorithm, cfg.algorithm.adv_estimator
    keys, weights = alg.gdpo_reward_keys, alg.gdpo_reward_weights
    if not info.get("needs_reward_components"):
        for key, value in [("gdpo_reward_keys", keys), ("gdpo_reward_weights", weights)]:
            if value:
                problems.add(
                    (f"algorithm.{key}", "algorithm.adv_estimator"),
                    f"algorithm.{key} is read by adv_estimator=gdpo only, but algorithm.adv_estimator={est}: "
                    f"set algorithm.adv_estimator=gdpo, or remove algorithm.{key}",
                )
        return
    if not keys:
        problems.add(
            ("algorithm.gdpo_reward_keys", "algorithm.adv_estimator"),
            f"algorithm.adv_estimator={est} normalises each reward term on its own and needs their names: set "
            "algorithm.gdpo_reward_keys=[correct,format] to fields your scorer returns in its dict "
            '({"score": ..., "correct": ..., "format": ...}; README: "Rewards with several terms")',
        )
    bad = [k for k in keys if not k or k in ("score", "error")]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if bad or repeated:
        problems.add(
            "algorithm.gdpo_reward_keys",
            f"algorithm.gdpo_reward_keys={keys}: "
            + (
                f"{bad} cannot name a term ('score' is the total, 'error' the scorer's error text). "
                if bad
                else ""
            )
            + (f"{repeated} appear more than once. " if repeated else "")
            + "Name each term once, as the scorer's dict names it",
        )
    if weights is not None and len(weights) != len(keys):
        problems.add(
            ("algorithm.gdpo_reward_weights", "algorithm.gdpo_reward_keys"),
            f"algorithm.gdpo_reward_weights has {len(weights)} weights ({weights}) but algorithm.gdpo_reward_keys "
            f"has {len(keys)} keys ({keys}): give one weight per key, in the same order, or null for all 1.0",
        )
    # The components alone make gdpo's advantages: what is added to the summed reward only would be lost.
    if alg.use_kl_in_reward:
        problems.add(
            ("algorithm.use_kl_in_reward", "algorithm.adv_estimator"),
            f"algorithm.adv_estimator={est} builds advantages from the reward terms alone, so a KL penalty in the "
            "reward would be ignored: set algorithm.use_kl_in_reward=false (actor.use_kl_loss=true keeps a KL term)",
        )
    if cfg.reward.reward_model.enable:
        problems.add(
            ("reward.reward_model.enable", "algorithm.adv_estimator"),
            f"algorithm.adv_estimator={est} builds advantages from the scorer's named reward terms; the reward "
            "model's score is not one of them and would be ignored: set reward.reward_model.enable=false or use grpo",
        )


def check_algorithm(cfg: TandemConfig, problems: Problems, info: dict[str, Any]) -> None:
    alg, est = cfg.algorithm, cfg.algorithm.adv_estimator
    if info.get("needs_critic") and cfg.critic.enable is False:
        problems.add(
            ("critic.enable", "algorithm.adv_estimator"),
            f"algorithm.adv_estimator={est} needs a value model but critic.enable=false: set "
            "critic.enable=auto (or true), or pick a critic-free estimator such as grpo or rloo",
        )
    if info.get("needs_groups") and cfg.rollout.n < 2:
        problems.add(
            ("rollout.n", "algorithm.adv_estimator"),
            f"algorithm.adv_estimator={est} compares samples of the same prompt, but rollout.n="
            f"{cfg.rollout.n}: a group of one has no baseline. Set rollout.n>=2 (4-16 is usual)",
        )
    if info.get("needs_reward_baselines") and cfg.trainer.async_mode != "synchronous":
        problems.add(
            ("algorithm.adv_estimator", "trainer.async_mode"),
            f"algorithm.adv_estimator={est} generates a greedy baseline each step, which "
            f"trainer.async_mode={cfg.trainer.async_mode} does not prefetch yet: use trainer.async_mode=synchronous",
        )
    if info.get("needs_sum_pi_squared") and not cfg.actor.calculate_sum_pi_squared:
        problems.add(
            ("actor.calculate_sum_pi_squared", "algorithm.adv_estimator"),
            f"algorithm.adv_estimator={est} weights each token by the policy's sum of squared "
            "probabilities, which the old-log-prob pass computes only when asked: set "
            "actor.calculate_sum_pi_squared=true",
        )
    _check_reward_components(cfg, problems, info)
    if alg.dynamic_sampling.enable and cfg.rollout.n < 2:
        problems.add(
            ("algorithm.dynamic_sampling.enable", "rollout.n"),
            "algorithm.dynamic_sampling.enable=true drops groups whose samples all score the same; "
            f"with rollout.n={cfg.rollout.n} every group would be dropped. Set rollout.n>=2",
        )
    _at_least(
        problems,
        "algorithm.dynamic_sampling.max_num_gen_batches",
        alg.dynamic_sampling.max_num_gen_batches,
        0,
    )
    _at_least(problems, "algorithm.dynamic_sampling.gen_batch_size", alg.dynamic_sampling.gen_batch_size, 1)
    ds, prompts = alg.dynamic_sampling, cfg.data.train_batch_size
    per_round = gen_prompts_per_round(cfg)
    if ds.enable and ds.max_num_gen_batches >= 1 and 1 <= per_round * ds.max_num_gen_batches < prompts:
        problems.add(
            (
                "algorithm.dynamic_sampling.gen_batch_size",
                "algorithm.dynamic_sampling.max_num_gen_batches",
                "data.train_batch_size",
            ),
            f"algorithm.dynamic_sampling: {ds.max_num_gen_batches} rounds (max_num_gen_batches) x "
            f"{per_round} prompts (gen_batch_size) cannot fill a step of data.train_batch_size={prompts} "
            "prompts even if no group is dropped. Raise gen_batch_size (2-3x train_batch_size is usual) "
            "or max_num_gen_batches (0 = no limit)",
        )
    if cfg.trainer.critic_warmup > 0 and cfg.critic.enable is False:
        problems.add(
            ("trainer.critic_warmup", "critic.enable"),
            f"trainer.critic_warmup={cfg.trainer.critic_warmup} but there is no critic: set it to 0",
        )
    _within(problems, "algorithm.gamma", alg.gamma, 0, 1, "[]")
    _within(problems, "algorithm.lam", alg.lam, 0, 1, "[]")
    _at_least(problems, "algorithm.kl_ctrl.kl_coef", alg.kl_ctrl.kl_coef, 0)
    if alg.kl_ctrl.type == "adaptive":
        if alg.kl_ctrl.target_kl <= 0:
            problems.add(
                "algorithm.kl_ctrl.target_kl",
                f"algorithm.kl_ctrl.target_kl={alg.kl_ctrl.target_kl} "
                "must be > 0 for the adaptive controller",
            )
        _at_least(problems, "algorithm.kl_ctrl.horizon", alg.kl_ctrl.horizon, 1)


# --- batch sizes and parallelism ----------------------------------------------------------------


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
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length
    budget = cfg.actor.max_tokens_per_micro_batch
    if cfg.actor.use_dynamic_bsz and budget is not None and budget < longest:
        problems.add(
            ("actor.max_tokens_per_micro_batch", "data.max_response_length"),
            f"actor.max_tokens_per_micro_batch={cfg.actor.max_tokens_per_micro_batch} cannot hold one "
            f"full-length sample (data.max_prompt_length + data.max_response_length = {longest} tokens). "
            f"Raise it to at least {longest}",
        )


def check_parallel(cfg: TandemConfig, problems: Problems) -> None:
    world = cfg.trainer.nnodes * cfg.trainer.workers_per_node
    if world < 1:
        return
    a, r = cfg.actor, cfg.rollout
    if a.strategy == "megatron":
        mp = a.megatron
        size = mp.tensor_parallel * mp.pipeline_parallel * mp.context_parallel
        if size >= 1 and world % size:
            problems.add(
                (
                    "actor.megatron.tensor_parallel",
                    "actor.megatron.pipeline_parallel",
                    "actor.megatron.context_parallel",
                    "trainer.workers_per_node",
                ),
                f"actor.megatron tensor_parallel={mp.tensor_parallel} x pipeline_parallel="
                f"{mp.pipeline_parallel} x context_parallel={mp.context_parallel} = {size} does not "
                f"divide the world size {world} (trainer.nnodes x trainer.workers_per_node)",
            )
        if mp.virtual_pipeline > 1 and mp.pipeline_parallel == 1:
            problems.add(
                ("actor.megatron.virtual_pipeline", "actor.megatron.pipeline_parallel"),
                f"actor.megatron.virtual_pipeline={mp.virtual_pipeline} needs actor.megatron.pipeline_parallel > 1 "
                "(model chunks interleave over the pipeline stages)",
            )
        # experts are not split by TP (expert tensor parallel 1): their ranks are a pipeline stage's
        expert_pool = world // max(1, mp.pipeline_parallel)
        if (
            mp.expert_parallel >= 1
            and world % max(1, mp.pipeline_parallel) == 0
            and expert_pool % mp.expert_parallel
        ):
            problems.add(
                ("actor.megatron.expert_parallel", "trainer.workers_per_node"),
                f"actor.megatron.expert_parallel={mp.expert_parallel} does not divide world size / "
                f"pipeline_parallel = {expert_pool}",
            )
    elif a.fsdp.sequence_parallel >= 1 and world % a.fsdp.sequence_parallel:
        problems.add(
            ("actor.fsdp.sequence_parallel", "trainer.workers_per_node"),
            f"actor.fsdp.sequence_parallel={a.fsdp.sequence_parallel} does not divide the world size "
            f"{world} (trainer.nnodes x trainer.workers_per_node)",
        )
    if r.tensor_parallel >= 1 and world % r.tensor_parallel:
        problems.add(
            ("rollout.tensor_parallel", "trainer.workers_per_node"),
            f"rollout.tensor_parallel={r.tensor_parallel} does not divide the world size {world}: "
            "each inference engine spans tensor_parallel ranks",
        )
    if r.engine == "hf" and r.tensor_parallel != 1:
        problems.add(
            ("rollout.tensor_parallel", "rollout.engine"),
            "rollout.engine=hf generates on each rank alone: set rollout.tensor_parallel=1 or use vllm",
        )
    if r.engine == "sglang" and cfg.trainer.device == "cpu":
        problems.add(
            ("rollout.engine", "trainer.device"),
            "rollout.engine=sglang has no CPU path: use rollout.engine=vllm or hf on trainer.device=cpu",
        )


BUILTIN_TOOLS = (
    "calculator",
    "python",
)  # tandem/tools; checked here so a typo fails before any worker starts
BUILTIN_INTERACTIONS = ("try_again",)


def check_multi_turn(cfg: TandemConfig, problems: Problems) -> None:
    """rollout.mode and rollout.multi_turn: the agent loop runs on vLLM, and only in async mode."""
    r, m = cfg.rollout, cfg.rollout.multi_turn
    uses_agent = bool(m.tools or m.tool_file or m.interaction)
    if uses_agent and r.mode != "async":
        problems.add(
            "rollout.mode",
            f"rollout.multi_turn names tools or an interaction, but rollout.mode={r.mode}: tools run in the agent "
            "loop; set rollout.mode=async",
        )
    if r.mode == "async" and r.engine in ("hf", "sglang"):
        problems.add(
            ("rollout.mode", "rollout.engine"),
            f"rollout.mode=async runs on vLLM's continuously batched engine; rollout.engine={r.engine} has none. "
            "Set rollout.engine=vllm (or auto where vLLM is installed)",
        )
    for key, value in [
        ("rollout.multi_turn.max_assistant_turns", m.max_assistant_turns),
        ("rollout.multi_turn.max_parallel_calls", m.max_parallel_calls),
        ("rollout.multi_turn.max_tool_response_length", m.max_tool_response_length),
    ]:
        _at_least(problems, key, value, 1)
    _at_least(problems, "rollout.multi_turn.max_user_turns", m.max_user_turns, 0)
    if m.tool_timeout_s <= 0:
        problems.add(
            "rollout.multi_turn.tool_timeout_s",
            f"rollout.multi_turn.tool_timeout_s={m.tool_timeout_s} must be > 0",
        )
    unknown = [name for name in m.tools if name not in BUILTIN_TOOLS]
    if unknown:
        problems.add(
            "rollout.multi_turn.tools",
            f"rollout.multi_turn.tools names {unknown}, not built-in tools ({', '.join(BUILTIN_TOOLS)}); tools of your "
            "own go in a Python file named by rollout.multi_turn.tool_file (all of its tools are offered)",
        )
    if m.interaction and m.interaction not in BUILTIN_INTERACTIONS and not m.interaction_file:
        problems.add(
            "rollout.multi_turn.interaction",
            f"rollout.multi_turn.interaction={m.interaction} is not built in ({', '.join(BUILTIN_INTERACTIONS)}); "
            "define it in a Python file and set rollout.multi_turn.interaction_file",
        )
    for key, path in [
        ("rollout.multi_turn.tool_file", m.tool_file),
        ("rollout.multi_turn.interaction_file", m.interaction_file),
    ]:
        if path and not Path(path).expanduser().is_file():
            problems.add(key, f"{key}: '{path}' does not exist")


def check_data(cfg: TandemConfig, problems: Problems) -> None:
    """Only when about to train: the data must be there."""
    d, t = cfg.data, cfg.trainer
    if not d.train_files:
        problems.add(
            "data.train_files",
            "data.train_files is empty: give parquet / jsonl files, e.g. data.train_files=[train.parquet]",
        )
    for key, files in (("data.train_files", d.train_files), ("data.val_files", d.val_files)):
        for path in files:
            if "://" not in path and path.endswith(_DATA_SUFFIXES) and not Path(path).expanduser().is_file():
                problems.add(key, f"{key}: '{path}' does not exist")
    if not d.val_files and (t.test_freq > 0 or t.val_before_train):
        problems.add(
            ("data.val_files", "trainer.test_freq"),
            "trainer.test_freq / trainer.val_before_train ask for validation but data.val_files is "
            "empty: add val files or set trainer.test_freq=-1 and trainer.val_before_train=false",
        )
    if not cfg.actor.model_path:
        problems.add(
            "actor.model_path", "actor.model_path is not set: point it at a local Hugging Face folder"
        )
