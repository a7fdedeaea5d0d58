"""Generation and scoring of an RL run, in one object the rollout sources and validation use:

    draw / request    the training data's next rows, collated as prompts with their uid and sampling
    group             the worker group that generates, given the actor's weights when they changed
    score             rule scorers + reward model: token_level_scores, acc, score (gdpo's terms)
    concat            rollout batches as one, their prompts left-padded to the widest
    validate          rollout.val sampling on the validation prompts: accuracy and score

The trainer tells it when workers start (`attach`) and when the actor's weights change (`actor_updates`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from tandem.batch import Batch
from tandem.config.schema import TandemConfig
from tandem.controller import WorkerGroup
from tandem.data import DATASET_INDEX, PromptDataset, StatefulSampler, UserSampler, collate_prompts
from tandem.data.padding import concat_left_padded
from tandem.rewards import RewardManager, reward_components
from tandem.roles.layout import WorkerGroups
from tandem.roles.reward_model import last_token_index
from tandem.rollout import PROMPT_INDEX, SamplingParams
from tandem.rollout.agent import AGENT_COUNT_KEYS, AGENT_FINISH_KEY
from tandem.trainer.dumps import REWARD_EXTRA_KEY, SampleDumps
from tandem.trainer.metrics import agent_metrics


class Rollouts:
    """Prompts in, scored samples out, for the rollout sources (tandem/trainer/rollout_source.py) and
    validation. `draw` is the trainer's data order (the next batch of training rows)."""

    def __init__(
        self,
        cfg: TandemConfig,
        rewards: RewardManager,
        pad_id: int,
        train_data: PromptDataset | None,
        val_data: PromptDataset | None,
        sampler: StatefulSampler | UserSampler,
        draw: Callable[[], list[int]],
    ) -> None:
        self.cfg = cfg
        self.rewards = rewards
        self.pad_id = pad_id
        self.train_data = train_data
        self.val_data = val_data
        self.sampler = sampler
        self.draw = draw
        self.groups: WorkerGroups | None = None
        self.workers = 0  # how many times workers were started: work in flight on older ones is gone
        self.actor_updates = 0  # the version of the actor's weights a generation starts from
        self.reward_errors_total = 0
        self._synced: int | None = None  # rollout.layout=separate: the update number the engines hold
        self.dumps: SampleDumps | None = None  # validation's sample dumps and tracker generations

    def attach(self, groups: WorkerGroups) -> None:
        """New workers: generate and score on `groups`; a separate rollout pool gets the weights first."""
        self.groups = groups
        self.workers += 1
        self._synced = None

    def sampler_state(self) -> dict[str, Any]:
        """The training data's position now, as a checkpoint records it."""
        return self.sampler.state_dict()

    # ---- prompts and generation --------------------------------------------------------------------

    def request(self, indices: list[int], step: int, round_: int) -> tuple[Batch, SamplingParams]:
        """The training-data rows `indices` as prompts with their index in the step, their row (DATASET_INDEX)
        and `uid`, and the sampling of the step that will train on them."""
        r, d = self.cfg.rollout, self.cfg.data
        prompts = collate_prompts([self.train_data[i] for i in indices], self.pad_id)
        rows = {
            PROMPT_INDEX: torch.arange(len(prompts)),
            DATASET_INDEX: torch.tensor(indices, dtype=torch.long),
        }
        prompts = prompts.union(Batch.from_dict(rows))
        prompts["uid"] = [f"{step}.{round_}.{i}" for i in range(len(prompts))]
        sampling = SamplingParams(
            max_tokens=d.max_response_length,
            n=r.n,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            seed=sampling_seed(self.cfg.trainer.seed, step, round_),
        )
        return prompts, sampling

    def group(self) -> WorkerGroup:
        """The group that generates. In the separate layout its engines first get the actor's weights when
        they changed since the last sync (and once for new workers: a resumed or loaded checkpoint)."""
        groups = self.groups
        assert groups is not None, "Rollouts.attach(groups) comes first"
        if groups.separate_rollout and self._synced != self.actor_updates:
            groups.sync_rollout(self.actor_updates)
            self._synced = self.actor_updates
        return groups.rollout

    # ---- scoring -------------------------------------------------------------------------------------

    def score(self, batch: Batch, *, train: bool = False) -> tuple[Batch, dict[str, float]]:
        """`token_level_scores` (rule scorers + reward model, at the last response token) and per-sample
        `acc` (the scorer's acc field where it gives one, else its score). With train=True and gdpo, also
        `reward_components` [B, K], the terms algorithm.gdpo_reward_keys names (validation needs none)."""
        result = self.rewards(batch)
        scores = result.token_level_scores
        assert self.groups is not None
        if self.groups.reward_model is not None:
            rm = self.groups.reward_model.compute_rm_scores(batch)["rm_scores"].float()
            mask = batch["response_mask"]
            has_tokens = mask.bool().any(-1)
            last = last_token_index(mask)
            scores = scores.clone()
            rows = torch.arange(len(batch))
            scores[rows, last] += torch.where(has_tokens, rm, torch.zeros_like(rm))
            result.metrics["reward/rm_score_mean"] = float(rm.mean())
        batch["token_level_scores"] = scores
        scorer = torch.as_tensor(result.extra["scorer_score"], dtype=torch.float32)
        if "acc" in result.extra and np.issubdtype(np.asarray(result.extra["acc"]).dtype, np.number):
            acc = torch.as_tensor(np.asarray(result.extra["acc"], dtype=np.float64), dtype=torch.float32)
            batch["acc"] = torch.where(torch.isnan(acc), scorer, acc)
        else:
            batch["acc"] = scorer
        batch["score"] = scores.sum(-1)
        batch[REWARD_EXTRA_KEY] = _reward_extra(result.extra, len(batch))  # the dumps' reward terms
        keys = self.cfg.algorithm.gdpo_reward_keys  # set only with adv_estimator=gdpo
        if train and keys:
            terms = reward_components(result, keys, batch["data_source"])
            batch["reward_components"] = torch.as_tensor(terms, dtype=torch.float32, device=scores.device)
            result.metrics.update(
                {f"reward/gdpo/{key}_mean": float(terms[:, k].mean()) for k, key in enumerate(keys)}
            )
        errors = int(result.metrics["reward/error_count"] + result.metrics["reward/timeout_count"])
        self.reward_errors_total += errors
        return batch, result.metrics

    def concat(self, batches: list[Batch]) -> Batch:
        """Rollout batches as one, their prompts left-padded to the widest (dynamic sampling's rounds, the
        stream's groups)."""
        return concat_left_padded(batches, self.pad_id)

    # ---- validation ------------------------------------------------------------------------------------

    def validate(self, step: int = 0) -> dict[str, float]:
        """rollout.val sampling on the validation prompts: accuracy and score, overall and per data source.
        With dumps, the pass's samples go to trainer.validation_data_dir as the dump of `step`."""
        data, r, d = self.val_data, self.cfg.rollout.val, self.cfg.data
        assert data is not None
        size = d.val_batch_size or len(data)
        sampling = SamplingParams(
            max_tokens=d.max_response_length,
            n=r.n,
            temperature=r.temperature,
            top_p=r.top_p,
            seed=sampling_seed(self.cfg.trainer.seed, 0, 0) if r.temperature > 0 else None,
        )
        scored, whole = [], []
        for start in range(0, len(data), size):
            items = [data[i] for i in range(start, min(start + size, len(data)))]
            prompts = collate_prompts(items, self.pad_id)
            prompts = prompts.union(Batch.from_dict({PROMPT_INDEX: torch.arange(start, start + len(items))}))
            batch, _ = self.score(self.group().generate(prompts, sampling))
            if self.dumps is not None and self.dumps.wants_validation:
                whole.append(batch)
            agent_keys = [k for k in (*AGENT_COUNT_KEYS, AGENT_FINISH_KEY) if k in batch]
            scored.append(batch.select("acc", "score", "response_mask", "data_source", *agent_keys))
        batch = Batch.concat(scored, meta="first")
        dump_timing = self.dumps.validation(step, whole) if self.dumps is not None and whole else {}
        sources = np.asarray(batch["data_source"], dtype=object)
        metrics = {
            "val/acc": float(batch["acc"].mean()),
            "val/score_mean": float(batch["score"].mean()),
            "val/response_length/mean": float(batch["response_mask"].sum(-1).double().mean()),
            **agent_metrics(batch, "val/agent"),
            **dump_timing,
        }
        for source in sorted(set(sources)):
            rows = torch.as_tensor(sources == source)
            metrics[f"val/{source}/acc"] = float(batch["acc"][rows].mean())
            metrics[f"val/{source}/score_mean"] = float(batch["score"][rows].mean())
        return metrics


def _reward_extra(extra: dict[str, np.ndarray], n: int) -> list[dict[str, Any]]:
    """Per sample: the reward terms and scorer fields of the reward result, and its scorer's error if any."""
    names = [name for name in extra if name not in ("scorer_score", "error")]
    errors = extra.get("error")
    rows = []
    for i in range(n):
        row = {name: extra[name][i] for name in names}
        if errors is not None and errors[i]:
            row["reward_error"] = errors[i]
        rows.append(row)
    return rows


def sampling_seed(seed: int, step: int, round_: int) -> int:
    """The sampling seed of a step's generation round: the same on a resumed run."""
    return (seed * 1_000_003 + step) * 101 + round_
