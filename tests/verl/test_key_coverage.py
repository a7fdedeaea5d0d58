"""Every key of verl's configs has a rule in Tandem's tables: it maps, has no effect (with the reason), or is
refused naming what Tandem lacks. verl's generated trainer configs (ppo_trainer, ppo_megatron_trainer), its SFT
configs and its generation config are kept as data in tests/verl/data (scripts/extract_verl_examples.py).
Also here: the values whose meaning depends on other keys, read as verl reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.config.verl.extra_keys import EXTRA_KEYS
from tandem.config.verl.generation_keys import generation_rule
from tandem.config.verl.translate import _reads_as_verl, _rule, is_tandem_key, translate_overrides

from .verl_config import composed
from .verl_keys_script import load_generator

DATA = Path(__file__).parent / "data"


def _keys(name: str) -> list[str]:
    return load_generator().config_keys(name)


def _has_rule(key: str, sft: bool) -> bool:
    """As config/verl/translate.py reads a key: a verl key with a rule, or a key Tandem has with verl's meaning."""
    if _reads_as_verl(key, sft):
        return _rule(key, sft) is not None
    return is_tandem_key(key)


@pytest.mark.parametrize(
    ("config", "covered", "total"),
    [
        ("ppo_trainer", lambda k: _has_rule(k, False), 533),
        ("ppo_megatron_trainer", lambda k: _has_rule(k, False), 594),
        ("sft_trainer", lambda k: _has_rule(k, True), 72),
        ("sft_trainer_engine", lambda k: _has_rule(k, True), 121),
        ("generation", lambda k: generation_rule(k) is not None, 43),
    ],
)
def test_every_key_of_verls_configs_has_a_rule(config, covered, total):
    keys = _keys(config)
    assert len(keys) == total
    assert [k for k in keys if not covered(k)] == []


def test_a_default_only_key_takes_verls_default_and_names_the_feature_otherwise():
    """The class: each key that only asks for something Tandem lacks accepts verl's default value."""
    defaults = {
        k: v for name in ("ppo_trainer", "ppo_megatron_trainer") for k, v in _default_values(name).items()
    }
    checked = 0
    for key, rule in EXTRA_KEYS.items():
        if rule.effect != "maps" or rule.target or key not in defaults:
            continue
        assert translate_overrides([f"{key}={_text(defaults[key])}"]).problems == [], key
        asked = translate_overrides([f"{key}=something_else"]).problems
        assert len(asked) == 1 and asked[0][1].startswith(f"{key}=something_else: "), key
        assert "Did you mean" not in asked[0][1], key
        checked += 1
    assert checked >= 30


def _default_values(name: str) -> dict:
    out = {}

    def walk(node, prefix=""):
        for key, value in node.items():
            if isinstance(value, dict) and value:
                walk(value, f"{prefix}{key}.")
            else:
                out[f"{prefix}{key}"] = value

    walk(composed(name))
    return out


def _text(value) -> str:
    return "null" if value is None else ("{}" if value == {} else str(value))


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        # verl's older global micro-batch sizes: divided by nnodes x n_gpus_per_node / the role's Ulysses size
        (["actor_rollout_ref.actor.ppo_micro_batch_size=64"], "actor.micro_batch_size_per_rank=8"),  # 8 GPUs
        (
            [
                "trainer.nnodes=2",
                "trainer.n_gpus_per_node=4",
                "actor_rollout_ref.actor.ppo_micro_batch_size=64",
            ],
            "actor.micro_batch_size_per_rank=8",
        ),
        (
            [
                "trainer.n_gpus_per_node=8",
                "actor_rollout_ref.actor.ulysses_sequence_parallel_size=4",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size=64",
            ],
            "rollout.log_prob_micro_batch_size_per_rank=32",  # 2 data-parallel groups
        ),
        (
            ["trainer.n_gpus_per_node=2", "actor_rollout_ref.ref.log_prob_micro_batch_size=6"],
            "reference.log_prob_micro_batch_size_per_rank=3",
        ),
        (
            ["trainer.n_gpus_per_node=4", "critic.ppo_micro_batch_size=16"],
            "critic.micro_batch_size_per_rank=4",
        ),
        # the actor's token budget: verl's per GPU of a Ulysses group, times its size (Tandem's counts whole rows)
        (
            [
                "actor_rollout_ref.actor.ulysses_sequence_parallel_size=4",
                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192",
            ],
            "actor.max_tokens_per_micro_batch=32768",
        ),
        (["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192"], "actor.max_tokens_per_micro_batch=8192"),
        # the resume path is used only with resume_mode=resume_path
        (
            ["trainer.resume_mode=resume_path", "trainer.resume_from_path=ckpt/global_step_5"],
            "trainer.resume=ckpt/global_step_5",
        ),
    ],
)
def test_values_that_depend_on_other_keys_are_read_as_verl_reads_them(given, expected):
    t = translate_overrides(given)
    assert t.problems == []
    assert expected in t.overrides


def test_the_divided_and_multiplied_values_arrive_in_the_config():
    from tandem.config import load_config

    cfg = load_config(
        "verl",
        [
            "trainer.nnodes=1",
            "trainer.n_gpus_per_node=4",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
            "actor_rollout_ref.actor.ppo_micro_batch_size=8",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size=16",
        ],
        on_verl=lambda t: None,
        gpus_per_node=4,
    )
    assert cfg.actor.max_tokens_per_micro_batch == 8192  # 4096 x 2
    assert cfg.actor.micro_batch_size_per_rank == 4  # 8 over 4 GPUs / 2
    assert cfg.rollout.log_prob_micro_batch_size_per_rank == 8


def test_the_resume_path_without_resume_path_mode_has_no_effect_as_in_verl():
    for mode in ([], ["trainer.resume_mode=auto"], ["trainer.resume_mode=disable"]):
        t = translate_overrides([*mode, "trainer.resume_from_path=checkpoints/"])
        assert not any(o.startswith("trainer.resume=checkpoints") for o in t.overrides)
        assert t.no_effect[-1][0] == "trainer.resume_from_path=checkpoints/"
    ((key, message),) = translate_overrides(["trainer.resume_mode=resume_path"]).problems
    assert key == "trainer.resume_mode" and "needs trainer.resume_from_path=PATH" in message


def test_a_global_micro_batch_size_smaller_than_the_gpus_is_refused_with_the_per_gpu_key():
    ((_, message),) = translate_overrides(["critic.ppo_micro_batch_size=4"]).problems  # over 8 GPUs
    assert "4 over 8 data-parallel GPUs is 0 per GPU" in message
    assert "critic.ppo_micro_batch_size_per_gpu" in message


@pytest.mark.parametrize(("verl", "tandem"), [("hermes", "hermes"), ("qwen", "hermes"), ("qwen25", "hermes")])
def test_sglangs_qwen_tool_call_parser_is_the_hermes_syntax(verl, tandem):
    t = translate_overrides([f"actor_rollout_ref.rollout.multi_turn.format={verl}"])
    assert t.overrides == [f"rollout.multi_turn.format={tandem}"]


def test_another_tool_call_syntax_is_refused_naming_the_one_tandem_parses():
    ((_, message),) = translate_overrides(["actor_rollout_ref.rollout.multi_turn.format=gpt-oss"]).problems
    assert "parses hermes-style tool calls" in message and "'gpt-oss'" in message
