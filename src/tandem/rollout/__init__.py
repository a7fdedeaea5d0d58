"""Rollout engines: token ids in, sampled token ids + their log-probs out (layout in `base.py`)."""

from __future__ import annotations

from typing import Any

from tandem.rollout.base import PROMPT_INDEX, ROLLOUT_KEYS, RolloutEngine, SamplingParams
from tandem.rollout.hf import HFRollout

ROLLOUT_ENGINES = ("hf",)
LATER_ENGINES = ("vllm", "sglang")

__all__ = ["PROMPT_INDEX", "ROLLOUT_KEYS", "HFRollout", "RolloutEngine", "SamplingParams", "build_rollout"]


def build_rollout(name: str, **kwargs: Any) -> RolloutEngine:
    """The rollout engine called ``name``. ``"hf"``: ``HFRollout.from_pretrained(**kwargs)`` (so
    ``model_path`` is required and stop / pad ids default to the folder's)."""
    if name == "hf":
        return HFRollout.from_pretrained(**kwargs)
    if name in LATER_ENGINES:
        raise NotImplementedError(
            f"rollout engine {name!r} is not available yet (it comes in a later release); use 'hf'"
        )
    raise ValueError(f"unknown rollout engine {name!r}; choose one of {ROLLOUT_ENGINES}")
