"""How each LoRA adapter's A is drawn (actor.lora.init_a; B starts at 0 either way): kaiming-uniform as PEFT draws
it, or xavier-uniform as megatron-bridge (verl's megatron LoRA, whose default it is) draws it; `auto` is the
engine's verl default. On the tiny Qwen2 with PEFT's real injection, in process."""

from __future__ import annotations

import math

import pytest
import torch

from tandem.config import load_config
from tandem.config.errors import ConfigError
from tandem.config.schema import LoraConfig
from tandem.config.verl import translate_overrides
from tandem.engine.fsdp.lora import inject, lora_layers
from tandem.models.tiny import build_model, build_tokenizer
from tandem.train_engine_options import lora_init_a

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 1}


def _adapters(init_a: str, seed: int = 0) -> dict[str, torch.nn.Module]:
    model = build_model(build_tokenizer(), **SMALL)
    return lora_layers(inject(model, LoraConfig(rank=8, alpha=16.0), seed=seed, init_a=init_a))


def test_xavier_draws_each_a_within_its_glorot_bound_and_b_stays_zero():
    kaiming, xavier = _adapters("kaiming"), _adapters("xavier")
    assert kaiming.keys() == xavier.keys() and len(xavier) == 7  # q k v o gate up down of the one layer
    for name, layer in xavier.items():
        a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        rank, fan_in = a.shape
        bound = math.sqrt(6 / (fan_in + rank))  # xavier-uniform: U(-b, b)
        assert a.abs().max() <= bound and a.abs().max() > 0.8 * bound, name
        assert float(a.std()) == pytest.approx(bound / math.sqrt(3), rel=0.15), (
            name
        )  # U(-b, b): std b / sqrt 3
        assert not torch.equal(a, kaiming[name].lora_A["default"].weight), name
        assert torch.count_nonzero(b) == 0, name
        # kaiming-uniform with a = sqrt(5): U(-1 / sqrt(fan_in), 1 / sqrt(fan_in)), PEFT's draw
        assert kaiming[name].lora_A["default"].weight.abs().max() <= 1 / math.sqrt(fan_in), name
    again = _adapters("xavier")  # the seed alone decides the draw
    assert all(
        torch.equal(again[n].lora_A["default"].weight, xavier[n].lora_A["default"].weight) for n in xavier
    )


def test_auto_is_each_engines_verl_default_and_an_explicit_choice_wins():
    assert (lora_init_a("fsdp", "auto"), lora_init_a("megatron", "auto")) == ("kaiming", "xavier")
    assert (lora_init_a("fsdp", "xavier"), lora_init_a("megatron", "kaiming")) == ("xavier", "kaiming")


def test_the_key_and_verls_spelling():
    assert load_config(overrides=["actor.lora.rank=4"]).actor.lora.init_a == "auto"
    assert (
        load_config(overrides=["actor.lora.rank=4", "actor.lora.init_a=xavier"]).actor.lora.init_a == "xavier"
    )
    with pytest.raises(ConfigError, match="actor.lora.init_a"):
        load_config(overrides=["actor.lora.rank=4", "actor.lora.init_a=normal"])
    megatron = (
        "actor_rollout_ref.actor.strategy=megatron"  # verl's megatron workers read the model.lora block
    )
    for value in ("kaiming", "xavier"):
        t = translate_overrides([megatron, f"actor_rollout_ref.model.lora.lora_A_init_method={value}"])
        assert (t.overrides, t.problems) == (["actor.strategy=megatron", f"actor.lora.init_a={value}"], [])
    # verl's FSDP workers do not read it (config/verl/engine_keys.py): its default has no effect, another is refused
    assert translate_overrides(["actor_rollout_ref.model.lora.lora_A_init_method=xavier"]).overrides == []
    ((key, message),) = translate_overrides(
        ["actor_rollout_ref.model.lora.lora_A_init_method=kaiming"]
    ).problems
    assert (
        key == "actor_rollout_ref.model.lora.lora_A_init_method" and "verl's megatron workers read" in message
    )


def test_xavier_draws_each_expert_of_a_fused_adapter_within_its_own_bound():
    """A mixture-of-experts model's fused expert tensors (PEFT's ParamWrapper, A [E r, in]): each expert's A_e
    [r, in] within sqrt(6 / (in + r)) (megatron-bridge's draw of every expert's A), not the stack's bound; the
    routers' adapters (E = 1 there) as a linear's; B 0; the seed alone decides."""
    from peft.tuners.lora.layer import ParamWrapper
    from transformers import AutoModelForCausalLM

    from tandem.models.tiny_families import family_config

    def adapters(init_a: str) -> dict[str, torch.nn.Module]:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(family_config("qwen3_moe"))
        settings = LoraConfig(rank=8, alpha=16.0, target_modules=["all-linear"])
        return lora_layers(inject(model, settings, seed=0, init_a=init_a))

    xavier, kaiming = adapters("xavier"), adapters("kaiming")
    fused = {name: layer for name, layer in xavier.items() if isinstance(layer, ParamWrapper)}
    assert {layer.num_experts for layer in fused.values()} == {1, 4}  # routers and experts
    for name, layer in fused.items():
        a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        per_expert = a.reshape(layer.num_experts, -1, a.shape[-1])  # [E, r, in]
        rank, fan_in = per_expert.shape[1:]
        bound = math.sqrt(6 / (fan_in + rank))
        for e, a_e in enumerate(per_expert):
            assert a_e.abs().max() <= bound and a_e.abs().max() > 0.8 * bound, (name, e)
        assert float(a.std()) == pytest.approx(bound / math.sqrt(3), rel=0.15), name
        assert not torch.equal(a, kaiming[name].lora_A["default"].weight), name
        assert torch.count_nonzero(b) == 0, name
    again = adapters("xavier")
    assert all(
        torch.equal(again[n].lora_A["default"].weight, xavier[n].lora_A["default"].weight) for n in fused
    )
