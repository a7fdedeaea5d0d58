"""MegatronEngine on megatron-core over gloo (CPU, float32): the real roles on TP=2, PP=2 and DP=2 layouts
of 2 ranks and TP=2 x PP=2 on 4 ranks (megatron_scenarios.py), against the same roles on a 1-rank FSDP2
engine and against transformers.

Tolerances (measured on this machine): weights streamed out of megatron equal the folder's exactly; actor
log-probs / entropy and critic values ~1e-6 from FSDP's (asserted 1e-5); loss and grad norm ~2e-6 relative
(asserted 1e-5); the weight update of one AdamW step (largest element 5e-4) 1-3e-5 of its norm away from
FSDP's (asserted 1e-4), at most 1e-5 in any element (asserted 2e-5): Adam's first step divides each
gradient element by its own magnitude, so float noise in near-zero gradient elements (another reduction
order under TP / PP) shows up there. Resume and export are compared exactly.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tandem.models.tiny import save_tiny

from . import megatron_scenarios as sc

pytest.importorskip("megatron.core")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# name: ((tensor parallel, pipeline parallel[, sequence parallel[, virtual pipeline[, expert[, context parallel[,
# override_transformer_config]]]]]), ranks)
LAYOUTS = {
    "cp2": ((1, 1, False, 1, 1, 2), 2),  # each row's columns split over 2 ranks (context_parallel.py)
    "tp2spcp2": (
        (2, 1, True, 1, 1, 2),
        4,
    ),  # ... and each CP rank's columns over 2 TP ranks (sequence parallel)
    # TP=2 with megatron's sequence parallel (norms and residuals split over the TP ranks); TP without it
    # runs in tp2pp2 and in the end-to-end tests
    "tp2sp": ((2, 1, True), 2),
    "pp2": ((1, 2), 2),
    "pp2vp2": ((1, 2, False, 2), 2),  # 2 model chunks of 1 layer per stage, the interleaved schedule
    # megatron's uneven split: 1 of the 4 layers on the first stage, 3 on the last (verl's deepseek / qwen3-235b
    # scripts set the first / last stage's sizes)
    "pp2first1": ((1, 2, False, 1, 1, 1, {"num_layers_in_first_pipeline_stage": 1}), 2),
    "dp2": ((1, 1), 2),
    "tp2pp2": ((2, 2), 4),
}


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron_models")
    return str(save_tiny(root / "policy")), str(save_tiny(root / "critic", num_labels=1))


@pytest.fixture(scope="module")
def fsdp(paths, tmp_path_factory):
    return sc.run((1, 1), 1, paths, tmp_path_factory.mktemp("fsdp"), strategy="fsdp")[0]


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout(request, paths, tmp_path_factory):
    return sc.run_layout(request.param, LAYOUTS, paths, tmp_path_factory, "megatron")


def data_parallel_rows(layout: dict, section: str, key: str | None = None) -> torch.Tensor:
    """`section`'s per-row values (its `key`) for the whole batch: the collectors' shares in data-parallel order."""
    ranks = layout["ranks"]
    collectors = sorted((r["dispatch_info"][0], i) for i, r in enumerate(ranks) if r["dispatch_info"][2])
    parts = [ranks[i][section] for _, i in collectors]
    return torch.cat([part[key] if key else part for part in parts])


def assert_states_close(actual: dict, expected: dict, atol: float) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=atol, msg=name)


def assert_update_close(actual: dict, expected: dict, before: str, after: str) -> None:
    assert actual[after].keys() == expected[after].keys()
    names = list(expected[after])
    mine = torch.cat([(actual[after][n] - actual[before][n]).flatten() for n in names])
    ref = torch.cat([(expected[after][n] - expected[before][n]).flatten() for n in names])
    assert float((mine - ref).norm() / ref.norm()) < 1e-4
    torch.testing.assert_close(mine, ref, rtol=0, atol=2e-5)


def assert_step_close(actual: dict, expected: dict) -> None:
    assert actual["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert actual["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)
    assert actual["lr"] == expected["lr"] and actual["skipped"] is expected["skipped"] is False


def test_dispatch_info_names_the_data_parallel_groups_and_collectors(layout):
    infos = [r["dispatch_info"] for r in layout["ranks"]]
    expected = {
        "cp2": [(0, 1, True), (0, 1, False)],  # CP rank 0 answers
        "tp2spcp2": [(0, 1, True), (0, 1, False), (0, 1, False), (0, 1, False)],  # TP 0 of CP 0
        "tp2sp": [(0, 1, True), (0, 1, False)],  # TP rank 0 answers
        "pp2": [(0, 1, False), (0, 1, True)],  # the last stage answers
        "pp2vp2": [(0, 1, False), (0, 1, True)],
        "pp2first1": [(0, 1, False), (0, 1, True)],
        "dp2": [(0, 2, True), (1, 2, True)],
        "tp2pp2": [(0, 1, False), (0, 1, False), (0, 1, True), (0, 1, False)],  # TP rank 0 of the last stage
    }[layout["name"]]
    assert infos == expected
    sequence_parallel = layout["name"].startswith("tp2sp")
    chunk_layers = {"pp2vp2": [[1, 1]] * 2, "pp2": [[2]] * 2, "tp2pp2": [[2]] * 4, "pp2first1": [[1], [3]]}
    expected_layers = chunk_layers.get(
        layout["name"], [[4]] * len(layout["ranks"])
    )  # of the 4 layers, by rank
    for rank, layers in zip(layout["ranks"], expected_layers, strict=True):
        assert rank["chunk_layers"] == layers
        assert rank["sequence_parallel"] is sequence_parallel
        assert rank["norms"] == ({"SequenceParallelRMSNorm"} if sequence_parallel else {"RMSNorm"})


def test_weights_stream_out_exactly_as_loaded(layout, paths, fsdp):
    """HF -> megatron (cut over TP, PP) -> HF is exact, on every rank, for the LM and the value model."""
    hf = AutoModelForCausalLM.from_pretrained(paths[0], dtype=torch.float32).state_dict()
    hf.pop("lm_head.weight")  # tied: streamed once, as model.embed_tokens.weight (as FSDP does)
    for rank in layout["ranks"]:
        assert_states_close(rank["state0"], hf, atol=0)
        assert_states_close(rank["critic_state0"], fsdp["critic_state0"], atol=0)  # same seeded value head


def test_a_rollout_engine_of_the_same_tp_size_gets_each_rank_s_own_cuts(layout, paths):
    """state_dict_cuts into a rollout TP engine of the trainer's TP size: every rank's pieces are its part of the
    folder's tensors as vLLM cuts them (heads, MLP rows / columns, vocabulary), the norms whole; under PP the
    other stage's layers come from the rank of the same TP rank there."""
    if LAYOUTS[layout["name"]][0][0] == 1:
        pytest.skip("TP=1: one rank per rollout engine, no cuts")
    hf = AutoModelForCausalLM.from_pretrained(paths[0], dtype=torch.float32).state_dict()
    hf.pop("lm_head.weight")
    for index, rank in enumerate(layout["ranks"]):
        pieces = rank["cuts0"]
        assert pieces.keys() == hf.keys()
        for name, (piece, cut) in pieces.items():
            expected = hf[name] if cut is None else hf[name].narrow(cut.dim, cut.start, cut.length)
            assert torch.equal(piece, expected), (index, name)
            assert (cut is None) == ("norm" in name), name
        assert pieces["model.layers.0.self_attn.o_proj.weight"][1].start == 128 * (index % 2)  # 256 columns


def test_logits_equal_transformers(layout, paths):
    """The whole vocabulary's logits at every real token, against the unsharded transformers model."""
    batch = sc.rollout_batch()
    expected = sc.transformers_logits(paths[0], batch)
    real = batch["attention_mask"].bool()
    actual = data_parallel_rows(layout, "logits")
    torch.testing.assert_close(actual[real], expected[real], rtol=0, atol=1e-5)


def test_every_role_forward_equals_fsdp(layout, fsdp):
    """Actor log-probs and entropy, reference log-probs (a frozen engine), SFT NLL, critic values, RM scores."""
    mask = sc.rollout_batch()["response_mask"].bool()
    for section, key in (("log_probs", "old_log_probs"), ("log_probs", "entropy"), ("values", "values")):
        actual = data_parallel_rows(layout, section, key)
        torch.testing.assert_close(actual[mask], fsdp[section][key][mask], rtol=0, atol=1e-5, msg=key)
    torch.testing.assert_close(
        data_parallel_rows(layout, "ref_log_probs")[mask], fsdp["ref_log_probs"][mask], rtol=0, atol=1e-5
    )
    torch.testing.assert_close(data_parallel_rows(layout, "rm_scores"), fsdp["rm_scores"], rtol=0, atol=1e-5)
    torch.testing.assert_close(data_parallel_rows(layout, "sft_nll"), fsdp["sft_nll"], rtol=1e-5, atol=1e-5)


def test_actor_and_critic_updates_equal_fsdp(layout, fsdp):
    for rank in layout["ranks"]:  # every rank reports the same global numbers
        assert_step_close(rank["actor_step"], fsdp["actor_step"])
        assert_step_close(rank["critic_step"], fsdp["critic_step"])
        assert rank["lr_after"] == fsdp["lr_after"]
        assert_update_close(rank, fsdp, "state0", "state1")
        assert_update_close(rank, fsdp, "critic_state0", "critic_state1")
    # The update moved the weights by far more than the tolerance.
    moved = max(float((a - b).abs().max()) for a, b in zip(fsdp["state1"].values(), fsdp["state0"].values()))
    assert moved > 1e-4


def test_zero_advantages_leave_the_policy_where_it_is(layout, fsdp):
    """Issue 44's invariant, for token-budget (packed) and fixed-size (padded) micro-batches of 16 uneven rows:
    with zero advantages and the old / reference log-probs from the same weights, the update's log-probs equal
    the old ones, KL loss, ppo_kl and the gradient are 0 (to float rounding; with the interleaved schedule's
    activations and gradients crossed, PP=2 x VP=2 gave kl_loss 0.024, grad norm 273). The old log-probs equal
    FSDP2's, and a step with random advantages on the same micro-batches equals FSDP2's."""
    mask = sc.rollout_rows(sc.INVARIANT_LENGTHS, sc.PROMPT, sc.RESPONSE, seed=3)["response_mask"].bool()
    for name, expected in fsdp["invariant"].items():
        ranks = layout["ranks"]
        collectors = sorted((r["dispatch_info"][0], i) for i, r in enumerate(ranks) if r["dispatch_info"][2])
        old = torch.cat([ranks[i]["invariant"][name]["old_log_probs"] for _, i in collectors])
        torch.testing.assert_close(old[mask], expected["old_log_probs"][mask], rtol=0, atol=1e-5, msg=name)
        for rank in layout["ranks"]:
            numbers = rank["invariant"][name]
            assert numbers["lp_diff"] < 1e-5, (name, numbers)
            assert numbers["kl_loss"] < 1e-10 and numbers["ppo_kl"] < 1e-6, (name, numbers)
            assert numbers["grad_norm"] < 1e-5, (name, numbers)
            assert_step_close(numbers["step"], expected["step"])


def test_activation_checkpointing_changes_no_number(layout):
    for rank in layout["ranks"]:
        assert rank["checkpointed_actor_step"] == rank["actor_step"]


def test_resume_from_checkpoint_equals_continuing(layout):
    for rank in layout["ranks"]:
        assert rank["resumed_global_step"] == 1
        assert rank["resumed_lr"] == rank["lr_after"]
        assert rank["resumed_step"] == rank["continued_step"]
        assert_states_close(rank["resumed_state"], rank["continued_state"], atol=0)


def test_a_step_on_one_row_equals_fsdp(layout, fsdp):
    """One row for the whole step: under data parallel 2 a rank with no rows runs a dummy pass that adds
    nothing."""
    for rank in layout["ranks"]:
        assert_step_close(rank["one_row_step"], fsdp["one_row_step"])


def test_export_is_a_transformers_folder_with_the_trained_weights(layout):
    exported = load_file(layout["out"] / "export" / "model.safetensors")
    state1 = layout["ranks"][0]["state1"]
    assert_states_close({k: v for k, v in exported.items() if k != "lm_head.weight"}, state1, atol=0)
    model = AutoModelForCausalLM.from_pretrained(layout["out"] / "export", dtype=torch.float32)
    assert torch.equal(model.lm_head.weight, state1["model.embed_tokens.weight"])  # tied again


# ---------------------------------------------------------------------------- GPU only
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_bf16_step_offload_and_onload(paths, tmp_path):
    result = sc.run_gpu(paths[0], tmp_path)
    batch = sc.rollout_batch()
    model = AutoModelForCausalLM.from_pretrained(paths[0], dtype=torch.float32).eval()
    with torch.no_grad():
        expected = model(**{k: batch[k] for k in sc.MODEL_INPUTS}, use_cache=False).logits
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(result["logits"][real], expected[real], rtol=0, atol=5e-2)  # bfloat16 compute
    assert result["param_dtypes"] == {torch.bfloat16}
    for step in ("step", "step_after_onload"):
        assert not result[step]["skipped"] and result[step]["grad_norm"] > 0, step
    assert result["freed_bytes"] > 10e6
    assert "onload() first" in result["offloaded_forward_error"]
    assert result["onload_unchanged"]
