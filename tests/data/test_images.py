"""verl's multimodal prompt rows (an `images` column, `<image>` in the messages) read for a vision-language
model: images decoded from bytes, paths and dicts, each marker widened to the image's tokens by the model's
processor (lengths count them), the unwidened ids kept for vLLM; bad rows named."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from tandem.data import DataError, PromptDataset, collate_prompts, write_rows
from tandem.models.tiny_vlm import IMAGE_PAD, save_tiny_vlm

from .data_helpers import png


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    from transformers import AutoProcessor

    from tandem.models.without_torchvision import adapt_transformers

    adapt_transformers()
    folder = save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "model")
    processor = AutoProcessor.from_pretrained(folder)
    return folder, processor


def row(content: str, images, **extra) -> dict:
    return {
        "prompt": [{"role": "user", "content": content}],
        "data_source": "shapes",
        "images": images,
        **extra,
    }


def dataset(tmp_path, rows, vlm, **kwargs):
    kwargs.setdefault("max_prompt_length", 64)
    _, processor = vlm
    path = write_rows(rows, tmp_path / "rows.parquet")
    return PromptDataset([str(path)], processor.tokenizer, processor=processor, **kwargs)


def test_images_from_bytes_paths_and_dicts_are_widened_to_their_tokens(tmp_path, vlm):
    Image.new("RGB", (84, 56), (0, 0, 255)).save(tmp_path / "blue.png")
    rows = [
        row("<image>Which colour?", [{"bytes": png(56, 56, (255, 0, 0)), "path": None}]),
        row(
            "Left <image> right <image>?",
            [{"bytes": None, "path": "blue.png"}, {"bytes": None, "path": str(tmp_path / "blue.png")}],
        ),
        row("No picture here.", None),
    ]
    data = dataset(tmp_path, rows, vlm)
    _, processor = vlm
    pad = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    first, second, third = data[0], data[1], data[2]
    # 56 x 56: 4 x 4 patches of 14, merged 2 x 2 -> 4 tokens; 84 x 56: 4 x 6 -> 6 tokens each
    assert first["input_ids"].count(pad) == 4 and first["raw_prompt_ids"].count(pad) == 1
    assert len(first["input_ids"]) == len(first["raw_prompt_ids"]) + 3
    assert second["input_ids"].count(pad) == 12 and second["raw_prompt_ids"].count(pad) == 2
    assert first["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert second["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 6], [1, 4, 6]]
    assert first["multi_modal_inputs"]["pixel_values"].shape == (16, 3 * 2 * 14 * 14)
    assert [image.size for image in second["multi_modal_data"]["image"]] == [(84, 56), (84, 56)]
    assert first["multi_modal_data"]["image"][0].getpixel((0, 0)) == (255, 0, 0)
    assert third["multi_modal_data"] is None and third["input_ids"] == third["raw_prompt_ids"]
    assert first["raw_prompt"] == rows[0]["prompt"]  # the row's messages as written

    batch = collate_prompts([first, second, third], processor.tokenizer.pad_token_id)
    assert batch["input_ids"].shape == (3, len(second["input_ids"]))
    assert batch["raw_prompt_ids"][1] == second["raw_prompt_ids"]
    assert torch.equal(batch["multi_modal_inputs"][0]["image_grid_thw"], torch.tensor([[1, 4, 4]]))


def test_images_as_plain_paths_in_jsonl_and_plain_bytes_in_parquet(tmp_path, vlm):
    _, processor = vlm
    Image.new("RGB", (56, 56), (0, 255, 0)).save(tmp_path / "green.png")
    rows = [row("<image>?", ["green.png"])]
    from_jsonl = PromptDataset(
        [str(write_rows(rows, tmp_path / "rows.jsonl"))],
        processor.tokenizer,
        processor=processor,
        max_prompt_length=64,
    )
    from_parquet = dataset(tmp_path, [row("<image>?", [png(56, 56, (0, 255, 0))])], vlm)
    assert from_jsonl[0]["input_ids"] == from_parquet[0]["input_ids"]
    assert torch.equal(
        from_jsonl[0]["multi_modal_inputs"]["pixel_values"],
        from_parquet[0]["multi_modal_inputs"]["pixel_values"],
    )


def test_the_prompt_length_counts_the_image_tokens(tmp_path, vlm):
    rows = [row("<image>Which colour?", [png(56, 56, (255, 0, 0))])]
    widened = len(dataset(tmp_path, rows, vlm)[0]["input_ids"])
    with pytest.raises(DataError, match=rf"rows.parquet row 0: prompt is {widened} tokens"):
        dataset(tmp_path, rows, vlm, max_prompt_length=widened - 1)
    with pytest.raises(DataError, match="a prompt with images is not cut"):
        dataset(tmp_path, rows, vlm, max_prompt_length=widened - 1, truncation="left")
    assert (
        len(
            dataset(
                tmp_path, [*rows, row("short", None)], vlm, max_prompt_length=widened - 1, truncation="filter"
            )
        )
        == 1
    )


@pytest.mark.parametrize(
    ("images", "content", "message"),
    [
        (
            [png(56, 56, (0, 0, 0))],
            "two <image> markers <image>",
            r"row 0: the prompt has 2 <image> placeholder\(s\) and field 'images' 1 image",
        ),
        ([b"not a png"], "<image>?", r"row 0: images\[0\]: 9 bytes do not decode as an image"),
        (["missing.png"], "<image>?", r"row 0: images\[0\]: no image file at .*missing.png"),
        (
            [{"bytes": None, "path": None}],
            "<image>?",
            r"row 0: images\[0\] is a dict without 'bytes' or 'path'",
        ),
        ([3], "<image>?", r"row 0: images\[0\] must be bytes, a path or a"),
    ],
    ids=["count", "undecodable", "missing-file", "empty-dict", "wrong-type"],
)
def test_a_bad_image_row_is_named(tmp_path, vlm, images, content, message):
    with pytest.raises(DataError, match=message):
        dataset(tmp_path, [row(content, images)], vlm)


def test_images_for_a_model_without_a_processor_are_refused(tmp_path, vlm, tokenizer):
    path = write_rows([row("<image>?", [png(56, 56, (0, 0, 0))])], tmp_path / "rows.parquet")
    with pytest.raises(DataError, match="row 0: the row has 'images' but the model has no image processor"):
        PromptDataset([str(path)], tokenizer, max_prompt_length=64)


# ---- SFT rows with images --------------------------------------------------------------------------------


def test_sft_rows_with_images_widen_the_prompt_and_train_the_response_alone(tmp_path, vlm):
    from tandem.data import SFTDataset, collate_sft

    _, processor = vlm
    tokenizer = processor.tokenizer
    rows = [
        row("<image>How many red?", [{"bytes": png(56, 56, (255, 0, 0)), "path": None}], response="2"),
        row("Just text.", None, response="ok"),
    ]
    path = write_rows(rows, tmp_path / "sft.parquet")
    data = SFTDataset([str(path)], tokenizer, max_length=64, processor=processor)
    pad = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    prompts = dataset(
        tmp_path, [{**r, "response": None} for r in rows], vlm
    )  # the RL prompts of the same rows
    with_image, text = data[0], data[1]
    # the prompt as the RL dataset widens it, then "2" and EOS, the only trained tokens
    assert with_image["input_ids"] == [
        *prompts[0]["input_ids"],
        *tokenizer("2")["input_ids"],
        tokenizer.eos_token_id,
    ]
    assert with_image["input_ids"].count(pad) == 4
    assert with_image["loss_mask"] == [0] * len(prompts[0]["input_ids"]) + [1, 1]
    assert with_image["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert torch.equal(
        with_image["multi_modal_inputs"]["pixel_values"], prompts[0]["multi_modal_inputs"]["pixel_values"]
    )
    assert text["multi_modal_inputs"] is None and text["input_ids"].count(pad) == 0
    batch = collate_sft([with_image, text], tokenizer.pad_token_id)
    assert batch["input_ids"].shape == (2, len(with_image["input_ids"]))
    assert batch["multi_modal_inputs"][1] is None
    assert torch.equal(batch["multi_modal_inputs"][0]["image_grid_thw"], torch.tensor([[1, 4, 4]]))
    # the image tokens count in max_length
    with pytest.raises(DataError, match=r"row 0: prompt \+ response \+ EOS is \d+ tokens, longer than"):
        SFTDataset([str(path)], tokenizer, max_length=len(with_image["input_ids"]) - 1, processor=processor)


def test_sft_image_rows_that_cannot_be_read_are_named(tmp_path, vlm, tokenizer):
    from tandem.data import SFTDataset

    _, processor = vlm
    image = [{"bytes": png(56, 56, (255, 0, 0)), "path": None}]
    conversation = [{"role": "user", "content": "?"}, {"role": "assistant", "content": "<image>1"}]
    path = write_rows([row("<image>?", image, messages=conversation)], tmp_path / "conv.parquet")
    with pytest.raises(
        DataError, match=r"row 0: field 'messages' message 1 is the assistant's and holds <image>"
    ):
        SFTDataset([str(path)], processor.tokenizer, max_length=64, processor=processor)
    path = write_rows([row("<image>?", image, response="1")], tmp_path / "text.parquet")
    with pytest.raises(DataError, match="row 0: the row has 'images' but the model has no image processor"):
        SFTDataset([str(path)], tokenizer, max_length=64)
    path = write_rows([row("<image><image>?", image, response="1")], tmp_path / "count.parquet")
    with pytest.raises(DataError, match="row 0: the prompt has 2 <image> placeholder"):
        SFTDataset([str(path)], processor.tokenizer, max_length=64, processor=processor)


def test_an_sft_conversation_with_images_widens_each_in_its_turn_and_trains_the_replies(tmp_path, vlm):
    import io

    from tandem.data import SFTDataset
    from tandem.models.tiny import IM_END

    _, processor = vlm
    tokenizer = processor.tokenizer
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    conversation = [
        {"role": "user", "content": "<image>How many red?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "And here <image>?"},
        {"role": "assistant", "content": "13"},
    ]
    images = [
        {"bytes": png(56, 56, (255, 0, 0)), "path": None},
        {"bytes": png(84, 56, (0, 0, 255)), "path": None},
    ]
    path = write_rows([row("unused", images, messages=conversation)], tmp_path / "conv.parquet")
    data = SFTDataset([str(path)], tokenizer, max_length=128, processor=processor, stop_token_ids=[im_end])
    item = data[0]
    # the whole conversation as the processor widens it: 4 + 6 image tokens, each image in its own user turn
    items = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many red?"}]},
        {"role": "assistant", "content": "2"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "And here "},
                {"type": "image"},
                {"type": "text", "text": "?"},
            ],
        },
        {"role": "assistant", "content": "13"},
    ]
    text = processor.apply_chat_template(items, tokenize=False)
    decoded = [Image.open(io.BytesIO(image["bytes"])).convert("RGB") for image in images]
    expected = processor(text=[text], images=decoded, return_tensors="pt")["input_ids"][0].tolist()
    assert item["input_ids"] == expected
    assert item["input_ids"].count(tokenizer.convert_tokens_to_ids(IMAGE_PAD)) == 10
    trained = [token for token, on in zip(item["input_ids"], item["loss_mask"]) if on]
    assert trained == [*tokenizer("2")["input_ids"], im_end, *tokenizer("13")["input_ids"], im_end]
    assert item["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 6]]
