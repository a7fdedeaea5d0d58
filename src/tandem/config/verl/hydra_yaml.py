"""A verl (Hydra) YAML config composed into one tree by Hydra and OmegaConf themselves, as
`python -m verl.trainer.main_ppo --config-path DIR --config-name NAME key=value ...` composes it.

Hydra follows the `defaults:` lists (`_self_`, `group@package: option`, `../group@pkg`, `override`,
`optional`), the `hydra.searchpath` of the primary file (`file://DIR`, relative to the working folder as
for verl), and applies the command line's overrides with its own grammar (`key=v`, `+key=v`, `++key=v`,
`~key`, lists and dicts); OmegaConf then resolves the interpolations (`${a.b}`, `${.a}`,
`${oc.select:a.b,default}`, `${oc.env:VAR,default}`) over the tree the overrides made, as verl reads it.
So `actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2` on the command line also sets the
reference's size, which verl's YAML makes `${oc.select:...actor.megatron.tensor_model_parallel_size,1}`.

Which overrides Hydra applies: those of a key the composed tree has, and those with Hydra's `+`, `++` or
`~`. Tandem's own keys, and names verl's tree lacks (an older verl key, a misspelling), are left to the
verl translation (config/verl/translate.py), which maps them or names the problem. A Hydra error (a defaults entry
not found, `+` on a key that exists, an override Hydra cannot parse) is a ConfigError: verl stops there too.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Set
from pathlib import Path
from typing import Any

from tandem.config.errors import ConfigError
from tandem.config.yaml_io import dotted_keys

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


def compose(path: Path, overrides: Iterable[str] = ()) -> dict[str, Any]:
    """The verl config at `path` composed by Hydra with its `defaults:` and the command line's `overrides`
    that are verl's (see `hydra_overrides`), interpolations resolved by OmegaConf; `_target_` class names
    left out (verl's dataclass names, nothing to configure)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"verl config file '{path}' does not exist")
    given = [str(o) for o in overrides]
    try:
        with initialize_config_dir(config_dir=str(path.parent), version_base=None):
            applied = hydra_overrides(given, _tree_keys(path, path.stat().st_mtime_ns))
            cfg = hydra_compose(config_name=path.stem, overrides=applied)
        tree = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(_hydra_message(path, err)) from None
    return _without_targets(tree)


@functools.lru_cache(maxsize=32)
def _tree_keys(path: Path, mtime_ns: int) -> frozenset[str]:
    """The keys (every level) of the config at `path` composed without overrides, inside compose's Hydra context:
    the same for each command line of one file (`mtime_ns`: a file written anew is read anew)."""
    from hydra import compose as hydra_compose
    from omegaconf import OmegaConf

    return frozenset(dotted_keys(OmegaConf.to_container(hydra_compose(config_name=path.stem))))


def hydra_overrides(overrides: Iterable[str], keys: Set[str]) -> list[str]:
    """The overrides Hydra applies to a verl tree with these `keys` (dotted, every level): those of a key
    the tree has, and those marked `+`, `++` or `~`; the rest are left to the verl translation."""
    out = []
    for text in overrides:
        key = text.partition("=")[0].strip()
        if key.startswith(("+", "~")) or key in keys:
            out.append(text)
    return out


def _without_targets(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_targets(v) for k, v in node.items() if k != "_target_"}
    if isinstance(node, list):
        return [_without_targets(v) for v in node]
    return node


def _hydra_message(path: Path, err: Exception) -> str:
    text = " ".join(str(err).split())
    hint = ""
    if "Could not load" in text or "Could not find" in text or "not found" in text:
        hint = (
            " Give --config-path the folder that holds the files the defaults list names (verl's "
            "verl/trainer/config in a verl checkout), or set the file's hydra.searchpath to it."
        )
    elif ("Key" in text and "not in struct" in text) or "Could not override" in text:
        hint = " verl's Hydra refuses it too: a key verl's config lacks needs a leading '+'."
    return f"composing verl config {path} as verl's Hydra does: {text}.{hint}"
