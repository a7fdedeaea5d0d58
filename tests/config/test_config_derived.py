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
        "actor.use_dynamic_bsz=false",
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
        "actor.use_dynamic_bsz=false",
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
        "actor.use_dynamic_bsz=false",
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


def test_three_nodes_of_two_workers_five_samples_per_prompt():
    # 3 x 2 = 6 ranks. 12 prompts x 5 = 60 samples per step, 10 per rank.
    # Actor: mini 6 prompts = 30 samples = 5 per rank, micro 1 -> 5 accumulation steps;
    #        12 / 6 = 2 mini-batches x 2 epochs = 4 optimizer steps.
    # Critic: mini 12 prompts = 60 samples = 10 per rank, micro 5 -> 2 accumulation steps;
    #         1 mini-batch x 2 epochs (inherited) = 2 optimizer steps.
    d = load(
        "trainer.nnodes=3",
        "trainer.workers_per_node=2",
        "algorithm.adv_estimator=gae",
        "rollout.n=5",
        "data.train_batch_size=12",
        "actor.ppo_mini_batch_size=6",
        "actor.use_dynamic_bsz=false",
        "actor.micro_batch_size_per_rank=1",
        "actor.ppo_epochs=2",
        "critic.ppo_mini_batch_size=12",
        "critic.micro_batch_size_per_rank=5",
    ).derived
    assert (d.world_size, d.dp_size, d.samples_per_step, d.samples_per_rank) == (6, 6, 60, 10)
    assert (d.actor_mini_batch_samples, d.actor_mini_batch_samples_per_rank, d.actor_grad_accum_steps) == (
        30,
        5,
        5,
    )
    assert (d.actor_mini_batches_per_step, d.actor_optimizer_steps_per_step) == (2, 4)
    assert (d.critic_mini_batch_samples, d.critic_mini_batch_samples_per_rank, d.critic_grad_accum_steps) == (
        60,
        10,
        2,
    )
    assert (d.critic_mini_batches_per_step, d.critic_optimizer_steps_per_step) == (1, 2)
    assert d.critic_needed and not d.reference_needed
    assert d.gen_prompts_per_round == 12


def test_three_nodes_with_tensor_parallel_and_dapo_dynamic_sampling():
    # 6 ranks / TP 2 = 3 data-parallel ranks. 12 prompts x 5 = 60 samples, 20 per DP rank.
    # Mini 6 prompts = 30 samples = 10 per DP rank, micro 5 -> 2 steps; 2 mini-batches, 1 epoch.
    # Dynamic sampling generates 18 prompts (90 samples) per round and keeps 12 prompts' groups.
    d = load(
        "trainer.nnodes=3",
        "trainer.workers_per_node=2",
        "actor.strategy=megatron",
        "actor.megatron.tensor_parallel=2",
        "rollout.n=5",
        "data.train_batch_size=12",
        "actor.ppo_mini_batch_size=6",
        "actor.use_dynamic_bsz=false",
        "actor.micro_batch_size_per_rank=5",
        "algorithm.dynamic_sampling.enable=true",
        "algorithm.dynamic_sampling.gen_batch_size=18",
        preset="dapo",
    ).derived
    assert (d.world_size, d.dp_size, d.samples_per_step, d.samples_per_rank) == (6, 3, 60, 20)
    assert (d.actor_mini_batch_samples_per_rank, d.actor_grad_accum_steps) == (10, 2)
    assert (d.actor_mini_batches_per_step, d.actor_optimizer_steps_per_step) == (2, 2)
    assert d.gen_prompts_per_round == 18


def test_gen_batch_size_is_unused_without_dynamic_sampling():
    # dapo sets gen_batch_size=16; turning dynamic sampling off must not make a step generate 16 prompts.
    d = load("algorithm.dynamic_sampling.enable=false", preset="dapo").derived
    assert d.gen_prompts_per_round == 8
    assert load(preset="dapo").derived.gen_prompts_per_round == 16
    assert (
        load("algorithm.dynamic_sampling.enable=true").derived.gen_prompts_per_round == 8
    )  # None = a step's


def test_dynamic_bsz_needs_no_micro_batch_and_a_budget_of_one_full_sample():
    # base preset: 128 prompt + 128 response tokens; micro 3 does not divide 8 but is unused.
    cfg = load(
        "actor.use_dynamic_bsz=true",
        "actor.max_tokens_per_micro_batch=256",
        "actor.micro_batch_size_per_rank=3",
        preset="base",
    )
    assert cfg.derived.actor_grad_accum_steps is None
    assert cfg.derived.actor_mini_batch_samples_per_rank == 8
