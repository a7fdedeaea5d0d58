"""Liger's fused kernels (engine/kernels.py, `actor.fsdp.liger`): refused with the reason where they cannot
run (no CUDA here, or no liger-kernel package), verl's `use_liger` maps to the key, and on a GPU with the
package (tests marked gpu) a patched model keeps its parameter names and gives the unpatched logits."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import AutoModelForCausalLM

from tandem.config.verl.translate import translate_overrides
from tandem.engine import kernels
from tandem.models.tiny import save_tiny


def test_liger_is_refused_where_it_cannot_run(monkeypatch):
    kernels.check_liger(False, torch.device("cpu"))  # off: nothing to check
    with pytest.raises(ValueError, match=r"actor.fsdp.liger=true needs a CUDA device .*device here: cpu"):
        kernels.check_liger(True, torch.device("cpu"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # a GPU machine without the package
    with pytest.raises(ValueError, match="needs the liger-kernel package: pip install liger-kernel"):
        kernels.check_liger(True, torch.device("cuda", 0))


def test_verls_use_liger_maps_to_the_key():
    translation = translate_overrides(["actor_rollout_ref.model.use_liger=True"])
    assert translation.overrides == ["actor.fsdp.liger=True"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None, reason="needs liger-kernel")
def test_liger_keeps_names_and_logits_on_cuda(tmp_path):
    path = save_tiny(tmp_path / "tiny")
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    patched = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    kernels.apply_liger(patched)
    assert [n for n, _ in patched.named_parameters()] == [n for n, _ in plain.named_parameters()]
    ids = torch.randint(4, 260, (2, 33), device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(
            patched(input_ids=ids).logits, plain(input_ids=ids).logits, rtol=0, atol=1e-4
        )
