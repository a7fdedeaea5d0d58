"""trainer.async_mode=streaming, the controller's side: keep the rollout pool fed, take what finished.

The rollout workers generate prompt groups continuously (tandem/rollout/stream.py). `StreamFeed`
keeps up to trainer.stream_queue_batches batches of prompts submitted and not yet trained on, drawing
a new batch from the sampler whenever one fits; a step takes the first data.train_batch_size groups
to finish, in the order they finished. A group is tagged with the weight version (actor update count)
each of its samples started from; one more than trainer.max_staleness updates behind the actor when
a step would take it is dropped, counted, and never trained on. `StreamingSource` is the mode's rollout
source (tandem/trainer/rollout_source.py): each step takes its groups from the feed and scores them.

Checkpoints: the prompts of groups submitted but not trained on (in flight or waiting) are saved in
the trainer's state and submitted first after a resume, so no prompt is lost or trained twice; the
groups themselves are not saved (a resumed run starts with an empty queue and generates them again,
with the resumed weights).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tandem.batch import Batch
from tandem.controller import WorkerGroup
from tandem.rollout import SamplingParams
from tandem.rollout.stream import VERSION_KEY
from tandem.trainer.metrics import Timer
from tandem.trainer.rollout_source import RolloutSource
from tandem.trainer.rollouts import Rollouts

COLLECT_WAIT_S = 1.0  # how long one collect call waits on the workers for a group to finish


class StreamFeed:
    """The queue of prompt groups between the sampler, the rollout pool and the trainer's steps."""

    def __init__(self, batch_groups: int, queue_batches: int, max_staleness: int, timeout_s: float) -> None:
        self.batch_groups = batch_groups  # groups a step trains on (data.train_batch_size)
        self.capacity = batch_groups * queue_batches  # groups submitted and not yet trained or dropped
        self.max_staleness = max_staleness
        self.timeout_s = timeout_s  # the longest wait for one group before the run stops
        self.pending: dict[str, int] = {}  # uid -> dataset index, in submission order
        self.requeue: list[int] = []  # dataset indices to submit before drawing new ones (after a resume)
        self.ready: list[Batch] = []  # finished groups, in the order they arrived
        self.submitted = 0  # batches submitted so far: numbers the uids and seeds of the next one
        self.dropped_total = 0

    def take(
        self,
        rollout: WorkerGroup,
        version: int,
        draw: Callable[[], list[int]],
        request: Callable[[list[int], int], tuple[Batch, SamplingParams]],
        concat: Callable[[list[Batch]], Batch],
    ) -> tuple[Batch, dict[str, float]]:
        """The next step's groups (``batch_groups`` of them) generated with weights at most max_staleness
        updates older than ``version``, and the step's async/* metrics. Submits new prompts (``draw`` gives
        dataset indices, ``request`` turns them and a batch number into prompts and sampling) whenever
        there is room in the queue, so the pool keeps generating while the step trains."""
        dropped = 0
        idle: dict[int, float] = {}
        waited_since = time.perf_counter()
        while True:
            fresh = []
            for group in self.ready:
                if version - int(group[VERSION_KEY].min()) > self.max_staleness:
                    self.pending.pop(_uid(group))
                    dropped += 1
                else:
                    fresh.append(group)
            self.ready = fresh
            self._fill(rollout, draw, request)
            if len(self.ready) >= self.batch_groups:
                break
            parts = rollout.stream_collect(self.batch_groups - len(self.ready), COLLECT_WAIT_S)
            arrived = [group for groups, _ in parts for group in groups]
            for rank, (_, info) in enumerate(parts):
                idle[rank] = idle.get(rank, 0.0) + info["idle_s"]
            if arrived:
                self.ready.extend(arrived)
                waited_since = time.perf_counter()
            elif time.perf_counter() - waited_since > self.timeout_s:
                raise TimeoutError(
                    f"trainer.async_mode=streaming: no prompt group finished in {self.timeout_s:g} s "
                    f"(trainer.worker_timeout_s) with {len(self.pending)} submitted on worker group "
                    f"{rollout.name!r}; the rollout workers' logs say why"
                )
        taken, self.ready = self.ready[: self.batch_groups], self.ready[self.batch_groups :]
        for group in taken:
            self.pending.pop(_uid(group))
        self.dropped_total += dropped
        self._fill(rollout, draw, request)  # room was made: keep the pool busy while this step trains
        batch = concat(taken)
        staleness = (version - batch[VERSION_KEY]).double()
        metrics = {
            "async/staleness_mean": float(staleness.mean()),
            "async/staleness_max": float(staleness.max()),
            "async/queue_groups": float(len(self.pending)),
            "async/ready_groups": float(len(self.ready)),
            "async/dropped_groups": float(dropped),
            "async/dropped_groups_total": float(self.dropped_total),
            "async/rollout_idle_s": max(idle.values(), default=0.0),
        }
        return batch, metrics

    def restart(self) -> None:
        """New workers (a resumed run): what was in flight is gone; its prompts are submitted again first."""
        self.requeue = list(self.pending.values()) + self.requeue
        self.pending, self.ready = {}, []

    def _fill(
        self,
        rollout: WorkerGroup,
        draw: Callable[[], list[int]],
        request: Callable[[list[int], int], tuple[Batch, SamplingParams]],
    ) -> None:
        while len(self.pending) + self.batch_groups <= self.capacity:
            if self.requeue:
                indices, self.requeue = self.requeue[: self.batch_groups], self.requeue[self.batch_groups :]
            else:
                indices = draw()
            prompts, sampling = request(indices, self.submitted)
            self.submitted += 1
            rollout.stream_submit(prompts, sampling)
            for uid, index in zip(prompts["uid"], indices, strict=True):
                self.pending[str(uid)] = index

    def state_dict(self) -> dict[str, Any]:
        return {
            "pending": list(self.pending.values()) + self.requeue,
            "submitted": self.submitted,
            "dropped_total": self.dropped_total,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.requeue = [int(i) for i in state["pending"]]
        self.pending, self.ready = {}, []
        self.submitted = int(state["submitted"])
        self.dropped_total = int(state["dropped_total"])


class StreamingSource(RolloutSource):
    """The first train_batch_size prompt groups to finish on the rollout pool, from a `StreamFeed`."""

    draws_after_update = False  # the next step's prompts are drawn while this step trains

    def __init__(self, rollouts: Rollouts, total_steps: int) -> None:
        super().__init__(rollouts, total_steps)
        t = rollouts.cfg.trainer  # the prompt groups between sampler, pool and steps
        self.feed = StreamFeed(
            rollouts.cfg.data.train_batch_size, t.stream_queue_batches, t.max_staleness, t.worker_timeout_s
        )
        self.workers = 0  # the start of the workers the feed's groups in flight run on (`Rollouts.workers`)

    def next(self, step: int, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """The first train_batch_size prompt groups to finish on the rollout pool, generated at most
        trainer.max_staleness actor updates ago. The pool gets the current weights first when they changed
        (after its turns in flight finish)."""
        t = self.rollouts
        if self.workers != t.workers:
            self.feed.restart()
            self.workers = t.workers
        rollout = t.group()
        with timer("wait_generate"):
            batch, metrics = self.feed.take(rollout, t.actor_updates, t.draw, self._request, t.concat)
        with timer("reward"):
            batch, reward_metrics = t.score(batch, train=True)
        return batch, {**reward_metrics, **metrics}

    def _request(self, indices: list[int], number: int) -> tuple[Batch, SamplingParams]:
        """The prompts of dataset rows ``indices`` as the stream's batch ``number``, with their sampling."""
        return self.rollouts.request(indices, number, 0)

    def state_dict(self) -> dict[str, Any]:
        return self.feed.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.feed.load_state_dict(state)


def _uid(group: Batch) -> str:
    uids = {str(u) for u in group["uid"]}
    if len(uids) != 1:
        raise ValueError(f"a streamed prompt group holds samples of several prompts: uids {sorted(uids)}")
    return uids.pop()
