"""verl keys its releases of the last year had and its current config lacks (the table: config/verl/removed_keys.py,
generated from verl's releases). A command line written for such a release gives them: at the old default a key
changes nothing and is accepted as if absent, with a note; at any other value it is refused, naming the release
that last had it and the key verl has for it now (or that verl dropped the setting). config/verl/translate.py's
accept_old_default and config/verl/hints.py read them where no rule covers a key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tandem.config.verl.removed_keys import REMOVED_GENERATION, REMOVED_PPO, REMOVED_SFT

# whose command line: verl's main_ppo, its SFT trainers, main_generation
Trainer = Literal["ppo", "sft", "generation"]
_TABLES = {"ppo": REMOVED_PPO, "sft": REMOVED_SFT, "generation": REMOVED_GENERATION}


@dataclass(frozen=True)
class RemovedKey:
    """A verl key of an older release: its defaults there, the last release with it, verl's key for it now
    (None: verl dropped the setting) and whether that key takes the same values (a rename)."""

    key: str
    defaults: tuple
    last_release: str
    current: str | None
    renamed: bool


def removed_key(key: str, trainer: Trainer = "ppo") -> RemovedKey | None:
    """The removed verl key `key` of `trainer`'s configs, or None when it is not one."""
    entry = _TABLES[trainer].get(key.strip().lstrip("+"))
    return RemovedKey(key.strip().lstrip("+"), *entry) if entry is not None else None


def old_defaults(trainer: Trainer = "ppo") -> dict[str, tuple]:
    """Each removed key of `trainer`'s configs -> the defaults it had (the shape of config/verl/defaults.py's)."""
    return {key: entry[0] for key, entry in _TABLES[trainer].items()}


def removed_note(key: str, trainer: Trainer = "ppo") -> str:
    """What reading removed key `key` at its old default did: nothing, and the key verl has for it now."""
    old = removed_key(key, trainer)
    now = f"; verl's key for it now is {old.current}" if old.current else ""
    return f"removed from verl after {old.last_release}; at its old default it changes nothing{now}"


def removed_key_message(key: str, trainer: Trainer = "ppo", value_text: str | None = None) -> str | None:
    """Why removed verl key `key` (given `value_text`, where known) is refused: the release that last had it, its
    old default (accepted), and what to write instead. None when `key` is not a removed key."""
    old = removed_key(key, trainer)
    if old is None:
        return None
    given = f"{old.key}={value_text.strip()}" if value_text is not None else old.key
    defaults = " or ".join(_text(d) for d in old.defaults)
    head = (
        f"{given}: a key of verl up to {old.last_release}, removed since; only its old default ({defaults}) is "
        "accepted, as if absent."
    )
    if old.current and old.renamed:
        value = value_text.strip() if value_text is not None else "VALUE"
        return f"{head} verl's name for it now is {old.current}: write {old.current}={value}"
    if old.current:
        return (
            f"{head} verl replaced it with {old.current}, which takes other values (see verl's docs for it)"
        )
    return f"{head} verl dropped the setting: remove it"


def _text(value: object) -> str:
    """A default as a verl command line writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
