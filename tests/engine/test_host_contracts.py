"""The engines hold their parts and inherit none of them. Construction, weights out, checkpoints and offload, and
megatron's pipeline schedule are functions over explicit arguments or classes the engine builds and holds. Every
such class in engine/ (each class that extends nothing, but dataclasses) reads through `self` only its own
members and what its constructor sets, and assigns nothing else; an engine reads only its members, what its
constructor sets and what the engine face (TrainEngine) declares. So no part reads an attribute of the engine
that nobody declared. No `typing.Protocol` host contract is
left in engine/ (there is no host to describe). Read from the source with `ast` and from the classes: nothing is
built, megatron-core is not imported."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pathlib
import textwrap

import pytest

import tandem.engine
from tandem.engine.base import TrainEngine
from tandem.engine.fsdp.engine import FSDPEngine
from tandem.engine.fsdp.lora import WithoutAdapter
from tandem.engine.megatron.engine import MegatronEngine
from tandem.engine.megatron.parallel import ParallelLayout

ENGINES = [FSDPEngine, MegatronEngine, WithoutAdapter]
ENGINE_ROOT = pathlib.Path(tandem.engine.__file__).parent


def _self_attributes(code: object) -> tuple[set[str], set[str]]:
    """(names a class's methods, or a function, read through `self`, names they assign through `self`)."""
    tree = code if isinstance(code, ast.AST) else ast.parse(textwrap.dedent(inspect.getsource(code)))
    reads, writes = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            (writes if isinstance(node.ctx, ast.Store) else reads).add(node.attr)
    return reads, writes


def _is_value(node: ast.ClassDef) -> bool:
    """A dataclass: a value its fields describe, not a part with behaviour over state."""
    return any("dataclass" in ast.unparse(decorator) for decorator in node.decorator_list)


def _part_nodes() -> list[tuple[str, ast.ClassDef]]:
    """Every class in engine/ that extends nothing (no engine face, no library class, no Protocol) and is not a
    dataclass: the engines' parts and helpers, as (file, class), read from the source."""
    found = []
    for path in sorted(ENGINE_ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ClassDef)
                and all(ast.unparse(base) == "object" for base in node.bases)
                and not _is_value(node)
            ):
                found.append((str(path.relative_to(ENGINE_ROOT)), node))
    return found


def _check_part(node: ast.ClassDef) -> list[str]:
    """What is wrong with a class as a part: attributes it reads that no one gave it, state it keeps that its
    constructor does not set."""
    members = {
        item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
    } | {
        target.id
        for item in node.body
        for target in (item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)])
        if isinstance(item, (ast.Assign, ast.AnnAssign))
        and isinstance(target, ast.Name)
        and (isinstance(item, ast.Assign) or item.value is not None)
    }
    constructor = [
        item for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "__init__"
    ]
    set_in_init = _self_attributes(constructor[0])[1] if constructor else set()
    reads, writes = _self_attributes(node)
    problems = []
    if unknown := reads - members - set_in_init:
        problems.append(f"{node.name} reads attributes no one gave it: {sorted(unknown)}")
    if kept := writes - set_in_init:
        problems.append(f"{node.name} keeps state its constructor does not set: {sorted(kept)}")
    return problems


def _parse_class(cls: type) -> ast.ClassDef:
    return ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]


PARTS = _part_nodes()


def _engine_problems(engine: type) -> list[str]:
    """An engine's methods read only its members, what its constructors set and what the engine face declares
    (TrainEngine's annotations), and keep no state their constructors do not set."""
    ours = [cls for cls in engine.__mro__ if cls.__module__.startswith("tandem.")]
    declared = set(dir(engine)) | {name for cls in ours for name in vars(cls).get("__annotations__", {})}
    set_in_init = {
        name for cls in ours if "__init__" in vars(cls) for name in _self_attributes(vars(cls)["__init__"])[1]
    }
    reads, writes = set(), set()
    for cls in ours:
        cls_reads, cls_writes = _self_attributes(_parse_class(cls))
        reads, writes = reads | cls_reads, writes | cls_writes
    problems = []
    if unknown := reads - declared - set_in_init:
        problems.append(f"{engine.__name__} reads attributes no one declared: {sorted(unknown)}")
    if kept := writes - declared - set_in_init:
        problems.append(f"{engine.__name__} keeps state its constructor does not set: {sorted(kept)}")
    return problems


@pytest.mark.parametrize(
    "path",
    ["fsdp/weights.py", "fsdp/state.py", "megatron/weights.py", "megatron/state.py", "megatron/schedule.py"],
)
def test_the_former_mixins_are_parts(path):
    """Weights out, checkpoints and offload, and megatron's schedule: classes the engine builds and holds."""
    assert [node.name for file, node in PARTS if file == path]


@pytest.mark.parametrize("engine", ENGINES, ids=[engine.__name__ for engine in ENGINES])
def test_an_engine_inherits_only_the_engine_face(engine):
    assert engine.__bases__ == (TrainEngine,)
    assert _engine_problems(engine) == []


@pytest.mark.parametrize(
    "part", [node for _, node in PARTS], ids=[f"{file}:{node.name}" for file, node in PARTS]
)
def test_a_part_reads_only_what_its_constructor_sets(part):
    assert _check_part(part) == []


def test_no_host_protocol_is_left_in_engine():
    """A `typing.Protocol` in engine/ would describe a host some mixin reads: there is none."""
    protocols = []
    for path in sorted(ENGINE_ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                ast.unparse(base).split(".")[-1] == "Protocol" for base in node.bases
            ):
                protocols.append(f"{path.relative_to(ENGINE_ROOT)}:{node.name}")
    assert protocols == []


def test_the_parallel_layout_is_a_frozen_value():
    fields = {field.name for field in dataclasses.fields(ParallelLayout)}
    assert {"tp_rank", "tp_size", "pp_rank", "pp_size", "vp_size", "dp_rank", "dp_size"} <= fields
    assert {"cp_rank", "cp_size", "ep_rank", "ep_size", "tp_group", "pp_group", "pp_ranks"} <= fields
    layout = ParallelLayout(**{name: 1 for name in fields} | {"pp_rank": 1, "pp_size": 2})
    assert layout.last_stage and not dataclasses.replace(layout, pp_rank=0).last_stage
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.tp_rank = 3


def test_the_check_sees_an_undeclared_read_and_kept_state():
    source = textwrap.dedent(
        """
        class Reader:
            def __init__(self, rank):
                self.rank = rank

            def where(self):
                return self.rank + self.world_size  # world_size: nobody gave it

        class Keeper:
            def __init__(self):
                self.step = 0

            def advance(self):
                self.step += 1
                self.last = self.step  # state the constructor does not set

        class Good:
            limit: int = 3

            def __init__(self, rank):
                self.rank = rank
                self.calls = 0

            def where(self):
                self.calls += 1
                return self.rank + self.offset() + self.limit

            def offset(self):
                return 1
        """
    )
    reader, keeper, good = ast.parse(source).body
    assert _check_part(reader) == ["Reader reads attributes no one gave it: ['world_size']"]
    assert _check_part(keeper) == ["Keeper keeps state its constructor does not set: ['last']"]
    assert _check_part(good) == []
