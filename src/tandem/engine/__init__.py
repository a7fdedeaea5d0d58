"""Training engines: the `TrainEngine` interface and its implementations, FSDP2 and megatron-core."""

from __future__ import annotations

from typing import Any

from tandem.engine.base import StepResult, TrainEngine
from tandem.engine.fsdp.engine import FSDPEngine

__all__ = ["FSDPEngine", "StepResult", "TrainEngine", "build_engine"]


def build_engine(strategy: str, *, fsdp: Any = None, megatron: Any = None, **kwargs: Any) -> TrainEngine:
    """The engine of a config's `strategy`: FSDPEngine(fsdp=..., **kwargs) or MegatronEngine(megatron=...,
    **kwargs); the other strategy's settings are ignored. megatron-core is imported only when chosen."""
    if strategy == "fsdp":
        return FSDPEngine(fsdp=fsdp, **kwargs)
    if strategy == "megatron":
        from tandem.engine.megatron import MegatronEngine, megatron_available

        if not megatron_available():
            raise ImportError(
                "strategy=megatron needs megatron-core: `pip install -e '.[megatron]'` (make installs it)"
            )
        return MegatronEngine(megatron=megatron, **kwargs)
    raise ValueError(f"unknown engine strategy {strategy!r}; use fsdp or megatron")
