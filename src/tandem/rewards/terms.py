"""Reward terms: small additions on top of a scorer's score (format bonus, length penalty).

A term is any object with a `name` and `__call__(sample: TermInput) -> float`. The manager adds
each term's value to the scorer's score and reports it in `extra[term.name]`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

# Where the agent loop's per-call step rewards reach reward functions and terms (verl's name).
TOOL_REWARDS_KEY = "tool_rewards"


@dataclass(frozen=True)
class TermInput:
    """What a term sees of one sample."""

    solution_str: str
    response_length: int  # valid response tokens
    data_source: str
    extra_info: dict | None = None


class Term(Protocol):
    name: str

    def __call__(self, sample: TermInput) -> float: ...


@dataclass(frozen=True)
class FormatTerm:
    """`match_reward` when the response matches `pattern`, else `mismatch_reward`.

    `fullmatch=False` searches anywhere in the response; `fullmatch=True` needs the whole
    response (surrounding whitespace stripped) to match. `.` matches newlines by default.
    """

    pattern: str
    match_reward: float = 0.0
    mismatch_reward: float = -1.0
    fullmatch: bool = False
    flags: int = re.DOTALL
    name: str = "format"
    _regex: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "_regex", re.compile(self.pattern, self.flags))
        except re.error as error:
            raise ValueError(f"FormatTerm pattern {self.pattern!r} is not a valid regex: {error}") from None

    def __call__(self, sample: TermInput) -> float:
        if self.fullmatch:
            matched = self._regex.fullmatch(sample.solution_str.strip()) is not None
        else:
            matched = self._regex.search(sample.solution_str) is not None
        return self.match_reward if matched else self.mismatch_reward


def soft_overlong_penalty(length: int, max_length: int, buffer: int, penalty_factor: float = 1.0) -> float:
    """DAPO's soft overlong punishment: 0 for l <= L-B, -(l-(L-B))/B * factor up to L, -factor beyond."""
    start = max_length - buffer
    if length <= start:
        return 0.0
    if length <= max_length:
        return -(length - start) / buffer * penalty_factor
    return -penalty_factor


@dataclass(frozen=True)
class LengthTerm:
    """Soft overlong penalty on the response length in tokens (DAPO, eq. 13).

    `max_response_length=None` takes the RewardManager's `max_response_length`.
    """

    overlong_buffer: int
    penalty_factor: float = 1.0
    max_response_length: int | None = None
    name: str = "overlong"

    def __post_init__(self) -> None:
        if self.overlong_buffer <= 0:
            raise ValueError(f"LengthTerm overlong_buffer must be > 0, got {self.overlong_buffer}")
        if self.max_response_length is not None and self.overlong_buffer > self.max_response_length:
            raise ValueError(
                f"LengthTerm overlong_buffer ({self.overlong_buffer}) must be <= max_response_length "
                f"({self.max_response_length})"
            )

    def __call__(self, sample: TermInput) -> float:
        if self.max_response_length is None:
            raise ValueError("LengthTerm needs max_response_length: pass it here or to the RewardManager")
        return soft_overlong_penalty(
            sample.response_length, self.max_response_length, self.overlong_buffer, self.penalty_factor
        )


@dataclass(frozen=True)
class ToolRewardTerm:
    """The sum of the step rewards a trajectory's tool calls gave (the agent loop's
    ``extra_info["tool_rewards"]``); 0 for a sample of no trajectory or no such rewards.

    verl hands these step rewards to the reward function in ``extra_info["tool_rewards"]`` and its
    built-in scorers ignore them, so a tool's step reward counts only where a custom function adds it.
    Tandem adds their sum to the score by default (reward.tool_rewards): a tool that returns a step
    reward means it to count, and a reward left out without a word is a silent drop. A reward function
    that adds them itself, as some verl ones do, wants reward.tool_rewards=false."""

    name: str = "tool_reward"

    def __call__(self, sample: TermInput) -> float:
        rewards = (sample.extra_info or {}).get(TOOL_REWARDS_KEY) or []
        return float(sum(float(r) for r in rewards))


def check_terms(terms: Any, max_response_length: int | None) -> tuple[Term, ...]:
    """Validate `terms` (unique names, callables) and fill LengthTerm's max length from the manager."""
    bound: list[Term] = []
    for term in terms:
        if not callable(term) or not isinstance(getattr(term, "name", None), str):
            raise TypeError(f"a reward term needs a `name` and `__call__(TermInput) -> float`, got {term!r}")
        if isinstance(term, LengthTerm) and term.max_response_length is None:
            if max_response_length is None:
                raise ValueError(
                    "LengthTerm has no max_response_length: pass RewardManager(max_response_length=...)"
                )
            term = LengthTerm(term.overlong_buffer, term.penalty_factor, max_response_length, term.name)
        bound.append(term)
    names = [term.name for term in bound]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"reward terms need distinct names; repeated: {', '.join(duplicates)}")
    return tuple(bound)
