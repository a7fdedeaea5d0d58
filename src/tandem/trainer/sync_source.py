"""trainer.async_mode=synchronous: each step generates its own samples, with the actor's current weights.

With DAPO dynamic sampling (algorithm.dynamic_sampling.enable) a step generates rounds of gen_batch_size
prompts, drops the groups whose samples all score alike, and goes on until data.train_batch_size prompts
are kept; the surplus of the last round is cut.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch

from tandem.algos.core import group_stats
from tandem.batch import Batch
from tandem.rollout import SamplingParams
from tandem.trainer.dumps import REWARD_EXTRA_KEY
from tandem.trainer.metrics import Timer
from tandem.trainer.rollout_source import RolloutSource

COUNT_SUFFIX = "_count"


class SyncSource(RolloutSource):
    """Generate and score the step's prompts now; with dynamic sampling, in rounds until the batch is full."""

    def next(self, step: int, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """The step's samples with `token_level_scores`. With dynamic sampling, rounds of
        gen_batch_size prompts until data.train_batch_size prompts with varied scores are kept."""
        t = self.rollouts
        cfg = t.cfg
        ds, n, wanted = cfg.algorithm.dynamic_sampling, cfg.rollout.n, cfg.data.train_batch_size
        kept: list[Batch] = []
        reward_metrics: list[tuple[int, dict[str, float]]] = []
        kept_prompts = drawn_prompts = rounds = 0
        while True:
            rounds += 1
            indices = t.draw()
            drawn_prompts += len(indices)
            with timer("generate"):
                batch = self.generate(indices, step, rounds)
            with timer("reward"):
                batch, metrics = t.score(batch, train=True)
            reward_metrics.append((len(batch), metrics))
            if not ds.enable:
                kept.append(batch)
                break
            keep = varied_groups(sample_metric(batch, ds.metric), batch["uid"])
            kept.append(batch.reorder(keep))
            kept_prompts += len(keep) // n
            if kept_prompts >= wanted:
                break
            if 0 < ds.max_num_gen_batches <= rounds:
                raise RuntimeError(
                    f"dynamic sampling: after {rounds} rounds of {len(indices)} prompts only {kept_prompts} of "
                    f"data.train_batch_size={wanted} prompts had samples that scored differently "
                    f"(algorithm.dynamic_sampling.metric={ds.metric}). The task is too easy or too hard "
                    "for the model: raise algorithm.dynamic_sampling.max_num_gen_batches (0 = no limit) or "
                    "gen_batch_size, or change the data"
                )
        batch = t.concat(kept).slice(0, wanted * n) if ds.enable else kept[0]
        metrics = _merge_reward_metrics(reward_metrics)
        if ds.enable:
            metrics["dynamic_sampling/rounds"] = float(rounds)
            metrics["dynamic_sampling/prompts_drawn"] = float(drawn_prompts)
            metrics["dynamic_sampling/groups_kept"] = float(kept_prompts)
            metrics["dynamic_sampling/kept_ratio"] = kept_prompts / drawn_prompts
        return batch, metrics

    def generate(self, indices: list[int], step: int, round_: int) -> Batch:
        """rollout.n samples per prompt of training rows `indices`; a `uid` per prompt; ReMax's greedy
        baseline scores when needed."""
        t = self.rollouts
        r, d = t.cfg.rollout, t.cfg.data
        prompts, sampling = t.request(indices, step, round_)
        batch = t.group().generate(prompts, sampling)
        if t.cfg.derived.reward_baselines_needed:
            greedy = t.group().generate(prompts, SamplingParams(max_tokens=d.max_response_length))
            baselines = t.score(greedy)[0]["token_level_scores"].sum(-1)
            batch["reward_baselines"] = baselines.repeat_interleave(r.n)
        return batch


# what verl's filter_groups.metric names besides a reward term (the scorer's acc, the sequence sums)
SEQUENCE_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")


def sample_metric(batch: Batch, name: str) -> torch.Tensor:
    """The per-sample value dynamic sampling keeps groups by (verl's filter_groups.metric), from a scored batch:
    acc; score and seq_reward, the summed token_level_scores; seq_final_reward, the summed token_level_rewards
    where the batch has them (after the KL penalty), else the scores (which hold the reward terms, overlong
    included, as verl's rewards without a KL penalty do); any other name, a reward term the reward function
    returned for every sample. A name no sample carries is an error naming those that exist."""
    if name == "acc":
        return batch["acc"]
    if name in ("score", "seq_reward"):
        return batch["token_level_scores"].sum(-1)
    if name == "seq_final_reward":
        final = "token_level_rewards" if "token_level_rewards" in batch.keys() else "token_level_scores"
        return batch[final].sum(-1)
    rows = list(batch[REWARD_EXTRA_KEY])
    values = [row.get(name) for row in rows]
    if not all(_is_number(v) for v in values):
        terms = sorted({t for row in rows for t, v in row.items() if _is_number(v)})
        terms = [
            t for t in terms if t not in SEQUENCE_METRICS and all(_is_number(row.get(t)) for row in rows)
        ]
        missing = sum(v is None for v in values)
        why = f"{missing} of {len(rows)} samples lack it" if missing else "a value of it is not a number"
        raise ValueError(
            f"algorithm.dynamic_sampling.metric={name!r} (verl's filter_groups.metric): {why}. The samples carry "
            f"{', '.join(SEQUENCE_METRICS + tuple(terms))}; name one of them, or return {name!r} from the reward "
            "function for every sample"
        )
    return torch.tensor([float(v) for v in values], dtype=torch.float64)


def _is_number(value: Any) -> bool:
    """A reward term's value a group's spread is taken of (a bool counts as 0 / 1, as numpy's std takes it)."""
    return isinstance(value, (numbers.Real, np.bool_))


def varied_groups(values: torch.Tensor, uid: Any) -> torch.Tensor:
    """Row indices of the samples whose group (same uid) holds at least two different values."""
    _, std, _ = group_stats(values.double(), uid)
    return torch.nonzero(std > 0).squeeze(-1)


def _merge_reward_metrics(parts: list[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """Reward metrics of several scoring calls: counts summed, the rest averaged by sample count."""
    total = sum(n for n, _ in parts)
    merged: dict[str, float] = {}
    for key in {k for _, m in parts for k in m}:
        present = [(n, m[key]) for n, m in parts if key in m]
        if key.endswith(COUNT_SUFFIX):
            merged[key] = float(sum(v for _, v in present))
        else:
            weight = sum(n for n, _ in present) or total or 1
            merged[key] = float(sum(n * v for n, v in present) / weight)
    return merged
