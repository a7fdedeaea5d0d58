"""A vision-language model (Qwen2-VL) in the FSDP2 engine: its image inputs per micro-batch, and its vision
tower run on every rank in every forward.

A micro-batch's rows carry their prompt's processor outputs (`multi_modal_inputs`: `pixel_values`,
`image_grid_thw`; None for a row without images). The model computes its multimodal rope positions itself
from the attention mask, `mm_token_type_ids` and the image grids (so these micro-batches run padded, not
packed).

The image features are put in by `VisionTower`, not by the model: transformers finds an image's place by
its token id, and a response may hold that id too (the policy can sample `<|image_pad|>`, a plain token to
vLLM, which places images by the prompt's layout). Here the image tokens are the first ones of each row, as
many as its images widen to: the prompt's. A hook just before the text decoder runs the vision tower and
scatters its features there.

FSDP2 shards the vision blocks like the decoder layers: gathering a block's weights, and reduce-scattering
its gradients, are collectives every rank must enter in the same order. A rank whose micro-batch has no image
would skip the vision tower while another runs it (measured: gloo aborts, EnforceNotMet). So where a forward
has no image, the hook runs the tower on one blank 28 x 28 image and adds its output times zero to the
decoder's input: the same collectives in the same order on every rank, and no output changed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from tandem.batch import Batch


class VisionTower:
    """The image inputs of micro-batches for `model` (a transformers Qwen2-VL), and the hook that encodes them."""

    def __init__(self, model: nn.Module) -> None:
        config = model.config
        self.image_token_id = config.image_token_id
        vision = config.vision_config
        self.visual = model.model.visual
        self.merge = vision.spatial_merge_size
        self.blank_grid = torch.tensor([[1, self.merge, self.merge]])  # one merged token
        self.blank_pixels = torch.zeros(
            self.merge**2, vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
        )
        self._images: tuple[Tensor, Tensor, Tensor] | None = None  # the next forward's pixels, grids, places
        model.model.language_model.register_forward_pre_hook(self._encode, with_kwargs=True)

    def model_inputs(self, micro: Batch, device: torch.device) -> dict[str, Tensor]:
        """The model's keyword inputs for a padded micro-batch (no position ids: the model computes them); the
        images themselves wait for the hook."""
        ids = micro["input_ids"]
        given = micro.get("multi_modal_inputs")  # a column of objects, or absent
        rows = list(given) if given is not None else [None] * len(ids)
        places = torch.zeros_like(ids, dtype=torch.bool)
        for row, images in enumerate(rows):
            if images is None:
                continue
            count = int(images["image_grid_thw"].prod(-1).sum()) // self.merge**2
            found = (ids[row] == self.image_token_id).nonzero().flatten()
            if len(found) < count:
                raise ValueError(
                    f"a row's images widen to {count} tokens, its ids hold {len(found)} image tokens"
                )
            places[row, found[:count]] = True
        inputs = {"input_ids": ids, "attention_mask": micro["attention_mask"]}
        present = [images for images in rows if images is not None]
        self._images = None
        if present:
            grids = torch.cat([images["image_grid_thw"] for images in present]).to(device)
            pixels = torch.cat([images["pixel_values"] for images in present]).to(device)
            self._images = (pixels, grids, places.to(device))
            inputs["mm_token_type_ids"] = places.long()
            inputs["image_grid_thw"] = grids
        return inputs

    def _encode(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        embeds = kwargs["inputs_embeds"]
        if self._images is None:  # the blank pass (see the module docstring)
            out = self.visual(
                self.blank_pixels.to(embeds.device, embeds.dtype), grid_thw=self.blank_grid.to(embeds.device)
            )
            kwargs["inputs_embeds"] = embeds + 0.0 * out.pooler_output.sum()
            return args, kwargs
        pixels, grids, places = self._images
        features = self.visual(pixels.to(embeds.dtype), grid_thw=grids).pooler_output.to(embeds.dtype)
        kwargs["inputs_embeds"] = embeds.masked_scatter(places[..., None], features)
        return args, kwargs
