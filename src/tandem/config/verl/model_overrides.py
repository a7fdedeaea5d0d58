"""verl's model.override_config of each model Tandem builds from it, read as Tandem's: the attributes set on the
Hugging Face config before the model is built (`<section>.override_config`; verl's megatron nesting under
`model_config` read through), and `attn_implementation`, the attention kernel verl builds the config with, as
that section's kernel setting. The actor's (actor_rollout_ref.model, or model in an SFT line) reaches the
actor, the reference and the rollout engine; the critic's (critic.model) is the critic's own, as in verl."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tandem.config.verl.rules import Rule, UnsupportedValue, maps
from tandem.config.verl.values import hydra_mapping

_NOTE = "set on the model's Hugging Face config before the model is built"
_ATTENTION_NOTE = "verl builds the model config with this attention kernel"


@dataclass(frozen=True)
class ModelOverrides:
    """One verl model's override_config: `verl_key` (its dotted key), the Tandem `section` it fills and the
    key of that section's attention kernel (`attention`, relative to the section)."""

    verl_key: str
    section: str
    attention: str

    def rule(self, key: str) -> Rule | None:
        """The rule of `key` (the whole mapping, or one attribute under it), or None for another key."""
        if key in (self.verl_key, f"{self.verl_key}.model_config"):
            return maps(self.section, _NOTE, convert=self._section)
        attribute = key.removeprefix(f"{self.verl_key}.").removeprefix("model_config.")
        if attribute == key:
            return None
        if attribute == "attn_implementation":
            return maps(f"{self.section}.{self.attention}", _ATTENTION_NOTE)
        return maps(f"{self.section}.override_config.{attribute}", _NOTE)

    def _section(self, value: Any) -> dict[str, Any]:
        """The whole mapping (its attributes, or under `model_config`) as the section's part."""
        value = {} if value in (None, "", "null") else hydra_mapping(value)
        if not isinstance(value, dict):
            raise UnsupportedValue("give a mapping of config.json attributes: {rope_theta: 1000000.0, ...}")
        value = dict(hydra_mapping(value.get("model_config", value)))
        part: dict[str, Any] = {"override_config": value}
        if "attn_implementation" in value:
            *parents, name = self.attention.split(".")
            inner = part
            for parent in parents:
                inner = inner.setdefault(parent, {})
            inner[name] = value.pop("attn_implementation")
        return part


SFT_MODEL = ModelOverrides("model.override_config", "actor", "fsdp.attn_implementation")
ACTOR_MODEL = ModelOverrides("actor_rollout_ref.model.override_config", "actor", "fsdp.attn_implementation")
CRITIC_MODEL = ModelOverrides("critic.model.override_config", "critic", "attn_implementation")


def model_override_rule(key: str) -> Rule | None:
    """The rule of an RL key under the actor's or the critic's override_config, or None."""
    return ACTOR_MODEL.rule(key) or CRITIC_MODEL.rule(key)
