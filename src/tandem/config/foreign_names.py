"""Keys people bring from verl and TRL configs, and the Tandem key to use instead.

Only used to word the "unknown key" error; nothing is translated silently, so a config always
reads as Tandem's own. verl keys are dotted paths as on its command line; TRL's are the flat
`GRPOConfig` / `TrainingArguments` names.
"""

from __future__ import annotations

# verl key -> (Tandem key, note on a difference in meaning or "")
VERL: dict[str, tuple[str, str]] = {
    "actor_rollout_ref": ("actor, rollout, reference", "verl's section is split into these three"),
    "actor_rollout_ref.model": (
        "actor",
        "the model settings are actor.model_path, actor.activation_checkpointing",
    ),
    "actor_rollout_ref.model.path": ("actor.model_path", ""),
    "actor_rollout_ref.model.lora_rank": ("actor.lora.rank", ""),
    "actor_rollout_ref.model.lora_alpha": ("actor.lora.alpha", ""),
    "actor_rollout_ref.model.target_modules": ("actor.lora.target_modules", "a list: [all-linear] or names"),
    "actor_rollout_ref.model.enable_gradient_checkpointing": ("actor.activation_checkpointing", ""),
    "actor_rollout_ref.actor.use_torch_compile": (
        "actor.fsdp.torch_compile",
        "verl compiles its entropy function (on by default); Tandem compiles each decoder layer, off by default",
    ),
    "actor_rollout_ref.model.use_fused_kernels": (
        "actor.fsdp.lm_head_chunk_tokens",
        "Tandem's log-probs from the hidden states take a chunk size in tokens (torch only, no Triton kernel)",
    ),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": ("actor.micro_batch_size_per_rank", ""),
    "actor_rollout_ref.actor.ppo_micro_batch_size": (
        "actor.micro_batch_size_per_rank",
        "verl's counts samples over all GPUs, Tandem's on one rank",
    ),
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": ("actor.max_tokens_per_micro_batch", ""),
    "actor_rollout_ref.actor.clip_ratio": ("actor.clip_ratio_low and actor.clip_ratio_high", ""),
    "actor_rollout_ref.actor.policy_loss.loss_mode": ("actor.policy_loss", ""),
    "actor_rollout_ref.actor.policy_loss.clip_cov_ratio": ("actor.clip_cov_ratio", ""),
    "actor_rollout_ref.actor.policy_loss.clip_cov_lb": ("actor.clip_cov_lb", ""),
    "actor_rollout_ref.actor.policy_loss.clip_cov_ub": ("actor.clip_cov_ub", ""),
    "actor_rollout_ref.actor.policy_loss.kl_cov_ratio": ("actor.kl_cov_ratio", ""),
    "actor_rollout_ref.actor.policy_loss.ppo_kl_coef": ("actor.ppo_kl_coef", ""),
    "actor_rollout_ref.actor.policy_loss.dro_beta": ("actor.dro_beta", ""),
    "actor_rollout_ref.actor.tau_pos": ("actor.tau_pos", ""),
    "actor_rollout_ref.actor.calculate_sum_pi_squared": ("actor.calculate_sum_pi_squared", ""),
    "actor_rollout_ref.actor.sum_pi_squared_checkpointing": (
        "actor.calculate_sum_pi_squared",
        "not needed: Tandem computes sum pi^2 in the old-log-prob pass, without gradients",
    ),
    "actor_rollout_ref.actor.tau_neg": ("actor.tau_neg", ""),
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": ("actor.fsdp.sequence_parallel", ""),
    "actor_rollout_ref.actor.fsdp_config": ("actor.fsdp", ""),
    "actor_rollout_ref.actor.fsdp_config.param_offload": ("actor.fsdp.cpu_offload", ""),
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": ("actor.fsdp.cpu_offload", ""),
    "actor_rollout_ref.actor.optim.lr_warmup_steps": ("actor.optim.warmup_steps", ""),
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": ("actor.optim.warmup_ratio", ""),
    "actor_rollout_ref.actor.optim.warmup_style": ("actor.optim.lr_scheduler", ""),
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": ("actor.megatron.tensor_parallel", ""),
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size": ("actor.megatron.pipeline_parallel", ""),
    "actor_rollout_ref.actor.megatron.context_parallel_size": ("actor.megatron.context_parallel", ""),
    "actor_rollout_ref.actor.megatron.sequence_parallel": ("actor.megatron.sequence_parallel", ""),
    "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size": (
        "actor.megatron.virtual_pipeline",
        "",
    ),
    "actor_rollout_ref.actor.megatron.expert_model_parallel_size": ("actor.megatron.expert_parallel", ""),
    "actor_rollout_ref.rollout.name": ("rollout.engine", ""),
    "actor_rollout_ref.rollout.multi_turn.enable": (
        "rollout.mode",
        "set rollout.mode=async and name the tools in rollout.multi_turn.tools",
    ),
    "actor_rollout_ref.rollout.multi_turn.tool_config_path": (
        "rollout.multi_turn.tools and rollout.multi_turn.tool_file",
        "built-in tools by name; your own from a Python file (TOOLS list or @tandem.tools.tool), not a YAML",
    ),
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path": (
        "rollout.multi_turn.interaction and rollout.multi_turn.interaction_file",
        "",
    ),
    "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side": (
        "rollout.multi_turn.tool_response_truncate_side",
        "",
    ),
    "actor_rollout_ref.rollout.agent.num_workers": (
        "rollout.mode",
        "the agent loop runs inside each rollout worker, one coroutine per sample; no separate agent workers",
    ),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": ("rollout.tensor_parallel", ""),
    "actor_rollout_ref.rollout.response_length": ("data.max_response_length", ""),
    "actor_rollout_ref.rollout.prompt_length": ("data.max_prompt_length", ""),
    "actor_rollout_ref.rollout.val_kwargs": ("rollout.val", ""),
    "actor_rollout_ref.ref": ("reference", ""),
    "critic.model.path": ("critic.model_path", ""),
    "critic.ppo_micro_batch_size_per_gpu": ("critic.micro_batch_size_per_rank", ""),
    "critic.ppo_max_token_len_per_gpu": ("actor.max_tokens_per_micro_batch", "the critic shares the actor's"),
    "critic.use_dynamic_bsz": ("actor.use_dynamic_bsz", "the critic shares the actor's"),
    "reward_model": ("reward.reward_model", ""),
    "reward_model.model.path": ("reward.reward_model.model_path", ""),
    "reward_model.micro_batch_size_per_gpu": ("reward.reward_model.micro_batch_size_per_rank", ""),
    "reward_model.overlong_buffer": ("reward.overlong", ""),
    "reward_model.overlong_buffer.len": ("reward.overlong.buffer_len", ""),
    "custom_reward_function": ("reward.custom_reward_file and reward.custom_reward_function", ""),
    # Tandem has one reward manager, and it passes every field of a scorer's dict through, so verl's
    # naive / dapo / gdpo managers need no setting: gdpo reads the fields algorithm.gdpo_reward_keys names.
    "reward.reward_manager.name": (
        "reward.custom_reward_file",
        "Tandem has one reward manager; it keeps every field of the scorer's dict, so for gdpo name its "
        "terms in algorithm.gdpo_reward_keys",
    ),
    "reward_model.reward_manager": (
        "reward.custom_reward_file",
        "Tandem has one reward manager; it keeps every field of the scorer's dict, so for gdpo name its "
        "terms in algorithm.gdpo_reward_keys",
    ),
    "custom_reward_function.path": ("reward.custom_reward_file", ""),
    "custom_reward_function.name": ("reward.custom_reward_function", ""),
    "algorithm.rollout_correction.rollout_token_veto_threshold": (
        "algorithm.rollout_correction.rollout_rs",
        "verl 0.7's per-token veto is gone in newer verl; seq_max_k2 / seq_max_k3 reject a sequence for its worst token",
    ),
    "algorithm.rollout_correction.rollout_rs_threshold_lower": (
        "algorithm.rollout_correction.rollout_rs_threshold",
        "write the k1 bounds as lower_upper, e.g. 0.5_2.0",
    ),
    "algorithm.rollout_correction.use_policy_gradient": (
        "algorithm.rollout_correction.loss_type",
        "verl's later name: loss_type=reinforce with bypass_mode=true",
    ),
    "actor_rollout_ref.rollout.calculate_log_probs": (
        "algorithm.rollout_correction",
        "Tandem's rollout engines always return the rollout log-probs; nothing to turn on",
    ),
    "algorithm.filter_groups": ("algorithm.dynamic_sampling", ""),
    "algorithm.norm_adv_by_std_in_grpo": ("algorithm.norm_adv_by_std", ""),
    "data.gen_batch_size": ("algorithm.dynamic_sampling.gen_batch_size", ""),
    "trainer.n_gpus_per_node": ("trainer.workers_per_node", ""),
    "trainer.logger": ("trainer.loggers", ""),
    "trainer.default_local_dir": ("trainer.output_dir", ""),
    "trainer.resume_mode": ("trainer.resume", ""),
    "trainer.max_actor_ckpt_to_keep": ("trainer.max_checkpoints_to_keep", ""),
    "trainer.profile_steps": ("trainer.profile.steps", ""),
    "global_profiler.steps": (
        "trainer.profile.steps",
        "Tandem's torch.profiler settings are under trainer.profile",
    ),
    "global_profiler.save_path": ("trainer.profile.output_dir", ""),
}

# verl section -> Tandem section, most specific first
VERL_SECTIONS: list[tuple[str, str]] = [
    ("actor_rollout_ref.ref.", "reference."),
    ("actor_rollout_ref.rollout.val_kwargs.", "rollout.val."),
    ("actor_rollout_ref.actor.fsdp_config.", "actor.fsdp."),
    ("actor_rollout_ref.", ""),
    ("reward_model.overlong_buffer.", "reward.overlong."),
    ("reward_model.", "reward.reward_model."),
    ("algorithm.filter_groups.", "algorithm.dynamic_sampling."),
]

# TRL argument -> (Tandem key, note)
TRL: dict[str, tuple[str, str]] = {
    "model_name_or_path": ("actor.model_path", ""),
    "learning_rate": ("actor.optim.lr", ""),
    "weight_decay": ("actor.optim.weight_decay", ""),
    "lr_scheduler_type": ("actor.optim.lr_scheduler", ""),
    "warmup_steps": ("actor.optim.warmup_steps", ""),
    "warmup_ratio": ("actor.optim.warmup_ratio", ""),
    "max_grad_norm": ("actor.grad_clip", ""),
    "gradient_checkpointing": ("actor.activation_checkpointing", ""),
    "per_device_train_batch_size": ("actor.micro_batch_size_per_rank", "samples per forward on one rank"),
    "gradient_accumulation_steps": (
        "actor.ppo_mini_batch_size",
        "accumulation steps are derived from it and actor.micro_batch_size_per_rank",
    ),
    "num_generations": ("rollout.n", ""),
    "max_prompt_length": ("data.max_prompt_length", ""),
    "max_completion_length": ("data.max_response_length", ""),
    "temperature": ("rollout.temperature", ""),
    "top_p": ("rollout.top_p", ""),
    "top_k": ("rollout.top_k", ""),
    "use_vllm": ("rollout.engine", "set rollout.engine=vllm"),
    "beta": ("actor.kl_loss_coef", "with actor.use_kl_loss=true"),
    "epsilon": ("actor.clip_ratio_low", ""),
    "epsilon_high": ("actor.clip_ratio_high", ""),
    "num_iterations": ("actor.ppo_epochs", ""),
    "loss_type": ("actor.loss_agg_mode", ""),
    "scale_rewards": ("algorithm.norm_adv_by_std", ""),
    "num_train_epochs": ("trainer.total_epochs", ""),
    "max_steps": ("trainer.total_training_steps", ""),
    "save_steps": ("trainer.save_freq", ""),
    "eval_steps": ("trainer.test_freq", ""),
    "save_total_limit": ("trainer.max_checkpoints_to_keep", ""),
    "report_to": ("trainer.loggers", ""),
    "output_dir": ("trainer.output_dir", ""),
    "run_name": ("trainer.experiment_name", ""),
    "seed": ("trainer.seed", ""),
    "bf16": ("actor.fsdp.param_dtype", "set actor.fsdp.param_dtype=bfloat16"),
}


def foreign_key_hint(key: str, valid: tuple[str, ...]) -> str | None:
    """`unknown key ...: that is verl's name; in Tandem use ...`, or None for a key of no other framework."""
    if key in VERL:
        return _hint(key, "verl", *VERL[key])
    if key in TRL:
        return _hint(key, "TRL", *TRL[key])
    for verl_prefix, prefix in VERL_SECTIONS:  # most verl keys keep their name inside a renamed section
        if key.startswith(verl_prefix):
            renamed = prefix + key.removeprefix(verl_prefix).replace("_per_gpu", "_per_rank")
            if renamed in valid:
                return _hint(key, "verl", renamed, "")
            break
    return None


def _hint(key: str, source: str, target: str, note: str) -> str:
    where = f"'{target}'" if " " not in target else target
    return f"unknown key '{key}': that is {source}'s name; in Tandem use {where}" + (
        f" ({note})" if note else ""
    )
