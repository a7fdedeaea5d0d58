"""The LoRA keys that read a folder or a pattern (config/checks/lora.py), and verl's keys for them.

`actor.lora.adapter_path`: the folder's adapter_config.json fills actor.lora's rank, alpha, dropout,
target_modules and exclude_modules where they are at their defaults; another value is refused naming both; a
missing folder or file, or an adapter Tandem does not train as plain LoRA, is refused naming the key. The
engine side (the weights, log-probs against PEFT) is tests/engine/test_lora_start.py."""

from __future__ import annotations

import json

import pytest

from tandem.config import ConfigError, load_config
from tandem.config.lora_names import hf_target_modules
from tandem.config.verl.translate import translate_overrides

PEFT_CONFIG = {  # as PEFT 0.21's save_pretrained writes it (the fields the check reads, and a few others)
    "peft_type": "LORA",
    "task_type": "CAUSAL_LM",
    "r": 8,
    "lora_alpha": 32,
    "lora_dropout": 0.05,
    "target_modules": ["v_proj", "q_proj"],
    "exclude_modules": None,
    "bias": "none",
    "use_dora": False,
    "modules_to_save": None,
    "rank_pattern": {},
    "alpha_pattern": {},
    "inference_mode": True,
}


def adapter_folder(root, **changes):
    folder = root / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({**PEFT_CONFIG, **changes}))
    (folder / "adapter_model.safetensors").write_bytes(b"")  # read by the engine, not by the config check
    return folder


def test_the_adapters_config_fills_the_lora_keys_left_at_their_defaults(tmp_path):
    folder = adapter_folder(tmp_path, exclude_modules=".*visual.*")
    lora = load_config(overrides=[f"actor.lora.adapter_path={folder}"]).actor.lora
    assert (lora.rank, lora.alpha, lora.dropout) == (8, 32.0, 0.05)
    assert lora.target_modules == ["q_proj", "v_proj"] and lora.exclude_modules == [".*visual.*"]
    # the same values given explicitly are the same run; the LoRA rules read the filled keys
    same = ["actor.lora.rank=8", "actor.lora.alpha=32", "actor.lora.target_modules=[q_proj,v_proj]"]
    assert load_config(overrides=[f"actor.lora.adapter_path={folder}", *same]).actor.lora == lora
    # the folder's dropout reaches the rules: adapter dropout is built on FSDP2 only
    with pytest.raises(ConfigError, match="actor.lora.dropout=0.05 with actor.strategy=megatron"):
        load_config(overrides=[f"actor.lora.adapter_path={folder}", "actor.strategy=megatron"])


def test_a_lora_key_that_disagrees_with_the_adapter_is_refused_naming_both(tmp_path):
    folder = adapter_folder(tmp_path)
    with pytest.raises(ConfigError) as error:
        load_config(
            overrides=[
                f"actor.lora.adapter_path={folder}",
                "actor.lora.rank=16",
                "actor.lora.target_modules=[o_proj]",
            ]
        )
    text = str(error.value)
    assert f"actor.lora.rank=16 but the adapter actor.lora.adapter_path={folder} has 8" in text
    assert "leave actor.lora.rank unset or set it to 8" in text
    assert (
        "actor.lora.target_modules=['o_proj'] but the adapter" in text and "has ['q_proj', 'v_proj']" in text
    )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root: root / "nowhere", "the folder does not exist; point it at a PEFT adapter folder"),
        (lambda root: root, "the folder has no adapter_config.json and no adapter_model.safetensors"),
        (lambda root: adapter_folder(root, use_dora=True), "sets use_dora=True; Tandem trains plain LoRA"),
        (lambda root: adapter_folder(root, peft_type="IA3"), "is not a LoRA adapter's (peft_type IA3)"),
        (lambda root: adapter_folder(root, modules_to_save=["lm_head"]), "sets modules_to_save=['lm_head']"),
    ],
)
def test_an_adapter_folder_tandem_cannot_start_from_is_refused(tmp_path, make, message):
    folder = make(tmp_path)
    with pytest.raises(ConfigError) as error:
        load_config(overrides=[f"actor.lora.adapter_path={folder}"])
    assert f"actor.lora.adapter_path={folder}: " in str(error.value) and message in str(error.value)


def test_exclude_modules_entries_must_be_regular_expressions():
    with pytest.raises(
        ConfigError, match=r"critic.lora.exclude_modules: 'visual\[' is no regular expression"
    ):
        load_config(overrides=["critic.lora.rank=4", "critic.lora.exclude_modules=['visual[']"])
    assert (
        load_config(overrides=["actor.lora.rank=4", "actor.lora.exclude_modules=[visual]"]).actor.lora.rank
        == 4
    )


def test_verls_keys_map():
    t = translate_overrides(
        [
            "actor_rollout_ref.model.lora_adapter_path=/adapters/a",
            "actor_rollout_ref.model.exclude_modules=.*visual.*",  # verl's string: one regular expression
            "actor_rollout_ref.actor.freeze_vision_tower=True",
        ]
    )
    assert t.problems == []
    assert t.overrides == [
        "actor.lora.adapter_path=/adapters/a",
        'actor.lora.exclude_modules=[".*visual.*"]',
        "actor.freeze_vision_tower=True",
    ]
    assert translate_overrides(["actor_rollout_ref.model.exclude_modules=[a,b]"]).overrides == [
        'actor.lora.exclude_modules=["a", "b"]'
    ]
    # verl's megatron adapter checkpoint stays refused, naming Tandem's adapter folder key
    ((key, message),) = translate_overrides(
        ["actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.model.lora.adapter_path=/a"]
    ).problems
    assert key == "actor_rollout_ref.model.lora.adapter_path" and "actor.lora.adapter_path" in message
    assert "megatron" in message


def test_megatron_lora_is_the_actors_and_reads_verls_megatron_keys():
    megatron = ["actor.strategy=megatron", "actor.lora.rank=4"]
    assert load_config(overrides=megatron).actor.lora.rank == 4
    with pytest.raises(
        ConfigError, match="critic.lora.rank=4 with actor.strategy=megatron: LoRA on megatron is"
    ):
        load_config("ppo", overrides=["actor.strategy=megatron", "critic.lora.rank=4"])
    t = translate_overrides(
        [
            "actor_rollout_ref.actor.strategy=megatron",  # verl's megatron workers read the model.lora block
            "actor_rollout_ref.model.lora.rank=16",
            "actor_rollout_ref.model.lora.target_modules=[linear_qkv,linear_fc2]",
            "actor_rollout_ref.model.lora.lora_A_init_method=kaiming",
            "actor_rollout_ref.model.lora.lora_B_init_method=zero",
        ]
    )
    assert t.problems == []
    assert t.overrides == [
        "actor.strategy=megatron",
        "actor.lora.rank=16",
        'actor.lora.target_modules=["linear_qkv", "linear_fc2"]',
        "actor.lora.init_a=kaiming",
    ]
    # the megatron names are the projections they fuse, on either engine
    assert hf_target_modules(["linear_qkv", "o_proj", "linear_fc2"]) == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "down_proj",
    ]
    for key, value in (("lora_A_init_method", "normal"), ("lora_B_init_method", "kaiming")):
        ((_, message),) = translate_overrides(
            ["actor_rollout_ref.actor.strategy=megatron", f"actor_rollout_ref.model.lora.{key}={value}"]
        ).problems
        assert f"{key}={value!r}" in message
