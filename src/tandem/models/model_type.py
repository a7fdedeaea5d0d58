"""What kind of model a folder or a transformers config holds: the one reader of config.json's model_type."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# where an image goes in a prompt's text (verl's schema; the tiny VLM's template)
IMAGE_PLACEHOLDER = "<image>"
VISION_LANGUAGE_TYPES = ("qwen2_vl",)  # config.json model_types of the vision-language models Tandem reads


def is_vision_language(config: Any) -> bool:
    """Whether a transformers config is one of a vision-language model Tandem reads."""
    return getattr(config, "model_type", None) in VISION_LANGUAGE_TYPES


def folder_model_type(folder: str | Path | None) -> str | None:
    """config.json's model_type of a local model folder (None where there is none to read: the loaders then
    name what is wrong with the folder)."""
    config = Path(folder) / "config.json" if folder else None
    if config is None or not config.is_file():
        return None
    try:
        return json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError):
        return None
