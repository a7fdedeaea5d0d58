"""The SFT dataset: a prompt rendered exactly as the RL prompts are, then the response and EOS."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from tandem.batch import Batch
from tandem.data.padding import pad_sequences, position_ids_from_mask
from tandem.data.rows import (
    DataError,
    FileList,
    as_paths,
    check_prompt,
    check_row,
    iter_rows,
    render_prompt,
    require,
    resolve_mode,
    tokenize,
)

logger = logging.getLogger(__name__)

TRUNCATION_MODES = ("error", "right")
MAX_LOGGED_ROWS = 3  # filtered / truncated rows named in the log, as examples
SAMPLE_ROWS = 8  # rendered rows kept (`sample_texts`) for the start-up tokenizer round-trip check


class SFTDataset:
    """(prompt, response) rows as ``input_ids`` and ``loss_mask`` token lists.

    ``input_ids`` = prompt tokens (rendered with the generation prompt, as :class:`PromptDataset`
    does) + response tokens + EOS. Prompt and response are tokenized separately, so the response
    tokens are the ones the policy would generate after that prompt. ``loss_mask`` is 1 exactly on
    the response tokens and the EOS, aligned with ``input_ids`` (the loss shifts it with the labels).

    Sequences longer than ``max_length``: ``truncation="error"`` raises; ``"right"`` cuts the end,
    and drops (counted in ``report["filtered"]``) rows whose prompt leaves no response token; both
    are logged as a warning that names a few of the rows. ``sample_texts`` are (location, text) of
    the first rows: the rendered prompt followed by the response.
    """

    def __init__(
        self,
        files: FileList,
        tokenizer: Any,
        *,
        max_length: int,
        prompt_key: str = "prompt",
        response_key: str = "response",
        truncation: str = "error",
        chat_template: str = "auto",
    ) -> None:
        if truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation must be one of {TRUNCATION_MODES} for SFT, got {truncation!r}")
        if max_length < 2:
            raise ValueError(f"data.max_length must be >= 2, got {max_length}")
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no EOS token; SFT appends one to every response")
        mode = resolve_mode(chat_template, tokenizer)
        self.files = as_paths(files)
        self.max_length = max_length

        locations, prompts, responses = [], [], []
        for path in self.files:
            for location, row in iter_rows(path):
                row = check_row(location, row)
                prompt = require(
                    location, row, prompt_key, object, " Set data.prompt_key if it has another name."
                )
                prompts.append(
                    render_prompt(check_prompt(location, prompt, prompt_key, mode), tokenizer, mode, location)
                )
                responses.append(
                    require(
                        location, row, response_key, str, " Set data.response_key if it has another name."
                    )
                )
                locations.append(location)

        self.sample_texts: list[tuple[str, str]] = [
            (location, prompt + response)
            for location, prompt, response in list(zip(locations, prompts, responses))[:SAMPLE_ROWS]
        ]
        self._items: list[dict[str, list[int]]] = []
        filtered: list[str] = []
        truncated: list[str] = []
        eos = tokenizer.eos_token_id
        for location, prompt_ids, response_ids in zip(
            locations, tokenize(tokenizer, prompts), tokenize(tokenizer, responses)
        ):
            input_ids = [*prompt_ids, *response_ids, eos]
            loss_mask = [0] * len(prompt_ids) + [1] * (len(response_ids) + 1)
            if len(input_ids) > max_length:
                if truncation == "error":
                    raise DataError(
                        f"{location}: prompt + response + EOS is {len(input_ids)} tokens, longer than "
                        f"data.max_length={max_length}; raise data.max_length or set data.truncation=right"
                    )
                if len(prompt_ids) >= max_length:
                    filtered.append(f"{location} (prompt alone {len(prompt_ids)} tokens)")
                    continue
                truncated.append(f"{location} ({len(input_ids)} tokens)")
                input_ids, loss_mask = input_ids[:max_length], loss_mask[:max_length]
            self._items.append({"input_ids": input_ids, "loss_mask": loss_mask})

        total = len(locations)
        self.report = {
            "total": total,
            "kept": len(self._items),
            "filtered": len(filtered),
            "truncated": len(truncated),
        }
        summary = (
            f"SFT rows from {len(self.files)} file(s): {total} rows, {len(self._items)} kept, "
            f"{len(filtered)} filtered, {len(truncated)} truncated "
            f"(data.max_length={max_length}, data.truncation={truncation})"
        )
        changed = filtered or truncated
        if changed:
            summary += f"; e.g. {', '.join(changed[:MAX_LOGGED_ROWS])}"
        logger.log(logging.WARNING if changed else logging.INFO, "%s", summary)
        if not self._items:
            raise DataError(
                f"no SFT rows left out of {total} in {', '.join(map(str, self.files))}: every prompt fills "
                f"data.max_length={max_length}; raise it"
            )

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return self._items[i]


def collate_sft(items: Sequence[dict[str, Any]], pad_token_id: int) -> Batch:
    """Items of an :class:`SFTDataset` as a Batch: RIGHT-padded ``input_ids``, ``attention_mask``,
    ``position_ids`` and ``loss_mask`` (0 on padding), each [N, longest]."""
    if not items:
        raise ValueError("collate_sft got no items")
    input_ids = pad_sequences([item["input_ids"] for item in items], pad_token_id, side="right")
    attention_mask = pad_sequences([[1] * len(item["input_ids"]) for item in items], 0, side="right")
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
        "loss_mask": pad_sequences([item["loss_mask"] for item in items], 0, side="right"),
    }
    return Batch.from_dict(tensors)
