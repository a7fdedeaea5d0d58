"""A mixture-of-experts model (tiny Mixtral: 4 experts, 2 per token) on megatron-core with expert parallel,
against the FSDP2 engine and transformers: the battery of tests/engine/test_megatron.py (weights streamed out
exactly as loaded, logits, every role's forward, the actor's and the critic's updates, activation
checkpointing, resume) on two layouts, plus the routers' balance term and the export.

  ep2     EP=2 (TP=1): each rank holds 2 of the 4 experts of every layer; tokens cross ranks by all-to-all
  tp2ep2  TP=2 with sequence parallel (megatron requires it for MoE under TP) and EP=2 on the same 2 ranks
          (experts whole on each rank: expert tensor parallel 1)

The balance term's weight is 0.5 (megatron_scenarios.role_config), so it moves the update visibly: the
actor's gradient norm is 1.10 with it, 0.038 without.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tandem.engine.megatron import convert
from tandem.models.tiny import save_tiny

from . import megatron_scenarios as sc
from .test_megatron import (  # noqa: F401 - the shared battery, run here on the MoE fixtures below
    assert_states_close,
    test_activation_checkpointing_changes_no_number,
    test_actor_and_critic_updates_equal_fsdp,
    test_every_role_forward_equals_fsdp,
    test_logits_equal_transformers,
    test_resume_from_checkpoint_equals_continuing,
    test_weights_stream_out_exactly_as_loaded,
    test_zero_advantages_leave_the_policy_where_it_is,
)

pytest.importorskip("megatron.core")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MOE = {"num_experts": 4, "experts_per_token": 2}
# name: ((tensor, pipeline, sequence parallel, virtual pipeline, expert parallel), ranks)
LAYOUTS = {"ep2": ((1, 1, False, 1, 2), 2), "tp2ep2": ((2, 1, True, 1, 2), 2)}


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron_moe_models")
    return str(save_tiny(root / "policy", **MOE)), str(save_tiny(root / "critic", num_labels=1, **MOE))


@pytest.fixture(scope="module")
def fsdp(paths, tmp_path_factory):
    return sc.run((1, 1), 1, paths, tmp_path_factory.mktemp("fsdp_moe"), strategy="fsdp")[0]


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout(request, paths, tmp_path_factory):
    return sc.run_layout(request.param, LAYOUTS, paths, tmp_path_factory, "megatron_moe")


def test_layout_and_the_balance_term_equal_fsdp(layout, fsdp):
    ep2 = layout["name"] == "ep2"
    infos = [r["dispatch_info"] for r in layout["ranks"]]
    # EP=2 alone: two data-parallel ranks (the experts' all-to-all spans them); with TP=2: one
    assert infos == ([(0, 2, True), (1, 2, True)] if ep2 else [(0, 1, True), (0, 1, False)])
    expected = sum(fsdp["actor_step"]["metrics"]["router_aux_loss"])
    assert 1.0 <= expected <= 2.0  # between even routing and every token on the same 2 of 4 experts
    if ep2:  # each data-parallel rank reports its share of the micro-batches
        actual = sum(sum(r["actor_step"]["metrics"]["router_aux_loss"]) for r in layout["ranks"])
    else:
        actual = sum(layout["ranks"][0]["actor_step"]["metrics"]["router_aux_loss"])
    assert actual == pytest.approx(expected, rel=1e-5)
    assert fsdp["actor_step"]["grad_norm"] > 1.0  # the term dominates this step's gradient (0.038 without)


def test_a_step_where_a_rank_has_no_rows_equals_fsdp(layout, fsdp):
    """EP=2 over 2 data-parallel ranks, one row: the empty rank's dummy passes join the all-to-alls and add
    nothing, the balance term included."""
    expected = fsdp["one_row_step"]
    for rank in layout["ranks"]:
        got = rank["one_row_step"]
        assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)
        assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)
    reported = sum(
        sum(r["one_row_step"]["metrics"]["router_aux_loss"]) for r in layout["ranks"] if r["dispatch_info"][2]
    )
    assert reported == pytest.approx(sum(expected["metrics"]["router_aux_loss"]), rel=1e-5)


def test_export_is_a_mixtral_folder_with_the_trained_weights(layout):
    """Written by transformers from the streamed weights: per-expert w1 / w2 / w3 files, read back fused."""
    files = load_file(layout["out"] / "export" / "model.safetensors")
    assert "model.layers.0.block_sparse_moe.experts.3.w2.weight" in files
    model = AutoModelForCausalLM.from_pretrained(layout["out"] / "export", dtype=torch.float32)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert_states_close(state, layout["ranks"][0]["state1"], atol=0)


def test_moe_layouts_megatron_cannot_run_are_refused():
    from transformers import AutoConfig

    config = AutoConfig.for_model("mixtral", num_local_experts=4, num_experts_per_tok=2, sliding_window=None)
    convert.check_supported(config, 1, 1, 2)
    convert.check_supported(config, 2, 1, 2, sequence_parallel=True)
    with pytest.raises(ValueError, match="needs actor.megatron.sequence_parallel=true"):
        convert.check_supported(config, 2, 1, 1)
    with pytest.raises(
        ValueError, match="num_local_experts=4 is not a multiple of actor.megatron.expert_parallel=3"
    ):
        convert.check_supported(config, 1, 1, 3)
    dense = AutoConfig.for_model("qwen2")
    with pytest.raises(ValueError, match="expert_parallel=2 with a dense model"):
        convert.check_supported(dense, 1, 1, 2)
    kwargs = convert.moe_config_kwargs(config, 2)
    assert (kwargs["num_moe_experts"], kwargs["moe_router_topk"], kwargs["expert_model_parallel_size"]) == (
        4,
        2,
        2,
    )
    assert kwargs["moe_router_load_balancing_type"] == "none"  # Tandem's term instead (engine/moe.py)
    assert convert.moe_config_kwargs(dense, 1) == {}


def test_context_parallel_with_a_moe_model_passes_the_start_up_checks(paths):
    """Built (test_megatron_families.py: Qwen3-MoE at CP=2, CP=2 + EP=2 equal FSDP2 over two updates)."""
    from tandem.config import load_config
    from tandem.trainer.start_checks.available import check_available

    overrides = [f"actor.model_path={paths[0]}", "actor.strategy=megatron", "trainer.workers_per_node=2"]
    check_available(load_config("grpo", [*overrides, "actor.megatron.context_parallel=2"]))
    check_available(load_config("grpo", [*overrides, "actor.megatron.expert_parallel=2"]))
