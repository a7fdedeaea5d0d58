"""load_config: preset or YAML file (with `base:` inheritance) + dotted overrides -> validated config."""

from __future__ import annotations

import json
import logging
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml

from tandem.config.coerce import (
    RESERVED,
    describe,
    is_section,
    parse_into,
    section_message,
    strip_optional,
    to_plain,
    type_at,
    unknown_key_message,
)
from tandem.config.errors import ConfigError, Problems, closest
from tandem.config.schema import TandemConfig
from tandem.config.validate import finalize
from tandem.config.verl import (
    VerlTranslation,
    compose,
    layout_problems,
    looks_like_verl,
    translate_overrides,
    translate_tree,
    verl_sft_preset,
    verl_sizes,
)
from tandem.config.yaml_io import deep_merge, dotted_keys, read_yaml

PRESET_DIR = Path(__file__).parent / "presets"


def list_presets() -> list[str]:
    """Names of the bundled presets (`grpo`, `ppo`, ...)."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_config(
    preset_or_path: str | Path | None = None,
    overrides: Iterable[str] = (),
    *,
    require_data: bool = False,
    on_verl: Callable[[VerlTranslation], None] | None = None,
    gpus_per_node: int | None = None,
    sft: bool = False,
) -> TandemConfig:
    """A validated config from a preset name or YAML path (None = schema defaults) and `key=value` overrides.

    verl's keys are read as Tandem's (config/verl/translate.py), and a verl YAML file is composed with its
    `defaults:` over the `verl` preset; `on_verl` then gets the translation (default: logged).
    With `require_data=True` the training files must be given (and exist): use it when about to train.
    `gpus_per_node`: the GPUs workers_per_node=auto takes per node (None: counted, config/gpus.py).
    `sft`: verl keys are those of verl's SFT trainers (config/verl/sft_keys.py); a verl SFT YAML (with top-level
    `model:` / `optim:` sections) is read so without it, over its trainer's preset (`verl_sft_engine` for
    sft_trainer_engine.yaml, `verl_sft` for fsdp_sft_trainer's sft_trainer.yaml).
    Raises ConfigError listing every problem found.
    """
    raw: dict[str, Any] = {}
    problems = Problems()
    translation = VerlTranslation()
    sizes: dict[str, str] | None = None  # a verl YAML's GPU counts (and the command line's over them)
    if preset_or_path is not None:
        path = resolve_ref(str(preset_or_path), Path.cwd())
        top = read_yaml(path)
        if isinstance(top, dict) and looks_like_verl(top):  # a verl (Hydra) YAML: verl's defaults under it
            sft = sft or "model" in top or "optim" in top  # sections of verl's SFT configs alone
            overrides = [str(o) for o in overrides]
            tree = compose(path, overrides)  # by Hydra, with the command line's verl keys applied before
            # verl's defaults under it: its SFT trainer's (sft_trainer_engine.yaml's keys: the newer trainer's)
            preset = verl_sft_preset(dotted_keys(tree)) if sft else "verl"
            raw = load_yaml_tree(PRESET_DIR / f"{preset}.yaml", (), problems.files)
            sizes = verl_sizes(tree, overrides)  # interpolations resolve, as verl composes its config
            translation = translate_tree(tree, sft=sft, sizes=sizes)
            translation.source = str(path)
        else:
            raw = load_yaml_tree(path, (), problems.files)
    from_file = translation.overrides
    translation.merge(translate_overrides(overrides, sft=sft, sizes=sizes))
    for key, message in translation.problems:
        problems.notes[key] = "from a verl override"
        problems.add(key, message)
    if translation.read_verl:
        (on_verl or _log_translation)(translation)
    apply_overrides(raw, from_file, problems)
    for text in from_file:
        problems.notes[text.partition("=")[0]] = f"from verl config {translation.source}"
    apply_overrides(raw, translation.overrides, problems)
    return config_from_dict(
        raw,
        require_data=require_data,
        problems=problems,
        more_checks=lambda cfg: layout_problems(translation, cfg),
        gpus_per_node=gpus_per_node,
    )


def _log_translation(translation: VerlTranslation) -> None:
    logging.getLogger("tandem.config").info("%s", translation.summary())


def config_from_dict(
    raw: Mapping[str, Any],
    *,
    require_data: bool = False,
    problems: Problems | None = None,
    more_checks: Callable[[TandemConfig], list[tuple[str, str]]] | None = None,
    gpus_per_node: int | None = None,
) -> TandemConfig:
    """Build and validate a config from nested plain values (as read from YAML): parse, resolve, validate.
    Problems caused by a value that failed to parse are not repeated. `more_checks(cfg)` gives (key, message)
    problems of the resolved config beyond the schema's rules (load_config: verl's reference / critic layout)."""
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
    finalize(cfg, checks, require_data=require_data, gpus_per_node=gpus_per_node)
    for key, message in more_checks(cfg) if more_checks is not None else []:
        checks.add(key, message)
    for problem in checks.items:
        if not bad.intersection(problem.keys):
            problems.items.append(problem)
    problems.raise_if_any()
    return cfg


def config_to_dict(cfg: TandemConfig) -> dict[str, Any]:
    """Nested plain values (lists, not tuples), ready for YAML or JSON; `cfg.derived` is left out."""
    return to_plain(cfg)


def config_to_yaml(cfg: TandemConfig) -> str:
    """YAML text that `load_config` reads back into an equal config."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=False)


# --- YAML files and presets -------------------------------------------------------------------


def resolve_ref(ref: str, relative_to: Path) -> Path:
    """A preset name (`grpo`) or a YAML path (relative to `relative_to`) -> an existing file."""
    looks_like_path = ref.endswith((".yaml", ".yml")) or "/" in ref or "\\" in ref
    path = Path(ref).expanduser()
    if not path.is_absolute():
        path = relative_to / path
    if "=" in ref and not looks_like_path:
        raise ConfigError(
            f"'{ref}' looks like an override, but it stands where the preset name or YAML file goes: "
            f"name one first, e.g. `tandem config grpo {ref}` or load_config('grpo', ['{ref}'])"
        )
    if looks_like_path:
        if path.is_file():
            return path
        hint = ""
        if Path(ref).stem in list_presets() and Path(ref).name == ref:
            hint = f"; for the bundled preset write just '{Path(ref).stem}'"
        raise ConfigError(f"config file '{path}' does not exist{hint}")
    preset = PRESET_DIR / f"{ref}.yaml"
    if preset.is_file():
        return preset
    if path.is_file():
        return path
    match = closest(ref.lower(), list_presets())
    hint = f" Did you mean '{match}'?" if match else ""
    raise ConfigError(
        f"'{ref}' is neither a preset nor a YAML file.{hint} Presets: {', '.join(list_presets())}."
    )


def load_yaml_tree(
    path: Path, chain: tuple[Path, ...], files: dict[str, str] | None = None
) -> dict[str, Any]:
    """Read a YAML file and, recursively, the file its `base:` names; the file's keys win.

    `files` collects, for every dotted key, the file that set it last (to name it in errors)."""
    path = path.resolve()
    if path in chain:
        cycle = " -> ".join(str(p) for p in (*chain, path))
        raise ConfigError(
            f"'base:' files include each other in a loop: {cycle}. Remove one of the base: lines"
        )
    data = read_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} must hold a mapping of sections (data:, actor:, ...), not a {type(data).__name__}: "
            "write e.g. `actor:` on one line and `  ppo_mini_batch_size: 4` indented below it"
        )
    base = data.pop("base", None)
    parent: dict[str, Any] = {}
    if base is not None:
        if not isinstance(base, str):
            raise ConfigError(f"{path}: 'base:' must name one preset or YAML path, got {base!r}")
        try:
            base_path = resolve_ref(base, path.parent)
        except ConfigError as err:
            raise ConfigError(f"{path}: base: {err}") from None
        parent = load_yaml_tree(base_path, (*chain, path), files)
    if files is not None:
        label = f"in preset '{path.stem}'" if path.parent == PRESET_DIR.resolve() else f"in {path}"
        files.update(dict.fromkeys(dotted_keys(data), label))
    return deep_merge(parent, data)


# --- dotted overrides ---------------------------------------------------------------------------


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str], problems: Problems) -> None:
    """Set `a.b.c=value` into the nested dict `raw`; unknown keys and bad syntax become problems.

    A mapping given to a section (`actor.optim={lr: 1e-6, eps: 1e-6}`) is merged into it, as a
    `base:` file's sections are; any other value replaces what was there."""
    if isinstance(overrides, str):
        overrides = [overrides]
    for text in map(str, overrides):
        key, sep, value_text = text.partition("=")
        key = key.strip()
        if key.startswith("~"):
            name = key.lstrip("~")
            problems.notes[name] = f"from override '{text}'"
            problems.add(
                name,
                f"{name}: keys cannot be removed; set {name}=null where null is allowed, or a value",
            )
            continue
        key = key.lstrip("+")  # Hydra's `+key=` / `++key=` add a key; every Tandem key exists already
        parts = key.split(".")
        if not sep or "" in parts:
            problems.add(
                key or text, f"override '{text}' must look like section.key=value, e.g. actor.optim.lr=1e-6"
            )
            continue
        problems.notes[key] = f"from override '{text}'"
        if parts[0] in RESERVED:
            problems.add(key, f"{key}: {parts[0]} {RESERVED[parts[0]]}")
            continue
        tp = type_at(key)
        if tp is None:
            problems.add(key, unknown_key_message(key, TandemConfig))
            continue
        value = parse_override_value(value_text, tp)
        missing = _missing_value_problem(key, tp, value)
        if missing:
            problems.add(key, missing)
            continue
        _set_dotted(raw, parts, value, tp)


def _set_dotted(raw: dict[str, Any], parts: list[str], value: Any, tp: Any) -> None:
    """raw[a][b][c] = value, making the sections on the way; a mapping given to a section merges into it."""
    node = raw
    for part in parts[:-1]:
        if node.get(part) is None:
            node[part] = {}
        node = node[part]
        if not isinstance(node, dict):
            return  # an earlier `actor=3` stays, so that its error is reported
    old = node.get(parts[-1])
    if is_section(strip_optional(tp)) and isinstance(value, Mapping) and isinstance(old, Mapping):
        value = deep_merge(old, value)
    node[parts[-1]] = value


def _missing_value_problem(key: str, tp: Any, value: Any) -> str | None:
    """A message when `key=` (or `key=null`) gives no value where one is needed, else None."""
    inner = strip_optional(tp)
    if value is not None or inner is not tp or tp is Any or typing.get_origin(tp) in (list, dict):
        return None  # null is allowed: an optional field, a list or mapping (empty), a free value
    if is_section(tp):
        return section_message(key, tp, value)
    default: Any = TandemConfig()
    for part in key.split("."):
        default = getattr(default, part)
    example = json.dumps(to_plain(default))
    text_hint = f"; for empty text write {key}=''" if tp is str else ""
    return f"{key} needs a value ({describe(tp)}), e.g. {key}={example}{text_hint}"


def parse_override_value(text: str, tp: Any) -> Any:
    """Text after `=`: kept verbatim for string fields (so `007` stays `007`), else read as YAML.

    Nothing after `=` is None: it clears an optional field, empties a list or mapping, and is an
    error for any other field."""
    text = text.strip()
    optional = strip_optional(tp) is not tp
    if text in ("", "null", "~") or (optional and text == "None"):
        return None
    if _is_text_type(strip_optional(tp)):
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
            return text[1:-1]
        return text
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _is_text_type(tp: Any) -> bool:
    if tp is str:
        return True
    return typing.get_origin(tp) is Literal and all(isinstance(c, str) for c in typing.get_args(tp))


# --- verl YAML -> Tandem YAML ---------------------------------------------------------------------


def verl_yaml_to_tandem(path: str | Path) -> str:
    """`tandem config --from-verl FILE`: the verl config at `path` (with its `defaults:`) as a Tandem
    YAML over the `verl` preset, and a comment for every key dropped, with why. The text loads with
    load_config; a problem with the translated values is a ConfigError, as for any config."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"verl config file '{path}' does not exist")
    translation = translate_tree(compose(path))
    problems = Problems()
    raw: dict[str, Any] = {}
    apply_overrides(raw, translation.overrides, problems)
    problems.raise_if_any()
    lines = [
        f"# Translated from verl config {path} by `tandem config --from-verl`.",
        "# The base is Tandem's `verl` preset: verl's defaults in Tandem's keys.",
        yaml.safe_dump({"base": "verl", **raw}, sort_keys=False, default_flow_style=False).rstrip(),
        f"# Dropped: {len(translation.dropped)} keys of the verl config have no Tandem setting:",
        *(f"#   {key}  -- {why}" for key, why in translation.dropped),
    ]
    return "\n".join(lines) + "\n"
