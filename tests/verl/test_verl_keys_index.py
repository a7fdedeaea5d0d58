"""Every key of verl's configs can be found by grepping its exact name: written in a table of src/tandem/config/
(config/verl/keys.py and the tables it merges), or, where a rule for many keys covers it (a glob, a subtree, a
renamed section), in the generated index tests/verl/keys_index.py, which must be current."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tandem.config.verl.extra_keys import EXTRA_KEYS
from tandem.config.verl.keys import VERL_KEYS
from tandem.config.verl.megatron_keys import MEGATRON_KEYS
from tandem.config.verl.translate import _reads_as_verl

from .verl_keys_script import ROOT, load_generator


@pytest.fixture(scope="module")
def generator():
    return load_generator()


def test_index_is_up_to_date(generator):
    written = generator.INDEX.read_text() if generator.INDEX.exists() else ""
    assert written == generator.render(), (
        f"{generator.INDEX.relative_to(ROOT)} is out of date with the verl tables: "
        f"run `{generator.REGENERATE}` and commit it"
    )


def test_every_key_of_verls_configs_is_written_in_a_table_or_the_index(generator):
    named = generator.named_in_tables() | set(_index_keys(generator.INDEX))
    configs = {
        "rl": [k for k in generator.config_keys(*generator.RL_CONFIGS) if _reads_as_verl(k)],
        "sft": [k for k in generator.config_keys(*generator.SFT_CONFIGS) if _reads_as_verl(k, True)],
        "generation": generator.config_keys("generation"),
    }
    assert {name: len(keys) for name, keys in configs.items()} == {"rl": 644, "sft": 126, "generation": 43}
    assert {name: [k for k in keys if k not in named] for name, keys in configs.items()} == {
        "rl": [],
        "sft": [],
        "generation": [],
    }


def test_a_table_key_no_line_names_is_refused(generator, monkeypatch):
    """A table entry made by code (a loop) is not greppable: the generator refuses it rather than index it."""
    named = generator.named_in_tables()
    monkeypatch.setattr(generator, "named_in_tables", lambda: named - {"actor_rollout_ref.actor.optim.lr"})
    with pytest.raises(
        ValueError, match=r"^actor_rollout_ref\.actor\.optim\.lr: a VERL_KEYS entry no line names"
    ):
        generator.render()


def test_no_key_is_in_two_tables():
    """VERL_KEYS is its literal and the megatron and extra tables merged: a key in two would hide one rule."""
    source = (ROOT / "src/tandem/config/verl/keys.py").read_text()
    table = next(
        node.value
        for node in ast.parse(source).body
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "VERL_KEYS"
    )
    own = [k.value for k in table.keys if isinstance(k, ast.Constant)]
    assert set(own).isdisjoint(MEGATRON_KEYS) and set(own).isdisjoint(EXTRA_KEYS)
    assert set(MEGATRON_KEYS).isdisjoint(EXTRA_KEYS)
    assert len(VERL_KEYS) == len(own) + len(MEGATRON_KEYS) + len(EXTRA_KEYS)


def _index_keys(path: Path) -> list[str]:
    return [
        k.value
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Dict)
        for k in node.value.keys
    ]
