"""LoRA on a mixture-of-experts model. PEFT (0.21) adapts a Hugging Face MoE model's fused expert tensors
([experts, ...] parameters, not linear layers) when target_modules is all-linear or names gate / up / down_proj;
Tandem folds adapters into linear weights only (FSDP2's merged weights, megatron's per-expert linears), so such a
run would train adapters the rollout and the export never see. It is refused by name on both engines (they share
engine/fsdp/lora.py's `inject`), and by the config check where the layout says MoE (megatron's expert_parallel),
as verl's megatron LoRA script for Qwen3-MoE asks for them. On a real tiny Qwen3-MoE."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from tandem.config import load_config
from tandem.config.errors import ConfigError
from tandem.engine.fsdp.lora import inject, lora_layers
from tandem.models.tiny_families import family_config


def _inject(*targets: str):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(family_config("qwen3_moe"))
    settings = SimpleNamespace(
        rank=4, alpha=8.0, dropout=0.0, target_modules=list(targets), exclude_modules=[], adapter_path=None
    )
    return inject(model, settings, seed=0)


@pytest.mark.parametrize("targets", [("all-linear",), ("q_proj", "gate_proj", "up_proj", "down_proj")])
def test_adapters_on_fused_experts_are_refused_naming_them(targets):
    with pytest.raises(
        ValueError, match=r"fused expert tensors \(model\.layers\.0\.mlp\.experts, .*q_proj,k_proj"
    ):
        _inject(*targets)


def test_attention_adapters_on_an_moe_model_are_built():
    layers = lora_layers(_inject("q_proj", "k_proj", "v_proj", "o_proj"))
    assert layers and all(
        name.rsplit(".", 1)[1] in {"q_proj", "k_proj", "v_proj", "o_proj"} for name in layers
    )


def test_the_config_check_refuses_verls_default_targets_with_expert_parallel():
    base = ["actor.strategy=megatron", "actor.lora.rank=8", "trainer.workers_per_node=2"]
    with pytest.raises(ConfigError, match="experts .*linear_fc1 / linear_fc2.*not build on megatron"):
        load_config(
            "grpo", [*base, "actor.megatron.expert_parallel=2", "actor.lora.target_modules=[all-linear]"]
        )
    cfg = load_config(
        "grpo",
        [*base, "actor.megatron.expert_parallel=2", "actor.lora.target_modules=[linear_qkv,linear_proj]"],
    )
    assert cfg.actor.lora.target_modules == ["linear_qkv", "linear_proj"]
