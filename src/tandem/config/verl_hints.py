"""What to tell a user about a verl key that no rule covers: a key verl has that Tandem does not support, or a
misspelled one with the nearest verl key Tandem reads (config/verl.py's problems)."""

from __future__ import annotations

import functools

from tandem.config.coerce import all_paths
from tandem.config.errors import closest
from tandem.config.schema import TandemConfig
from tandem.config.verl_keys import VERL_KEYS, VERL_SECTIONS
from tandem.config.verl_names import VERL_NAMES
from tandem.config.verl_sft_keys import SFT_AS_RL, SFT_KEYS


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


def unknown_verl_key_message(key: str, sft: bool = False) -> str:
    """The problem of verl key `key` (as the user wrote it) that no rule covers."""
    if key in VERL_NAMES:
        return (
            f"{key}: a verl key Tandem does not support (Tandem has no setting for it; "
            "tandem/config/verl_keys.py lists the verl keys it reads). Remove it; where it changes what is "
            "trained, find the nearest Tandem setting in `tandem config` output"
        )
    known = known_verl_keys(sft)
    section = key.rsplit(".", 1)[0] + "."
    near = closest(key, [k for k in known if k.startswith(section)]) or closest(key, known)
    hint = f" Did you mean '{near}'?" if near else ""
    return f"{key}: not a key of verl's config, and none Tandem reads.{hint} Fix the spelling, or remove it"
