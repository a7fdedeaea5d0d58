"""The RL trainer: PPO, GRPO, DAPO, RLOO, REINFORCE++, ReMax, ... picked by the config.

One step, each phase one call on a worker group (tandem/roles/layout.py):
  samples from the rollout source trainer.async_mode picks (`rollout_source` below): n responses per
  prompt generated in the step -> rewards (rule scorers + reward model) [DAPO dynamic sampling: drop
  groups whose samples all score alike, generate more until full] (tandem/trainer/sync_source.py); or
  generated during the previous step (one_step_off.py); or streamed as they finish (streaming.py)
  -> old log-probs (+ entropy) -> reference log-probs, with the critic's values computed meanwhile
  -> KL penalty in the reward (fixed or adaptive) -> advantages (any registered estimator)
  [PF-PPO: the updates' rows drawn again, with replacement, by their scores]
  -> critic update -> actor update (after trainer.critic_warmup steps)
Validation every trainer.test_freq steps and checkpoints every trainer.save_freq come from
tandem/trainer/base.py.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from tandem.algos import apply_kl_penalty, kl_controller_from_config, resample_indices
from tandem.batch import Batch
from tandem.config.checks.data_sources import check_data_sources
from tandem.config.errors import ConfigError
from tandem.config.schema import PFPPOConfig, TandemConfig
from tandem.config.validate import validate_config
from tandem.data import PromptDataset, UserSampler, sampler_batch, sampler_config
from tandem.data.user_dataset import dataset_config, rows_from_class
from tandem.engine.flops import ModelFlops
from tandem.rewards import reward_manager_from_config
from tandem.roles.actor import ROUTING_KEYS as ACTOR_ROUTING_KEYS
from tandem.roles.actor import update_keys as actor_update_keys
from tandem.roles.common import BALANCE_META, input_keys, model_inputs
from tandem.roles.correction import correction_from_config
from tandem.roles.layout import WorkerGroups, build_worker_groups
from tandem.rollout.agent import tool_schemas
from tandem.trainer.advantage_step import compute_step_advantages
from tandem.trainer.base import Trainer
from tandem.trainer.dumps import SampleDumps
from tandem.trainer.metrics import Timer, batch_metrics, throughput_metrics
from tandem.trainer.one_step_off import OneStepOffSource
from tandem.trainer.rollout_source import RolloutSource
from tandem.trainer.rollouts import Rollouts
from tandem.trainer.start_checks.model_folders import check_model_folders
from tandem.trainer.start_checks.multi_turn import check_multi_turn
from tandem.trainer.start_checks.rows import check_ground_truths, check_item_data_sources
from tandem.trainer.start_checks.tokenizers import (
    check_tokenizers,
    load_actor_tokenizer,
    load_image_processor,
)
from tandem.trainer.streaming import StreamingSource
from tandem.trainer.sync_source import SyncSource

logger = logging.getLogger(__name__)


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
        self.train_data = self._prompts(d.train_files, cfg, "data.train_files") if train else None
        self.val_data = self._prompts(d.val_files, cfg, "data.val_files") if d.val_files else None
        check_tokenizers(cfg, self.tokenizer, [self.train_data, self.val_data], "rl" if train else "eval")
        check_multi_turn(cfg, [self.train_data, self.val_data], self.tokenizer)
        self.rewards = reward_manager_from_config(cfg, self.tokenizer)
        if d.custom_dataset_file:  # the rows of a user's class: their data_source checked only now
            check_item_data_sources(self.rewards, [self.train_data, self.val_data])
        check_ground_truths(self.rewards, [self.train_data, self.val_data])
        num_items = len(self.train_data) if train else 1
        sampler = self._user_sampler(cfg) if train and d.sampler_file else None  # before any worker starts
        super().__init__(cfg, num_items, cfg.derived.gen_prompts_per_round if train else 1, sampler)
        alg = cfg.algorithm
        self.kl_ctrl = kl_controller_from_config(alg.kl_ctrl) if alg.use_kl_in_reward else None
        # where the old log-probs come from, how the rollout's are corrected for (roles/correction.py)
        self.correction = correction_from_config(cfg)
        self._model_flops: dict[str, ModelFlops] = {}
        pad_id = self.tokenizer.pad_token_id
        self.rollouts = Rollouts(
            cfg, self.rewards, pad_id, self.train_data, self.val_data, self.sampler, self.next_indices
        )
        self.source = rollout_source(self.rollouts, self.total_steps)
        self.dumps = self.rollouts.dumps = SampleDumps(cfg, self.tokenizer)  # what the model wrote

    def _prompts(self, files: list[str], cfg: TandemConfig, key: str) -> PromptDataset:
        d = cfg.data
        rows = None
        if d.custom_dataset_file:  # the rows of a Dataset class of the user's, built on the files
            rows = rows_from_class(
                d.custom_dataset_file,
                d.custom_dataset_class,
                files,
                tokenizer=self.tokenizer,
                processor=self.processor,
                config=dataset_config(d),
                files_key=key,
                prompt_key=d.prompt_key,
                image_key=d.image_key,
            )
        return PromptDataset(
            files,
            self.tokenizer,
            max_prompt_length=d.max_prompt_length,
            prompt_key=d.prompt_key,
            truncation=d.truncation,
            chat_template=d.chat_template,
            chat_template_kwargs=d.chat_template_kwargs,
            tools=tool_schemas(cfg.rollout.multi_turn),
            processor=self.processor,
            image_key=d.image_key,
            user_rows=rows,
        )

    def _user_sampler(self, cfg: TandemConfig) -> UserSampler:
        """The user's sampler class (data.sampler_class) over the training prompts. A curriculum (update())
        needs each step's prompts drawn after the previous step's update: refused where they are drawn early."""
        d, mode, batch = cfg.data, cfg.trainer.async_mode, cfg.derived.gen_prompts_per_round
        sampler = UserSampler(d.sampler_file, d.sampler_class, self.train_data, sampler_config(d), batch)
        if sampler.is_curriculum and not ROLLOUT_SOURCES[mode].draws_after_update:
            raise ConfigError(
                f"data.sampler_class={d.sampler_class} has update(batch), a curriculum, but trainer.async_mode={mode} "
                "draws a step's prompts before the previous step trains, so update() could not change them: use "
                "trainer.async_mode=synchronous, or a sampler without update()"
            )
        return sampler

    # ---- one step ------------------------------------------------------------------------------------

    def train_step(self) -> dict[str, float]:
        cfg, groups, d = self.cfg, self.groups, self.cfg.derived
        alg = cfg.algorithm
        timer = Timer()
        metrics: dict[str, float] = {}
        with timer("step"):
            batch, rollout_metrics = self.source.next(self.step, timer)
            batch.meta[BALANCE_META] = cfg.trainer.balance_batch  # how the workers split its rows
            metrics.update(rollout_metrics)
            mask = batch["response_mask"]

            inputs = model_inputs(batch, "responses", "response_mask")
            values = groups.critic.compute_values.async_(inputs) if groups.critic else None
            if self.correction.old_log_prob_pass:  # else the rollout's or the update's (roles/correction.py)
                with timer("old_log_probs"):
                    batch = batch.union(groups.actor.compute_log_probs(inputs))
            if groups.ref is not None:
                with timer("ref_log_probs"):
                    batch = batch.union(groups.ref.compute_ref_log_probs(inputs))
            if values is not None:
                with timer("values"):
                    batch = batch.union(values.result())
            # the whole batch's rollout IS weights, for estimators that read them (OTB), and its diagnostics
            batch, is_weights, diagnostics = self.correction.before_advantages(batch)
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
                # what the estimator's spec names, from the batch and algorithm.* (trainer/advantage_step.py)
                batch["advantages"], batch["returns"] = compute_step_advantages(
                    batch, rewards, alg, is_weights
                )

            # the rows the updates train on: the batch, or with PF-PPO rows drawn again by their scores
            train = batch
            if alg.pf_ppo.enable:
                train, pf_metrics = pf_ppo_rows(batch, alg.pf_ppo, cfg.trainer.seed, self.step)
                metrics.update(pf_metrics)
            update_mask = train["attention_mask"]  # the tokens each update trains on (model FLOPs, MFU)
            if groups.critic is not None:
                with timer("update_critic"):
                    update = model_inputs(train, "responses", "response_mask", "values", "returns")
                    mini_batches = d.critic_mini_batches_per_step
                    metrics.update(groups.critic.update_critic(update, mini_batches=mini_batches)[0])
                epochs = cfg.critic.ppo_epochs or cfg.actor.ppo_epochs
                metrics["perf/update_flops/critic"] = 3 * epochs * self._flops("critic").forward(update_mask)
            if self.step > cfg.trainer.critic_warmup:
                with timer("update_actor"):
                    update = train.select(*self._actor_update_keys(train))
                    mini_batches = d.actor_mini_batches_per_step
                    metrics.update(groups.actor.update_actor(update, mini_batches=mini_batches)[0])
                    self.rollouts.actor_updates += 1
                flops = 3 * cfg.actor.ppo_epochs * self._flops("actor").forward(update_mask)
                metrics["perf/update_flops/actor"] = flops

        metrics.update(batch_metrics(batch, cfg.data.max_response_length))
        metrics.update(throughput_metrics(batch, timer.seconds))
        metrics["reward/error_count_total"] = float(self.rollouts.reward_errors_total)
        metrics.update(self.dumps.train(self.step, batch))
        if isinstance(self.sampler, UserSampler) and self.sampler.is_curriculum:  # before the next step draws
            self.sampler.update(sampler_batch(self.step, batch))
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
        routing = [key for key in ACTOR_ROUTING_KEYS if key in batch]  # actor.router_replay's record
        return [*input_keys(batch), *actor_update_keys(self.cfg), *self.correction.update_keys, *routing]

    # ---- generation, validation ---------------------------------------------------------------------

    def sampler_state(self) -> dict[str, Any]:
        return self.source.sampler_state()  # one_step_off: from before the prefetch's draw

    def workers_started(self, groups: WorkerGroups) -> None:
        self.rollouts.attach(groups)

    def has_validation(self) -> bool:
        return self.val_data is not None

    def validate(self) -> dict[str, float]:
        """rollout.val sampling on the validation prompts: accuracy and score, overall and per data source."""
        return self.rollouts.validate(self.step)

    def take_generations(self) -> list[dict[str, Any]]:
        return self.dumps.take_generations()

    def resume(self, path: Path | None) -> None:
        super().resume(path)
        self.dumps.resume(self.step if path is not None else -1)  # a fresh run starts fresh dumps

    # ---- checkpoint state --------------------------------------------------------------------------------

    def extra_state(self) -> dict[str, Any]:
        return {
            "kl_ctrl": self.kl_ctrl.state_dict() if self.kl_ctrl is not None else None,
            "reward_errors_total": self.rollouts.reward_errors_total,
            "stream": self.source.state_dict(),  # the rollout source's: only streaming keeps any
        }

    def load_extra_state(self, state: dict[str, Any]) -> None:
        if self.kl_ctrl is not None and state.get("kl_ctrl") is not None:
            self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        self.rollouts.reward_errors_total = int(state.get("reward_errors_total", 0))
        if state.get("stream") is not None:
            self.source.load_state_dict(state["stream"])

    def fit(self, until_step: int | None = None) -> list[dict[str, float]]:
        """Train to trainer.total_training_steps (or stop after `until_step`); returns the logged metrics,
        one dict per logged step. The reward processes are closed at the end, however it ends."""
        try:
            return super().fit(until_step)
        finally:
            self.dumps.close()
            self.rewards.close()

    def evaluate(self, checkpoint: str | None = None) -> dict[str, float]:
        """Validation alone: the actor of actor.model_path (or of `checkpoint`) on data.val_files."""
        try:
            path = self.checkpoints.resolve(checkpoint) if checkpoint is not None else None  # before workers
            self.groups = build_worker_groups(self.cfg, purpose="eval", log_dir=self.log_dir)
            self.workers_started(self.groups)
            self.announce_devices("eval")
            if path is not None:
                self.groups.actor.load_checkpoint(str(path))
            return self.validate()
        finally:
            if self.groups is not None:
                self.groups.shutdown()
                self.groups = None
            self.dumps.close()
            self.rewards.close()


def pf_ppo_rows(batch: Batch, pf: PFPPOConfig, seed: int, step: int) -> tuple[Batch, dict[str, float]]:
    """PF-PPO's update rows: len(batch) rows drawn with replacement by their summed token-level scores
    (tandem.algos.pf_ppo), from a generator seeded by `seed` and `step` (a resumed run draws the same rows), and
    `pf_ppo/*` metrics: the share of distinct rows drawn and the drawn rows' mean score.

    verl draws from torch's global generator, and its critic/score/*, response-length and advantage metrics are of
    the drawn rows; Tandem's stay of the rows generated (what the policy wrote), the drawn rows' in pf_ppo/*."""
    scores = batch["token_level_scores"].sum(-1)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    rows = resample_indices(scores, pf.reweight_method, pf.weight_pow, generator)
    metrics = {
        "pf_ppo/unique_rows_fraction": len(torch.unique(rows)) / max(len(rows), 1),
        "pf_ppo/score_mean": float(scores.double()[rows].mean()),
    }
    return batch.reorder(rows), metrics


ROLLOUT_SOURCES: dict[str, type[RolloutSource]] = {
    "synchronous": SyncSource,
    "one_step_off": OneStepOffSource,
    "streaming": StreamingSource,
}


def rollout_source(rollouts: Rollouts, total_steps: int) -> RolloutSource:
    """Where the steps' samples come from, by trainer.async_mode: generated in the step (synchronous),
    during the previous step (one_step_off), or taken as they finish from a stream (streaming)."""
    return ROLLOUT_SOURCES[rollouts.cfg.trainer.async_mode](rollouts, total_steps)
