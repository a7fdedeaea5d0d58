"""The audit of verl's "no effect" keys (tests/verl/data/no_effect_audit.json): every entry of the verl tables whose
rule is "no effect" (a literal key, a glob, a subtree; the PPO, SFT and generation tables) has a verdict there:

- "same run": its value changes nothing verl computes that Tandem's run would differ in (`values`: which values);
- "refused": it changes the run and Tandem has no way: its rule now refuses any value but verl's default, naming it;
- "built": it changes the run and maps to the Tandem key `target`.

A new no-effect entry without a verdict fails here, and so does a "same run" verdict whose entry is no longer one.
Names: a PPO key or glob as written; an SFT or generation table's entry prefixed "sft:" / "generation:".
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any

import pytest
from tests.verl.keys_index import GENERATION_INDEX, RL_INDEX, SFT_INDEX

from tandem.config.verl.defaults import RL_DEFAULTS, SFT_DEFAULTS
from tandem.config.verl.engine_keys import STRATEGY_KEY, reading_engine
from tandem.config.verl.generation_keys import GENERATION_KEYS, GENERATION_PATTERNS
from tandem.config.verl.keys import ENGINE_KWARGS, VERL_KEYS, VERL_PATTERNS, verl_rule
from tandem.config.verl.sft_keys import SFT_KEYS
from tandem.config.verl.translate import translate_overrides

from .verl_keys_script import load_generator

AUDIT: dict[str, dict[str, Any]] = json.loads(
    (Path(__file__).parent / "data" / "no_effect_audit.json").read_text()
)
ENGINE_KWARGS_REST = ENGINE_KWARGS + ".*"  # verl_rule's no-effect subtree: engine_kwargs not under .vllm.
VERDICTS = ("same run", "refused", "built")


def no_effect_entries() -> set[str]:
    """Every entry of the verl tables whose rule has no effect, named as the audit names it."""
    names = {k for k, r in VERL_KEYS.items() if r.effect == "none"}
    names |= {p for p, r in VERL_PATTERNS if r.effect == "none"}
    if verl_rule(ENGINE_KWARGS + ".sglang", lambda _: False).effect == "none":
        names.add(ENGINE_KWARGS_REST)
    names |= {f"sft:{k}" for k, r in SFT_KEYS.items() if r.effect == "none"}
    names |= {f"generation:{k}" for k, r in GENERATION_KEYS.items() if r.effect == "none"}
    names |= {f"generation:{p}" for p, r in GENERATION_PATTERNS if r.effect == "none"}
    return names


def _of(verdict: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in AUDIT.items() if v["verdict"] == verdict}


def test_the_audit_names_every_no_effect_entry_and_no_other():
    same_run = set(_of("same run"))
    assert sorted(no_effect_entries() - same_run) == [], "no-effect entries without a verdict in the audit"
    assert sorted(same_run - no_effect_entries()) == [], (
        "'same run' verdicts whose entry no longer has no effect"
    )
    assert {name: v["verdict"] for name, v in AUDIT.items() if v["verdict"] not in VERDICTS} == {}
    assert [name for name, v in AUDIT.items() if not v["reason"].strip()] == []
    assert [
        name for name, v in AUDIT.items() if v["values"] != "all" and not isinstance(v["values"], list)
    ] == []
    assert {v: len(_of(v)) for v in VERDICTS} == {"same run": 205, "refused": 28, "built": 4}


def test_every_key_a_no_effect_glob_covers_resolves_to_an_audited_entry():
    """Through the generated index: each concrete key of verl's configs a no-effect glob covers."""
    same_run = set(_of("same run"))
    missing = []
    for prefix, index in (("", RL_INDEX), ("generation:", GENERATION_INDEX)):
        for key, where in index.items():
            if not where.startswith("no effect"):
                continue
            origin = where.partition(" <- ")[2]
            name = ENGINE_KWARGS_REST if origin.startswith(ENGINE_KWARGS) else origin.removeprefix("glob ")
            if prefix + name not in same_run:
                missing.append(key)
    for (
        key,
        where,
    ) in SFT_INDEX.items():  # an SFT key read as an RL key: that key's entry, or the glob it names
        if where.startswith("no effect"):
            origin = where.partition(" <- as ")[2].split(", glob ")
            if origin[-1] not in same_run:
                missing.append(f"sft:{key}")
    assert missing == []


def _covered(name: str) -> list[tuple[str, bool]]:
    """(verl key, sft) for an audit name: the key itself, or each key of verl's configs a glob covers."""
    sft = name.startswith("sft:")
    key = name.removeprefix("sft:")
    if "*" not in key:
        return [(key, sft)]
    generator = load_generator()
    keys = [
        k
        for k in generator.config_keys(*generator.RL_CONFIGS)
        if fnmatch.fnmatchcase(k, key) and k not in VERL_KEYS  # a key with a rule of its own is its own entry
    ]
    assert keys, f"{name}: no key of verl's configs under it"
    return [(k, sft) for k in keys]


def _other_value(key: str, sft: bool) -> str:
    """A value of `key` that is not verl's default, as a command line writes it."""
    defaults = (SFT_DEFAULTS if sft else RL_DEFAULTS).get(key, [None])
    default = defaults[0]
    if isinstance(default, bool):
        return str(not default)
    if isinstance(default, (int, float)):
        return str(max(defaults) + 7)
    if isinstance(default, str):
        return default + "_other"
    if isinstance(default, list):
        return "[other]"
    if isinstance(default, dict):
        return "{other:1}"
    return "other"


def _default_text(key: str, sft: bool) -> str | None:
    defaults = (SFT_DEFAULTS if sft else RL_DEFAULTS).get(key)
    if not defaults:
        return None
    value = defaults[0]
    if isinstance(value, list):
        return "[" + ",".join(map(str, value)) + "]"
    return "null" if value is None else str(value)


@pytest.mark.parametrize("name", sorted(_of("refused")))
def test_a_refused_entry_refuses_another_value_by_name_and_accepts_verls_default(name):
    for key, sft in _covered(name):
        other = f"{key}={_other_value(key, sft)}"
        problems = translate_overrides([other], sft=sft).problems
        assert [k for k, _ in problems] == [key], other
        assert problems[0][1].startswith(other), problems[0][1]
        default = _default_text(key, sft)
        if default is not None:
            assert translate_overrides([f"{key}={default}"], sft=sft).problems == [], default


@pytest.mark.parametrize("name", sorted(_of("built")))
def test_a_built_entry_maps_to_its_tandem_key(name):
    target = AUDIT[name]["target"]
    for key, sft in _covered(name):
        value = _other_value(key, sft)
        # a key one of verl's engines reads alone, read on that engine (config/verl/engine_keys.py)
        engine = [] if sft else [f"{STRATEGY_KEY}={reading_engine(key)}"] * (reading_engine(key) is not None)
        translation = translate_overrides([*engine, f"{key}={value}"], sft=sft)
        assert translation.problems == []
        assert translation.overrides[len(engine) :] == [f"{target}={value}"]
