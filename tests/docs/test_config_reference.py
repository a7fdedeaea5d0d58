"""docs/config-reference.md is generated from the config code (scripts/gen_config_reference.py): it must be
current, and what it says about a key must be what the code says."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tandem.config import TandemConfig, config_to_dict

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def generator():
    spec = importlib.util.spec_from_file_location(
        "gen_config_reference", ROOT / "scripts/gen_config_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def page(generator) -> str:
    return generator.render()


def test_page_is_up_to_date(generator, page):
    written = generator.PAGE.read_text() if generator.PAGE.exists() else ""
    assert written == page, (
        f"{generator.PAGE.relative_to(ROOT)} is out of date with src/tandem/config/: "
        f"run `{generator.REGENERATE}` (python scripts/gen_config_reference.py) and commit the page"
    )


def _leaves(tree: dict, prefix: str = "") -> list[str]:
    keys = []
    for name, value in tree.items():
        if isinstance(value, dict) and name not in ("custom_reward_kwargs",):
            keys += _leaves(value, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def test_every_key_of_the_schema_has_its_heading(page):
    keys = _leaves(config_to_dict(TandemConfig()))
    assert len(keys) > 200
    missing = [key for key in keys if f"### `{key}` {{ #{key} }}" not in page]
    assert missing == []


def _entry(page: str, key: str) -> str:
    return page.split(f"### `{key}` {{ #{key} }}\n", 1)[1].split("\n### ", 1)[0].strip()


def test_a_key_shows_type_default_comment_presets_and_foreign_names(page):
    entry = _entry(page, "data.max_prompt_length")
    assert entry.startswith("_int_, default `512`. TOKENS per prompt at most")
    assert "`128` (base," in entry  # base sets 128 and every preset built on it inherits it
    assert "**verl:** `actor_rollout_ref.rollout.prompt_length`" in entry
    assert "**TRL:** `max_prompt_length`" in entry


def test_a_key_set_by_one_preset_and_two_verl_names(page):
    entry = _entry(page, "actor.clip_ratio_low")
    assert entry.startswith("_float_, default `0.2`.")
    assert "**Presets:** `0.0003` (gspo)" in entry
    # verl's clip_ratio sets both bounds; clip_ratio_low is also read by its own name
    assert "`actor_rollout_ref.actor.clip_ratio`, `actor_rollout_ref.actor.clip_ratio_low`" in entry


def test_literal_types_list_their_choices_and_comment_lines_above_a_field_are_read(page):
    entry = _entry(page, "actor.fsdp.attn_implementation")
    assert entry.startswith(
        "_one of `auto`, `sdpa`, `eager`, `flash_attention_2`, `varlen`, `flex_attention`, `sdpa_split`_, "
        "default `auto`. attention kernel"
    )
    entry = _entry(page, "actor.fsdp.lm_head_chunk_tokens")
    assert entry.startswith("_int, `auto` or null_, default `auto`. TOKENS per chunk of the LM head")


def test_presets_are_compared_with_the_default_by_value(generator, page):
    # YAML reads 1e-5 as the text '1e-5': equal to the default 1e-05, so not listed as a difference
    assert generator.same_value("1e-5", 1e-05) and generator.same_value([0.9, 0.999], (0.9, 0.999))
    assert not generator.same_value("1e-6", 1e-05) and not generator.same_value(True, 1)
    assert not generator.same_value(None, 0) and generator.same_value("auto", "auto")
    critic_lr = page.split("### `critic.optim.lr` ")[1].split("\n### ")[0]
    assert "Presets" not in critic_lr  # ppo and verl set 1e-5, the default
