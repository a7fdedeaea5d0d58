"""LoRA on a mixture-of-experts model's experts, on a real tiny Qwen3-MoE (4 experts, 2 layers).

PEFT (0.21) adapts a Hugging Face MoE model's fused expert tensors (mlp.experts: gate_up_proj [E, 2I, H],
down_proj [E, H, I]; one rank-r adapter per expert in a ParamWrapper) and its routers' weights when
target_modules is all-linear or names gate / up / down_proj. The FSDP2 engine folds each expert's adapter into its
slice of the fused tensor (engine/fsdp/lora.py `merged_weights`): checked against PEFT's own merge_and_unload and
forward with B not 0, in process and on 1 and 2 FSDP2 ranks (the export loads in transformers and its adapter
folder in PEFT, both giving the engine's logits). The megatron engine builds the same adapters, one per expert
(engine/megatron/lora.py ExpertAdapters): from the same draw, after two PPO steps (a tiny Qwen3-MoE with 2 query
groups) its adapters at expert parallel 1 equal FSDP2's within 2e-7 (log-probs 4.8e-7), EP=2's and TP=2 x EP=2's
(sequence parallel) equal EP=1's within 3e-8 and 1.6e-6 (asserted 2e-5 / 1e-5, as test_megatron_lora.py); its
merged weights are PEFT's merge_and_unload of its saved folder, which PeftModel loads to the engine's logits; a
checkpoint resumes exactly. Routers take no adapter on megatron:
all-linear leaves them out, naming one is an error."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from tandem.config import load_config
from tandem.engine.fsdp.lora import (
    adapter_state,
    fused_adapters,
    inject,
    lora_config,
    lora_layers,
    merged_weights,
    save_adapter,
)
from tandem.models.tiny_families import family_config, save_family

from . import lora_expert_scenarios as les
from .fsdp_scenarios import rollout_batch, spawn
from .test_fsdp import hf_logits

TOL = 1e-5
ROUTED = ("mlp.experts", "mlp.experts.base_layer", "mlp.gate")  # down_proj, gate_up_proj, the router
EXPERTS = ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj")


def _settings(*targets: str, dropout: float = 0.0) -> SimpleNamespace:
    return SimpleNamespace(
        rank=4,
        alpha=8.0,
        dropout=dropout,
        target_modules=list(targets),
        exclude_modules=[],
        adapter_path=None,
    )


def _base() -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(family_config("qwen3_moe")).eval()


def _random_b(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))


def _peft_twin(base: torch.nn.Module, ours: torch.nn.Module, settings) -> torch.nn.Module:
    """PEFT's own PeftModel on a copy of `base` with `ours`'s adapters (same names under base_model.model.)."""
    from peft import get_peft_model

    twin = get_peft_model(copy.deepcopy(base), lora_config(settings))
    mine = dict(ours.named_parameters())
    with torch.no_grad():
        for name, p in twin.named_parameters():
            if ".lora_" in name:
                p.copy_(mine[name.removeprefix("base_model.model.")])
    return twin.eval()


@pytest.mark.parametrize("targets", [("all-linear",), ("q_proj", "gate_proj", "up_proj", "down_proj")])
def test_merged_expert_weights_equal_peft_merge_and_unload(targets, tmp_path):
    base = _base()
    settings = _settings(*targets)
    ours = inject(copy.deepcopy(base), settings, seed=0)
    assert {"model.layers.0.mlp.experts", "model.layers.0.mlp.experts.base_layer"} <= set(
        fused_adapters(ours)
    )
    _random_b(ours, seed=1)
    twin = _peft_twin(base, ours, settings)
    ids = torch.randint(4, 300, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = ours(ids).logits
        torch.testing.assert_close(logits, twin(ids).logits, rtol=0, atol=1e-6)
    merged = dict(merged_weights(iter(ours.state_dict().items()), ours, lambda t: t))
    expected = twin.merge_and_unload().state_dict()
    assert merged.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(merged[name], tensor, rtol=0, atol=1e-6, msg=name)
    for name in EXPERTS:  # the experts moved: each expert's own update is in its slice
        moved = (merged[name] - base.state_dict()[name]).abs().amax(dim=(1, 2))
        assert (moved > 1e-3).all(), (name, moved)
    plain = AutoModelForCausalLM.from_config(family_config("qwen3_moe")).eval()
    plain.load_state_dict(merged)
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, logits, rtol=0, atol=TOL)

    # the adapters as a PEFT folder (our config, PEFT converts it on load as on inject): PEFT's logits
    from peft import PeftModel

    folder = save_adapter(
        tmp_path / "adapter", settings, adapter_state(ours.named_parameters(), lambda t: t), "x"
    )
    loaded = PeftModel.from_pretrained(copy.deepcopy(base), folder).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, logits, rtol=0, atol=1e-6)


def test_dropout_on_expert_adapters_names_the_key():
    with pytest.raises(ValueError, match=r"actor.lora.dropout=0.1 .*experts.*set actor.lora.dropout=0"):
        inject(_base(), _settings("all-linear", dropout=0.1), seed=0)
    attention = inject(_base(), _settings("q_proj", "k_proj", "v_proj", "o_proj"), seed=0)
    assert lora_layers(attention) and not fused_adapters(attention)


def test_megatron_expert_factors_are_peft_s_per_expert_update():
    """PEFT's fused layer as one (A_e, B_e) per expert: (alpha / r) B_e A_e is PEFT's delta of expert e, and
    fusing the experts' factors back gives PEFT's A and B (the saved folder's)."""
    from tandem.engine.megatron.lora import expert_factors, fuse_experts

    model = inject(_base(), _settings("gate_proj", "up_proj", "down_proj"), seed=0)
    _random_b(model, seed=4)
    for name in ("model.layers.0.mlp.experts", "model.layers.0.mlp.experts.base_layer"):
        layer = lora_layers(model)[name]
        delta = layer.get_delta_weight("default")  # [E, out, in]
        factors = [expert_factors(layer, e) for e in range(layer.num_experts)]
        for e, (a, b) in enumerate(factors):
            torch.testing.assert_close(layer.scaling["default"] * b @ a, delta[e], rtol=0, atol=1e-7)
        a, b = fuse_experts(factors)
        assert torch.equal(a, layer.lora_A["default"].weight) and torch.equal(
            b, layer.lora_B["default"].weight
        )


def test_the_adapter_sync_refuses_expert_adapters():
    """The worker's check before the first adapter sync (roles/worker.py): the merged sync serves them."""
    from tandem.roles.rollout import check_servable_adapters

    experts = fused_adapters(inject(_base(), _settings("all-linear"), seed=0))
    with pytest.raises(
        ValueError, match=r"rollout_sync=adapter: .* 6 adapters .*model\.layers\.0\.mlp\.experts, "
    ):
        check_servable_adapters([], experts)
    check_servable_adapters([], [])  # attention alone: served


def test_the_config_takes_megatron_lora_on_experts_under_expert_parallel():
    base = ["actor.strategy=megatron", "actor.lora.rank=8", "trainer.workers_per_node=2"]
    for targets in ("[all-linear]", "[linear_qkv,linear_proj,linear_fc1,linear_fc2]"):
        cfg = load_config(
            "grpo", [*base, "actor.megatron.expert_parallel=2", f"actor.lora.target_modules={targets}"]
        )
        assert cfg.actor.megatron.expert_parallel == 2 and cfg.actor.lora.rank == 8


@pytest.fixture(scope="module")
def moe_runs(tmp_path_factory):
    """A tiny Qwen3-MoE folder with a PEFT adapter folder (all-linear, B not 0) inside; 1 and 2 FSDP2 ranks."""
    from peft import get_peft_model

    root = tmp_path_factory.mktemp("lora_moe")
    path = save_family("qwen3_moe", root / "moe")
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    peft_model = get_peft_model(base, lora_config(_settings("all-linear")))
    _random_b(peft_model, seed=3)
    peft_model.save_pretrained(path / "adapter")
    out = {world: root / f"ranks{world}" for world in (1, 2)}
    return path, {
        world: {"ranks": spawn(les.run_rank, world, path, out[world]), "out": out[world]} for world in out
    }


def _peft_merged(path, raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """PEFT's merge_and_unload of the folder's base with the engine's adapters `raw` (in-engine names)."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), path / "adapter"
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(raw[name.removeprefix("base_model.model.")])
    return model.merge_and_unload().state_dict()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fsdp2_merges_expert_adapters_as_peft_and_two_ranks_equal_one(moe_runs):
    path, runs = moe_runs
    one, two = runs[1]["ranks"][0], runs[2]["ranks"][0]
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
    for merged, raw in (("merged0", "raw0"), ("merged2", "raw2")):
        expected = _peft_merged(path, one[raw])
        assert one[merged].keys() == expected.keys()
        for name, tensor in expected.items():
            torch.testing.assert_close(one[merged][name], tensor, rtol=0, atol=1e-6, msg=f"{merged} {name}")
    for name in EXPERTS:  # the folder's B is not 0: the experts' weights differ from the base's
        assert (one["merged0"][name] - base[name]).abs().max() > 1e-3, name
    assert one["experts"] == sorted(f"model.layers.{i}.{m}" for i in (0, 1) for m in ROUTED)
    trained = [n for n in one["raw2"] if ".lora_" in n and "mlp.experts" in n]
    assert len(trained) == 2 * 2 * 2 and all(not torch.equal(one["raw2"][n], one["raw0"][n]) for n in trained)

    for step in ("step1", "step2"):
        assert two[step]["loss"] == pytest.approx(one[step]["loss"], rel=TOL)
        assert two[step]["grad_norm"] == pytest.approx(one[step]["grad_norm"], rel=TOL)
    for name, tensor in one["merged2"].items():
        torch.testing.assert_close(two["merged2"][name], tensor, rtol=0, atol=TOL, msg=name)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_export_and_its_adapter_folder_give_the_engines_logits(moe_runs):
    from peft import PeftModel

    path, runs = moe_runs
    one, export = runs[1]["ranks"][0], runs[1]["out"] / "export"
    probe = rollout_batch(5, seed=1)
    real = probe["attention_mask"].bool()
    exported = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
    torch.testing.assert_close(hf_logits(exported, probe)[real], one["logits2"][real], rtol=0, atol=TOL)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, export / "lora_adapter").eval()
    torch.testing.assert_close(hf_logits(peft_model, probe)[real], one["logits2"][real], rtol=0, atol=TOL)


@pytest.fixture(scope="module")
def megatron_runs(tmp_path_factory):
    """The tiny Qwen3-MoE on megatron at expert parallel 1 (with FSDP2 in the same rank), 2, and TP=2 x EP=2."""
    pytest.importorskip("megatron.core")
    root = tmp_path_factory.mktemp("megatron_lora_moe")
    path = save_family("qwen3_moe", root / "moe", num_key_value_heads=2)  # 2 query groups: TP=2 cuts them
    out = {world: root / f"ep{world}" for world in (1, 2)}
    return path, {
        world: {"ranks": les.run_megatron(world, str(path), out[world]), "out": out[world]} for world in out
    }


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_megatron_expert_adapters_equal_fsdp2_at_expert_parallel_1_and_2(megatron_runs):
    _, runs = megatron_runs
    one = runs[1]["ranks"][0]
    m, fsdp = one["megatron"], one["fsdp"]
    experts = sorted(f"model.layers.{i}.mlp.experts{s}" for i in (0, 1) for s in ("", ".base_layer"))
    assert m["expert_adapters"] == fsdp["expert_adapters"] == experts  # no router
    assert torch.equal(m["logits0"], m["base_logits0"])  # B = 0: the adapters add exactly 0
    torch.testing.assert_close(m["logits0"], fsdp["logits0"], rtol=0, atol=TOL)
    # 2 layers x (4 experts x 2 linears + q, k, v, o), an A and a B each
    assert len(m["trainable"]) == 2 * (4 * 2 + 4) * 2 and all("_lora.lora_" in n for n in m["trainable"])
    assert m["optimizer_params"] == sum(t.numel() for t in m["adapters2"].values())
    assert all(torch.equal(m["base0"][k], m["base2"][k]) for k in m["base0"])
    assert _max_diff(m["adapters2"], m["adapters0"]) > 1e-4
    for name in experts:  # the experts' adapters moved, every expert's B
        b = m["adapters2"][f"base_model.model.{name}.lora_B.weight"]
        assert (b.reshape(b.shape[0], -1, 4).abs().amax(dim=(0, 1)) > 0).all(), name
    two = [r["megatron"] for r in runs[2]["ranks"]]
    tp2ep2 = [r["tp2ep2"] for r in runs[2]["ranks"]]
    assert all(r["built"] == (1, True, [2]) for r in tp2ep2)  # sequence parallel on, 2 layers
    for other in (fsdp, *two, *tp2ep2):
        assert _max_diff(other["adapters0"], m["adapters0"]) == 0  # the same draw of A
        assert _max_diff(other["adapters2"], m["adapters2"]) < 2e-5
        for step in ("step1", "step2"):
            assert other[step]["loss"] == pytest.approx(m[step]["loss"], rel=TOL)
            assert other[step]["grad_norm"] == pytest.approx(m[step]["grad_norm"], rel=TOL)
    torch.testing.assert_close(
        fsdp["log_probs2"]["old_log_probs"], m["log_probs2"]["old_log_probs"], rtol=0, atol=TOL
    )
    shares = torch.cat([r["log_probs2"]["old_log_probs"] for r in two])  # each data-parallel rank's rows
    torch.testing.assert_close(shares, m["log_probs2"]["old_log_probs"], rtol=0, atol=TOL)
    for rank in tp2ep2:  # one data-parallel rank: every row on both
        torch.testing.assert_close(
            rank["log_probs2"]["old_log_probs"], m["log_probs2"]["old_log_probs"], rtol=0, atol=TOL
        )
    for rank in tp2ep2:
        for name, tensor in m["merged2"].items():
            torch.testing.assert_close(rank["merged2"][name], tensor, rtol=0, atol=TOL, msg=name)
    for rank in two:  # weights out: every rank gets every expert's merged weights
        for name, tensor in m["merged2"].items():
            torch.testing.assert_close(rank["merged2"][name], tensor, rtol=0, atol=TOL, msg=name)
        assert rank["resumed"]["loss"] == rank["continued"]["loss"]
        assert _max_diff(rank["resumed_adapters"], rank["continued_adapters"]) == 0
    assert one["all_linear"] == sorted(m["adapters2"])  # all-linear: no router adapter on megatron
    assert "mlp.gate" in one["router_error"] and "router" in one["router_error"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_megatron_saved_expert_adapters_load_in_peft_and_merge_as_peft(megatron_runs):
    from peft import PeftModel

    from . import megatron_scenarios as sc

    path, runs = megatron_runs
    m = runs[1]["ranks"][0]["megatron"]
    for world, rank in ((1, 0), (2, 1)):
        folder = runs[world]["out"] / f"megatron-adapter{rank}"
        model = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), folder
        )
        state = dict(model.named_parameters())
        for name, tensor in m["adapters2"].items():  # PEFT reads the folder as the engine's fused layout
            key = name.replace(".lora_A.", ".lora_A.default.").replace(".lora_B.", ".lora_B.default.")
            torch.testing.assert_close(state[key], tensor, rtol=0, atol=2e-5, msg=key)
        batch = sc.rollout_batch()
        real = batch["attention_mask"].bool()
        if world == 1:
            with torch.no_grad():
                logits = model.eval()(
                    input_ids=batch["input_ids"],
                    attention_mask=batch["attention_mask"],
                    position_ids=batch["position_ids"],
                    use_cache=False,
                ).logits
            torch.testing.assert_close(logits[real], m["logits2"][real], rtol=0, atol=TOL)
        merged = model.merge_and_unload().state_dict()  # weights out: each expert's own update in its slice
        expected = runs[world]["ranks"][rank]["megatron"]["merged2"]
        assert expected.keys() == merged.keys()
        for name, tensor in merged.items():
            torch.testing.assert_close(expected[name], tensor, rtol=0, atol=1e-6, msg=name)
