"""Qwen2-VL's processor and vLLM's Qwen2-VL model without torchvision.

torchvision has no build for torch 2.13 on CPU (the pinned torch; a torchvision wheel of another torch
fails at import: "operator torchvision::nms does not exist"), and two libraries reach for it on the way to
Qwen2-VL although images need only PIL:

1. transformers 5.19: `Qwen2VLProcessor` lists a video processor among its parts, and Qwen2-VL's video
   processor exists only on torchvision, so the processor can be neither built nor loaded ("requires the
   Torchvision library"). Without torchvision the processor's parts are the image processor (its PIL
   backend, which transformers picks by itself) and the tokenizer: no videos.
2. vLLM 0.32: its Qwen2-VL model imports `smart_resize` from transformers' torchvision image-processing
   module (the PIL module defines the same function), and it asks the processor's video processor for its
   settings. The PIL module stands in for the torchvision one, and the model declares images only. vLLM
   inspects model classes in a subprocess, which would import the original module: the class is
   registered in this process instead (the engine runs in this process: VLLM_ENABLE_V1_MULTIPROCESSING=0).

Each step is a no-op where torchvision imports. tests/data/test_without_torchvision.py fails when a library
stops needing (or changes) what is adapted here.
"""

from __future__ import annotations

import sys

from transformers.utils import is_torchvision_available

QWEN2_VL_TORCHVISION_MODULE = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
_done: set[str] = set()


def adapt_transformers() -> bool:
    """Qwen2VLProcessor of an image processor and a tokenizer; True when adapted (no torchvision)."""
    if is_torchvision_available():
        return False
    if "transformers" not in _done:
        from transformers import Qwen2VLProcessor

        Qwen2VLProcessor.get_attributes = classmethod(lambda cls: ["image_processor", "tokenizer"])
        _done.add("transformers")
    return True


def adapt_vllm() -> bool:
    """vLLM's Qwen2-VL on images only, importable without torchvision (adapts transformers too)."""
    if not adapt_transformers():
        return False
    if "vllm" not in _done:
        from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl

        sys.modules.setdefault(QWEN2_VL_TORCHVISION_MODULE, image_processing_pil_qwen2_vl)
        from vllm import ModelRegistry
        from vllm.model_executor.models.qwen2_vl import Qwen2VLForConditionalGeneration, Qwen2VLProcessingInfo

        Qwen2VLProcessingInfo.get_supported_mm_limits = lambda self: {"image": None}
        ModelRegistry.register_model("Qwen2VLForConditionalGeneration", Qwen2VLForConditionalGeneration)
        _done.add("vllm")
    return True
