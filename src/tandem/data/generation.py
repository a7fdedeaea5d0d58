"""The prompts of a file to generate from (`tandem generate`): every row kept, in file order.

The same rendering as the RL prompt dataset (`data/prompts.py`: the chat template with its generation
prompt, the same length rule), but only the prompt field is required: a row is not scored, so it needs
no `data_source` or `reward_model`, and no row is dropped (the output has a row for each input row).
Items are shaped for `collate_prompts`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tandem.data.prompts import MAX_LOGGED_ROWS, _truncate
from tandem.data.rows import (
    DataError,
    as_paths,
    check_prompt,
    check_row,
    generation_prompt_ids,
    iter_rows,
    render_prompt,
    require,
    resolve_mode,
    tokenize,
)

logger = logging.getLogger(__name__)

GENERATION_TRUNCATION = ("error", "left", "right")


def generation_items(
    path: str | Path,
    tokenizer: Any,
    *,
    prompt_key: str = "prompt",
    max_prompt_length: int,
    truncation: str = "error",
    chat_template: str = "auto",
    chat_template_kwargs: Mapping[str, Any] | None = None,
    key_names: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """One item per row of `path`: ``input_ids`` (the rendered, tokenized prompt), ``raw_prompt``,
    ``data_source`` (None where the row has none), ``ground_truth`` (None), ``extra_info`` ({}) and
    ``index`` (the row's position in the file).

    A prompt longer than ``max_prompt_length`` tokens is an error naming the row (``truncation="error"``)
    or cut: ``"left"`` keeps its last tokens, ``"right"`` its first (still ending with the chat template's
    generation prompt). ``chat_template_kwargs``: the template's own variables, as in training
    (data.chat_template_kwargs). ``key_names`` renames config keys in the messages (``{"prompt_key":
    "data.prompt_key"}`` for a verl command line)."""
    names = {"prompt_key": "prompt_key", "max_prompt_length": "max_prompt_length", "truncation": "truncation"}
    names.update(key_names or {})
    if truncation not in GENERATION_TRUNCATION:
        raise ValueError(f"{names['truncation']} must be one of {GENERATION_TRUNCATION}, got {truncation!r}")
    (file,) = as_paths(path)
    mode = resolve_mode(chat_template, tokenizer, chat_template_kwargs)
    hint = f" Set {names['prompt_key']} to the column that holds the chat messages."
    rows, texts, locations = [], [], []
    for location, row in iter_rows(file):
        row = check_row(location, row)
        prompt = check_prompt(location, require(location, row, prompt_key, object, hint), prompt_key, mode)
        rows.append((prompt, row.get("data_source")))
        texts.append(render_prompt(prompt, tokenizer, mode, location, template_kwargs=chat_template_kwargs))
        locations.append(location)

    keep_at_end = (
        generation_prompt_ids(tokenizer, mode, chat_template_kwargs) if truncation == "right" else []
    )
    items, truncated = [], []
    for position, ((prompt, data_source), location, ids) in enumerate(
        zip(rows, locations, tokenize(tokenizer, texts), strict=True)
    ):
        ids = list(ids)
        if not ids:
            raise DataError(
                f"{location}: field {prompt_key!r} renders to no tokens; give the prompt some text"
            )
        if len(ids) > max_prompt_length:
            if truncation == "error":
                raise DataError(
                    f"{location}: prompt is {len(ids)} tokens, longer than {names['max_prompt_length']}="
                    f"{max_prompt_length}; raise it, or set {names['truncation']}=left or right to cut it"
                )
            truncated.append(f"{location} ({len(ids)} tokens)")
            ids = _truncate(location, ids, max_prompt_length, truncation, keep_at_end)
        items.append(
            {
                "input_ids": ids,
                "raw_prompt": prompt,
                "data_source": data_source,
                "ground_truth": None,
                "extra_info": {},
                "index": position,
            }
        )
    if truncated:
        logger.warning(
            "%d of %d prompts cut to %s=%d tokens (%s=%s), e.g. %s",
            len(truncated),
            len(items),
            names["max_prompt_length"],
            max_prompt_length,
            names["truncation"],
            truncation,
            ", ".join(truncated[:MAX_LOGGED_ROWS]),
        )
    return items
