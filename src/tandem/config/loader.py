"""load_config: preset or YAML file (with `base:` inheritance) + dotted overrides -> validated config."""

from __future__ import annotations

import copy
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml

from tandem.config.coerce import field_types, is_section, parse_into, strip_optional, unknown_key_message
from tandem.config.errors import ConfigError, Problems, closest
from tandem.config.schema import TandemConfig
from tandem.config.validate import finalize

PRESET_DIR = Path(__file__).parent / "presets"


def list_presets() -> list[str]:
    """Names of the bundled presets (`grpo`, `ppo`, ...)."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_config(
    preset_or_path: str | Path | None = None,
    overrides: Iterable[str] = (),
    *,
    require_data: bool = False,
) -> TandemConfig:
    """A validated config from a preset name or YAML path (None = schema defaults) and `key=value` overrides.

    With `require_data=True` the training files must be given (and exist): use it when about to train.
    Raises ConfigError listing every problem found.
    """
    raw: dict[str, Any] = {}
    if preset_or_path is not None:
        raw = load_yaml_tree(resolve_ref(str(preset_or_path), Path.cwd()), ())
    problems = Problems()
    apply_overrides(raw, overrides, problems)
    return build(raw, require_data=require_data, problems=problems)


def build(
    raw: Mapping[str, Any], *, require_data: bool = False, problems: Problems | None = None
) -> TandemConfig:
    """Parse, resolve, validate. Problems caused by a value that failed to parse are not repeated."""
    problems = problems if problems is not None else Problems()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"a config must be a mapping of sections, got {type(raw).__name__}")
    cfg = TandemConfig()
    if "base" in raw:
        problems.add("base", "'base:' only works in YAML files read by load_config")
        raw = {k: v for k, v in raw.items() if k != "base"}
    parse_into(cfg, raw, "", problems)
    bad = problems.bad_keys()
    checks = Problems()
    checks.notes = problems.notes
    finalize(cfg, checks, require_data=require_data)
    for problem in checks.items:
        if not bad.intersection(problem.keys):
            problems.items.append(problem)
    problems.raise_if_any()
    return cfg


# --- YAML files and presets -------------------------------------------------------------------


def resolve_ref(ref: str, relative_to: Path) -> Path:
    """A preset name (`grpo`) or a YAML path (relative to `relative_to`) -> an existing file."""
    looks_like_path = ref.endswith((".yaml", ".yml")) or "/" in ref or "\\" in ref
    path = Path(ref).expanduser()
    if not path.is_absolute():
        path = relative_to / path
    if looks_like_path:
        if not path.is_file():
            raise ConfigError(f"config file '{path}' does not exist")
        return path
    preset = PRESET_DIR / f"{ref}.yaml"
    if preset.is_file():
        return preset
    if path.is_file():
        return path
    match = closest(ref, list_presets())
    hint = f" Did you mean '{match}'?" if match else ""
    raise ConfigError(
        f"'{ref}' is neither a preset nor a YAML file.{hint} Presets: {', '.join(list_presets())}."
    )


def load_yaml_tree(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    """Read a YAML file and, recursively, the file its `base:` names; the file's keys win."""
    path = path.resolve()
    if path in chain:
        cycle = " -> ".join(str(p) for p in (*chain, path))
        raise ConfigError(f"'base:' files include each other in a loop: {cycle}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} must hold a mapping of sections (data:, actor:, ...), not {type(data).__name__}"
        )
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ConfigError(f"{path}: 'base:' must name a preset or a YAML path, got {base!r}")
    parent = load_yaml_tree(resolve_ref(base, path.parent), (*chain, path))
    return deep_merge(parent, data)


def deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """`top` over `base`: mappings merge key by key, everything else (lists too) is replaced."""
    out = copy.deepcopy(dict(base))
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# --- dotted overrides ---------------------------------------------------------------------------


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str], problems: Problems) -> None:
    """Set `a.b.c=value` into the nested dict `raw`; unknown keys and bad syntax become problems."""
    if isinstance(overrides, str):
        overrides = [overrides]
    for text in overrides:
        key, sep, value_text = str(text).partition("=")
        key = key.strip().removeprefix("+")
        if not sep or not key:
            problems.add(key or str(text), f"override '{text}' must look like section.key=value")
            continue
        tp = _type_at(key)
        if tp is None:
            problems.add(key, f"{unknown_key_message(key, TandemConfig)} (in override '{text}')")
            continue
        node = raw
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = parse_override_value(value_text, tp)
        problems.notes[key] = f"from override '{text}'"


def _type_at(dotted: str) -> Any:
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


def parse_override_value(text: str, tp: Any) -> Any:
    """Text after `=`: kept verbatim for string fields (so `007` stays `007`), else read as YAML."""
    text = text.strip()
    optional = strip_optional(tp) is not tp
    if text in ("null", "~") or (optional and text == "None"):
        return None
    if _is_text_type(strip_optional(tp)):
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
            return text[1:-1]
        return text
    try:
        return yaml.safe_load(text) if text else None
    except yaml.YAMLError:
        return text


def _is_text_type(tp: Any) -> bool:
    if tp is str:
        return True
    return typing.get_origin(tp) is Literal and all(isinstance(c, str) for c in typing.get_args(tp))
