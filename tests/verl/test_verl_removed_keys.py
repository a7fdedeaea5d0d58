"""Keys verl had in its releases of the last year and has since removed (config/verl/removed_keys.py, generated from
the releases' composed configs in data/verl_release_keys.json): at their old default accepted as if absent, with a
note; at another value refused, naming the key, the release that last had it and verl's key for it now. Checked
over the whole table, for verl's PPO and SFT command lines, and over a whole older release's config tree."""

from __future__ import annotations

import importlib.util
import json
import os
from datetime import date
from pathlib import Path

import pytest

from tandem.config import ConfigError, load_config
from tandem.config.generate import translate_generation_overrides
from tandem.config.verl.removed import removed_key
from tandem.config.verl.removed_keys import RELEASES, REMOVED_GENERATION, REMOVED_PPO, REMOVED_SFT
from tandem.config.verl.translate import _rule, translate_overrides, translate_tree

from .test_verl_defaults import hydra_text

ROOT = Path(__file__).parents[2]
RELEASE_DATA = Path(__file__).parent / "data" / "verl_release_keys.json"
TABLES = {"ppo": REMOVED_PPO, "sft": REMOVED_SFT, "generation": REMOVED_GENERATION}
ENTRIES = [(trainer, key) for trainer, table in TABLES.items() for key in table]


def generator():
    spec = importlib.util.spec_from_file_location(
        "gen_verl_removed_keys", ROOT / "scripts/gen_verl_removed_keys.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def translate(trainer: str, text: str):
    if trainer == "generation":
        return translate_generation_overrides([text])
    return translate_overrides([text], sft=trainer == "sft")


def another_value(defaults: tuple) -> str:
    """A value none of `defaults` is, of the same kind where there is one."""
    for default in defaults:
        if isinstance(default, bool):
            return hydra_text(not default)
        if isinstance(default, (int, float)):
            return hydra_text(default * 2 + 1)
        if isinstance(default, str):
            return default + "_other"
    return "3"


def test_the_table_is_up_to_date():
    assert (ROOT / "src/tandem/config/verl/removed_keys.py").read_text() == generator().render(), (
        "src/tandem/config/verl/removed_keys.py is stale: run `python scripts/gen_verl_removed_keys.py`"
    )


def test_the_releases_are_those_of_the_last_year_or_the_last_three():
    dates = {t: date.fromisoformat(d) for t, d in json.loads(RELEASE_DATA.read_text())["releases"].items()}
    assert tuple(dates) == RELEASES == ("v0.6.0", "v0.6.1", "v0.7.0")
    select = generator().select_releases
    tags = {"v0.5.0": date(2025, 7, 23), **dates}
    assert select(tags, date(2026, 12, 6)) == ["v0.6.0", "v0.6.1", "v0.7.0"]  # only v0.7.0 within the year
    assert select(tags, date(2026, 1, 10)) == ["v0.5.0", "v0.6.0", "v0.6.1", "v0.7.0"]  # all four within it


@pytest.mark.skipif(
    not os.environ.get("VERL_GIT"), reason="set VERL_GIT to a verl git folder to re-read its releases"
)
def test_the_release_data_is_what_verls_git_says():
    module = generator()
    assert module.read_releases(Path(os.environ["VERL_GIT"])) == json.loads(RELEASE_DATA.read_text())


def test_the_table_holds_what_verl_removed():
    assert (len(REMOVED_PPO), len(REMOVED_SFT), len(REMOVED_GENERATION)) == (21, 4, 0)
    renamed = {k: v[2] for t in TABLES.values() for k, v in t.items() if v[3]}
    assert renamed == {
        "actor_rollout_ref.rollout.update_weights_bucket_megabytes": (
            "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"
        ),
        "algorithm.rollout_is_level": "algorithm.rollout_correction.rollout_is",
        "algorithm.rollout_is_threshold": "algorithm.rollout_correction.rollout_is_threshold",
        "optim.warmup_steps_ratio": "optim.lr_warmup_steps_ratio",
    }


@pytest.mark.parametrize(("trainer", "key"), ENTRIES)
def test_a_removed_key_at_its_old_default_is_accepted(trainer, key):
    old = removed_key(key, trainer)
    for default in old.defaults:
        text = f"{key}={hydra_text(default)}"
        translation = translate(trainer, text)
        assert translation.problems == [], text
        if _rule(key, trainer == "sft") is None:  # no rule of Tandem's reads it: the removed key's note
            ((given, why),) = translation.no_effect
            assert given == text and f"removed from verl after {old.last_release}" in why
            assert "at its old default it changes nothing" in why


@pytest.mark.parametrize(("trainer", "key"), ENTRIES)
def test_a_removed_key_at_another_value_is_refused_naming_verls_key_for_it(trainer, key):
    old = removed_key(key, trainer)
    text = f"{key}={another_value(old.defaults)}"
    translation = translate(trainer, text)
    rule = _rule(key, trainer == "sft")
    if rule is not None and rule.effect in ("maps", "none", "same"):
        # Tandem reads the older key itself (verl's per-role profiler: no effect; the weight bucket: mapped)
        assert translation.problems == [] and (translation.mapped or translation.no_effect), text
        return
    ((problem_key, message),) = translation.problems
    assert problem_key == key and message.startswith(text.partition("=")[0]), message
    if rule is None:  # the removed key's own message: the last release, verl's key now or that it was dropped
        assert message.startswith(f"{text}: a key of verl up to {old.last_release}, removed since"), message
        assert (old.current in message) if old.current else ("verl dropped the setting" in message)
    else:  # an older key Tandem's rules already explain: theirs names verl's key now too
        assert old.current in message, message


def tree_of(leaves: dict) -> dict:
    tree: dict = {}
    for key, value in sorted(leaves.items()):
        *sections, name = key.split(".")
        node = tree
        for section in sections:
            node = node.setdefault(section, {})
        node.setdefault(name, value)
    return tree


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("trainer", ["ppo", "sft"])
def test_an_older_releases_whole_config_reads_with_its_removed_keys_dropped(release, trainer):
    data = json.loads(RELEASE_DATA.read_text())[trainer]
    leaves = {key: defaults[0] for key, (releases, defaults) in data.items() if release in releases}
    sft = trainer == "sft"
    translation = translate_tree(tree_of(leaves), sft=sft)
    assert translation.problems == []
    # null is "not set" in a tree, said nowhere; a removed key no rule reads is dropped with its note
    unread = sorted(
        k for k in leaves if removed_key(k, trainer) and _rule(k, sft) is None and leaves[k] is not None
    )
    notes = dict(translation.dropped)
    for key in unread:
        assert "removed from verl after" in notes[f"{key}={hydra_text(leaves[key])}"]
    # the same tree with such a key at another value: refused, not dropped
    for key in unread[:1]:
        changed = translate_tree(tree_of({**leaves, key: another_value((leaves[key],))}), sft=sft)
        ((problem_key, message),) = changed.problems
        assert problem_key == key and "removed since" in message


def test_a_removed_generation_key_is_read_the_same_way(monkeypatch):
    # verl's generation.yaml lost no key in these releases; the hook is the same as the trainers'
    monkeypatch.setitem(REMOVED_GENERATION, "rollout.older_key", ((4,), "v0.6.1", "rollout.n", True))
    translation = translate_generation_overrides(["rollout.older_key=4"])
    assert translation.problems == [] and "removed from verl after v0.6.1" in translation.no_effect[0][1]
    ((_, message),) = translate_generation_overrides(["rollout.older_key=5"]).problems
    assert message.endswith("verl's name for it now is rollout.n: write rollout.n=5")


# --- real examples, as a verl 0.6 / 0.7 command line gives them ---------------------------------------------


def test_verl_0_6s_rollout_importance_sampling_keys():
    translation = translate_overrides(
        [
            "algorithm.rollout_is=false",
            "algorithm.rollout_is_level=token",
            "algorithm.rollout_is_threshold=null",
        ]
    )
    assert translation.problems == [] and translation.overrides == []
    assert translation.no_effect[0] == (
        "algorithm.rollout_is=false",
        "removed from verl after v0.6.0; at its old default it changes nothing; verl's key for it now is "
        "algorithm.rollout_correction.rollout_is",
    )
    ((key, message),) = translate_overrides(["algorithm.rollout_is_threshold=2.0"]).problems
    assert key == "algorithm.rollout_is_threshold"
    assert message == (
        "algorithm.rollout_is_threshold=2.0: a key of verl up to v0.6.0, removed since; only its old default "
        "(null) is accepted, as if absent. verl's name for it now is algorithm.rollout_correction.rollout_is_threshold: "
        "write algorithm.rollout_correction.rollout_is_threshold=2.0"
    )
    ((_, message),) = translate_overrides(["algorithm.rollout_is_mode=mask"]).problems
    assert message == (
        "algorithm.rollout_is_mode=mask: a key of verl up to v0.6.0, removed since; only its old default "
        "(truncate) is accepted, as if absent. verl replaced it with algorithm.rollout_correction.rollout_rs, "
        "which takes other values (see verl's docs for it)"
    )


def test_verl_0_7s_rollout_correction_keys_at_their_default_no_longer_stop_a_run():
    # both had a refusal of their own at any value; null (their default) asks for nothing
    for text in (
        "algorithm.rollout_correction.rollout_token_veto_threshold=null",
        "algorithm.rollout_correction.rollout_rs_threshold_lower=null",
        "algorithm.rollout_correction.use_policy_gradient=False",
    ):
        assert translate_overrides([text]).problems == [], text
    ((_, message),) = translate_overrides(["algorithm.rollout_correction.use_policy_gradient=true"]).problems
    assert "algorithm.rollout_correction.loss_type=reinforce" in message


def test_verl_0_6s_reference_model_placeholder():
    assert translate_overrides(["actor_rollout_ref.ref.model=null"]).problems == []
    ((_, message),) = translate_overrides(["actor_rollout_ref.ref.model=/models/ref"]).problems
    assert message == (
        "actor_rollout_ref.ref.model=/models/ref: a key of verl up to v0.6.1, removed since; only its old default "
        "(null) is accepted, as if absent. verl dropped the setting: remove it"
    )


def test_fsdp_sft_trainers_older_warmup_key():
    translation = translate_overrides(["optim.warmup_steps_ratio=0.1"], sft=True)
    assert translation.problems == [] and translation.overrides == []
    ((_, message),) = translate_overrides(["optim.warmup_steps_ratio=0.05"], sft=True).problems
    assert message.endswith(
        "verl's name for it now is optim.lr_warmup_steps_ratio: write optim.lr_warmup_steps_ratio=0.05"
    )


def test_a_removed_key_through_load_config():
    quiet = {"on_verl": lambda translation: None}
    base = load_config("verl", ["actor_rollout_ref.model.path=/m"], **quiet)
    older = [
        "algorithm.rollout_is=false",
        "algorithm.rollout_is_mode=truncate",
        "actor_rollout_ref.ref.model=null",
    ]
    assert load_config("verl", ["actor_rollout_ref.model.path=/m", *older], **quiet) == base
    with pytest.raises(
        ConfigError, match=r"algorithm.rollout_is=true: a key of verl up to v0.6.0, removed since"
    ):
        load_config("verl", ["actor_rollout_ref.model.path=/m", "algorithm.rollout_is=true"], **quiet)
