"""data.chat_template_kwargs (the chat template's variables) as a Tandem key, and verl's
data.apply_chat_template_kwargs read into it on each of verl's command lines: PPO (and a composed YAML), SFT
and main_generation; bad values are errors naming the key as written."""

from __future__ import annotations

import pytest

from tandem.config import ConfigError, load_config
from tandem.config.generate import load_generate_config
from tandem.config.verl.translate import translate_overrides, translate_tree

GENERATE = ["model.path=/m", "data.path=/d.parquet", "data.output_path=/o.parquet"]


def test_tandem_key_one_name_at_a_time_or_whole():
    one = load_config(
        "grpo", ["data.chat_template_kwargs.enable_thinking=false", "data.chat_template_kwargs.x=3"]
    )
    assert one.data.chat_template_kwargs == {"enable_thinking": False, "x": 3}
    whole = load_config("grpo", ["data.chat_template_kwargs={reasoning_effort: medium}"])
    assert whole.data.chat_template_kwargs == {"reasoning_effort": "medium"}
    assert load_config("grpo").data.chat_template_kwargs == {}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.chat_template_kwargs=3"], "data.chat_template_kwargs: got 3, expected a mapping"),
        (["data.chat_template_kwargs.tools=[a]"], "data.chat_template_kwargs.tools: tools is an argument of"),
        (
            ["data.chat_template_kwargs.budget=[1, 2]"],
            "data.chat_template_kwargs.budget: a template variable here",
        ),
        (
            ["data.chat_template_kwargs.enable_thinking=false", "data.chat_template=plain"],
            "which data.chat_template=plain does not use",
        ),
    ],
)
def test_bad_values_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match="(?s)" + message.replace("[", r"\[")):
        load_config("grpo", overrides)


def test_ppo_command_line_and_yaml():
    # verl's gpt-oss GRPO script writes it this way (examples/grpo_trainer/run_gptoss_20b.sh)
    one = translate_overrides(["+data.apply_chat_template_kwargs.reasoning_effort=medium"])
    assert one.overrides == ["data.chat_template_kwargs.reasoning_effort=medium"] and not one.problems
    whole = translate_overrides(["data.apply_chat_template_kwargs={enable_thinking:false}"])
    assert whole.overrides == ['data.chat_template_kwargs={"enable_thinking": false}']
    assert load_config("verl", whole.overrides).data.chat_template_kwargs == {"enable_thinking": False}
    tree = translate_tree({"data": {"apply_chat_template_kwargs": {"enable_thinking": False}}})
    assert load_config("verl", tree.overrides).data.chat_template_kwargs == {"enable_thinking": False}
    # verl's default, {}: Tandem's default
    empty = translate_tree({"data": {"apply_chat_template_kwargs": {}}})
    assert load_config("verl", empty.overrides).data.chat_template_kwargs == {}


def test_sft_command_line():
    t = translate_overrides(["+data.apply_chat_template_kwargs.enable_thinking=False"], sft=True)
    assert t.overrides == ["data.chat_template_kwargs.enable_thinking=False"] and not t.problems
    assert load_config("verl_sft", t.overrides).data.chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize("sft", [False, True])
def test_a_value_that_is_no_mapping_is_refused_naming_verls_key(sft):
    t = translate_overrides(["data.apply_chat_template_kwargs=enable_thinking"], sft=sft)
    ((key, message),) = t.problems
    assert key == "data.apply_chat_template_kwargs"
    assert message.startswith("data.apply_chat_template_kwargs=enable_thinking: give a mapping")


def test_generation_command_line():
    cfg, _ = load_generate_config(None, [*GENERATE, "+data.apply_chat_template_kwargs.reasoning_effort=high"])
    assert cfg.chat_template_kwargs == {"reasoning_effort": "high"}
    cfg, _ = load_generate_config(
        None, [*GENERATE, "data.apply_chat_template_kwargs={enable_thinking:false}"]
    )
    assert cfg.chat_template_kwargs == {"enable_thinking": False}
    tandem_keys = ["model_path=/m", "data_path=/d.parquet", "output_path=/o.parquet"]
    cfg, _ = load_generate_config(None, [*tandem_keys, "chat_template_kwargs.enable_thinking=false"])
    assert cfg.chat_template_kwargs == {"enable_thinking": False}
    with pytest.raises(ConfigError, match=r"data.apply_chat_template_kwargs=3: give a mapping"):
        load_generate_config(None, [*GENERATE, "data.apply_chat_template_kwargs=3"])
    with pytest.raises(
        ConfigError, match=r"data.apply_chat_template_kwargs.tokenize: tokenize is an argument"
    ):
        load_generate_config(None, [*GENERATE, "+data.apply_chat_template_kwargs.tokenize=true"])
    with pytest.raises(ConfigError, match=r"which chat_template=none does not use"):
        load_generate_config(None, [*tandem_keys, "chat_template_kwargs.x=1", "chat_template=none"])
