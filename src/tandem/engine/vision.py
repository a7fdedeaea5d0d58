"""A vision-language model (Qwen2-VL) in the FSDP2 engine: its image inputs per micro-batch, and its vision
tower run on every rank in every forward.

A micro-batch's rows carry their prompt's processor outputs (`multi_modal_inputs`: `pixel_values`,
`image_grid_thw`; None for a row without images); the model reads them concatenated in row order, with
`mm_token_type_ids` marking the image tokens, and computes its multimodal rope positions itself from the
attention mask (so these micro-batches run padded, not packed).

FSDP2 shards the vision blocks like the decoder layers: gathering a block's weights, and reduce-scattering
its gradients, are collectives every rank must enter in the same order. A rank whose micro-batch has no image
would skip the vision tower while another runs it (measured: gloo aborts, EnforceNotMet). So where a forward
has no image, `VisionTower` runs the tower on one blank 28 x 28 image at the point where the images would
have been encoded (just before the text decoder) and adds its output times zero to the decoder's input:
the same collectives in the same order on every rank, and not a digit of any output changed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from tandem.batch import Batch


class VisionTower:
    """The image inputs of micro-batches for `model` (a transformers Qwen2-VL), and its blank-image pass."""

    def __init__(self, model: nn.Module) -> None:
        config = model.config
        self.image_token_id = config.image_token_id
        vision = config.vision_config
        self.visual = model.model.visual
        side = vision.spatial_merge_size  # one merged token: merge x merge patches of one frame pair
        self.blank_grid = torch.tensor([[1, side, side]])
        self.blank_pixels = torch.zeros(
            side * side, vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
        )
        self._images_in_forward = False
        model.model.language_model.register_forward_pre_hook(self._blank_pass, with_kwargs=True)

    def model_inputs(self, micro: Batch, device: torch.device) -> dict[str, Tensor]:
        """The model's keyword inputs for a padded micro-batch (no position ids: the model computes them)."""
        ids = micro["input_ids"]
        inputs = {"input_ids": ids, "attention_mask": micro["attention_mask"]}
        given = micro.get("multi_modal_inputs")  # a column of objects, or absent
        rows = [row for row in (given if given is not None else ()) if row is not None]
        self._images_in_forward = bool(rows)
        if rows:
            inputs["pixel_values"] = torch.cat([row["pixel_values"] for row in rows]).to(device)
            inputs["image_grid_thw"] = torch.cat([row["image_grid_thw"] for row in rows]).to(device)
            inputs["mm_token_type_ids"] = (ids == self.image_token_id).long()
        return inputs

    def _blank_pass(
        self, module: nn.Module, args: tuple, kwargs: dict[str, Any]
    ) -> tuple[tuple, dict[str, Any]]:
        if self._images_in_forward:
            return args, kwargs
        embeds = kwargs["inputs_embeds"]
        grid = self.blank_grid.to(embeds.device)
        out = self.visual(self.blank_pixels.to(embeds.device, embeds.dtype), grid_thw=grid)
        features = out.pooler_output if hasattr(out, "pooler_output") else out
        kwargs["inputs_embeds"] = embeds + 0.0 * features.sum()
        return args, kwargs
