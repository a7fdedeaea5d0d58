"""The RL trainer: PPO, GRPO, DAPO, RLOO, REINFORCE++, ReMax, ... picked by the config.

One step, each phase one call on a worker group (tandem/roles/layout.py):
  samples from the rollout source trainer.async_mode picks (`rollout_source` below): n responses per
  prompt generated in the step -> rewards (rule scorers + reward model) [DAPO dynamic sampling: drop
  groups whose samples all score alike, generate more until full] (tandem/trainer/sync_source.py); or
  generated during the previous step (one_step_off.py); or streamed as they finish (streaming.py)
  -> old log-probs (+ entropy) -> reference log-probs, with the critic's values computed meanwhile
  -> KL penalty in the reward (fixed or adaptive) -> advantages (any registered estimator)
  -> critic update -> actor update (after trainer.critic_warmup steps)
Validation every trainer.test_freq steps and checkpoints every trainer.save_freq come from
tandem/trainer/base.py.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tandem.algos import apply_kl_penalty, compute_advantages, kl_controller_from_config
from tandem.algos.rollout_correction import rollout_diagnostics
from tandem.batch import Batch
from tandem.config.checks.data_sources import check_data_sources
from tandem.config.errors import ConfigError
from tandem.config.schema import TandemConfig
from tandem.config.validate import validate_config
from tandem.controller import WorkerGroup
from tandem.data import PromptDataset, collate_prompts
from tandem.engine.flops import ModelFlops
from tandem.rewards import reward_components, reward_manager_from_config
from tandem.roles.common import arrange_for_update, balanced_order, input_keys, model_inputs
from tandem.roles.layout import build_worker_groups
from tandem.roles.reward_model import last_token_index
from tandem.rollout import PROMPT_INDEX, SamplingParams
from tandem.rollout.agent import AGENT_COUNT_KEYS, AGENT_FINISH_KEY, tool_schemas
from tandem.trainer.base import Trainer
from tandem.trainer.metrics import Timer, agent_metrics, batch_metrics, throughput_metrics
from tandem.trainer.one_step_off import OneStepOffSource
from tandem.trainer.rollout_source import RolloutSource
from tandem.trainer.start_checks import (
    check_ground_truths,
    check_model_folders,
    check_multi_turn,
    check_tokenizers,
    load_actor_tokenizer,
    load_image_processor,
)
from tandem.trainer.streaming import StreamingSource
from tandem.trainer.sync_source import SyncSource

logger = logging.getLogger(__name__)

PROMPT_SIDE = {"prompts": "pad", "input_ids": "pad", "attention_mask": 0, "position_ids": 0}


class RLTrainer(Trainer):
    """Reads the data, checks it and the reward functions, then `fit()` starts the workers and trains."""

    def __init__(self, cfg: TandemConfig, *, train: bool = True) -> None:
        """train=False: validation only (`evaluate`), no training data needed."""
        validate_config(cfg, require_data=train)
        d = cfg.data
        if not train and not (d.val_files and cfg.actor.model_path):
            raise ConfigError("evaluation needs data.val_files and actor.model_path; set both")
        check_data_sources(cfg)  # every row's data_source has a scorer: read before the data is tokenized
        check_model_folders(cfg, "rl" if train else "eval")
        self.tokenizer = load_actor_tokenizer(cfg)
        self.processor = load_image_processor(cfg)  # a vision-language model's (None for a text model)
        self.pad_id = self.tokenizer.pad_token_id
        self.train_data = self._prompts(d.train_files, cfg) if train else None
        self.val_data = self._prompts(d.val_files, cfg) if d.val_files else None
        check_tokenizers(cfg, self.tokenizer, [self.train_data, self.val_data], "rl" if train else "eval")
        check_multi_turn(cfg, [self.train_data, self.val_data], self.tokenizer)
        self.rewards = reward_manager_from_config(cfg, self.tokenizer)
        check_ground_truths(self.rewards, [self.train_data, self.val_data])
        num_items = len(self.train_data) if train else 1
        super().__init__(cfg, num_items, cfg.derived.gen_prompts_per_round if train else 1)
        alg = cfg.algorithm
        self.kl_ctrl = kl_controller_from_config(alg.kl_ctrl) if alg.use_kl_in_reward else None
        self.reward_errors_total = 0
        self.actor_updates = 0  # rollout.layout=separate: the engines hold the weights of update number ...
        self._synced: tuple[int, int] | None = None  # ... (id of the worker groups, that number)
        self._model_flops: dict[str, ModelFlops] = {}
        self.source = rollout_source(self)

    def _prompts(self, files: list[str], cfg: TandemConfig) -> PromptDataset:
        d = cfg.data
        return PromptDataset(
            files,
            self.tokenizer,
            max_prompt_length=d.max_prompt_length,
            prompt_key=d.prompt_key,
            truncation=d.truncation,
            chat_template=d.chat_template,
            tools=tool_schemas(cfg.rollout.multi_turn),
            processor=self.processor,
            image_key=d.image_key,
        )

    # ---- one step ------------------------------------------------------------------------------------

    def train_step(self) -> dict[str, float]:
        cfg, groups, d = self.cfg, self.groups, self.cfg.derived
        alg = cfg.algorithm
        timer = Timer()
        metrics: dict[str, float] = {}
        with timer("step"):
            batch, rollout_metrics = self.rollout(timer)
            metrics.update(rollout_metrics)
            mask = batch["response_mask"]

            # Rows in an order that gives every data-parallel rank about the same number of tokens.
            order, restore = balanced_order(batch, groups.actor.dp_size)
            inputs = model_inputs(batch, "responses", "response_mask").reorder(order)
            values = groups.critic.compute_values.async_(inputs) if groups.critic else None
            if alg.rollout_correction.bypass_mode:  # the rollout's log-probs are the old ones (verl's name)
                batch["old_log_probs"] = batch["rollout_log_probs"]
            elif not d.old_log_probs_from_update:  # else the actor's update computes them (roles/actor.py)
                with timer("old_log_probs"):
                    batch = batch.union(groups.actor.compute_log_probs(inputs).reorder(restore))
            if groups.ref is not None:
                with timer("ref_log_probs"):
                    batch = batch.union(groups.ref.compute_ref_log_probs(inputs).reorder(restore))
            if values is not None:
                with timer("values"):
                    batch = batch.union(values.result().reorder(restore))
            is_weights = None  # the whole batch's rollout IS weights, for estimators that read them (OTB)
            if "old_log_probs" in batch and not alg.rollout_correction.bypass_mode:  # else: the update's
                is_weights, diagnostics = rollout_diagnostics(
                    batch["old_log_probs"], batch["rollout_log_probs"], mask, alg.rollout_correction
                )
                metrics.update(diagnostics)

            with timer("advantages"):
                scores = batch["token_level_scores"]
                if self.kl_ctrl is not None:
                    rewards, kl = apply_kl_penalty(
                        scores,
                        batch["old_log_probs"],
                        batch["ref_log_probs"],
                        mask,
                        self.kl_ctrl,
                        alg.kl_penalty,
                    )
                    metrics["actor/reward_kl_penalty"] = kl["kl"]
                    metrics["actor/reward_kl_penalty_coeff"] = kl["kl_coef"]
                else:
                    rewards = scores
                batch["token_level_rewards"] = rewards
                batch["advantages"], batch["returns"] = compute_advantages(
                    alg.adv_estimator,
                    rewards,
                    mask,
                    index=batch["uid"],
                    values=batch.get("values"),
                    reward_baselines=batch.get("reward_baselines"),
                    old_log_probs=batch.get("old_log_probs"),
                    sum_pi_squared=batch.get("sum_pi_squared"),
                    rollout_is_weights=is_weights,
                    gamma=alg.gamma,
                    lam=alg.lam,
                    norm_adv_by_std=alg.norm_adv_by_std,
                    reward_components=batch.get("reward_components"),  # gdpo's terms
                    reward_weights=alg.gdpo_reward_weights,
                )

            update_mask = batch["attention_mask"]  # the tokens each update trains on (model FLOPs, MFU)
            if groups.critic is not None:
                with timer("update_critic"):
                    update = model_inputs(batch, "responses", "response_mask", "values", "returns")
                    update = arrange_for_update(update, groups.critic.dp_size, d.critic_mini_batches_per_step)
                    metrics.update(groups.critic.update_critic(update)[0])
                epochs = cfg.critic.ppo_epochs or cfg.actor.ppo_epochs
                metrics["perf/update_flops/critic"] = 3 * epochs * self._flops("critic").forward(update_mask)
            if self.step > cfg.trainer.critic_warmup:
                with timer("update_actor"):
                    update = arrange_for_update(
                        batch.select(*self._actor_update_keys(batch)),
                        groups.actor.dp_size,
                        d.actor_mini_batches_per_step,
                    )
                    metrics.update(groups.actor.update_actor(update)[0])
                    self.actor_updates += 1
                flops = 3 * cfg.actor.ppo_epochs * self._flops("actor").forward(update_mask)
                metrics["perf/update_flops/actor"] = flops

        metrics.update(batch_metrics(batch, cfg.data.max_response_length))
        metrics.update(throughput_metrics(batch, timer.seconds))
        metrics["reward/error_count_total"] = float(self.reward_errors_total)
        return metrics

    def _flops(self, role: str) -> ModelFlops:
        """The FLOP counts of the actor's or the critic's model (engine/flops.py), read once."""
        if role not in self._model_flops:
            path = self.cfg.actor.model_path if role == "actor" else self.cfg.critic.model_path
            self._model_flops[role] = ModelFlops.from_folder(path, "lm" if role == "actor" else "value")
        return self._model_flops[role]

    def update_devices(self) -> dict[str, int]:
        groups = self.groups
        devices = {"actor": groups.actor.world_size}
        if groups.critic is not None:
            devices["critic"] = groups.critic.world_size
        return devices

    def _actor_update_keys(self, batch: Batch) -> list[str]:
        keys = [*input_keys(batch), "responses", "response_mask", "advantages"]
        if self.cfg.derived.old_log_probs_from_update:
            keys.append("rollout_log_probs")  # for rollout_mismatch/*, computed in the update
        else:
            keys.append("old_log_probs")
        if self.cfg.actor.use_kl_loss:
            keys.append("ref_log_probs")
        rc = self.cfg.algorithm.rollout_correction
        if (rc.rollout_is or rc.rollout_rs or rc.bypass_mode) and "rollout_log_probs" not in keys:
            keys.append("rollout_log_probs")
        return keys

    # ---- generation and rewards --------------------------------------------------------------------------

    def rollout(self, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """The step's samples with `token_level_scores`, and the rollout metrics, from the source
        trainer.async_mode picked (`rollout_source`)."""
        return self.source.next(self.step, timer)

    def sampler_state(self) -> dict[str, Any]:
        return self.source.sampler_state()  # one_step_off: from before the prefetch's draw

    def train_prompts(self, indices: list[int]) -> Batch:
        """The training-data rows `indices`, collated as prompts."""
        return self._collate([self.train_data[i] for i in indices])

    def _collate(self, items: list[dict[str, Any]]) -> Batch:
        return collate_prompts(items, self.pad_id)

    def generation_request(self, prompts: Batch, step: int, round_: int) -> tuple[Batch, SamplingParams]:
        """The prompts with their index and `uid`, and the sampling of the step that will train on them."""
        r, d = self.cfg.rollout, self.cfg.data
        prompts = prompts.union(Batch.from_dict({PROMPT_INDEX: torch.arange(len(prompts))}))
        prompts["uid"] = [f"{step}.{round_}.{i}" for i in range(len(prompts))]
        sampling = SamplingParams(
            max_tokens=d.max_response_length,
            n=r.n,
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            seed=_seed(self.cfg.trainer.seed, step, round_),
        )
        return prompts, sampling

    def rollout_group(self) -> WorkerGroup:
        """The group that generates. In the separate layout its engines first get the actor's weights when
        they changed since the last sync (and once for new workers: a resumed or loaded checkpoint)."""
        groups = self.groups
        if groups.separate_rollout and self._synced != (id(groups), self.actor_updates):
            groups.sync_rollout(self.actor_updates)
            self._synced = (id(groups), self.actor_updates)
        return groups.rollout

    def score(self, batch: Batch, *, train: bool = False) -> tuple[Batch, dict[str, float]]:
        """`token_level_scores` (rule scorers + reward model, at the last response token) and per-sample
        `acc` (the scorer's acc field where it gives one, else its score). With train=True and gdpo, also
        `reward_components` [B, K], the terms algorithm.gdpo_reward_keys names (validation needs none)."""
        result = self.rewards(batch)
        scores = result.token_level_scores
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
        width = max(b["prompts"].shape[1] for b in batches)
        return Batch.concat([_left_pad(b, width, self.pad_id) for b in batches])

    # ---- validation ------------------------------------------------------------------------------------

    def has_validation(self) -> bool:
        return self.val_data is not None

    def validate(self) -> dict[str, float]:
        """rollout.val sampling on the validation prompts: accuracy and score, overall and per data source."""
        data, r, d = self.val_data, self.cfg.rollout.val, self.cfg.data
        size = d.val_batch_size or len(data)
        sampling = SamplingParams(
            max_tokens=d.max_response_length,
            n=r.n,
            temperature=r.temperature,
            top_p=r.top_p,
            seed=_seed(self.cfg.trainer.seed, 0, 0) if r.temperature > 0 else None,
        )
        scored = []
        for start in range(0, len(data), size):
            items = [data[i] for i in range(start, min(start + size, len(data)))]
            prompts = self._collate(items)
            prompts = prompts.union(Batch.from_dict({PROMPT_INDEX: torch.arange(start, start + len(items))}))
            batch, _ = self.score(self.rollout_group().generate(prompts, sampling))
            agent_keys = [k for k in (*AGENT_COUNT_KEYS, AGENT_FINISH_KEY) if k in batch]
            scored.append(batch.select("acc", "score", "response_mask", "data_source", *agent_keys))
        batch = Batch.concat(scored, meta="first")
        sources = np.asarray(batch["data_source"], dtype=object)
        metrics = {
            "val/acc": float(batch["acc"].mean()),
            "val/score_mean": float(batch["score"].mean()),
            "val/response_length/mean": float(batch["response_mask"].sum(-1).double().mean()),
            **agent_metrics(batch, "val/agent"),
        }
        for source in sorted(set(sources)):
            rows = torch.as_tensor(sources == source)
            metrics[f"val/{source}/acc"] = float(batch["acc"][rows].mean())
            metrics[f"val/{source}/score_mean"] = float(batch["score"][rows].mean())
        return metrics

    # ---- checkpoint state --------------------------------------------------------------------------------

    def extra_state(self) -> dict[str, Any]:
        return {
            "kl_ctrl": self.kl_ctrl.state_dict() if self.kl_ctrl is not None else None,
            "reward_errors_total": self.reward_errors_total,
            "stream": self.source.state_dict(),  # the rollout source's: only streaming keeps any
        }

    def load_extra_state(self, state: dict[str, Any]) -> None:
        if self.kl_ctrl is not None and state.get("kl_ctrl") is not None:
            self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        self.reward_errors_total = int(state.get("reward_errors_total", 0))
        if state.get("stream") is not None:
            self.source.load_state_dict(state["stream"])

    def fit(self, until_step: int | None = None) -> list[dict[str, float]]:
        """Train to trainer.total_training_steps (or stop after `until_step`); returns the logged metrics,
        one dict per logged step. The reward processes are closed at the end, however it ends."""
        try:
            return super().fit(until_step)
        finally:
            self.rewards.close()

    def evaluate(self, checkpoint: str | None = None) -> dict[str, float]:
        """Validation alone: the actor of actor.model_path (or of `checkpoint`) on data.val_files."""
        try:
            path = self.checkpoints.resolve(checkpoint) if checkpoint is not None else None  # before workers
            self.groups = build_worker_groups(self.cfg, purpose="eval", log_dir=self.log_dir)
            self.announce_devices("eval")
            if path is not None:
                self.groups.actor.load_checkpoint(str(path))
            return self.validate()
        finally:
            if self.groups is not None:
                self.groups.shutdown()
                self.groups = None
            self.rewards.close()


ROLLOUT_SOURCES: dict[str, type[RolloutSource]] = {
    "synchronous": SyncSource,
    "one_step_off": OneStepOffSource,
    "streaming": StreamingSource,
}


def rollout_source(trainer: RLTrainer) -> RolloutSource:
    """Where the steps' samples come from, by trainer.async_mode: generated in the step (synchronous),
    during the previous step (one_step_off), or taken as they finish from a stream (streaming)."""
    return ROLLOUT_SOURCES[trainer.cfg.trainer.async_mode](trainer)


def _seed(seed: int, step: int, round_: int) -> int:
    """The sampling seed of a step's generation round: the same on a resumed run."""
    return (seed * 1_000_003 + step) * 101 + round_


def _left_pad(batch: Batch, width: int, pad_id: int) -> Batch:
    """The prompt side of a rollout batch left-padded to `width` tokens (to concatenate rounds)."""
    extra = width - batch["prompts"].shape[1]
    if extra == 0:
        return batch
    batch = batch.select(*batch.keys())
    for key, value in PROMPT_SIDE.items():
        batch[key] = F.pad(batch[key], (extra, 0), value=pad_id if value == "pad" else value)
    return batch
