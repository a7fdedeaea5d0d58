"""Turning plain values (YAML, command-line text) into typed dataclass fields, and back.

Coercion follows the annotation: `1e-6` (a string to PyYAML) becomes a float, `"3"` an int,
`"yes"` a bool, `a,b` a list. A value that does not fit is a problem naming the dotted key.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, Union

from tandem.config.errors import Problems, closest
from tandem.config.foreign_names import foreign_key_hint
from tandem.config.schema import TandemConfig

_BAD = object()  # "could not coerce"; None is a legitimate value
_TRUE = {"true", "yes", "on", "1", "y", "t"}
_FALSE = {"false", "no", "off", "0", "n", "f"}
_NULL = {"null", "~", "None"}
RESERVED = {"derived": "is computed from the other settings when the config is loaded and cannot be set"}


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of a dataclass's public fields, in declaration order."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if not f.name.startswith("_")}


def is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _union_args(tp: Any) -> tuple[Any, ...] | None:
    if typing.get_origin(tp) in (Union, types.UnionType):
        return typing.get_args(tp)
    return None


def strip_optional(tp: Any) -> Any:
    args = _union_args(tp)
    if args and type(None) in args:
        rest = tuple(a for a in args if a is not type(None))
        return rest[0] if len(rest) == 1 else Union[rest]  # noqa: UP007 - built from a tuple
    return tp


def describe(tp: Any) -> str:
    """What a type accepts, in words."""
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if tp is type(None):
        return "null"
    if tp is Any:
        return "any value"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is list:
        return f"a list of {_plural(describe(args[0]))}"
    if origin is tuple:
        return f"a list of {len(args)} {_plural(describe(args[0]))}"
    if origin is dict:
        return "a mapping"
    if _union_args(tp):
        return " or ".join(describe(a) for a in _union_args(tp))
    if is_section(tp):
        return f"a mapping of {tp.__name__} settings"
    return str(tp)


def _plural(words: str) -> str:
    for one, many in (("an integer", "integers"), ("a number", "numbers"), ("a string", "strings")):
        if words == one:
            return many
    return f"({words})" if " or " in words else words


def coerce(
    value: Any, tp: Any, key: str, problems: Problems, default: Any = None, root: type | None = None
) -> Any:
    """`value` converted to `tp`, or _BAD after recording a problem that names `key`.

    `default` is the field's current value (sections are updated in place); `root` is the
    top-level class, used to suggest keys."""
    out = _convert(value, tp, key, problems, default, root)
    if out is _BAD:
        problems.add(key, _mismatch_message(value, tp, key))
    return out


def _mismatch_message(value: Any, tp: Any, key: str) -> str:
    inner = strip_optional(tp)
    if is_section(inner):
        return section_message(key, inner, value)
    if _is_non_finite(value):
        off = "; use null to turn it off" if inner is not tp else ""
        return f"{key}: got {value!r}, but only finite numbers are allowed{off}"
    return f"{key}: got {value!r}, expected {describe(tp)}{_choice_hint(value, tp)}"


def section_message(key: str, section: type, value: Any) -> str:
    """`actor=3`: name the section and show how its keys are set."""
    example = next(name for name, tp in field_types(section).items() if not is_section(tp))
    return (
        f"{key} is a section, not a single value (got {value!r}): set the keys inside it, "
        f"e.g. {key}.{example}=..."
    )


def _is_non_finite(value: Any) -> bool:
    if isinstance(value, str):
        value = _to_float(value)
    return isinstance(value, float) and not math.isfinite(value)


def _choice_hint(value: Any, tp: Any) -> str:
    args = _union_args(tp) or (tp,)
    choices = [c for a in args if typing.get_origin(a) is Literal for c in typing.get_args(a)]
    if isinstance(value, str) and choices:
        match = closest(value, [str(c) for c in choices])
        if match:
            return f"; did you mean {match!r}?"
    return ""


def _convert(value: Any, tp: Any, key: str, problems: Problems, default: Any, root: type | None) -> Any:
    if tp is Any:
        return value
    args = _union_args(tp)
    if args is not None:
        return _convert_union(value, args, key, problems, default, root)
    origin = typing.get_origin(tp)
    if origin is Literal:
        return _convert_literal(value, typing.get_args(tp))
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        return _BAD
    if tp is int:
        if isinstance(value, bool):
            return _BAD
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                value = _to_float(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return _BAD
    if tp is float:
        if isinstance(value, bool):
            return _BAD
        number = _to_float(value) if isinstance(value, str | int | float) else _BAD
        return number if number is not _BAD and math.isfinite(number) else _BAD  # nan / inf: never a setting
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)  # `experiment_name: 2024` means the text
        return _BAD
    if origin is list:
        items = _as_items(value)
        if items is None:
            return _BAD
        out = [coerce(v, typing.get_args(tp)[0], f"{key}[{i}]", problems) for i, v in enumerate(items)]
        return list(default or []) if _BAD in out else out  # item problems were recorded
    if origin is tuple:
        items = _as_items(value)
        elem_types = typing.get_args(tp)
        if items is None or len(items) != len(elem_types):
            return _BAD
        out = [coerce(v, t, f"{key}[{i}]", problems) for i, (v, t) in enumerate(zip(items, elem_types))]
        return default if _BAD in out else tuple(out)
    if origin is dict:
        if value is None:
            return {}
        return dict(value) if isinstance(value, Mapping) else _BAD
    if is_section(tp):
        if value is None:
            return default if default is not None else tp()
        if not isinstance(value, Mapping):
            return _BAD
        target = default if default is not None else tp()
        parse_into(target, value, key, problems, root=root)
        return target
    raise TypeError(f"config field {key} has an unsupported annotation {tp!r}")


def _convert_union(
    value: Any, args: tuple[Any, ...], key: str, problems: Problems, default: Any, root: type | None
) -> Any:
    if type(None) in args and (value is None or (isinstance(value, str) and value.strip() in _NULL)):
        return None
    members = [a for a in args if a is not type(None)]
    for member in members:  # a value that already fits one member exactly keeps its meaning
        if _fits_exactly(value, member):
            return value
    for member in members:
        scratch = Problems()
        out = _convert(value, member, key, scratch, default, root)
        if out is not _BAD and not scratch:
            return out
    return _BAD


def _fits_exactly(value: Any, tp: Any) -> bool:
    if typing.get_origin(tp) is Literal:
        return any(value == c and type(value) is type(c) for c in typing.get_args(tp))
    return tp in (bool, int, float, str) and type(value) is tp


def _convert_literal(value: Any, choices: tuple[Any, ...]) -> Any:
    for c in choices:
        if value == c and type(value) is type(c):
            return c
    if isinstance(value, str):
        for c in choices:
            if isinstance(c, str) and c.lower() == value.strip().lower():
                return c
    return _BAD


def _to_float(value: str | int | float) -> Any:
    try:
        return float(value.strip() if isinstance(value, str) else value)
    except (ValueError, OverflowError):
        return _BAD


def _as_items(value: Any) -> list[Any] | None:
    if isinstance(value, list | tuple):
        return list(value)
    if value is None:
        return []
    if isinstance(value, str):  # `a.parquet,b.parquet` or a single item
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, Mapping):
        return None
    return [value]


def parse_into(
    obj: Any, data: Mapping[str, Any], prefix: str, problems: Problems, root: type | None = None
) -> None:
    """Set the fields of dataclass instance `obj` from `data`, recording every problem."""
    root = root or type(obj)
    types_ = field_types(type(obj))
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if name in RESERVED and not prefix:
            problems.add(key, f"{key} {RESERVED[name]}")
            continue
        if name not in types_:
            problems.add(key, unknown_key_message(key, root))
            continue
        out = coerce(value, types_[name], key, problems, default=getattr(obj, name), root=root)
        if out is not _BAD:
            setattr(obj, name, out)


@functools.cache
def all_paths(cls: type, prefix: str = "") -> tuple[str, ...]:
    """Every dotted key of a dataclass tree, sections included."""
    out: list[str] = []
    for name, tp in field_types(cls).items():
        path = f"{prefix}.{name}" if prefix else name
        out.append(path)
        if is_section(tp):
            out.extend(all_paths(tp, path))
    return tuple(out)


def section_at(cls: type, dotted: str) -> type | None:
    """The section class at a dotted path ('' = the root), or None if the path is not a section."""
    for part in [p for p in dotted.split(".") if p]:
        tp = field_types(cls).get(part)
        if not is_section(tp):
            return None
        cls = tp
    return cls


def unknown_key_message(key: str, root: type) -> str:
    """`unknown key 'actor.optim.lrr'; did you mean 'actor.optim.lr'?`"""
    paths = all_paths(root)
    foreign = foreign_key_hint(key, paths)
    if foreign:
        return foreign
    parts = key.split(".")
    for depth in range(1, len(parts)):
        head = ".".join(parts[:depth])
        if head in paths and section_at(root, head) is None:
            return f"unknown key '{key}': {head} is a single setting, not a section; set it as {head}=..."
    same_leaf = [p for p in paths if p.rsplit(".", 1)[-1] == parts[-1]]
    if same_leaf and section_at(root, ".".join(parts[:-1])) is not None:  # right name, wrong section
        return f"unknown key '{key}'; did you mean " + " or ".join(f"'{p}'" for p in same_leaf[:3]) + "?"
    candidates = []
    for depth in range(len(parts)):  # the first segment that is not a key of its section
        parent = ".".join(parts[:depth])
        section = section_at(root, parent)
        if section is None or parts[depth] in field_types(section):
            continue
        match = closest(parts[depth], field_types(section))
        if match:
            fixed = ".".join([*parts[:depth], match, *parts[depth + 1 :]])
            candidates.append(fixed if fixed in paths else ".".join([*parts[:depth], match]))
        break
    anywhere = closest(key, [p for p in paths if not key.startswith(p + ".")])
    if anywhere:
        candidates.append(anywhere)
    hint = max(candidates, key=lambda c: difflib.SequenceMatcher(None, key, c).ratio(), default=None)
    if hint:
        return f"unknown key '{key}'; did you mean '{hint}'?"
    leaves = {p.rsplit(".", 1)[-1] for p in paths}
    leaf = closest(parts[-1], leaves)
    if leaf:
        options = [p for p in paths if p.rsplit(".", 1)[-1] == leaf][:3]
        return f"unknown key '{key}'; did you mean " + " or ".join(f"'{o}'" for o in options) + "?"
    parent = section_at(root, ".".join(parts[:-1])) or root
    return f"unknown key '{key}'; valid keys here: {', '.join(field_types(parent))}"


def to_plain(obj: Any) -> Any:
    """Dataclasses to dicts, tuples to lists; private fields (derived) left out."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {name: to_plain(getattr(obj, name)) for name in field_types(type(obj))}
    if isinstance(obj, list | tuple):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


def type_at(dotted: str) -> Any:
    """The annotation a dotted key leads to (inside a dict field: Any), or None if there is no such key."""
    cls: Any = TandemConfig
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        tp = field_types(cls).get(part)
        if tp is None:
            return None
        if i == len(parts) - 1:
            return tp
        if typing.get_origin(tp) is dict:
            return Any
        if not is_section(tp):
            return None
        cls = tp
    return None
