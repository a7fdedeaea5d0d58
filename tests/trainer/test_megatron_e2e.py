"""End to end with the actor (and reference, critic) on megatron-core: Ray workers, gloo, the vLLM rollout
engine synced from the megatron model after every update, the tiny model. Checks that the rollout's
log-probs equal the trainer's after each sync (the synced weights are the trained ones), that training
moved the weights, and that the checkpoint and export work."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tandem.commands.export import export_checkpoint
from tandem.rollout.vllm import file_names
from tandem.trainer import RLTrainer
from tandem.trainer.checkpoint import COMPLETE

from .trainer_helpers import MOE_HALVED, custom_reward, make_assets, run_config, shard_bytes

pytest.importorskip("megatron.core")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("assets"))


@pytest.fixture(scope="module")
def moe_assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("moe_assets"), num_experts=4, experts_per_token=2)


@pytest.mark.parametrize(
    ("preset", "layout"),
    [
        # a tiny Mixtral on trainer TP=2 (+ sequence parallel) and EP=2 -> one vLLM engine over the same 2 ranks
        # (rollout TP=2): the experts gathered over EP, sent under their checkpoint names
        (
            "grpo",
            [
                "actor.megatron.tensor_parallel=2",
                "actor.megatron.sequence_parallel=true",
                "actor.megatron.expert_parallel=2",
                "rollout.tensor_parallel=2",
            ],
        ),
        # PP=2 with 2 model chunks per stage (the interleaved schedule); exported on one rank below
        ("ppo", ["actor.megatron.pipeline_parallel=2", "actor.megatron.virtual_pipeline=2"]),
        # CP=2: every row's columns split over both ranks (engine/megatron/context_parallel.py), one vLLM per rank
        ("grpo", ["actor.megatron.context_parallel=2"]),
    ],
    ids=["grpo-moe-tp2-ep2-rollout-tp2", "ppo-pp2-vp2", "grpo-cp2"],
)
def test_megatron_actor_trains_and_the_rollout_follows_it(
    ray_local, assets, moe_assets, tmp_path, preset, layout
):
    moe = "actor.megatron.expert_parallel=2" in layout
    assets = moe_assets if moe else assets
    cfg = run_config(
        assets,
        tmp_path,
        preset,
        "actor.strategy=megatron",
        *layout,
        "trainer.total_training_steps=3",
        "actor.ppo_mini_batch_size=4",  # one optimizer step per step (dp = 1: the batch is not split)
        "actor.use_kl_loss=true",
        "actor.kl_loss_coef=0.1",
        *custom_reward("by_length"),
    )
    history = {m["step"]: m for m in RLTrainer(cfg).fit()}
    assert sorted(history) == [1, 2, 3]
    for step, metrics in history.items():
        assert math.isfinite(metrics["actor/grad_norm"]) and metrics["actor/grad_norm"] > 0, step
        assert metrics["actor/optimizer_steps"] == 1
        assert "actor/kl_loss" in metrics
        # vLLM's log-probs of its own samples against the megatron actor's: equal after every sync.
        # (one optimizer step per step: the update's own log-probs are the old ones, roles/actor.py)
        assert 0 <= metrics["rollout_mismatch/abs_diff_mean"] < 1e-4, step
        if (
            preset == "grpo"
        ):  # measured |log ratio| <= 1e-6 after each sync (trainer TP=2 -> rollout TP=2; CP=2)
            assert metrics["rollout_mismatch/max_ratio"] == pytest.approx(1.0, abs=1e-5), step
            assert metrics["rollout_mismatch/min_ratio"] == pytest.approx(1.0, abs=1e-5), step
        if moe:
            assert 1.0 <= metrics["actor/router_aux_loss"] <= 2.0, step  # the routers' balance term
        if preset == "ppo":
            assert math.isfinite(metrics["critic/vf_loss"]) and metrics["critic/grad_norm"] > 0
    assert history[3]["actor/kl_loss"] > 0  # the actor moved away from the reference
    if (
        moe
    ):  # rollout TP = trainer TP = 2: each rank's own TP cuts went into its half of the engine, no gather
        folder_bytes, expected = shard_bytes(assets["model"], MOE_HALVED)
        for step in (2, 3):
            assert history[step]["weight_sync/full_gather_bytes"] == folder_bytes
            assert history[step]["weight_sync/bytes"] == expected

    run = tmp_path / "tandem" / cfg.trainer.experiment_name
    last = run / "checkpoints" / "global_step_3"
    assert (last / COMPLETE).is_file() and (last / "actor").is_dir()
    # The TP / PP-sharded checkpoint, loaded on one rank (megatron reshards it) and exported: the trained weights.
    exported = export_checkpoint(last, tmp_path / "hf")
    trained, initial = (
        load_file(exported / "model.safetensors"),
        load_file(assets["model"] / "model.safetensors"),
    )
    assert trained.keys() == initial.keys()
    moved = [name for name in initial if not torch.equal(trained[name], initial[name])]
    assert len(moved) == len(initial), f"unchanged after 3 steps: {sorted(set(initial) - set(moved))}"
    model = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32)
    reloaded = dict(model.named_parameters())
    to_files = file_names(exported)  # a MoE model's fused experts, as its files name them
    if to_files is not None:
        reloaded = dict(to_files(iter(reloaded.items())))
    assert all(torch.equal(reloaded[name], trained[name]) for name in trained)
