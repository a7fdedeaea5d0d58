"""The algorithm section: what the advantage estimator needs, the policy-loss keys, gdpo's reward terms,
dynamic sampling, PF-PPO's weight power, the KL controller."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tandem.algo_options import EstimatorSpec, GroupOfOne
from tandem.config.checks.common import at_least, within
from tandem.config.derived import gen_prompts_per_round
from tandem.config.errors import Problems

if TYPE_CHECKING:
    from tandem.config.schema import TandemConfig

logger = logging.getLogger(__name__)


def check_policy_loss_keys(cfg: TandemConfig, problems: Problems) -> None:
    """The keys of clip_cov, kl_cov and dro (verl's actor.policy_loss.* keys, flat under actor)."""
    a = cfg.actor
    within(problems, "actor.clip_cov_ratio", a.clip_cov_ratio, 0, 1, "(]")
    within(problems, "actor.kl_cov_ratio", a.kl_cov_ratio, 0, 1, "(]")
    if a.clip_cov_lb >= a.clip_cov_ub:
        problems.add(
            ("actor.clip_cov_lb", "actor.clip_cov_ub"),
            f"actor.clip_cov_lb={a.clip_cov_lb} must be below actor.clip_cov_ub={a.clip_cov_ub}: "
            "clip_cov drops tokens whose covariance lies between them (1.0 and 5.0 are verl's defaults)",
        )
    at_least(problems, "actor.ppo_kl_coef", a.ppo_kl_coef, 0)
    if a.policy_loss == "dro" and a.dro_beta is None:
        problems.add(
            "actor.dro_beta",
            "actor.policy_loss=dro needs actor.dro_beta, the weight of its quadratic log-ratio penalty "
            "beta/2 (logp - old)^2; it has no default: set e.g. actor.dro_beta=0.1",
        )
    elif a.dro_beta is not None and a.dro_beta <= 0:
        problems.add("actor.dro_beta", f"actor.dro_beta={a.dro_beta} must be > 0 (null when dro is unused)")


def _check_reward_components(cfg: TandemConfig, problems: Problems, estimator: EstimatorSpec) -> None:
    """gdpo's algorithm.gdpo_reward_keys / gdpo_reward_weights (verl's names)."""
    alg, est = cfg.algorithm, cfg.algorithm.adv_estimator
    keys, weights = alg.gdpo_reward_keys, alg.gdpo_reward_weights
    if not estimator.needs_reward_components:
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


def group_of_one_warning(cfg: TandemConfig, estimator: EstimatorSpec) -> str | None:
    """With rollout.n=1 a group estimator has no baseline: as in verl, the advantage is the raw score. A
    warning that says so, else None (also for the estimators that give a group of one 0: refused instead)."""
    if not estimator.needs_groups or estimator.refuses_group_of_one or cfg.rollout.n >= 2:
        return None
    est = cfg.algorithm.adv_estimator
    return (
        f"algorithm.adv_estimator={est} compares the samples of a prompt, but rollout.n={cfg.rollout.n} gives "
        "one sample per prompt: there is no baseline, so each sample's advantage is its raw score (as in "
        "verl: group mean 0, std 1). Every sample with a positive score is reinforced. Set rollout.n>=2 "
        "(4-16 is usual) for a group baseline"
    )


def check_algorithm(cfg: TandemConfig, problems: Problems, estimator: EstimatorSpec) -> None:
    alg, est = cfg.algorithm, cfg.algorithm.adv_estimator
    if estimator.needs_critic and cfg.critic.enable is False:
        problems.add(
            ("critic.enable", "algorithm.adv_estimator"),
            f"algorithm.adv_estimator={est} needs a value model but critic.enable=false: set "
            "critic.enable=auto (or true), or pick a critic-free estimator such as grpo or rloo",
        )
    if estimator.group_of_one is GroupOfOne.NEEDS_TWO and cfg.rollout.n < 2:
        problems.add(
            ("rollout.n", "algorithm.adv_estimator"),
            f"algorithm.adv_estimator={est} learns from each prompt's best sample by its margin over the "
            f"second best, but rollout.n={cfg.rollout.n} gives one sample per prompt: every advantage "
            "would be 0 (verl stops there too). Set rollout.n>=2 (4-16 is usual)",
        )
    # Refused, not warned: verl runs this, but every policy-gradient advantage is 0, so the rewards teach
    # nothing and the run's compute is spent on the KL and entropy terms alone.
    if estimator.group_of_one is GroupOfOne.ZERO and cfg.rollout.n < 2:
        problems.add(
            ("rollout.n", "algorithm.adv_estimator"),
            f"algorithm.adv_estimator={est} gives a sample that is alone in its group advantage 0 (as in verl), "
            f"and rollout.n={cfg.rollout.n} gives one sample per prompt: every advantage would be 0 and the "
            "rewards would teach nothing. Set rollout.n>=2 (4-16 is usual), or pick an estimator "
            "that gives a lone sample its raw score, such as rloo",
        )
    warning = group_of_one_warning(cfg, estimator)
    if warning is not None:
        logger.warning("%s", warning)
    if estimator.needs_sum_pi_squared and not cfg.actor.calculate_sum_pi_squared:
        problems.add(
            ("actor.calculate_sum_pi_squared", "algorithm.adv_estimator"),
            f"algorithm.adv_estimator={est} weights each token by the policy's sum of squared "
            "probabilities, which the old-log-prob pass computes only when asked: set "
            "actor.calculate_sum_pi_squared=true",
        )
    _check_reward_components(cfg, problems, estimator)
    if (
        alg.dynamic_sampling.enable
        and alg.dynamic_sampling.metric == "seq_final_reward"
        and alg.use_kl_in_reward
    ):
        problems.add(
            ("algorithm.dynamic_sampling.metric", "algorithm.use_kl_in_reward"),
            "algorithm.dynamic_sampling.metric=seq_final_reward keeps groups by the rewards after the KL penalty, "
            "and Tandem applies that penalty after the groups are kept (the reference's log-probs come later): "
            "not built. Use metric=seq_reward (the scores before the penalty), or use_kl_in_reward=false",
        )
    if alg.dynamic_sampling.enable and cfg.rollout.n < 2:
        problems.add(
            ("algorithm.dynamic_sampling.enable", "rollout.n"),
            "algorithm.dynamic_sampling.enable=true drops groups whose samples all score the same; "
            f"with rollout.n={cfg.rollout.n} every group would be dropped. Set rollout.n>=2",
        )
    at_least(
        problems,
        "algorithm.dynamic_sampling.max_num_gen_batches",
        alg.dynamic_sampling.max_num_gen_batches,
        0,
    )
    at_least(problems, "algorithm.dynamic_sampling.gen_batch_size", alg.dynamic_sampling.gen_batch_size, 1)
    if alg.pf_ppo.weight_pow < 0:  # |0|^p is infinite for p < 0: a row scored 0 would take every draw
        problems.add(
            "algorithm.pf_ppo.weight_pow",
            f"algorithm.pf_ppo.weight_pow={alg.pf_ppo.weight_pow} must be >= 0: a negative power gives a row "
            "scored 0 an infinite weight. 2.0 is verl's default; 0 draws every row alike",
        )
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
    within(problems, "algorithm.gamma", alg.gamma, 0, 1, "[]")
    within(problems, "algorithm.lam", alg.lam, 0, 1, "[]")
    at_least(problems, "algorithm.kl_ctrl.kl_coef", alg.kl_ctrl.kl_coef, 0)
    if alg.kl_ctrl.type == "adaptive":
        if alg.kl_ctrl.target_kl <= 0:
            problems.add(
                "algorithm.kl_ctrl.target_kl",
                f"algorithm.kl_ctrl.target_kl={alg.kl_ctrl.target_kl} "
                "must be > 0 for the adaptive controller",
            )
        at_least(problems, "algorithm.kl_ctrl.horizon", alg.kl_ctrl.horizon, 1)
