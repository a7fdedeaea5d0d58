"""Helpers the section checks share: bounds on one value, and every non-finite number of a config."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

from tandem.config.errors import Problems


def at_least(problems: Problems, key: str, value: float | None, low: float, what: str = "") -> None:
    if value is not None and value < low:
        problems.add(key, f"{key}={value} must be >= {low}{what}")


def within(problems: Problems, key: str, value: float, low: float, high: float, how: str) -> None:
    ok = {"[]": low <= value <= high, "(]": low < value <= high, "[)": low <= value < high}[how]
    if not ok:
        problems.add(key, f"{key}={value} must be in {how[0]}{low}, {high}{how[1]}")


def non_finite(obj: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    """(dotted key, value) of every nan / inf float, lists and tuples included."""
    for f in dataclasses.fields(obj):
        if f.name.startswith("_"):
            continue
        value, key = getattr(obj, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from non_finite(value, f"{key}.")
        items = enumerate(value) if isinstance(value, list | tuple) else [(None, value)]
        for i, item in items:
            if isinstance(item, float) and not math.isfinite(item):
                yield (key if i is None else f"{key}[{i}]"), item
