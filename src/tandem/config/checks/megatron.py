"""The megatron section's checks: a distributed checkpoint needs the megatron engine, and the keys of
megatron-core's own configs a user sets (the rules in config/megatron_overrides.py, which the engine's build reads
too)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tandem.config.megatron_overrides import megatron_fields, override_problems
from tandem.train_engine_options import engines_with, facts

if TYPE_CHECKING:
    from tandem.config.errors import Problems
    from tandem.config.schema import TandemConfig


def check_megatron(cfg: TandemConfig, problems: Problems) -> None:
    """The override keys of actor.megatron (read whatever the strategy: a typo is a typo); the distributed
    checkpoints a run starts from need the megatron engine (their folders are checked at start-up)."""
    mp = cfg.actor.megatron
    for key, value in (
        ("actor.megatron.dist_checkpoint", mp.dist_checkpoint),
        ("critic.megatron_dist_checkpoint", cfg.critic.megatron_dist_checkpoint),
    ):
        if value and not facts(cfg.actor.strategy).dist_checkpoint:
            problems.add(
                (key, "actor.strategy"),
                f"{key}: a megatron distributed checkpoint starts the megatron engine only; set "
                f"actor.strategy={' or '.join(engines_with('dist_checkpoint'))}, or convert it to a Hugging Face "
                "folder (`tandem convert mcore-to-hf`) and start from that",
            )
    for kind, overrides in (
        ("transformer", mp.override_transformer_config),
        ("optimizer", mp.override_optimizer_config),
    ):
        if overrides:
            for key, message in override_problems(kind, overrides, megatron_fields(kind)):
                problems.add(key, message)
