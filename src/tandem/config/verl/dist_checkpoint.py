"""verl's megatron distributed checkpoint keys, read together as verl reads them: a role's
`megatron.dist_checkpointing_path` is its starting weights only with that role's `megatron.use_dist_checkpointing`
true (config/verl/translate.py hands these keys here, with the values the whole command line or YAML gives).

  verl (actor_rollout_ref.actor / .ref / critic)   Tandem
  actor...use_dist_checkpointing + ..._path        actor.megatron.dist_checkpoint (the actor's, SFT's start)
  ref...use_dist_checkpointing + ..._path          the actor's: Tandem's reference is the actor's starting
                                                   weights; accepted when it names the actor's folder
  critic...use_dist_checkpointing + ..._path       critic.megatron_dist_checkpoint

Where Tandem differs: verl with use_dist_checkpointing true and no path fails as it loads; here the command
line is refused naming the key. The reward model's keys stay refused (extra_keys.py): verl's loader drops
a value model's output layer, a reward model's trained head.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tandem.config.yaml_io import is_true, parse_scalar

_ROLES = {
    "actor_rollout_ref.actor.megatron.": "actor.megatron.dist_checkpoint",
    "actor_rollout_ref.ref.megatron.": "actor.megatron.dist_checkpoint",
    "critic.megatron.": "critic.megatron_dist_checkpoint",
}
USE, PATH = "use_dist_checkpointing", "dist_checkpointing_path"
DIST_KEYS = {prefix + name for prefix in _ROLES for name in (USE, PATH)}
REFERENCE = "the reference is the actor's starting weights (actor.megatron.dist_checkpoint)"


def _folder(text: str | None) -> str:
    value = parse_scalar((text or "").strip())
    return "" if value is None else str(value).strip()


def read_dist_checkpoint(out: Any, text: str, given: Mapping[str, str]) -> None:
    """One of DIST_KEYS (`text`, a `key=value` override) into the translation `out` (config/verl/translate.py's
    VerlTranslation); `given`: the values of DIST_KEYS the whole config gives."""
    key = text.lstrip("+").partition("=")[0].strip()
    prefix = key[: -len(USE)] if key.endswith(USE) else key[: -len(PATH)]
    target, reference = _ROLES[prefix], prefix.startswith("actor_rollout_ref.ref.")
    on, folder = is_true(given.get(prefix + USE)), _folder(given.get(prefix + PATH))
    shown = text.lstrip("+")
    if key.endswith(USE):
        if not on:
            out.no_effect.append((shown, "false: Tandem reads the weights from the Hugging Face folder"))
        elif not folder:
            out.problems.append(
                (
                    key,
                    f"{key}=True needs {prefix + PATH}=FOLDER, the megatron distributed checkpoint to start from",
                )
            )
        else:
            out.mapped.append((shown, f"({target}: {prefix + PATH})", ""))
        return
    if not on:
        out.no_effect.append((shown, f"verl reads it only with {prefix + USE}=True"))
    elif reference:
        actor = "actor_rollout_ref.actor.megatron."
        actor_folder = _folder(given.get(actor + PATH)) if is_true(given.get(actor + USE)) else ""
        if folder == actor_folder:
            out.mapped.append((shown, f"(the same as {target})", REFERENCE))
        else:
            started = (
                f"{actor + PATH}={actor_folder}" if actor_folder else "the Hugging Face folder (model.path)"
            )
            out.problems.append(
                (
                    key,
                    f"{key}={folder}: {REFERENCE}, here {started}; give the actor the same folder, or drop it",
                )
            )
    elif folder:
        out.overrides.append(f"{target}={folder}")
        out.mapped.append((shown, f"{target}={folder}", "model.path still gives the config and tokenizer"))
