"""The RL math's names and option strings, read without torch.

Config validation checks names such as `algorithm.adv_estimator=grpo`, reads what an estimator needs (a
critic, groups of samples) and parses the rollout-correction options before anything is trained; importing
the math itself (`tandem.algos`) loads torch, seconds of start-up for a command that only prints a config.
So the names each registry of tandem/algos/registry.py holds once `tandem.algos` is imported are listed here
too, with the metadata config reads; tests/algos/test_algo_options.py keeps the two equal (a new estimator,
loss, ... is registered beside its function and named here). The rejection-sampling options and the grammar
of the rollout-correction thresholds live here alone: tandem/algos/rollout_correction.py registers its
statistics under these names and parses with these functions.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def unknown_name_message(kind: str, name: str, known: list[str]) -> str:
    """'unknown <kind> '<name>'. Did you mean ...? Known: ...' (a registry's error for a name it lacks)."""
    close = difflib.get_close_matches(str(name), known, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return f"unknown {kind} '{name}'.{hint} Known: {', '.join(known)}."


@dataclass(frozen=True)
class Names:
    """A registry's names and metadata without its functions: what config validation reads of it."""

    kind: str
    entries: Mapping[str, Mapping[str, Any]]

    def names(self) -> list[str]:
        """Every name, sorted."""
        return sorted(self.entries)

    def info(self, name: str) -> dict[str, Any]:
        """The metadata `name` is registered with; a KeyError naming the closest known name otherwise."""
        if name not in self.entries:
            raise KeyError(self.unknown_message(name))
        return dict(self.entries[name])

    def unknown_message(self, name: str) -> str:
        return unknown_name_message(self.kind, name, self.names())

    def __contains__(self, name: object) -> bool:
        return name in self.entries


def _estimator(critic: bool = False, groups: bool = True, baselines: bool = False, **more: bool) -> dict:
    return {"needs_critic": critic, "needs_groups": groups, "needs_reward_baselines": baselines, **more}


def _plain(*names: str) -> dict[str, dict]:
    return {name: {} for name in names}  # registered without metadata


ADV_ESTIMATORS = Names(
    "advantage estimator",
    {
        "gae": _estimator(critic=True, groups=False),
        "grpo": _estimator(),
        "dr_grpo": _estimator(),
        "grpo_passk": _estimator(needs_two_per_group=True),
        "gdpo": _estimator(needs_reward_components=True),
        "gpg": _estimator(),
        "opo": _estimator(),
        "rloo": _estimator(),
        "rloo_vectorized": _estimator(zero_for_group_of_one=True),
        "reinforce_plus_plus": _estimator(groups=False),
        "reinforce_plus_plus_baseline": _estimator(),
        "remax": _estimator(groups=False, baselines=True),
        "optimal_token_baseline": _estimator(needs_sum_pi_squared=True),
        "tir_optimal_token_baseline": _estimator(needs_sum_pi_squared=True),
    },
)
POLICY_LOSSES = Names(
    "policy loss",
    _plain("vanilla", "gspo", "reinforce", "gpg", "cispo", "geo_mean", "sapo", "clip_cov", "kl_cov", "dro")
    | _plain("dppo_tv", "dppo_kl"),
)
_KL = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")  # each also "<name>+": k2's gradient (kl.py)
KL_ESTIMATORS = Names("KL estimator", _plain(*_KL, *(f"{name}+" for name in _KL)))
AGG_MODES = Names(
    "loss aggregation mode",
    _plain("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"),
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
        f"{reduce}_{estimator}": {
            "level": "token" if reduce == "token" else "sequence",
            "ratio_bounds": estimator == "k1",
        }
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
        if ROLLOUT_RS.info(option)["ratio_bounds"]:
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
