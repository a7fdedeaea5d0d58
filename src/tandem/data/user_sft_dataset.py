"""A dataset class of the user's for `tandem sft` (verl's data.custom_cls in its SFT trainers): its items become
the SFT rows.

The class is a map-style `torch.utils.data.Dataset` in a Python file, named by data.custom_dataset_file and
data.custom_dataset_class (the keys RL training reads for its prompt rows, `user_dataset.py`); it is built as
verl's SFT trainers build theirs, once for data.train_files and once for data.val_files::

    cls(parquet_files=[...], tokenizer=tokenizer, config=data_config)

with `processor=` (verl's `sft_trainer`) and `max_samples=-1` (both of verl's SFT trainers) where the
constructor takes them. `config` is the data section as an OmegaConf mapping under verl's key names
(`sft_dataset_config`); `parquet_files` is an OmegaConf list, as verl passes it (verl's own SFTDataset
wraps anything else in a list).

Each item is verl's SFT item, a dict of 1-D tensors (or lists) of one length: `input_ids`, `loss_mask`, and
optionally `attention_mask` (1 on the tokens, 0 on padding; absent: no padding, verl's pad_mode=no_padding)
and `position_ids`. The loss mask is read as verl's SFT trainers read it: `loss_mask[j] = 1` trains token j
(the prediction of token j from the tokens before it; verl drops the first position, `loss_mask[:, 1:]`,
against the labels `input_ids[:, 1:]`). That is Tandem's convention too (`roles/sft.py`'s `target_mask`), so
the row is the item's tokens and loss mask with the padding dropped, and a class trains in Tandem what it
trains in verl: verl's own SFTDataset, for one, trains the last prompt token and not the EOS under it.

Where it differs from verl, and why: Tandem reads every item once at start-up (verl: one each time a batch
needs it), so a bad item stops the run before any worker starts, named by its index and what to fix. The
padding must sit at the ends (one sequence per item: Tandem pads and packs the rows itself), the positions of
the tokens must count 0, 1, 2, ... (Tandem computes them; no packed sequences or vision positions), and the
loss mask is 0 on padding and on the first token (nothing predicts it). Items longer than data.max_length
follow data.truncation, as Tandem's own rows do. Items with images (`multi_modal_inputs`) are not read:
a vision-language model's SFT rows come from the files (data.image_key).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from tandem.data.rows import DataError
from tandem.data.user_dataset import (
    CLASS_KEY,
    FILE_KEY,
    build_dataset,
    item_of,
    load_dataset_class,
    takes_argument,
)

logger = logging.getLogger(__name__)

REQUIRED = ("input_ids", "loss_mask")
MAX_LOGGED_ITEMS = 3


def sft_dataset_config(data: Any, max_length: int) -> Any:
    """The `config` a user's SFT class gets: Tandem's data section (prompt_key, response_key, messages_key,
    truncation, shuffle, seed, train_files, ... are verl's names too) as an OmegaConf mapping, plus verl's names
    for what Tandem says otherwise: `max_length` (data.max_length, or the prompt and response lengths summed),
    `custom_cls.path` / `.name`, `multiturn.messages_key`, `apply_chat_template_kwargs`, `chat_template` (None:
    the tokenizer's own), `pad_mode=right` and `use_shm=false`."""
    from dataclasses import asdict

    from omegaconf import OmegaConf

    values = asdict(data)
    values["max_length"] = max_length
    values["custom_cls"] = {"path": data.custom_dataset_file, "name": data.custom_dataset_class}
    values["multiturn"] = {"messages_key": data.messages_key}
    values["apply_chat_template_kwargs"] = dict(data.chat_template_kwargs or {})
    values["chat_template"] = None if data.chat_template == "auto" else data.chat_template
    values["pad_mode"] = "right"
    values["use_shm"] = False
    return OmegaConf.create(values)


class UserSFTRows:
    """The SFT rows of a user's Dataset class, as `SFTDataset`'s: items {"input_ids", "loss_mask"} (token
    lists, aligned) by index, `report` (total / kept / filtered / truncated items) and `sample_texts` (empty:
    the class tokenizes its rows itself, so there is no rendering of Tandem's to round-trip)."""

    def __init__(
        self,
        path: str,
        name: str,
        files: list[str],
        *,
        tokenizer: Any,
        processor: Any,
        config: Any,
        files_key: str,
        max_length: int,
        truncation: str,
    ) -> None:
        from omegaconf import OmegaConf

        cls = load_dataset_class(path, name)
        kwargs: dict[str, Any] = {
            "parquet_files": OmegaConf.create(list(files)),
            "tokenizer": tokenizer,
            "config": config,
        }
        if takes_argument(cls, "processor"):
            kwargs["processor"] = processor
        if takes_argument(cls, "max_samples"):
            kwargs["max_samples"] = -1
        called_as = f"verl's SFT trainers call it, {name}({', '.join(f'{k}=...' for k in kwargs)}),"
        dataset, count = build_dataset(cls, kwargs, path, name, files_key, list(files), called_as)
        self.files = list(files)
        self.sample_texts: list[tuple[str, str]] = []
        self._items: list[dict[str, list[int]]] = []
        truncated, filtered = [], []
        for i in range(count):
            location = f"{files_key}: item {i} of {name} ({path})"
            item = item_of(dataset, i, location, path)
            row = sft_row_of_item(location, item, len(tokenizer))
            size = len(row["input_ids"])
            if size > max_length:
                if truncation == "error":
                    raise DataError(
                        f"{location}: {size} tokens, longer than data.max_length={max_length} (the config's "
                        "max_length it got); cut it in the class, raise data.max_length or set data.truncation=right"
                    )
                row = {key: tokens[:max_length] for key, tokens in row.items()}
                if not any(row["loss_mask"]):
                    filtered.append(f"item {i} (no trained token in the first {max_length})")
                    continue
                truncated.append(f"item {i} ({size} tokens)")
            self._items.append(row)
        self.report = {
            "total": count,
            "kept": len(self._items),
            "filtered": len(filtered),
            "truncated": len(truncated),
        }
        changed = filtered + truncated
        if changed:
            logger.warning(
                "SFT rows of %s on %s: %d items, %d kept, %d filtered, %d truncated (data.max_length=%d, "
                "data.truncation=%s); e.g. %s",
                name,
                files_key,
                count,
                len(self._items),
                len(filtered),
                len(truncated),
                max_length,
                truncation,
                ", ".join(changed[:MAX_LOGGED_ITEMS]),
            )
        if not self._items:
            where = f"{CLASS_KEY}='{name}' in {FILE_KEY}='{path}'"
            raise DataError(
                f"{where}: no SFT rows left out of {count} items on {files_key}: each one's trained tokens lie "
                f"past data.max_length={max_length}; raise it"
            )

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return self._items[i]


def sft_row_of_item(location: str, item: Any, vocab_size: int) -> dict[str, list[int]]:
    """A user's SFT item (verl's: input_ids, loss_mask, attention_mask, position_ids) as Tandem's SFT row
    {"input_ids", "loss_mask"}: the tokens where attention_mask is 1 and their loss mask, 0 on the first token.
    Every departure from verl's item shape is a DataError naming `location`, the field and what to do."""
    import torch

    if not isinstance(item, Mapping):
        raise DataError(
            f"{location}: __getitem__ returned a {type(item).__name__}; it must return one SFT item, a dict of "
            "1-D tensors 'input_ids' and 'loss_mask' (and 'attention_mask', 'position_ids'), as verl's SFTDataset"
        )
    missing = [key for key in REQUIRED if item.get(key) is None]
    if missing:
        present = ", ".join(sorted(map(str, item))) or "none"
        raise DataError(f"{location}: missing field(s) {', '.join(missing)} (fields present: {present})")
    if item.get("multi_modal_inputs"):
        raise DataError(
            f"{location}: holds 'multi_modal_inputs'; Tandem reads no images from a dataset class of the user's for "
            "SFT: give the rows as files with their images in the field data.image_key"
        )
    ids = _vector(location, item, "input_ids")
    loss = _vector(location, item, "loss_mask")
    attention = _vector(location, item, "attention_mask") if item.get("attention_mask") is not None else None
    if attention is None:
        attention = torch.ones_like(ids)
    for key, values in (("loss_mask", loss), ("attention_mask", attention)):
        if len(values) != len(ids):
            raise DataError(
                f"{location}: '{key}' has {len(values)} entries, 'input_ids' {len(ids)}; give one per token"
            )
        if not ((values == 0) | (values == 1)).all():
            raise DataError(
                f"{location}: '{key}' holds {sorted(set(values.tolist()))[:4]}; it must be 0 / 1 per token"
            )
    kept = attention.nonzero().flatten()
    if len(kept) == 0:
        raise DataError(f"{location}: 'attention_mask' is 0 everywhere; the item holds no token")
    first, last = int(kept[0]), int(kept[-1])
    if len(kept) != last - first + 1:
        raise DataError(
            f"{location}: 'attention_mask' has padding between tokens (0 at position "
            f"{int((attention[first:last] == 0).nonzero()[0]) + first}); Tandem reads one sequence per item, padding "
            "at the ends only (it pads and packs the rows itself)"
        )
    on_padding = (loss.bool() & ~attention.bool()).nonzero().flatten()
    if len(on_padding):
        raise DataError(
            f"{location}: 'loss_mask' is 1 at position {int(on_padding[0])}, where 'attention_mask' is 0 (padding); "
            "set the loss mask 0 on padding"
        )
    if item.get("position_ids") is not None:
        positions = torch.as_tensor(item["position_ids"])
        if positions.dim() != 1 or len(positions) != len(ids):
            raise DataError(
                f"{location}: 'position_ids' has shape {list(positions.shape)}; Tandem reads 1-D positions, one per "
                "token (vision-language positions are not read from a class of the user's)"
            )
        if not torch.equal(positions[first : last + 1].long(), torch.arange(last - first + 1)):
            raise DataError(
                f"{location}: 'position_ids' of the tokens are not 0, 1, 2, ...; Tandem computes the positions "
                "itself, one sequence per item: pack no sequences into one item"
            )
    ids, loss = ids[first : last + 1].long(), loss[first : last + 1].long()
    bad = ((ids < 0) | (ids >= vocab_size)).nonzero().flatten()
    if len(bad):
        raise DataError(
            f"{location}: 'input_ids' holds {int(ids[bad[0]])} at position {int(bad[0]) + first}, not a token id of "
            f"the tokenizer (0 .. {vocab_size - 1}); tokenize with the tokenizer the class is given"
        )
    loss[0] = 0  # nothing predicts the first token (verl's trainers drop its position too)
    if not loss.any():
        raise DataError(
            f"{location}: 'loss_mask' trains no token (it is 0 on every token but the first, which nothing "
            "predicts); set it 1 on the tokens to learn, e.g. the response"
        )
    return {"input_ids": ids.tolist(), "loss_mask": loss.tolist()}


def _vector(location: str, item: Mapping[str, Any], key: str) -> Any:
    """item[key] as a 1-D tensor, or a DataError naming the field."""
    import torch

    try:
        values = torch.as_tensor(item[key])
    except (TypeError, ValueError, RuntimeError) as error:
        raise DataError(f"{location}: field '{key}' is not a tensor or list of numbers ({error})") from error
    if values.dim() != 1:
        raise DataError(
            f"{location}: field '{key}' has shape {list(values.shape)}; give one 1-D tensor per item (no batch "
            "dimension)"
        )
    if values.dtype.is_floating_point and key == "input_ids":
        raise DataError(f"{location}: field 'input_ids' holds floats; give token ids (integers)")
    return values
