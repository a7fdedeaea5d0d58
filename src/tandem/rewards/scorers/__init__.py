"""Built-in scorers; importing this package registers them in `tandem.rewards.registry.SCORERS`."""

from tandem.rewards.scorers.arithmetic import (
    addition_score,
    countdown_score,
    evaluate_arithmetic,
    tool_multiply_score,
)
from tandem.rewards.scorers.code import code_score
from tandem.rewards.scorers.geo3k import geo3k_score
from tandem.rewards.scorers.gsm8k import gsm8k_score
from tandem.rewards.scorers.math_answer import math_score
from tandem.rewards.scorers.math_dapo import math_dapo_score

__all__ = [
    "addition_score",
    "code_score",
    "countdown_score",
    "evaluate_arithmetic",
    "geo3k_score",
    "gsm8k_score",
    "math_dapo_score",
    "math_score",
    "tool_multiply_score",
]
