"""The RL math's names, and what each name reads, without torch.

Config validation checks names such as `algorithm.adv_estimator=grpo`, reads what an estimator needs (a
critic, groups of samples) and parses the rollout-correction options before anything is trained; importing
the math itself (`tandem.algos`) loads torch, seconds of start-up for a command that only prints a config.
So each name of the registries of tandem/algos/registry.py is listed here with its spec: a frozen dataclass
that says what the function reads (an estimator's inputs and settings, a policy loss's settings, an
aggregation mode's counts) and the typed flags config reads. The registries register their functions
against these specs (tandem/algos/registry.py checks each function's keywords against its spec), and the
callers pass exactly what the spec names: the advantage step (trainer/advantage_step.py) and the actor's
loss (roles/actor.py). tests/algos/test_algo_options.py keeps the names here equal to the registries'. The
rejection-sampling options and the grammar of the rollout-correction thresholds live here alone:
tandem/algos/rollout_correction.py registers its statistics under these names and parses with these
functions.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol


def unknown_name_message(kind: str, name: str, known: list[str]) -> str:
    """'unknown <kind> '<name>'. Did you mean ...? Known: ...' (a registry's error for a name it lacks)."""
    close = difflib.get_close_matches(str(name), known, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return f"unknown {kind} '{name}'.{hint} Known: {', '.join(known)}."


class Spec(Protocol):
    """What a registered name reads and its flags; `info()` is the same as a plain dict (logs, tests)."""

    def info(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Plain:
    """A name that reads only its family's fixed arguments and has no flags (KL estimators, controllers)."""

    def info(self) -> dict[str, Any]:
        return {}


class GroupOfOne(Enum):
    """What a group estimator gives a sample alone in its group (every sample, with rollout.n=1)."""

    OWN_SCORE = "own_score"  # baseline 0, as in verl: its advantage is its score (config warns at n=1)
    ZERO = "zero"  # advantage 0, as verl's rloo_vectorized: refused at n=1 (the rewards would teach nothing)
    NEEDS_TWO = "needs_two"  # advantage 0 where verl raises (grpo_passk's margin over the second best)


@dataclass(frozen=True)
class EstimatorSpec:
    """What an advantage estimator reads besides (token_level_rewards, response_mask), its positional pair.

    `inputs`: per-sample data it needs, each a batch key of that name, except `index`, the prompt's uid
    (batch["uid"]) that groups the samples; the advantage step refuses a batch that lacks one.
    `optional`: data it reads when the step has it, None otherwise (`rollout_is_weights`: the rollout
    correction's IS weights of the whole batch, when it computes them before the advantages).
    `settings`: config values, `algorithm.<name>` (`reward_weights` is `algorithm.gdpo_reward_weights`).
    The function's other keywords keep their defaults (e.g. `epsilon`). The flags config reads follow
    from the inputs: a critic for `values`, groups for `index`, ...
    """

    inputs: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    settings: tuple[str, ...] = ()
    group_of_one: GroupOfOne = GroupOfOne.OWN_SCORE

    def keywords(self) -> tuple[str, ...]:
        """Every keyword the advantage step passes."""
        return (*self.inputs, *self.optional, *self.settings)

    @property
    def needs_critic(self) -> bool:
        return "values" in self.inputs

    @property
    def needs_groups(self) -> bool:
        return "index" in self.inputs

    @property
    def needs_reward_baselines(self) -> bool:
        """The greedy response's score per prompt (ReMax): the rollout generates it each step."""
        return "reward_baselines" in self.inputs

    @property
    def needs_sum_pi_squared(self) -> bool:
        return "sum_pi_squared" in self.inputs

    @property
    def needs_reward_components(self) -> bool:
        """One column per named reward term (algorithm.gdpo_reward_keys)."""
        return "reward_components" in self.inputs

    @property
    def refuses_group_of_one(self) -> bool:
        """A group estimator that gives a lone sample 0: rollout.n=1 is refused at start-up."""
        return self.needs_groups and self.group_of_one is not GroupOfOne.OWN_SCORE

    def info(self) -> dict[str, bool]:
        """The flags as a dict: needs_critic, needs_groups, needs_reward_baselines always, the rest when true."""
        flags = {
            "needs_critic": self.needs_critic,
            "needs_groups": self.needs_groups,
            "needs_reward_baselines": self.needs_reward_baselines,
            "needs_sum_pi_squared": self.needs_sum_pi_squared,
            "needs_reward_components": self.needs_reward_components,
            "needs_two_per_group": self.needs_groups and self.group_of_one is GroupOfOne.NEEDS_TWO,
            "zero_for_group_of_one": self.needs_groups and self.group_of_one is GroupOfOne.ZERO,
        }
        return {k: v for i, (k, v) in enumerate(flags.items()) if i < 3 or v}


# The fixed part of a policy loss's call: fn(old_log_probs, log_probs, advantages, response_mask, *,
# is_weights, agg_kwargs, **its settings); is_weights may be None, agg_kwargs are aggregation's counts.
LOSS_FIXED_KEYWORDS = ("is_weights", "agg_kwargs")


@dataclass(frozen=True)
class LossSpec:
    """What a policy loss reads besides its fixed arguments (LOSS_FIXED_KEYWORDS): `settings`, each the
    config value `actor.<name>`; the function's other keywords keep their defaults."""

    settings: tuple[str, ...] = ("loss_agg_mode",)

    def keywords(self) -> tuple[str, ...]:
        return (*LOSS_FIXED_KEYWORDS, *self.settings)

    def info(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class AggSpec:
    """Which of the mini-batch's counts (`global_num_tokens`, `global_num_seqs`, `norm_length`) an
    aggregation mode divides by: fn(loss_mat, mask, *, <its counts>)."""

    counts: tuple[str, ...]

    def keywords(self) -> tuple[str, ...]:
        return self.counts

    def info(self) -> dict[str, Any]:
        return {}


class RatioLevel(Enum):
    TOKEN = "token"
    SEQUENCE = "sequence"


@dataclass(frozen=True)
class RejectionSpec:
    """A rejection-sampling option: the level it rejects at; `ratio_bounds`: it bounds the ratio (k1) with
    lower_upper, else it takes one upper bound (k2 / k3)."""

    level: RatioLevel
    ratio_bounds: bool

    def info(self) -> dict[str, Any]:
        return {"level": self.level.value, "ratio_bounds": self.ratio_bounds}


@dataclass(frozen=True)
class Names:
    """A registry's names and specs without its functions: what config validation reads of it."""

    kind: str
    entries: Mapping[str, Spec]

    def names(self) -> list[str]:
        """Every name, sorted."""
        return sorted(self.entries)

    def spec(self, name: str) -> Any:
        """The spec `name` is registered with; a KeyError naming the closest known name otherwise."""
        if name not in self.entries:
            raise KeyError(self.unknown_message(name))
        return self.entries[name]

    def info(self, name: str) -> dict[str, Any]:
        """The spec of `name` as a dict."""
        return self.spec(name).info()

    def unknown_message(self, name: str) -> str:
        return unknown_name_message(self.kind, name, self.names())

    def __contains__(self, name: object) -> bool:
        return name in self.entries


def _plain(*names: str) -> dict[str, Plain]:
    return {name: Plain() for name in names}


_GROUPED = EstimatorSpec(inputs=("index",))
_OTB = EstimatorSpec(inputs=("index", "old_log_probs", "sum_pi_squared"), optional=("rollout_is_weights",))
ADV_ESTIMATORS = Names(
    "advantage estimator",
    {
        "gae": EstimatorSpec(inputs=("values",), settings=("gamma", "lam")),
        "grpo": EstimatorSpec(inputs=("index",), settings=("norm_adv_by_std",)),
        "dr_grpo": _GROUPED,
        "grpo_passk": EstimatorSpec(
            inputs=("index",), settings=("norm_adv_by_std",), group_of_one=GroupOfOne.NEEDS_TWO
        ),
        "gdpo": EstimatorSpec(
            inputs=("index", "reward_components"), settings=("reward_weights", "norm_adv_by_std")
        ),
        "gpg": _GROUPED,
        "opo": _GROUPED,
        "rloo": _GROUPED,
        "rloo_vectorized": EstimatorSpec(inputs=("index",), group_of_one=GroupOfOne.ZERO),
        "reinforce_plus_plus": EstimatorSpec(settings=("gamma",)),
        "reinforce_plus_plus_baseline": _GROUPED,
        "remax": EstimatorSpec(inputs=("reward_baselines",)),
        "optimal_token_baseline": _OTB,
        "tir_optimal_token_baseline": _OTB,
    },
)
_CLIP = ("loss_agg_mode", "clip_ratio_low", "clip_ratio_high")
POLICY_LOSSES = Names(
    "policy loss",
    {
        "vanilla": LossSpec((*_CLIP, "clip_ratio_c")),
        "gspo": LossSpec(_CLIP),
        "reinforce": LossSpec(),
        "gpg": LossSpec(),
        "cispo": LossSpec(_CLIP),
        "geo_mean": LossSpec(("clip_ratio_low", "clip_ratio_high")),  # sequence-level: no loss_agg_mode
        "sapo": LossSpec(("tau_pos", "tau_neg")),  # seq-mean-token-mean whatever loss_agg_mode says
        "clip_cov": LossSpec((*_CLIP, "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub")),
        "kl_cov": LossSpec(("loss_agg_mode", "kl_cov_ratio", "ppo_kl_coef")),
        "dro": LossSpec(("loss_agg_mode", "dro_beta")),
        "dppo_tv": LossSpec((*_CLIP, "clip_ratio_c")),
        "dppo_kl": LossSpec((*_CLIP, "clip_ratio_c")),
    },
)
_KL = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")  # each also "<name>+": k2's gradient (kl.py)
KL_ESTIMATORS = Names("KL estimator", _plain(*_KL, *(f"{name}+" for name in _KL)))
AGG_MODES = Names(
    "loss aggregation mode",
    {
        "token-mean": AggSpec(("global_num_tokens",)),
        "seq-mean-token-sum": AggSpec(("global_num_seqs",)),
        "seq-mean-token-mean": AggSpec(("global_num_seqs",)),
        "seq-mean-token-sum-norm": AggSpec(("global_num_seqs", "norm_length")),
    },
)
KL_CONTROLLERS = Names("KL controller", _plain("fixed", "adaptive"))
IS_LEVELS = Names("importance-sampling correction level", _plain("token", "sequence"))
PF_PPO_WEIGHTS = Names("PF-PPO reweight method", _plain("pow", "max_min", "max_random"))

# Rejection sampling (verl's rollout_rs): a k1 / k2 / k3 statistic of log r per token, or its sum / mean / max
# over each sequence; k1 options bound the ratio (lower_upper), k2 / k3 take one upper bound.
_RS_LEVELS = {"token": ("k1", "k2", "k3"), "seq_sum": ("k1", "k2", "k3"), "seq_mean": ("k1", "k2", "k3")}
_RS_LEVELS["seq_max"] = ("k2", "k3")  # max of k1 is one-sided; verl offers none
ROLLOUT_RS = Names(
    "rejection-sampling option",
    {
        f"{reduce}_{estimator}": RejectionSpec(
            RatioLevel.TOKEN if reduce == "token" else RatioLevel.SEQUENCE, ratio_bounds=estimator == "k1"
        )
        for reduce, estimators in _RS_LEVELS.items()
        for estimator in estimators
    },
)


def parse_rollout_rs(
    rollout_rs: str, threshold: float | str | None, key: str = "algorithm.rollout_correction"
) -> list[tuple[str, float | None, float]]:
    """(option, lower, upper) per comma-separated option of `rollout_rs`, with one threshold each.

    `threshold`: one entry for all options or one per option, comma-separated. k1 options bound the
    ratio pi_rollout / pi_old: "lower_upper", or one number u meaning 1/u to u. k2 / k3: one upper
    bound. Errors name `key`.rollout_rs / `key`.rollout_rs_threshold.
    """
    options = [o.strip() for o in str(rollout_rs).split(",") if o.strip()]
    if not options:
        raise ValueError(f"{key}.rollout_rs={rollout_rs!r} names no option; use null to turn it off")
    for option in options:
        if option not in ROLLOUT_RS:
            raise ValueError(f"{key}.rollout_rs: {ROLLOUT_RS.unknown_message(option)}")
    if threshold is None:
        raise ValueError(
            f"{key}.rollout_rs={rollout_rs} needs {key}.rollout_rs_threshold (e.g. 0.5_2.0, or 0.01)"
        )
    specs = [s.strip() for s in str(threshold).split(",") if s.strip()]
    if len(specs) == 1:
        specs = specs * len(options)
    if len(specs) != len(options):
        raise ValueError(
            f"{key}.rollout_rs_threshold={threshold!r} has {len(specs)} entries for {len(options)} "
            f"rollout_rs options: give one for all, or one per option in the same order"
        )
    out: list[tuple[str, float | None, float]] = []
    for option, spec in zip(options, specs, strict=True):
        bad = f"{key}.rollout_rs_threshold entry {spec!r} for {option}"
        if ROLLOUT_RS.spec(option).ratio_bounds:
            bounds = ratio_bounds(spec)
            if bounds is None:
                raise ValueError(
                    f"{bad}: give lower_upper with 0 < lower < upper (e.g. 0.5_2.0), or one upper > 1"
                )
            out.append((option, *bounds))
            continue
        try:
            parts = [float(p) for p in spec.split("_")]
        except ValueError:
            raise ValueError(f"{bad} is not a number (or lower_upper for k1 options)") from None
        if len(parts) != 1 or parts[0] <= 0:
            raise ValueError(f"{bad}: k2 / k3 options take one upper bound > 0 (e.g. 0.01)")
        out.append((option, None, parts[0]))
    return out


def ratio_bounds(spec: str) -> tuple[float, float] | None:
    """(lower, upper) from verl's "lower_upper" ("0.5_2.0"), or one number u meaning 1/u .. u;
    None unless both are finite numbers with 0 < lower < upper."""
    try:
        parts = [float(p) for p in str(spec).strip().split("_")]  # split first: float("1_5") is 15
    except ValueError:
        return None
    if len(parts) == 1 and parts[0] > 0:
        parts = [1.0 / parts[0], parts[0]]
    if len(parts) != 2 or not all(map(math.isfinite, parts)) or not 0 < parts[0] < parts[1]:
        return None
    return parts[0], parts[1]


def parse_rollout_is_threshold(
    threshold: float | str, key: str = "algorithm.rollout_correction"
) -> tuple[float, tuple[float, float] | None]:
    """(truncation threshold, IcePop band or None) from rollout_is_threshold, read as verl reads it.

    A number truncates the weights (TIS). "lower_upper" (e.g. "0.5_2.0") zeroes them where r leaves
    [lower, upper] (IcePop), which leaves nothing above upper to truncate: (upper, (lower, upper)).
    Errors name `key`.rollout_is_threshold, its value and the two forms.
    """
    name, text = f"{key}.rollout_is_threshold", str(threshold).strip()
    forms = (
        "a number > 0 (weights truncated there, e.g. 2.0) or lower_upper with 0 < lower <= 1 <= upper "
        "(the IcePop band, e.g. 0.5_2.0)"
    )
    if "_" not in text:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{name}={threshold!r}: expected {forms}") from None
        if not math.isfinite(value) or value <= 0:
            raise ValueError(
                f"{name}={threshold!r} must be > 0 (or lower_upper, the IcePop band, e.g. 0.5_2.0)"
            )
        return value, None
    band = ratio_bounds(text)
    if band is None:
        raise ValueError(f"{name}={threshold!r}: expected {forms}")
    if not band[0] <= 1 <= band[1]:
        raise ValueError(
            f"{name}={threshold!r}: the IcePop band lower_upper needs lower <= 1 <= upper, or it drops "
            "tokens the rollout and the trainer agree on (ratio 1)"
        )
    return band[1], band
