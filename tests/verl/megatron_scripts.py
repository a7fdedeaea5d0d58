"""The override lists of verl's 31 example scripts that run `ppo_megatron_trainer`.

30 are read from tests/verl/data/examples.json (examples_data.py): what each script passes to `python3 -m
verl.trainer.main_ppo` after its `--config-name=ppo_megatron_trainer`, its shell variables at their defaults. A
variable with no default (a path) is empty there, as bash leaves it, and `$HOME/...` / `$PROJECT_DIR/...` stand for
the user's files. The key is the script's path under examples/ (`grpo_trainer/run_qwen2-7b_sgl_megatron.sh` is
`grpo_trainer_run_qwen2_7b_sgl_megatron`).

The 31st, sapo_trainer/run_qwen30b_sapo.sh, runs megatron only with `backend=megatron` (its default is fsdp, which
is what examples.json holds): its megatron branch's overrides (verl's examples/ at b178a3c) are the one list kept
here.

`tests/verl/test_megatron_scripts.py` reads each through `tandem config` over verl's megatron defaults.
"""

from .examples_data import EXAMPLES, script_key

# sapo_trainer/run_qwen30b_sapo.sh with backend=megatron
SAPO_MEGATRON = [
    "algorithm.adv_estimator=grpo",
    "algorithm.use_kl_in_reward=False",
    "algorithm.kl_ctrl.kl_coef=0.001",
    "algorithm.gamma=1.0",
    "algorithm.lam=0.95",
    "data.train_files=$HOME/data/dataset/dapo/train.parquet",
    "data.val_files=$HOME/data/dataset/test/aime_24/train.parquet",
    "data.return_raw_chat=True",
    "data.train_batch_size=256",
    "data.max_prompt_length=2048",
    "data.max_response_length=8192",
    "data.filter_overlong_prompts=True",
    "data.filter_overlong_prompts_workers=64",
    "data.truncation=error",
    "trainer.use_legacy_worker_impl=disable",
    "trainer.critic_warmup=0",
    "trainer.logger=[console,wandb]",
    "trainer.project_name=RL4LLM",
    "trainer.experiment_name=qwen3-30B-base-vanilla-megatron",
    "trainer.default_local_dir=$HOME/data/checkpoint/RL4LLM/qwen3-30B-base-vanilla-megatron",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=1",
    "trainer.val_before_train=False",
    "trainer.log_val_generations=100",
    "trainer.save_freq=-1",
    "trainer.test_freq=10",
    "trainer.total_epochs=10",
    "trainer.total_training_steps=2000",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B-Base",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.tau_pos=1.0",
    "actor_rollout_ref.actor.tau_neg=1.05",
    "actor_rollout_ref.actor.policy_loss.loss_mode=sapo",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=32",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30720",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1",
    "actor_rollout_ref.actor.megatron.context_parallel_size=1",
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1",
    "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=null",
    "actor_rollout_ref.actor.megatron.expert_model_parallel_size=8",
    "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1",
    "actor_rollout_ref.actor.megatron.param_offload=True",
    "actor_rollout_ref.actor.megatron.grad_offload=True",
    "actor_rollout_ref.actor.megatron.optimizer_offload=True",
    "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_router_dtype=fp32",
    "+actor_rollout_ref.actor.megatron.override_transformer_config.moe_permute_fusion=True",
    "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform",
    "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full",
    "+actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers=1",
    "+actor_rollout_ref.actor.megatron.override_transformer_config.apply_rope_fusion=True",
    "+actor_rollout_ref.actor.megatron.override_transformer_config.gradient_accumulation_fusion=True",
    "actor_rollout_ref.actor.megatron.use_mbridge=True",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.mode=async",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
    "actor_rollout_ref.rollout.data_parallel_size=1",
    "actor_rollout_ref.rollout.expert_parallel_size=1",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.8",
    "actor_rollout_ref.rollout.n=16",
    "actor_rollout_ref.rollout.val_kwargs.top_p=0.7",
    "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
    "actor_rollout_ref.rollout.val_kwargs.n=1",
    "reward_model.reward_manager=dapo",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4096",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
    "+reward_model.reward_kwargs.max_resp_len=8192",
]

MEGATRON_SCRIPTS: dict[str, list[str]] = {
    **{
        script_key(entry["script"]): list(entry["overrides"])
        for entry in EXAMPLES
        if (entry["config_name"] or "").removesuffix(".yaml") == "ppo_megatron_trainer"
    },
    "sapo_trainer_run_qwen30b_sapo": SAPO_MEGATRON,
}
