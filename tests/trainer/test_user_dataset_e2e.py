"""Two training steps and a validation on the rows of a user's Dataset class (verl's data.custom_cls), in
process on 1 rank: the prompts the rollout generated from are exactly the class's rows, and the class was
built on the configured files with verl's arguments."""

from __future__ import annotations

import json

import pytest

from tandem.models.tiny import build_tokenizer
from tandem.rewards.registry import UnknownDataSourceError
from tandem.trainer import RLTrainer

from .trainer_helpers import make_assets, run_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# Reads the addition parquet it is given (to prove the files reach it) and makes its own four rows instead, in
# verl's item shape (raw_prompt, reward_model.ground_truth, extra_info, a tensor Tandem does not read)
USER_CLASS = """\
from pathlib import Path

import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset

PAIRS = [(1, 2), (3, 4), (5, 1), (2, 2)]


class SumsOfPairs(Dataset):
    def __init__(self, data_files, tokenizer, config, processor=None, max_samples=-1):
        self.rows_in_files = sum(pq.read_metadata(path).num_rows for path in data_files)
        self.split = Path(data_files[0]).stem  # "train" or "val"
        assert config.max_prompt_length == 32 and config.custom_cls.name == "SumsOfPairs"

    def __len__(self):
        return len(PAIRS)

    def __getitem__(self, i):
        a, b = PAIRS[i]
        offset = 5 if self.split == "val" else 0  # the validation rows differ from the training rows
        return {
            "raw_prompt": [{"role": "user", "content": f"{a + offset}+{b}="}],
            "data_source": "addition",
            "reward_model": {"ground_truth": str(a + offset + b)},
            "extra_info": {"rows_in_files": self.rows_in_files, "index": 100 + i},
            "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
        }
"""


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("assets"))


def test_training_and_validation_prompts_are_the_user_class_rows(assets, tmp_path):
    user_file = tmp_path / "sums.py"
    user_file.write_text(USER_CLASS)
    rollouts, validations = tmp_path / "rollouts", tmp_path / "validations"
    cfg = run_config(
        assets,
        tmp_path,
        "grpo",
        "trainer.backend=inprocess",
        "trainer.workers_per_node=1",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=true",
        "data.train_batch_size=2",
        "data.shuffle=false",
        "rollout.n=2",
        "rollout.engine=hf",  # the prompts are what is checked: the quicker engine to start
        "actor.ppo_mini_batch_size=2",
        f"data.custom_dataset_file={user_file}",
        "data.custom_dataset_class=SumsOfPairs",
        f"trainer.rollout_data_dir={rollouts}",
        f"trainer.validation_data_dir={validations}",
    )
    trainer = RLTrainer(cfg)
    # the class was built on each split's file: 16 training rows, 8 validation rows read by it
    assert {trainer.train_data[i]["extra_info"]["rows_in_files"] for i in range(4)} == {16}
    assert {trainer.val_data[i]["extra_info"]["rows_in_files"] for i in range(4)} == {8}
    history = trainer.fit()
    assert [m["step"] for m in history] == [0, 1, 2]

    tokenizer = build_tokenizer()

    def rendered(question: str) -> str:
        messages = [{"role": "user", "content": question}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def dumped(folder, step):
        rows = [json.loads(line) for line in (folder / f"{step}.jsonl").read_text().splitlines()]
        return [(row["input"], row["gts"], row["data_source"]) for row in rows]

    # no shuffle: step 1 takes the class's items 0 and 1, step 2 items 2 and 3; each prompt's 2 samples
    train = [("1+2=", "3"), ("3+4=", "7"), ("5+1=", "6"), ("2+2=", "4")]
    expected = [(rendered(q), gt, "addition") for q, gt in train for _ in range(2)]
    assert dumped(rollouts, 1) + dumped(rollouts, 2) == expected
    val = [("6+2=", "8"), ("8+4=", "12"), ("10+1=", "11"), ("7+2=", "9")]
    assert sorted(dumped(validations, 0)) == sorted((rendered(q), gt, "addition") for q, gt in val)


def test_an_item_whose_data_source_has_no_scorer_is_named_before_any_worker_starts(assets, tmp_path):
    user_file = tmp_path / "unscored.py"
    user_file.write_text(
        "from torch.utils.data import Dataset\n\n\nclass Unscored(Dataset):\n"
        "    def __init__(self, data_files, tokenizer, config, processor=None):\n        pass\n\n"
        "    def __len__(self):\n        return 4\n\n"
        "    def __getitem__(self, i):\n"
        "        return {'raw_prompt': [{'role': 'user', 'content': '1+1='}], 'reward_model': {'ground_truth': '2'},\n"
        "                'data_source': 'no_such_task' if i == 2 else 'addition'}\n"
    )
    cfg = run_config(
        assets,
        tmp_path,
        "grpo",
        "trainer.backend=inprocess",
        "trainer.workers_per_node=1",
        f"data.custom_dataset_file={user_file}",
        "data.custom_dataset_class=Unscored",
    )
    with pytest.raises(UnknownDataSourceError) as error:
        RLTrainer(cfg)
    assert str(error.value).startswith(
        f"data.train_files: item 2 of Unscored ({user_file}): no reward scorer for data_source 'no_such_task'"
    )
