"""Every advantage estimator runs a step through the trainer (in process, 1 rank: fast)."""

from __future__ import annotations

import math

import pytest

from tandem.trainer import RLTrainer

from .trainer_helpers import custom_reward, make_assets, run_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("assets"))


@pytest.mark.parametrize("preset", ["rloo", "reinforce_pp", "remax", "dr_grpo", "gspo"])
def test_preset_runs_a_step(assets, tmp_path, preset, capsys):
    cfg = run_config(
        assets,
        tmp_path,
        preset,
        "trainer.backend=inprocess",
        "trainer.workers_per_node=1",
        "trainer.total_training_steps=1",
        "rollout.n=4",
        *custom_reward("by_length"),
    )
    (metrics,) = RLTrainer(cfg).fit()
    assert metrics["step"] == 1 and metrics["perf/samples"] == 16
    (line,) = [out for out in capsys.readouterr().out.splitlines() if out.startswith("[tandem] device:")]
    assert line.startswith(
        "[tandem] device: cpu (set by trainer.device); actor fp32 compute, fp32 master; rollout "
    )
    assert "actor/pg_loss" in metrics and "advantages/mean" in metrics
    if preset in ("rloo", "dr_grpo", "gspo"):  # group baselines: advantages sum to 0 within each group
        assert metrics["advantages/max"] >= 0 >= metrics["advantages/min"]


def test_dynamic_sampling_that_keeps_no_group_stops_after_max_rounds_with_the_fix(assets, tmp_path):
    cfg = run_config(
        assets,
        tmp_path,
        "dapo",
        "trainer.backend=inprocess",
        "trainer.workers_per_node=1",
        "trainer.total_training_steps=1",
        "algorithm.dynamic_sampling.gen_batch_size=4",
        "algorithm.dynamic_sampling.max_num_gen_batches=3",
        "reward.overlong.enable=false",
        *custom_reward("constant"),
    )
    with pytest.raises(RuntimeError, match=r"after 3 rounds of 4 prompts only 0 of .*max_num_gen_batches"):
        RLTrainer(cfg).fit()


RC = "algorithm.rollout_correction"


@pytest.mark.parametrize(
    "override",
    [
        "actor.policy_loss=cispo",
        "actor.policy_loss=geo_mean",
        "actor.policy_loss=sapo",
        "actor.policy_loss=clip_cov actor.clip_cov_lb=0",  # the tiny model's covariances all lie below 1
        "actor.policy_loss=dro actor.dro_beta=0.1",
        "actor.policy_loss=kl_cov",
        "actor.policy_loss=dppo_tv",
        "actor.policy_loss=dppo_kl",
        "algorithm.adv_estimator=grpo_passk",
        "algorithm.adv_estimator=optimal_token_baseline actor.calculate_sum_pi_squared=true",
        # the IS weights scale the path energy
        f"algorithm.adv_estimator=tir_optimal_token_baseline actor.calculate_sum_pi_squared=true {RC}.rollout_is=token",
        # rollout correction (the helpers' two mini-batches give a separate old-log-prob pass)
        pytest.param(
            f"{RC}.rollout_is=token {RC}.rollout_is_band_low=0.5 {RC}.rollout_is_band_high=5 "
            f"{RC}.rollout_is_batch_normalize=true",
            id="rollout_is_band_norm",
        ),
        pytest.param(
            f"{RC}.rollout_is=sequence {RC}.rollout_rs=seq_mean_k1,token_k3 {RC}.rollout_rs_threshold=0.5_2.0,0.1",
            id="rollout_rs",
        ),
        pytest.param(
            f"{RC}.bypass_mode=true {RC}.rollout_rs=token_k3 {RC}.rollout_rs_threshold=0.1",
            id="bypass_ppo_clip",
        ),
        pytest.param(
            f"{RC}.bypass_mode=true {RC}.loss_type=reinforce {RC}.rollout_is=sequence", id="bypass_reinforce"
        ),
        # two reward terms, each group-normalised (rewards_for_tests.by_parts)
        "algorithm.adv_estimator=gdpo algorithm.gdpo_reward_keys=[correct,format] "
        "algorithm.gdpo_reward_weights=[1.0,0.5] reward.custom_reward_function=by_parts",
    ],
    ids=lambda override: override.split()[0].split("=")[1],
)
def test_loss_or_estimator_trains_two_steps(assets, tmp_path, override):
    cfg = run_config(
        assets,
        tmp_path,
        "grpo",
        "trainer.backend=inprocess",
        "trainer.workers_per_node=1",
        "trainer.total_training_steps=2",
        *custom_reward("by_characters"),
        *override.split(),  # after the reward: a case may pick its own
    )
    history = RLTrainer(cfg).fit()
    assert [m["step"] for m in history] == [1, 2]
    for metrics in history:
        assert math.isfinite(metrics["actor/pg_loss"]) and metrics["actor/pg_loss"] != 0
        assert math.isfinite(metrics["actor/grad_norm"]) and metrics["actor/grad_norm"] > 0
        if "bypass_mode" in override:  # no old-log-prob pass: the update compares with the rollout
            assert math.isfinite(metrics["rollout_mismatch/kl"]) and metrics["actor/entropy"] > 0
            assert "timing_s/old_log_probs" not in metrics and "timing_s/update_actor" in metrics
            if "rollout_rs" in override:  # verl's statistics of the option, from the update's log-probs
                assert math.isfinite(metrics["rollout_corr/rollout_rs_token_k3_std"])
        elif "rollout_correction" in override:  # the diagnostics of the step, all finite
            corr = {k: v for k, v in metrics.items() if k.startswith("rollout_corr/")}
            assert {"rollout_corr/rollout_is_eff_sample_size", "rollout_corr/chi2_seq"} <= corr.keys()
            assert all(math.isfinite(v) for v in corr.values()), corr
            if "rollout_rs" in override:  # verl's statistics of each option (13 for k1, 12 for k3)
                assert (
                    len([k for k in corr if k.startswith("rollout_corr/rollout_rs_seq_mean_k1_")]) == 13 + 2
                )
                assert len([k for k in corr if k.startswith("rollout_corr/rollout_rs_token_k3_")]) == 12 + 2
        elif "gdpo" in override:  # each term's batch mean is logged; advantages are whitened over tokens
            assert all(0 <= metrics[f"reward/gdpo/{key}_mean"] <= 1 for key in ("correct", "format"))
            assert abs(metrics["advantages/mean"]) < 1e-4


def test_chunked_lm_head_gives_the_full_heads_step(assets, tmp_path):
    """actor.fsdp.lm_head_chunk_tokens through the whole trainer (actor with its old-log-prob pass, the KL
    reference, an entropy bonus, OTB's sum pi^2): one step's metrics equal the full logits' (the tiny model's
    vocabulary keeps `auto` off, so chunks are forced here)."""
    runs = {}
    for chunk in ("null", "5"):
        cfg = run_config(
            assets,
            tmp_path / chunk,
            "grpo",
            "trainer.backend=inprocess",
            "trainer.workers_per_node=1",
            "trainer.total_training_steps=1",
            "actor.use_kl_loss=true",
            "actor.entropy_coeff=0.01",
            "algorithm.adv_estimator=optimal_token_baseline",
            "actor.calculate_sum_pi_squared=true",
            f"actor.fsdp.lm_head_chunk_tokens={chunk}",
            *custom_reward("by_length"),
        )
        (runs[chunk],) = RLTrainer(cfg).fit()
    full, chunked = runs["null"], runs["5"]
    keys = [k for k in full if k.startswith(("actor/", "advantages/")) and not k.startswith("actor/lr")]
    assert {"actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"} <= set(keys)
    assert full["actor/grad_norm"] > 0 and full["actor/entropy"] > 0.1
    for key in keys:
        assert chunked[key] == pytest.approx(full[key], rel=1e-4, abs=1e-6), key


def test_ppo_with_adapters_on_the_actor_and_the_critic_trains_both(assets, tmp_path):
    cfg = run_config(
        assets,
        tmp_path,
        "ppo",
        "trainer.backend=inprocess",
        "trainer.workers_per_node=1",
        "trainer.total_training_steps=2",
        "actor.lora.rank=4",
        "critic.lora.rank=4",
        *custom_reward("by_length"),
    )
    for metrics in RLTrainer(cfg).fit():
        assert math.isfinite(metrics["critic/vf_loss"]) and metrics["critic/grad_norm"] > 0
        assert metrics["actor/grad_norm"] > 0
