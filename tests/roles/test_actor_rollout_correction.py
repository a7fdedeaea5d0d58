"""The actor's side of rollout correction. Bypass mode: the rollout's log-probs are the old ones, and the
loss compares the policy being updated with the rollout (IS weights, rejection), checked against the loss
written out by hand from the model's own log-probs. One optimizer step per step: the update gives the old
log-probs, and its rollout_corr/* equal those of a separate old-log-prob pass. Real FSDP2 engine in this process
(conftest's `world`), as test_packing_parity."""

from __future__ import annotations

import math

import pytest
import torch

from tandem.algos.rollout_correction import rollout_diagnostics
from tandem.roles.actor import Actor

from .roles_helpers import tiny_config
from .test_packing_parity import capture_gradients, engine, rollout_batch

RC = "algorithm.rollout_correction"
# One mini-batch of all 8 samples: the reported pg_loss is the loss at the weights the samples met.
ONE_STEP = ["actor.ppo_mini_batch_size=4", "actor.use_kl_loss=false", "actor.entropy_coeff=0"]
LOW, HIGH, THRESHOLD = 0.6, 1.6, 1.2


def bypass_batch(model_dir, cfg):
    """The rollout batch with rollout log-probs = the model's own + noise, and old = rollout (as the
    trainer sets them in bypass mode); also the model's log-probs, for the expected loss."""
    batch = rollout_batch(seed=3)
    mask = batch["response_mask"].float()
    current = Actor(engine(model_dir, "lm", packing=True), cfg).compute_log_probs(batch)["old_log_probs"]
    noise = torch.randn(mask.shape, generator=torch.Generator().manual_seed(5)) * 0.4
    batch["rollout_log_probs"] = (current + noise) * mask
    batch["old_log_probs"] = batch["rollout_log_probs"]
    return batch, current, mask


def expected_keep(current, rollout, mask):
    """token_k1 with bounds LOW_HIGH keeps tokens whose pi_rollout / pi_theta lies in [LOW, HIGH]."""
    ratio = torch.exp(rollout - current)
    return ((ratio >= LOW) & (ratio <= HIGH)).float() * mask


def update(model_dir, cfg, batch):
    return Actor(engine(model_dir, "lm", packing=True), cfg).update(batch)


def test_bypass_reinforce_weights_by_the_truncated_ratio_to_the_rollout_and_rejects(world, model_dirs):
    cfg = tiny_config(
        model_dirs["lm"],
        1,
        *ONE_STEP,
        f"{RC}.bypass_mode=true",
        f"{RC}.loss_type=reinforce",
        f"{RC}.rollout_is=token",
        f"{RC}.rollout_is_threshold={THRESHOLD}",
        f"{RC}.rollout_rs=token_k1",
        f"{RC}.rollout_rs_threshold={LOW}_{HIGH}",
    )
    batch, current, mask = bypass_batch(model_dirs["lm"], cfg)
    rollout, adv = batch["rollout_log_probs"], batch["advantages"]
    weights = torch.exp(current - rollout).clamp(max=THRESHOLD) * mask
    keep = expected_keep(current, rollout, mask)
    assert 0 < keep.sum() < mask.sum() and ((weights == THRESHOLD) & (keep > 0)).any()  # both act
    # REINFORCE: -A logp w on the kept tokens, over every valid token (the mini-batch's count, as verl)
    expected = float((-adv * current * weights * keep).sum() / mask.sum())
    metrics = update(model_dirs["lm"], cfg, batch)
    assert metrics["actor/pg_loss"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    rejected = 1 - float(keep.sum() / mask.sum())
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(rejected, rel=1e-5)
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(
        float(weights.sum() / mask.sum()), rel=1e-4
    )
    log_ratio = (current - rollout) * mask
    assert metrics["rollout_mismatch/kl"] == pytest.approx(float(-log_ratio.sum() / mask.sum()), rel=1e-4)
    # verl's statistics of the option over the rows the update saw: s = log(pi_rollout / pi_theta) per token
    stat = -log_ratio
    assert metrics["rollout_corr/rollout_rs_token_k1_mean"] == pytest.approx(
        float(stat.sum() / mask.sum()), rel=1e-4
    )
    high = float(((stat > math.log(HIGH)) * mask).sum() / mask.sum())
    low = float(((stat < math.log(LOW)) * mask).sum() / mask.sum())
    assert metrics["rollout_corr/rollout_rs_token_k1_fraction_high"] == pytest.approx(high, abs=1e-6)
    assert metrics["rollout_corr/rollout_rs_token_k1_fraction_low"] == pytest.approx(low, abs=1e-6)
    assert metrics["rollout_corr/rollout_rs_token_k1_masked_fraction"] == pytest.approx(rejected, rel=1e-5)
    assert metrics["actor/grad_norm"] > 0


def test_bypass_ppo_clip_takes_the_ratio_to_the_rollout_policy_without_is_weights(world, model_dirs):
    cfg = tiny_config(
        model_dirs["lm"],
        1,
        *ONE_STEP,
        f"{RC}.bypass_mode=true",
        f"{RC}.rollout_is=token",  # computed for the metrics only: the ratio already is the correction
        f"{RC}.rollout_rs=token_k1",
        f"{RC}.rollout_rs_threshold={LOW}_{HIGH}",
    )
    batch, current, mask = bypass_batch(model_dirs["lm"], cfg)
    rollout, adv = batch["rollout_log_probs"], batch["advantages"]
    ratio = torch.exp(current - rollout)
    clipped = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    per_token = torch.where(adv < 0, torch.minimum(clipped, -adv * 3.0), clipped)  # dual clip, c = 3
    keep = expected_keep(current, rollout, mask)
    expected = float((per_token * keep).sum() / mask.sum())
    metrics = update(model_dirs["lm"], cfg, batch)
    assert metrics["actor/pg_loss"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert "rollout_corr/rollout_is_mean" in metrics and metrics["actor/pg_clipfrac"] > 0


def test_diagnostics_from_the_update_equal_those_of_a_separate_pass(world, model_dirs):
    cfg = tiny_config(
        model_dirs["lm"],
        1,
        *ONE_STEP,
        f"{RC}.rollout_is=token",
        f"{RC}.rollout_is_band_low=0.8",
        f"{RC}.rollout_is_band_high=1.5",
    )
    assert cfg.derived.old_log_probs_from_update
    batch, current, mask = bypass_batch(model_dirs["lm"], cfg)
    _, expected = rollout_diagnostics(
        current, batch["rollout_log_probs"], mask, cfg.algorithm.rollout_correction
    )
    metrics = update(model_dirs["lm"], cfg, batch.exclude("old_log_probs"))
    assert {
        "rollout_corr/rollout_is_band_fraction",
        "rollout_corr/chi2_seq",
        "rollout_mismatch/max_ratio",
    } <= set(expected)
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_bypass_batch_normalisation_divides_by_the_mini_batch_mean_however_it_is_cut(
    world, model_dirs, level
):
    """rollout_is_batch_normalize in bypass mode: the weights of the policy being updated divided by their mean
    over the whole mini-batch (tokens, or sequences), so one micro-batch of 8 and two of 4 give the same loss and
    gradients; with one micro-batch this is verl's number (verl divides by each micro-batch's mean)."""
    runs, batch = {}, None
    for micro in (8, 4):
        cfg = tiny_config(
            model_dirs["lm"],
            1,
            *ONE_STEP,
            f"actor.micro_batch_size_per_rank={micro}",
            f"{RC}.bypass_mode=true",
            f"{RC}.loss_type=reinforce",
            f"{RC}.rollout_is={level}",
            f"{RC}.rollout_is_threshold={THRESHOLD}",
            f"{RC}.rollout_is_batch_normalize=true",
        )
        if batch is None:  # the same samples for both cuts
            batch, current, mask = bypass_batch(model_dirs["lm"], cfg)
        actor = Actor(engine(model_dirs["lm"], "lm", packing=True), cfg)
        grads = capture_gradients(actor.engine)
        runs[micro] = (actor.update(batch), grads)
    rollout, adv = batch["rollout_log_probs"], batch["advantages"]
    log_ratio = (current - rollout) * mask
    if level == "token":
        weights = torch.exp(log_ratio).clamp(max=THRESHOLD) * mask
        mean = weights.sum() / mask.sum()
    else:  # one weight per sequence, the product of its token ratios; the mean over the sequences with a token
        per_row = torch.exp(log_ratio.sum(-1)).clamp(max=THRESHOLD)
        weights = per_row[:, None] * mask
        has_token = mask.sum(-1) > 0
        assert not has_token.all()  # a row with an empty response does not count, as in verl
        mean = per_row[has_token].mean()
    assert ((weights > 0) & (weights < THRESHOLD)).any() and abs(
        float(mean) - 1
    ) > 0.05  # normalising matters
    expected = float((-adv * current * weights / mean).sum() / mask.sum())
    (one, one_grads), (two, two_grads) = runs[8], runs[4]
    for metrics in (one, two):
        assert metrics["actor/pg_loss"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
        assert metrics["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(float(mean), rel=1e-5)
        # the mean before normalising, as verl reports it
        assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(
            float(weights.sum() / mask.sum()), rel=1e-4
        )
    assert one["actor/grad_norm"] == pytest.approx(two["actor/grad_norm"], rel=1e-5)
    assert one_grads.keys() == two_grads.keys() and one_grads
    for name, grad in one_grads.items():
        torch.testing.assert_close(two_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)
