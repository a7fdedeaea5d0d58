"""verl-format fixtures for multi-turn GSM8K, to reuse: the tool and interaction YAML files (verl's
format, read by Tandem as they are) and rows shaped as verl's examples/data_preprocess scripts write
them (gsm8k_multiturn_w_tool.py, gsm8k_multiturn_w_interaction.py, gsm8k_tool_agent_loop.py).

From another test folder: ``from tools.verl_rows import ...`` (tests/ is on sys.path).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from tandem.models.tiny import IM_END
from tandem.tools import build_toolset

FILES = Path(__file__).parent / "verl_files"
TOOL_YAML = FILES / "gsm8k_tool_config.yaml"
INTERACTION_YAML = FILES / "gsm8k_interaction_config.yaml"
TOOL_NAME = "calc_gsm8k_reward"
DATA_SOURCE = "openai/gsm8k"

# (question, answer) pairs small enough for a tiny model's prompt budget
PROBLEMS = [
    ("1+2", "3"),
    ("2+2", "4"),
    ("3+4", "7"),
    ("5+1", "6"),
    ("2*3", "6"),
    ("9-1", "8"),
    ("4+4", "8"),
    ("7-2", "5"),
]


def gsm8k_row(
    question: str,
    answer: str,
    index: int,
    *,
    split: str = "train",
    agent_name: str | None = "tool_agent",
    interaction: bool = True,
) -> dict[str, Any]:
    """One row with verl's multi-turn fields: tools_kwargs (create_kwargs.ground_truth of the GSM8K
    tool), need_tools_kwargs, interaction_kwargs (name gsm8k), ability, and agent_name."""
    extra_info: dict[str, Any] = {
        "split": split,
        "index": index,
        "answer": f"{question} = {answer}\n#### {answer}",
        "question": question,
        "need_tools_kwargs": True,
        "tools_kwargs": {TOOL_NAME: {"create_kwargs": {"ground_truth": answer}}},
    }
    if interaction:
        extra_info["interaction_kwargs"] = {"name": "gsm8k", "query": question, "ground_truth": answer}
    row = {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": extra_info,
    }
    if agent_name is not None:
        row["agent_name"] = agent_name
    return row


def gsm8k_rows(n: int = len(PROBLEMS), **kwargs: Any) -> list[dict[str, Any]]:
    """`n` rows over `PROBLEMS` (repeated as needed)."""
    return [gsm8k_row(*PROBLEMS[i % len(PROBLEMS)], i, **kwargs) for i in range(n)]


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    """The rows as a parquet file, as verl's preprocessing writes them."""
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# the one answer fit_to_call teaches a tiny model: a call of verl's GSM8K tool
CALL = f'<tool_call>{{"name": "{TOOL_NAME}", "arguments": {{"answer": "3"}}}}</tool_call>'


def fit_to_call(
    folder: Path,
    prompts: list[list[dict]],
    calls: list[str] | None = None,
    schemas: list[dict] | None = None,
) -> None:
    """Train the model in `folder` until it answers prompt i with ``calls[i]`` (default: CALL for every
    prompt), then save it there. ``schemas``: the tools the prompts are rendered with, as the run renders
    them (default: those of verl's GSM8K tool YAML)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    schemas = schemas if schemas is not None else build_toolset([], TOOL_YAML).schemas()
    calls = calls if calls is not None else [CALL] * len(prompts)
    end = [tokenizer.convert_tokens_to_ids(IM_END)]
    rows, starts = [], []
    for messages, call in zip(prompts, calls, strict=True):
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, tools=schemas
        )
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        rows.append(prompt + tokenizer(call, add_special_tokens=False)["input_ids"] + end)
        starts.append(len(prompt))
    width = max(map(len, rows))
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    labels = ids.clone()
    for i, (row, start) in enumerate(zip(rows, starts)):
        labels[i, :start] = -100
        labels[i, len(row) :] = -100
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(300):  # ~140 steps to a loss of 0.01 (right padding: no position reads a pad)
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.01:
            break
    assert loss.item() < 0.05, f"the tiny model did not learn the call (loss {loss.item():.3f})"
    model.save_pretrained(folder)
