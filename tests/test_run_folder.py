"""The run folder (tandem/run_folder.py) as the trainer writes it and `tandem view` reads it: a folder written with
the trainer's own writers (config.yaml as the loop writes it, the jsonl tracker, the sample dumps) and read back
with view/runs.py, field by field; and the page's script reads only fields the run folder defines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import torch

from tandem.batch import Batch
from tandem.config.loader import config_to_yaml
from tandem.config.schema import TandemConfig
from tandem.models.tiny import build_tokenizer
from tandem.rollout import PROMPT_INDEX
from tandem.rollout.agent import AGENT_FINISH_KEY, TRAJECTORY_KEY
from tandem.run_folder import (
    CONFIG_FILE,
    DUMP_KINDS,
    SAMPLE_FIELDS,
    SFT_METRIC,
    STEP,
    TOOL_CALL_FIELDS,
    TURN_FIELDS,
    dump_file,
    dump_step,
)
from tandem.trainer.dumps import SampleDumps, sample_rows
from tandem.trainer.tracking import Tracker
from tandem.view.runs import open_runs

TOKENIZER = build_tokenizer()
PAGE_SCRIPT = Path(__file__).resolve().parents[1] / "src" / "tandem" / "view" / "page" / "app.js"


def ids(text: str) -> list[int]:
    return [4 + b for b in text.encode()]  # the tiny tokenizer: byte b is token 4 + b


def scored_batch() -> Batch:
    """Two scored samples with every field a dump row can hold: reward terms and a scorer's error, advantages,
    both log-probs, and a multi-turn trajectory with a tool call that timed out."""
    response_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    trajectory = {
        "num_turns": 3,
        "num_prompt_messages": 1,
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": "a",
                "tool_calls": [{"function": {"name": "py", "arguments": {}}}],
            },
            {"role": "tool", "content": "error: timed out"},
            {"role": "assistant", "content": "b"},
        ],
        "tool_call_errors": ["timeout"],
    }
    return Batch.from_dict(
        {
            "prompts": torch.tensor([[0, *ids("hi")], ids("xyz")]),
            "responses": torch.tensor([[*ids("ab"), 1, 0], ids("cdef")]),
            "response_mask": response_mask,
            "attention_mask": torch.cat([torch.tensor([[0, 1, 1], [1, 1, 1]]), response_mask], dim=1),
            "score": torch.tensor([1.0, 0.0]),
            "advantages": torch.tensor([[0.5, 0.5, 0.5, 0.0], [-1.0, -1.0, -1.0, -1.0]]),
            "rollout_log_probs": torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.1, -0.2, -0.3, -0.4]]),
            "old_log_probs": torch.tensor([[-1.1, -1.8, -0.5, 0.0], [-0.1, -0.2, -0.3, -0.8]]),
            PROMPT_INDEX: torch.tensor([0, 1]),
        },
        {
            "data_source": ["calc", "gsm8k"],
            "ground_truth": ["3", None],
            "uid": ["g0", "g1"],
            "reward_extra": [{"acc": np.float64(1.0)}, {"acc": 0.0, "reward_error": "boom"}],
            AGENT_FINISH_KEY: ["stop", "length"],
            TRAJECTORY_KEY: [trajectory, {"num_turns": 1, "messages": []}],
        },
    )


def test_the_view_reads_what_the_trainer_writes_field_by_field(tmp_path):
    run = tmp_path / "run"
    cfg = TandemConfig()
    cfg.data.max_response_length = 4
    cfg.trainer.rollout_data_dir = str(tmp_path / "elsewhere" / "rollouts")  # named by config.yaml alone
    cfg.trainer.validation_data_dir = str(run / "validation")
    dumps = SampleDumps(cfg, TOKENIZER)
    run.mkdir()
    (run / CONFIG_FILE).write_text(config_to_yaml(cfg))  # as trainer/base.py writes it
    with Tracker(["jsonl"], log_dir=run, project="p", experiment="e", progress=False) as tracker:
        tracker.log({"score/mean": 0.5, "actor/entropy": 1.25}, step=1)
        tracker.log({"score/mean": 0.75}, step=2)
    batch = scored_batch()
    dumps.train(2, batch)
    dumps.validation(0, [batch.exclude("advantages")])
    dumps.close()

    (view,) = open_runs([run])
    assert view.dump_dir("rollouts") == tmp_path / "elsewhere" / "rollouts"
    assert view.summary()["steps"] == {"rollouts": [2], "validation": [0]} and not view.is_sft()
    metrics = view.metrics()
    assert [(m[STEP], m["score/mean"], m.get("actor/entropy")) for m in metrics] == [
        (1, 0.5, 1.25),
        (2, 0.75, None),
    ]

    expected = json.loads(
        json.dumps(sample_rows(batch, 2, TOKENIZER, max_response_length=4, trainer_log_probs=True))
    )
    read = view.samples("rollouts", 2)
    assert len(read) == 2
    written = set()
    for got, want in zip(read, expected, strict=True):
        for field in (*SAMPLE_FIELDS, *want["reward_keys"]):
            assert got.get(field) == want.get(field), field
        assert set(got) - set(got["reward_keys"]) <= set(SAMPLE_FIELDS)  # no field the run folder lacks
        written |= set(got) - set(got["reward_keys"])
        for turn in got.get("turns", []):
            assert set(turn) <= set(TURN_FIELDS)
            for call in turn.get("tool_calls", []):
                assert set(call) <= set(TOOL_CALL_FIELDS)
    assert written == set(SAMPLE_FIELDS)  # every field the run folder defines is written
    assert read[0]["turns"][1] == {
        "role": "tool",
        "text": "error: timed out",
        "error": "timeout",
        "timed_out": True,
    }
    assert [r["advantage"] for r in view.samples("validation", 0)] == [None, None]

    with Tracker(["jsonl"], log_dir=run, project="p", experiment="e", progress=False) as tracker:
        tracker.log({SFT_METRIC: 2.5}, step=3)
    assert view.is_sft()  # the view tells an SFT run by the metric the SFT trainer logs


def test_dump_file_names_round_trip():
    assert dump_file("d", 12) == Path("d/12.jsonl") and dump_step(dump_file("d", 12)) == 12
    assert dump_step("d/12.jsonl.tmp") is None and dump_step("d/notes.jsonl") is None
    assert set(DUMP_KINDS.values()) == {"rollout_data_dir", "validation_data_dir"}
    assert all(hasattr(TandemConfig().trainer, key) for key in DUMP_KINDS.values())


def test_the_page_script_reads_only_the_run_folders_fields():
    """app.js names a sample `s` (or `x`), a turn `t` and a tool call `c`; the fields it reads of each, and the
    fields it lists by name, are the run folder's."""
    js = PAGE_SCRIPT.read_text()

    def read_of(*names: str) -> set[str]:
        return {f for n in names for f in re.findall(rf"(?<![\w.]){n}\.([A-Za-z_]+)", js)}

    sample_reads = read_of("s", "x")
    listed = set(re.findall(r'"([a-z_]+)"', re.search(r"const keys = \[(.*?)\];", js, re.S).group(1)))
    assert {
        "score",
        "input",
        "output",
        "turns",
    } <= sample_reads and "gts" in listed  # the patterns still match
    assert sample_reads <= set(SAMPLE_FIELDS)
    assert listed <= set(SAMPLE_FIELDS)
    assert read_of("t") == set(TURN_FIELDS)
    assert read_of("c") == set(TOOL_CALL_FIELDS)
    assert f'"{SFT_METRIC}"' in js and "r.step" in js
