"""The rule a verl key follows in Tandem (`Rule`: maps / no effect / unsupported / same) and its constructors,
in a module of their own: the verl tables (config/verl/keys.py and the tables it merges) import them from
here, not from each other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Effect = Literal[
    "maps", "none", "unsupported", "same"
]  # same: must equal the Tandem key (verl_megatron_keys)


class UnsupportedValue(ValueError):
    """A verl value Tandem has no meaning for (the key itself may have one)."""


@dataclass(frozen=True)
class Rule:
    """What one verl key does in Tandem."""

    effect: Effect
    target: str = ""  # the Tandem key ("maps"); "a,b" sets both (to a convert's tuple: one value each)
    note: str = ""  # why (no effect / unsupported), or how the meaning differs (maps)
    convert: Callable[[Any], Any] | None = None  # verl value -> Tandem value; may raise UnsupportedValue


def maps(target: str, note: str = "", convert: Callable[[Any], Any] | None = None) -> Rule:
    return Rule("maps", target, note, convert)


def no_effect(why: str) -> Rule:
    return Rule("none", note=why)


def unsupported(why: str) -> Rule:
    return Rule("unsupported", note=why)
