"""Reading dataset files and checking their rows: the shared ground of the prompt and SFT datasets.

Files are parquet or jsonl in the verl-style row schema (see :mod:`tandem.data.synthetic`).
Every problem is a :class:`DataError` that names the file, the row and the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

CHAT_TEMPLATE_MODES = ("auto", "plain", "none")
FileList = str | Path | Sequence[str | Path]


class DataError(ValueError):
    """A dataset file or row is not what Tandem expects; the message says where and what to do."""


def as_paths(files: FileList) -> list[Path]:
    """One path or a list of them, each checked to exist and to be parquet or jsonl."""
    paths = [Path(files)] if isinstance(files, str | Path) else [Path(f) for f in files]
    if not paths:
        raise DataError("no data files given: pass at least one .parquet or .jsonl file")
    for path in paths:
        if path.suffix not in (".parquet", ".jsonl"):
            raise DataError(f"{path}: unsupported file type {path.suffix!r}; use .parquet or .jsonl")
        if not path.is_file():
            raise DataError(f"{path}: no such file; check the data file paths in your config")
    return paths


def iter_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """Yield ``(location, row)`` for every row of one file; location reads ``"<file> row <i>"``."""
    if path.suffix == ".parquet":
        for i, row in enumerate(pq.read_table(path).to_pylist()):
            yield f"{path} row {i}", row
        return
    with path.open() as f:
        i = 0
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            location = f"{path} row {i} (line {line_number})"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(
                    f"{location}: not valid JSON ({e.msg}); each line must be one JSON object"
                ) from e
            yield location, row
            i += 1


def check_row(location: str, row: Any) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise DataError(f"{location}: a row must be a JSON object (a dict), got {type(row).__name__}")
    return row


def require(location: str, row: dict[str, Any], key: str, kind: type, hint: str = "") -> Any:
    """``row[key]``, which must be present, not null and an instance of ``kind``."""
    if key not in row or row[key] is None:
        present = ", ".join(sorted(row)) or "none"
        raise DataError(f"{location}: missing field {key!r} (fields present: {present}).{hint}")
    value = row[key]
    if not isinstance(value, kind):
        raise DataError(
            f"{location}: field {key!r} must be a {kind.__name__}, got {type(value).__name__} ({value!r:.60}).{hint}"
        )
    return value


def optional_dict(location: str, row: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = row.get(key)
    if value is not None and not isinstance(value, dict):
        raise DataError(
            f"{location}: field {key!r} must be an object (dict) when given, got {type(value).__name__}"
        )
    return value


def check_prompt(location: str, prompt: Any, key: str, mode: str) -> list[dict[str, str]] | str:
    """A prompt is a non-empty list of ``{"role": str, "content": str}`` messages, or with
    ``chat_template="none"`` one plain string used as it is."""
    if mode == "none":
        if not isinstance(prompt, str):
            raise DataError(
                f"{location}: field {key!r} must be a plain string with data.chat_template=none, "
                f"got {type(prompt).__name__}; use chat_template=auto or plain for chat messages"
            )
        return prompt
    shape = "a list of {'role': ..., 'content': ...} messages"
    if isinstance(prompt, str):
        raise DataError(
            f"{location}: field {key!r} must be {shape}, got a string; wrap it as "
            f"[{{'role': 'user', 'content': ...}}] or set data.chat_template=none to use text as it is"
        )
    if not isinstance(prompt, list) or not prompt:
        what = "an empty list" if isinstance(prompt, list) else type(prompt).__name__
        raise DataError(f"{location}: field {key!r} must be {shape}, got {what}")
    for j, message in enumerate(prompt):
        if not isinstance(message, dict):
            raise DataError(
                f"{location}: field {key!r} message {j} must be a dict, got {type(message).__name__}"
            )
        for part in ("role", "content"):
            if not isinstance(message.get(part), str):
                got = "nothing" if message.get(part) is None else type(message[part]).__name__
                raise DataError(
                    f"{location}: field {key!r} message {j} needs a string {part!r}, got {got}; "
                    f"each message is {{'role': ..., 'content': ...}}"
                )
    return prompt


def check_mode(chat_template: str) -> None:
    if chat_template not in CHAT_TEMPLATE_MODES:
        raise ValueError(f"data.chat_template must be one of {CHAT_TEMPLATE_MODES}, got {chat_template!r}")


def resolve_mode(chat_template: str, tokenizer: Any) -> str:
    """``auto`` becomes ``chat`` when the tokenizer has a chat template, else ``plain``."""
    check_mode(chat_template)
    if chat_template == "auto":
        return "chat" if getattr(tokenizer, "chat_template", None) else "plain"
    return chat_template


def render_prompt(prompt: list[dict[str, str]] | str, tokenizer: Any, mode: str) -> str:
    """The prompt as text, ready for the model to continue with its answer.

    ``chat``: the tokenizer's chat template with the generation prompt; ``plain``: the message
    contents joined by newlines; ``none``: the string as it is.
    """
    if mode == "none":
        return prompt  # type: ignore[return-value]
    if mode == "plain":
        return "\n".join(message["content"] for message in prompt)
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


def tokenize(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, without any special tokens the tokenizer would add on its own."""
    if not texts:
        return []
    return tokenizer(texts, add_special_tokens=False)["input_ids"]
