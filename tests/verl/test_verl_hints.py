"""What Tandem says of a verl key no rule covers (config/verl/hints.py): a key verl has, now or in a release of the
last year, is never called "not a key of verl's config"; a "Did you mean" names only a key of verl's config or of
Tandem's. Checked over every key of verl's current configs and near-miss spellings of each (a letter dropped, two
letters swapped)."""

from __future__ import annotations

import re

import pytest

from tandem.config.verl.defaults import GENERATION_DEFAULTS, RL_DEFAULTS, SFT_DEFAULTS
from tandem.config.verl.hints import is_verl_config_key, unknown_verl_key_message
from tandem.config.verl.removed_keys import REMOVED_GENERATION, REMOVED_PPO, REMOVED_SFT
from tandem.config.verl.translate import is_tandem_key, translate_overrides

TABLES = {False: RL_DEFAULTS, True: SFT_DEFAULTS}  # sft -> verl's current keys of that trainer
HINT = re.compile(r"Did you mean '([^']+)'\?")


def every_level(keys) -> set[str]:
    return {".".join(k.split(".")[:n]) for k in keys for n in range(1, k.count(".") + 2)}


VERL_KEYS_NOW = every_level([*RL_DEFAULTS, *SFT_DEFAULTS, *GENERATION_DEFAULTS])


def near_misses(key: str) -> list[str]:
    """Misspellings of the last name of `key`: its first, middle and last letter dropped, its middle two and its
    last two letters swapped; and the middle letter of its first section dropped."""
    *sections, name = key.split(".")
    mid = len(name) // 2
    names = {name[1:], name[:mid] + name[mid + 1 :], name[:-1]}
    if len(name) > 2:
        names |= {
            name[: mid - 1] + name[mid] + name[mid - 1] + name[mid + 1 :],
            name[:-2] + name[-1] + name[-2],
        }
    out = [".".join([*sections, n]) for n in sorted(names) if n and n != name]
    if sections and len(sections[0]) > 2:
        first = sections[0]
        out.append(".".join([first[: len(first) // 2] + first[len(first) // 2 + 1 :], *sections[1:], name]))
    return out


@pytest.mark.parametrize("sft", [False, True])
def test_no_key_verl_has_is_called_not_a_key(sft):
    removed = [*REMOVED_PPO, *REMOVED_SFT, *REMOVED_GENERATION]
    keys = sorted(VERL_KEYS_NOW | set(removed))
    assert len(keys) > 900
    said = {k: m for k in keys if "not a key of verl's config" in (m := unknown_verl_key_message(k, sft))}
    assert said == {}


@pytest.mark.parametrize("sft", [False, True])
def test_every_did_you_mean_for_a_near_miss_of_a_verl_key_is_a_key(sft):
    """Each near miss given on a command line (`typo=1`), as the translation reads it: most are covered by a rule
    (a glob of a section Tandem takes as no effect) or left to the loader (a key under a section Tandem shares);
    each the translation calls a misspelling has a hint naming a key."""
    asked, back, wrong = 0, 0, {}
    for key in sorted(every_level(TABLES[sft])):
        for typo in near_misses(key):
            if is_verl_config_key(typo) or is_tandem_key(typo):
                continue  # another real key, not a misspelling
            messages = [m for _, m in translate_overrides([f"{typo}=1"], sft=sft).problems]
            if not messages or "not a key of verl's config" not in messages[0]:
                continue
            asked += 1
            hint = HINT.search(messages[0])
            assert hint is not None, messages[0]
            back += hint[1] == key
            if hint[1] not in VERL_KEYS_NOW and not is_tandem_key(hint[1]):
                wrong[typo] = hint[1]
    assert asked > (1500 if not sft else 200)
    assert wrong == {}
    # the hint names the key misspelled (not always: clip_cov_bl is as near clip_cov_ub as clip_cov_lb)
    assert back > 0.99 * asked


def test_hints_of_the_issue():
    # the example of the issue: a verl key (under a mapping verl passes to the model config), no guess
    message = unknown_verl_key_message("actor_rollout_ref.model.override_config.attention_dropout")
    assert "a verl key Tandem does not support" in message and "Did you mean" not in message
    # a removed key names the release that last had it, not a misspelling
    message = unknown_verl_key_message("algorithm.rollout_is_level")
    assert message.startswith("algorithm.rollout_is_level: a key of verl up to v0.6.0, removed since")
    message = unknown_verl_key_message("actor_rollout_ref.actor.ppo_mini_bach_size")
    assert message.endswith(
        "Did you mean 'actor_rollout_ref.actor.ppo_mini_batch_size'? Fix the spelling, or remove it"
    )
