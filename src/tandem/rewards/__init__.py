"""Rewards: rule-based scorers, composable terms, and the manager that turns a batch of
responses into token-level scores, with time limits and process isolation for user code.

The scorers, their registry and the terms load with the package (pure Python: `tandem config` reads which
data_source each scorer covers without loading torch); the manager, the scorer pool and verl's manager class
load on first use (`__getattr__`)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tandem.rewards.custom import load_function
from tandem.rewards.registry import (
    DATA_SOURCES,
    GROUND_TRUTH_CHECKS,
    SCORERS,
    GroundTruthCheck,
    ScorerFn,
    UnknownDataSourceError,
    default_scorer_for,
    register_scorer,
)
from tandem.rewards.scorers import (
    addition_score,
    countdown_score,
    evaluate_arithmetic,
    gsm8k_score,
    math_dapo_score,
    math_score,
)
from tandem.rewards.terms import (
    FormatTerm,
    LengthTerm,
    Term,
    TermInput,
    ToolRewardTerm,
    soft_overlong_penalty,
)

if TYPE_CHECKING:
    from tandem.rewards.from_config import reward_manager_from_config
    from tandem.rewards.manager import RewardManager, RewardResult, reward_components
    from tandem.rewards.pool import ScorerPool
    from tandem.rewards.verl_manager import ManagerClassRewards, VerlData

# name -> the module that defines it, imported on first use (they load numpy / torch)
_LAZY = {
    "reward_manager_from_config": "from_config",
    "RewardManager": "manager",
    "RewardResult": "manager",
    "reward_components": "manager",
    "ScorerPool": "pool",
    "ManagerClassRewards": "verl_manager",
    "VerlData": "verl_manager",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'tandem.rewards' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tandem.rewards.{_LAZY[name]}"), name)


__all__ = [
    "DATA_SOURCES",
    "GROUND_TRUTH_CHECKS",
    "SCORERS",
    "FormatTerm",
    "GroundTruthCheck",
    "LengthTerm",
    "ManagerClassRewards",
    "RewardManager",
    "RewardResult",
    "ScorerFn",
    "ScorerPool",
    "Term",
    "TermInput",
    "ToolRewardTerm",
    "UnknownDataSourceError",
    "VerlData",
    "addition_score",
    "countdown_score",
    "default_scorer_for",
    "evaluate_arithmetic",
    "gsm8k_score",
    "load_function",
    "math_dapo_score",
    "math_score",
    "register_scorer",
    "reward_components",
    "reward_manager_from_config",
    "soft_overlong_penalty",
]
