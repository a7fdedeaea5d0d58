"""Per-step metrics computed by the controller from the step's batch, and the phase timer.

Names (each computed here and nowhere else):
  score/*            sequence score from the reward (rule scorers + reward model), before any KL
  rewards/*          sequence sum of the token-level rewards the advantages were computed from
  advantages/*, returns/*, values/*   over valid response tokens
  reward_baselines/* ReMax: per sample, the score of its prompt's greedy response (the baseline)
  response_length/*  tokens per response; clip_ratio = share that hit data.max_response_length
  prompt_length/*    tokens per prompt
  actor/entropy      token-mean entropy of the policy on the sampled responses
  timing_s/*         seconds per phase, timing_share/* its share of the step
  perf/*             tokens per second, samples per step; update_flops/<role>, the model FLOPs of the
                     actor's / critic's update, and mfu/<role> against the devices' peak (engine/flops.py)
  agent/*            multi-turn rollouts (rollout.mode=async): turns, tool calls, errors, timeouts and
                     seconds, how trajectories ended, generated vs inserted tokens
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor

from tandem.algos.core import masked_mean
from tandem.batch import Batch
from tandem.rollout.agent import AGENT_FINISH_KEY


def _stats(prefix: str, values: Tensor) -> dict[str, float]:
    values = values.double()
    if values.numel() == 0:
        return {}
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def batch_metrics(batch: Batch, max_response_length: int) -> dict[str, float]:
    """Reward, advantage, value and length statistics of a step's batch (keys as in the module docstring)."""
    mask = batch["response_mask"].bool()
    lengths = mask.sum(-1)
    # The response part of the attention mask: the whole trajectory, tokens tools inserted included.
    trajectory_lengths = batch["attention_mask"][:, -mask.shape[1] :].sum(-1)
    prompt_lengths = batch["attention_mask"].sum(-1) - trajectory_lengths
    metrics = {
        **_stats("response_length", lengths),
        "response_length/clip_ratio": float((trajectory_lengths >= max_response_length).double().mean()),
        **_stats("prompt_length", prompt_lengths),
        **agent_metrics(batch),
    }
    if "token_level_scores" in batch:
        metrics.update(_stats("score", (batch["token_level_scores"] * mask).sum(-1)))
    if "token_level_rewards" in batch:
        metrics.update(_stats("rewards", (batch["token_level_rewards"] * mask).sum(-1)))
    for key in ("advantages", "returns", "values"):
        if key in batch:
            metrics.update(_stats(key, batch[key][mask]))
    if "reward_baselines" in batch:  # ReMax: each sample's baseline, its prompt's greedy response's score
        metrics.update(_stats("reward_baselines", batch["reward_baselines"]))
    if "values" in batch and "returns" in batch:
        returns, values = batch["returns"][mask].double(), batch["values"][mask].double()
        # Explained variance: 1 - Var(R - V) / Var(R); 1 = the critic predicts the returns perfectly.
        variance = returns.var(unbiased=False)
        if variance > 0:
            metrics["critic/vf_explained_var"] = float(1 - (returns - values).var(unbiased=False) / variance)
    if "entropy" in batch:
        metrics["actor/entropy"] = float(masked_mean(batch["entropy"].double(), mask.double()))
    return metrics


def agent_metrics(batch: Batch, prefix: str = "agent") -> dict[str, float]:
    """agent/* over the batch's trajectories; {} when the rollout was not the agent loop."""
    if "agent_turns" not in batch:
        return {}
    calls, errors = batch["agent_tool_calls"].double(), batch["agent_tool_errors"].double()
    finish = batch[AGENT_FINISH_KEY]
    samples = max(len(batch), 1)
    return {
        **_stats(f"{prefix}/turns", batch["agent_turns"]),
        f"{prefix}/user_turns/mean": float(batch["agent_user_turns"].double().mean()),
        f"{prefix}/tool_calls_per_sample": float(calls.mean()),
        f"{prefix}/tool_use_ratio": float((calls > 0).double().mean()),
        f"{prefix}/tool_errors": float(errors.sum()),
        f"{prefix}/tool_error_ratio": float(errors.sum() / calls.sum()) if calls.sum() > 0 else 0.0,
        f"{prefix}/tool_timeouts": float(batch["agent_tool_timeouts"].sum()),
        f"{prefix}/tool_seconds": float(batch["agent_tool_seconds"].sum()),
        f"{prefix}/finish_max_turns_ratio": sum(f == "max_turns" for f in finish) / samples,
        f"{prefix}/finish_budget_ratio": sum(f == "budget" for f in finish) / samples,
        f"{prefix}/finish_time_limit_ratio": sum(f == "time_limit" for f in finish) / samples,
        f"{prefix}/generated_tokens/mean": float(batch["agent_generated_tokens"].double().mean()),
        f"{prefix}/inserted_tokens/mean": float(batch["agent_inserted_tokens"].double().mean()),
    }


def throughput_metrics(batch: Batch, timings: dict[str, float]) -> dict[str, float]:
    """Tokens per second of the whole step and of generation; shares of the step per phase."""
    response_tokens = float(batch["response_mask"].sum())
    all_tokens = float(batch["attention_mask"].sum())
    step = timings["step"]
    metrics = {
        "perf/total_tokens": all_tokens,
        "perf/response_tokens": response_tokens,
        "perf/samples": float(len(batch)),
        "perf/tokens_per_s": all_tokens / step if step > 0 else 0.0,
    }
    if timings.get("generate", 0) > 0:
        metrics["perf/generated_tokens_per_s"] = response_tokens / timings["generate"]
    for name, seconds in timings.items():
        metrics[f"timing_s/{name}"] = seconds
        if name != "step" and step > 0:
            metrics[f"timing_share/{name}"] = seconds / step
    return metrics


def worker_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Numbers the workers report per rank (pop_metrics), one list over every worker of every group: the
    max over them (the largest worker's memory, the slowest rank's time); for `memory/*` also the sum
    over all workers (`memory/<name>_sum`, what the run holds in all) and `memory/workers`, their count."""
    merged: dict[str, float] = {}
    workers = 0
    for metrics in per_rank:
        workers += any(key.startswith("memory/") for key in metrics)
        for key, value in metrics.items():
            merged[key] = max(merged.get(key, value), value)
            if key.startswith("memory/"):
                merged[f"{key}_sum"] = merged.get(f"{key}_sum", 0.0) + value
    if workers:
        merged["memory/workers"] = float(workers)
    return merged


class Timer:
    """Wall-clock seconds per named phase of one step: `with timer("generate"): ...`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
