"""The one error type of the config layer, and the list that collects problems before raising it."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass


class ConfigError(ValueError):
    """A configuration that cannot run. The message lists every problem found, one per line."""

    def __init__(self, problems: Iterable[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            message = f"{len(self.problems)} problems in the configuration:\n{lines}"
        super().__init__(message)


@dataclass(frozen=True)
class Problem:
    keys: tuple[str, ...]  # dotted keys the problem is about (used to drop follow-on errors)
    message: str


class Problems:
    """Collects problems so that a user sees all of them at once, not one per run."""

    def __init__(self) -> None:
        self.items: list[Problem] = []
        self.notes: dict[str, str] = {}  # dotted key -> where its value came from, e.g. an override
        # dotted key -> the YAML file that set it; named only in problems found while parsing, since
        # a rule about two keys would blame whichever file happened to set the first one
        self.files: dict[str, str] = {}

    def add(self, keys: str | Iterable[str], message: str) -> None:
        keys = (keys,) if isinstance(keys, str) else tuple(keys)
        note = next((n for k in keys if (n := self.note_for(k))), None)
        self.items.append(Problem(keys, f"{message} ({note})" if note else message))

    def note_for(self, key: str) -> str | None:
        """Where `key` (or the section holding it) was set: `from override '...'` or `in FILE`."""
        key = key.split("[")[0]
        parts = key.split(".")
        for depth in range(len(parts), 0, -1):  # an override may have set the whole section
            note = self.notes.get(".".join(parts[:depth]))
            if note:
                return note
        return self.files.get(key)  # files record every key they set, sections included

    def bad_keys(self) -> set[str]:
        return {k for p in self.items for k in p.keys}

    def __bool__(self) -> bool:
        return bool(self.items)

    def raise_if_any(self) -> None:
        if self.items:
            raise ConfigError([p.message for p in self.items])


def closest(word: str, candidates: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The candidate most like `word`, or None when nothing is close."""
    found = difflib.get_close_matches(word, list(candidates), n=1, cutoff=cutoff)
    return found[0] if found else None
