"""Training engines: the `TrainEngine` interface and its implementations, FSDP2 and megatron-core.

The roles and the trainer reach an engine through this face alone (`build_engine`, `check_buildable` and
`TrainEngine`'s methods, LoRA's `without_adapter` / `save_adapter` among them), never through
`engine.fsdp` or `engine.megatron` (tests/test_structure.py checks it)."""

from __future__ import annotations

from typing import Any

from tandem.config.schema import Strategy
from tandem.engine.base import EngineSpec, StepResult, TrainEngine
from tandem.engine.fsdp.engine import FSDPEngine

__all__ = ["EngineSpec", "FSDPEngine", "StepResult", "TrainEngine", "build_engine", "check_buildable"]


def engine_class(strategy: Strategy) -> type[TrainEngine]:
    """FSDPEngine or MegatronEngine (importing it imports no megatron-core; building one does)."""
    if strategy == "fsdp":
        return FSDPEngine
    if strategy == "megatron":
        from tandem.engine.megatron import MegatronEngine

        return MegatronEngine
    raise ValueError(f"unknown engine strategy {strategy!r}; use fsdp or megatron")


def build_engine(spec: EngineSpec) -> TrainEngine:
    """The engine of `spec.strategy`: FSDPEngine(spec) or MegatronEngine(spec); the other strategy's settings
    are ignored. megatron-core is imported only when chosen."""
    engine = engine_class(spec.strategy)
    if spec.strategy == "megatron":
        from tandem.engine.megatron import megatron_available

        if not megatron_available():
            raise ImportError(
                "strategy=megatron needs megatron-core: `pip install -e '.[megatron]'` (make installs it)"
            )
    return engine(spec)


def check_buildable(strategy: Strategy, settings: Any, folders: dict[str, str]) -> list[str]:
    """The start-up check of an engine of `strategy`, before any worker starts: what it could not build from the
    model folders of `folders` (what to call each in a message, e.g. "actor.model_path" -> the folder) under its
    config section `settings` (actor.fsdp or actor.megatron), megatron-core missing included. One line per
    problem; [] when every model builds."""
    return engine_class(strategy).check_buildable(settings, folders)
