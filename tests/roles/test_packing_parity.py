"""Packed sequences equal padded ones, and token-budget micro-batches equal one big batch.

The real roles (actor, reference, critic, reward model, SFT) over real FSDP2 engines in this
process (a world-size-1 gloo group), on a hand-built rollout batch whose prompts and responses
have different lengths (an empty response included). Tolerance: fp32; packing changes which
padding the attention kernel sees, not the arithmetic of real tokens, so outputs agree to 1e-5
and gradients to 1e-6 relative to their norm.
"""

from __future__ import annotations

import logging

import pytest
import torch

from tandem.batch import Batch
from tandem.config.schema import FSDPConfig, OptimConfig
from tandem.engine import EngineSpec, FSDPEngine
from tandem.engine.fsdp import engine as fsdp_module
from tandem.roles.actor import Actor
from tandem.roles.critic import Critic
from tandem.roles.reference import Reference
from tandem.roles.reward_model import RewardModel
from tandem.roles.sft import SFT

from .roles_helpers import rollout_rows, tiny_config

PROMPT, RESPONSE = 6, 10
# (prompt tokens, response tokens) per sample: left-padded prompts, right-padded responses.
LENGTHS = [(6, 10), (2, 3), (4, 0), (3, 10), (5, 7), (1, 1), (6, 4), (2, 9)]


def rollout_batch(seed: int = 0) -> Batch:
    return rollout_rows(LENGTHS, PROMPT, RESPONSE, seed)


def engine(
    path, head: str, *, packing: bool, budget: int | None = None, trainable: bool = True
) -> FSDPEngine:
    return FSDPEngine(
        EngineSpec(
            model_path=path,
            head=head,
            device="cpu",
            optim=OptimConfig(lr=1e-3, weight_decay=0.0) if trainable else None,
            fsdp=FSDPConfig(),
            grad_clip=None,  # gradients compared as computed
            total_training_steps=10,
            packing=packing,
            max_tokens_per_micro_batch=budget,
        )
    )


def capture_gradients(eng: FSDPEngine) -> dict[str, torch.Tensor]:
    """Every full gradient, as the optimizer sees it, at each optimizer step (the last one wins)."""
    grads: dict[str, torch.Tensor] = {}

    def hook(optimizer, args, kwargs):
        for name, p in eng.model.named_parameters():
            if p.grad is not None:
                grads[name] = p.grad.full_tensor().clone()

    eng.optimizer.register_step_pre_hook(hook)
    return grads


def full_weights(eng: FSDPEngine) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in eng.state_dict_iter()}


def assert_grads_close(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys() and expected
    for name, grad in expected.items():
        scale = float(grad.norm()) + 1e-12
        assert float((actual[name] - grad).norm()) / scale < 1e-5, name


def masked_close(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor, atol: float = 1e-5) -> None:
    mask = mask.bool()
    torch.testing.assert_close(a[mask], b[mask], rtol=0, atol=atol)


CFG = [
    "actor.use_kl_loss=true",
    "actor.kl_loss_coef=0.1",
    "actor.entropy_coeff=0.01",
    "rollout.is_correction=token",
]


def test_packed_forward_equals_padded_for_every_role(world, model_dirs):
    cfg = tiny_config(
        model_dirs["lm"], 1, *CFG, "rollout.temperature=0.7", "actor.calculate_sum_pi_squared=true"
    )
    batch = rollout_batch()
    out = {}
    for packing in (False, True):
        lm = engine(model_dirs["lm"], "lm", packing=packing, trainable=False)
        value = engine(model_dirs["value"], "value", packing=packing, trainable=False)
        out[packing] = (
            Actor(lm, cfg).compute_log_probs(batch),
            Reference(lm, cfg).compute_ref_log_probs(batch),
            Critic(value, cfg).compute_values(batch),
            RewardModel(value, cfg).compute_scores(batch),
            SFT(lm, cfg).nll(batch),
        )
    (actor0, ref0, critic0, rm0, sft0), (actor1, ref1, critic1, rm1, sft1) = out[False], out[True]
    mask = batch["response_mask"]
    assert mask.sum() > 0 and (mask.sum(-1) == 0).any()  # real tokens, and one empty response
    masked_close(actor1["old_log_probs"], actor0["old_log_probs"], mask)
    masked_close(actor1["entropy"], actor0["entropy"], mask)
    masked_close(actor1["sum_pi_squared"], actor0["sum_pi_squared"], mask, atol=1e-6)
    # pi(y)^2 <= sum_v pi_v^2 <= 1
    spi, chosen = actor1["sum_pi_squared"][mask.bool()], actor1["old_log_probs"][mask.bool()].exp()
    assert (chosen**2 <= spi + 1e-6).all() and (spi <= 1).all() and (spi > 0).all()
    masked_close(ref1["ref_log_probs"], ref0["ref_log_probs"], mask)
    masked_close(critic1["values"], critic0["values"], mask)
    torch.testing.assert_close(rm1["rm_scores"], rm0["rm_scores"], rtol=0, atol=1e-5)
    torch.testing.assert_close(sft1["nll_sum"], sft0["nll_sum"], rtol=1e-5, atol=1e-4)
    assert torch.equal(sft1["num_tokens"], sft0["num_tokens"])
    torch.testing.assert_close(sft1["min_log_prob"], sft0["min_log_prob"], rtol=0, atol=1e-5)
    # the least likely token's log-prob is at least the row's summed log-prob, at most its mean
    total = -sft0["nll_sum"]
    assert (total - 1e-5 <= sft0["min_log_prob"]).all()
    assert (sft0["min_log_prob"] * sft0["num_tokens"] <= total + 1e-5).all()
    assert (sft0["min_log_prob"] < total / sft0["num_tokens"].clamp(min=1)).any()  # not just the mean
    # Packed outputs are 0 where the predicting position is padding: the model computed nothing there.
    predicted_from_padding = torch.cat([torch.zeros_like(mask[:, :1]), 1 - mask[:, :-1]], dim=1).bool()
    assert predicted_from_padding.any() and (actor1["old_log_probs"][predicted_from_padding] == 0).all()


@pytest.mark.parametrize("old_log_probs_from_update", [False, True])
def test_packed_updates_equal_padded(world, model_dirs, old_log_probs_from_update):
    """Actor (clip loss + KL + entropy + IS correction) and critic: losses, metrics, gradients."""
    flag = f"actor.old_log_probs_from_update={str(old_log_probs_from_update).lower()}"
    cfg = tiny_config(
        model_dirs["lm"], 1, *CFG, flag, "actor.ppo_mini_batch_size=4", "algorithm.adv_estimator=gae"
    )
    assert cfg.derived.old_log_probs_from_update is old_log_probs_from_update
    batch = rollout_batch(seed=1)
    if old_log_probs_from_update:
        batch = batch.exclude("old_log_probs")
    results = {}
    for packing in (False, True):
        actor_engine = engine(model_dirs["lm"], "lm", packing=packing)
        critic_engine = engine(model_dirs["value"], "value", packing=packing)
        actor_grads, critic_grads = capture_gradients(actor_engine), capture_gradients(critic_engine)
        before = full_weights(actor_engine)
        actor_metrics = Actor(actor_engine, cfg).update(batch)
        critic_metrics = Critic(critic_engine, cfg).update(batch)
        step = {name: w - before[name] for name, w in full_weights(actor_engine).items()}
        results[packing] = (actor_metrics, critic_metrics, actor_grads, critic_grads, step)
    (a0, c0, ga0, gc0, step0), (a1, c1, ga1, gc1, step1) = results[False], results[True]
    # Every parameter took the same optimizer step, the embeddings of the FSDP root included. Not
    # element-wise: Adam's g / sqrt(v) turns rounding in near-zero gradient elements into a full lr step.
    for name, update in step0.items():
        assert float(update.abs().max()) > 0, name
        assert float((step1[name] - update).norm()) / float(update.norm()) < 1e-2, name
    for key in ("actor/loss", "actor/pg_loss", "actor/kl_loss", "actor/entropy_loss", "actor/grad_norm"):
        assert a1[key] == pytest.approx(a0[key], rel=1e-5, abs=1e-7), key
    for key in ("critic/loss", "critic/vf_loss", "critic/grad_norm", "critic/vpred_mean"):
        assert c1[key] == pytest.approx(c0[key], rel=1e-5, abs=1e-7), key
    if old_log_probs_from_update:
        # Ratio exactly 1: no token is clipped; entropy and mismatch come from the update.
        assert a1["actor/pg_clipfrac"] == 0.0
        assert a1["actor/entropy"] == pytest.approx(a0["actor/entropy"], rel=1e-5)
        assert a1["rollout_mismatch/kl"] == pytest.approx(a0["rollout_mismatch/kl"], rel=1e-5)
    assert_grads_close(ga1, ga0)
    assert_grads_close(gc1, gc0)


def test_token_budget_micro_batches_equal_one_big_batch(world, model_dirs, tmp_path):
    cfg = tiny_config(model_dirs["lm"], 1, *CFG, "actor.ppo_mini_batch_size=4")
    batch = rollout_batch(seed=2)
    tokens = batch["attention_mask"].sum(-1)
    budget = 24  # the longest sample has 16 tokens; all 8 hold 87
    whole = engine(model_dirs["lm"], "lm", packing=True)  # micro-batches of micro_batch_size samples
    split = engine(model_dirs["lm"], "lm", packing=True, budget=budget)

    seen: list[list[int]] = []

    def fn(output, micro):
        seen.append(micro["attention_mask"].sum(-1).tolist())
        return {
            "logits_sum": output.logits.sum()[None].expand(len(micro)).clone(),
            "tokens": micro["attention_mask"].sum(-1),
        }

    # forward: rows come back in input order although micro-batches regroup them
    out = split.forward(batch, fn, micro_batch_size=1)
    assert torch.equal(out["tokens"], tokens)
    assert len(seen) >= -(-int(tokens.sum()) // budget) and all(sum(m) <= budget for m in seen)
    assert sorted(t for m in seen for t in m) == sorted(tokens.tolist())
    split.save(tmp_path / "after-forward")  # a forward leaves the optimizer's parameters registered
    log_probs_split = Actor(split, cfg).compute_log_probs(batch)
    log_probs_whole = Actor(whole, cfg).compute_log_probs(batch)
    masked_close(log_probs_split["old_log_probs"], log_probs_whole["old_log_probs"], batch["response_mask"])

    grads_whole, grads_split = capture_gradients(whole), capture_gradients(split)
    cfg_one = tiny_config(
        model_dirs["lm"], 1, *CFG, "actor.ppo_mini_batch_size=4", "actor.micro_batch_size_per_rank=8"
    )
    metrics_whole = Actor(whole, cfg_one).update(batch)
    metrics_split = Actor(split, cfg).update(batch)
    assert metrics_whole["actor/loss"] == pytest.approx(metrics_split["actor/loss"], rel=1e-5)
    assert metrics_whole["actor/grad_norm"] == pytest.approx(metrics_split["actor/grad_norm"], rel=1e-5)
    assert_grads_close(grads_split, grads_whole)


def test_packing_turns_itself_off_for_a_model_that_mixes_packed_sequences(
    world, model_dirs, monkeypatch, caplog
):
    assert (
        engine(model_dirs["lm"], "lm", packing=True, trainable=False).packing is True
    )  # Qwen2 separates them
    # Stand-in for a model whose attention ignores restarting position ids: positions run on across a row,
    # so the sequences sharing a row attend to each other. The engine's start-up probe must notice.
    real = fsdp_module.pack_model_inputs

    def positions_run_on(input_ids, attention_mask, pad_id, one_row=False):
        inputs, packing = real(input_ids, attention_mask, pad_id, one_row=one_row)
        rows, width = packing.packed_shape
        inputs["position_ids"] = torch.arange(width).expand(rows, width).clone()
        return inputs, packing

    monkeypatch.setattr(fsdp_module, "pack_model_inputs", positions_run_on)
    with caplog.at_level(logging.WARNING, logger="tandem.engine.fsdp.build"):
        mixed = engine(model_dirs["lm"], "lm", packing=True, trainable=False)
    assert mixed.packing is False
    assert "sequence packing is off for Qwen2ForCausalLM" in caplog.text
