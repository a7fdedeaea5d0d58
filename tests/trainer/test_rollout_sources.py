"""The rollout sources against scripted Rollouts (no workers): which one each trainer.async_mode picks, and
one_step_off's prefetch, staleness and checkpointed sampler position, streaming's resubmission on new workers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tandem.batch import Batch
from tandem.rollout.stream import VERSION_KEY
from tandem.trainer.metrics import Timer
from tandem.trainer.one_step_off import OneStepOffSource
from tandem.trainer.ppo import rollout_source
from tandem.trainer.streaming import StreamingSource
from tandem.trainer.sync_source import SyncSource


class Done:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class ScriptedRollouts:
    """Rollouts with a data order that counts draws and a rollout group that records what it generates."""

    def __init__(self, async_mode: str = "one_step_off") -> None:
        self.cfg = SimpleNamespace(
            trainer=SimpleNamespace(
                async_mode=async_mode, stream_queue_batches=2, max_staleness=1, worker_timeout_s=60.0
            ),
            data=SimpleNamespace(train_batch_size=2),
        )
        self.draws = 0
        self.workers = 1
        self.actor_updates = 0
        self.generated: list[tuple[int, int]] = []  # (step, weight version) of each generation started
        self.rollout = SimpleNamespace(generate=SimpleNamespace(async_=self._generate_async))

    def draw(self) -> list[int]:
        self.draws += 1
        return [self.draws]

    def sampler_state(self):
        return {"position": self.draws}

    def request(self, indices, step, round_):
        return {"indices": indices, "step": step}, None

    def group(self):
        return self.rollout

    def _generate_async(self, prompts, sampling):
        self.generated.append((prompts["step"], self.actor_updates))
        return Done({"step": prompts["step"]})

    def score(self, batch, *, train=False):
        return batch, {"reward/score_mean": 1.0}


@pytest.mark.parametrize(
    ("mode", "source"),
    [("synchronous", SyncSource), ("one_step_off", OneStepOffSource), ("streaming", StreamingSource)],
)
def test_each_async_mode_picks_its_source(mode, source):
    assert type(rollout_source(ScriptedRollouts(mode), 3)) is source


def test_one_step_off_trains_on_the_prefetch_and_checkpoints_the_sampler_from_before_it():
    trainer = ScriptedRollouts()
    source = OneStepOffSource(trainer, total_steps=3)
    assert source.sampler_state() == {"position": 0} and source.state_dict() is None
    staleness = []
    for step in (1, 2, 3):
        batch, metrics = source.next(step, Timer())
        assert batch == {"step": step}
        staleness.append(metrics["async/staleness_max"])
        # the next step's prompts are drawn but not trained on: a checkpoint records the draw before them
        # (after the last step, none are drawn: the sampler's position now)
        assert source.sampler_state() == {"position": step} and trainer.draws == min(step + 1, 3)
        trainer.actor_updates += 1
    # step 1 generated with the weights of update 0 (in the step), each later one an update behind
    assert trainer.generated == [(1, 0), (2, 0), (3, 1)] and staleness == [0.0, 1.0, 1.0]
    assert source.prefetch is None  # nothing launched after the last step


def test_one_step_off_generates_again_on_new_workers():
    trainer = ScriptedRollouts()
    source = OneStepOffSource(trainer, total_steps=3)
    source.next(1, Timer())
    trainer.actor_updates, trainer.workers = 1, 2  # a resumed run: the prefetch's workers are gone
    _, metrics = source.next(2, Timer())
    assert trainer.generated == [(1, 0), (2, 0), (2, 1), (3, 1)] and metrics["async/staleness_max"] == 0


class InstantPool:
    """A rollout pool whose submitted prompt groups all finish at the next collect, with weights of version 0."""

    name = "rollout"

    def __init__(self):
        self.submitted: list[int] = []  # dataset indices, in submission order
        self.finished: list[Batch] = []

    def stream_submit(self, prompts, sampling):
        for uid, index in zip(prompts["uid"], prompts["index"].tolist(), strict=True):
            self.submitted.append(index)
            group = Batch.from_dict({"index": torch.full((2,), index), VERSION_KEY: torch.zeros(2)})
            group["uid"] = [uid] * 2
            self.finished.append(group)
        return len(prompts)

    def stream_collect(self, min_groups, timeout_s):
        out, self.finished = self.finished, []
        return [(out, {"idle_s": 0.0})]


def test_streaming_submits_the_prompts_in_flight_again_first_on_new_workers():
    rollouts = StreamRollouts()
    source = StreamingSource(rollouts, total_steps=2)
    batch, _ = source.next(1, Timer())
    # rows 1 2 | 3 4 submitted (the queue's bound), 1 2 trained on, then 5 6 submitted in the room made
    assert rollouts.rollout.submitted == [1, 2, 3, 4, 5, 6] and sorted(set(batch["index"].tolist())) == [1, 2]
    rollouts.rollout, rollouts.workers = InstantPool(), 2  # a resumed run: what was in flight is gone
    batch, _ = source.next(2, Timer())
    assert rollouts.rollout.submitted[:4] == [3, 4, 5, 6] and sorted(set(batch["index"].tolist())) == [3, 4]


class StreamRollouts(ScriptedRollouts):
    """Scripted Rollouts for the stream: two dataset rows a draw (data.train_batch_size), an instant pool."""

    def __init__(self) -> None:
        super().__init__("streaming")
        self.rollout = InstantPool()

    def draw(self) -> list[int]:
        self.draws += 2
        return [self.draws - 1, self.draws]

    def request(self, indices, number, round_):
        prompts = Batch.from_dict({"index": torch.tensor(indices)})
        prompts["uid"] = [f"{number}.{round_}.{i}" for i in range(len(indices))]
        return prompts, None

    def concat(self, groups):
        return Batch.concat(groups, meta="first")
