"""Sample dumps (tandem/trainer/dumps.py) on a hand-made batch: fields, reward terms, mismatch means,
multi-turn turns, a failed write, resume."""

import errno
import json
import logging

import numpy as np
import pytest
import torch

from tandem.batch import Batch
from tandem.config.errors import ConfigError
from tandem.config.schema import TandemConfig
from tandem.models.tiny import build_tokenizer
from tandem.rollout import PROMPT_INDEX
from tandem.trainer.dumps import SampleDumps, drop_steps_after, first_samples, sample_rows, turns_of

TOKENIZER = build_tokenizer()
PAD, EOS = 0, 1


def ids(text: str) -> list[int]:
    return [4 + b for b in text.encode()]  # the tiny tokenizer: byte b is token 4 + b


def hand_batch() -> Batch:
    """Two samples: prompt 'hi' (left-padded) answered 'ab' + EOS, prompt 'xyz' answered 'cdef' (the whole
    budget of 4 tokens: truncated)."""
    prompts = torch.tensor([[PAD, *ids("hi")], ids("xyz")])
    responses = torch.tensor([[*ids("ab"), EOS, PAD], ids("cdef")])
    response_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    attention_mask = torch.cat([torch.tensor([[0, 1, 1], [1, 1, 1]]), response_mask], dim=1)
    return Batch.from_dict(
        {
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "attention_mask": attention_mask,
            "score": torch.tensor([1.1, 0.0]),
            "advantages": torch.tensor([[0.5, 0.5, 0.5, 9.0], [-1.0, -1.0, -1.0, -1.0]]),
            "rollout_log_probs": torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.1, -0.2, -0.3, -0.4]]),
            "old_log_probs": torch.tensor([[-1.1, -1.8, -0.5, 5.0], [-0.1, -0.2, -0.3, -0.8]]),
        },
        {
            "data_source": ["calc", "gsm8k"],
            "ground_truth": ["3", None],
            "uid": ["1.0.0", "1.0.1"],
            "reward_extra": [
                {"acc": np.float64(1.0), "format": 0.1, "pred": "ab"},
                {"acc": np.float64(np.nan), "format": 0.0, "pred": "cdef", "reward_error": "boom"},
            ],
        },
    )


def test_rows_carry_texts_rewards_advantage_and_mismatch():
    rows = sample_rows(hand_batch(), 7, TOKENIZER, max_response_length=4, trainer_log_probs=True)
    first, second = rows
    assert first["input"] == "hi" and first["output"] == "ab<|endoftext|>"  # special tokens kept
    assert second["input"] == "xyz" and second["output"] == "cdef"
    assert (first["gts"], first["score"], first["step"], first["sample"]) == ("3", pytest.approx(1.1), 7, 0)
    assert (first["acc"], first["format"], first["pred"]) == (1.0, 0.1, "ab")
    assert first["reward_keys"] == ["acc", "format", "pred"] and "reward_error" not in first
    assert second["acc"] is None and second["reward_error"] == "boom"  # NaN is null in JSON
    assert (first["data_source"], first["uid"]) == ("calc", "1.0.0")
    assert (first["prompt_length"], first["response_length"]) == (2, 3)
    assert (second["prompt_length"], second["response_length"]) == (3, 4)
    assert (first["finish_reason"], first["truncated"]) == ("stop", False)
    assert (second["finish_reason"], second["truncated"]) == ("length", True)
    assert first["advantage"] == pytest.approx(0.5) and second["advantage"] == pytest.approx(-1.0)
    # |(-1.0) - (-1.1)| + |(-2.0) - (-1.8)| + 0 over 3 tokens; the padded 4th is not a token
    assert first["rollout_mismatch"] == pytest.approx(0.3 / 3, abs=1e-6)
    assert second["rollout_mismatch"] == pytest.approx(0.4 / 4, abs=1e-6)
    assert first["tokens"] == ["a", "b", "<|endoftext|>"]
    assert first["token_mismatch"] == [0.1, -0.2, 0.0]
    json.dumps(rows, allow_nan=False)  # every value is plain JSON


def test_a_response_that_stops_exactly_at_the_length_budget_finished_and_was_not_cut():
    eos = frozenset([TOKENIZER.eos_token_id])
    first = sample_rows(hand_batch(), 7, TOKENIZER, max_response_length=3, trainer_log_probs=True)[0]
    assert (first["finish_reason"], first["truncated"]) == ("length", True)  # no stop ids known: cut
    rows = sample_rows(
        hand_batch(), 7, TOKENIZER, max_response_length=3, trainer_log_probs=True, stop_ids=eos
    )
    assert (rows[0]["finish_reason"], rows[0]["truncated"]) == ("stop", False)  # "ab<|endoftext|>": 3 of 3
    assert (rows[1]["finish_reason"], rows[1]["truncated"]) == ("length", True)  # "cdef": no stop id


def test_rows_without_trainer_log_probs_have_no_mismatch():
    batch = hand_batch().exclude("advantages")  # a validation batch
    rows = sample_rows(batch, 0, TOKENIZER, max_response_length=8, trainer_log_probs=False)
    assert [r["rollout_mismatch"] for r in rows] == [None, None]
    assert [r["advantage"] for r in rows] == [None, None]
    assert "tokens" not in rows[0] and "token_mismatch" not in rows[0]
    assert [r["truncated"] for r in rows] == [False, False]  # a budget of 8 tokens


def test_turns_show_tool_calls_observations_errors_and_timeouts():
    trajectory = {
        "num_turns": 3,
        "num_prompt_messages": 1,
        "messages": [
            {"role": "user", "content": "1+2?"},
            {
                "role": "assistant",
                "content": "let me add",
                "tool_calls": [
                    {"type": "function", "function": {"name": "calc", "arguments": '{"e": "1+2"}'}}
                ],
            },
            {"role": "tool", "content": "3", "name": "calc"},
            {
                "role": "assistant",
                "content": "slow",
                "tool_calls": [{"function": {"name": "py", "arguments": {}}}],
            },
            {"role": "tool", "content": "error: timed out", "name": "py"},
            {"role": "assistant", "content": "3"},
        ],
        "tool_call_errors": [None, "timeout"],
    }
    assert turns_of(trajectory) == [
        {
            "role": "assistant",
            "text": "let me add",
            "tool_calls": [{"name": "calc", "arguments": '{"e": "1+2"}'}],
        },
        {"role": "tool", "text": "3", "error": None, "timed_out": False},
        {"role": "assistant", "text": "slow", "tool_calls": [{"name": "py", "arguments": "{}"}]},
        {"role": "tool", "text": "error: timed out", "error": "timeout", "timed_out": True},
        {"role": "assistant", "text": "3", "tool_calls": []},
    ]


def test_first_samples_are_the_first_sample_of_the_first_prompts():
    batch = Batch.from_dict({PROMPT_INDEX: torch.tensor([0, 0, 1, 1, 2, 2])})
    assert first_samples(batch, 2) == [0, 2]
    assert first_samples(batch, 10) == [0, 2, 4]
    assert first_samples(batch, 0) == []


def dumps_for(tmp_path, **trainer) -> SampleDumps:
    cfg = TandemConfig()
    cfg.data.max_response_length = 4
    for key, value in trainer.items():
        setattr(cfg.trainer, key, value)
    return SampleDumps(cfg, TOKENIZER)


def test_train_and_validation_dumps_are_written_whole(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dumps = dumps_for(tmp_path, rollout_data_dir="rollouts", validation_data_dir="val", log_val_generations=1)
    assert dumps.train_dir == tmp_path / "rollouts"  # relative to the current directory, made absolute
    timing = dumps.train(3, hand_batch())
    assert list(timing) == ["timing_s/dump"]
    val = hand_batch().exclude("advantages", "old_log_probs")
    val[PROMPT_INDEX] = torch.tensor([0, 1])
    # two validation chunks, prompts of 2 and 3 tokens
    dumps.validation(3, [val.slice(0, 1), val.slice(1, 2)])
    dumps.close()
    lines = (tmp_path / "rollouts" / "3.jsonl").read_text().splitlines()
    assert [json.loads(line)["output"] for line in lines] == ["ab<|endoftext|>", "cdef"]
    val_rows = [json.loads(line) for line in (tmp_path / "val" / "3.jsonl").read_text().splitlines()]
    assert [(r["input"], r["advantage"], r["rollout_mismatch"]) for r in val_rows] == [
        ("hi", None, None),
        ("xyz", None, None),
    ]
    generations = dumps.take_generations()
    assert [(g["input"], g["output"], g["step"]) for g in generations] == [("hi", "ab<|endoftext|>", 3)]
    assert dumps.take_generations() == []
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == ["3.jsonl"]  # no temp file left


def test_a_failed_write_is_one_warning_and_training_goes_on(tmp_path, caplog):
    blocked = tmp_path / "not_a_folder"
    blocked.write_text("a file where the dump folder should be")
    dumps = dumps_for(tmp_path, rollout_data_dir=str(blocked))
    with caplog.at_level(logging.WARNING, logger="tandem.trainer.dumps"):
        for step in (1, 2, 3):
            dumps.train(step, hand_batch())
        dumps.close()
    warnings = [r.getMessage() for r in caplog.records]
    assert (
        len(warnings) == 2 and str(blocked / "1.jsonl") in warnings[0] and "training goes on" in warnings[0]
    )
    assert warnings[1] == f"2 more sample dumps in {blocked} could not be written (see the first warning)"


def test_a_full_disk_leaves_no_half_written_dump(tmp_path, monkeypatch, caplog):
    """The disk fills while a step's file is half written (ENOSPC on its second line): the temp file goes, the
    folder holds the whole files written before, and the next step's dump is written once space is back."""
    dumps = dumps_for(tmp_path, rollout_data_dir=str(tmp_path / "rollouts"))
    dumps.train(1, hand_batch())
    dumps.close()
    real_dumps, calls = json.dumps, []

    def fills_up(row, **kwargs):
        calls.append(row)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_dumps(row, **kwargs)

    monkeypatch.setattr("tandem.trainer.dumps.json.dumps", fills_up)
    with caplog.at_level(logging.WARNING, logger="tandem.trainer.dumps"):
        dumps.train(2, hand_batch())
        dumps.close()
        dumps.train(3, hand_batch())  # space again
        dumps.close()
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == [
        "1.jsonl",
        "3.jsonl",
    ]  # no 2, no .tmp
    assert len((tmp_path / "rollouts" / "3.jsonl").read_text().splitlines()) == 2
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "2.jsonl (OSError: [Errno 28] No space left on device)" in warning


def test_resume_deletes_the_dumps_after_the_checkpoint(tmp_path):
    for step in range(5):
        (tmp_path / f"{step}.jsonl").write_text("{}\n")
    (tmp_path / "notes.jsonl").write_text("mine\n")
    drop_steps_after(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.jsonl", "1.jsonl", "2.jsonl", "notes.jsonl"]
    dumps = dumps_for(tmp_path, rollout_data_dir=str(tmp_path))
    dumps.resume(-1)  # a fresh run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.jsonl"]


def test_negative_log_val_generations_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="trainer.log_val_generations=-1"):
        dumps_for(tmp_path, log_val_generations=-1)
