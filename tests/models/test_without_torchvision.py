"""models/without_torchvision.py: what it adapts is still there to adapt (this test fails when transformers or
vLLM change it, or when torchvision becomes importable with the pinned torch)."""

from __future__ import annotations

import importlib.util
import inspect

import pytest

from tandem.models.without_torchvision import QWEN2_VL_TORCHVISION_MODULE, adapt_transformers, adapt_vllm


def test_torchvision_is_still_missing_for_the_pinned_torch():
    from transformers.utils import is_torchvision_available

    assert not is_torchvision_available()  # else the adapters are no-ops: drop the module


def test_qwen2_vl_processor_lists_a_video_processor_until_adapted():
    from transformers import Qwen2VLProcessor

    assert "video_processor" in inspect.signature(Qwen2VLProcessor.__init__).parameters
    assert adapt_transformers()
    assert Qwen2VLProcessor.get_attributes() == ["image_processor", "tokenizer"]


def test_vllm_s_qwen2_vl_still_imports_the_torchvision_image_module():
    spec = importlib.util.find_spec("vllm.model_executor.models.qwen2_vl")
    if spec is None:
        pytest.skip("vLLM is not installed")
    source = open(spec.origin).read()  # noqa: SIM115 - read once
    assert QWEN2_VL_TORCHVISION_MODULE in source
    assert adapt_vllm()
    from vllm.model_executor.models.qwen2_vl import Qwen2VLProcessingInfo

    assert Qwen2VLProcessingInfo.get_supported_mm_limits(object()) == {"image": None}
