"""algorithm.rollout_correction: IS weights, rejection sampling, bypass mode, and the older rollout.is_* keys."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tandem.config.errors import Problems

if TYPE_CHECKING:
    from tandem.config.schema import TandemConfig

_RC = "algorithm.rollout_correction"


def check_rollout_correction(cfg: TandemConfig, problems: Problems) -> None:
    """algorithm.rollout_correction: known names, sane bounds, and agreement with the older rollout.is_* keys."""
    from tandem.algo_options import parse_rollout_rs

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
    """Whether rollout_is_threshold reads as a number (validate.resolve_is_threshold made verl's "lower_upper"
    IcePop band a number and the band keys where it could): a problem, and False, when it is malformed, the
    band keys disagree with it, or it is a band with no IS weights to act on. Changes nothing."""
    from tandem.algo_options import parse_rollout_is_threshold

    key, given = f"{_RC}.rollout_is_threshold", rc.rollout_is_threshold
    try:
        _, band = parse_rollout_is_threshold(given, key=_RC)
    except ValueError as e:
        problems.add(key, str(e))
        return False
    if band is None:
        return True
    names = [f"{_RC}.rollout_is_band_low", f"{_RC}.rollout_is_band_high"]
    set_keys = [rc.rollout_is_band_low, rc.rollout_is_band_high]
    clash = [f"{n}={v}" for n, v, b in zip(names, set_keys, band) if v is not None and v != b]
    if clash:
        problems.add(
            (key, *names),
            f"{key}={given!r} sets the IcePop band to [{band[0]}, {band[1]}], but {' and '.join(clash)}: "
            "give the band one way, as lower_upper in rollout_is_threshold or as the two band keys",
        )
    elif rc.rollout_is is None:
        problems.add(
            (key, f"{_RC}.rollout_is"),
            f"{key}={given!r} is an IcePop band, which acts on IS weights: set {_RC}.rollout_is=token "
            "or sequence",
        )
    return False


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
    if cfg.actor.calculate_sum_pi_squared:
        problems.add(
            ("actor.calculate_sum_pi_squared", f"{_RC}.bypass_mode"),
            "actor.calculate_sum_pi_squared comes from the old-log-prob pass, which "
            f"{_RC}.bypass_mode=true skips: set bypass_mode=false (the optimal token baseline needs the pass)",
        )


def check_old_log_probs_for_correction(cfg: TandemConfig, problems: Problems) -> None:
    rc = cfg.algorithm.rollout_correction
    wanted = [k for k in ("rollout_rs", "rollout_is_batch_normalize") if getattr(rc, k) not in (None, False)]
    if wanted and cfg.derived.old_log_probs_from_update:
        problems.add(
            (f"{_RC}.{wanted[0]}", "actor.old_log_probs_from_update"),
            f"{_RC}.{wanted[0]} needs the old log-probs of the whole batch before the update, but they come "
            "from the update itself (actor.old_log_probs_from_update=true, one optimizer step per step): set "
            "actor.old_log_probs_from_update=false (one more forward pass)",
        )
