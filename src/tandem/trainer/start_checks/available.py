"""`check_available`: the engines and models a config names, checked before any worker starts; every problem
in one ConfigError (exit status 2 through the CLI)."""

from __future__ import annotations

from tandem.config.errors import ConfigError
from tandem.config.schema import TandemConfig
from tandem.models.model_type import VISION_LANGUAGE_TYPES, folder_model_type
from tandem.trainer.start_checks.rollout_engine import rollout_engine_problems
from tandem.trainer.start_checks.training_engine import (
    dist_checkpoint_problems,
    model_override_problems,
    training_engine_problems,
)
from tandem.trainer.start_checks.vision_language import vision_language_problems


def check_available(cfg: TandemConfig, purpose: str = "rl") -> None:
    """Engines the config may name but this release does not have yet, or cannot build as asked: an error before
    any worker starts. `purpose`: "rl", or "sft" (no rollout, no critic)."""
    problems = rollout_engine_problems(cfg, purpose)
    problems += model_override_problems(cfg, purpose)
    problems += training_engine_problems(cfg)
    problems += dist_checkpoint_problems(cfg, purpose)
    model_type = folder_model_type(cfg.actor.model_path)
    if model_type in VISION_LANGUAGE_TYPES:
        problems += vision_language_problems(cfg, model_type, purpose)
    if problems:
        raise ConfigError("\n".join(problems))
