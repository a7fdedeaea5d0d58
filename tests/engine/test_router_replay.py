"""Router replay on the FSDP2 engine (engine/router_replay.py): a tiny Mixtral (4 experts, 2 per token) on one
gloo rank, packed.

Recorded: every real token names 2 different experts per layer, padding -1. Replayed with unchanged weights:
the log-probs equal the recording pass exactly. Then the routers' weights are perturbed so that they route
other tokens elsewhere: a fresh forward routes differently and scores differently, while the replayed forward
equals an independent reference, transformers' own model (padded, unsharded) with each router's top-k replaced
by the recorded experts (gate weights from its current logits). Off: an engine built without replay and one
with replay but no recorded column give the same numbers (the forward and a training step).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from tandem.algos import log_probs_from_logits
from tandem.config.schema import FSDPConfig
from tandem.engine import router_replay as replay
from tandem.models.tiny import save_tiny

from .fsdp_scenarios import OPTIM, PROMPT_LEN, RESPONSE_LEN, make_engine, rollout_batch

ROWS, MICRO = 5, 2
LAYERS, TOP_K, EXPERTS = 2, 2, 4


@pytest.fixture(scope="module")
def mixtral(one_rank, tmp_path_factory):
    """A tiny Mixtral's folder (the one_rank fixture's gloo group is up)."""
    return save_tiny(
        tmp_path_factory.mktemp("replay") / "mixtral",
        num_layers=LAYERS,
        hidden_size=64,
        intermediate_size=64,
        num_experts=EXPERTS,
        experts_per_token=TOP_K,
    )


def response_log_probs(output, micro):
    """[b, R] log-probs of the response tokens (packed outputs read through `at`)."""
    rows = micro["input_ids"].shape[0]
    positions = torch.arange(PROMPT_LEN - 1, PROMPT_LEN - 1 + RESPONSE_LEN).expand(rows, -1)
    logits, where = output.at(positions)
    labels = micro["input_ids"][:, PROMPT_LEN:][where]
    out = torch.zeros(where.shape)
    out[where] = log_probs_from_logits(logits.float(), labels)
    return {"log_probs": out}


def engine(path, replay_on=True, optim=None):
    return make_engine(
        str(path),
        "lm",
        optim=optim,
        fsdp=FSDPConfig(param_dtype="float32"),
        packing=True,
        router_replay=replay_on,
    )


def perturbed_router_weights(model: nn.Module, seed: int = 3) -> dict[str, torch.Tensor]:
    """Each router's weight moved by noise as large as itself; the new weights by name."""
    gen = torch.Generator().manual_seed(seed)
    new = {}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                local = param.to_local() if hasattr(param, "to_local") else param
                local.add_(torch.randn(local.shape, generator=gen) * 3 * local.std())
                new[name] = local.clone()
    return new


class GivenRouting(nn.Module):
    """A router that routes to given experts: softmax over all logits, the given k, renormalised (Mixtral)."""

    def __init__(self, weight: torch.Tensor, indices: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.indices = indices  # [tokens, k] in the padded batch's row-major order

    def forward(self, hidden):
        logits = hidden.reshape(-1, hidden.shape[-1]) @ self.weight.t()
        given = self.indices.clamp(min=0)  # padding: any experts, its outputs are not read
        probs = torch.softmax(logits.float(), -1).gather(1, given)
        return logits, probs / probs.sum(-1, keepdim=True), given


def reference_log_probs(path, gate_weights, batch, routed) -> torch.Tensor:
    """transformers' model with `gate_weights` and every router replaced by GivenRouting(routed)."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for layer in range(LAYERS):
        indices = routed[:, :, layer].reshape(-1, TOP_K)
        weight = gate_weights[f"model.layers.{layer}.mlp.gate.weight"]
        model.model.layers[layer].mlp.gate = GivenRouting(weight, indices)
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
            use_cache=False,
        ).logits
    return log_probs_from_logits(logits[:, PROMPT_LEN - 1 : -1].float(), batch["input_ids"][:, PROMPT_LEN:])


def test_replay_uses_the_recorded_experts(mixtral):
    batch = rollout_batch(ROWS, seed=4)
    mask = batch["response_mask"].bool()
    eng = engine(mixtral)
    recorded = eng.forward(batch, response_log_probs, MICRO, record_routing=True)
    routed = recorded[replay.ROUTED_EXPERTS]
    assert routed.shape == (ROWS, PROMPT_LEN + RESPONSE_LEN, LAYERS, TOP_K)
    real = batch["attention_mask"].bool()
    assert (routed[~real] == -1).all()
    tokens = routed[real].reshape(-1, TOP_K)
    assert replay.valid_rows(tokens, EXPERTS).all()

    # unchanged weights: replaying what was recorded changes no number
    same = eng.forward(batch.union(recorded.select(replay.ROUTED_EXPERTS)), response_log_probs, MICRO)
    assert torch.equal(same["log_probs"], recorded["log_probs"])

    gates = perturbed_router_weights(eng.model)
    fresh = eng.forward(batch, response_log_probs, MICRO, record_routing=True)
    moved = (fresh[replay.ROUTED_EXPERTS].sort(-1).values != routed.sort(-1).values).any(-1)[real]
    assert moved.float().mean() > 0.2  # the perturbed routers send many tokens elsewhere
    replayed = eng.forward(batch.union(recorded.select(replay.ROUTED_EXPERTS)), response_log_probs, MICRO)
    expected = reference_log_probs(mixtral, gates, batch, routed)
    assert torch.allclose(replayed["log_probs"][mask], expected[mask], atol=1e-5)
    assert (replayed["log_probs"][mask] - fresh["log_probs"][mask]).abs().max() > 1e-3
    # the replayed pass, recorded, is the replayed routing
    again = eng.forward(
        batch.union(recorded.select(replay.ROUTED_EXPERTS)), response_log_probs, MICRO, record_routing=True
    )
    assert torch.equal(again[replay.ROUTED_EXPERTS][real], routed[real])


def test_off_is_todays_numbers(mixtral):
    batch = rollout_batch(ROWS, seed=5)
    tokens = float(batch["response_mask"].sum())

    def loss_fn(output, micro):
        log_probs = response_log_probs(output, micro)["log_probs"]
        return (-micro["advantages"] * log_probs * micro["response_mask"]).sum() / tokens, {}

    results = []
    for on in (False, True):
        eng = engine(mixtral, replay_on=on, optim=OPTIM)
        log_probs = eng.forward(batch, response_log_probs, MICRO)["log_probs"]
        step = eng.train_step(batch, loss_fn, MICRO)
        results.append((log_probs, step.loss, step.grad_norm))
    assert torch.equal(results[0][0], results[1][0])
    assert results[0][1:] == results[1][1:]


def test_errors_name_the_setting(mixtral, one_rank):
    eng = engine(mixtral, replay_on=False)
    batch = rollout_batch(2, seed=1)
    with pytest.raises(ValueError, match="built without router replay"):
        eng.forward(batch, response_log_probs, MICRO, record_routing=True)
    with pytest.raises(ValueError, match="not a mixture-of-experts"):
        engine(one_rank)  # the dense tiny Qwen2


def test_r2_with_recomputed_layers_under_pipeline_parallel_is_refused_by_the_config():
    """A layer recomputed in backward would replay the experts of the micro-batch whose forward ran last."""
    from tandem.config import ConfigError, load_config

    base = ["actor.strategy=megatron", "trainer.workers_per_node=2", "actor.router_replay=R2"]
    with pytest.raises(
        ConfigError, match="R2 with actor.activation_checkpointing=true and .*pipeline_parallel=2"
    ):
        load_config(
            "grpo", [*base, "actor.megatron.pipeline_parallel=2", "actor.activation_checkpointing=true"]
        )
    load_config("grpo", [*base, "actor.megatron.pipeline_parallel=2"])  # no recomputation
    load_config("grpo", [*base, "actor.activation_checkpointing=true"])  # one stage: replayed in order
