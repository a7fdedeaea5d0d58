"""Llama 3 (rope_type llama3), Qwen3 (per-head q/k norms, head_dim != hidden / heads) and Qwen3-MoE on megatron-core
(convert.py), against the folder, transformers and FSDP2, on tiny random models (megatron_family_scenarios.py).

One spawn of 2 ranks per family runs FSDP2 and the family's megatron layouts:

  llama3     tp2 (TP=2)                      pp2 (PP=2)
  qwen3      tp2sp (TP=2, sequence parallel) pp2
  qwen3_moe  tp2ep2 (TP=2 + SP, EP=2)        pp2 (on a folder with norm_topk_prob=false: megatron's pre-softmax)
             cp2 (context parallel 2: each router sees half of every row's columns; the balance term's sums
             are summed over the CP ranks), cp2ep2 (the same with the experts split over the two CP ranks),
             pp2ckpt (PP=2 with activation checkpointing: a recomputed router takes its own micro-batch's term)

Each run takes two actor updates on two batches (the balance term at weight 0.5 included in the loss and the
gradient) and the response log-probs between them. Tolerances as tests/engine/test_megatron.py's: weights
streamed out equal the folder's exactly; logits 1e-5 from transformers'; each update's loss and grad norm rel
1e-5 from FSDP2's, its weight change rel 1e-4; the log-probs after the first update 1e-5.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from tandem.engine.megatron import convert

from . import megatron_family_scenarios as fam
from . import megatron_scenarios as sc

pytest.importorskip("megatron.core")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# family: {layout name: (layout, folder)}; folder "main" or "alt" (the family's variant, if any)
LAYOUTS = {
    "llama3": {"tp2": ((2, 1), "main"), "pp2": ((1, 2), "main")},
    "qwen3": {"tp2sp": ((2, 1, True), "main"), "pp2": ((1, 2), "main")},
    "qwen3_moe": {
        "tp2ep2": ((2, 1, True, 2), "main"),
        "pp2": ((1, 2), "alt"),
        "cp2": ((1, 1, False, 1, 2), "main"),
        "cp2ep2": ((1, 1, False, 2, 2), "main"),
        "pp2ckpt": ((1, 2, False, 1, 1, True), "main"),
    },
}
VARIANTS = {"qwen3_moe": {"norm_topk_prob": False}}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def family(request, tmp_path_factory):
    name = request.param
    root = tmp_path_factory.mktemp(f"family_{name}")
    folders = {"main": fam.save_family(root / "main", name)}
    if name in VARIANTS:
        folders["alt"] = fam.save_family(root / "alt", name, **VARIANTS[name])
    runs = [(f"fsdp_{key}", None, path) for key, path in folders.items()]
    runs += [(layout, parallel, folders[key]) for layout, (parallel, key) in LAYOUTS[name].items()]
    ranks = fam.run(runs, root / "out")
    return {"name": name, "folders": folders, "ranks": ranks}


def _layouts(family: dict):
    for layout, (parallel, key) in LAYOUTS[family["name"]].items():
        yield layout, parallel, family["folders"][key], key


def _hf_state(path: str) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")  # streamed once, as model.embed_tokens.weight (as FSDP does)
    return state


def test_weights_stream_out_exactly_as_loaded(family):
    for layout, _, path, _ in _layouts(family):
        expected = _hf_state(path)
        for rank in family["ranks"]:
            state = rank[layout]["state0"]
            assert state.keys() == expected.keys(), layout
            for name, tensor in expected.items():
                assert torch.equal(state[name], tensor), (layout, name)


def test_a_rollout_engine_of_the_same_tp_size_gets_each_rank_s_cuts(family):
    for layout, parallel, path, _ in _layouts(family):
        if parallel[0] == 1:
            continue
        expected = _hf_state(path)
        for index, rank in enumerate(family["ranks"]):
            pieces = rank[layout]["cuts0"]
            assert pieces.keys() == expected.keys()
            for name, (piece, cut) in pieces.items():
                want = (
                    expected[name] if cut is None else expected[name].narrow(cut.dim, cut.start, cut.length)
                )
                assert torch.equal(piece, want), (layout, index, name)


def test_the_family_s_modules_are_built(family):
    """Qwen3's q/k norms as megatron modules (torch's RMSNorm; HeadRMSNorm under sequence parallel); Llama 3's
    scaled frequencies, transformers' exactly."""
    name = family["name"]
    for layout, parallel, path, _ in _layouts(family):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        sequence_parallel = len(parallel) > 2 and parallel[2]
        for rank in family["ranks"]:
            norms = rank[layout]["norms"]
            if sequence_parallel:
                assert norms == (
                    {"SequenceParallelRMSNorm", "HeadRMSNorm"}
                    if name != "llama3"
                    else {"SequenceParallelRMSNorm"}
                )
            else:
                assert norms == {"RMSNorm"}
            assert torch.equal(rank[layout]["inv_freq"], model.model.rotary_emb.inv_freq)
    if name == "llama3":  # the scaling changes the frequencies: the check above would catch a missing one
        default = 1.0 / (10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
        assert not torch.allclose(family["ranks"][0]["tp2"]["inv_freq"], default)


def test_logits_equal_transformers(family):
    batch = sc.rollout_batch()
    real = batch["attention_mask"].bool()
    for layout, _, path, _ in _layouts(family):
        expected = sc.transformers_logits(path, batch)
        for rank in family["ranks"]:  # data parallel 1: every rank has every row
            actual = rank[layout]["logits"]
            diff = float((actual[real] - expected[real]).abs().max())
            print(f"{family['name']} {layout}: logits max |diff| {diff:.2e}")
            torch.testing.assert_close(actual[real], expected[real], rtol=0, atol=1e-5, msg=layout)


def test_actor_updates_equal_fsdp(family):
    response = sc.rollout_batch()["response_mask"].bool()
    for layout, _, _, key, which in (
        (*where, which) for where in _layouts(family) for which in ("step", "step2")
    ):
        fsdp = family["ranks"][0][f"fsdp_{key}"][which]
        for rank in family["ranks"]:
            step = rank[layout][which]
            loss_rel = abs(step["loss"] / fsdp["loss"] - 1)
            norm_rel = abs(step["grad_norm"] / fsdp["grad_norm"] - 1)
            names = list(fsdp["update"])
            assert step["update"].keys() == fsdp["update"].keys()
            mine = torch.cat([step["update"][n].flatten() for n in names])
            ref = torch.cat([fsdp["update"][n].flatten() for n in names])
            update_rel = float((mine - ref).norm() / ref.norm())
            print(
                f"{family['name']} {layout} {which}: loss rel {loss_rel:.1e}, grad norm rel {norm_rel:.1e}, "
                f"update rel {update_rel:.1e}"
            )
            assert step["loss"] == pytest.approx(fsdp["loss"], rel=1e-5), layout
            assert step["grad_norm"] == pytest.approx(fsdp["grad_norm"], rel=1e-5), layout
            assert not step["skipped"] and step["lr"] == fsdp["lr"]
            assert update_rel < 1e-4, layout
            assert float(ref.abs().max()) > 1e-4  # the step moved the weights by far more than the tolerance
            if which == "step2":  # between the updates: the log-probs of the first batch's responses
                mine, ref = rank[layout]["log_probs1"], family["ranks"][0][f"fsdp_{key}"]["log_probs1"]
                torch.testing.assert_close(mine[response], ref[response], rtol=0, atol=1e-5, msg=layout)


def test_the_folders_are_what_megatron_is_tested_for(family):
    """The configs keep the feature each family is here for (a transformers default that changed would hide it)."""
    config = AutoModelForCausalLM.from_pretrained(family["folders"]["main"]).config
    if family["name"] == "llama3":
        assert convert.rope_parameters(config)["rope_type"] == "llama3"
    else:
        assert convert.qk_norm(config) and config.head_dim != config.hidden_size // config.num_attention_heads
    if family["name"] == "qwen3_moe":
        assert convert.num_experts(config) == 4 and config.moe_intermediate_size != config.intermediate_size
