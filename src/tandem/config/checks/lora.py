"""The LoRA settings that read a folder or a pattern: the adapter folder the actor's adapters start from
(`actor.lora.adapter_path`), whose own config fills the actor's LoRA keys, and the `exclude_modules` entries.

Where we differ from verl: verl's FSDP workers load the folder with PEFT and ignore lora_rank / lora_alpha /
target_modules beside it without a word; Tandem fills those keys from the folder's config where they are at
their defaults, and refuses a run that sets one to another value (naming both), so that the config a run
prints is the one it trains."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tandem.config.errors import Problems
from tandem.config.lora_names import ADAPTER_CONFIG, ADAPTER_WEIGHTS

if TYPE_CHECKING:
    from tandem.config.schema import TandemConfig

_KEY = "actor.lora.adapter_path"
# what a PEFT LoRA config may hold that Tandem's merge into the rollout's weights, its checkpoints and vLLM's
# adapter sync do not reproduce: (field, its plain value)
_NOT_BUILT = (
    ("use_dora", False),
    ("modules_to_save", None),
    ("bias", "none"),
    ("rank_pattern", {}),
    ("alpha_pattern", {}),
)


def check_lora(cfg: TandemConfig, problems: Problems) -> None:
    """The actor's adapter folder (filling actor.lora from its config) and every exclude_modules entry."""
    resolve_adapter(cfg, problems)
    for role, lora in (("actor", cfg.actor.lora), ("critic", cfg.critic.lora)):
        for entry in lora.exclude_modules:
            try:
                re.compile(entry)
            except re.error as error:
                problems.add(
                    f"{role}.lora.exclude_modules",
                    f"{role}.lora.exclude_modules: {entry!r} is no regular expression ({error}); give a "
                    "module's name or a valid expression (e.g. .*visual.*)",
                )


def resolve_adapter(cfg: TandemConfig, problems: Problems) -> None:
    """actor.lora's rank, alpha, dropout, target_modules and exclude_modules from the adapter folder's config
    (in place); a key set to another value than the folder's is a problem naming both. A no-op without a folder,
    and again after it ran (the keys then equal the folder's)."""
    from tandem.config.schema import ActorLoraConfig

    lora = cfg.actor.lora
    if lora.adapter_path is None:
        return
    saved = _read_adapter_config(lora.adapter_path, problems)
    if saved is None:
        return
    folder = f"{_KEY}={lora.adapter_path}"
    for field, plain in _NOT_BUILT:
        if saved.get(field) and saved[field] != plain:  # absent, empty or plain: plain LoRA
            problems.add(
                _KEY,
                f"{folder}: its {ADAPTER_CONFIG} sets {field}={saved[field]!r}; Tandem trains plain LoRA adapters "
                f"({field} {plain!r}): not built",
            )
            return
    found = {
        "rank": saved.get("r"),
        "alpha": saved.get("lora_alpha"),
        "dropout": saved.get("lora_dropout", 0.0),
        "target_modules": _as_list(saved.get("target_modules")),
        "exclude_modules": _as_list(saved.get("exclude_modules")),
    }
    if not isinstance(found["rank"], int) or found["rank"] <= 0 or found["alpha"] is None:
        problems.add(
            _KEY,
            f"{folder}: its {ADAPTER_CONFIG} is no LoRA adapter's (r={found['rank']}, lora_alpha missing?)",
        )
        return
    defaults = ActorLoraConfig()
    unset = {"rank": 0}
    for name, value in found.items():
        given, default = getattr(lora, name), unset.get(name, getattr(defaults, name))
        same = sorted(given) == sorted(value) if isinstance(value, list) else given == value
        if given != default and not same:
            problems.add(
                (f"actor.lora.{name}", _KEY),
                f"actor.lora.{name}={given} but the adapter {folder} has {value} ({ADAPTER_CONFIG}), which "
                f"places and sizes the adapters it starts from: leave actor.lora.{name} unset or set it to {value}",
            )
    if problems.bad_keys() & {f"actor.lora.{name}" for name in found}:
        return
    lora.rank, lora.alpha, lora.dropout = found["rank"], float(found["alpha"]), float(found["dropout"])
    lora.target_modules, lora.exclude_modules = found["target_modules"], found["exclude_modules"]


def _read_adapter_config(path: str, problems: Problems) -> dict[str, Any] | None:
    """The folder's adapter_config.json, or None and a problem naming what is missing."""
    folder = Path(path).expanduser()
    fix = (
        "point it at a PEFT adapter folder: PeftModel.save_pretrained's, or the lora_adapter/ of a Tandem "
        "export (tandem export)"
    )
    if not folder.is_dir():
        problems.add(_KEY, f"{_KEY}={path}: the folder does not exist; {fix}")
        return None
    missing = [name for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS) if not (folder / name).is_file()]
    if missing:
        problems.add(_KEY, f"{_KEY}={path}: the folder has no {' and no '.join(missing)}; {fix}")
        return None
    try:
        saved = json.loads((folder / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as error:
        problems.add(_KEY, f"{_KEY}={path}: {ADAPTER_CONFIG} does not read as JSON ({error}); {fix}")
        return None
    if not isinstance(saved, dict) or saved.get("peft_type", "LORA") != "LORA":
        kind = saved.get("peft_type") if isinstance(saved, dict) else type(saved).__name__
        problems.add(
            _KEY, f"{_KEY}={path}: {ADAPTER_CONFIG} is not a LoRA adapter's (peft_type {kind}); {fix}"
        )
        return None
    return saved


def _as_list(value: Any) -> list[str]:
    """PEFT's target_modules / exclude_modules as Tandem's list: a string (a regular expression, or all-linear)
    as its one entry, a list or set of names sorted."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return sorted(value)
