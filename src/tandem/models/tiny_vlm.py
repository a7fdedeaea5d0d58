"""A tiny Qwen2-VL (vision-language model) built locally, with its processor, for tests and the visual task.

The text side is the tiny Qwen2 of tiny.py (its byte-level tokenizer plus Qwen2-VL's four vision tokens);
the vision side a one-block ViT with 14-pixel patches merged 2 x 2, so a 56 x 56 image is 16 patches and 4
image tokens. Sizes that vLLM's CPU build accepts: text heads of 32 dimensions (it has no kernel for 16)
and a multimodal-rope split summing to half of them.

The chat template takes a message's content as a string (an ``<image>`` in it stands for the next image, as
verl's rows write it) or as a list of ``{"type": "image"}`` / ``{"type": "text", "text": ...}`` items (what
released Qwen2-VL templates take); each image becomes ``<|vision_start|><|image_pad|><|vision_end|>``,
which the processor widens to the image's tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tandem.models.model_type import IMAGE_PLACEHOLDER
from tandem.models.tiny import IM_END, build_tokenizer, padded_vocab_size, save_tokenizer
from tandem.models.without_torchvision import adapt_transformers

VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = (
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
IMAGE_MARKUP = VISION_START + IMAGE_PAD + VISION_END
PATCH, MERGE = 14, 2

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}"
    "{{ message['content'] | replace('" + IMAGE_PLACEHOLDER + "', '" + IMAGE_MARKUP + "') }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '" + IMAGE_MARKUP + "' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_vlm(
    *,
    hidden_size: int = 128,
    intermediate_size: int = 256,
    num_layers: int = 2,
    vision_dim: int = 32,
    vision_depth: int = 1,
    seed: int = 0,
    max_image_pixels: int = 112 * 112,
) -> tuple[torch.nn.Module, object]:
    """(a randomly initialised Qwen2VLForConditionalGeneration in float32, its processor). Same seed, same
    weights; the global torch RNG is left untouched. Images are resized to at most `max_image_pixels`."""
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessorPil,
        Qwen2VLProcessor,
    )

    adapted = adapt_transformers()
    tokenizer = build_tokenizer(extra_special=VISION_TOKENS)
    tokenizer.chat_template = CHAT_TEMPLATE
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in VISION_TOKENS}
    heads = hidden_size // 32
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": padded_vocab_size(tokenizer),
            "hidden_size": hidden_size,
            "intermediate_size": intermediate_size,
            "num_hidden_layers": num_layers,
            "num_attention_heads": heads,
            "num_key_value_heads": max(heads // 2, 1),
            "max_position_embeddings": 2048,
            # temporal, height, width shares of the 16 rotary frequencies of a 32-dimension head
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]},
            "tie_word_embeddings": True,
            "attention_dropout": 0.0,
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "bos_token_id": tokenizer.eos_token_id,
        },
        vision_config={
            "depth": vision_depth,
            "embed_dim": vision_dim,
            "hidden_size": hidden_size,
            "num_heads": 2,
            "mlp_ratio": 2,
            "patch_size": PATCH,
            "spatial_merge_size": MERGE,
            "temporal_patch_size": 2,
            "in_channels": 3,
        },
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(config)
    model = model.to(torch.float32).eval()
    model.config.dtype = torch.float32
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=(PATCH * MERGE) ** 2,
        max_pixels=max_image_pixels,
        patch_size=PATCH,
        temporal_patch_size=2,
        merge_size=MERGE,
    )
    parts = {"image_processor": image_processor, "tokenizer": tokenizer}
    if not adapted:  # torchvision is there: the processor has its video part too (unused by Tandem)
        from transformers import Qwen2VLVideoProcessor

        parts["video_processor"] = Qwen2VLVideoProcessor(
            patch_size=PATCH, temporal_patch_size=2, merge_size=MERGE
        )
    processor = Qwen2VLProcessor(**parts, chat_template=CHAT_TEMPLATE)
    return model, processor


def save_tiny_vlm(path: str | Path, *, stop_at_im_end: bool = False, **kwargs: object) -> Path:
    """Write a Hugging Face folder holding a tiny Qwen2-VL (`build_vlm(**kwargs)`), its tokenizer and its
    processor; returns the folder. `stop_at_im_end`: generation also stops at <|im_end|>."""
    path = Path(path)
    model, processor = build_vlm(**kwargs)
    tokenizer = processor.tokenizer
    if stop_at_im_end:
        model.generation_config.eos_token_id = [
            tokenizer.eos_token_id,
            tokenizer.convert_tokens_to_ids(IM_END),
        ]
    model.save_pretrained(path, safe_serialization=True)
    processor.save_pretrained(path)
    save_tokenizer(tokenizer, path)
    return path
