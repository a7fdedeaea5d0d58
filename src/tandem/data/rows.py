"""Reading dataset files and checking their rows: the shared ground of the prompt and SFT datasets.

Files are parquet or jsonl in the verl-style row schema (see :mod:`tandem.data.synthetic`).
Every problem is a :class:`DataError` that names the file, the row and the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tandem.models.chat_template import render_chat

CHAT_TEMPLATE_MODES = ("auto", "plain", "none")
DATA_SUFFIXES = (".parquet", ".jsonl")
FileList = str | Path | Sequence[str | Path]


class DataError(ValueError):
    """A dataset file or row is not what Tandem expects; the message says where and what to do."""


def as_paths(files: FileList) -> list[Path]:
    """One path or a list of them, each checked to be an existing parquet or jsonl file."""
    paths = [Path(files)] if isinstance(files, str | Path) else [Path(f) for f in files]
    if not paths:
        raise DataError("no data files given: pass at least one .parquet or .jsonl file")
    for path in paths:
        if path.is_dir():
            inside = sorted(p.name for p in path.iterdir() if p.suffix.lower() in DATA_SUFFIXES)
            found = (
                f"data files in it: {', '.join(inside[:5])}"
                if inside
                else "no .parquet or .jsonl files in it"
            )
            raise DataError(
                f"{path}: is a directory ({found}); list the data files themselves in your config"
            )
        if path.suffix.lower() not in DATA_SUFFIXES:
            kind = repr(path.suffix) if path.suffix else "(no suffix)"
            raise DataError(
                f"{path}: unsupported file type {kind}; convert it to .parquet or "
                f".jsonl rows with the fields prompt (chat messages) and data_source"
            )
        if not path.exists():
            raise DataError(f"{path}: no such file; check the data file paths in your config")
    return paths


def iter_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """Yield ``(location, row)`` for every row of one file; location reads ``"<file> row <i>"``
    (``"... (line <n>)"`` in jsonl, where blank lines are skipped). A file with no rows is an error."""
    rows = _parquet_rows(path) if path.suffix.lower() == ".parquet" else _jsonl_rows(path)
    empty = True
    for item in rows:
        empty = False
        yield item
    if empty:
        raise DataError(
            f"{path}: the file holds no rows; check that it was written completely, or leave it out"
        )


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise DataError(
            f"{path}: not a readable parquet file ({e}); check that it was written completely"
        ) from e
    for i, row in enumerate(table.to_pylist()):
        yield f"{path} row {i}", row


def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open("rb") as f:
        if f.read(4) == b"PAR1":  # parquet's magic bytes
            raise DataError(f"{path}: this is a parquet file, not jsonl; name it .parquet")
        f.seek(0)
        i = 0
        for line_number, raw in enumerate(f, start=1):
            location = f"{path} row {i} (line {line_number})"
            try:
                # utf-8-sig: a byte-order mark (written by some Windows editors) is dropped.
                line = raw.decode("utf-8-sig" if line_number == 1 else "utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                fix = (
                    "it is a parquet file: name it .parquet"
                    if raw.startswith(b"PAR1")
                    else "save the file as UTF-8"
                )
                raise DataError(
                    f"{location}: not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1}); {fix}"
                ) from e
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                hint = (
                    "; the file looks like one JSON array: write one object per line instead"
                    if line_number == 1 and line.strip() == "["
                    else "; each line must be one JSON object"
                )
                raise DataError(f"{location}: not valid JSON ({e.msg} at column {e.pos + 1}){hint}") from e
            yield location, row
            i += 1


def check_row(location: str, row: Any) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise DataError(
            f"{location}: a row must be a JSON object (a dict) of fields, got {type(row).__name__}; "
            f"a .jsonl file holds one object per line"
        )
    return row


def require(location: str, row: dict[str, Any], key: str, kind: type, hint: str = "") -> Any:
    """``row[key]``, which must be present, not null and an instance of ``kind``; ``hint`` is added
    to the message when the field is missing (a field present with value null is "null", not missing)."""
    if key not in row:
        present = ", ".join(sorted(row)) or "none"
        raise DataError(f"{location}: missing field {key!r} (fields present: {present}).{hint}")
    if row[key] is None:
        raise DataError(f"{location}: field {key!r} is null; give it a value in every row, or drop the row")
    value = row[key]
    if not isinstance(value, kind):
        raise DataError(
            f"{location}: field {key!r} must be a {kind.__name__}, got {type(value).__name__} ({value!r:.60}); "
            f"write it as a {kind.__name__} in every row"
        )
    return value


def optional_dict(location: str, row: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = row.get(key)
    if value is not None and not isinstance(value, dict):
        raise DataError(
            f"{location}: field {key!r} must be an object (dict) when given, got {type(value).__name__} "
            f"({value!r:.60}); write it as {{...}} or leave the field out"
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
        what = (
            "an empty list; give it at least one message"
            if isinstance(prompt, list)
            else type(prompt).__name__
        )
        raise DataError(f"{location}: field {key!r} must be {shape}, got {what}")
    for j, message in enumerate(prompt):
        if not isinstance(message, dict):
            raise DataError(
                f"{location}: field {key!r} message {j} must be a dict, got {type(message).__name__}"
            )
        for part in ("role", "content"):
            if not isinstance(message.get(part), str):
                got = (
                    "nothing (no such key)"
                    if part not in message
                    else "null"
                    if message[part] is None
                    else type(message[part]).__name__
                )
                raise DataError(
                    f"{location}: field {key!r} message {j} needs a string {part!r}, got {got}; "
                    f"each message is {{'role': ..., 'content': ...}}"
                )
    return prompt


def check_mode(chat_template: str) -> None:
    if chat_template not in CHAT_TEMPLATE_MODES:
        raise ValueError(f"data.chat_template must be one of {CHAT_TEMPLATE_MODES}, got {chat_template!r}")


def resolve_mode(chat_template: str, tokenizer: Any, template_kwargs: Mapping[str, Any] | None = None) -> str:
    """``auto`` becomes ``chat`` when the tokenizer has a chat template, else ``plain``. Template arguments
    (``template_kwargs``) outside ``chat`` are an error: no template would read them."""
    check_mode(chat_template)
    mode = chat_template
    if chat_template == "auto":
        mode = "chat" if getattr(tokenizer, "chat_template", None) else "plain"
    if template_kwargs and mode != "chat":
        why = "the tokenizer has no chat template" if chat_template == "auto" else "no template is used"
        raise DataError(
            f"chat_template_kwargs {dict(template_kwargs)} are arguments of a chat template, but chat_template="
            f"{chat_template} renders prompts as {mode} text ({why}): drop them, or use a tokenizer with a chat "
            "template"
        )
    return mode


def render_prompt(
    prompt: list[dict[str, str]] | str,
    tokenizer: Any,
    mode: str,
    location: str = "",
    *,
    tools: list[dict] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The prompt as text, ready for the model to continue with its answer.

    ``chat``: the tokenizer's chat template with the generation prompt (and ``tools``, OpenAI-style
    schemas, when given: the template declares them as it does for the agent loop; ``template_kwargs``,
    the template's own variables: data.chat_template_kwargs); ``plain``: the message contents joined by
    newlines; ``none``: the string as it is (``tools`` unused in both).
    """
    if mode == "none":
        return prompt  # type: ignore[return-value]
    if mode == "plain":
        return "\n".join(message["content"] for message in prompt)
    try:
        return render_chat(
            tokenizer, prompt, generation_prompt=True, tools=tools, template_kwargs=template_kwargs
        )
    except Exception as e:  # jinja templates raise their own errors ("roles must alternate", ...)
        raise DataError(
            f"{location}: the tokenizer's chat template fails on field 'prompt' ({type(e).__name__}: {e}); "
            f"fix the messages, or set data.chat_template=plain to join their contents without it"
        ) from e


def generation_prompt_ids(
    tokenizer: Any, mode: str, template_kwargs: Mapping[str, Any] | None = None
) -> list[int]:
    """The tokens the chat template appends to open the assistant's turn, with the template's arguments
    (Qwen3's ``enable_thinking=False`` adds an empty think block there); ``[]`` outside chat mode, or
    when the template's generation prompt is not a plain suffix."""
    if mode != "chat":
        return []
    probe = [{"role": "user", "content": "x"}]
    try:
        without = render_chat(tokenizer, probe, generation_prompt=False, template_kwargs=template_kwargs)
        with_prompt = render_chat(tokenizer, probe, generation_prompt=True, template_kwargs=template_kwargs)
    except Exception:  # a template that wants more than one user message: cut as plain text
        return []
    if not with_prompt.startswith(without):
        return []
    ids_without, ids_with = tokenize(tokenizer, [without, with_prompt])
    if ids_with[: len(ids_without)] != ids_without:
        return []
    return list(ids_with[len(ids_without) :])


def tokenize(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, without any special tokens the tokenizer would add on its own."""
    if not texts:
        return []
    return tokenizer(texts, add_special_tokens=False)["input_ids"]
