"""Dotted overrides: each value is coerced to the annotated type of its field."""

import pytest
from config_helpers import error_of, load

from tandem.config import ConfigError, config_from_dict


def test_float_written_as_exponent_is_a_float():
    cfg = load("actor.optim.lr=1e-6", "critic.optim.lr=3E-5")
    assert cfg.actor.optim.lr == 1e-6 and isinstance(cfg.actor.optim.lr, float)
    assert cfg.critic.optim.lr == 3e-5


def test_exponent_string_inside_yaml_is_a_float():
    # PyYAML reads `1e-6` (no dot) as the string "1e-6".
    cfg = config_from_dict({"actor": {"optim": {"lr": "1e-6"}}})
    assert cfg.actor.optim.lr == 1e-6


def test_int_from_text_and_from_integral_float():
    cfg = config_from_dict({"data": {"train_batch_size": "16"}, "trainer": {"nnodes": 1.0}})
    assert cfg.data.train_batch_size == 16 and isinstance(cfg.data.train_batch_size, int)
    assert cfg.trainer.nnodes == 1 and isinstance(cfg.trainer.nnodes, int)


def test_fractional_float_for_int_field_is_an_error():
    msg = error_of("data.train_batch_size=2.5")
    assert "data.train_batch_size: got 2.5, expected an integer" in msg


def test_bool_words():
    assert load("data.shuffle=false").data.shuffle is False
    assert load("data.shuffle=yes").data.shuffle is True
    assert config_from_dict({"data": {"shuffle": "Off"}}).data.shuffle is False
    assert "expected true or false" in error_of("data.shuffle=maybe")


def test_bool_is_not_an_int():
    assert "expected an integer" in error_of("rollout.n=true")


def test_lists_in_brackets_and_with_commas():
    cfg = load("data.train_files=[a.parquet,b.parquet]", "trainer.loggers=[console,jsonl]")
    assert cfg.data.train_files == ["a.parquet", "b.parquet"]
    assert cfg.trainer.loggers == ["console", "jsonl"]
    assert load("data.val_files=v1.jsonl,v2.jsonl").data.val_files == ["v1.jsonl", "v2.jsonl"]
    assert load("data.val_files=only.parquet").data.val_files == ["only.parquet"]
    assert load("data.val_files=[]").data.val_files == []


def test_list_item_with_a_wrong_choice_names_the_index():
    msg = error_of("trainer.loggers=[console,wandbb]")
    assert "trainer.loggers[1]: got 'wandbb'" in msg and "did you mean 'wandb'?" in msg


def test_null_for_optional_fields():
    cfg = load("trainer.total_training_steps=null", "actor.grad_clip=None", "data.val_batch_size=~")
    assert cfg.trainer.total_training_steps is None
    assert cfg.actor.grad_clip is None
    assert cfg.data.val_batch_size is None
    assert load("trainer.total_training_steps=100").trainer.total_training_steps == 100


def test_null_for_required_field_is_an_error():
    msg = error_of("data.train_batch_size=null")
    assert "data.train_batch_size needs a value (an integer), e.g. data.train_batch_size=8" in msg


def test_literal_choices():
    assert load("data.truncation=left").data.truncation == "left"
    assert load("actor.fsdp.param_dtype=FLOAT32").actor.fsdp.param_dtype == "float32"
    msg = error_of("data.truncation=lefft")
    assert "data.truncation: got 'lefft', expected one of 'error', 'filter', 'left', 'right'" in msg
    assert "did you mean 'left'?" in msg


def test_bool_or_auto():
    assert load("critic.enable=true").critic.enable is True
    assert load("critic.enable=auto").critic.enable is False  # grpo needs no critic: auto resolves to false
    assert "expected true or false or one of 'auto'" in error_of("critic.enable=sometimes")


def test_string_fields_keep_the_text_verbatim():
    cfg = load(
        "trainer.experiment_name=007", "trainer.project_name='my: project'", "rollout.is_correction=none"
    )
    assert cfg.trainer.experiment_name == "007"
    assert cfg.trainer.project_name == "my: project"
    assert cfg.rollout.is_correction == "none"


def test_number_in_yaml_for_string_field_becomes_text():
    assert config_from_dict({"trainer": {"experiment_name": 2024}}).trainer.experiment_name == "2024"


def test_tuple_field():
    assert load("actor.optim.betas=[0.9,0.95]").actor.optim.betas == (0.9, 0.95)
    assert "expected a list of 2 numbers" in error_of("actor.optim.betas=[0.9]")


def test_dict_field_takes_nested_keys():
    cfg = load("reward.custom_reward_kwargs.scale=2", "reward.custom_reward_kwargs.mode=strict")
    assert cfg.reward.custom_reward_kwargs == {"scale": 2, "mode": "strict"}


def test_later_override_wins():
    assert load("rollout.n=2", "rollout.n=8").rollout.n == 8


def test_override_without_equals_sign():
    assert "override 'rollout.n' must look like section.key=value" in error_of("rollout.n")


def test_override_source_is_named_in_type_errors():
    assert "(from override 'actor.optim.lr=fast')" in error_of("actor.optim.lr=fast")


def test_section_must_be_a_mapping():
    with pytest.raises(
        ConfigError, match=r"actor is a section, not a single value \(got 3\): set the keys inside"
    ):
        config_from_dict({"actor": 3})
