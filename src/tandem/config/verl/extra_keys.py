"""verl's keys beyond config/verl/keys.py's main table: the data section's, the rewards' (the rule scorers, the
reward manager, the reward model), the model's and the megatron engine's details, and the rollout engine's
arguments. Merged into the table (`EXTRA_KEYS`, `EXTRA_PATTERNS`); tests/verl/test_key_coverage.py checks that
every key of verl's generated configs has a rule.

Many of them only name something verl can be asked for (a user's dataset class, a LoRA adapter to start from):
`default_only` accepts verl's default (which asks for nothing, so dropping it changes nothing) and refuses any
other value, naming what Tandem does not have.
"""

from __future__ import annotations

from typing import Any

from tandem.config.verl.rules import Rule, UnsupportedValue, maps, no_effect
from tandem.config.verl.values import as_list, chat_template_kwargs, hydra_mapping, reward_manager_name

_UNSET = (None, "null", "", {}, [], -1)


def default_only(missing: str, accepted: tuple[Any, ...] = _UNSET, note: str = "") -> Rule:
    """verl's default value (`accepted`) has no effect; any other asks for what Tandem lacks (`missing`)."""

    def check(value: Any) -> None:
        if value not in accepted and str(value) not in map(str, accepted):
            raise UnsupportedValue(missing)

    return maps("", note or "verl's default, which asks for nothing", check)


def _false_only(missing: str) -> Rule:
    return default_only(missing, (False, "false", "False"), "false: verl's default")


def _true_only(missing: str) -> Rule:
    return default_only(missing, (True, "true", "True"), "true: verl's default")


def _tool_call_format(value: Any) -> str:
    # SGLang's Qwen 2.5 parser (verl's sglang examples name it qwen / qwen25) reads <tool_call>{json}</tool_call>,
    # the hermes syntax
    if value in ("hermes", "qwen", "qwen25"):
        return "hermes"
    raise UnsupportedValue(
        f"Tandem's agent loop parses hermes-style tool calls (<tool_call>{{json}}</tool_call>), not {value!r}"
    )


_ENGINE_ARG = "a vLLM/SGLang engine argument Tandem does not pass on (the engine's default applies)"
_COPY_OF_N = "verl's copy of actor_rollout_ref.rollout.n for the worker; Tandem reads rollout.n itself"
_CHUNKED = "Tandem's entropy is always computed in chunks"
_PLACEMENT = (
    "where the reward model runs: Tandem places it with the other roles (roles/layout.py); placement does not "
    "change its scores"
)
_RM_BATCH = (
    "the reward model's forward is cut by reward_model.micro_batch_size_per_gpu; the scores are the same"
)
_LOADS_WEIGHTS = "Tandem always starts from the model folder's weights; a random start is not built"
_NO_MEGATRON_RM = (
    "Tandem's reward model is a Hugging Face model run for forward passes; verl's megatron layout for it "
    "changes memory and speed, not its scores"
)

# the override_config key verl's FSDP scripts use for the context length (the megatron ones nest it under
# model_config): Tandem does not change the folder's config
_CONTEXT_LENGTH = (
    "Tandem does not change the model folder's config.json: its engines compute rotary positions for any "
    "length, but vLLM's length check and a RoPE scaling that reads it (dynamic NTK) use the folder's "
    "value; a run longer than it is refused at start-up: raise it in config.json"
)
_REWARD_LOOP_CLASS = (
    "a class of verl's reward loop (RewardManagerBase: built with verl's whole config, called per sample) is not "
    "loaded; a class of verl's AbstractRewardManager interface is: reward_manager.source=importlib "
    "reward_manager.module.path=FILE reward_manager.name=CLASS"
)
# verl's prime reward manager (verl/workers/reward_manager/prime.py) against Tandem's per-sample scoring
_PRIME = (
    "prime: as in verl each sample is scored in a process of a pool, and one that raises or runs past its limit "
    "scores 0 while the rest of the batch is scored. Unlike verl: the limit is reward.timeout_s from when the "
    "sample starts (verl: 300 s from when the batch is handed to the pool, waiting in its queue included; set "
    "reward.timeout_s=300 for the same limit), the pool is reward.num_workers processes kept between batches "
    "(verl: 64, new for each batch), failures are counted in reward/error_count and reward/timeout_count (verl "
    "prints them), a dict's score and fields are kept (verl's prime scores the whole batch 0 when the function "
    "returns a dict) and a list or tuple is an error (verl takes its first item)"
)
_REWARD_MANAGER = (
    "naive, dapo, gdpo and prime call your function once per sample (Tandem's naive; dapo's overlong penalty is "
    "reward.overlong, gdpo's terms are the fields of your function's dict, named by algorithm.gdpo_reward_keys); "
    "batch calls it once per batch with lists, as verl's batch manager, in Tandem's scoring processes; with "
    "reward_manager.source=importlib it names your class. verl 0.7 runs batch and prime only with "
    "reward_model.use_reward_loop=false. " + _PRIME
)
REWARD_KWARGS = (
    "reward_manager=batch: passed to each call of your function; a class of your own: to its constructor (dapo's "
    "overlong_buffer_cfg and max_resp_len are reward.overlong.*)"
)
_DIST_PREFIX = default_only(
    "Tandem reads a distributed checkpoint's keys as megatron-core names them, with no prefix (verl's default '')",
    ("",),
)
_FORWARD_ONLY = "verl's flag for a role that never trains; Tandem knows which roles train"
_SEED = (
    "Tandem seeds megatron's random state from trainer.seed: another seed draws another random stream "
    "(dropout, new layers' initial weights), nothing else"
)
_PACKS = "Tandem packs sequences without padding for every role (actor.sequence_packing)"
_DDP = "Tandem builds megatron-core's DDP config itself; passing fields to it is not built"
_MCORE = (
    "Tandem builds megatron-core's model from the Hugging Face config; passing fields to it is not built "
    "(transformer fields: {role}.megatron.override_transformer_config.NAME)"
)
_DTYPE = "Tandem's megatron compute dtype is actor.megatron.param_dtype (auto: bfloat16 on CUDA)"
_DTYPE_NOTE = "bfloat16: Tandem's megatron dtype on CUDA (actor.megatron.param_dtype=auto)"
# megatron's optimizer schedule fields: verl's defaults are Tandem's schedule (optim.py); others are refused
_DECAY_STEPS = "Tandem's decay spans the training steps after warm-up; another length is not built"
_WARMUP_INIT = "Tandem's warm-up starts near 0 ((s + 1) / (W + 1) of the peak); another start is not built"
_MIN_LR = "Tandem's floor is a ratio of the peak: optim.min_lr_ratio"
_WSD_ONLY = "read only with lr_decay_style=WSD, a schedule Tandem refuses"
_SCHEDULE_FROM_CONFIG = (
    "Tandem's schedule comes from the config; a resumed run continues it from the checkpoint's step, and "
    "taking the schedule's settings from the checkpoint is not built"
)

EXTRA_KEYS: dict[str, Rule] = {
    # actor / reference / critic copies and switches verl's workers read
    "actor_rollout_ref.actor.rollout_n": no_effect(_COPY_OF_N),
    "actor_rollout_ref.ref.rollout_n": no_effect(_COPY_OF_N),
    "critic.rollout_n": no_effect(_COPY_OF_N),
    "actor_rollout_ref.actor.use_fused_kernels": no_effect(
        "verl's copy of actor_rollout_ref.model.use_fused_kernels: Tandem always computes log-probs and "
        "entropy from the hidden states in chunks"
    ),
    "actor_rollout_ref.ref.entropy_checkpointing": no_effect(_CHUNKED),
    "actor_rollout_ref.ref.entropy_from_logits_with_chunking": no_effect(_CHUNKED),
    "critic.data_loader_seed": no_effect("Tandem seeds everything from trainer.seed"),
    "critic.optim.total_training_steps": no_effect(
        "Tandem's schedule spans the run's steps (trainer.total_training_steps or the epochs)"
    ),
    "critic.checkpoint.async_save": no_effect("Tandem saves synchronously"),
    "critic.checkpoint.save_contents": no_effect("Tandem saves the critic's model, optimizer and run state"),
    "critic.checkpoint.load_contents": default_only(
        "Tandem loads the critic's model, optimizer and run state; loading a part of it is not built",
        (["model", "optimizer", "extra"], "[model,optimizer,extra]"),
    ),
    "actor_rollout_ref.actor.use_prefix_grouper": no_effect(
        "verl's PrefixGrouper computes a prompt shared by a group's samples once; Tandem computes it for each "
        "sample: the same numbers (to rounding), more compute"
    ),
    "actor_rollout_ref.actor.freeze_vision_tower": maps("actor.freeze_vision_tower"),
    "actor_rollout_ref.actor.loss_scale_factor": default_only(
        "Tandem's seq-mean-token-sum-norm divides by data.max_response_length (verl's null); another constant "
        "is not built"
    ),
    # the model
    "actor_rollout_ref.model.custom_chat_template": default_only(
        "Tandem applies the tokenizer folder's chat template (data.chat_template=auto); put the template in "
        "that folder's tokenizer_config.json (chat_template) and name the folder in "
        "actor_rollout_ref.model.tokenizer_path"
    ),
    "actor_rollout_ref.model.hf_config_path": default_only(
        "Tandem reads config.json from the model folder; put the config there"
    ),
    "actor_rollout_ref.model.exclude_modules": maps(
        "actor.lora.exclude_modules",
        "PEFT reads a string as one regular expression over a module's whole name and a list as names or ends "
        "of names; Tandem reads each entry both ways, and excludes what is inside an excluded module too",
        as_list,
    ),
    # verl loads the folder with PEFT and ignores lora_rank / lora_alpha / target_modules beside it; Tandem fills
    # them from the folder's adapter_config.json and refuses other values (config/checks/lora.py)
    "actor_rollout_ref.model.lora_adapter_path": maps("actor.lora.adapter_path"),
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": default_only(
        "Tandem repeats a prompt rollout.n times; a separate repeat count for multi-turn rollouts is not built"
    ),
    "actor_rollout_ref.rollout.multi_turn.format": maps(
        "rollout.multi_turn.format",
        "qwen / qwen25 (SGLang's Qwen 2.5 parser) are the hermes syntax",
        _tool_call_format,
    ),
    "algorithm.use_pf_ppo": maps(
        "algorithm.pf_ppo.enable",
        "verl resamples only with adv_estimator=gae (other estimators skip it without a word); Tandem with any",
    ),
    # data
    "data.tokenizer": default_only(
        "Tandem reads the tokenizer of actor_rollout_ref.model.tokenizer_path (or the model folder's); set that"
    ),
    "data.train_max_samples": default_only(
        "Tandem reads every row of data.train_files; write a smaller file to train on fewer"
    ),
    "data.val_max_samples": default_only("Tandem reads every row of data.val_files; write a smaller file"),
    "data.image_patch_size": no_effect(
        "images are sized by the model folder's image processor (its patch size), as verl's default 14 "
        "does for Qwen2-VL"
    ),
    "data.video_key": default_only(
        "Tandem reads no video inputs (only a row's images); naming a video column is not built",
        ("videos",),
    ),
    "data.apply_chat_template_kwargs": maps(
        "data.chat_template_kwargs",
        "the chat template's variables, for every rendering: prompts, SFT rows, the agent loop's turns",
        chat_template_kwargs,
    ),
    "data.custom_cls.path": maps(
        "data.custom_dataset_file",
        "its items are read once at start-up (verl reads one each time a batch needs it), every row's prompt "
        "rendered and length-checked by Tandem as a file's row is",
    ),
    "data.custom_cls.name": maps("data.custom_dataset_class"),
    "data.datagen.path": default_only("Tandem has no data generator that adds prompts during training"),
    "data.datagen.name": default_only("Tandem has no data generator that adds prompts during training"),
    "data.sampler.class_path": maps(
        "data.sampler_file",
        "update(batch) gets Tandem's SamplerBatch (the step's scores, rewards, dataset indices and per-sample "
        "fields), not verl's DataProto; a curriculum is refused with trainer.async_mode one_step_off / streaming",
    ),
    "data.sampler.class_name": maps("data.sampler_class"),
    # the rule scorers and the reward manager
    "reward_model.overlong_buffer.enable": maps("reward.overlong.enable"),
    "reward_model.overlong_buffer.len": maps("reward.overlong.buffer_len"),
    "reward_model.overlong_buffer.penalty_factor": maps("reward.overlong.penalty_factor"),
    # verl's DAPO scripts set the same penalty as the DAPO reward manager's arguments (with reward_manager=batch or
    # a class of your own verl passes these to it; Tandem applies the penalty, reward.overlong, and passes them not)
    "reward_model.reward_kwargs.overlong_buffer_cfg.enable": maps("reward.overlong.enable"),
    "reward_model.reward_kwargs.overlong_buffer_cfg.len": maps("reward.overlong.buffer_len"),
    "reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor": maps("reward.overlong.penalty_factor"),
    "reward_model.reward_kwargs.overlong_buffer_cfg.log": no_effect(
        "Tandem logs every reward term's mean (reward/overlong_mean)"
    ),
    "reward_model.reward_kwargs.max_resp_len": maps("reward.overlong.max_length"),
    "reward_model.sandbox_fusion.url": maps("reward.sandbox_fusion.url"),
    "reward_model.sandbox_fusion.max_concurrent": maps("reward.sandbox_fusion.max_concurrent"),
    "reward_model.sandbox_fusion.memory_limit_mb": maps("reward.sandbox_fusion.memory_limit_mb"),
    "reward_model.reward_manager": maps("reward.manager", _REWARD_MANAGER, convert=reward_manager_name),
    "reward_model.launch_reward_fn_async": no_effect(
        "Tandem's rewards are scored by reward.num_workers processes while the step goes on"
    ),
    "reward_model.use_reward_loop": no_effect(
        "Tandem scores each batch once on its own path: batch, prime and a class of your own run as verl runs "
        "them with use_reward_loop=false (its reward loop has neither batch nor prime, nor calls such a class)"
    ),
    # the processes verl's reward loop scores in: Tandem's scoring processes
    "reward_model.num_workers": maps("reward.num_workers"),
    "reward.reward_manager.name": maps("reward.manager", _REWARD_MANAGER, convert=reward_manager_name),
    "reward_manager.name": maps("reward.manager", _REWARD_MANAGER, convert=reward_manager_name),
    "reward_manager.source": maps(
        "reward.manager_source",
        "importlib: reward_manager.name is a class in reward_manager.module.path, built and called on each batch "
        "as verl's trainer does (verl 0.7 builds it but calls it only with reward_model.use_reward_loop=false)",
    ),
    "reward_manager.module.path": maps("reward.manager_file", "read with reward_manager.source=importlib"),
    "reward_manager.module.name": no_effect(
        "verl's trainer loads the class from module.path by reward_manager.name; module.name is not read there"
    ),
    "reward_model.reward_kwargs": maps("reward.manager_kwargs", REWARD_KWARGS, convert=hydra_mapping),
    "custom_reward_function.path": maps("reward.custom_reward_file"),
    "custom_reward_function.name": maps("reward.custom_reward_function"),
    "custom_reward_function.reward_kwargs": maps("reward.custom_reward_kwargs", convert=hydra_mapping),
    # the reward model
    "reward_model.enable_resource_pool": no_effect(_PLACEMENT),
    "reward_model.n_gpus_per_node": no_effect(_PLACEMENT),
    "reward_model.nnodes": no_effect(_PLACEMENT),
    "reward_model.strategy": no_effect(_NO_MEGATRON_RM),
    "reward_model.ulysses_sequence_parallel_size": no_effect(
        "Tandem's reward model forwards whole rows on a rank: memory, not scores"
    ),
    "reward_model.forward_max_token_len_per_gpu": no_effect(_RM_BATCH),
    "reward_model.use_dynamic_bsz": no_effect(_RM_BATCH),
    "reward_model.max_length": default_only(
        "Tandem's reward model reads the whole prompt + response; a cut at max_length is not built"
    ),
    "reward_model.load_weight": _true_only(_LOADS_WEIGHTS),
    "reward_model.nccl_timeout": no_effect("every worker call is bounded by trainer.worker_timeout_s"),
    "reward_model.reward_loop_source": no_effect(
        "read with reward_loop_module_path / reward_loop_class_name, which Tandem refuses (see them)"
    ),
    "reward_model.reward_loop_module_path": default_only(_REWARD_LOOP_CLASS),
    "reward_model.reward_loop_class_name": default_only(_REWARD_LOOP_CLASS),
    "reward_model.model.input_tokenizer": no_effect(
        "Tandem's reward model reads the actor's token ids; its tokenizer is checked to match the actor's at "
        "start-up, so verl's re-tokenizing is not needed"
    ),
    "reward_model.model.use_fused_kernels": no_effect("a forward-only model: the scores are the same"),
    "reward_model.megatron.use_dist_checkpointing": _false_only(
        "Tandem starts the reward model from its Hugging Face folder, not a megatron distributed checkpoint"
    ),
    # megatron: the model's and the rollout's weights
    "actor_rollout_ref.model.override_config.moe_config.freeze_moe_router": _false_only(
        "Tandem trains a MoE model's router with the rest; freezing it is not built"
    ),
    "critic.model.override_config.moe_config.freeze_moe_router": _false_only(
        "Tandem trains a MoE critic's router with the rest; freezing it is not built"
    ),
    "actor_rollout_ref.model.override_config.model_config": default_only(
        "give its keys one at a time (override_config.model_config.max_position_embeddings=N)"
    ),
    "critic.model.override_config.model_config": default_only(
        "give its keys one at a time (override_config.model_config.max_position_embeddings=N)"
    ),
    "actor_rollout_ref.rollout.layer_name_map.qkv_layer_name": no_effect(
        "Tandem converts megatron weights to Hugging Face names for the rollout itself (engine/megatron/)"
    ),
    "actor_rollout_ref.rollout.layer_name_map.gate_proj_layer_name": no_effect(
        "Tandem converts megatron weights to Hugging Face names for the rollout itself (engine/megatron/)"
    ),
    "critic.nccl_timeout": no_effect("every worker call is bounded by trainer.worker_timeout_s"),
    # the override_config key of each model for the context length
    "actor_rollout_ref.model.override_config.max_position_embeddings": no_effect(_CONTEXT_LENGTH),
    "critic.model.override_config.max_position_embeddings": no_effect(_CONTEXT_LENGTH),
    "reward_model.model.override_config.max_position_embeddings": no_effect(_CONTEXT_LENGTH),
    # the actor's megatron engine settings
    "actor_rollout_ref.actor.load_weight": _true_only(_LOADS_WEIGHTS),
    "actor_rollout_ref.actor.megatron.dist_checkpointing_prefix": _DIST_PREFIX,
    "actor_rollout_ref.actor.megatron.forward_only": no_effect(_FORWARD_ONLY),
    "actor_rollout_ref.actor.megatron.seed": no_effect(_SEED),
    "actor_rollout_ref.actor.megatron.use_remove_padding": no_effect(_PACKS),
    "actor_rollout_ref.actor.megatron.override_ddp_config": default_only(_DDP),
    "actor_rollout_ref.actor.megatron.override_mcore_model_config": default_only(
        _MCORE.format(role="actor_rollout_ref.actor")
    ),
    "actor_rollout_ref.actor.megatron.dtype": default_only(_DTYPE, ("bfloat16", None), _DTYPE_NOTE),
    # the reference's megatron engine settings
    "actor_rollout_ref.ref.load_weight": _true_only(_LOADS_WEIGHTS),
    "actor_rollout_ref.ref.megatron.dist_checkpointing_prefix": _DIST_PREFIX,
    "actor_rollout_ref.ref.megatron.forward_only": no_effect(_FORWARD_ONLY),
    "actor_rollout_ref.ref.megatron.seed": no_effect(_SEED),
    "actor_rollout_ref.ref.megatron.use_remove_padding": no_effect(_PACKS),
    "actor_rollout_ref.ref.megatron.override_ddp_config": default_only(_DDP),
    "actor_rollout_ref.ref.megatron.override_mcore_model_config": default_only(
        _MCORE.format(role="actor_rollout_ref.ref")
    ),
    "actor_rollout_ref.ref.megatron.dtype": default_only(_DTYPE, ("bfloat16", None), _DTYPE_NOTE),
    "actor_rollout_ref.ref.megatron.use_distributed_optimizer": no_effect(
        "the reference has no optimizer; the critic's engine follows actor.megatron.distributed_optimizer"
    ),
    "actor_rollout_ref.ref.megatron.override_transformer_config": no_effect(
        "the reference is built with the actor's actor.megatron.override_transformer_config"
    ),
    # the critic's megatron engine settings
    "critic.load_weight": _true_only(_LOADS_WEIGHTS),
    "critic.megatron.dist_checkpointing_prefix": _DIST_PREFIX,
    "critic.megatron.forward_only": no_effect(_FORWARD_ONLY),
    "critic.megatron.seed": no_effect(_SEED),
    "critic.megatron.use_remove_padding": no_effect(_PACKS),
    "critic.megatron.override_ddp_config": default_only(_DDP),
    "critic.megatron.override_mcore_model_config": default_only(_MCORE.format(role="critic")),
    "critic.megatron.dtype": default_only(_DTYPE, ("bfloat16", None), _DTYPE_NOTE),
    "critic.megatron.use_distributed_optimizer": no_effect(
        "the reference has no optimizer; the critic's engine follows actor.megatron.distributed_optimizer"
    ),
    # actor_rollout_ref.actor.optim: megatron's optimizer schedule fields
    "actor_rollout_ref.actor.optim.lr_decay_steps": default_only(_DECAY_STEPS),
    "actor_rollout_ref.actor.optim.lr_warmup_init": default_only(_WARMUP_INIT, (0.0, 0, None)),
    "actor_rollout_ref.actor.optim.min_lr": default_only(_MIN_LR, (0.0, 0, None)),
    "actor_rollout_ref.actor.optim.lr_wsd_decay_steps": no_effect(_WSD_ONLY),
    "actor_rollout_ref.actor.optim.lr_wsd_decay_style": no_effect(_WSD_ONLY),
    "actor_rollout_ref.actor.optim.use_checkpoint_opt_param_scheduler": _false_only(_SCHEDULE_FROM_CONFIG),
    "actor_rollout_ref.actor.optim.weight_decay_incr_style": default_only(
        "Tandem's weight decay is constant", ("constant", None)
    ),
    # critic.optim: megatron's optimizer schedule fields
    "critic.optim.lr_decay_steps": default_only(_DECAY_STEPS),
    "critic.optim.lr_warmup_init": default_only(_WARMUP_INIT, (0.0, 0, None)),
    "critic.optim.min_lr": default_only(_MIN_LR, (0.0, 0, None)),
    "critic.optim.lr_wsd_decay_steps": no_effect(_WSD_ONLY),
    "critic.optim.lr_wsd_decay_style": no_effect(_WSD_ONLY),
    "critic.optim.use_checkpoint_opt_param_scheduler": _false_only(_SCHEDULE_FROM_CONFIG),
    "critic.optim.weight_decay_incr_style": default_only(
        "Tandem's weight decay is constant", ("constant", None)
    ),
    # the engine arguments of the rollout: accepted, with the reason of _ENGINE_ARG
    "actor_rollout_ref.rollout.dtype": default_only(
        "Tandem's rollout runs at the actor's compute dtype (actor.fsdp.param_dtype); another rollout dtype is "
        "not built",
        ("bfloat16", "bf16"),
        "bfloat16: the actor's compute dtype by default",
    ),
    "actor_rollout_ref.rollout.gpu_memory_utilization_ratio": no_effect(_ENGINE_ARG),
    "actor_rollout_ref.rollout.ignore_eos": _false_only(
        "Tandem always stops a response at the end-of-sequence token"
    ),
    "actor_rollout_ref.rollout.enforce_eager": no_effect(_ENGINE_ARG),
    "actor_rollout_ref.rollout.cudagraph_capture_sizes": no_effect(_ENGINE_ARG),
    "actor_rollout_ref.rollout.data_parallel_size": no_effect(_ENGINE_ARG),
    "actor_rollout_ref.rollout.expert_parallel_size": no_effect(_ENGINE_ARG),
    "actor_rollout_ref.rollout.pipeline_model_parallel_size": no_effect(_ENGINE_ARG),
    "actor_rollout_ref.rollout.max_num_batched_tokens": no_effect(_ENGINE_ARG),
    "actor_rollout_ref.rollout.max_model_len": no_effect(_ENGINE_ARG),
    "actor_rollout_ref.rollout.max_num_seqs": no_effect(_ENGINE_ARG),
    "actor_rollout_ref.rollout.enable_chunked_prefill": no_effect(_ENGINE_ARG),
    "actor_rollout_ref.rollout.enable_prefix_caching": no_effect(_ENGINE_ARG),
    "actor_rollout_ref.rollout.logprobs_mode": default_only(
        "Tandem's rollout log-probs are processed_logprobs (after temperature), what the trainer recomputes",
        ("processed_logprobs",),
    ),
    "actor_rollout_ref.rollout.scheduling_policy": no_effect(_ENGINE_ARG),
    "actor_rollout_ref.rollout.disable_log_stats": no_effect(_ENGINE_ARG),
    "actor_rollout_ref.rollout.skip_rollout": _false_only(
        "Tandem generates every step's rollouts; reading them back from skip_dump_dir is not built"
    ),
    "actor_rollout_ref.rollout.skip_dump_dir": no_effect(_ENGINE_ARG),
    "actor_rollout_ref.rollout.skip_tokenizer_init": no_effect(_ENGINE_ARG),
    "actor_rollout_ref.rollout.enable_rollout_routing_replay": no_effect(_ENGINE_ARG),
    "actor_rollout_ref.rollout.quantization": default_only(
        "Tandem's rollout runs at the actor's compute dtype; a quantized rollout (fp8) is not built"
    ),
    "actor_rollout_ref.rollout.quantization_config_file": no_effect(_ENGINE_ARG),
    "actor_rollout_ref.rollout.limit_images": no_effect(_ENGINE_ARG),
}

# sections of verl's data config Tandem does not have: a key under one is verl's
EXTRA_PREFIXES = ("data.apply_chat_template_kwargs.", "data.custom_cls.", "data.datagen.", "data.sampler.")

_NSYS_CONTROLLER = (
    "Tandem's controller is the process you start: run `nsys profile ... tandem train` to profile it"
)

# verl's profilers' options (before verl_keys' "*.profiler.*", which names the per-role profilers)
EXTRA_PATTERNS: list[tuple[str, Rule]] = [
    ("global_profiler.global_tool_config.nsys.controller_nsight_options.*", no_effect(_NSYS_CONTROLLER)),
    (
        "global_profiler.global_tool_config.*",
        no_effect("verl's other profilers' options; Tandem's are trainer.profile.*"),
    ),
    ("reward_model.megatron.*", no_effect(_NO_MEGATRON_RM)),
    (
        "critic.model.lora.*",
        no_effect("verl's megatron LoRA of the critic; Tandem's LoRA is PEFT's, on FSDP2 (critic.lora.*)"),
    ),
]
