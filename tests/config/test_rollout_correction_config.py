"""algorithm.rollout_correction: verl's keys load, the older rollout.is_* keys map onto them, and
every wrong setting names its key and the fix."""

import pytest
from config_helpers import error_of, load

RC = "algorithm.rollout_correction"


def test_defaults_are_off_and_verls_yaml_keys_load():
    rc = load().algorithm.rollout_correction
    assert rc.rollout_is is None and rc.rollout_rs is None and rc.rollout_is_threshold == 2.0
    cfg = load(
        f"{RC}.rollout_is=sequence",
        f"{RC}.rollout_is_threshold=3.0",
        f"{RC}.rollout_is_batch_normalize=true",
        f"{RC}.rollout_rs=token_k1,seq_max_k3",
        f"{RC}.rollout_rs_threshold=0.5_2.0,0.01",
        f"{RC}.bypass_mode=false",
        "actor.old_log_probs_from_update=false",
    )
    rc = cfg.algorithm.rollout_correction
    assert (rc.rollout_is, rc.rollout_is_threshold, rc.rollout_is_batch_normalize) == ("sequence", 3.0, True)
    assert (rc.rollout_rs, rc.rollout_rs_threshold) == ("token_k1,seq_max_k3", "0.5_2.0,0.01")
    assert (
        load(
            f"{RC}.rollout_rs=token_k2",
            f"{RC}.rollout_rs_threshold=0.1",
            "actor.old_log_probs_from_update=false",
        ).algorithm.rollout_correction.rollout_rs_threshold
        == 0.1
    )


def test_older_rollout_is_keys_map_onto_the_new_block():
    rc = load("rollout.is_correction=token", "rollout.is_threshold=3").algorithm.rollout_correction
    assert (rc.rollout_is, rc.rollout_is_threshold) == ("token", 3.0)
    rc = load("rollout.is_correction=sequence", f"{RC}.rollout_is=sequence").algorithm.rollout_correction
    assert (rc.rollout_is, rc.rollout_is_threshold) == ("sequence", 2.0)
    assert load("rollout.is_correction=none").algorithm.rollout_correction.rollout_is is None


RULES = [
    (["rollout.is_correction=token", f"{RC}.rollout_is=sequence"], ["disagree", f"set only {RC}.rollout_is"]),
    (
        ["rollout.is_correction=token", "rollout.is_threshold=3", f"{RC}.rollout_is_threshold=4"],
        ["rollout.is_correction=token (threshold 3.0)", "(threshold 4.0) disagree"],
    ),
    ([f"{RC}.rollout_is=tokens"], [f"{RC}.rollout_is='tokens': use token, sequence or null"]),
    ([f"{RC}.rollout_is=none"], ["use null to turn it off"]),
    (
        [f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=0"],
        [f"{RC}.rollout_is_threshold=0.0 must be > 0"],
    ),
    ([f"{RC}.rollout_is=token", f"{RC}.rollout_is_band_low=0.5"], ["needs both", "rollout_is_band_high"]),
    (
        [f"{RC}.rollout_is=token", f"{RC}.rollout_is_band_low=1.5", f"{RC}.rollout_is_band_high=5"],
        ["need 0 <= low <= 1 <= high"],
    ),
    ([f"{RC}.rollout_is_batch_normalize=true"], [f"set {RC}.rollout_is=token or sequence"]),
    ([f"{RC}.rollout_rs=seq_men_k3", f"{RC}.rollout_rs_threshold=0.1"], ["Did you mean 'seq_mean_k3'"]),
    ([f"{RC}.rollout_rs=token_k3"], [f"needs {RC}.rollout_rs_threshold"]),
    ([f"{RC}.rollout_rs=token_k1", f"{RC}.rollout_rs_threshold=2.0_0.5"], ["0 < lower < upper"]),
    (
        [f"{RC}.rollout_rs=token_k3", f"{RC}.rollout_rs_threshold=0.1", "actor.ppo_mini_batch_size=8"],
        [f"{RC}.rollout_rs needs the old log-probs", "set actor.old_log_probs_from_update=false"],
    ),
    (
        [f"{RC}.rollout_is=token", f"{RC}.rollout_is_batch_normalize=true", "actor.ppo_mini_batch_size=8"],
        ["rollout_is_batch_normalize needs the old log-probs", "actor.old_log_probs_from_update=false"],
    ),
    ([f"{RC}.loss_type=pg"], [f"{RC}.loss_type='pg'", "use ppo_clip or reinforce"]),
    ([f"{RC}.loss_type=reinforce"], [f"set {RC}.bypass_mode=true", "actor.policy_loss=reinforce"]),
    (
        [f"{RC}.bypass_mode=true", f"{RC}.loss_type=reinforce", "actor.policy_loss=gspo"],
        ["replaces the policy loss", "use loss_type=ppo_clip to keep gspo"],
    ),
    (
        [f"{RC}.bypass_mode=true", f"{RC}.rollout_is=token", f"{RC}.rollout_is_batch_normalize=true"],
        ["one micro-batch at a time", "set it to false"],
    ),
    (
        [f"{RC}.bypass_mode=true", "actor.calculate_sum_pi_squared=true"],
        ["which algorithm.rollout_correction.bypass_mode=true skips", "set bypass_mode=false"],
    ),
]


def test_bypass_mode_skips_the_old_log_prob_pass_and_keeps_rejection():
    cfg = load(
        f"{RC}.bypass_mode=true",
        f"{RC}.loss_type=reinforce",
        f"{RC}.rollout_is=sequence",
        f"{RC}.rollout_rs=token_k3",
        f"{RC}.rollout_rs_threshold=0.1",
        "actor.ppo_mini_batch_size=8",  # one optimizer step: rollout_rs alone would ask for the pass
    )
    assert cfg.algorithm.rollout_correction.bypass_mode and not cfg.derived.old_log_probs_from_update


@pytest.mark.parametrize(("overrides", "needles"), RULES, ids=[" ".join(r[0]) for r in RULES])
def test_rule_names_the_key_and_the_fix(overrides, needles):
    msg = error_of(*overrides)
    for needle in needles:
        assert needle in msg


def test_verls_retired_keys_point_to_the_new_ones():
    msg = error_of(f"{RC}.rollout_token_veto_threshold=1e-4")
    assert f"{RC}.rollout_rs" in msg and "seq_max_k2" in msg
