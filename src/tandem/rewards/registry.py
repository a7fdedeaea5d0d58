"""Scorer registry: which function scores which `data_source`.

A scorer has the signature
`fn(data_source: str, solution_str: str, ground_truth, extra_info: dict | None) -> float | dict`;
a dict must hold "score" and may hold more per-sample fields (e.g. "acc"), reported in the
reward result's `extra`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

ScorerFn = Callable[[str, str, Any, "dict | None"], "float | dict"]
# `check(data_source, ground_truth) -> None` when the scorer can use the ground truth, else a phrase
# saying what it expected ("expected a whole number such as 42"); run on every row at load time.
GroundTruthCheck = Callable[[str, Any], "str | None"]

# scorer name -> function; the name also matches as a data_source.
SCORERS: dict[str, ScorerFn] = {}
# scorer name -> its ground-truth check (scorers registered without one accept any ground truth).
GROUND_TRUTH_CHECKS: dict[str, GroundTruthCheck] = {}
# extra data_source aliases -> scorer name (e.g. "openai/gsm8k" -> "gsm8k").
DATA_SOURCES: dict[str, str] = {}
# data_source prefix -> scorer name: any data_source starting with it (e.g. "aime" for "aime24", "aime-2025").
DATA_SOURCE_PREFIXES: dict[str, str] = {}
# data_source -> scorer name, looked up before everything else, for a data_source that is also the name of
# another scorer. verl's default_compute_score sends data_source "math" to its DAPO rule; the scorer named
# "math" (which extra_info.style and scorer_overrides name) stays the \boxed{} one, verl's rule for
# lighteval/MATH.
DATA_SOURCE_ROUTES: dict[str, str] = {"math": "math_dapo"}


class UnknownDataSourceError(KeyError):
    """No scorer is registered for a data_source (and no override or custom file covers it)."""

    def __str__(self) -> str:  # KeyError would repr() the message, quotes and all
        return str(self.args[0]) if self.args else ""


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def register_scorer(
    name: str,
    *data_sources: str,
    check_ground_truth: GroundTruthCheck | None = None,
    prefixes: tuple[str, ...] = (),
) -> Callable[[ScorerFn], ScorerFn]:
    """Register `fn` as scorer `name`, used for data_source `name` and each of `data_sources`, and for
    any data_source that starts with one of `prefixes` (an exact name or alias wins over a prefix).

    `check_ground_truth(data_source, ground_truth) -> str | None` declares what the scorer's ground
    truth must look like: every dataset row scored by it is checked when the data is loaded, and a
    row it rejects is an error then (instead of a sample that scores 0 on every step).

    Registering the same function again (a re-imported module) replaces the old entry;
    a different function under a taken name or data_source is an error.
    """

    def wrap(fn: ScorerFn) -> ScorerFn:
        old = SCORERS.get(name)
        if old is not None and _qualname(old) != _qualname(fn):
            raise ValueError(f"scorer '{name}' is already registered ({_qualname(old)}); pick another name")
        if DATA_SOURCES.get(name, name) != name:
            raise ValueError(f"'{name}' is already a data_source of scorer '{DATA_SOURCES[name]}'")
        for source in data_sources:
            owner = DATA_SOURCES.get(source) or (source if source in SCORERS else None)
            if owner is not None and owner != name:
                raise ValueError(f"data_source '{source}' is already scored by scorer '{owner}'")
        for prefix in prefixes:
            owner = DATA_SOURCE_PREFIXES.get(prefix)
            if owner is not None and owner != name:
                raise ValueError(f"data_source prefix '{prefix}' is already taken by scorer '{owner}'")
        SCORERS[name] = fn
        GROUND_TRUTH_CHECKS.pop(name, None)
        if check_ground_truth is not None:
            GROUND_TRUTH_CHECKS[name] = check_ground_truth
        for source in data_sources:
            DATA_SOURCES[source] = name
        for prefix in prefixes:
            DATA_SOURCE_PREFIXES[prefix] = name
        return fn

    return wrap


def scorer_name_for(data_source: str, style: str | None = None) -> str | None:
    """The registered scorer name for `data_source` (a route, a name, an alias, a prefix, in that order), else
    the scorer named by `style` (e.g. "math"), else None."""
    if data_source in DATA_SOURCE_ROUTES:
        return DATA_SOURCE_ROUTES[data_source]
    if data_source in SCORERS:
        return data_source
    if data_source in DATA_SOURCES:
        return DATA_SOURCES[data_source]
    if isinstance(data_source, str):
        for prefix, name in DATA_SOURCE_PREFIXES.items():
            if data_source.startswith(prefix):
                return name
    if style is not None and style in SCORERS:
        return style
    return None


def known_data_sources() -> list[str]:
    """Every data_source a registered scorer takes (scorer names, aliases, and "prefix*"), sorted."""
    return sorted(set(SCORERS) | set(DATA_SOURCES) | {f"{prefix}*" for prefix in DATA_SOURCE_PREFIXES})


def unknown_data_source_message(data_source: str) -> str:
    known = known_data_sources()
    close = difflib.get_close_matches(str(data_source), known, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return (
        f"no reward scorer for data_source '{data_source}'.{hint} Known data sources: {', '.join(known)}. "
        f"Fix: map it to a built-in scorer with RewardManager(scorer_overrides={{'{data_source}': 'gsm8k'}}), "
        f"point to your own function with scorer_overrides={{'{data_source}': 'path/to/file.py:compute_score'}} "
        "or custom_reward_file='path/to/file.py' (custom_reward_function='compute_score'), "
        f"register one with @register_scorer('my_scorer', '{data_source}'), "
        "or set extra_info['style'] to a scorer name (e.g. 'math')."
    )


def default_scorer_for(data_source: str, style: str | None = None) -> ScorerFn:
    """The built-in (or registered) scorer for `data_source`; raises UnknownDataSourceError."""
    name = scorer_name_for(data_source, style)
    if name is None:
        raise UnknownDataSourceError(unknown_data_source_message(data_source))
    return SCORERS[name]


def scorer_name_of(fn: Any) -> str | None:
    """The name `fn` is registered under (None for a function that is not a registered scorer)."""
    return next((name for name, registered in SCORERS.items() if registered is fn), None)
