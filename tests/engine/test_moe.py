"""Mixture-of-experts models on the FSDP2 engine (engine/moe.py): the routers' load-balancing loss.

The balance term by hand on small router logits; then a tiny Mixtral (4 experts, 2 per token) trained
over gloo on 1 and 2 ranks, packed and padded, against transformers' unsharded model: the step's loss,
the reported `router_aux_loss` and the gradient norm equal a reference computed here from transformers'
router logits with a second, independent implementation of the formula; 2 ranks equal 1; packed equals
padded (padding tokens are not counted); a resumed engine takes the same next step.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from tandem.algos import agg_loss, log_probs_from_logits
from tandem.config import ConfigError, load_config
from tandem.data.packing import plan_packing
from tandem.engine import moe
from tandem.models.tiny import save_tiny

from . import moe_scenarios as ms
from .fsdp_scenarios import PROMPT_LEN, rollout_batch, spawn

TOL = 1e-5
SIGMOID_2 = 1 / (1 + math.exp(-2))  # softmax([2, 0])[0]


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    return save_tiny(
        tmp_path_factory.mktemp("moe") / "mixtral",
        num_layers=2,
        hidden_size=64,
        intermediate_size=64,
        num_experts=4,
        experts_per_token=2,
    )


@pytest.fixture(scope="module")
def runs(moe_path, tmp_path_factory):
    return {
        world: spawn(ms.run_rank, world, moe_path, tmp_path_factory.mktemp(f"moe{world}")) for world in (1, 2)
    }


# ---------------------------------------------------------------------------- the formula by hand
def test_balance_loss_by_hand():
    two_by_one = moe.Routing(num_experts=2, top_k=1, coef=1.0)
    # tokens split evenly: P = (0.5, 0.5), f = (0.5, 0.5) -> 2 x (0.25 + 0.25) = 1
    even = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    assert moe.balance_loss([even], torch.tensor([True, True]), two_by_one).item() == pytest.approx(1.0)
    # both tokens to expert 0: P0 = sigmoid(2), f = (1, 0) -> 2 x sigmoid(2)
    collapsed = torch.tensor([[2.0, 0.0], [2.0, 0.0]])
    value = moe.balance_loss([collapsed], torch.tensor([True, True]), two_by_one).item()
    assert value == pytest.approx(2 * SIGMOID_2)
    # a masked token (padding) is not counted: the collapsed layer with a third, masked token of the other kind
    padded = torch.tensor([[2.0, 0.0], [2.0, 0.0], [0.0, 9.0]])
    assert moe.balance_loss([padded], torch.tensor([True, True, False]), two_by_one).item() == pytest.approx(
        value
    )
    # the mean over layers
    both = moe.balance_loss([even, collapsed], torch.tensor([True, True]), two_by_one).item()
    assert both == pytest.approx((1.0 + 2 * SIGMOID_2) / 2)
    # top-2 of 4, every token to experts {0, 1} with probabilities (a, a, b, b): E/k sum P f = 2 (a + a) = 4a
    logits = torch.tensor([[1.0, 1.0, 0.0, 0.0]] * 3)
    a = math.e / (2 * math.e + 2)
    four_by_two = moe.Routing(num_experts=4, top_k=2, coef=1.0)
    assert moe.balance_loss([logits], torch.ones(3, dtype=torch.bool), four_by_two).item() == pytest.approx(
        4 * a
    )
    # no real token: 0, still differentiable
    empty = moe.balance_loss([even.requires_grad_()], torch.tensor([False, False]), two_by_one)
    assert empty.item() == 0.0 and empty.requires_grad


def test_routing_of_configs(moe_path):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(moe_path)
    routing = moe.routing_of(config, None)
    assert (routing.num_experts, routing.top_k) == (4, 2)
    assert routing.coef == pytest.approx(2 * config.router_aux_loss_coef)  # k x the model's own weight
    assert moe.routing_of(config, 0.0).coef == 0.0
    with pytest.raises(ValueError, match="actor.router_aux_loss_coef must be >= 0"):
        moe.routing_of(config, -1.0)
    dense = AutoConfig.for_model("qwen2")
    assert moe.routing_of(dense, 0.5) is None


def test_real_tokens_of_packed_rows():
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    packing = plan_packing(mask)
    tokens = moe.real_tokens(None, packing.packed_shape, packing)
    assert int(tokens.sum()) == 5 and tokens.numel() == packing.packed_shape[0] * packing.packed_shape[1]
    assert torch.equal(moe.real_tokens(mask, (2, 3), None), mask.reshape(-1).bool())


def test_the_key_is_validated():
    with pytest.raises(ConfigError, match="actor.router_aux_loss_coef=-0.1 must be >= 0"):
        load_config(overrides=["actor.router_aux_loss_coef=-0.1"])


# ---------------------------------------------------------------------------- the engine
def reference(moe_path, coef: float) -> dict[str, float]:
    """Loss, reported balance term and gradient norm of the step, from transformers' unsharded model."""
    model = AutoModelForCausalLM.from_pretrained(moe_path, dtype=torch.float32)
    model.train()
    batch = rollout_batch(ms.ROWS, seed=2)
    all_tokens = float(batch["attention_mask"].sum())
    global_tokens = batch["response_mask"].sum()
    loss_total, aux_total = 0.0, 0.0
    for rows in (slice(0, 3), slice(3, 6)):  # the engine's micro-batches
        micro = {k: v[rows] for k, v in batch.tensors.items()}
        out = model(
            input_ids=micro["input_ids"],
            attention_mask=micro["attention_mask"],
            position_ids=micro["position_ids"],
            output_router_logits=True,
            use_cache=False,
        )
        log_probs = log_probs_from_logits(
            out.logits[:, PROMPT_LEN - 1 : -1], micro["input_ids"][:, PROMPT_LEN:]
        )
        pg = agg_loss(
            -micro["advantages"] * log_probs, micro["response_mask"], global_num_tokens=global_tokens
        )
        real = micro["attention_mask"].reshape(-1).bool()
        layers = []
        for logits in out.router_logits:  # Switch's term, written with one-hot counts
            probs = torch.softmax(logits[real], dim=-1)
            picked = F.one_hot(probs.topk(2, dim=-1).indices, 4).sum(1).float()  # [tokens, E], k ones a row
            layers.append(4 / 2 * (probs.mean(0) * picked.mean(0)).sum())
        aux = torch.stack(layers).mean() * (float(real.sum()) / all_tokens)
        loss = pg + coef * aux
        loss.backward()
        loss_total += float(loss.detach())
        aux_total += float(aux.detach())
    grad_norm = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None])
    ).item()
    return {"loss": loss_total, "router_aux_loss": aux_total, "grad_norm": grad_norm}


def summed(result: dict, key: str) -> float:
    return sum(result["metrics"][key])


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["packed", "padded", "off"])
def test_step_equals_transformers_reference(case, moe_path, runs):
    expected = reference(moe_path, 0.0 if case == "off" else ms.COEF)
    one = runs[1][0][case]
    assert one["loss"] == pytest.approx(expected["loss"], rel=TOL)
    assert summed(one, "router_aux_loss") == pytest.approx(expected["router_aux_loss"], rel=TOL)
    assert one["grad_norm"] == pytest.approx(expected["grad_norm"], rel=TOL)
    # the term is live: between perfect balance (1) and total collapse (E / k = 2), and it moves the gradient
    assert 1.0 <= expected["router_aux_loss"] <= 2.0
    if case == "packed":
        assert one["grad_norm"] != pytest.approx(runs[1][0]["off"]["grad_norm"], rel=1e-3)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["packed", "padded"])
def test_two_ranks_equal_one(case, runs):
    one, two = runs[1][0], runs[2]
    assert two[0][case]["loss"] == pytest.approx(one[case]["loss"], rel=TOL)  # reduced over the ranks
    two_aux = summed(two[0][case], "router_aux_loss") + summed(two[1][case], "router_aux_loss")
    assert two_aux == pytest.approx(summed(one[case], "router_aux_loss"), rel=TOL)
    assert two[0][case]["grad_norm"] == pytest.approx(one[case]["grad_norm"], rel=TOL)
    for name, tensor in one[f"{case}_state"].items():
        torch.testing.assert_close(two[0][f"{case}_state"][name], tensor, atol=TOL, rtol=0)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_packed_equals_padded_and_resume_equals_continuing(runs):
    for ranks in runs.values():
        rank0 = ranks[0]
        assert rank0["packed"]["loss"] == pytest.approx(rank0["padded"]["loss"], rel=TOL)
        packed_aux = summed(rank0["packed"], "router_aux_loss")
        assert packed_aux == pytest.approx(summed(rank0["padded"], "router_aux_loss"), rel=TOL)
        assert rank0["resumed"]["loss"] == pytest.approx(rank0["continued"]["loss"], rel=TOL)
        assert rank0["resumed"]["grad_norm"] == pytest.approx(rank0["continued"]["grad_norm"], rel=TOL)
        assert rank0["default_coef"] == pytest.approx(2 * 0.001)
    # the experts live in memory as fused [E, 2F, H] / [E, H, F] tensors (converted for vLLM, rollout/vllm.py)
    weights = runs[1][0]["weights"]
    assert weights["model.layers.0.mlp.experts.gate_up_proj"] == (4, 128, 64)
    assert weights["model.layers.0.mlp.experts.down_proj"] == (4, 64, 64)
    assert "sequence_parallel=2 with the mixture-of-experts model" in runs[2][0]["sp_error"]


def test_weights_reach_vllm_under_their_file_names(moe_path, tmp_path):
    """The trainer holds Mixtral's experts fused ([E, 2F, H] gate_up_proj, [E, H, F] down_proj); the rollout
    sends them as the checkpoint's per-expert w1 / w3 / w2 matrices, which is what vLLM's loader reads."""
    from safetensors.torch import load_file

    from tandem.rollout.vllm import file_names

    model = AutoModelForCausalLM.from_pretrained(moe_path, dtype=torch.float32)
    in_memory = [(name, p.detach()) for name, p in model.named_parameters()]
    assert "model.layers.0.mlp.experts.gate_up_proj" in dict(in_memory)
    converted = dict(file_names(moe_path)(iter(in_memory)))
    on_disk = load_file(moe_path / "model.safetensors")
    assert converted.keys() == on_disk.keys()
    assert "model.layers.1.block_sparse_moe.experts.3.w3.weight" in converted
    for name, tensor in on_disk.items():
        assert torch.equal(converted[name], tensor), name
    assert file_names(save_tiny(tmp_path / "dense", num_layers=1)) is None  # nothing to convert
