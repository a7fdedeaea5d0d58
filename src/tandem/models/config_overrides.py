"""Attributes set on a Hugging Face model config before the model is built (verl's model.override_config), in
one place for every engine that builds the model: the training engines (engine/fsdp) and the rollout engines
(rollout/hf.py builds with it, rollout/vllm.py hands it to vLLM as `hf_overrides`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import PretrainedConfig


def apply_overrides(
    config: PretrainedConfig, overrides: dict[str, Any], where: str = "override_config"
) -> None:
    """Set `overrides` on `config` in place (verl's model.override_config): a mapping value sets the attributes of
    the sub-config of that name (text_config: {...}), or updates a mapping attribute (rope_scaling: {...});
    any other value replaces the attribute. `where` names the setting in errors."""
    for key, value in overrides.items():
        current = getattr(config, key, None)
        if isinstance(value, dict) and isinstance(current, PretrainedConfig):
            apply_overrides(current, value, f"{where}.{key}")
        elif isinstance(value, dict) and isinstance(current, dict):
            setattr(config, key, {**current, **value})
        elif isinstance(value, dict) and current is not None:
            raise ValueError(
                f"{where}.{key}: the config's {key} is {current!r}, not a mapping to set keys in"
            )
        else:
            setattr(config, key, value)


def overridden_dict(config: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A config.json's contents (a dict) as the model is built with `overrides` (one level of mappings merged,
    as `apply_overrides` does): what the start-up checks read instead of the file alone."""
    merged = dict(config)
    for key, value in overrides.items():
        current = merged.get(key)
        merged[key] = {**current, **value} if isinstance(value, dict) and isinstance(current, dict) else value
    return merged


def text_config(model_path: str | Path, overrides: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """config.json of a model folder as a dict (a vision-language model's text_config), with `overrides` set as
    the model is built with them (actor.override_config), or None when the folder has none to read (the loaders
    name what is wrong then)."""
    file = Path(model_path) / "config.json"
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    config = overridden_dict(config, overrides or {})
    return config.get("text_config", config)
