"""Training engines: the `TrainEngine` interface and its implementations, FSDP2 and megatron-core."""

from __future__ import annotations

from tandem.engine.base import EngineSpec, StepResult, TrainEngine
from tandem.engine.fsdp.engine import FSDPEngine

__all__ = ["EngineSpec", "FSDPEngine", "StepResult", "TrainEngine", "build_engine"]


def build_engine(spec: EngineSpec) -> TrainEngine:
    """The engine of `spec.strategy`: FSDPEngine(spec) or MegatronEngine(spec); the other strategy's settings
    are ignored. megatron-core is imported only when chosen."""
    if spec.strategy == "fsdp":
        return FSDPEngine(spec)
    if spec.strategy == "megatron":
        from tandem.engine.megatron import MegatronEngine, megatron_available

        if not megatron_available():
            raise ImportError(
                "strategy=megatron needs megatron-core: `pip install -e '.[megatron]'` (make installs it)"
            )
        return MegatronEngine(spec)
    raise ValueError(f"unknown engine strategy {spec.strategy!r}; use fsdp or megatron")
