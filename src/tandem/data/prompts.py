"""The RL prompt dataset: chat-message prompts rendered, tokenized and length-checked once, up front."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tandem.batch import Batch
from tandem.data.images import row_images, widen_images
from tandem.data.padding import pad_sequences, position_ids_from_mask
from tandem.data.rows import (
    DataError,
    FileList,
    as_paths,
    check_prompt,
    check_row,
    generation_prompt_ids,
    iter_rows,
    optional_dict,
    render_prompt,
    require,
    resolve_mode,
    tokenize,
)
from tandem.tools.names import AGENT_NAMES

logger = logging.getLogger(__name__)

TRUNCATION_MODES = ("error", "filter", "left", "right")
MAX_LOGGED_ROWS = 3  # filtered / truncated rows named in the log, as examples
SAMPLE_ROWS = 8  # rendered prompts kept (`sample_texts`) for the start-up tokenizer round-trip check
NON_TENSOR_KEYS = ("raw_prompt", "data_source", "ground_truth", "extra_info", "index")
AGENT_NAME_KEY = "agent_name"  # verl's per-row agent loop (tools/names.py AGENT_NAMES), None when absent
# Fields of a row that Tandem reads besides data.prompt_key and data.image_key; any other is reported.
READ_FIELDS = ("data_source", "reward_model", "extra_info", AGENT_NAME_KEY)
# reward_model.style is verl's "rule" / "model" marker, which Tandem's own rows carry too: the config
# decides what scores a row, so the marker says nothing worth a warning.
READ_REWARD_MODEL_FIELDS = ("ground_truth", "style")
# a vision-language model's prompts (a processor given): images, their model inputs, the unwidened ids
MULTIMODAL_KEYS = ("raw_prompt_ids", "multi_modal_data", "multi_modal_inputs")


class PromptDataset:
    """Prompts from parquet / jsonl files in the verl-style row schema.

    Each item: ``input_ids`` (list of ints), ``raw_prompt`` (the messages), ``data_source``,
    ``ground_truth`` (``reward_model.ground_truth``, None when the row has no ``reward_model``),
    ``extra_info`` (dict, may be empty) and ``index`` (``extra_info.index``, else the row's
    position over all files). ``locations[i]`` names item i's file and row; ``ground_truth_absent``
    holds the items whose row has no ``reward_model.ground_truth`` field at all (as opposed to null);
    ``sample_texts`` are (location, text) of the first rows' prompts as rendered for the model.

    Prompts longer than ``max_prompt_length`` tokens: ``truncation="error"`` raises, ``"filter"``
    drops them, ``"left"`` keeps their last tokens, ``"right"`` their first. With a chat template,
    ``"right"`` still ends the prompt with the template's generation prompt (``<|im_start|>assistant``),
    so the model answers instead of continuing the cut user message. ``report`` counts ``total``,
    ``kept``, ``filtered`` and ``truncated`` rows; filtered and truncated rows are logged as a warning
    that names a few of them. ``tools`` (OpenAI-style schemas) are rendered into every prompt by the
    chat template, as the agent loop's tools are (rollout.multi_turn); ``chat_template_kwargs`` are the
    template's own variables (data.chat_template_kwargs), which the agent loop's turns get as well.
    """

    def __init__(
        self,
        files: FileList,
        tokenizer: Any,
        *,
        max_prompt_length: int,
        prompt_key: str = "prompt",
        truncation: str = "error",
        chat_template: str = "auto",
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tools: list[dict] | None = None,
        processor: Any = None,
        image_key: str = "images",
        user_rows: Sequence[tuple[str, dict[str, Any]]] | None = None,
    ) -> None:
        if truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation must be one of {TRUNCATION_MODES}, got {truncation!r}")
        if max_prompt_length < 1:
            raise ValueError(f"data.max_prompt_length must be >= 1, got {max_prompt_length}")
        mode = resolve_mode(chat_template, tokenizer, chat_template_kwargs)
        # a user's dataset class (data/user_dataset.py) gives `user_rows`: `files` are what the class read
        self.files = as_paths(files) if user_rows is None else [Path(f) for f in files]
        self.max_prompt_length = max_prompt_length
        # (the folder an image path is read from, the rows)
        sources = (
            [(p.parent, iter_rows(p)) for p in self.files] if user_rows is None else [(Path.cwd(), user_rows)]
        )

        rows, locations, texts, absent = [], [], [], set()
        # field -> (rows carrying it, the first one's location), for fields Tandem reads nowhere
        self.unread_fields: dict[str, tuple[int, str]] = {}
        for folder, file_rows in sources:
            for location, row in file_rows:
                row = check_row(location, row)
                self._note_unread(location, row, (prompt_key, image_key, *READ_FIELDS))
                rows.append(_parse_row(location, row, prompt_key, mode, position=len(rows)))
                if "ground_truth" not in (row.get("reward_model") or {}):  # a dict: _parse_row checked
                    absent.add(len(rows) - 1)
                locations.append(location)
                messages = rows[-1]["raw_prompt"]
                if row.get(image_key) is not None:
                    messages = _attach_images(
                        location, rows[-1], row[image_key], image_key, folder, mode, processor
                    )
                texts.append(
                    render_prompt(
                        messages, tokenizer, mode, location, tools=tools, template_kwargs=chat_template_kwargs
                    )
                )
        self.sample_texts: list[tuple[str, str]] = list(zip(locations, texts))[:SAMPLE_ROWS]
        if self.unread_fields:
            listed = ", ".join(
                f"'{field}' ({count} rows, first {first})"
                for field, (count, first) in self.unread_fields.items()
            )
            logger.warning(
                "fields that Tandem reads nowhere, dropped: %s. Reward functions get data_source, the response, "
                "reward_model.ground_truth and extra_info: move into extra_info what yours needs",
                listed,
            )

        keep_at_end = (
            generation_prompt_ids(tokenizer, mode, chat_template_kwargs) if truncation == "right" else []
        )
        self._items: list[dict[str, Any]] = []
        self.locations: list[str] = []
        self.ground_truth_absent: set[int] = set()
        filtered: list[str] = []
        truncated: list[str] = []
        for position, (item, location, ids) in enumerate(zip(rows, locations, tokenize(tokenizer, texts))):
            ids = list(ids)
            if not ids:
                raise DataError(
                    f"{location}: field {prompt_key!r} renders to no tokens; give the prompt some text"
                )
            if processor is not None:  # a vision-language model: ids with each image's tokens in place
                ids = _expand_images(item, ids, texts[position], processor)
            if len(ids) > max_prompt_length:
                if truncation in ("left", "right") and item.get("multi_modal_data"):
                    raise DataError(
                        f"{location}: prompt is {len(ids)} tokens with its images' tokens, longer than "
                        f"data.max_prompt_length={max_prompt_length}; a prompt with images is not cut (the "
                        "cut would split an image): raise data.max_prompt_length or set data.truncation=filter"
                    )
                if truncation == "error":
                    raise DataError(
                        f"{location}: prompt is {len(ids)} tokens, longer than data.max_prompt_length="
                        f"{max_prompt_length}; raise data.max_prompt_length or set data.truncation to "
                        f"filter, left or right"
                    )
                if truncation == "filter":
                    filtered.append(f"{location} ({len(ids)} tokens)")
                    continue
                truncated.append(f"{location} ({len(ids)} tokens)")
                ids = _truncate(location, ids, max_prompt_length, truncation, keep_at_end)
            item["input_ids"] = ids
            if position in absent:
                self.ground_truth_absent.add(len(self._items))
            self._items.append(item)
            self.locations.append(location)

        self.report = {
            "total": len(rows),
            "kept": len(self._items),
            "filtered": len(filtered),
            "truncated": len(truncated),
        }
        summary = (
            f"prompts from {len(self.files)} file(s): {len(rows)} rows, {len(self._items)} kept, "
            f"{len(filtered)} filtered, {len(truncated)} truncated "
            f"(data.max_prompt_length={max_prompt_length}, data.truncation={truncation})"
        )
        changed = filtered or truncated
        if changed:
            summary += f"; e.g. {', '.join(changed[:MAX_LOGGED_ROWS])}"
        logger.log(logging.WARNING if changed else logging.INFO, "%s", summary)
        if not self._items:
            raise DataError(
                f"no prompts left out of {len(rows)} rows in {', '.join(map(str, self.files))}: all are "
                f"longer than data.max_prompt_length={max_prompt_length}; raise it or set data.truncation "
                f"to left or right"
            )

    def _note_unread(self, location: str, row: dict[str, Any], read: tuple[str, ...]) -> None:
        reward_model = row.get("reward_model")
        # null: a parquet column that other rows fill, absent from this one
        fields = [key for key, value in row.items() if key not in read and value is not None]
        if isinstance(reward_model, dict):
            fields += [
                f"reward_model.{key}"
                for key, value in reward_model.items()
                if key not in READ_REWARD_MODEL_FIELDS and value is not None
            ]
        for field in fields:
            count, first = self.unread_fields.get(field, (0, location))
            self.unread_fields[field] = (count + 1, first)

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self._items[i]


def _parse_row(
    location: str, row: dict[str, Any], prompt_key: str, mode: str, position: int
) -> dict[str, Any]:
    prompt = require(
        location, row, prompt_key, object, " Set data.prompt_key if the prompts are in another field."
    )
    prompt = check_prompt(location, prompt, prompt_key, mode)
    data_source = require(
        location, row, "data_source", str, " It picks the reward function for the row: add it to every row."
    )
    if not data_source.strip():
        raise DataError(
            f"{location}: field 'data_source' is empty; name the task, it picks the reward function"
        )
    reward_model = optional_dict(location, row, "reward_model") or {}
    extra_info = optional_dict(location, row, "extra_info") or {}
    index = extra_info.get("index")
    agent_name = row.get(AGENT_NAME_KEY)
    if agent_name is not None and agent_name not in AGENT_NAMES:
        raise DataError(
            f"{location}: field {AGENT_NAME_KEY!r} is {agent_name!r}; Tandem runs verl's {' and '.join(AGENT_NAMES)} "
            "(the agent loop with rollout.multi_turn's tools, or one turn without them): use one of those or "
            "leave the field out"
        )
    return {
        "raw_prompt": prompt,
        "data_source": data_source,
        "ground_truth": reward_model.get("ground_truth"),
        "extra_info": extra_info,
        "index": position if index is None else index,
        AGENT_NAME_KEY: agent_name,
    }


def _attach_images(
    location: str, item: dict[str, Any], images: Any, key: str, folder: Any, mode: str, processor: Any
) -> list[dict[str, Any]]:
    """Decode a row's images into `item["multi_modal_data"]`; the messages to render (images as items)."""
    messages, decoded = row_images(location, item["raw_prompt"], images, key, folder, mode, processor)
    item["multi_modal_data"] = {"image": decoded} if decoded else None
    return messages


def _expand_images(item: dict[str, Any], ids: list[int], text: str, processor: Any) -> list[int]:
    """The prompt's ids as the model reads them (each image marker widened to the image's tokens, counted in
    every length limit), the image inputs the trainer needs, and `raw_prompt_ids` (the markers unwidened:
    what vLLM takes with the images)."""
    item["raw_prompt_ids"] = ids
    data = item.setdefault("multi_modal_data", None)
    if not data:
        item["multi_modal_inputs"] = None
        return ids
    ids, item["multi_modal_inputs"] = widen_images(text, data["image"], processor)
    return ids


def _truncate(
    location: str, ids: list[int], limit: int, truncation: str, keep_at_end: list[int]
) -> list[int]:
    if truncation == "left":
        return ids[-limit:]
    if keep_at_end and ids[-len(keep_at_end) :] == keep_at_end:
        if limit <= len(keep_at_end):
            raise DataError(
                f"{location}: data.max_prompt_length={limit} leaves no room for the prompt before the chat "
                f"template's {len(keep_at_end)}-token generation prompt; raise data.max_prompt_length"
            )
        return ids[: limit - len(keep_at_end)] + keep_at_end
    return ids[:limit]


def collate_prompts(items: Sequence[dict[str, Any]], pad_token_id: int) -> Batch:
    """Items of a :class:`PromptDataset` as a Batch: LEFT-padded ``input_ids`` [N, longest],
    ``attention_mask``, ``position_ids`` (0 on padding), and the per-sample non-tensors."""
    if not items:
        raise ValueError("collate_prompts got no items")
    input_ids = pad_sequences([item["input_ids"] for item in items], pad_token_id, side="left")
    lengths = [len(item["input_ids"]) for item in items]
    attention_mask = pad_sequences([[1] * n for n in lengths], 0, side="left")
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
    }
    keys = NON_TENSOR_KEYS + (MULTIMODAL_KEYS if "raw_prompt_ids" in items[0] else ())
    non_tensors = {key: [item[key] for item in items] for key in keys}
    if AGENT_NAME_KEY in items[0]:  # PromptDataset's items carry it (None where the row has none)
        non_tensors[AGENT_NAME_KEY] = [item.get(AGENT_NAME_KEY) for item in items]
    return Batch.from_dict(tensors, non_tensors)
