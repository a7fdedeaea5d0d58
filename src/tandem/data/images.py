"""Images of a prompt row in verl's multimodal schema: an `images` column (a list per row, each image as
bytes, a path, or a dict with "bytes" / "path" as pandas writes PIL-encoded images), and one `<image>` in
the prompt messages per image, in order. Paths are read relative to the data file's folder.

`prompt_with_images` checks a row and gives the messages with each `<image>` as an image item (the content
form released vision-language chat templates take) and the decoded RGB images; every problem is an error
that names the row, the image and what to do.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from tandem.data.rows import DataError
from tandem.models.model_type import IMAGE_PLACEHOLDER


def row_images(
    location: str,
    messages: list[dict[str, Any]],
    images: Any,
    key: str,
    folder: Path,
    mode: str,
    processor: Any,
) -> tuple[list[dict[str, Any]], list[Any]]:
    """`prompt_with_images` for a dataset row, once the dataset knows the model reads images (`processor`)
    and renders with the chat template (`mode`)."""
    if processor is None:
        raise DataError(
            f"{location}: the row has {key!r} but the model has no image processor; point actor.model_path "
            "at a vision-language model's folder (with its processor_config.json), or drop the images"
        )
    if mode != "chat":
        raise DataError(f"{location}: a row with {key!r} needs the chat template (data.chat_template=auto)")
    return prompt_with_images(location, messages, images, key, folder)


def widen_images(text: str, images: list[Any], processor: Any) -> tuple[list[int], dict[str, Any]]:
    """(the ids of rendered `text` with each image marker widened to its image's tokens, the image inputs the
    trainer's model reads: `pixel_values`, `image_grid_thw`)."""
    out = processor(text=[text], images=images, return_tensors="pt")
    inputs = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
    return out["input_ids"][0].tolist(), inputs


def prompt_with_images(
    location: str, messages: list[dict[str, Any]], images: Any, key: str, folder: Path
) -> tuple[list[dict[str, Any]], list[Any]]:
    """(messages with image items, the decoded images) of a row whose `key` column holds `images`."""
    if not isinstance(images, list | tuple):
        raise DataError(
            f"{location}: field {key!r} must be a list of images (bytes, paths or {{'bytes': ...}} / "
            f"{{'path': ...}} dicts), got {type(images).__name__}"
        )
    placeholders = sum(m["content"].count(IMAGE_PLACEHOLDER) for m in messages)
    if placeholders != len(images):
        raise DataError(
            f"{location}: the prompt has {placeholders} {IMAGE_PLACEHOLDER} placeholder(s) and field {key!r} "
            f"{len(images)} image(s); put one {IMAGE_PLACEHOLDER} in the messages where each image goes"
        )
    decoded = [_decode(location, key, i, image, folder) for i, image in enumerate(images)]
    return [_with_image_items(m) for m in messages], decoded


def _with_image_items(message: dict[str, Any]) -> dict[str, Any]:
    """A message whose content holds `<image>` as a list of image and text items; others unchanged."""
    content = message["content"]
    if IMAGE_PLACEHOLDER not in content:
        return message
    items: list[dict[str, str]] = []
    for i, text in enumerate(content.split(IMAGE_PLACEHOLDER)):
        if i:
            items.append({"type": "image"})
        if text:
            items.append({"type": "text", "text": text})
    return {**message, "content": items}


def _decode(location: str, key: str, index: int, image: Any, folder: Path) -> Any:
    from PIL import Image

    where = f"{location}: {key}[{index}]"
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, dict):
        data, path = image.get("bytes"), image.get("path")
        if data is None and not path:
            raise DataError(
                f"{where} is a dict without 'bytes' or 'path'; give the image's bytes or its file"
            )
        image = data if data is not None else path
    if isinstance(image, bytes | bytearray):
        source: Any = io.BytesIO(image)
        what = f"{len(image)} bytes"
    elif isinstance(image, str):
        source = Path(image) if Path(image).is_absolute() else folder / image
        if not source.is_file():
            raise DataError(
                f"{where}: no image file at {source}; paths are read relative to the data file's folder"
            )
        what = str(source)
    else:
        raise DataError(
            f"{where} must be bytes, a path or a {{'bytes': ...}} dict, got {type(image).__name__}"
        )
    try:
        with Image.open(source) as opened:
            return opened.convert("RGB")
    except Exception as error:  # PIL raises its own errors for truncated or unknown formats
        raise DataError(
            f"{where}: {what} do not decode as an image ({type(error).__name__}: {error})"
        ) from error
