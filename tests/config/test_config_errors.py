"""Unknown keys get a suggestion; every problem is reported in one error."""

import textwrap

import pytest
from config_helpers import error_of

from tandem.config import ConfigError, config_from_dict, load_config


def test_unknown_override_key_suggests_the_sibling():
    msg = error_of("actor.optim.lrr=1e-6")
    assert "unknown key 'actor.optim.lrr'; did you mean 'actor.optim.lr'?" in msg
    assert "(from override 'actor.optim.lrr=1e-6')" in msg


def test_misspelt_section_keeps_the_rest_of_the_path():
    assert "did you mean 'actor.optim.lr'?" in error_of("actr.optim.lr=1e-6")


def test_key_in_the_wrong_section_is_found_by_its_name():
    assert "unknown key 'trainer.clip_ratio_high'; did you mean 'actor.clip_ratio_high'?" in error_of(
        "trainer.clip_ratio_high=0.28"
    )


def test_key_too_shallow_is_found_among_all_paths():
    assert "did you mean 'rollout.val.temperature'?" in error_of("rollout.val_temperature=0")


def test_hopeless_key_lists_the_valid_ones():
    msg = error_of("reference.zzzzzz=1")
    assert "unknown key 'reference.zzzzzz'; valid keys here: log_prob_micro_batch_size_per_rank" in msg


def test_unknown_nested_key_in_yaml(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("algorithm:\n  kl_ctrl:\n    kl_coeff: 0.01\n")
    with pytest.raises(
        ConfigError,
        match=r"unknown key 'algorithm.kl_ctrl.kl_coeff'; did you mean "
        r"'algorithm.kl_ctrl.kl_coef'\?",
    ):
        load_config(str(path))


def test_derived_cannot_be_set():
    with pytest.raises(ConfigError, match="derived is computed"):
        config_from_dict({"derived": {"world_size": 4}})
    assert "derived.world_size: derived is computed from the other settings" in error_of(
        "derived.world_size=4"
    )


def test_all_problems_are_reported_at_once(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        textwrap.dedent("""
        data:
          train_batch_sise: 8
          truncation: sideways
        actor:
          clip_ratio_c: 0.5
    """)
    )
    with pytest.raises(ConfigError) as info:
        load_config(str(path), ["rollout.temperature=0", "trainer.nnodes=two"])
    err = info.value
    assert len(err.problems) == 5
    text = str(err)
    assert text.startswith("5 problems in the configuration:")
    for needle in [
        "data.train_batch_sise",
        "data.truncation: got 'sideways'",
        "actor.clip_ratio_c=0.5",
        "rollout.temperature=0.0",
        "trainer.nnodes: got 'two'",
    ]:
        assert needle in text


def test_value_that_failed_to_parse_causes_no_follow_on_error():
    # The bad mini-batch size keeps its default; no divisibility complaint about that default.
    with pytest.raises(ConfigError) as info:
        load_config(None, ["actor.ppo_mini_batch_size=three"])
    err = info.value
    assert err.problems == [
        "actor.ppo_mini_batch_size: got 'three', expected an integer "
        "(from override 'actor.ppo_mini_batch_size=three')"
    ]


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_unknown_preset_suggests_one():
    with pytest.raises(
        ConfigError, match="'grpoo' is neither a preset nor a YAML file. Did you mean 'grpo'?"
    ):
        load_config("grpoo")


def test_missing_yaml_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "nope.yaml"))


def test_yaml_syntax_error_names_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("actor: [unclosed\n")
    with pytest.raises(ConfigError, match="broken.yaml is not valid YAML"):
        load_config(str(path))


def test_right_name_in_the_wrong_section_lists_every_home():
    assert "did you mean 'actor.optim.lr' or 'critic.optim.lr'?" in error_of("trainer.lr=1e-6")


def test_key_below_a_plain_setting():
    assert "data.train_files is a single setting, not a section" in error_of("data.train_files.x=1")
