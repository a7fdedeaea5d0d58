"""A dataset class of the user's (verl's data.custom_cls): its items become the RL prompt rows.

The class is a `torch.utils.data.Dataset` (map-style: `len` and `[i]`) in a Python file, named by
data.custom_dataset_file and data.custom_dataset_class; it is built as verl builds its own, once for
data.train_files and once for data.val_files::

    cls(data_files=[...], tokenizer=tokenizer, config=data_config, processor=processor)

(`max_samples=-1` too where the constructor takes it, as verl's newer releases pass it). `config` is the data
section as an OmegaConf mapping under verl's key names (see `dataset_config`).

Each item is verl's row dict; Tandem reads these fields of it (`row_of_item`), and nothing else:

- the prompt: `raw_prompt` (verl's chat messages), else the field data.prompt_key; a message's content is a
  string (`<image>` where an image goes, the images in the field data.image_key) or verl's list of
  {"type": "text", "text": ...} / {"type": "image", "image": ...} items;
- `data_source` (a non-empty string: it picks the reward scorer), `reward_model.ground_truth`, `extra_info`,
  `agent_name`, as in a file's row;
- `tools_kwargs` / `interaction_kwargs`: into extra_info, over extra_info's own (verl's agent loop reads these
  top-level copies).

The ids verl's older items carry (`input_ids`, `raw_prompt_ids`, ...), `dummy_tensor` and `index` are not read:
Tandem renders and tokenizes the prompt itself, as for a file's rows, so data.max_prompt_length and
data.truncation apply alike. Where it differs from verl, and why: verl reads an item each time a batch
needs it; Tandem reads every item once at start-up, so that a bad item, a prompt too long or a data_source
no scorer covers stops the run before any worker starts (an item drawn at random is drawn once).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from typing import Any

from tandem.data.rows import DataError
from tandem.usercode import FILE_PREFIX, defined_at, describe_load_error, load_user_class

FILE_KEY = "data.custom_dataset_file"
CLASS_KEY = "data.custom_dataset_class"
# fields of verl's RLHFDataset items that Tandem derives itself (the prompt's ids, the multimodal inputs,
# the index): not read, and not reported as unread
DERIVED_FIELDS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "raw_prompt_ids",
    "full_prompts",
    "multi_modal_data",
    "multi_modal_inputs",
    "dummy_tensor",
    "index",
)
PROMPT_FIELD = "raw_prompt"
KWARGS_FIELDS = ("tools_kwargs", "interaction_kwargs")


def dataset_config(data: Any) -> Any:
    """The `config` a user's class gets: Tandem's data section (data.prompt_key, max_prompt_length,
    train_files, ... are verl's names too) as an OmegaConf mapping, plus verl's names for what Tandem says
    otherwise: `custom_cls.path` / `.name`, `filter_overlong_prompts` (data.truncation=filter, with
    `truncation` then `error`) and `return_raw_chat=True` (Tandem reads `raw_prompt`)."""
    from dataclasses import asdict

    from omegaconf import OmegaConf

    values = asdict(data)
    values["custom_cls"] = {"path": data.custom_dataset_file, "name": data.custom_dataset_class}
    values["filter_overlong_prompts"] = data.truncation == "filter"
    if data.truncation == "filter":
        values["truncation"] = "error"
    values["return_raw_chat"] = True
    return OmegaConf.create(values)


def load_dataset_class(path: str, name: str) -> type:
    """The class `name` of the Python file `path` (or verl's `pkg://package.module`), checked to be a map-style
    `torch.utils.data.Dataset`; every failure is a DataError naming the file and, where it is in the file,
    the line."""
    from torch.utils.data import Dataset, IterableDataset

    where = f"{CLASS_KEY}='{name}' in {FILE_KEY}='{path}'"
    try:
        cls = load_user_class(path, name, where=where, setting=FILE_KEY, prefix="tandem_user_dataset_")
    except (ImportError, OSError, TypeError) as error:  # the file, or the name in it
        raise DataError(str(error)) from error
    at = defined_at(cls)
    if not issubclass(cls, Dataset):
        raise DataError(
            f"{where}: class '{name}'{at} is not a torch.utils.data.Dataset; subclass it (verl's RLHFDataset "
            "and SFTDataset are), with __len__ and __getitem__ returning one item, a dict"
        )
    if issubclass(cls, IterableDataset):
        raise DataError(
            f"{where}: class '{name}'{at} is an IterableDataset; Tandem reads the rows by index, as verl's "
            "sampler does: give it __len__ and __getitem__ instead"
        )
    return cls


def build_dataset(
    cls: type, kwargs: dict[str, Any], path: str, name: str, files_key: str, files: list[str], called_as: str
) -> tuple[Any, int]:
    """(the user's class built with `kwargs`, its length): a constructor or `len` that raises is a DataError
    naming the file and line (`called_as`: how the class is called, for the message), and so is an empty one."""
    where = f"{CLASS_KEY}='{name}' in {FILE_KEY}='{path}'"
    real = os.path.realpath(path.removeprefix(FILE_PREFIX))
    try:
        dataset = cls(**kwargs)
        count = len(dataset)
    except Exception as error:
        raise DataError(
            f"{where}: building it on {files_key}={list(files)} failed: {describe_load_error(error, real)}; "
            f"the class is called as {called_as} and must have __len__"
        ) from error
    if count < 1:
        raise DataError(f"{where}: built on {files_key}={list(files)}, it holds no items")
    return dataset, count


def item_of(dataset: Any, i: int, location: str, path: str) -> Any:
    """dataset[i]; a `__getitem__` that raises is a DataError naming the item and the user's file and line."""
    try:
        return dataset[i]
    except Exception as error:
        real = os.path.realpath(path.removeprefix(FILE_PREFIX))
        raise DataError(f"{location}: __getitem__ failed: {describe_load_error(error, real)}") from error


def rows_from_class(
    path: str,
    name: str,
    data_files: list[str],
    *,
    tokenizer: Any,
    processor: Any,
    config: Any,
    files_key: str,
    prompt_key: str,
    image_key: str,
) -> list[tuple[str, dict[str, Any]]]:
    """(location, row) of every item of the user's class built on `data_files` (named by config key
    `files_key`), each row in the form of a file's row (the prompt under `prompt_key`, images under
    `image_key`). A constructor, `len` or `[i]` that raises is a DataError naming the file, the line and the
    item; an item that is not a dict, or lacks the prompt, names the item and the field."""
    cls = load_dataset_class(path, name)
    kwargs: dict[str, Any] = {
        "data_files": list(data_files),
        "tokenizer": tokenizer,
        "config": config,
        "processor": processor,
    }
    if takes_argument(cls, "max_samples"):
        kwargs["max_samples"] = -1
    called_as = f"{name}(data_files, tokenizer, config, processor)"
    dataset, count = build_dataset(cls, kwargs, path, name, files_key, data_files, called_as)
    rows = []
    for i in range(count):
        location = f"{files_key}: item {i} of {name} ({path})"
        item = item_of(dataset, i, location, path)
        rows.append((location, row_of_item(location, item, prompt_key, image_key)))
    return rows


def row_of_item(location: str, item: Any, prompt_key: str, image_key: str) -> dict[str, Any]:
    """A user's item (verl's row dict) as a file's row: the prompt under `prompt_key` (from `raw_prompt`, else
    `prompt_key`), verl's image items made `<image>` and the images under `image_key`, tools_kwargs /
    interaction_kwargs moved into extra_info, verl's derived fields dropped; the other fields as they are."""
    if not isinstance(item, Mapping):
        raise DataError(
            f"{location}: __getitem__ returned a {type(item).__name__}; it must return one row, a dict with "
            f"'{PROMPT_FIELD}' (or '{prompt_key}'), 'data_source', 'reward_model' and 'extra_info'"
        )
    item = dict(item)
    field = PROMPT_FIELD if item.get(PROMPT_FIELD) is not None else prompt_key
    if item.get(field) is None:
        present = ", ".join(sorted(map(str, item))) or "none"
        raise DataError(
            f"{location}: missing field '{PROMPT_FIELD}' (the chat messages; or '{prompt_key}', data.prompt_key) "
            f"(fields present: {present})"
        )
    prompt = _as_list(item[field])
    row = {k: v for k, v in item.items() if k not in DERIVED_FIELDS and k not in (PROMPT_FIELD, prompt_key)}
    row[prompt_key] = prompt
    if isinstance(prompt, list) and any(_has_items(m) for m in prompt):
        row[prompt_key], images = _from_content_items(location, field, prompt)
        if images:
            if item.get(image_key) is not None:
                raise DataError(
                    f"{location}: images both in '{field}' and in field '{image_key}'; give each image once"
                )
            row[image_key] = images
    elif row.get(image_key) is not None:
        row[image_key] = _as_list(row[image_key])
    kwargs = {k: row.pop(k) for k in KWARGS_FIELDS if k in row}
    if any(kwargs.values()):
        extra = row.get("extra_info")
        if extra is not None and not isinstance(extra, Mapping):
            return row  # a row check names the wrong type of extra_info (prompts.py)
        row["extra_info"] = {**(extra or {}), **{k: v for k, v in kwargs.items() if v}}
    return row


def _from_content_items(location: str, field: str, messages: list[Any]) -> tuple[list[Any], list[Any]]:
    """verl's messages with content item lists (`RLHFDataset._build_messages`) as messages with string content,
    `<image>` where each image went, and the images in order."""
    from tandem.models.model_type import IMAGE_PLACEHOLDER

    out, images = [], []
    for j, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list | tuple):
            out.append(message)
            continue
        text = []
        for part in content:
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind == "text" and isinstance(part.get("text"), str):
                text.append(part["text"])
            elif kind == "image":
                image = part.get("image")
                images.append(image if image is not None else {k: v for k, v in part.items() if k != "type"})
                text.append(IMAGE_PLACEHOLDER)
            else:
                raise DataError(
                    f"{location}: field '{field}' message {j} has a content item {str(part)[:60]}; Tandem reads "
                    "{'type': 'text', 'text': ...} and {'type': 'image', 'image': ...} items (no video)"
                )
        out.append({**message, "content": "".join(text)})
    return out, images


def _has_items(message: Any) -> bool:
    return isinstance(message, Mapping) and isinstance(message.get("content"), list | tuple)


def _as_list(value: Any) -> Any:
    """Numpy arrays (list columns read by pandas) as lists, inside lists and dicts too; other values unchanged."""
    if type(value).__name__ == "ndarray" and type(value).__module__ == "numpy":
        return [_as_list(v) for v in value]
    if isinstance(value, list):
        return [_as_list(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_list(v) for k, v in value.items()}
    return value


def takes_argument(cls: type, argument: str) -> bool:
    """Whether the constructor of `cls` takes `argument` by name (or any keyword)."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == argument or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
