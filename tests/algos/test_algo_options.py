"""tandem/algo_options.py lists, without torch, the names and metadata of every registry `import tandem.algos`
fills: config validation reads the list where tandem.algos is not loaded (`tandem config`), so the two must
agree name for name."""

from __future__ import annotations

import pytest

import tandem.algos  # noqa: F401 - importing registers the built-in names
from tandem import algo_options
from tandem.algo_options import Names
from tandem.algos import registry
from tandem.algos.registry import Registry

REGISTRIES = sorted(name for name, value in vars(registry).items() if isinstance(value, Registry))
LISTS = sorted(name for name, value in vars(algo_options).items() if isinstance(value, Names))


def test_every_registry_is_listed():
    assert LISTS == REGISTRIES
    assert len(REGISTRIES) >= 7  # advantage estimators, losses, KL, aggregation, controllers, IS levels, RS


@pytest.mark.parametrize("name", REGISTRIES)
def test_the_list_holds_each_registered_name_with_its_metadata(name):
    live, listed = getattr(registry, name), getattr(algo_options, name)
    assert listed.kind == live.kind
    assert listed.names() == live.names()
    assert {n: listed.info(n) for n in listed.names()} == {n: live.info(n) for n in live.names()}


def test_an_unknown_name_reads_as_the_registry_says_it():
    listed, live = algo_options.ADV_ESTIMATORS, registry.ADV_ESTIMATORS
    assert listed.unknown_message("grpp") == live.unknown_message("grpp")
    assert listed.unknown_message("grpp").startswith(
        "unknown advantage estimator 'grpp'. Did you mean 'grpo'?"
    )
    with pytest.raises(KeyError, match="Did you mean 'gae'"):
        listed.info("gea")
