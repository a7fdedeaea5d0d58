"""Batch-size normalisation, checked against sizes worked out by hand."""

import dataclasses

import pytest
from config_helpers import load


def test_grpo_on_two_ranks():
    # 8 prompts x 4 samples = 32 samples per step, 16 per rank.
    # Mini-batch 4 prompts = 16 samples = 8 per rank; micro 2 -> 4 accumulation steps; 8 / 4 = 2 optimizer steps.
    d = load(
        "data.train_batch_size=8",
        "rollout.n=4",
        "trainer.workers_per_node=2",
        "actor.ppo_mini_batch_size=4",
        "actor.micro_batch_size_per_rank=2",
    ).derived
    assert (d.world_size, d.dp_size) == (2, 2)
    assert (d.samples_per_step, d.samples_per_rank) == (32, 16)
    assert (d.actor_mini_batch_samples, d.actor_mini_batch_samples_per_rank) == (16, 8)
    assert d.actor_grad_accum_steps == 4
    assert (d.actor_mini_batches_per_step, d.actor_optimizer_steps_per_step) == (2, 2)
    assert not d.critic_needed and d.critic_optimizer_steps_per_step == 0
    assert not d.reference_needed and not d.reward_baselines_needed
    assert d.gen_prompts_per_round == 8


def test_ppo_on_two_nodes_with_critic_and_two_epochs():
    # 2 nodes x 4 = 8 ranks. 64 prompts x 1 sample = 64 samples, 8 per rank.
    # Actor: mini 16 prompts = 16 samples = 2 per rank, micro 1 -> 2 accumulation steps;
    #        64 / 16 = 4 mini-batches x 2 epochs = 8 optimizer steps.
    # Critic: mini 32 = 4 per rank, micro 2 -> 2 steps; 2 mini-batches x 2 epochs (inherited) = 4.
    d = load(
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_in_reward=true",
        "rollout.n=1",
        "trainer.nnodes=2",
        "trainer.workers_per_node=4",
        "data.train_batch_size=64",
        "actor.ppo_mini_batch_size=16",
        "actor.micro_batch_size_per_rank=1",
        "actor.ppo_epochs=2",
        "critic.ppo_mini_batch_size=32",
        "critic.micro_batch_size_per_rank=2",
    ).derived
    assert (d.world_size, d.dp_size, d.samples_per_step, d.samples_per_rank) == (8, 8, 64, 8)
    assert (d.actor_mini_batch_samples_per_rank, d.actor_grad_accum_steps) == (2, 2)
    assert (d.actor_mini_batches_per_step, d.actor_optimizer_steps_per_step) == (4, 8)
    assert d.critic_needed and d.reference_needed
    assert (d.critic_mini_batch_samples, d.critic_mini_batch_samples_per_rank) == (32, 4)
    assert (d.critic_grad_accum_steps, d.critic_mini_batches_per_step, d.critic_optimizer_steps_per_step) == (
        2,
        2,
        4,
    )


def test_megatron_splits_the_batch_over_data_parallel_ranks_only():
    # 8 ranks / (TP 2 x PP 2) = 2 data-parallel ranks. 16 prompts x 8 = 128 samples, 64 per DP rank.
    # Mini 8 prompts = 64 samples = 32 per DP rank; micro 4 -> 8 steps; 2 mini-batches.
    d = load(
        "actor.strategy=megatron",
        "actor.megatron.tensor_parallel=2",
        "actor.megatron.pipeline_parallel=2",
        "trainer.workers_per_node=8",
        "data.train_batch_size=16",
        "rollout.n=8",
        "actor.ppo_mini_batch_size=8",
        "actor.micro_batch_size_per_rank=4",
    ).derived
    assert (d.world_size, d.dp_size, d.samples_per_rank) == (8, 2, 64)
    assert (d.actor_mini_batch_samples_per_rank, d.actor_grad_accum_steps) == (32, 8)
    assert d.actor_optimizer_steps_per_step == 2


def test_ulysses_sequence_parallel_shrinks_data_parallel():
    d = load("actor.fsdp.sequence_parallel=2", "trainer.workers_per_node=4").derived
    assert (d.world_size, d.dp_size) == (4, 2)


def test_presets_derive_models_needed():
    assert load(preset="ppo").derived.critic_needed
    assert load(preset="grpo").derived.reference_needed
    assert not load(preset="dapo").derived.reference_needed
    assert load(preset="remax").derived.reward_baselines_needed
    assert load(preset="dapo").derived.gen_prompts_per_round == 16


def test_derived_is_frozen():
    d = load().derived
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.world_size = 3
