"""Model FLOPs and MFU (engine/flops.py) against counts made by hand from the model's shape."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import MixtralConfig

from tandem.engine import flops
from tandem.engine.flops import ModelFlops, mfu_metrics, peak_flops
from tandem.models.tiny import save_tiny


def qwen2_layer(h: int, kv: int, ffn: int) -> int:
    """One Qwen2 decoder layer: q, k, v with biases, o without, the gated MLP, two RMSNorms."""
    return (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * ffn + 2 * h


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("flops") / "model")


def test_dense_model_counts_by_hand(tiny):
    lm, value = ModelFlops.from_folder(tiny), ModelFlops.from_folder(tiny, "value")
    h, kv, ffn, layers = 256, 2 * 64, 768, 4  # save_tiny: 4 heads of 64, 2 KV heads
    vocab = 320
    body = layers * qwen2_layer(h, kv, ffn) + h  # + the final norm; the embedding is not a matmul
    assert lm == ModelFlops(params=body + vocab * h, layers=layers, hidden=h)  # the tied head counted once
    assert value == ModelFlops(params=body + h, layers=layers, hidden=h)  # a 1-wide score head


def test_forward_flops_by_hand():
    model = ModelFlops(params=1000.0, layers=2, hidden=8)
    mask = torch.tensor([[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]])  # sequences of 3 and 5 tokens
    # 2 N T + 4 L H (3^2 + 5^2)
    assert model.forward(mask) == 2 * 1000 * 8 + 4 * 2 * 8 * (9 + 25)


def test_mixture_of_experts_counts_the_routed_share(tmp_path):
    h, ffn, experts, top_k, layers, vocab, kv = 64, 96, 4, 2, 2, 100, 32
    MixtralConfig(
        vocab_size=vocab,
        hidden_size=h,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=experts,
        num_experts_per_tok=top_k,
        tie_word_embeddings=False,
    ).save_pretrained(tmp_path)
    model = ModelFlops.from_folder(tmp_path)
    attention = h * h + 2 * h * kv + h * h  # no biases
    expert = 3 * h * ffn
    router = h * experts
    per_layer = attention + router + top_k * expert + 2 * h  # top_k of the experts' weights per token
    assert model.params == pytest.approx(layers * per_layer + h + vocab * h)
    assert model.params < layers * (attention + router + experts * expert + 2 * h) + h + vocab * h


def test_peak_flops_configured_table_and_measured(monkeypatch, caplog):
    cuda = torch.device("cuda", 0)
    assert peak_flops(cuda, torch.bfloat16, configured=5e14) == 5e14
    names = iter(["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB", "Some GPU"])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: next(names))
    assert peak_flops(cuda, torch.bfloat16) == 989e12
    assert peak_flops(cuda, torch.float32) == 51e12  # PCIe, matched before the SXM entry
    assert peak_flops(cuda, torch.bfloat16) == 312e12
    with caplog.at_level(logging.WARNING):
        assert peak_flops(cuda, torch.bfloat16) is None
    assert "set trainer.peak_flops" in caplog.text
    measured = []
    monkeypatch.setattr(
        "tandem.engine.flops.matmul_rate", lambda dtype, shape, repeats: measured.append(shape) or 1.5e11
    )
    assert peak_flops(torch.device("cpu"), torch.float32) == 1.5e11
    assert measured == [flops.CPU_PROBE]


def test_mfu_by_hand():
    metrics = {
        "perf/peak_flops_per_device": 1e9,
        "perf/update_flops/actor": 6e9,
        "timing_s/update_actor": 2.0,
        "perf/update_flops/critic": 3e9,
        "timing_s/update_critic": 1.0,
    }
    assert mfu_metrics(metrics, {"actor": 3, "critic": 2}) == {"perf/mfu/actor": 1.0, "perf/mfu/critic": 1.5}
    no_peak = {k: v for k, v in metrics.items() if k != "perf/peak_flops_per_device"}
    assert mfu_metrics(no_peak, {"actor": 3}) == {}
    assert mfu_metrics(metrics, {}) == {}
