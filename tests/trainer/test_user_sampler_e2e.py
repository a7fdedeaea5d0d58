"""A curriculum sampler of the user's (data.sampler_file / data.sampler_class) in a training run: its update()
sees each step's scores as the sample dumps hold them, the next step trains on the prompts it chose, and a
resumed run draws what the uninterrupted one drew. In process, 1 rank, HF rollout, tiny model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tandem.config import ConfigError
from tandem.trainer import RLTrainer

from .trainer_helpers import (
    as_if_killed_after,
    assert_same_steps,
    by_step,
    custom_reward,
    make_assets,
    run_config,
)

pytestmark = pytest.mark.timeout(600)

# 16 rows in two groups (even, odd rows), each epoch every row once in order; after a step the rows left of the
# group whose samples scored lower on average come first. Each update() appends what it saw, and the rows it
# put next, to <this file>.seen.jsonl.
CURRICULUM = """
import json
from pathlib import Path

LOG = Path(__file__).with_suffix(".seen.jsonl")


class Curriculum:
    def __init__(self, data_source, data_config):
        self.n = len(data_source)
        self.batch = data_config.train_batch_size
        self.queue = []

    def set_epoch(self, epoch):
        self.queue = list(range(self.n))

    def __iter__(self):
        while self.queue:
            yield self.queue.pop(0)

    def __len__(self):
        return self.n

    def update(self, batch):
        rows = batch.dataset_indices.tolist()
        scores = batch.scores.tolist()
        mean = [sum(s for r, s in zip(rows, scores) if r % 2 == g) / max(1, sum(r % 2 == g for r in rows))
                for g in (0, 1)]
        harder = 0 if mean[0] <= mean[1] else 1
        self.queue.sort(key=lambda r: r % 2 != harder)
        seen = {"step": batch.step, "rows": rows, "scores": scores, "rewards": batch.rewards.tolist(),
                "uids": batch.non_tensor_batch["uid"].tolist(), "next": self.queue[: self.batch]}
        with LOG.open("a") as f:
            f.write(json.dumps(seen) + "\\n")

    def state_dict(self):
        return {"queue": list(self.queue)}

    def load_state_dict(self, state):
        self.queue = list(state["queue"])
"""


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("assets"))


def config(assets, out: Path, experiment: str, *overrides: str):
    sampler = out / f"{experiment}_sampler.py"
    if not sampler.exists():
        out.mkdir(parents=True, exist_ok=True)
        sampler.write_text(CURRICULUM)
    return run_config(
        assets,
        out,
        "grpo",
        "trainer.backend=inprocess",
        "trainer.workers_per_node=1",
        "rollout.engine=hf",
        "trainer.total_training_steps=2",
        "trainer.save_freq=1",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        f"trainer.experiment_name={experiment}",
        f"trainer.rollout_data_dir={out / 'tandem' / experiment / 'dumps'}",
        f"data.sampler_file={sampler}",
        "data.sampler_class=Curriculum",
        *custom_reward("by_length"),
        *overrides,
    )


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_a_curriculum_sees_each_steps_scores_and_picks_the_next_prompts_also_after_a_resume(assets, tmp_path):
    straight = by_step(RLTrainer(config(assets, tmp_path, "straight")).fit())
    seen = read_jsonl(tmp_path / "straight_sampler.seen.jsonl")
    assert [s["step"] for s in seen] == [1, 2]
    prompts = [row["prompt"][-1]["content"] for row in pq.read_table(assets["train"]).to_pylist()]
    for s in seen:
        dump = read_jsonl(tmp_path / "tandem/straight/dumps" / f"{s['step']}.jsonl")
        # update() saw the step's samples with the scores the dump holds, in the same order
        assert [(d["uid"], d["score"]) for d in dump] == list(zip(s["uids"], s["scores"]))
        assert s["rewards"] == s["scores"]  # no KL penalty in the reward (grpo)
        assert sum(s["scores"]) / len(s["scores"]) == pytest.approx(straight[s["step"]]["score/mean"])
        # and the rows it was given are the prompts the dump shows (4 prompts x rollout.n=4 samples)
        assert len(dump) == 16 and all(prompts[row] in d["input"] for row, d in zip(s["rows"], dump))
    assert seen[0]["rows"] == [r for r in range(4) for _ in range(4)]  # step 1: the first epoch's order
    # step 2 trained on the rows step 1's update() put next: a group moved ahead of the file's order
    assert seen[1]["rows"] == [r for r in seen[0]["next"] for _ in range(4)]
    assert seen[0]["next"] in ([4, 6, 8, 10], [5, 7, 9, 11])

    # killed after step 1's checkpoint (mid-epoch): the resumed run draws and scores step 2 as the straight run did
    as_if_killed_after(tmp_path / "tandem/straight", tmp_path / "tandem/resumed", 1)
    shutil.rmtree(tmp_path / "tandem/resumed/dumps")
    resumed = by_step(RLTrainer(config(assets, tmp_path, "resumed")).fit())
    assert sorted(resumed) == [2]
    again = read_jsonl(tmp_path / "resumed_sampler.seen.jsonl")
    assert again == seen[1:]
    assert_same_steps(resumed, straight, (2,))


def test_a_curriculum_is_refused_where_a_steps_prompts_are_drawn_before_the_last_update(assets, tmp_path):
    early = ("trainer.backend=ray", "rollout.layout=separate", "trainer.async_mode=one_step_off")
    cfg = config(assets, tmp_path, "early", *early)  # refused before Ray starts
    with pytest.raises(
        ConfigError, match=r"has update\(batch\), a curriculum, but trainer.async_mode=one_step_off"
    ):
        RLTrainer(cfg)
