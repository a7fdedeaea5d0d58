"""trainer.async_mode=one_step_off (rollout.layout=separate): the rollout pool generates the next step's
samples while this step trains.

Checkpoints: a checkpoint taken while the next step's prompts generate records the sampler from before
they were drawn, so a resumed run (whose queue starts empty) draws and generates them again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tandem.batch import Batch
from tandem.trainer.metrics import Timer
from tandem.trainer.rollout_source import RolloutSource
from tandem.trainer.rollouts import Rollouts


@dataclass
class Prefetch:
    """A generation started for a later step: its future, the actor update number whose weights it
    uses, and the start of the workers it runs on (`Rollouts.workers`)."""

    future: Any
    version: int
    workers: int


class OneStepOffSource(RolloutSource):
    """This step's samples were launched during the previous step, one actor update behind."""

    draws_after_update = False  # the next step's prompts are drawn while this step trains

    def __init__(self, rollouts: Rollouts, total_steps: int) -> None:
        super().__init__(rollouts, total_steps)
        self.prefetch: Prefetch | None = None  # the next step's generation
        self._sampler_before_prefetch: dict[str, Any] = {}

    def next(self, step: int, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """This step's samples were launched during the previous step with the weights the actor had then
        (one update behind), and the next step's are launched now, with the current weights, to generate
        while this step trains. After a (re)start the queue is empty: the first batch is generated here,
        with the current weights (staleness 0)."""
        t = self.rollouts
        pending, self.prefetch = self.prefetch, None
        if pending is None or pending.workers != t.workers:
            pending = self._launch(step)
        with timer("wait_generate"):
            batch = pending.future.result()
        staleness = float(t.actor_updates - pending.version)
        if step < self.total_steps:
            self.prefetch = self._launch(step + 1)
        with timer("reward"):
            batch, metrics = t.score(batch, train=True)
        # every sample of a step was generated with the same weights
        metrics["async/staleness_mean"] = metrics["async/staleness_max"] = staleness
        return batch, metrics

    def _launch(self, step: int) -> Prefetch:
        """Draw `step`'s prompts and start generating them with the actor's current weights (sent first
        when they changed). A checkpoint taken while they generate records the sampler from before the
        draw, so a resumed run generates them again."""
        t = self.rollouts
        self._sampler_before_prefetch = t.sampler_state()
        prompts, sampling = t.request(t.draw(), step, 1)
        future = t.group().generate.async_(prompts, sampling)
        return Prefetch(future, t.actor_updates, t.workers)

    def sampler_state(self) -> dict[str, Any]:
        if self.prefetch is not None:  # its prompts are drawn but not trained on: they are not consumed
            return self._sampler_before_prefetch
        return super().sampler_state()
