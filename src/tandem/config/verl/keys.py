"""verl's configuration keys and what each means in Tandem: the table `config/verl/translate.py` reads.

A verl key either *maps* (it is read as a Tandem key, its value converted where the two differ), has
*no effect* (Tandem accepts it and says why nothing needs it: a GPU-memory knob of a library Tandem
does not use, or something Tandem always does), or is *unsupported* (it asks for something Tandem
does not have: an error that says so). A key found in none of these tables but under a verl-only
section (`actor_rollout_ref.`, `critic.model.`, `reward_model.`, ...) is unknown to Tandem too: an
error, never a guess at a Tandem key. Keys verl and Tandem share (`data.train_batch_size`,
`algorithm.gamma`, `trainer.total_epochs`, ...) need no entry.

Every key of verl's own configs with a rule of its own is written out here, in the megatron and extra tables
merged below, or in sft_keys.py / generation_keys.py; a key a rule for many keys covers (a glob of
VERL_PATTERNS, a subtree, a renamed section) is listed with the rule it resolves to in the generated
tests/verl/keys_index.py (scripts/gen_verl_keys.py). So grepping an exact key of verl's configs finds its line.

The names and defaults follow verl's `ppo_trainer.yaml` (verl 0.7, read in 2026-11).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable

from tandem.config.verl.extra_keys import EXTRA_KEYS, EXTRA_PATTERNS, EXTRA_PREFIXES, REWARD_KWARGS
from tandem.config.verl.megatron_keys import MEGATRON_KEYS, MEGATRON_PATTERNS, MEGATRON_SUBTREES
from tandem.config.verl.model_overrides import ACTOR_MODEL, CRITIC_MODEL, model_override_rule
from tandem.config.verl.rules import Rule, maps, no_effect, unsupported
from tandem.config.verl.values import (
    as_list,
    compile_where_it_pays,
    device,
    float32_master,
    float32_only,
    fsdp_mixed_precision,
    hybrid_engine,
    lr_decay_style,
    lr_warmup_steps,
    master_dtype,
    optimizer,
    precision,
    profiler_tool,
    resume_mode,
    rollout_engine,
    strategy,
    verl_loggers,
)

# --- the table ---------------------------------------------------------------------------------------

SGLANG_NOTE = (
    "Tandem has no SGLang engine yet: rollout.engine=auto runs vLLM (Hugging Face generate where vLLM "
    "is not installed), with the same sampling settings"
)
_FP32_MASTER = "fp32: Tandem keeps float32 master weights (its compute dtype is actor.fsdp.param_dtype)"
_ACTOR_DTYPES = (
    "Tandem runs the reference and the critic at the actor's dtypes: set the actor's "
    "(actor_rollout_ref.actor.fsdp_config.mixed_precision, or actor.fsdp.param_dtype)"
)
_SAME_ACTOR_ENGINE = "the reference model is built like the actor (actor.fsdp / actor.megatron)"
_NO_SHUFFLE = (
    "Tandem keeps the rollout's order inside a step; shuffling the rows between mini-batches (verl's megatron "
    "and engine workers, seeded by data_loader_seed) is not built"
)
_PACKING = "Tandem packs sequences without padding for every role (actor.sequence_packing, on by default)"
_AS_PER_GPU = (
    "verl's size over all GPUs, divided by the data-parallel GPUs (nnodes x n_gpus_per_node / the Ulysses "
    "size) as verl divides it"
)
_ADAMW = "Tandem's optimizer is AdamW"
_TORCH_ADAMW = (
    "Tandem uses torch.optim's AdamW, fused where it runs (actor.optim.implementation); another module's "
    "optimizer class is not built"
)
_HALF_CYCLE = "Tandem's cosine schedule makes one half cycle (verl's 0.5); another count is not built"
_OWN_OPTIMIZER = "set actor.optim.* / critic.optim.*"
_FROM_DISK = "Tandem reads the model folder from disk"
_OWN_CLASSES = "Tandem builds models with transformers' own classes"
_TRANSFORMERS_ONLY = "Tandem loads models with transformers only"
_EDIT_CONFIG_JSON = "edit the model folder's config.json instead"
# verl's megatron scripts raise the context length of a model config this way
_ROPE_LENGTH = (
    "Tandem's engines and vLLM compute rotary positions for any length and check no length against "
    "it; only a RoPE scaling type that reads it (dynamic NTK) would change: edit config.json for that"
)
_NO_ACTIVATION_OFFLOAD = "Tandem has no activation offload"

VERL_KEYS: dict[str, Rule] = {
    **MEGATRON_KEYS,  # config/verl/megatron_keys.py (no key is in two tables: tests/verl/test_verl_keys_index.py)
    **EXTRA_KEYS,  # config/verl/extra_keys.py: the data, reward-model, model and megatron details
    # model
    "actor_rollout_ref.model.path": maps("actor.model_path"),
    "actor_rollout_ref.model.tokenizer_path": maps("actor.tokenizer_path"),
    "actor_rollout_ref.model.lora_rank": maps("actor.lora.rank"),
    "actor_rollout_ref.model.lora_alpha": maps("actor.lora.alpha"),
    "actor_rollout_ref.model.target_modules": maps("actor.lora.target_modules", convert=as_list),
    "actor_rollout_ref.model.enable_gradient_checkpointing": maps("actor.activation_checkpointing"),
    "actor_rollout_ref.model.use_remove_padding": maps("actor.sequence_packing"),
    "actor_rollout_ref.model.use_fused_kernels": no_effect(
        "Tandem always computes log-probs and entropy from the hidden states in chunks "
        "(actor.fsdp.lm_head_chunk_tokens), without a [tokens, vocab] logits tensor"
    ),
    "actor_rollout_ref.model.fused_kernel_options.impl_backend": no_effect(
        "see actor_rollout_ref.model.use_fused_kernels: Tandem's chunked LM head is plain torch"
    ),
    "actor_rollout_ref.model.use_liger": maps("actor.fsdp.liger"),
    "actor_rollout_ref.actor.fsdp_config.reshard_after_forward": no_effect(
        "Tandem's FSDP2 reshards each layer after its forward, as verl's default true does"
    ),
    "actor_rollout_ref.model.use_shm": no_effect("Tandem reads the model folder from disk"),
    "actor_rollout_ref.model.trust_remote_code": no_effect(
        "Tandem builds models with transformers' own classes; no remote code runs"
    ),
    "actor_rollout_ref.model.enable_activation_offload": no_effect(
        "Tandem has no activation offload; activation checkpointing is actor.activation_checkpointing"
    ),
    "actor_rollout_ref.model.external_lib": unsupported(_TRANSFORMERS_ONLY),
    "actor_rollout_ref.model.override_config": ACTOR_MODEL.rule(ACTOR_MODEL.verl_key),
    "actor_rollout_ref.model.override_config.model_config.max_position_embeddings": no_effect(_ROPE_LENGTH),
    # actor
    "actor_rollout_ref.actor.strategy": maps("actor.strategy", convert=strategy),
    "actor_rollout_ref.actor.ppo_micro_batch_size": maps(
        "(actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu)", _AS_PER_GPU
    ),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": maps("actor.micro_batch_size_per_rank"),
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": maps(
        "actor.max_tokens_per_micro_batch",
        "times the Ulysses size, as verl multiplies it (tokens of whole rows)",
    ),
    "actor_rollout_ref.actor.clip_ratio": maps("actor.clip_ratio_low,actor.clip_ratio_high"),
    "actor_rollout_ref.actor.policy_loss.loss_mode": maps("actor.policy_loss"),
    "actor_rollout_ref.actor.policy_loss.clip_cov_ratio": maps("actor.clip_cov_ratio"),
    "actor_rollout_ref.actor.policy_loss.clip_cov_lb": maps("actor.clip_cov_lb"),
    "actor_rollout_ref.actor.policy_loss.clip_cov_ub": maps("actor.clip_cov_ub"),
    "actor_rollout_ref.actor.policy_loss.kl_cov_ratio": maps("actor.kl_cov_ratio"),
    "actor_rollout_ref.actor.policy_loss.ppo_kl_coef": maps("actor.ppo_kl_coef"),
    "actor_rollout_ref.actor.policy_loss.dro_beta": maps("actor.dro_beta"),
    # the same name in Tandem's actor section
    "actor_rollout_ref.actor.calculate_sum_pi_squared": maps("actor.calculate_sum_pi_squared"),
    "actor_rollout_ref.actor.clip_ratio_c": maps("actor.clip_ratio_c"),
    "actor_rollout_ref.actor.clip_ratio_high": maps("actor.clip_ratio_high"),
    "actor_rollout_ref.actor.clip_ratio_low": maps("actor.clip_ratio_low"),
    "actor_rollout_ref.actor.entropy_coeff": maps("actor.entropy_coeff"),
    "actor_rollout_ref.actor.grad_clip": maps("actor.grad_clip"),
    "actor_rollout_ref.actor.kl_loss_coef": maps("actor.kl_loss_coef"),
    "actor_rollout_ref.actor.kl_loss_type": maps("actor.kl_loss_type"),
    "actor_rollout_ref.actor.loss_agg_mode": maps("actor.loss_agg_mode"),
    "actor_rollout_ref.actor.optim.betas": maps("actor.optim.betas"),
    "actor_rollout_ref.actor.optim.lr": maps("actor.optim.lr"),
    "actor_rollout_ref.actor.optim.min_lr_ratio": maps("actor.optim.min_lr_ratio"),
    "actor_rollout_ref.actor.optim.weight_decay": maps("actor.optim.weight_decay"),
    "actor_rollout_ref.actor.ppo_epochs": maps("actor.ppo_epochs"),
    "actor_rollout_ref.actor.ppo_mini_batch_size": maps("actor.ppo_mini_batch_size"),
    "actor_rollout_ref.actor.tau_neg": maps("actor.tau_neg"),
    "actor_rollout_ref.actor.tau_pos": maps("actor.tau_pos"),
    "actor_rollout_ref.actor.use_dynamic_bsz": maps("actor.use_dynamic_bsz"),
    "actor_rollout_ref.actor.use_kl_loss": maps("actor.use_kl_loss"),
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": maps("actor.fsdp.sequence_parallel"),
    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": maps(
        "actor.fsdp.sequence_parallel"
    ),
    # verl's FSDP compute / reduce dtypes (bf16 / fp32 where not given) and the master weights' (fp32)
    "actor_rollout_ref.actor.fsdp_config.mixed_precision": maps(
        "actor.fsdp",
        "verl's FSDP compute and reduce dtypes (bf16 and fp32 where left out)",
        fsdp_mixed_precision,
    ),
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype": maps(
        "actor.fsdp.param_dtype", convert=precision
    ),
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype": maps(
        "actor.fsdp.reduce_dtype", convert=precision
    ),
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype": maps(
        "", "fp32: Tandem keeps buffers in float32", convert=float32_only
    ),
    "actor_rollout_ref.actor.fsdp_config.model_dtype": maps("actor.fsdp.model_dtype", convert=master_dtype),
    "actor_rollout_ref.ref.fsdp_config.model_dtype": maps("", _FP32_MASTER, convert=float32_master),
    "critic.model.fsdp_config.model_dtype": maps("", _FP32_MASTER, convert=float32_master),
    "actor_rollout_ref.ref.fsdp_config.mixed_precision": unsupported(_ACTOR_DTYPES),
    "critic.model.fsdp_config.mixed_precision": unsupported(_ACTOR_DTYPES),
    "actor_rollout_ref.actor.fsdp_config.param_offload": maps(
        "actor.fsdp.cpu_offload", "one switch: parameters, gradients and optimizer state move together"
    ),
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": maps(
        "actor.fsdp.cpu_offload", "one switch: parameters, gradients and optimizer state move together"
    ),
    "actor_rollout_ref.actor.optim.lr_warmup_steps": maps(
        "actor.optim.warmup_steps", convert=lr_warmup_steps
    ),
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": maps("actor.optim.warmup_ratio"),
    "actor_rollout_ref.actor.optim.warmup_style": maps("actor.optim.lr_scheduler"),
    "actor_rollout_ref.actor.optim.lr_scheduler_type": maps("actor.optim.lr_scheduler"),
    "actor_rollout_ref.actor.optim.clip_grad": maps("actor.grad_clip"),
    "actor_rollout_ref.actor.optim.total_training_steps": no_effect(
        "Tandem's schedule spans the run's steps (trainer.total_training_steps or the epochs)"
    ),
    "actor_rollout_ref.actor.optim.optimizer": maps("", _ADAMW, convert=optimizer),
    "actor_rollout_ref.actor.optim.optimizer_impl": unsupported(_TORCH_ADAMW),
    "actor_rollout_ref.actor.optim.num_cycles": unsupported(_HALF_CYCLE),
    "actor_rollout_ref.actor.optim.lr_decay_style": maps("actor.optim.lr_scheduler", convert=lr_decay_style),
    "actor_rollout_ref.actor.optim.override_optimizer_config": unsupported(_OWN_OPTIMIZER),
    "actor_rollout_ref.actor.use_torch_compile": maps(
        "actor.fsdp.lm_head_compile",
        "verl compiles its entropy function; Tandem compiles its LM head's chunk arithmetic, where "
        "it pays: true is auto, false is false. actor.fsdp.torch_compile (auto: on CUDA) compiles every "
        "decoder layer",
        convert=compile_where_it_pays,
    ),
    "actor_rollout_ref.actor.calculate_entropy": no_effect("Tandem logs the entropy of every update"),
    "actor_rollout_ref.actor.sum_pi_squared_checkpointing": no_effect(
        "Tandem computes sum pi^2 in the old-log-prob pass, without gradients"
    ),
    "actor_rollout_ref.actor.entropy_from_logits_with_chunking": no_effect(
        "Tandem's entropy is always computed in chunks"
    ),
    "actor_rollout_ref.actor.entropy_checkpointing": no_effect(
        "Tandem's entropy is always computed in chunks"
    ),
    "actor_rollout_ref.actor.shuffle": unsupported(_NO_SHUFFLE),
    "actor_rollout_ref.actor.data_loader_seed": no_effect("Tandem seeds everything from trainer.seed"),
    "actor_rollout_ref.actor.use_remove_padding": maps("actor.sequence_packing"),
    "actor_rollout_ref.actor.checkpoint.async_save": no_effect("Tandem saves synchronously"),
    "actor_rollout_ref.actor.checkpoint.save_contents": maps(
        "trainer.save_hf_model",
        "Tandem's checkpoints always hold model, optimizer and run state; 'hf_model' also writes the weights "
        "into global_step_N/actor/huggingface",
        convert=lambda v: "hf_model" in as_list(v),
    ),
    "actor_rollout_ref.actor.checkpoint.load_contents": unsupported(
        "Tandem loads the whole checkpoint (model, optimizer, run state); loading a part of it is not built"
    ),
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size": maps("actor.megatron.tensor_parallel"),
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size": maps("actor.megatron.pipeline_parallel"),
    "actor_rollout_ref.actor.megatron.context_parallel_size": maps("actor.megatron.context_parallel"),
    "actor_rollout_ref.actor.megatron.sequence_parallel": maps("actor.megatron.sequence_parallel"),
    "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size": maps(
        "actor.megatron.virtual_pipeline", convert=lambda v: 1 if v is None else v
    ),
    "actor_rollout_ref.actor.megatron.expert_model_parallel_size": maps("actor.megatron.expert_parallel"),
    "actor_rollout_ref.actor.megatron.use_distributed_optimizer": maps(
        "actor.megatron.distributed_optimizer"
    ),
    # reference
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": maps(
        "reference.log_prob_micro_batch_size_per_rank"
    ),
    "actor_rollout_ref.ref.fsdp_config.param_offload": no_effect(_SAME_ACTOR_ENGINE),
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": no_effect(
        "the reference uses the actor's token budget"
    ),
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": no_effect(
        "the reference uses the actor's token budget"
    ),
    "actor_rollout_ref.ref.log_prob_micro_batch_size": maps(
        "(actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu)", _AS_PER_GPU
    ),
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": no_effect(_SAME_ACTOR_ENGINE),
    "actor_rollout_ref.ref.strategy": no_effect(_SAME_ACTOR_ENGINE),
    "actor_rollout_ref.ref.use_torch_compile": no_effect(_SAME_ACTOR_ENGINE),
    # rollout
    # the same name in Tandem's rollout section
    "actor_rollout_ref.rollout.gpu_memory_utilization": maps("rollout.gpu_memory_utilization"),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": maps(
        "rollout.log_prob_micro_batch_size_per_rank"
    ),
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": maps(
        "rollout.multi_turn.max_assistant_turns"
    ),
    "actor_rollout_ref.rollout.multi_turn.max_parallel_calls": maps("rollout.multi_turn.max_parallel_calls"),
    "actor_rollout_ref.rollout.multi_turn.max_tool_response_length": maps(
        "rollout.multi_turn.max_tool_response_length"
    ),
    "actor_rollout_ref.rollout.multi_turn.max_user_turns": maps("rollout.multi_turn.max_user_turns"),
    "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side": maps(
        "rollout.multi_turn.tool_response_truncate_side"
    ),
    "actor_rollout_ref.rollout.n": maps("rollout.n"),
    "actor_rollout_ref.rollout.temperature": maps("rollout.temperature"),
    "actor_rollout_ref.rollout.top_k": maps("rollout.top_k"),
    "actor_rollout_ref.rollout.top_p": maps("rollout.top_p"),
    "actor_rollout_ref.rollout.val_kwargs.n": maps("rollout.val.n"),
    "actor_rollout_ref.rollout.val_kwargs.temperature": maps("rollout.val.temperature"),
    "actor_rollout_ref.rollout.val_kwargs.top_p": maps("rollout.val.top_p"),
    "actor_rollout_ref.rollout.name": maps("rollout.engine", convert=rollout_engine),
    "actor_rollout_ref.rollout.mode": no_effect(
        "verl's async mode serves single-turn sampling too; Tandem's rollout.mode=async is the multi-turn "
        "agent loop, turned on by rollout.multi_turn.enable=true or a tool config"
    ),
    "actor_rollout_ref.rollout.multi_turn.enable": maps(
        "rollout.mode", convert=lambda v: "async" if v in (True, "true", "True") else "sync"
    ),
    "actor_rollout_ref.rollout.multi_turn.tool_config_path": maps("rollout.multi_turn.tool_file"),
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path": maps(
        "rollout.multi_turn.interaction_file"
    ),
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template": no_effect(
        "Tandem renders every turn with the model's chat template once (data.chat_template)"
    ),
    "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode": no_effect(
        "Tandem builds the token ids turn by turn and never re-tokenizes the whole conversation"
    ),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": maps("rollout.tensor_parallel"),
    "actor_rollout_ref.rollout.response_length": maps("data.max_response_length"),
    "actor_rollout_ref.rollout.prompt_length": maps("data.max_prompt_length"),
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": no_effect(
        "log-prob passes use the actor's token budget"
    ),
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": no_effect(
        "log-prob passes use the actor's token budget"
    ),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": maps(
        "(actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu)", _AS_PER_GPU
    ),
    "actor_rollout_ref.rollout.calculate_log_probs": no_effect(
        "Tandem's rollout engines always return the rollout log-probs"
    ),
    "actor_rollout_ref.rollout.do_sample": unsupported(
        "sampling follows rollout.temperature: greedy decoding is actor_rollout_ref.rollout.temperature=0"
    ),
    "actor_rollout_ref.rollout.val_kwargs.do_sample": no_effect(
        "validation follows rollout.val.temperature (0 = greedy)"
    ),
    "actor_rollout_ref.rollout.val_kwargs.top_k": unsupported(
        "validation samples with rollout.val.* and top_k=-1 (all tokens); another top_k is not built"
    ),
    "actor_rollout_ref.rollout.load_format": no_effect(
        "the trainer sends its weights to the rollout engine before every step, whatever the start format"
    ),
    "actor_rollout_ref.rollout.layered_summon": no_effect(
        "Tandem's weight sync hands the actor's tensors to vLLM one at a time already"
    ),
    "actor_rollout_ref.rollout.multi_stage_wake_up": no_effect(
        "Tandem's hybrid engine wakes vLLM's weights before its KV cache already"
    ),
    "actor_rollout_ref.rollout.free_cache_engine": no_effect(
        "the hybrid engine always frees vLLM's KV cache while the trainer works"
    ),
    "actor_rollout_ref.rollout.over_sample_rate": no_effect(
        "verl's rollout config holds it, but no code of verl's reads it (it would abort a step's slowest "
        "requests); Tandem finishes every request, as verl does"
    ),
    "actor_rollout_ref.rollout.update_weights_bucket_megabytes": maps("rollout.weight_bucket_mb"),
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": maps(
        "rollout.weight_bucket_mb"
    ),
    "actor_rollout_ref.rollout.agent.num_workers": no_effect(
        "the agent loop runs inside each rollout worker, one coroutine per sample"
    ),
    "actor_rollout_ref.rollout.agent.default_agent_loop": no_effect(
        "Tandem picks the agent loop from rollout.mode and each row's agent_name"
    ),
    "actor_rollout_ref.hybrid_engine": maps("rollout.layout", convert=hybrid_engine),
    "actor_rollout_ref.nccl_timeout": no_effect("every worker call is bounded by trainer.worker_timeout_s"),
    # critic
    "critic.model.path": maps("critic.model_path"),
    "critic.model.tokenizer_path": maps("critic.tokenizer_path"),
    "critic.model.lora_rank": maps("critic.lora.rank"),
    "critic.model.lora_alpha": maps("critic.lora.alpha"),
    "critic.model.target_modules": maps("critic.lora.target_modules", convert=as_list),
    "critic.ppo_micro_batch_size": maps("(critic.ppo_micro_batch_size_per_gpu)", _AS_PER_GPU),
    "critic.ppo_micro_batch_size_per_gpu": maps("critic.micro_batch_size_per_rank"),
    "critic.forward_micro_batch_size": maps("(critic.forward_micro_batch_size_per_gpu)", _AS_PER_GPU),
    "critic.forward_micro_batch_size_per_gpu": no_effect("the critic's forward uses its micro-batch size"),
    "critic.model.use_remove_padding": no_effect(_PACKING),
    "critic.model.enable_gradient_checkpointing": no_effect(
        "the critic follows actor.activation_checkpointing"
    ),
    "critic.model.fsdp_config.param_offload": no_effect("the critic follows actor.fsdp.cpu_offload"),
    "critic.model.fsdp_config.optimizer_offload": no_effect("the critic follows actor.fsdp.cpu_offload"),
    "critic.model.use_shm": no_effect(_FROM_DISK),
    "critic.model.trust_remote_code": no_effect(_OWN_CLASSES),
    "critic.model.external_lib": unsupported(_TRANSFORMERS_ONLY),
    "critic.model.override_config": CRITIC_MODEL.rule(CRITIC_MODEL.verl_key),
    "critic.model.override_config.model_config.max_position_embeddings": no_effect(_ROPE_LENGTH),
    "critic.model.enable_activation_offload": no_effect(_NO_ACTIVATION_OFFLOAD),
    "critic.optim.clip_grad": maps("critic.grad_clip"),
    "critic.optim.lr_warmup_steps": maps("critic.optim.warmup_steps", convert=lr_warmup_steps),
    "critic.optim.lr_warmup_steps_ratio": maps("critic.optim.warmup_ratio"),
    "critic.optim.warmup_style": maps("critic.optim.lr_scheduler"),
    "critic.optim.lr_scheduler_type": maps("critic.optim.lr_scheduler"),
    "critic.optim.optimizer": maps("", _ADAMW, convert=optimizer),
    "critic.optim.optimizer_impl": unsupported(_TORCH_ADAMW),
    "critic.optim.num_cycles": unsupported(_HALF_CYCLE),
    "critic.optim.lr_decay_style": maps("critic.optim.lr_scheduler", convert=lr_decay_style),
    "critic.optim.override_optimizer_config": unsupported(_OWN_OPTIMIZER),
    "critic.ppo_max_token_len_per_gpu": no_effect("the critic uses the actor's token budget"),
    "critic.forward_max_token_len_per_gpu": no_effect("the critic uses the actor's token budget"),
    "critic.use_dynamic_bsz": no_effect("the critic follows actor.use_dynamic_bsz"),
    "critic.ulysses_sequence_parallel_size": no_effect("the critic follows actor.fsdp.sequence_parallel"),
    "critic.strategy": no_effect("the critic follows actor.strategy"),
    "critic.shuffle": unsupported(_NO_SHUFFLE),
    # reward
    "reward_model.enable": maps("reward.reward_model.enable"),
    "reward_model.model.path": maps("reward.reward_model.model_path"),
    "reward_model.micro_batch_size": maps("(reward_model.micro_batch_size_per_gpu)", _AS_PER_GPU),
    "reward_model.micro_batch_size_per_gpu": maps("reward.reward_model.micro_batch_size_per_rank"),
    "reward_model.model.use_shm": no_effect(_FROM_DISK),
    "reward_model.model.trust_remote_code": no_effect(_OWN_CLASSES),
    "reward_model.model.external_lib": unsupported(_TRANSFORMERS_ONLY),
    "reward_model.model.override_config": unsupported(_EDIT_CONFIG_JSON),
    "reward_model.model.override_config.model_config.max_position_embeddings": no_effect(_ROPE_LENGTH),
    "reward_model.model.use_remove_padding": no_effect(_PACKING),
    "reward_model.model.enable_activation_offload": no_effect(_NO_ACTIVATION_OFFLOAD),
    # algorithm
    "algorithm.norm_adv_by_std_in_grpo": maps("algorithm.norm_adv_by_std"),
    "algorithm.filter_groups.enable": maps("algorithm.dynamic_sampling.enable"),
    "algorithm.filter_groups.metric": maps("algorithm.dynamic_sampling.metric"),
    "algorithm.filter_groups.max_num_gen_batches": maps("algorithm.dynamic_sampling.max_num_gen_batches"),
    "algorithm.rollout_correction.rollout_token_veto_threshold": unsupported(
        "verl 0.7's per-token veto is gone in newer verl; algorithm.rollout_correction.rollout_rs=seq_max_k2 "
        "or seq_max_k3 rejects a sequence for its worst token"
    ),
    "algorithm.rollout_correction.rollout_rs_threshold_lower": unsupported(
        "write the k1 bounds in algorithm.rollout_correction.rollout_rs_threshold as lower_upper, e.g. 0.5_2.0"
    ),
    "algorithm.rollout_correction.use_policy_gradient": unsupported(
        "verl's later name is algorithm.rollout_correction.loss_type=reinforce with bypass_mode=true"
    ),
    # data
    "data.gen_batch_size": maps("algorithm.dynamic_sampling.gen_batch_size"),
    "data.return_raw_chat": no_effect(
        "Tandem keeps each row's chat messages and applies the chat template itself"
    ),
    "data.return_raw_input_ids": no_effect("Tandem keeps each row's chat messages and tokenizes them itself"),
    "data.return_full_prompt": no_effect("Tandem keeps each row's chat messages"),
    "data.filter_overlong_prompts": maps(
        "data.truncation",
        "verl drops them before its data.truncation applies; Tandem's filter drops them and warns, naming rows",
        convert=lambda v: "filter" if v in (True, "true", "True") else None,
    ),
    "data.filter_overlong_prompts_workers": no_effect("see data.filter_overlong_prompts"),
    "data.dataloader_num_workers": no_effect("Tandem reads the parquet files once, in the controller"),
    "data.trust_remote_code": no_effect(
        "Tandem loads tokenizers and processors with transformers' own classes; transformers refuses a "
        "folder that needs its own code when it is loaded"
    ),
    "data.use_shm": no_effect("Tandem reads the data from disk"),
    "data.reward_fn_key": unsupported(
        "Tandem picks the scorer by each row's data_source (verl's default reward_fn_key); another column is not read"
    ),
    "data.return_multi_modal_inputs": no_effect("Tandem builds the image inputs of a row itself"),
    "data.validation_shuffle": no_effect("Tandem validates on the whole validation set in file order"),
    "data.tool_config_path": no_effect("Tandem reads the tool config from rollout.multi_turn.tool_file"),
    # trainer
    "trainer.n_gpus_per_node": maps("trainer.workers_per_node"),
    "trainer.logger": maps(
        "trainer.loggers",
        "verl's file logger is Tandem's jsonl: a JSON line of metrics per step in <run folder>/metrics.jsonl",
        convert=verl_loggers,
    ),
    "trainer.default_local_dir": maps(
        "trainer.run_dir",
        "Tandem's run folder: checkpoints/global_step_N sit in its checkpoints/ folder beside the metrics",
    ),
    "trainer.resume_mode": maps("trainer.resume", convert=resume_mode),
    "trainer.resume_from_path": maps(
        "trainer.resume", "only with trainer.resume_mode=resume_path, as in verl"
    ),
    "trainer.max_actor_ckpt_to_keep": maps("trainer.max_checkpoints_to_keep"),
    "trainer.max_critic_ckpt_to_keep": no_effect(
        "the critic's checkpoint is kept and deleted with the actor's (trainer.max_checkpoints_to_keep)"
    ),
    "trainer.device": maps("trainer.device", convert=device),
    "trainer.profile_steps": maps("trainer.profile.steps", convert=as_list),
    # true: each mini-batch's rows split over the ranks by tokens; verl's true also moves rows between
    # mini-batches, Tandem's keeps every mini-batch's rows (the same whenever a step is one mini-batch)
    "trainer.balance_batch": maps("trainer.balance_batch"),
    "trainer.use_legacy_worker_impl": no_effect("Tandem has one worker implementation"),
    "trainer.ray_wait_register_center_timeout": no_effect(
        "Tandem's workers start within trainer.worker_timeout_s"
    ),
    "trainer.val_only": maps("trainer.val_only"),
    "trainer.default_hdfs_dir": unsupported("Tandem saves checkpoints to a local folder only"),
    "trainer.del_local_ckpt_after_load": unsupported("Tandem never deletes a checkpoint it loaded"),
    "trainer.esi_redundant_time": no_effect(
        "a checkpoint-before-preemption setting of one cloud; Tandem has none"
    ),
    # profiler
    "global_profiler.tool": maps("trainer.profile.tool,trainer.profile.memory", convert=profiler_tool),
    "global_profiler.steps": maps("trainer.profile.steps", convert=as_list),
    "global_profiler.save_path": maps("trainer.profile.output_dir"),
    "global_profiler.profile_continuous_steps": no_effect("Tandem profiles each listed step on its own"),
}

# verl-only sections: a key under one of them that is in no table is an error, never a guess
VERL_ONLY_PREFIXES = (
    "actor_rollout_ref.",
    "critic.model.",
    "reward_model.",
    "custom_reward_function.",
    "global_profiler.",
    "ray_kwargs.",
    "transfer_queue.",
    "reward_manager.",
    "critic.megatron.",
    "critic.profiler.",
    "critic.optim.override_optimizer_config.",
    *EXTRA_PREFIXES,
)

# verl section -> Tandem section: a verl key not in VERL_KEYS maps to the Tandem key of the same name in
# the renamed section, when Tandem has that key (`_per_gpu` becomes `_per_rank`). Most specific first. The keys
# of verl's configs it covers are written in VERL_KEYS; it reads the verl names of Tandem's other keys.
VERL_SECTIONS: list[tuple[str, str]] = [
    ("actor_rollout_ref.ref.", "reference."),
    ("actor_rollout_ref.rollout.val_kwargs.", "rollout.val."),
    ("actor_rollout_ref.actor.fsdp_config.", "actor.fsdp."),
    ("actor_rollout_ref.", ""),
    ("reward_model.overlong_buffer.", "reward.overlong."),
    ("reward_model.", "reward.reward_model."),
    ("algorithm.filter_groups.", "algorithm.dynamic_sampling."),
]

_NSYS_WORKER = "an option of `nsys profile` for each worker (trainer.profile.tool=nsys)"

# whole verl subtrees with no effect in Tandem (glob patterns, first match wins)
ENGINE_KWARGS = "actor_rollout_ref.rollout.engine_kwargs"
# whole subtrees, key by key: verl prefix -> Tandem prefix (the rest of the key is the library's field name)
VERL_SUBTREES: list[tuple[str, str, str]] = [
    (ENGINE_KWARGS + ".vllm.", "rollout.engine_kwargs.", "an argument of vLLM's engine"),
    ("reward_model.reward_kwargs.", "reward.manager_kwargs.", REWARD_KWARGS),
    ("data.apply_chat_template_kwargs.", "data.chat_template_kwargs.", "a variable of the chat template"),
    (
        "global_profiler.global_tool_config.nsys.worker_nsight_options.",
        "trainer.profile.nsight_options.",
        _NSYS_WORKER,
    ),
]

VERL_PATTERNS: list[tuple[str, Rule]] = [
    *EXTRA_PATTERNS,
    *MEGATRON_PATTERNS,
    ("*.profiler.*", no_effect("verl's per-role profiler; Tandem's profiler is trainer.profile.*")),
    ("*.fsdp_config.*", no_effect("Tandem's FSDP2 settings are actor.fsdp.*; it shards every decoder layer")),
    ("*.checkpoint.*", no_effect("Tandem saves model, optimizer and run state in every checkpoint")),
    (
        "*.router_replay.*",
        no_effect("record_file / replay_file: verl reads neither; the routing travels with the step's batch"),
    ),
    ("*.tiled_mlp.*", no_effect("Tandem has no tiled MLP")),
    ("*.mtp.*", no_effect("Tandem has no multi-token prediction")),
    ("actor_rollout_ref.model.mtp", no_effect("Tandem has no multi-token prediction")),
    ("actor_rollout_ref.rollout.mtp", no_effect("Tandem has no multi-token prediction")),
    (
        "actor_rollout_ref.rollout.trace.*",
        no_effect("Tandem writes rollouts to the run folder, no tracing backend"),
    ),
    (
        "actor_rollout_ref.rollout.prometheus.*",
        no_effect("Tandem logs rollout metrics with the step's metrics"),
    ),
    (
        "actor_rollout_ref.rollout.agent.*",
        unsupported(
            "Tandem's agent loop is set by rollout.mode and rollout.multi_turn; a user's agent loop config or "
            "rollout server class is not loaded"
        ),
    ),
    (
        "actor_rollout_ref.rollout.checkpoint_engine.*",
        no_effect("weights reach vLLM by Tandem's weight sync"),
    ),
    ("reward_model.rollout.*", no_effect("Tandem's reward model is a scoring model, not a generative judge")),
    ("ray_kwargs.*", no_effect("Tandem starts Ray itself; trainer.ray_address joins a running cluster")),
    ("transfer_queue.*", no_effect("Tandem moves batches through Ray's object store")),
]


def verl_rule(key: str, is_tandem_key: Callable[[str], bool]) -> Rule | None:
    """The rule for verl key `key`, or None when it is not a verl-only key (a key Tandem shares, or a
    key of neither). `is_tandem_key` tells whether a dotted key exists in Tandem's schema."""
    if key in VERL_KEYS:
        return VERL_KEYS[key]
    if (override := model_override_rule(key)) is not None:  # an attribute under a model's override_config
        return override
    for verl_prefix, prefix, note in (*MEGATRON_SUBTREES, *VERL_SUBTREES):
        if key.startswith(verl_prefix):
            return maps(prefix + key.removeprefix(verl_prefix), note)
    # the whole, or another engine's (sglang, trtllm): not rollout.engine_kwargs
    if key.startswith(ENGINE_KWARGS):
        return no_effect("no vLLM engine arguments in it (those are engine_kwargs.vllm.NAME)")
    for verl_prefix, prefix in VERL_SECTIONS:
        if key.startswith(verl_prefix):
            renamed = prefix + key.removeprefix(verl_prefix).replace("_per_gpu", "_per_rank")
            if renamed != key and is_tandem_key(renamed):
                return maps(renamed)
            break
    for pattern, rule in VERL_PATTERNS:
        if fnmatch.fnmatchcase(key, pattern):
            return rule
    return None


def is_verl_key(key: str) -> bool:
    """A key verl has and Tandem reads differently or not at all: in the table, or under a verl-only section."""
    return key.startswith(VERL_ONLY_PREFIXES) or key in VERL_KEYS or model_override_rule(key) is not None
