"""algorithm.rollout_correction: verl's keys load, the older rollout.is_* keys map onto them, and
every wrong setting names its key and the fix."""

import math

import pytest
import torch
from config_helpers import error_of, load

from tandem.algos.rollout_correction import correction_settings, rollout_correction
from tandem.config import config_to_yaml, load_config

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


def band_of(rc):
    return (rc.rollout_is_threshold, rc.rollout_is_band_low, rc.rollout_is_band_high)


def test_verls_lower_upper_threshold_is_the_icepop_band():
    rc = load(f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=0.5_2.0").algorithm.rollout_correction
    assert band_of(rc) == (2.0, 0.5, 2.0)  # truncation at upper: nothing inside the band is above it
    # the Tandem band keys still work, alone or agreeing with the string
    keys = load(
        f"{RC}.rollout_is=token",
        f"{RC}.rollout_is_threshold=2.0",
        f"{RC}.rollout_is_band_low=0.5",
        f"{RC}.rollout_is_band_high=2",
    ).algorithm.rollout_correction
    assert band_of(keys) == (2.0, 0.5, 2.0)
    both = load(
        f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=0.5_2.0", f"{RC}.rollout_is_band_low=0.5"
    ).algorithm.rollout_correction
    assert band_of(both) == (2.0, 0.5, 2.0)
    # a float-like string is a plain threshold, as in verl
    plain = load(f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold='3.0'").algorithm.rollout_correction
    assert band_of(plain) == (3.0, None, None)


def test_lower_upper_and_band_keys_give_the_same_weights():
    # log r = 0.5, -0.5, 2.0 / 0.1 (then padding): r = 1.65, 0.61, 7.39 / 1.11
    old = torch.tensor([[0.5, -0.5, 2.0], [0.1, 0.0, 0.0]])
    rollout = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    string_form = load(f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=0.7_5.0")
    band_keys = load(
        f"{RC}.rollout_is=token",
        f"{RC}.rollout_is_threshold=5.0",
        f"{RC}.rollout_is_band_low=0.7",
        f"{RC}.rollout_is_band_high=5.0",
    )
    weights = []
    for cfg in (string_form, band_keys):
        w, _, m = rollout_correction(
            old, rollout, mask, **correction_settings(cfg.algorithm.rollout_correction)
        )
        weights.append(w)
        assert m["rollout_is_band_fraction"] == pytest.approx(2 / 4)
    # 0.61 < 0.7 and 7.39 > 5 are zeroed (IcePop, verl's mask), the others kept as they are
    expected = torch.tensor([[math.exp(0.5), 0.0, 0.0], [math.exp(0.1), 0.0, 0.0]])
    torch.testing.assert_close(weights[0], expected)
    torch.testing.assert_close(weights[1], weights[0])


def test_lower_upper_threshold_from_a_yaml_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "algorithm:\n  rollout_correction:\n    rollout_is: sequence\n    rollout_is_threshold: 0.5_5.0\n"
    )
    rc = load_config(str(path)).algorithm.rollout_correction
    assert band_of(rc) == (5.0, 0.5, 5.0)
    path.write_text(
        "algorithm:\n  rollout_correction:\n    rollout_is: token\n    rollout_is_threshold: '0.8_1.25'\n"
    )
    cfg = load_config(str(path))
    assert band_of(cfg.algorithm.rollout_correction) == (1.25, 0.8, 1.25)
    dump = tmp_path / "dump.yaml"  # what a run saves reloads to the same config
    dump.write_text(config_to_yaml(cfg))
    assert load_config(str(dump)) == cfg


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
    (  # verl's lower_upper band against band keys that say otherwise: both keys named
        [f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=0.5_2.0", f"{RC}.rollout_is_band_low=0.3"],
        [
            f"{RC}.rollout_is_threshold='0.5_2.0' sets the IcePop band to [0.5, 2.0]",
            f"but {RC}.rollout_is_band_low=0.3",
            "give the band one way",
        ],
    ),
    (
        [f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=0.5_2.0", f"{RC}.rollout_is_band_high=3"],
        [f"{RC}.rollout_is_threshold='0.5_2.0'", f"but {RC}.rollout_is_band_high=3.0"],
    ),
    # quoted, or YAML reads 2_0.5 as 20.5 and 0.5_ as 0.5 before Tandem sees it (YAML 1.1 digit separators)
    *(
        (
            [f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold='{bad}'"],
            [f"{RC}.rollout_is_threshold='{bad}': expected a number > 0", "lower_upper", "e.g. 0.5_2.0"],
        )
        for bad in ("2_0.5", "0.5_", "_2.0", "0.5_1.0_2.0", "0_2.0")
    ),
    (
        [f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=abc"],
        [f"{RC}.rollout_is_threshold='abc': expected a number > 0", "lower_upper", "e.g. 0.5_2.0"],
    ),
    (
        [f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=1.5_3.0"],
        [f"{RC}.rollout_is_threshold='1.5_3.0'", "needs lower <= 1 <= upper"],
    ),
    (
        [f"{RC}.rollout_is_threshold=0.5_2.0"],
        [f"{RC}.rollout_is_threshold='0.5_2.0' is an IcePop band", f"set {RC}.rollout_is=token or sequence"],
    ),
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


def test_bypass_mode_takes_batch_normalisation():
    """Normalised over each mini-batch at the policy of its step (roles/correction.py Bypass.is_weight_total)."""
    cfg = load(
        f"{RC}.bypass_mode=true",
        f"{RC}.loss_type=reinforce",
        f"{RC}.rollout_is=token",
        f"{RC}.rollout_is_batch_normalize=true",
    )
    assert cfg.algorithm.rollout_correction.rollout_is_batch_normalize


@pytest.mark.parametrize(("overrides", "needles"), RULES, ids=[" ".join(r[0]) for r in RULES])
def test_rule_names_the_key_and_the_fix(overrides, needles):
    msg = error_of(*overrides)
    for needle in needles:
        assert needle in msg


def test_verls_retired_keys_point_to_the_new_ones():
    msg = error_of(f"{RC}.rollout_token_veto_threshold=1e-4")
    assert f"{RC}.rollout_rs" in msg and "seq_max_k2" in msg


@pytest.mark.parametrize(
    "settings",
    [
        {"rollout_is": "token", "rollout_is_threshold": "0.5_2.0"},  # as loaded, before the resolution step
        {"rollout_is_threshold": "0.5_2.0"},  # a band with no IS weights: a problem
        {"rollout_is": "token", "rollout_is_threshold": "0.5_2.0", "rollout_is_band_low": 0.4},  # disagree
        {"rollout_is": "sequence", "rollout_is_threshold": "3"},
    ],
)
def test_the_check_reports_and_changes_nothing(settings):
    """check_rollout_correction only reads: verl's lower_upper threshold is made a number and the band keys by
    the resolution step (validate.resolve_is_threshold), not by the check."""
    import copy

    from tandem.config.checks.rollout_correction import check_rollout_correction
    from tandem.config.errors import Problems

    cfg = load_config(None, [])
    for key, value in settings.items():
        setattr(cfg.algorithm.rollout_correction, key, value)
    before = copy.deepcopy(cfg.algorithm.rollout_correction)
    check_rollout_correction(cfg, Problems())
    assert cfg.algorithm.rollout_correction == before
