"""The reward manager a TandemConfig's `reward` section describes: Tandem's (your function once per sample, or
once per batch with reward.manager=batch, verl's batch manager) or a reward-manager class of your own."""

from __future__ import annotations

from typing import Any

from tandem.rewards.manager import RewardManager
from tandem.rewards.terms import FormatTerm, LengthTerm, Term, ToolRewardTerm
from tandem.rewards.verl_manager import ManagerClassRewards

# reward.manager's values with reward.manager_source=register
MANAGERS = ("naive", "batch")


def reward_terms(cfg: Any) -> list[Term]:
    """The reward terms the config turns on (format, DAPO's overlong penalty, tool step rewards)."""
    reward = cfg.reward
    terms: list[Term] = []
    if reward.format.enable:
        terms.append(
            FormatTerm(
                reward.format.pattern,
                match_reward=reward.format.match_reward,
                mismatch_reward=reward.format.mismatch_reward,
                fullmatch=reward.format.fullmatch,
            )
        )
    if reward.overlong.enable:
        terms.append(
            LengthTerm(
                overlong_buffer=reward.overlong.buffer_len,
                penalty_factor=reward.overlong.penalty_factor,
                max_response_length=reward.overlong.max_length or cfg.data.max_response_length,
            )
        )
    m = cfg.rollout.multi_turn
    if reward.tool_rewards and (m.tools or m.tool_file):
        terms.append(ToolRewardTerm())
    return terms


def reward_manager_from_config(cfg: Any, tokenizer: Any) -> RewardManager:
    """The RewardManager that a TandemConfig's `reward` section (and `data.max_response_length`) describes."""
    reward = cfg.reward
    if reward.manager_source == "importlib":
        if not reward.manager_file:
            raise ValueError(
                "reward.manager_source=importlib needs reward.manager_file, the file of the class"
            )
        return ManagerClassRewards(
            tokenizer,
            manager_file=reward.manager_file,
            manager_class=reward.manager,
            manager_kwargs=reward.manager_kwargs,
            custom_reward_file=reward.custom_reward_file,
            custom_reward_function=reward.custom_reward_function,
            custom_reward_kwargs=reward.custom_reward_kwargs,
            terms=reward_terms(cfg),
            max_response_length=cfg.data.max_response_length,
        )
    if reward.manager not in MANAGERS:
        raise ValueError(f"reward.manager={reward.manager!r} is none of {MANAGERS}")
    return RewardManager(
        tokenizer,
        custom_reward_file=reward.custom_reward_file,
        custom_reward_function=reward.custom_reward_function,
        custom_reward_kwargs=reward.custom_reward_kwargs,
        terms=reward_terms(cfg),
        timeout_s=reward.timeout_s,
        num_workers=reward.num_workers,
        max_response_length=cfg.data.max_response_length,
        reward_model=cfg.reward.reward_model.enable,
        batch=reward.manager == "batch",
        manager_kwargs=reward.manager_kwargs,
        scorer_kwargs={"code": code_scorer_kwargs(cfg)},
    )


def code_scorer_kwargs(cfg: Any) -> dict[str, Any]:
    """The code scorer's runner (reward.sandbox_fusion): max_concurrent is shared by the scoring processes, one
    sample at a time in each, so each runs at most max_concurrent / reward.num_workers of its cases at once."""
    box = cfg.reward.sandbox_fusion
    processes = max(1, cfg.reward.num_workers)
    return {
        "sandbox_url": box.url,
        "max_concurrent": max(1, box.max_concurrent // processes),
        "memory_limit_mb": box.memory_limit_mb,
    }
