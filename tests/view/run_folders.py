"""Run folders written by hand in the dump format of docs/run-folder.md, for the `tandem view` tests:
config.yaml naming the dump folders, metrics.jsonl, rollouts/<step>.jsonl and validation/<step>.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

CHAT = "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"


def metrics_rows(steps: int = 4, offset: float = 0.0) -> list[dict]:
    rows = [{"step": 0, "val/acc": 0.25 + offset, "val/score_mean": 0.25 + offset}]
    for step in range(1, steps + 1):
        rows.append(
            {
                "step": step,
                "score/mean": round(0.1 * step + offset, 4),
                "response_length/mean": 10.0 + step,
                "actor/entropy": round(1.5 - 0.1 * step, 4),
                "actor/kl_loss": 0.001 * step,
                "rollout_mismatch/kl": 0.0002 * step,
                "timing_s/step": 2.5,
                "time": "2026-11-28T00:00:00+00:00",
            }
        )
        if step % 2 == 0:
            rows[-1].update({"val/acc": 0.25 + 0.125 * step + offset, "val/score_mean": 0.5})
    return rows


def addition_sample(step: int, index: int, validation: bool = False) -> dict:
    """One single-turn sample: the question `index + step`, right every other sample, truncated every
    fourth, data source alternating between two names."""
    a, b = index, step
    right = index % 2 == 0
    answer = str(a + b) if right else str(a + b + 1)
    tokens = [answer, "<|im_end|>"]
    sample = {
        "input": CHAT.format(q=f"What is {a} + {b}?"),
        "output": f"{answer}<|im_end|>",
        "gts": str(a + b),
        "score": 1.0 if right else 0.0,
        "step": step,
        "acc": 1.0 if right else 0.0,
        "format": 0.5,
        "reward_keys": ["acc", "format"],
        "data_source": "addition" if index % 3 else "addition_hard",
        "uid": f"u{index // 2}",
        "sample": index,
        "prompt_length": 14,
        "response_length": 2 + index,
        "finish_reason": "length" if index % 4 == 3 else "stop",
        "truncated": index % 4 == 3,
        "advantage": None if validation else (0.5 if right else -0.5),
        "rollout_mismatch": None if validation else 0.001 * (index + 1),
    }
    if not validation:
        sample.update(tokens=tokens, token_mismatch=[round(0.002 * (index + 1), 4), -0.0005])
    return sample


def tool_sample(step: int, index: int) -> dict:
    """A two-call calculator trajectory; sample 1's second call fails."""
    failed = index == 1
    turns = [
        {
            "role": "assistant",
            "text": "<tool_call>",
            "tool_calls": [{"name": "calculator", "arguments": '{"expression": "6*7"}'}],
        },
        {"role": "tool", "text": "42", "error": None, "timed_out": False},
        {
            "role": "assistant",
            "text": "",
            "tool_calls": [{"name": "calculator", "arguments": '{"expression": "42/0"}'}],
        },
        {
            "role": "tool",
            "text": "error: division by zero" if failed else "inf",
            "error": "ZeroDivisionError: division by zero" if failed else None,
            "timed_out": False,
        },
        {"role": "assistant", "text": "The answer is 42.", "tool_calls": []},
    ]
    sample = addition_sample(step, index)
    sample.update(
        input=CHAT.format(q="What is 6 * 7? Use the calculator."),
        output="".join(t["text"] for t in turns),
        data_source="tool_multiply",
        num_turns=len(turns),
        turns=turns,
        tokens=[t["text"] for t in turns if t["text"]],
        token_mismatch=[round(0.01 * n * (-1) ** n, 4) for n, t in enumerate(turns) if t["text"]],
    )
    return sample


def write_jsonl(path: Path, rows: list[dict], half_line: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + half_line)


def write_run(
    folder: Path, steps: int = 4, samples: int = 8, offset: float = 0.0, tools: bool = False
) -> Path:
    """A run folder of `steps` training steps with `samples` samples each, validation at steps 0, 2, 4,
    ...; metrics.jsonl ends in a half-written line, as a file a run is writing can."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "trainer": {
            "rollout_data_dir": str(folder / "rollouts"),
            "validation_data_dir": str(folder / "validation"),
        }
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    write_jsonl(folder / "metrics.jsonl", metrics_rows(steps, offset), half_line='{"step": 99, "score/m')
    make = tool_sample if tools else addition_sample
    for step in range(1, steps + 1):
        write_jsonl(folder / "rollouts" / f"{step}.jsonl", [make(step, i) for i in range(samples)])
    for step in range(0, steps + 1, 2):
        write_jsonl(
            folder / "validation" / f"{step}.jsonl",
            [
                addition_sample(step, i, validation=True) | {"input": CHAT.format(q=f"val question {i}")}
                for i in range(3)
            ],
        )
    return folder
