"""Rollout engines: token ids in, sampled token ids + their log-probs out (layout in `base.py`)."""

from __future__ import annotations

import importlib.util
from typing import Any

from tandem.batch import ROLLOUT_KEYS
from tandem.rollout.base import PROMPT_INDEX, RolloutEngine, SamplingParams
from tandem.rollout.hf import HFRollout

ROLLOUT_ENGINES = ("hf", "vllm")
LATER_ENGINES = ("sglang",)

__all__ = [
    "PROMPT_INDEX",
    "ROLLOUT_KEYS",
    "HFRollout",
    "RolloutEngine",
    "SamplingParams",
    "build_rollout",
    "resolve_engine",
]


def resolve_engine(name: str) -> str:
    """The engine a config's rollout.engine means: "auto" is vllm where it is installed, else hf."""
    if name != "auto":
        return name
    return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"


def build_rollout(name: str, **kwargs: Any) -> RolloutEngine:
    """The rollout engine called ``name`` (``auto``: see `resolve_engine`), built by its
    ``from_pretrained(**kwargs)`` (so ``model_path`` is required and stop / pad ids default to the
    folder's)."""
    name = resolve_engine(name)
    if name == "hf":
        return HFRollout.from_pretrained(**kwargs)
    if name == "vllm":
        from tandem.rollout.vllm import VLLMRollout  # imports vllm: seconds, and only where it is used

        return VLLMRollout.from_pretrained(**kwargs)
    if name in LATER_ENGINES:
        raise NotImplementedError(f"rollout engine {name!r} is not available yet; use 'vllm' or 'hf'")
    raise ValueError(f"unknown rollout engine {name!r}; choose one of {('auto', *ROLLOUT_ENGINES)}")
