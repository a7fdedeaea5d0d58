"""The package map of docs/DESIGN.md, checked on the source: imports point only down the layers, no two
modules import each other (directly or round a circle, lazy imports included), no source file is over
600 lines. Read from the files with `ast`, nothing imported."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "tandem"

# docs/DESIGN.md's layers, lowest first: a package may import packages of lower layers only.
LAYERS = [
    {"batch", "usercode", "models", "algo_options", "rollout_options", "train_engine_options", "run_folder"},
    {"algos", "rewards", "controller", "view"},
    {"tools"},
    {"config"},
    {"data"},
    {"engine", "rollout"},
    {"roles"},
    {"trainer"},
    {"commands"},
    {"cli"},
]
LAYER = {package: level for level, packages in enumerate(LAYERS) for package in packages}
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The tandem modules `name` imports anywhere in its file (`from pkg import submodule` counts as the
    submodule, not as the package's __init__)."""
    out = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in node.names]
            out.update(s for s in subs if s in modules)
            if base in modules and any(s not in modules for s in subs):
                out.add(base)
    out.discard(name)
    return out


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "tandem"


GRAPH = {name: _imports(name, path, _modules()) for name, path in _modules().items()}


def test_every_package_has_a_layer():
    packages = {_package(m) for m in GRAPH} - {"tandem"}
    assert packages <= set(LAYER), (
        f"packages missing from LAYERS (and docs/DESIGN.md): {packages - set(LAYER)}"
    )


def test_imports_point_down_the_layers():
    upward = sorted(
        f"{a} imports {b}"
        for a, targets in GRAPH.items()
        for b in targets
        if _package(a) != _package(b) and "tandem" not in (_package(a), _package(b))
        if LAYER[_package(b)] >= LAYER[_package(a)]
    )
    assert upward == []


# docs/DESIGN.md's "knows nothing of" column where a machine can read it: the roles know no engine underneath,
# the trainer and the commands no engine internals. Both reach an engine through `tandem.engine` (its __init__: build_engine,
# check_buildable) and the modules shared by every engine; never through an engine's own package.
ENGINE_PACKAGES = ("tandem.engine.fsdp", "tandem.engine.megatron")


def _engine_package_imports(graph: dict[str, set[str]], packages: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{a} imports {b}"
        for a, targets in graph.items()
        if _package(a) in packages
        for b in targets
        if any(b == p or b.startswith(p + ".") for p in ENGINE_PACKAGES)
    )


def test_roles_trainer_and_commands_import_no_engine_package():
    assert _engine_package_imports(GRAPH, ("roles", "trainer", "commands")) == []


def test_the_engine_package_check_finds_one():
    graph = {
        "tandem.roles.x": {"tandem.engine.fsdp.lora", "tandem.engine.base"},
        "tandem.engine": {"tandem.engine.fsdp"},
    }
    assert _engine_package_imports(graph, ("roles", "trainer")) == [
        "tandem.roles.x imports tandem.engine.fsdp.lora"
    ]


# The rollout engines' face (docs/DESIGN.md): outside rollout/, an engine is reached through `tandem.rollout`
# (RolloutSpec, build_rollout, check_buildable) and asked what it can do through its facts by name
# (`tandem.rollout_options`); never through an engine's own module, and never by comparing its name.
DESIGN = SRC.parents[1] / "docs" / "DESIGN.md"


def _rollout_engine_names() -> set[str]:
    """The keys of rollout_options.ROLLOUT_ENGINES, read from the file."""
    for node in ast.walk(ast.parse((SRC / "rollout_options.py").read_text())):
        if (
            isinstance(node, ast.AnnAssign | ast.Assign)
            and "ROLLOUT_ENGINES" in ast.unparse(node).split(":")[0]
        ):
            return {key.value for key in node.value.keys}
    raise AssertionError("rollout_options.py has no ROLLOUT_ENGINES")


ROLLOUT_ENGINE_NAMES = _rollout_engine_names()
# an engine's own modules: rollout/<name>.py and rollout/<name>_*.py
ROLLOUT_ENGINE_MODULES = {
    m
    for m in GRAPH
    if m.startswith("tandem.rollout.") and m.split(".")[2].split("_")[0] in ROLLOUT_ENGINE_NAMES
}
# where an engine's name may be compared outside rollout/: verl's own value names, read by the verl translation
NAME_READERS = {
    "config/verl/": "the verl translation reads verl's rollout.name values",
    "config/generate.py:translate_generation_overrides": "tandem generate's reading of verl's rollout.name",
    "models/without_torchvision.py": "the vllm package's import, not an engine choice",
}


def _engine_name_comparisons(
    sources: dict[str, str], names: set[str], home: str = "rollout/", readers: dict[str, str] = NAME_READERS
) -> list[str]:
    """`path:line` of each comparison with an engine's name (==, !=, in) in `sources` (path under src/tandem ->
    text), outside the engines' own package `home` and `readers` (a path prefix, or `path:function`)."""
    found = []
    for path, text in sources.items():
        if path.startswith(home) or any(path.startswith(r) for r in readers if ":" not in r):
            continue
        functions = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef)]
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            values = [
                e.value
                for side in sides
                for e in ([side] if isinstance(side, ast.Constant) else getattr(side, "elts", []))
                if isinstance(e, ast.Constant)
            ]
            inside = {f.name for f in functions if f.lineno <= node.lineno <= (f.end_lineno or f.lineno)}
            if names & set(values) and not any(f"{path}:{f}" in readers for f in inside):
                found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return sorted(found)


def _sources() -> dict[str, str]:
    return {str(p.relative_to(SRC)): p.read_text() for p in SRC.rglob("*.py")}


def test_no_engine_name_is_compared_outside_rollout():
    assert _engine_name_comparisons(_sources(), ROLLOUT_ENGINE_NAMES) == []


def test_the_engine_name_check_finds_one():
    sources = {
        "config/x.py": "def f(r):\n    return r.engine == 'hf' or r.mode in ('sync', 'vllm')\n",
        "rollout/y.py": "ok = name == 'vllm'\n",
        "config/generate.py": "def translate_generation_overrides(v):\n    return v == 'sglang'\n",
    }
    assert _engine_name_comparisons(sources, {"hf", "vllm", "sglang"}) == [
        "config/x.py:2: r.engine == 'hf'",
        "config/x.py:2: r.mode in ('sync', 'vllm')",
    ]


# The training engines' face (docs/DESIGN.md): outside engine/, what a training engine does is asked of its facts by
# name (`tandem.train_engine_options`), never by comparing actor.strategy with a name; the verl translation alone
# reads verl's strategy values.
def _train_engine_names() -> set[str]:
    """The keys of train_engine_options.TRAIN_ENGINES, read from the file."""
    for node in ast.walk(ast.parse((SRC / "train_engine_options.py").read_text())):
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "TRAIN_ENGINES":
            return {key.value for key in node.value.keys}
    raise AssertionError("train_engine_options.py has no TRAIN_ENGINES")


TRAIN_ENGINE_NAMES = _train_engine_names()
STRATEGY_READERS = {
    "config/verl/values.py:strategy": "verl's actor_rollout_ref.actor.strategy values",
    "config/verl/sft_keys.py:_engine_group": "verl's SFT model.strategy / engine values",
}


def test_no_strategy_name_is_compared_outside_engine():
    assert sorted(TRAIN_ENGINE_NAMES) == ["fsdp", "megatron"]
    assert _engine_name_comparisons(_sources(), TRAIN_ENGINE_NAMES, "engine/", STRATEGY_READERS) == []


def test_the_strategy_name_check_finds_one():
    sources = {
        "roles/x.py": "def f(a):\n    return a.strategy != 'megatron' or a.strategy in ['fsdp']\n",
        "engine/y.py": "megatron = strategy == 'megatron'\n",
        "config/verl/values.py": "def strategy(v):\n    return v == 'fsdp'\ndef other(v):\n    return v == 'fsdp'\n",
    }
    assert _engine_name_comparisons(sources, {"fsdp", "megatron"}, "engine/", STRATEGY_READERS) == [
        "config/verl/values.py:4: v == 'fsdp'",
        "roles/x.py:2: a.strategy != 'megatron'",
        "roles/x.py:2: a.strategy in ['fsdp']",
    ]


def test_roles_trainer_and_commands_import_no_rollout_engine_module():
    breaches = sorted(
        f"{a} imports {b}"
        for a, targets in GRAPH.items()
        if _package(a) in ("roles", "trainer", "commands")
        for b in targets & ROLLOUT_ENGINE_MODULES
    )
    assert {
        "tandem.rollout.hf",
        "tandem.rollout.vllm",
        "tandem.rollout.vllm_models",
    } <= ROLLOUT_ENGINE_MODULES
    assert breaches == []


def _new_rollout_engine_files() -> set[str]:
    """The files DESIGN.md's "Where the next things go" names for a new rollout engine (its SGLang entry)."""
    entry = next(line for line in DESIGN.read_text().split("\n- ") if line.startswith("**SGLang**"))
    files = entry.split("do not change")[0]  # the list; what follows names the tests and what is reused
    return set(re.findall(r"`((?:[a-z_]+/)*[a-z_]+\.py)`", files))


def test_designs_list_of_the_files_a_new_rollout_engine_touches_is_true():
    """Every file that writes an engine's name (outside the engines' own modules) is on the list, and every file
    on the list but the new engine's own module writes one: a new engine touches these files and no other."""
    named = {
        path
        for path, text in _sources().items()
        if not path.startswith("models/without_torchvision")
        if f"tandem.{path[:-3].replace('/', '.')}" not in ROLLOUT_ENGINE_MODULES
        if any(
            isinstance(n, ast.Constant) and n.value in ROLLOUT_ENGINE_NAMES for n in ast.walk(ast.parse(text))
        )
    }
    listed = _new_rollout_engine_files()
    assert "rollout/sglang.py" in listed
    assert named == listed - {"rollout/sglang.py"}


# The view reads files only: of the rest of Tandem it knows the run folder's names (tandem/run_folder.py), which
# itself imports nothing of Tandem, so the trainer that writes a run folder and the view that reads it share them.
def test_the_view_knows_only_the_run_folder():
    outside = sorted(
        f"{a} imports {b}"
        for a, targets in GRAPH.items()
        if _package(a) in ("view", "run_folder")
        for b in targets
        if _package(b) not in (_package(a), "run_folder")
    )
    assert outside == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles():
    assert _cycles(GRAPH) == []


# The quick commands (`tandem presets`, `tandem config`, `--help`, a config error) load none of the heavy
# libraries: cli.py and config/ import them, and whatever imports them, only inside the functions that need them
# (tests/test_cli_imports.py runs the commands and reads what they imported).
HEAVY = {"torch", "transformers", "tensordict", "vllm", "ray"}


@functools.cache
def _top_level_imports(path: Path) -> set[str]:
    """Every module a file imports when it is loaded (the statements outside functions and classes, not under
    `if TYPE_CHECKING:`), as written: `from a.b import c` gives a.b and a.b.c."""
    found: set[str] = set()

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                walk(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                walk(node.body + node.orelse + node.finalbody)

    walk(ast.parse(path.read_text()).body)
    return found


def _heavy_at_load(start: str, modules: dict[str, Path]) -> dict[str, list[str]]:
    """The heavy packages loading tandem module `start` loads, each with the chain of tandem modules to it."""
    chains: dict[str, list[str]] = {start: [start]}
    todo, heavy = [start], {}
    while todo:
        name = todo.pop()
        parts = name.split(".")
        parents = [".".join(parts[:i]) for i in range(1, len(parts))]  # a module's packages load first
        for target in [*parents, *_top_level_imports(modules[name])] if name in modules else []:
            if target.split(".")[0] in HEAVY:
                heavy.setdefault(target.split(".")[0], chains[name])
            elif target in modules and target not in chains:
                chains[target] = [*chains[name], target]
                todo.append(target)
    return heavy


def test_cli_and_config_load_no_heavy_library():
    modules = _modules()
    starts = ["tandem.cli", *sorted(m for m in modules if m.startswith("tandem.config"))]
    found = {start: heavy for start in starts if (heavy := _heavy_at_load(start, modules))}
    assert found == {}


def test_the_heavy_import_check_finds_one():
    modules = _modules()
    assert _heavy_at_load("tandem.algos.registry", modules)["torch"][:2] == [
        "tandem.algos.registry",
        "tandem.algos",
    ]
    assert _heavy_at_load("tandem.algo_options", modules) == {}


def test_no_source_file_is_over_600_lines():
    long = {
        str(p.relative_to(SRC)): n
        for p in SRC.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


# config/verl/ is the verl translation, a package of its own inside config/ (docs/DESIGN.md): the rest of Tandem
# reads it through its face (`tandem.config.verl`), never a table or rule inside it, and it reads config's
# schema and helpers, never the loader or the checks that use it.
VERL = "tandem.config.verl"
VERL_READS = {"tandem.config.coerce", "tandem.config.errors", "tandem.config.schema", "tandem.config.yaml_io"}


def _verl_face_breaches(graph: dict[str, set[str]]) -> list[str]:
    inside = {m for m in graph if m == VERL or m.startswith(VERL + ".")}
    out = [f"{a} imports {b}" for a in graph if a not in inside for b in graph[a] if b.startswith(VERL + ".")]
    out += [
        f"{a} imports {b}"
        for a in inside
        for b in graph[a]
        if _package(b) == "config" and b not in inside and b not in VERL_READS
    ]
    return sorted(out)


def test_the_verl_translation_is_read_through_its_face():
    assert _verl_face_breaches(GRAPH) == []


def test_the_verl_face_check_finds_one():
    graph = {
        "tandem.cli": {"tandem.config.verl", "tandem.config.verl.keys"},
        "tandem.config.verl": {"tandem.config.verl.keys"},
        "tandem.config.verl.keys": {"tandem.config.schema", "tandem.config.loader"},
    }
    assert _verl_face_breaches(graph) == [
        "tandem.cli imports tandem.config.verl.keys",
        "tandem.config.verl.keys imports tandem.config.loader",
    ]


def test_no_engine_imports_a_config_check():
    """The rules an engine shares with a config check live beside the schema (config/megatron_overrides.py, config/lora_names.py), so
    the engines, rollouts and roles read no config check (config/checks/)."""
    found = sorted(
        f"{a} imports {b}"
        for a, targets in GRAPH.items()
        if _package(a) in ("engine", "rollout", "roles")
        for b in targets
        if b.startswith("tandem.config.checks")
    )
    assert found == []


# docs/DESIGN.md's "knows nothing of" column where the layers alone do not say it (a package of a lower layer
# that a package could import, or a library): package -> (tandem modules it must not import, libraries it must
# not import anywhere in its files, lazy imports included)
KNOWS_NOTHING_OF: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "models": ((), ("ray",)),
    "algos": (("tandem.models", "tandem.controller"), ("ray",)),
    "rewards": (("tandem.models",), ()),
    "tools": (("tandem.models",), ()),
    "config": (("tandem.controller",), ()),
    "data": ((), ("ray",)),
    "engine": (("tandem.algos",), ("ray",)),  # but algos/core's per-token primitives (below)
}
ENGINE_MAY_USE = ("tandem.algos.core",)
# the one exception, said in docs/DESIGN.md: workers_per_node=auto on a Ray cluster asks the cluster its GPUs per
# node when the config resolves (config/gpus.py, lazily, through the controller's init_ray)
ALLOWED = {"tandem.config.gpus imports tandem.controller"}


@functools.cache
def _libraries(path: Path) -> set[str]:
    """The top-level names of every library a file imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def _knows_what_it_should_not(graph: dict[str, set[str]], files: dict[str, Path]) -> list[str]:
    out = []
    for module, targets in graph.items():
        if _package(module) not in KNOWS_NOTHING_OF:
            continue
        modules, libraries = KNOWS_NOTHING_OF[_package(module)]
        out += [
            f"{module} imports {b}"
            for b in targets
            if any(b == m or b.startswith(m + ".") for m in modules)
            and not (_package(module) == "engine" and b.startswith(ENGINE_MAY_USE))
        ]
        out += [f"{module} imports {lib}" for lib in sorted(_libraries(files[module]) & set(libraries))]
    return sorted(out)


def test_each_package_knows_nothing_of_what_design_says():
    assert [line for line in _knows_what_it_should_not(GRAPH, _modules()) if line not in ALLOWED] == []


def test_the_knows_nothing_check_finds_one(tmp_path):
    lazy = tmp_path / "x.py"
    lazy.write_text("def f():\n    import ray\n")
    graph = {
        "tandem.algos.x": {"tandem.models.tiny"},
        "tandem.engine.x": {"tandem.algos.core", "tandem.algos.kl"},
    }
    files = {"tandem.algos.x": lazy, "tandem.engine.x": tmp_path / "y.py"}
    files["tandem.engine.x"].write_text("import torch\n")
    assert _knows_what_it_should_not(graph, files) == [
        "tandem.algos.x imports ray",
        "tandem.algos.x imports tandem.models.tiny",
        "tandem.engine.x imports tandem.algos.kl",
    ]
