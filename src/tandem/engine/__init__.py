"""Training engines: the `TrainEngine` interface and its implementations (FSDP2 now, megatron-core later)."""

from __future__ import annotations

from typing import Any

from tandem.engine.base import StepResult, TrainEngine
from tandem.engine.fsdp import FSDPEngine

__all__ = ["FSDPEngine", "StepResult", "TrainEngine", "build_engine"]


def build_engine(strategy: str, **kwargs: Any) -> TrainEngine:
    """The engine of a config's `strategy`; `kwargs` go to its constructor (see FSDPEngine)."""
    if strategy == "fsdp":
        return FSDPEngine(**kwargs)
    if strategy == "megatron":
        raise NotImplementedError(
            "strategy=megatron: the megatron-core engine is not available yet; use strategy=fsdp"
        )
    raise ValueError(f"unknown engine strategy {strategy!r}; use fsdp or megatron")
