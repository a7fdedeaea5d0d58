"""A verl (Hydra) YAML config composed into one tree, as `python -m verl.trainer.main_ppo
--config-path DIR --config-name NAME` would, without Hydra: `defaults:` lists are followed through
verl's config folders, `${...}` interpolations resolved, and `tandem config --from-verl FILE` written.

What is followed: `defaults:` entries `name`, `group: option`, `group@package: option` (the package
relative to the including config's, as Hydra places it), `../group@package: option`, `_self_`
(last when not listed), `override` / `optional` prefixes; `hydra.searchpath` entries `file://DIR`
(relative to the working folder or the file's folder). Interpolations `${a.b}`, `${.a}` (relative),
`${oc.select:a.b,default}` and `${oc.env:VAR,default}`. A defaults entry that is not found (a verl
YAML copied out of a verl checkout) is named in the notes and skipped: verl's defaults for that part are
then not read, and Tandem's `verl` preset (verl's defaults in Tandem's keys) applies.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tandem.config.errors import ConfigError
from tandem.config.yaml_io import deep_merge, parse_scalar, read_yaml

# top-level sections only a verl config has: a YAML holding one is read as verl's
VERL_SECTIONS = (
    "actor_rollout_ref",
    "hydra",
    "defaults",
    "custom_reward_function",
    "global_profiler",
    "reward_model",
)


def looks_like_verl(tree: Mapping[str, Any]) -> bool:
    """Whether a parsed YAML file is a verl config (it has a section only verl has)."""
    return any(section in tree for section in VERL_SECTIONS)


def compose(path: Path, notes: list[str] | None = None, top: Any = None) -> dict[str, Any]:
    """The verl config at `path` with its `defaults:` merged in and its interpolations resolved; `top`: the
    file already parsed (None: read here)."""
    notes = notes if notes is not None else []
    top = (read_yaml(path) if top is None else top) or {}
    if not isinstance(top, dict):
        raise ConfigError(f"{path} must hold a mapping of verl's sections, not a {type(top).__name__}")
    roots = [path.parent, *_search_path(top, path)]
    tree = _compose_file(path, top, "", roots, notes, (path.resolve(),))
    return _resolve(tree, notes)


def _search_path(top: Mapping[str, Any], path: Path) -> list[Path]:
    entries = ((top.get("hydra") or {}).get("searchpath") or []) if isinstance(top.get("hydra"), dict) else []
    roots = []
    for entry in entries:
        if isinstance(entry, str) and entry.startswith("file://"):
            rel = Path(entry.removeprefix("file://")).expanduser()
            roots += [rel] if rel.is_absolute() else [Path.cwd() / rel, path.parent / rel]
    return roots


def _compose_file(
    path: Path,
    data: dict[str, Any],
    package: str,
    roots: list[Path],
    notes: list[str],
    chain: tuple[Path, ...],
) -> dict[str, Any]:
    data = dict(data)
    defaults = data.pop("defaults", None) or []
    data.pop("hydra", None)
    own = _place(data, package)
    out: dict[str, Any] = {}
    placed_self = False
    for entry in defaults:
        if entry == "_self_":
            out, placed_self = deep_merge(out, own), True
            continue
        found = _entry_file(entry, path.parent, package, roots)
        if found is None:
            notes.append(
                f"{path.name}: defaults entry {entry!r} not found (looked in {path.parent} and the "
                "hydra searchpath); verl's defaults for it are not read"
            )
            continue
        sub_path, sub_package = found
        if sub_path.resolve() in chain:
            raise ConfigError(f"{path}: defaults include each other in a loop ({sub_path})")
        sub = read_yaml(sub_path) or {}
        out = deep_merge(
            out, _compose_file(sub_path, sub, sub_package, roots, notes, (*chain, sub_path.resolve()))
        )
    return out if placed_self else deep_merge(out, own)


def _entry_file(entry: Any, here: Path, package: str, roots: list[Path]) -> tuple[Path, str] | None:
    """A defaults entry -> (its YAML file, the package it lands in), or None when it names nothing."""
    if isinstance(entry, str):
        group_spec, option = entry, None
    elif isinstance(entry, dict) and len(entry) == 1:
        ((group_spec, option),) = entry.items()
        if option is None or option == "???":
            return None
    else:
        return None
    group_spec = str(group_spec)
    for prefix in ("override ", "optional "):
        group_spec = group_spec.removeprefix(prefix)
    group, _, pkg = group_spec.partition("@")
    if option is None:  # `name` or `name@pkg`: a config file beside this one
        rel, default_pkg = Path(f"{group}.yaml"), ""
    else:
        rel, default_pkg = Path(group) / f"{option}.yaml", Path(group).name
    for base in (here, *roots):
        candidate = (base / rel).resolve()
        if candidate.is_file():
            return candidate, _join(package, pkg if pkg else default_pkg)
    return None


def _place(data: dict[str, Any], package: str) -> dict[str, Any]:
    for part in reversed([p for p in package.split(".") if p]):
        data = {part: data}
    return data


def _join(package: str, sub: str) -> str:
    return ".".join(p for p in (package, sub) if p)


# --- interpolations ---------------------------------------------------------------------------------

_INTERP = re.compile(r"\$\{([^${}]*)\}")


def _resolve(tree: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """Every `${...}` in the tree's strings replaced, up to 8 levels of one pointing at another."""

    def walk(node: Any, where: tuple[str, ...]) -> Any:
        if isinstance(node, dict):
            return {k: walk(v, (*where, str(k))) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, where) for v in node]
        if isinstance(node, str) and "${" in node:
            return _interpolate(node, where[:-1], tree, notes, 0)
        return node

    return walk(tree, ())


def _interpolate(
    text: str, parent: tuple[str, ...], tree: dict[str, Any], notes: list[str], depth: int
) -> Any:
    whole = _INTERP.fullmatch(text)
    if whole:
        return _lookup(whole.group(1), parent, tree, notes, depth)
    return _INTERP.sub(lambda m: str(_lookup(m.group(1), parent, tree, notes, depth)), text)


_MISSING = object()


def _lookup(expr: str, parent: tuple[str, ...], tree: dict[str, Any], notes: list[str], depth: int) -> Any:
    expr = expr.strip()
    default: Any = _MISSING
    if expr.startswith("oc.env:"):
        name, _, fallback = expr.removeprefix("oc.env:").partition(",")
        return os.environ.get(name.strip(), fallback.strip() or None)
    if expr.startswith("oc.select:"):
        expr, _, fallback = expr.removeprefix("oc.select:").partition(",")
        expr, default = expr.strip(), parse_scalar(fallback.strip())
    elif ":" in expr:
        notes.append(f"interpolation ${{{expr}}} is not one Tandem resolves; the key is left unset")
        return None
    if expr.startswith("."):
        levels = len(expr) - len(expr.lstrip("."))
        keys = (*parent[: len(parent) - levels + 1], *expr.lstrip(".").split("."))
    else:
        keys = tuple(expr.split("."))
    node: Any = tree
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return None if default is _MISSING else default
        node = node[key]
    if isinstance(node, str) and "${" in node and depth < 8:
        return _interpolate(node, keys[:-1], tree, notes, depth + 1)
    return node
