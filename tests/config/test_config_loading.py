"""Presets, `base:` inheritance and the config_to_yaml round trip."""

import pytest
import yaml
from config_helpers import load

from tandem.config import (
    ConfigError,
    TandemConfig,
    config_from_dict,
    config_to_dict,
    config_to_yaml,
    list_presets,
    load_config,
    validate_config,
)

PRESETS = [
    "base",
    "dapo",
    "dr_grpo",
    "grpo",
    "gspo",
    "ppo",
    "reinforce_pp",
    "remax",
    "rloo",
    "sft",
    "verl",
    "verl_sft",
    "verl_sft_engine",
]


def test_list_presets():
    assert list_presets() == PRESETS


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_loads_and_validates(name):
    cfg = load_config(name)
    assert cfg.derived.samples_per_step == cfg.data.train_batch_size * cfg.rollout.n
    assert cfg.trainer.device == "auto"  # every preset builds on base: cuda where there are GPUs, else cpu


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_passes_the_real_registries(name, real_registries):
    load_config(name)


def test_preset_values():
    dapo = load_config("dapo")
    assert (dapo.actor.clip_ratio_low, dapo.actor.clip_ratio_high) == (0.2, 0.28)
    assert dapo.actor.loss_agg_mode == "token-mean"
    assert dapo.reward.overlong.enable and dapo.algorithm.dynamic_sampling.enable
    assert not dapo.actor.use_kl_loss and not dapo.algorithm.use_kl_in_reward
    ppo = load_config("ppo")
    assert ppo.algorithm.adv_estimator == "gae" and ppo.critic.enable is True
    dr = load_config("dr_grpo")
    assert dr.algorithm.norm_adv_by_std is False and dr.rollout.n == 4  # n inherited from grpo


def test_base_inheritance_from_a_relative_file(tmp_path):
    (tmp_path / "common.yaml").write_text("base: grpo\nrollout:\n  n: 8\ntrainer:\n  loggers: [jsonl]\n")
    sub = tmp_path / "exp"
    sub.mkdir()
    (sub / "run.yaml").write_text(
        "base: ../common.yaml\nrollout:\n  temperature: 0.7\nactor:\n  optim:\n    lr: 2e-6\n"
    )
    cfg = load_config(str(sub / "run.yaml"), ["trainer.experiment_name=x"])
    assert (cfg.rollout.n, cfg.rollout.temperature) == (8, 0.7)  # mappings merge key by key
    assert cfg.actor.optim.lr == 2e-6 and cfg.actor.optim.weight_decay == 0.01
    assert cfg.actor.use_kl_loss  # from grpo
    assert cfg.trainer.device == "auto"  # from base, through grpo
    assert cfg.trainer.loggers == ["jsonl"]  # lists are replaced, not appended
    assert cfg.trainer.experiment_name == "x"  # overrides win over every file


def test_base_loop_is_an_error(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="include each other in a loop"):
        load_config(str(tmp_path / "a.yaml"))


def test_none_gives_schema_defaults():
    assert load_config() == validate_config(TandemConfig())


@pytest.mark.parametrize("name", PRESETS)
def test_to_yaml_round_trips(name, tmp_path):
    cfg = load_config(
        name, ["actor.optim.lr=3e-7", "data.train_files=[a.parquet]", "reward.custom_reward_kwargs.k=1"]
    )
    path = tmp_path / "dump.yaml"
    path.write_text(config_to_yaml(cfg))
    again = load_config(str(path))
    assert again == cfg
    assert again.derived == cfg.derived
    assert config_to_yaml(again) == config_to_yaml(cfg)


def test_to_dict_and_from_dict():
    cfg = load("actor.optim.betas=[0.9,0.95]")
    plain = config_to_dict(cfg)
    assert plain["actor"]["optim"]["betas"] == [0.9, 0.95]  # plain lists, YAML/JSON ready
    assert "derived" not in plain and "_derived" not in plain
    assert yaml.safe_load(yaml.safe_dump(plain)) == plain
    assert config_from_dict(plain) == cfg


def test_base_key_only_in_files():
    with pytest.raises(ConfigError, match="'base:' only works in YAML files"):
        config_from_dict({"base": "grpo"})


def test_empty_section_keeps_defaults(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("base: grpo\ncritic:\nreward: {}\n")
    assert load_config(str(path)).critic.cliprange_value == 0.5
