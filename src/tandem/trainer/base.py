"""What the RL and SFT trainers share: the run folder, the data order, the loop with its
validation and checkpoint schedule, resume, and the trackers.

    <trainer.output_dir>/<project_name>/<experiment_name>/   (or trainer.run_dir, verl's default_local_dir)
        config.yaml       the resolved config of the run
        metrics.jsonl     with trainer.loggers=[...,jsonl]: one line per step (step 0: validation before training)
        tensorboard/      with tensorboard in trainer.loggers (wandb/, mlruns/ likewise)
        checkpoints/      see tandem/trainer/checkpoint.py
        .lock             held while a run uses the folder (tandem/trainer/run_lock.py)
        logs/             each Ray worker's output (<group>_rank<r>.log); error.log: the tracebacks of a failure
"""

from __future__ import annotations

import logging
import resource
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from tandem.config.errors import ConfigError
from tandem.config.loader import config_to_dict, config_to_yaml
from tandem.config.schema import TandemConfig
from tandem.data import StatefulSampler, UserSampler
from tandem.engine.flops import mfu_metrics
from tandem.roles.layout import WorkerGroups, build_worker_groups, device_choice
from tandem.run_folder import CHECKPOINTS_DIR, CONFIG_FILE, METRICS_FILE, STEP
from tandem.trainer.checkpoint import (
    CheckpointManager,
    checkpoint_step,
    load_trainer_state,
    save_trainer_state,
)
from tandem.trainer.checkpoint_hf import write_checkpoint_hf
from tandem.trainer.device_line import device_line
from tandem.trainer.metrics import worker_metrics
from tandem.trainer.run_lock import RunLock
from tandem.trainer.start_checks.available import check_available
from tandem.trainer.tracking import Tracker, read_jsonl

logger = logging.getLogger(__name__)


def run_dir(cfg: TandemConfig) -> Path:
    """The folder of a run's config, metrics and checkpoints."""
    t = cfg.trainer
    if t.run_dir:
        return Path(t.run_dir).expanduser()
    return Path(t.output_dir) / t.project_name / t.experiment_name


class Trainer(ABC):
    """The loop: for each step, `train_step`, validation every test_freq, a checkpoint every save_freq
    and at the end. Subclasses say what a step, a validation and their extra state are."""

    purpose = "rl"  # which workers build_worker_groups starts
    console_keys: tuple[str, ...] | None = None  # metrics on the console line; None = the tracker's default

    def __init__(
        self, cfg: TandemConfig, num_items: int, batch_size: int, sampler: UserSampler | None = None
    ) -> None:
        """`sampler`: the data order in place of Tandem's shuffle (the user's class, data.sampler_class)."""
        check_available(cfg, self.purpose)
        self.cfg = cfg
        self.run_dir = run_dir(cfg)
        self.log_dir = self.run_dir / "logs"  # the workers' output, and error.log (tandem/cli.py)
        d, t = cfg.data, cfg.trainer
        self.sampler: StatefulSampler | UserSampler
        if sampler is not None:
            self.sampler = sampler
        else:
            try:
                self.sampler = StatefulSampler(num_items, batch_size, shuffle=d.shuffle, seed=d.seed)
            except ValueError as err:  # too few rows for one batch: the data and the config disagree
                raise ConfigError(f"data.train_files={d.train_files}: {err}") from None
        self._batches: Any = None
        self.total_steps = t.total_training_steps or t.total_epochs * len(self.sampler)
        self.checkpoints = CheckpointManager(self.run_dir / CHECKPOINTS_DIR, t.max_checkpoints_to_keep)
        self.step = 0
        self.groups: WorkerGroups | None = None
        self.history: list[dict[str, float]] = []  # every logged metrics dict, with its "step"
        self._checkpoint_metrics: dict[str, float] | None = None  # the resumed checkpoint's step's metrics

    # ---- what a subclass defines -------------------------------------------------------------------

    @abstractmethod
    def train_step(self) -> dict[str, float]:
        """Run step `self.step` and return its metrics."""

    def validate(self) -> dict[str, float]:
        """Metrics on the validation data ({} when there is none)."""
        return {}

    def has_validation(self) -> bool:
        return False

    def stop_early(self, metrics: dict[str, float]) -> bool:
        """After a step (and its validation, if any): True ends the run here, as if it were the last step
        (final checkpoint, finish). A resumed run (trainer.resume=auto) would train on past it."""
        return False

    def extra_state(self) -> dict[str, Any]:
        """Controller state beyond step and data position, saved in checkpoints."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Restore what extra_state returned."""

    def take_generations(self) -> list[dict[str, Any]]:
        """The last validation's samples for the trackers (trainer.log_val_generations), once; [] if none."""
        return []

    def workers_started(self, groups: WorkerGroups) -> None:  # noqa: B027 - optional hook
        """`groups` were just started (before a resume loads a checkpoint into them)."""

    # ---- data ------------------------------------------------------------------------------------------

    def next_indices(self) -> list[int]:
        """The next batch of dataset rows; epochs follow each other without end (the step count stops)."""
        indices = next(self._batches, None) if self._batches is not None else None
        if indices is None:
            self._batches = iter(self.sampler)
            indices = next(self._batches)
        return indices

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    # ---- the loop ----------------------------------------------------------------------------------------

    def fit(self, until_step: int | None = None) -> list[dict[str, float]]:
        """Train to trainer.total_training_steps (or stop after `until_step`, as an interrupted run would);
        returns the logged metrics, one dict per logged step. The run folder is locked for the whole
        call (tandem/trainer/run_lock.py): a second run on the same folder is refused."""
        with RunLock(self.run_dir):
            return self._fit_locked(until_step)

    def _fit_locked(self, until_step: int | None) -> list[dict[str, float]]:
        t = self.cfg.trainer
        stop = min(self.total_steps, until_step) if until_step is not None else self.total_steps
        self.checkpoints.remove_partial()
        resume_from = self.checkpoints.resolve(t.resume)  # before any worker: a damaged one is an error now
        if resume_from is not None and checkpoint_step(resume_from) >= self.total_steps and not t.val_only:
            print(
                f"[tandem] run folder {self.run_dir} finished at step {checkpoint_step(resume_from)} "
                f"(of {self.total_steps}); use trainer.resume=disable or another trainer.experiment_name "
                "to train again",
                flush=True,
            )
            return self.history
        (self.run_dir / CONFIG_FILE).write_text(config_to_yaml(self.cfg))
        try:
            self.groups = build_worker_groups(
                self.cfg, self.total_steps, purpose=self.purpose, log_dir=self.log_dir
            )
            self.workers_started(self.groups)
            self.announce_devices(self.purpose)
            self.resume(resume_from)
            with Tracker(
                t.loggers,
                log_dir=self.run_dir,
                project=t.project_name,
                experiment=t.experiment_name,
                config=config_to_dict(self.cfg),
                total_steps=self.total_steps,
                start_step=self.step,
                console_keys=self.console_keys,
                progress=t.progress_bar,
            ) as tracker:
                # trainer.val_only, as verl: the starting or resumed actor validated once, then no step
                validate_first = (
                    t.val_before_train and self.has_validation() and (self.step == 0 or t.val_only)
                )
                self._log_missed_step(tracker)
                if validate_first:
                    self._log(tracker, self._timed_validation(), self.step)
                if validate_first and t.val_only:
                    return self.history
                while self.step < stop:
                    self.step += 1
                    if t.profile.steps:  # trainer.profile: the workers trace the calls of chosen steps
                        folder = t.profile.output_dir or str(self.run_dir / "profile")
                        for group in self.groups.unique():
                            group.profile_step(self.step, folder)
                    start = time.perf_counter()
                    metrics = self.train_step()
                    metrics = {**self.worker_metrics(), **metrics}  # the controller's timings win
                    metrics.update(mfu_metrics(metrics, self.update_devices()))
                    # with a generation in flight (one_step_off) the workers' report waits for it
                    metrics["timing_s/step_wall"] = time.perf_counter() - start
                    last = self.step == stop
                    if self.has_validation() and t.test_freq > 0 and (self.step % t.test_freq == 0 or last):
                        metrics.update(self._timed_validation())
                    last = last or self.stop_early(metrics)
                    metrics["train/epoch"] = float(self.epoch)
                    if (last and t.save_final) or (t.save_freq > 0 and self.step % t.save_freq == 0):
                        start = time.perf_counter()
                        self.save_checkpoint(metrics)
                        metrics["timing_s/save_checkpoint"] = time.perf_counter() - start
                    self._log(tracker, metrics, self.step)
                    if last:
                        break
                self.finish()
        finally:
            if self.groups is not None:
                self.groups.shutdown()
                self.groups = None
        return self.history

    def announce_devices(self, purpose: str) -> None:
        """Print, once per start of the workers, the device and the dtypes each role computes in."""
        print(f"[tandem] {device_line(self.cfg, *device_choice(self.cfg), purpose)}", flush=True)

    def worker_metrics(self) -> dict[str, float]:
        """What every worker of every group reported since the last call (timings, peak memory), merged
        over them (tandem/trainer/metrics.py), and the controller's own peak memory."""
        assert self.groups is not None
        metrics = worker_metrics([m for group in self.groups.unique() for m in group.pop_metrics()])
        # ru_maxrss is in KiB on Linux
        metrics["memory/controller_peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        return metrics

    def finish(self) -> None:  # noqa: B027 - optional hook
        """Called after the last step, while the workers are up."""

    def _timed_validation(self) -> dict[str, float]:
        start = time.perf_counter()
        metrics = self.validate()
        metrics["timing_s/validate"] = time.perf_counter() - start
        return metrics

    def _log(self, tracker: Tracker, metrics: dict[str, float], step: int) -> None:
        tracker.log(metrics, step)
        if generations := self.take_generations():
            tracker.log_generations(generations, step)
        self.history.append({"step": step, **metrics})

    # ---- checkpoints -------------------------------------------------------------------------------------

    def _log_missed_step(self, tracker: Tracker) -> None:
        """A run killed after its checkpoint of step N was complete but before step N's metrics line was written
        resumes after step N: the line is written now from the copy in the checkpoint (metrics.jsonl tells)."""
        metrics, self._checkpoint_metrics = self._checkpoint_metrics, None
        path = self.run_dir / METRICS_FILE
        if not metrics or "jsonl" not in self.cfg.trainer.loggers or not path.exists():
            return
        if any(row.get(STEP) == self.step for row in read_jsonl(path)):
            return
        print(
            f"[tandem] step {self.step}'s metrics were not logged before the run stopped: logged now from its "
            "checkpoint",
            flush=True,
        )
        self._log(tracker, metrics, self.step)

    def save_checkpoint(self, metrics: dict[str, float] | None = None) -> Path:
        """Every trainable role's state and the controller's, as checkpoints/global_step_<step>; with the step's
        `metrics`, logged after it is saved, so a run killed in between can log them when it resumes."""
        assert self.groups is not None
        with self.checkpoints.writing(self.step) as folder:
            for group in self.groups.unique():
                group.save_checkpoint(str(folder))
            if (folder / "actor").is_dir():
                write_checkpoint_hf(self.cfg, self.groups.actor, folder)
            state = {
                "step": self.step,
                "sampler": self.sampler_state(),
                "extra": self.extra_state(),
                "metrics": dict(metrics or {}),
            }
            save_trainer_state(folder, state)
            (folder / CONFIG_FILE).write_text(config_to_yaml(self.cfg))
        logger.info("saved checkpoint %s", self.checkpoints.root / f"global_step_{self.step}")
        return self.checkpoints.root / f"global_step_{self.step}"

    def update_devices(self) -> dict[str, int]:
        """Devices of each role whose update is timed as `timing_s/update_<role>`, for `perf/mfu/<role>`."""
        return {}

    def sampler_state(self) -> dict[str, Any]:
        """What a checkpoint records of the sampler: by default its position now."""
        return self.sampler.state_dict()

    def resume(self, path: Path | None) -> None:
        """Load the checkpoint `path` (what trainer.resume resolved to), if any, into the workers and here."""
        assert self.groups is not None
        if path is None:
            return
        for group in self.groups.unique():
            group.load_checkpoint(str(path))
        state = load_trainer_state(path)
        self.step = int(state["step"])
        self.sampler.load_state_dict(state["sampler"])
        self._batches = None
        self.load_extra_state(state["extra"])
        self._checkpoint_metrics = state.get("metrics")  # a checkpoint written before them has none
        print(f"[tandem] resumed from {path} (step {self.step} of {self.total_steps})", flush=True)
