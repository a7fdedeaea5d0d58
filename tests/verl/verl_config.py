"""verl's real config folder as test data: tests/verl/data/verl_config is verl/trainer/config at the commit
examples.json names (scripts/extract_verl_examples.py), composed here by Hydra as verl composes it."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from tandem.config.verl.hydra_yaml import compose

VERL_CONFIG = Path(__file__).parent / "data" / "verl_config"  # what a user's --config-path names


@cache
def _composed(name: str) -> dict[str, Any]:
    return compose(VERL_CONFIG / f"{name}.yaml")


def composed(name: str) -> dict[str, Any]:
    """verl's `name` config (ppo_trainer, ppo_megatron_trainer, sft_trainer, sft_trainer_engine, generation)
    composed with its defaults, interpolations resolved: verl's default for every key (a fresh copy)."""
    import copy

    return copy.deepcopy(_composed(name))
