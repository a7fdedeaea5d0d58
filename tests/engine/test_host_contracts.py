"""Each engine mixin's host contract (a `typing.Protocol` in the mixin's module) is what the mixin reads of its
engine, and the engine provides all of it; a part built over explicit arguments (megatron's `PipelineSchedule`)
reads nothing but what its constructor sets, and the engine is not one of its subclasses. Read from the source
with `ast` and from the classes (nothing is built, megatron-core is not imported)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap

import pytest

from tandem.engine.fsdp import build as fsdp_build
from tandem.engine.fsdp import state as fsdp_state
from tandem.engine.fsdp import weights as fsdp_weights
from tandem.engine.fsdp.engine import FSDPEngine
from tandem.engine.megatron import build as megatron_build
from tandem.engine.megatron import schedule as megatron_schedule
from tandem.engine.megatron import state as megatron_state
from tandem.engine.megatron import weights as megatron_weights
from tandem.engine.megatron.engine import MegatronEngine
from tandem.engine.megatron.parallel import ParallelLayout

CONTRACTS = [
    (FSDPEngine, fsdp_build.ModelBuild, fsdp_build.BuildHost),
    (FSDPEngine, fsdp_weights.WeightsOut, fsdp_weights.WeightsHost),
    (FSDPEngine, fsdp_state.CheckpointAndOffload, fsdp_state.StateHost),
    (MegatronEngine, megatron_build.ModelBuild, megatron_build.BuildHost),
    (MegatronEngine, megatron_weights.WeightsOut, megatron_weights.WeightsHost),
    (MegatronEngine, megatron_state.Checkpoints, megatron_state.CheckpointHost),
]
IDS = [f"{engine.__name__}-{mixin.__name__}" for engine, mixin, _ in CONTRACTS]
# parts an engine builds over explicit arguments and holds (engine, the part's class)
PARTS = [(MegatronEngine, megatron_schedule.PipelineSchedule)]


def _self_attributes(code: object) -> tuple[set[str], set[str]]:
    """(names a class's methods, or a function, read through `self`, names they assign through `self`)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(code)))
    reads, writes = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            (writes if isinstance(node.ctx, ast.Store) else reads).add(node.attr)
    return reads, writes


def _members(protocol: type) -> set[str]:
    """A Protocol's attributes (annotations) and methods, those of the Protocols it extends included."""
    names: set[str] = set()
    for cls in protocol.__mro__:
        if cls.__module__.startswith("tandem."):
            names |= set(vars(cls).get("__annotations__", {}))
            names |= {
                name for name, value in vars(cls).items() if callable(value) and not name.startswith("__")
            }
    return names


def _provided(engine: type) -> set[str]:
    """What an engine instance has: the attributes and methods of its classes, the names they annotate, and
    every `self.x = ...` in their methods."""
    names = set(dir(engine))
    for cls in engine.__mro__[:-1]:  # not `object`
        names |= set(vars(cls).get("__annotations__", {}))
        if cls.__module__ != "abc":
            names |= _self_attributes(cls)[1]
    return names


@pytest.mark.parametrize(("engine", "mixin", "host"), CONTRACTS, ids=IDS)
def test_the_protocol_lists_what_the_mixin_reads(engine, mixin, host):
    reads, writes = _self_attributes(mixin)
    own = set(vars(mixin))  # the mixin's own methods
    wanted = reads - own - writes  # what the mixin takes from its host: state it does not set itself
    members = _members(host)
    assert wanted - members == set(), f"{mixin.__name__} reads these, missing from {host.__name__}"
    assert members - (reads | writes) == set(), f"{host.__name__} lists these, {mixin.__name__} reads none"


@pytest.mark.parametrize(("engine", "mixin", "host"), CONTRACTS, ids=IDS)
def test_the_engine_provides_its_mixins_hosts(engine, mixin, host):
    assert issubclass(engine, mixin)
    assert _members(host) - _provided(engine) == set(), f"{engine.__name__} lacks these of {host.__name__}"


@pytest.mark.parametrize(("engine", "part"), PARTS, ids=[part.__name__ for _, part in PARTS])
def test_a_part_reads_only_what_its_constructor_sets(engine, part):
    reads, writes = _self_attributes(part)
    assert not issubclass(engine, part), f"{part.__name__} is a part {engine.__name__} holds, not a base"
    set_in_init = _self_attributes(part.__init__)[1]
    assert writes == set_in_init, f"{part.__name__} keeps state it does not take in its constructor"
    assert reads - set(vars(part)) - set_in_init == set(), f"{part.__name__} reads attributes no one gave it"


def test_the_parallel_layout_is_a_frozen_value():
    fields = {field.name for field in dataclasses.fields(ParallelLayout)}
    assert {"tp_rank", "tp_size", "pp_rank", "pp_size", "vp_size", "dp_rank", "dp_size"} <= fields
    assert {"cp_rank", "cp_size", "ep_rank", "ep_size", "tp_group", "pp_group", "pp_ranks"} <= fields
    layout = ParallelLayout(**{name: 1 for name in fields} | {"pp_rank": 1, "pp_size": 2})
    assert layout.last_stage and not dataclasses.replace(layout, pp_rank=0).last_stage
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.tp_rank = 3


def test_the_check_sees_a_missing_attribute():
    class Host:
        def __init__(self) -> None:
            self.rank = 0

    class Mixin:
        def where(self) -> int:
            return self.rank + self.world_size

    assert _self_attributes(Mixin)[0] - set(vars(Mixin)) == {"rank", "world_size"}
    assert {"rank", "world_size"} - _provided(Host) == {"world_size"}
