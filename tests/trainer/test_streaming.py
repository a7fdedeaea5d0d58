"""StreamFeed, the controller's side of trainer.async_mode=streaming, against a scripted rollout pool:
the queue stays within its bound, a step takes groups in the order they finished, groups too many
updates old are dropped and counted, and the untrained prompts survive a checkpoint."""

import pytest
import torch

from tandem.batch import Batch
from tandem.rollout import SamplingParams
from tandem.rollout.stream import VERSION_KEY
from tandem.trainer.streaming import StreamFeed


class ScriptedPool:
    """Stands in for the rollout worker group: a group 'finishes' when the test releases it, with the
    weight version the test says it was generated with."""

    name = "rollout"

    def __init__(self):
        self.submitted: list[tuple[str, int]] = []  # (uid, dataset index) in submission order
        self.released: list[Batch] = []

    def stream_submit(self, prompts, sampling):
        self.submitted += list(zip(prompts["uid"], prompts["index"].tolist(), strict=True))
        return len(prompts)

    def stream_collect(self, min_groups, timeout_s):
        out, self.released = self.released, []
        return [(out, {"groups_in_flight": 0.0, "idle_s": 0.25})]

    def release(self, uid: str, version: int, n: int = 2) -> None:
        index = dict(self.submitted)[uid]
        group = Batch.from_dict({"index": torch.full((n,), index), VERSION_KEY: torch.full((n,), version)})
        group["uid"] = [uid] * n
        self.released.append(group)


class Sampler:
    def __init__(self, batch: int):
        self.next, self.batch = 0, batch

    def draw(self) -> list[int]:
        out = list(range(self.next, self.next + self.batch))
        self.next += self.batch
        return out


def request(indices, number):
    prompts = Batch.from_dict({"index": torch.tensor(indices)})
    prompts["uid"] = [f"{number}.0.{i}" for i in range(len(indices))]
    return prompts, SamplingParams(max_tokens=4, n=2)


def concat(groups):
    return Batch.concat(groups, meta="first")


def take(feed, pool, sampler, version):
    return feed.take(pool, version, sampler.draw, request, concat)


def test_the_queue_is_bounded_groups_come_in_finishing_order_and_stale_ones_are_dropped():
    pool, sampler = ScriptedPool(), Sampler(batch=2)
    feed = StreamFeed(batch_groups=2, queue_batches=2, max_staleness=1, timeout_s=60)
    # Before anything finished, the feed submits two batches (its bound) and no more.
    feed._fill(pool, sampler.draw, request)
    assert [uid for uid, _ in pool.submitted] == ["0.0.0", "0.0.1", "1.0.0", "1.0.1"]
    # Groups of the second batch finish first; the step takes them in that order.
    pool.release("1.0.1", version=0)
    pool.release("0.0.0", version=0)
    batch, metrics = take(feed, pool, sampler, version=0)
    assert batch["uid"].tolist() == ["1.0.1", "1.0.1", "0.0.0", "0.0.0"]
    assert metrics["async/staleness_max"] == 0 and metrics["async/dropped_groups"] == 0
    # Taking two made room for one more batch: submitted at once, while the step trains.
    assert [uid for uid, _ in pool.submitted[4:]] == ["2.0.0", "2.0.1"]
    assert metrics["async/queue_groups"] == 4 and metrics["async/rollout_idle_s"] == 0.25
    # Two updates later: a group of version 0 is 2 behind (dropped), version 1 is 1 behind (kept).
    pool.release("0.0.1", version=0)
    pool.release("1.0.0", version=1)
    pool.release("2.0.0", version=2)
    batch, metrics = take(feed, pool, sampler, version=2)
    assert sorted(set(batch["uid"].tolist())) == ["1.0.0", "2.0.0"]
    assert metrics["async/dropped_groups"] == 1 and metrics["async/dropped_groups_total"] == 1
    assert metrics["async/staleness_mean"] == pytest.approx(0.5) and metrics["async/staleness_max"] == 1
    assert "0.0.1" not in feed.pending  # dropped groups' prompts are used up, not retried


def test_untrained_prompts_are_submitted_first_after_a_resume():
    pool, sampler = ScriptedPool(), Sampler(batch=2)
    feed = StreamFeed(batch_groups=2, queue_batches=2, max_staleness=1, timeout_s=60)
    feed._fill(pool, sampler.draw, request)
    pool.release("1.0.0", version=0)
    pool.release("0.0.1", version=0)
    take(feed, pool, sampler, version=0)  # trains on dataset rows 2 and 1; rows 0 and 3 stay pending
    pool.release("2.0.1", version=1)  # finished, not yet trained on: its prompt is pending too
    state = feed.state_dict()
    assert sorted(state["pending"]) == [0, 3, 4, 5] and state["submitted"] == 3

    resumed_pool, resumed_sampler = ScriptedPool(), Sampler(batch=2)
    resumed_sampler.next = sampler.next  # the checkpoint's sampler position
    resumed = StreamFeed(batch_groups=2, queue_batches=2, max_staleness=1, timeout_s=60)
    resumed.load_state_dict(state)
    resumed._fill(resumed_pool, resumed_sampler.draw, request)
    # the four pending prompts first, in two batches numbered on from the checkpoint, then new ones
    assert sorted(index for _, index in resumed_pool.submitted) == [0, 3, 4, 5]
    assert {uid.split(".")[0] for uid, _ in resumed_pool.submitted} == {"3", "4"}


def test_a_pool_that_never_finishes_a_group_is_an_error_naming_it():
    pool, sampler = ScriptedPool(), Sampler(batch=2)
    feed = StreamFeed(batch_groups=2, queue_batches=1, max_staleness=1, timeout_s=0.0)
    with pytest.raises(TimeoutError, match="no prompt group finished in 0 s .* worker group 'rollout'"):
        take(feed, pool, sampler, version=0)
