from pathlib import Path

import pytest

from tandem.batch import Batch
from tandem.data.prompts import collate_prompts
from tandem.models.tiny import build_tokenizer, save_tiny

# Small enough that a generate call takes milliseconds on 2 CPU cores.
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}
PROMPTS = ["1+2=", "13+45=", "7*8-9+100="]  # different lengths: the batch is left-padded


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("rollout") / "model", **TINY)


def make_prompts(tokenizer, texts=PROMPTS) -> Batch:
    items = [
        {
            "input_ids": tokenizer(text)["input_ids"],
            "raw_prompt": [{"role": "user", "content": text}],
            "data_source": "arith",
            "ground_truth": str(i),
            "extra_info": {"i": i},
            "index": i,
        }
        for i, text in enumerate(texts)
    ]
    batch = collate_prompts(items, tokenizer.pad_token_id)
    batch.meta["step"] = 7
    return batch


@pytest.fixture
def prompts(tokenizer) -> Batch:
    return make_prompts(tokenizer)
