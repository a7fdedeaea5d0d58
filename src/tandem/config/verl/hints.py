"""What to tell a user about a verl key that no rule covers: a key verl has that Tandem does not support, a key of
an older verl release (config/verl/removed.py), or a misspelled one with the nearest key Tandem reads that is a key
of verl's config or of Tandem's (config/verl/translate.py's problems)."""

from __future__ import annotations

import functools

from tandem.config.coerce import all_paths, type_at
from tandem.config.errors import closest
from tandem.config.schema import TandemConfig
from tandem.config.verl.defaults import GENERATION_DEFAULTS, RL_DEFAULTS, SFT_DEFAULTS
from tandem.config.verl.keys import VERL_KEYS, VERL_SECTIONS
from tandem.config.verl.names import VERL_NAMES
from tandem.config.verl.removed import removed_key, removed_key_message
from tandem.config.verl.removed_keys import REMOVED_GENERATION, REMOVED_PPO, REMOVED_SFT
from tandem.config.verl.sft_keys import SFT_AS_RL, SFT_KEYS


@functools.cache
def known_verl_keys(sft: bool = False) -> frozenset[str]:
    """Every verl key Tandem reads: the table's own entries, and the verl names of the Tandem keys its renamed
    sections cover (`actor_rollout_ref.actor.optim.lr` for actor.optim.lr); for SFT, their SFT names too."""
    keys = set(VERL_KEYS)
    tandem = all_paths(TandemConfig)
    for verl_prefix, prefix in VERL_SECTIONS:
        for key in tandem:
            if key.startswith(prefix) and key != prefix.rstrip("."):
                keys.add(verl_prefix + key.removeprefix(prefix).replace("_per_rank", "_per_gpu"))
    if sft:
        keys |= set(SFT_KEYS)
        for sft_prefix, rl_prefix in SFT_AS_RL:
            keys |= {sft_prefix + k.removeprefix(rl_prefix) for k in keys if k.startswith(rl_prefix)}
    return frozenset(keys)


@functools.cache
def verl_config_keys(sft: bool = False) -> frozenset[str]:
    """The keys of verl's current configs of one trainer (PPO and megatron, or the two SFT trainers), every level:
    `actor_rollout_ref.actor.optim.lr` and `actor_rollout_ref.actor.optim`."""
    table = SFT_DEFAULTS if sft else RL_DEFAULTS
    return frozenset(".".join(k.split(".")[:n]) for k in table for n in range(1, k.count(".") + 2))


@functools.cache
def _open_mappings() -> frozenset[str]:
    """Keys of verl's configs whose default is a mapping: verl takes any key under them (`+...override_config.x`)."""
    tables = (RL_DEFAULTS, SFT_DEFAULTS, GENERATION_DEFAULTS)
    return frozenset(k for t in tables for k, values in t.items() if any(isinstance(v, dict) for v in values))


def is_verl_config_key(key: str) -> bool:
    """Whether verl has `key`: in a current config of any of its trainers (under a mapping-valued key too), or in
    one of its releases of the last year."""
    parts = key.split(".")
    return (
        key in VERL_NAMES
        or key in verl_config_keys(False)
        or key in verl_config_keys(True)
        or any(k == key or k.startswith(key + ".") for k in GENERATION_DEFAULTS)
        or any(".".join(parts[:n]) in _open_mappings() for n in range(1, len(parts)))
        or any(key in table for table in (REMOVED_PPO, REMOVED_SFT, REMOVED_GENERATION))
    )


@functools.cache
def _suggestions(sft: bool) -> tuple[str, ...]:
    """The names a hint may offer: the keys of verl's current config (this trainer's), and the keys Tandem reads
    as verl's that are Tandem's own; never an older or made-up name."""
    tandem = {k for k in known_verl_keys(sft) if type_at(k) is not None}
    return tuple(sorted(verl_config_keys(sft) | tandem))


def unknown_verl_key_message(key: str, sft: bool = False, value_text: str | None = None) -> str:
    """The problem of verl key `key` (as the user wrote it, given `value_text` where known) that no rule covers."""
    removed = removed_key_message(key, "sft" if sft else "ppo", value_text)
    if removed is None and removed_key(key, "ppo" if sft else "sft") is not None:  # the other trainer's
        removed = removed_key_message(key, "ppo" if sft else "sft", value_text)
    if removed is not None:
        return removed
    if is_verl_config_key(key):
        return (
            f"{key}: a verl key Tandem does not support (Tandem has no setting for it; "
            "tandem/config/verl/keys.py lists the verl keys it reads). Remove it; where it changes what is "
            "trained, find the nearest Tandem setting in `tandem config` output"
        )
    known = _suggestions(sft)
    section = key.rsplit(".", 1)[0] + "."
    near = closest(key, [k for k in known if k.startswith(section)]) or closest(key, known)
    hint = f" Did you mean '{near}'?" if near else ""
    return f"{key}: not a key of verl's config, and none Tandem reads.{hint} Fix the spelling, or remove it"
