"""verl keys that one of verl's engines reads alone (config/verl/engine_keys.py): its FSDP workers the model's
lora_rank / lora_alpha / target_modules / exclude_modules / lora_adapter_path, its megatron workers the model.lora
block. Over the whole class (every such key of verl's real config, actor and critic): on the other engine, at
verl's default, accepted with no effect; at any other value, refused naming the key, the engine and the key to
give. With verl's real config folder: a stale `lora_rank=0` beside `lora.rank=32` on megatron no longer turns
LoRA off, and `lora.rank=32` on FSDP (which verl's FSDP workers ignore) is refused."""

from __future__ import annotations

import pytest

from tandem.config import ConfigError, load_config
from tandem.config.verl.engine_keys import FSDP_ONLY, STRATEGY_KEY, reading_engine
from tandem.config.verl.translate import RL_DEFAULTS, translate_overrides

from .test_all_example_scripts import VERL_CONFIG

ENGINE_KEYS = sorted(key for key in RL_DEFAULTS if reading_engine(key) is not None)
OTHER = {"fsdp": "megatron", "megatron": "fsdp"}


def _text(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(map(str, value)) + "]"
    return "null" if value is None else str(value)


def _other_value(default: object) -> str:
    """A value of the default's type that is not verl's default."""
    if isinstance(default, bool):
        return _text(not default)
    if isinstance(default, (int, float)):
        return _text(default + 7)
    if isinstance(default, list):
        return "[q_proj]"
    return "/some/other_value"


def test_the_class_is_every_engine_only_key_of_verls_config():
    assert set(FSDP_ONLY) <= set(ENGINE_KEYS)  # each FSDP-only key is one of verl's
    megatron = [key for key in ENGINE_KEYS if reading_engine(key) == "megatron"]
    assert len(megatron) >= 30 and {key.rpartition(".")[2] for key in megatron} >= {"rank", "alpha", "type"}


@pytest.mark.parametrize("key", ENGINE_KEYS)
def test_the_other_engine_s_key_is_no_effect_at_verls_default_and_refused_otherwise(key):
    reader = reading_engine(key)
    engine = [f"{STRATEGY_KEY}={OTHER[reader]}"]
    default = RL_DEFAULTS[key][0]
    quiet = translate_overrides([*engine, f"{key}={_text(default)}"])
    assert quiet.problems == [] and quiet.overrides == [f"actor.strategy={OTHER[reader]}"], quiet.problems
    if default is not None:  # verl's null is "not set" before any engine is asked
        assert [verl for verl, _ in quiet.no_effect] == [f"{key}={_text(default)}"]
    value = _other_value(default)
    ((name, message),) = translate_overrides([*engine, f"{key}={value}"]).problems
    assert name == key and message.startswith(f"{key}={value}: verl's {reader} workers read this key")
    assert f"this run's are {OTHER[reader]}'s ({STRATEGY_KEY})" in message
    if key in FSDP_ONLY:
        assert f"verl reads {FSDP_ONLY[key]}" in message
    # on its own engine the key is read by its own rule, not this one
    own = translate_overrides([f"{STRATEGY_KEY}={reader}", f"{key}={value}"])
    assert all("workers read this key" not in text for _, text in own.problems)


def _load(yaml: str, *given: str):
    """verl's real `yaml` with the command line's `given` keys, as `tandem train verl` loads it."""
    return load_config(
        str(VERL_CONFIG / yaml),
        ["data.train_files=/x.parquet", *given],
        require_data=False,
        on_verl=lambda t: None,
    )


@pytest.mark.parametrize(
    ("yaml", "given", "rank"),
    [
        ("ppo_megatron_trainer.yaml", ["actor_rollout_ref.model.lora.rank=32"], 32),
        # a stale FSDP key at its default: mapped before, it set actor.lora.rank=0 and turned LoRA off
        (
            "ppo_megatron_trainer.yaml",
            ["actor_rollout_ref.model.lora.rank=32", "actor_rollout_ref.model.lora_rank=0"],
            32,
        ),
        (
            "ppo_trainer.yaml",
            ["actor_rollout_ref.model.lora_rank=32", "actor_rollout_ref.model.lora.rank=0"],
            32,
        ),
        ("ppo_trainer.yaml", ["actor_rollout_ref.model.lora_rank=32"], 32),
    ],
)
def test_verls_real_config_reads_the_engine_s_own_lora_keys(yaml, given, rank):
    cfg = _load(yaml, *given)
    assert cfg.actor.lora.rank == rank
    assert cfg.actor.lora.alpha == (32 if "megatron" in yaml else 16)  # each engine's verl default alpha


@pytest.mark.parametrize(
    ("yaml", "given", "named"),
    [
        ("ppo_trainer.yaml", "actor_rollout_ref.model.lora.rank=32", "actor_rollout_ref.model.lora_rank"),
        (
            "ppo_megatron_trainer.yaml",
            "actor_rollout_ref.model.lora_rank=32",
            "actor_rollout_ref.model.lora.rank",
        ),
    ],
)
def test_verls_real_config_refuses_the_other_engine_s_lora(yaml, given, named):
    with pytest.raises(ConfigError, match=f"{given}: verl's .* workers read this key.*verl reads {named}"):
        _load(yaml, given)
