"""LoRA on the megatron engine (`actor.lora` with actor.strategy=megatron, engine/megatron/lora.py) over gloo,
against transformers, PEFT and the FSDP2 engine's LoRA.

Adapters of rank 4 (alpha 8) on every linear of the tiny model, TP=1 (with an FSDP2 run in the same rank) and TP=2
(megatron_lora_scenarios.py), two steps of the real actor's PPO loss. Tolerances (measured on this machine): the
model with B = 0 equals the base model exactly (the adapters add 0) and transformers' logits within 7e-7; after two
steps the adapters of TP=2 and of FSDP2 are 3e-6 / 2e-6 from TP=1's (asserted 2e-5: Adam's first steps divide
each gradient element by its own magnitude), log-probs 1e-6 (asserted 1e-5), the merged weights 5e-8 from
W + (alpha / r) B A (asserted 1e-6); the base weights are bit-equal before and after; a resumed checkpoint takes the
continuing engine's step exactly. The same two steps under sequence parallel (TP=2), PP=2 and PP=2 with 2 virtual
stages (the interleaved schedule) equal TP=1's within the same tolerances.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tandem.models.tiny import save_tiny

from . import megatron_lora_scenarios as ls
from . import megatron_scenarios as sc

pytest.importorskip("megatron.core")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SCALE = ls.LORA.alpha / ls.LORA.rank
TOL = 1e-5


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron_lora_models")
    return str(save_tiny(root / "policy")), str(save_tiny(root / "critic", num_labels=1))


@pytest.fixture(scope="module")
def runs(paths, tmp_path_factory):
    out = {tp: tmp_path_factory.mktemp(f"megatron_lora_tp{tp}") for tp in (1, 2)}
    return {tp: {"ranks": ls.run(tp, paths, out[tp]), "out": out[tp]} for tp in out}


def real(logits: torch.Tensor, batch) -> torch.Tensor:
    return logits[batch["attention_mask"].bool()]


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_with_b_zero_the_model_is_the_base_model(paths, runs):
    batch = sc.rollout_batch()
    expected = real(sc.transformers_logits(paths[0], batch), batch)
    for tp in (1, 2):
        for rank in runs[tp]["ranks"]:
            m = rank["megatron"]
            assert torch.equal(m["logits0"], m["base_logits0"])  # B = 0: the adapters add exactly 0
            torch.testing.assert_close(real(m["logits0"], batch), expected, rtol=0, atol=TOL)
            assert all(float(t.abs().max()) == 0 for n, t in m["adapters0"].items() if "lora_B" in n)


def test_only_the_adapters_train_and_the_base_weights_stay(paths, runs):
    base = load_file(f"{paths[0]}/model.safetensors")
    for tp in (1, 2):
        m = runs[tp]["ranks"][0]["megatron"]
        assert m["trainable"] and all("_lora.lora_" in name for name in m["trainable"])
        # the tiny model's 4 layers x 7 projections, an A and a B each; at TP=1 the optimizer holds the adapters
        assert len(m["adapters2"]) == 4 * 7 * 2
        if tp == 1:
            assert m["optimizer_params"] == sum(t.numel() for t in m["adapters2"].values())
        assert m["base0"].keys() == m["base2"].keys()
        assert all(torch.equal(m["base0"][k], m["base2"][k]) for k in m["base0"])
        # weights out (rollout, export): every adapter folded into its base weight, the rest as they were
        merged = m["merged2"]
        for name, tensor in merged.items():
            module = name.removesuffix(".weight")
            a = m["adapters2"].get(f"base_model.model.{module}.lora_A.weight")
            expected = (
                base[name]
                if a is None
                else base[name] + SCALE * (m["adapters2"][f"base_model.model.{module}.lora_B.weight"] @ a)
            )
            torch.testing.assert_close(tensor, expected, rtol=0, atol=1e-6, msg=name)


def test_tp2_equals_tp1_and_megatron_equals_fsdp2(runs):
    tp1 = runs[1]["ranks"][0]
    m, fsdp = tp1["megatron"], tp1["fsdp"]
    for other in (fsdp, *(r["megatron"] for r in runs[2]["ranks"])):
        assert max_diff(other["adapters0"], m["adapters0"]) == 0  # the same draw of A
        assert max_diff(other["adapters2"], m["adapters2"]) < 2e-5
        torch.testing.assert_close(
            other["log_probs2"]["old_log_probs"], m["log_probs2"]["old_log_probs"], rtol=0, atol=TOL
        )
        for step in ("step1", "step2"):
            assert other[step]["grad_norm"] == pytest.approx(m[step]["grad_norm"], rel=TOL)
            assert other[step]["loss"] == pytest.approx(m[step]["loss"], rel=TOL)
    # the adapters moved: the comparison above is not of two untrained models
    assert max_diff(m["adapters2"], m["adapters0"]) > 1e-4


def test_sequence_parallel_and_pipeline_layouts_equal_tp1(paths, runs):
    base = load_file(f"{paths[0]}/model.safetensors")
    m = runs[1]["ranks"][0]["megatron"]
    built = {"tp2sp": (1, True, [4]), "pp2": (2, False, [2]), "pp2vp2": (2, False, [1, 1])}
    for name in ls.LAYOUTS:
        for rank in runs[2]["ranks"]:
            other = rank["layouts"][name]
            assert other["built"] == built[name]
            assert torch.equal(other["logits0"], other["base_logits0"]), name  # B = 0 adds exactly 0
            assert max_diff(other["adapters0"], m["adapters0"]) == 0, name
            assert max_diff(other["adapters2"], m["adapters2"]) < 2e-5, name
            torch.testing.assert_close(
                other["log_probs2"]["old_log_probs"], m["log_probs2"]["old_log_probs"], rtol=0, atol=TOL
            )
            for step in ("step1", "step2"):
                assert other[step]["grad_norm"] == pytest.approx(m[step]["grad_norm"], rel=TOL), (name, step)
                assert other[step]["loss"] == pytest.approx(m[step]["loss"], rel=TOL), (name, step)
            assert all(torch.equal(other["base0"][k], other["base2"][k]) for k in other["base0"])
        merged, adapters = runs[2]["ranks"][0]["layouts"][name]["merged2"], other["adapters2"]
        assert merged.keys() == m["merged2"].keys()
        for key, tensor in merged.items():  # weights out gathers every stage's merged weights
            module = key.removesuffix(".weight")
            a = adapters.get(f"base_model.model.{module}.lora_A.weight")
            b = adapters.get(f"base_model.model.{module}.lora_B.weight")
            expected = base[key] if a is None else base[key] + SCALE * (b @ a)
            torch.testing.assert_close(tensor, expected, rtol=0, atol=1e-6, msg=f"{name} {key}")
        folder = runs[2]["out"] / f"megatron-{name}-adapter0"
        assert load_file(str(folder / "adapter_model.safetensors")).keys() == m["adapters2"].keys()


def test_the_reference_is_the_base_model_after_training(paths, runs):
    batch = sc.rollout_batch()
    expected = real(sc.transformers_logits(paths[0], batch), batch)
    m = runs[2]["ranks"][0]["megatron"]
    torch.testing.assert_close(real(m["base_logits2"], batch), expected, rtol=0, atol=TOL)
    assert float((m["logits2"] - m["base_logits2"]).abs().max()) > 1e-3


def test_the_saved_adapter_loads_in_peft(paths, runs):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    batch = sc.rollout_batch()
    m = runs[2]["ranks"][0]["megatron"]
    folder = runs[2]["out"] / "megatron-adapter0"
    assert load_file(str(folder / "adapter_model.safetensors")).keys() == m["adapters2"].keys()
    base = AutoModelForCausalLM.from_pretrained(paths[0], dtype=torch.float32)
    model = PeftModel.from_pretrained(base, folder).eval()
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
            use_cache=False,
        ).logits
    torch.testing.assert_close(real(logits, batch), real(m["logits2"], batch), rtol=0, atol=TOL)


def test_a_resumed_checkpoint_takes_the_continuing_step(runs):
    for rank in runs[2]["ranks"]:
        m = rank["megatron"]
        assert m["resumed"]["loss"] == m["continued"]["loss"]
        assert m["resumed"]["grad_norm"] == m["continued"]["grad_norm"]
        assert max_diff(m["resumed_adapters"], m["continued_adapters"]) == 0
