"""Start-up checks: every rule names the keys involved and says how to fix them.

`validate_config` resolves the inherited values, runs the rules of tandem/config/checks/ (one module per
section) and tandem/config/modes.py in a fixed order, so problems are listed in the same order every run,
then computes `cfg.derived` (tandem/config/derived.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tandem.algo_options import EstimatorSpec
from tandem.config.checks.algorithm import check_algorithm
from tandem.config.checks.data import check_data, check_dataset_class, check_sampler_class
from tandem.config.checks.lora import check_lora
from tandem.config.checks.megatron import check_megatron
from tandem.config.checks.names import check_names, estimator_spec, registries
from tandem.config.checks.rollout import check_multi_turn
from tandem.config.checks.rollout_correction import (
    check_old_log_probs_for_correction,
    check_rollout_correction,
)
from tandem.config.checks.sizes import check_batch_sizes, check_parallel
from tandem.config.checks.values import check_values
from tandem.config.derived import choose_workers_per_node, compute_derived
from tandem.config.errors import Problems
from tandem.config.gpus import gpus_per_node as gpus_per_node_counted
from tandem.config.modes import check_modes

if TYPE_CHECKING:
    from tandem.config.schema import TandemConfig


def validate_config(
    cfg: TandemConfig, *, require_data: bool = False, gpus_per_node: int | None = None
) -> TandemConfig:
    """Fill in inherited values, check every rule, compute `cfg.derived`; raise ConfigError listing all.
    `gpus_per_node`: what workers_per_node=auto counts (None: counted, config/gpus.py).
    Returns `cfg` (changed in place)."""
    problems = Problems()
    finalize(cfg, problems, require_data=require_data, gpus_per_node=gpus_per_node)
    problems.raise_if_any()
    return cfg


def finalize(
    cfg: TandemConfig, problems: Problems, *, require_data: bool = False, gpus_per_node: int | None = None
) -> None:
    """Resolve `auto` / `None = the actor's` values in place, check every rule, then compute `cfg.derived`."""
    cfg._derived = None
    regs = registries()
    estimator = estimator_spec(cfg.algorithm.adv_estimator, regs)
    resolve(cfg, estimator)
    ranks_why = resolve_workers_per_node(cfg, gpus_per_node)
    before = len(problems.items)
    check_names(cfg, problems, regs)
    check_lora(cfg, problems)  # first: an adapter folder fills actor.lora's keys that the rules below read
    check_values(cfg, problems)
    check_dataset_class(cfg, problems)
    check_modes(cfg, problems, estimator)
    check_algorithm(cfg, problems, estimator)
    check_batch_sizes(cfg, problems)
    check_parallel(cfg, problems)
    check_megatron(cfg, problems)
    check_multi_turn(cfg, problems)
    if require_data:
        check_data(cfg, problems)
    check_rollout_correction(cfg, problems)
    check_sampler_class(cfg, problems)
    if len(problems.items) == before:
        cfg._derived = compute_derived(cfg, estimator=estimator, ranks_why=ranks_why)
        check_old_log_probs_for_correction(cfg, problems)


def resolve_workers_per_node(cfg: TandemConfig, gpus_per_node: int | None) -> str:
    """trainer.workers_per_node / rollout.workers_per_node = auto made numbers (`choose_workers_per_node`), with
    the GPUs per node given, or counted where a choice needs them; returns how they were chosen."""
    t, r = cfg.trainer, cfg.rollout
    if t.workers_per_node != "auto" and r.workers_per_node != "auto":
        return "set by trainer.workers_per_node"
    where = "given"
    if gpus_per_node is None:
        gpus_per_node, where = 0, "counted"
        if t.backend != "inprocess" and t.device != "cpu":
            gpus_per_node, where = gpus_per_node_counted(t.ray_address)
    t.workers_per_node, r.workers_per_node, why = choose_workers_per_node(
        t.workers_per_node,
        r.workers_per_node,
        gpus_per_node=gpus_per_node,
        where=where,
        device=t.device,
        backend=t.backend,
        separate=r.layout == "separate",
        rollout_tensor_parallel=r.tensor_parallel if isinstance(r.tensor_parallel, int) else 1,
    )
    return why


def resolve(cfg: TandemConfig, estimator: EstimatorSpec) -> None:
    """Fill in settings that default to another setting, so consumers never see `auto` or None."""
    critic = cfg.critic
    if critic.enable == "auto":
        critic.enable = estimator.needs_critic
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
    resolve_is_threshold(rc)


def resolve_is_threshold(rc: Any) -> None:
    """algorithm.rollout_correction.rollout_is_threshold as a number: verl's "lower_upper" (IcePop) gives the
    band keys and leaves upper as the threshold. Left as it is where it does not read, disagrees with the band
    keys or has no IS weights to act on (check_rollout_correction names the problem then)."""
    from tandem.algo_options import parse_rollout_is_threshold

    try:
        threshold, band = parse_rollout_is_threshold(rc.rollout_is_threshold)
    except ValueError:
        return
    if band is not None:
        given = (rc.rollout_is_band_low, rc.rollout_is_band_high)
        if rc.rollout_is is None or any(v is not None and v != b for v, b in zip(given, band)):
            return
        rc.rollout_is_band_low, rc.rollout_is_band_high = band
    rc.rollout_is_threshold = threshold
