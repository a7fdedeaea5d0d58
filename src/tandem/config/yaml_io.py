"""Reading config YAML: a syntax error or a repeated key is a ConfigError naming the file and line."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from tandem.config.errors import ConfigError


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; in a config that silently drops a whole section."""


def _construct_unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[str, int] = {}
    for key_node, _ in node.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
            if key_node.value in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key '{key_node.value}' appears twice in one mapping (first at line "
                    f"{seen[key_node.value] + 1}); the second would silently replace the first. Merge them",
                    key_node.start_mark,
                )
            seen[key_node.value] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def read_yaml(path: Path) -> Any:
    """The parsed file; a syntax error or a repeated key is a ConfigError naming the file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read config file {path}: {err}") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as err:
        raise ConfigError(_yaml_error_message(path, err)) from None


def _yaml_error_message(path: Path, err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    message = f"{path} is not valid YAML{where}: {getattr(err, 'problem', None) or err}"
    context, context_mark = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context and context_mark is not None:
        message += f" ({context} at line {context_mark.line + 1})"
    if "'\\t'" in message:
        message += ". Indent with spaces: YAML does not allow tabs"
    return message


def deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """`top` over `base`: mappings merge key by key, everything else (lists too) is replaced."""
    out = copy.deepcopy(dict(base))
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_scalar(text: str) -> Any:
    """A value written on a command line or after an interpolation's comma, read as YAML (text that is not
    valid YAML stays text; nothing is None)."""
    try:
        return yaml.safe_load(text) if text else None
    except yaml.YAMLError:
        return text


def is_true(text: str | None) -> bool:
    """Whether a command line's value text reads as true (`True`, `true`); None (not given) is false."""
    return str(parse_scalar((text or "false").strip())).lower() == "true"


def dotted_leaves(tree: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a nested mapping; an empty mapping is a leaf (`{}`)."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from dotted_leaves(value, path + ".")
        else:
            yield path, value


def dotted_keys(tree: Mapping[str, Any], prefix: str = "") -> Iterable[str]:
    """The dotted key of every entry of a nested mapping, sections and leaves alike (`a`, `a.b`, ...)."""
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        yield path
        if isinstance(value, Mapping):
            yield from dotted_keys(value, path)
