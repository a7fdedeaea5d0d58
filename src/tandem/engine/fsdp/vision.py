"""A vision-language model (Qwen2-VL) in the FSDP2 engine: its image inputs per micro-batch, and its vision
tower run on every rank in every forward.

A micro-batch's rows carry their prompt's processor outputs (`multi_modal_inputs`: `pixel_values`,
`image_grid_thw`; None for a row without images). Their multimodal rope positions (temporal, height, width)
come from the model's own `get_rope_index` on the padded rows, each row counted from its first real token,
whether or not the micro-batch holds an image (left to itself, the model counts a micro-batch without images
from its first column, padding included: the same attention, rope being relative, but other positions than
the rollout's). Packed (data/packing.py), they are packed with the tokens under the plain restarting
positions that transformers reads the sequence boundaries from: position ids [4, rows, width], text first.

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
from tandem.data.packing import Packing, pack_model_inputs


def vision_tower(model: nn.Module) -> nn.Module:
    """The vision encoder of `model` (a transformers Qwen2-VL: `model.model.visual`, its patch embedding, blocks and
    the merger into the language model's width)."""
    return model.model.visual


class VisionTower:
    """The image inputs of micro-batches for `model` (a transformers Qwen2-VL), and the hook that encodes them."""

    def __init__(self, model: nn.Module) -> None:
        config = model.config
        self.image_token_id = config.image_token_id
        vision = config.vision_config
        self.visual = vision_tower(model)
        self.rope_index = model.model.get_rope_index
        self.merge = vision.spatial_merge_size
        self.blank_grid = torch.tensor([[1, self.merge, self.merge]])  # one merged token
        self.blank_pixels = torch.zeros(
            self.merge**2, vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
        )
        # the next forward's pixels, grids, where their features go, and in which order (None: as they come)
        self._images: tuple[Tensor, Tensor, Tensor, Tensor | None] | None = None
        model.model.language_model.register_forward_pre_hook(self._encode, with_kwargs=True)

    def model_inputs(
        self, micro: Batch, device: torch.device, pad_id: int | None = None
    ) -> tuple[dict[str, Tensor], Packing | None]:
        """The model's keyword inputs for a micro-batch, and its packing: padded, or, given the `pad_id` to fill
        free slots with, packed. The images themselves wait for the hook."""
        ids, mask = micro["input_ids"], micro["attention_mask"]
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
        present = [images for images in rows if images is not None]
        self._images = None
        grids = pixels = None  # on the micro-batch's device, as the ids; the hook moves them to the model's
        if present:
            grids = torch.cat([images["image_grid_thw"] for images in present])
            pixels = torch.cat([images["pixel_values"] for images in present])
        rope, _ = self.rope_index(
            ids,
            mm_token_type_ids=places.long(),
            image_grid_thw=grids,
            attention_mask=mask,
        )  # [3, B, T]: each row's positions from its first real token, its images' over time, height, width
        if pad_id is None:
            if present:
                self._images = (pixels, grids, places.to(device), None)
            return {"input_ids": ids, "attention_mask": mask, "position_ids": rope}, None
        inputs, packing = pack_model_inputs(ids, mask, pad_id)
        text = inputs["position_ids"]
        real = packing.pack(mask.bool(), fill=False)
        planes = [torch.where(real, packing.pack(plane.to(text.dtype)), text) for plane in rope]
        inputs["position_ids"] = torch.stack([text, *planes])
        if present:
            # features come in row order (a row's images in order); the packed rows hold them in another order
            order = (places.flatten().cumsum(0) - 1).view(places.shape).masked_fill(~places, -1)
            packed_order = packing.pack(order, fill=-1)
            at = packed_order >= 0
            self._images = (pixels, grids, at.to(device), packed_order[at].to(device))
        return inputs, packing

    def _encode(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        embeds = kwargs["inputs_embeds"]
        if self._images is None:  # the blank pass (see the module docstring)
            out = self.visual(
                self.blank_pixels.to(embeds.device, embeds.dtype), grid_thw=self.blank_grid.to(embeds.device)
            )
            kwargs["inputs_embeds"] = embeds + 0.0 * out.pooler_output.sum()
            return args, kwargs
        pixels, grids, places, order = self._images
        grids = grids.to(embeds.device)
        features = self.visual(pixels.to(embeds.device, embeds.dtype), grid_thw=grids).pooler_output.to(
            embeds.dtype
        )
        if order is not None:
            features = features[order]
        kwargs["inputs_embeds"] = embeds.masked_scatter(places[..., None], features)
        return args, kwargs
