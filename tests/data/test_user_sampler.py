"""A user's sampler class (data.sampler_file / data.sampler_class): batches drawn lazily so a curriculum's
update() reorders the next one, epochs, the state a checkpoint keeps (resumed == uninterrupted), and the errors."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch

from tandem.batch import Batch
from tandem.config.schema import DataConfig
from tandem.data import DATASET_INDEX, DataError, StatefulSampler, UserSampler, sampler_batch, sampler_config

# A curriculum over 10 rows in two groups (even, odd rows): each epoch every row once, in order; after a step
# the rows left of the group whose samples scored lower on average come first. The epoch's order is a queue
# in the object (set_epoch fills it, __iter__ pops from it); update() records what it saw.
CURRICULUM = """
class Hardest:
    def __init__(self, data_source, data_config):
        self.n = len(data_source)
        self.queue = []
        self.seen = []

    def set_epoch(self, epoch):
        self.queue = list(range(self.n))

    def __iter__(self):
        while self.queue:
            yield self.queue.pop(0)

    def __len__(self):
        return self.n

    def update(self, batch):
        rows = [int(i) for i in batch.dataset_indices]
        scores = [float(s) for s in batch.scores]
        self.seen.append((batch.step, rows, scores))
        mean = [sum(s for r, s in zip(rows, scores) if r % 2 == g) / max(1, sum(r % 2 == g for r in rows))
                for g in (0, 1)]
        harder = 0 if mean[0] <= mean[1] else 1
        self.queue.sort(key=lambda r: r % 2 != harder)

    def state_dict(self):
        return {"queue": list(self.queue), "seen": list(self.seen)}

    def load_state_dict(self, state):
        self.queue, self.seen = list(state["queue"]), list(state["seen"])
"""

# No state_dict: a seeded order of its own, a new one each epoch (an epoch counter bumped by iter()).
SEEDED = """
import random

class Seeded:
    def __init__(self, data_source, data_config):
        self.n, self.seed, self.epoch = len(data_source), data_config.seed, 0

    def __iter__(self):
        order = list(range(self.n))
        random.Random(self.seed * 100 + self.epoch).shuffle(order)
        self.epoch += 1
        return iter(order)

    def __len__(self):
        return self.n
"""


def write(tmp_path, text: str, name: str = "my_sampler.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


ROWS = [{"raw_prompt": f"q{i}"} for i in range(10)]
CONFIG = sampler_config(DataConfig(seed=7))


def make(path: str, name: str, batch_size: int = 4) -> UserSampler:
    return UserSampler(path, name, ROWS, CONFIG, batch_size)


def draw(sampler: UserSampler, n: int) -> list[list[int]]:
    """The next `n` batches, into further epochs, as the trainer's next_indices draws them."""
    out: list[list[int]] = []
    while len(out) < n:
        out.extend(b for _, b in zip(range(n - len(out)), iter(sampler)))
    return out


def scored(step: int, rows: list[int], scores: list[float], n: int = 2) -> Batch:
    """A trained step's batch: `n` samples a row, each sample's score on its last response token."""
    index = torch.tensor(rows).repeat_interleave(n)
    per_sample = torch.tensor(scores).repeat_interleave(n)
    token_scores = torch.zeros(len(index), 3)
    token_scores[:, -1] = per_sample
    batch = Batch.from_dict(
        {
            DATASET_INDEX: index,
            "token_level_scores": token_scores,
            "token_level_rewards": token_scores - 0.25,
            "advantages": torch.ones(len(index), 3),
            "response_mask": torch.ones(len(index), 3),
            "acc": per_sample,
        }
    )
    batch["uid"] = [f"{step}.1.{i // n}" for i in range(len(index))]
    batch["data_source"] = ["t"] * len(index)
    batch["reward_extra"] = [{"term": float(s)} for s in per_sample]
    return batch


def test_update_reorders_the_next_batch_drawn_only_after_it(tmp_path):
    sampler = make(write(tmp_path, CURRICULUM), "Hardest")
    assert sampler.is_curriculum and sampler.stateful and len(sampler) == 2  # 10 rows // 4
    batches = iter(sampler)
    assert next(batches) == [0, 1, 2, 3]
    # the odd rows (1, 3) scored 0.25 on average, the even (0, 2) 0.625: the odd rows left come first
    sampler.update(sampler_batch(1, scored(1, [0, 1, 2, 3], [1.0, 0.5, 0.25, 0.0])))
    assert next(batches) == [5, 7, 9, 4]
    assert sampler.state_dict()["epoch"] == 1 and sampler.state_dict()["position"] == 0  # 2 batches an epoch
    # the next epoch starts afresh (set_epoch); rows 6 and 8 of the last were left out (drop_last)
    assert draw(sampler, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_sampler_batch_holds_the_steps_scores_rewards_rows_and_fields():
    batch = sampler_batch(3, scored(3, [5, 7], [0.5, 2.0]))
    assert batch.step == 3 and len(batch) == 4
    assert batch.dataset_indices.tolist() == [5, 5, 7, 7] and batch.dataset_indices.dtype == np.int64
    assert batch.scores.tolist() == [0.5, 0.5, 2.0, 2.0]
    assert batch.rewards.tolist() == [-0.25, -0.25, 1.25, 1.25]  # 3 tokens of -0.25 each, KL-penalty-like
    assert batch.acc.tolist() == [0.5, 0.5, 2.0, 2.0]
    assert sorted(batch.batch) == ["advantages", "response_mask", "token_level_rewards", "token_level_scores"]
    assert batch.non_tensor_batch["uid"].tolist() == ["3.1.0", "3.1.0", "3.1.1", "3.1.1"]
    assert [r["term"] for r in batch.non_tensor_batch["reward_extra_info"]] == [0.5, 0.5, 2.0, 2.0]


def test_a_stateful_curriculum_resumed_draws_what_the_uninterrupted_one_draws(tmp_path):
    path = write(tmp_path, CURRICULUM)
    straight, saved = make(path, "Hardest"), None
    drawn = []
    for step in range(1, 7):  # 6 steps, 3 epochs of 2 batches; a checkpoint after step 3 (mid-epoch)
        (rows,) = draw(straight, 1)
        drawn.append(rows)
        straight.update(sampler_batch(step, scored(step, rows, [float((r * 7 + step) % 5) for r in rows])))
        if step == 3:
            saved = straight.state_dict()
    resumed = make(path, "Hardest")
    resumed.load_state_dict(saved)
    for step in range(4, 7):
        (rows,) = draw(resumed, 1)
        assert rows == drawn[step - 1]
        resumed.update(sampler_batch(step, scored(step, rows, [float((r * 7 + step) % 5) for r in rows])))
    assert resumed.sampler.seen == straight.sampler.seen and resumed.state_dict() == straight.state_dict()


@pytest.mark.parametrize("after", [1, 2, 3, 5])  # mid-epoch and at an epoch's end
def test_a_sampler_without_state_is_replayed_to_the_same_next_batches(tmp_path, after):
    path = write(tmp_path, SEEDED)
    straight = make(path, "Seeded", batch_size=3)  # 10 rows: 3 batches an epoch, row 10th left out
    assert not straight.is_curriculum and not straight.stateful
    first = draw(straight, after)
    saved = straight.state_dict()
    later = draw(straight, 4)
    assert first[0] != draw(make(path, "Seeded", batch_size=3), 4)[3]  # each epoch its own order
    resumed = make(path, "Seeded", batch_size=3)
    resumed.load_state_dict(saved)
    assert draw(resumed, 4) == later


def test_a_curriculum_without_state_warns_on_resume(tmp_path, caplog):
    path = write(
        tmp_path,
        CURRICULUM.replace("def state_dict", "def _state").replace("def load_state_dict", "def _load"),
    )
    sampler = make(path, "Hardest")
    draw(sampler, 1)
    saved = sampler.state_dict()
    assert saved["user_state"] is None
    again = make(path, "Hardest")
    again.load_state_dict(saved)
    assert "without what update() learned" in caplog.text
    assert draw(again, 1) == [[4, 5, 6, 7]]  # the order of a fresh instance, the first batch skipped


def test_the_checkpoint_of_one_sampler_is_refused_by_the_other(tmp_path):
    sampler = make(write(tmp_path, CURRICULUM), "Hardest")
    with pytest.raises(DataError, match="saved by Tandem's own sampler .*resume without data.sampler_class"):
        sampler.load_state_dict(StatefulSampler(10, 4).state_dict())
    with pytest.raises(ValueError, match="saved by your sampler class 'Hardest'"):
        StatefulSampler(10, 4).load_state_dict(sampler.state_dict())
    with pytest.raises(DataError, match="had batch_size=4, now 2"):
        make(write(tmp_path, CURRICULUM), "Hardest", batch_size=2).load_state_dict(sampler.state_dict())


def test_the_data_config_is_the_data_section_read_only_with_verls_sampler_keys():
    cfg = DataConfig(seed=7, sampler_file="s.py", sampler_class="S")
    config = sampler_config(cfg)
    assert config.seed == 7 and config.get("train_batch_size") == cfg.train_batch_size
    assert config.sampler.class_path == "s.py" and config["sampler"]["class_name"] == "S"
    with pytest.raises(Exception, match="read-only"):
        config.seed = 1


# ---- errors: each names the key, the file and, where it is in the file, the line ---------------------


def test_a_file_that_fails_names_its_line(tmp_path):
    path = write(tmp_path, "import os\nx = 1 +\n")
    with pytest.raises(
        DataError, match=r"data.sampler_class='S' in data.sampler_file=.*SyntaxError.* line 2"
    ):
        make(path, "S")


def test_a_missing_class_lists_those_in_the_file(tmp_path):
    with pytest.raises(DataError, match=r"has no 'Hardes' \(classes in it: Hardest\)"):
        make(write(tmp_path, CURRICULUM), "Hardes")


def test_a_missing_file_and_a_missing_module_are_named(tmp_path):
    with pytest.raises(DataError, match=r"the file does not exist \(data.sampler_file is .*nowhere.py\)"):
        make(str(tmp_path / "nowhere.py"), "S")
    with pytest.raises(DataError, match="importing module 'no_such_pkg.samplers' failed"):
        make("pkg://no_such_pkg.samplers", "S")


def test_a_class_without_len_or_iter_is_refused(tmp_path):
    path = write(tmp_path, "class S:\n    def __init__(self, data_source, data_config):\n        pass\n")
    with pytest.raises(DataError, match=r"class 'S' \(.*my_sampler.py line 1\) has no __iter__ or __len__"):
        make(path, "S")


def test_a_constructor_that_raises_names_its_line(tmp_path):
    text = (
        "class S:\n    def __init__(self, data_source, data_config):\n        raise KeyError('difficulty')\n"
    )
    with pytest.raises(
        DataError,
        match=r"building it failed \(called as S\(data_source, data_config\)\): "
        r"KeyError: 'difficulty' \(line 3\)",
    ):
        make(write(tmp_path, text), "S")


def test_an_epoch_shorter_than_a_batch_is_refused(tmp_path):
    text = SEEDED.replace("return self.n\n", "return 3\n")
    with pytest.raises(DataError, match="an epoch of it yields 3 indices .*fewer than one batch of 4"):
        make(write(tmp_path, text), "Seeded")


def test_an_index_out_of_range_is_named(tmp_path):
    text = SEEDED.replace("return iter(order)", "return iter([o + 5 for o in order])")
    sampler = make(write(tmp_path, text), "Seeded")
    with pytest.raises(DataError, match=r"its iterator yielded 1[0-4]; .*ints in \[0, 10\)"):
        draw(sampler, 3)


def test_an_update_that_raises_names_its_line(tmp_path):
    text = CURRICULUM.replace(
        "        rows = [int(i)", "        raise ValueError('no scores')\n        rows = [int(i)"
    )
    line = text.splitlines().index("        raise ValueError('no scores')") + 1
    sampler = make(write(tmp_path, text), "Hardest")
    with pytest.raises(DataError, match=rf"update\(batch\) failed: ValueError: no scores \(line {line}\)"):
        sampler.update(sampler_batch(1, scored(1, [0], [1.0])))
