"""What the training engine (actor.strategy) builds as asked: the engine's own check of its settings and model
folders (`engine.check_buildable`), the model-config overrides and attention kernels, and the megatron
distributed checkpoints a run starts from."""

from __future__ import annotations

from pathlib import Path

from tandem.config.schema import TandemConfig
from tandem.engine import check_buildable
from tandem.train_engine_options import facts, settings
from tandem.trainer.start_checks.model_folders import engine_model_folders


def training_engine_problems(cfg: TandemConfig) -> list[str]:
    """What the actor's engine strategy could not build of its settings and the run's model folders."""
    return check_buildable(cfg.actor.strategy, settings(cfg.actor), engine_model_folders(cfg))


def dist_checkpoint_problems(cfg: TandemConfig, purpose: str = "rl") -> list[str]:
    """The megatron distributed checkpoints the run starts from are folders megatron wrote (its metadata.json);
    whether they hold the model's weights is checked as each engine loads them (engine/megatron/dist_start.py)."""
    if not facts(cfg.actor.strategy).dist_checkpoint:
        return []
    folders = {"actor.megatron.dist_checkpoint": cfg.actor.megatron.dist_checkpoint}
    if purpose != "sft" and cfg.derived.critic_needed:
        folders["critic.megatron_dist_checkpoint"] = cfg.critic.megatron_dist_checkpoint
    problems = []
    for key, folder in folders.items():
        if folder and not (Path(folder).expanduser() / "metadata.json").is_file():
            what = "no such folder" if not Path(folder).expanduser().is_dir() else "no metadata.json in it"
            problems.append(
                f"{key}={folder}: not a megatron distributed checkpoint ({what}); `tandem convert hf-to-mcore "
                "MODEL_DIR OUT_DIR` writes one from a Hugging Face folder"
            )
    return problems


# attention kernels that run on CUDA only (engine/attention.py `resolve` says the same in the worker)
CUDA_ATTENTION = ("flash_attention_2", "varlen")


def model_override_problems(cfg: TandemConfig, purpose: str = "rl") -> list[str]:
    """What keeps the model config overrides (actor.override_config for the actor, reference and rollout;
    critic.override_config) and the roles' attention kernels from being built as asked: megatron builds from
    config.json alone, and a CUDA-only kernel on trainer.device=cpu."""
    problems = []
    sections = {"actor": cfg.actor.override_config}
    if purpose != "sft" and cfg.critic.override_config:
        sections["critic"] = cfg.critic.override_config
    for role, overrides in sections.items():
        if overrides and not facts(cfg.actor.strategy).override_config:
            problems.append(
                f"{role}.override_config is applied by the FSDP2 engine (actor.strategy=fsdp); megatron's own is "
                "actor.megatron.override_transformer_config (or edit the model folder's config.json)"
            )
        if "attn_implementation" in overrides:
            problems.append(
                f"{role}.override_config.attn_implementation: the attention kernel is "
                f"{'actor.fsdp' if role == 'actor' else 'critic'}.attn_implementation; set it there"
            )
    kernels = {"actor.fsdp.attn_implementation": cfg.actor.fsdp.attn_implementation}
    if purpose != "sft":
        kernels["critic.attn_implementation"] = cfg.critic.attn_implementation
    for key, kernel in kernels.items():
        if cfg.trainer.device == "cpu" and kernel in CUDA_ATTENTION:
            problems.append(
                f"{key}={kernel} runs on CUDA only and trainer.device=cpu; set {key}=sdpa (or sdpa_split, eager)"
            )
    return problems
