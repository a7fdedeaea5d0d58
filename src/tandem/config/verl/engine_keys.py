"""verl keys that only one of verl's training engines reads.

verl's FSDP workers take LoRA from the model's `lora_rank`, `lora_alpha`, `target_modules`, `exclude_modules` and
`lora_adapter_path`; its megatron workers take it from the `model.lora` block alone (megatron-bridge's LoRA:
`rank`, `alpha`, `target_modules`, ...). Each engine ignores the other's keys. Tandem reads both sets into the
one `actor.lora` / `critic.lora`, so it reads such a key only when the run's verl engine
(`actor_rollout_ref.actor.strategy`, fsdp by default as in verl's ppo_trainer.yaml) is the one that reads it.

The other engine's key is:
- at verl's default value: accepted with no effect, as verl ignores it. Mapping it could undo the key verl does
  read: a `lora_rank=0` left beside `lora.rank=32` on megatron turned LoRA off.
- at any other value: refused by name. verl would run without it without a word (a full fine-tune where LoRA was
  asked for), which is not a run to reproduce; the message names the key the run's engine reads.
"""

from __future__ import annotations

from collections.abc import Mapping

from tandem.config.verl.rules import UnsupportedValue
from tandem.config.verl.values import strategy

STRATEGY_KEY = "actor_rollout_ref.actor.strategy"
# verl's FSDP-only key -> the megatron key that means the same there
FSDP_ONLY = {
    "actor_rollout_ref.model.lora_rank": "actor_rollout_ref.model.lora.rank",
    "actor_rollout_ref.model.lora_alpha": "actor_rollout_ref.model.lora.alpha",
    "actor_rollout_ref.model.target_modules": "actor_rollout_ref.model.lora.target_modules",
    "actor_rollout_ref.model.exclude_modules": "actor_rollout_ref.model.lora.exclude_modules",
    "actor_rollout_ref.model.lora_adapter_path": "actor_rollout_ref.model.lora.adapter_path",
    "critic.model.lora_rank": "critic.model.lora.rank",
    "critic.model.lora_alpha": "critic.model.lora.alpha",
    "critic.model.target_modules": "critic.model.lora.target_modules",
}
MEGATRON_TO_FSDP = {megatron: fsdp for fsdp, megatron in FSDP_ONLY.items()}
MEGATRON_BLOCKS = ("actor_rollout_ref.model.lora.", "critic.model.lora.")


def reading_engine(key: str) -> str | None:
    """The one verl engine that reads `key` (fsdp or megatron), or None when both read it."""
    if key in FSDP_ONLY:
        return "fsdp"
    if key.startswith(MEGATRON_BLOCKS):
        return "megatron"
    return None


def run_engine(sizes: Mapping[str, str]) -> str | None:
    """The run's verl engine from `sizes` (translate.verl_sizes: the config's strategy, the command line's over
    it); None for a strategy Tandem does not build (its own key's error says so)."""
    try:
        return strategy(sizes.get(STRATEGY_KEY, "fsdp").strip())
    except UnsupportedValue:
        return None


def ignored_note(reader: str, engine: str) -> str:
    return f"verl's {reader} workers read it, this run's are {engine}'s: no effect, as on verl"


def ignored_message(key: str, value_text: str, reader: str, engine: str) -> str:
    """Why `key=value_text`, read by verl's `reader` engine only, is refused in a run on `engine`."""
    same = FSDP_ONLY.get(key) or MEGATRON_TO_FSDP.get(key)
    instead = (
        f"on {engine} verl reads {same}: give that, or drop this key"
        if same
        else f"verl's {engine} LoRA has no such setting (its keys: the model's lora_rank, lora_alpha, "
        "target_modules, exclude_modules, lora_adapter_path): drop this key"
    )
    return (
        f"{key}={value_text}: verl's {reader} workers read this key and this run's are {engine}'s "
        f"({STRATEGY_KEY}), so verl would run as if it were not given; {instead}"
    )
