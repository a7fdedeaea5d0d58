"""The model and tokenizer folders a run reads: each must be a folder a model or tokenizer loads from, checked
before any worker starts; the folders the actor's engine strategy builds (what `engine.check_buildable` reads)."""

from __future__ import annotations

from tandem.config.errors import ConfigError
from tandem.config.schema import TandemConfig
from tandem.engine.hf_io import model_folder_problem, tokenizer_folder_problem
from tandem.trainer.start_checks.tokenizers import actor_tokenizer_source


def _role_folders(cfg: TandemConfig, purpose: str) -> list[tuple[str, str, str, bool]]:
    """(role, key, folder, is_model) of every folder a run of `purpose` reads, model folders first."""
    a, c, rm = cfg.actor, cfg.critic, cfg.reward.reward_model
    tokenizer_key, tokenizer_path = actor_tokenizer_source(cfg)
    folders = [("actor", "actor.model_path", a.model_path, True)]
    if purpose == "rl" and cfg.derived.critic_needed:
        folders.append(("critic", "critic.model_path", c.model_path, True))
    if purpose == "rl" and cfg.derived.reward_model_needed:
        folders.append(("reward model", "reward.reward_model.model_path", rm.model_path, True))
    folders.append(("actor", tokenizer_key, tokenizer_path, False))
    # The critic and the reward model read the actor's token ids: their tokenizers are only compared
    # with the actor's (role_tokenizer_warnings), so only one named explicitly must be there.
    if (
        purpose == "rl"
        and cfg.derived.critic_needed
        and c.tokenizer_path
        and c.tokenizer_path != a.tokenizer_path
    ):
        folders.append(("critic", "critic.tokenizer_path", c.tokenizer_path, False))
    if purpose == "rl" and cfg.derived.reward_model_needed and rm.tokenizer_path:
        folders.append(("reward model", "reward.reward_model.tokenizer_path", rm.tokenizer_path, False))
    return [f for f in folders if f[2]]


def check_model_folders(cfg: TandemConfig, purpose: str = "rl") -> None:
    """Every model folder a run of `purpose` (rl, eval, sft) loads must hold config.json and weights,
    and the actor's tokenizer folder tokenizer files; else a ConfigError listing each key and folder."""
    problems, bad_folders = [], set()
    for role, key, folder, is_model in _role_folders(cfg, purpose):
        if folder in bad_folders:
            continue  # one message per folder
        if is_model:
            problem = model_folder_problem(folder)
            fix = (
                f"point {key} at a local Hugging Face folder of the {role} (config.json, weights, tokenizer)"
            )
        else:
            problem = tokenizer_folder_problem(folder)
            fix = (
                "put the model's tokenizer files there, or set actor.tokenizer_path to the folder that holds them"
                if key == "actor.model_path"
                else f"point {key} at a folder holding the tokenizer files, or leave it unset"
            )
        if problem is not None:
            bad_folders.add(folder)
            problems.append(f"{key}={folder}: {problem}; {fix}")
    if problems:
        raise ConfigError(problems)


def engine_model_folders(cfg: TandemConfig) -> dict[str, str]:
    """The model folders the actor's engine strategy builds, by key: the actor's, and the critic's and the reward
    model's when the run has them (what `engine.check_buildable` reads)."""
    folders = {"actor.model_path": cfg.actor.model_path}
    if cfg.derived.critic_needed:
        folders["critic.model_path"] = cfg.critic.model_path
    if cfg.derived.reward_model_needed:
        folders["reward.reward_model.model_path"] = cfg.reward.reward_model.model_path
    return folders
