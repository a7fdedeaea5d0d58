"""What a vision-language actor runs with yet (README, 'Vision-language models'): the training engine, no
sequence parallel, vLLM's rollout of images, no critic or reward model."""

from __future__ import annotations

from tandem.config.schema import TandemConfig
from tandem.train_engine_options import engines_with, facts
from tandem.trainer.start_checks.rollout_engine import vision_language_rollout_problems


def vision_language_problems(cfg: TandemConfig, model_type: str, purpose: str = "rl") -> list[str]:
    """What a vision-language actor does not run with yet (README, 'Vision-language models'); SFT asks only
    about the training engine."""
    a = cfg.actor
    what = f"actor.model_path is a vision-language model ({model_type})"
    problems = []
    if not facts(a.strategy).vision_language:
        problems.append(
            f"{what}: train it with actor.strategy={' or '.join(engines_with('vision_language'))}"
        )
    if a.fsdp.sequence_parallel > 1:
        problems.append(f"{what}: not yet with actor.fsdp.sequence_parallel > 1")
    if purpose == "sft":
        return problems
    problems += vision_language_rollout_problems(cfg, what)
    if cfg.derived.critic_needed or cfg.derived.reward_model_needed:
        problems.append(
            f"{what}: no critic or reward model reads images yet; use a critic-free estimator (grpo, "
            "rloo, ...) and rule-based rewards"
        )
    return problems
