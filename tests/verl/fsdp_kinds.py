"""The model kind of each of verl's example scripts the config accepts that runs the FSDP engine (main_ppo,
main_ppo_split and the SFT trainers), for tests/verl/test_all_example_scripts.py's start-up check: as for the
megatron scripts (megatron_kinds.py, whose `KIND_OF_PATH` and `save_kind` this table shares), `check_available`
then reads a folder of the kind the script trains, not the test's tiny dense Qwen2. On FSDP it reads the folder's
model_type (a vision-language model's checks), its heads against the Ulysses sequence-parallel size, and vLLM's
reading of it; the shared folder's 16 query / 8 key-value heads are divided by every script's Ulysses size (at
most 4) and rollout tensor parallel size (at most 16: vLLM copies a key-value head over 2 ranks).

main_generation is not in it: `tandem generate` runs no start-up check of the model folder.
"""

from __future__ import annotations

# script -> the model_type of the model it trains (its actor_rollout_ref.model.path, SFT's model.partial_pretrain
# or model.path)
FSDP_KINDS: dict[str, str] = {
    "examples/gmpo_trainer/run_qwen2_5-7b_math.sh": "qwen2",  # Qwen/Qwen2.5-Math-7B
    "examples/gmpo_trainer/test_dapo_7b_math.sh": "qwen2",  # $HOME/verl/models/Qwen2.5-Math-7B
    "examples/gmpo_trainer/test_dapo_qwen3_30b_math.sh": "qwen3_moe",  # $HOME/verl/models/Qwen3-30B-A3B-Base
    "examples/gpg_trainer/run_qwen2-7b_math.sh": "qwen2",  # Qwen/Qwen2-7B-Instruct
    "examples/grpo_trainer/run_deepseek7b_llm.sh": "llama",  # deepseek-ai/deepseek-llm-7b-chat
    "examples/grpo_trainer/run_deepseek7b_llm_math.sh": "llama",  # deepseek-ai/deepseek-llm-7b-chat
    "examples/grpo_trainer/run_deepseek7b_llm_seq_balance.sh": "llama",  # deepseek-ai/deepseek-llm-7b-chat
    "examples/grpo_trainer/run_glm41v_9b.sh": "glm4v",  # zai-org/GLM-4.1V-9B-Thinking
    "examples/grpo_trainer/run_minicpmo2_6.sh": "minicpmo",  # openbmb/MiniCPM-o-2_6
    "examples/grpo_trainer/run_mistral13b_skyworkrm_hhrlhf.sh": "mistral",  # mistralai/Mistral-Nemo-Instruct-2407
    "examples/grpo_trainer/run_qwen2-32b_sglang_fsdp_npu.sh": "qwen2",  # Qwen/Qwen2.5-32B
    "examples/grpo_trainer/run_qwen2-7b.sh": "qwen2",  # Qwen/Qwen2-7B-Instruct
    "examples/grpo_trainer/run_qwen2-7b_math.sh": "qwen2",  # Qwen/Qwen2-7B-Instruct
    "examples/grpo_trainer/run_qwen2-7b_seq_balance.sh": "qwen2",  # Qwen/Qwen2-7B-Instruct
    "examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh": "qwen2",  # Qwen/Qwen2.5-3B-Instruct
    "examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora_from_adapter.sh": "qwen2",  # Qwen/Qwen2.5-3B-Instruct
    "examples/grpo_trainer/run_qwen2_5_32b_grpo_npu.sh": "qwen2",  # Qwen/Qwen2.5-32B-Instruct
    "examples/grpo_trainer/run_qwen2_5_7b_grpo_npu.sh": "qwen2",  # Qwen/Qwen2.5-7B-Instruct
    "examples/grpo_trainer/run_qwen2_5_vl-7b-sglang.sh": "qwen2_5_vl",  # Qwen/Qwen2.5-VL-7B-Instruct
    "examples/grpo_trainer/run_qwen2_5_vl-7b.sh": "qwen2_5_vl",  # Qwen/Qwen2.5-VL-7B-Instruct
    "examples/grpo_trainer/run_qwen2_5_vl-7b_freeze_vision.sh": "qwen2_5_vl",  # Qwen/Qwen2.5-VL-7B-Instruct
    "examples/grpo_trainer/run_qwen2_5_vl-7b_lora.sh": "qwen2_5_vl",  # Qwen/Qwen2.5-VL-7B-Instruct
    "examples/grpo_trainer/run_qwen2_5_vl-7b_seq_balance.sh": "qwen2_5_vl",  # Qwen/Qwen2.5-VL-7B-Instruct
    "examples/grpo_trainer/run_qwen2_5_vl_32b_npu.sh": "qwen2_5_vl",  # Qwen/Qwen2.5-VL-32B-Instruct
    "examples/grpo_trainer/run_qwen2_5_vl_3b_npu.sh": "qwen2_5_vl",  # Qwen/Qwen2.5-VL-3B-Instruct
    "examples/grpo_trainer/run_qwen2_5_vl_7b_npu.sh": "qwen2_5_vl",  # Qwen/Qwen2.5-VL-7B-Instruct
    "examples/grpo_trainer/run_qwen3-32b_npu.sh": "qwen3",  # $HOME/verl/models/Qwen3-32B
    "examples/grpo_trainer/run_qwen3-8b.sh": "qwen3",  # Qwen/Qwen3-8B
    "examples/grpo_trainer/run_qwen3-8b_npu.sh": "qwen3",  # $HOME/verl/models/Qwen3-8B
    "examples/grpo_trainer/run_qwen3_8b_grpo_sglang_1k_spmd_npu.sh": "qwen3",  # /models/Qwen3-8B
    "examples/grpo_trainer/run_qwen3_8b_grpo_sglang_32k_spmd_npu.sh": "qwen3",  # /models/Qwen3-8B
    "examples/grpo_trainer/run_seed_oss_36b.sh": "seed_oss",  # ByteDance-Seed/Seed-OSS-36B-Base
    "examples/gspo_trainer/test_gspo_3b_math.sh": "qwen2",  # Qwen/Qwen2.5-3B-Instruct
    "examples/gspo_trainer/test_gspo_3b_math_slurm.sh": "qwen2",  # Qwen/Qwen2.5-3B-Instruct
    "examples/otb_trainer/run_qwen2_5-7b.sh": "qwen2",  # Qwen/Qwen2.5-7B
    "examples/ppo_trainer/run_deepseek7b_llm.sh": "llama",  # deepseek-ai/deepseek-llm-7b-chat
    "examples/ppo_trainer/run_deepseek7b_llm_modelscope.sh": "llama",  # deepseek-ai/deepseek-llm-7b-chat
    # no model path: ppo_trainer.yaml's default, ~/models/deepseek-llm-7b-chat (Llama's kind)
    "examples/ppo_trainer/run_deepseek7b_llm_pfppo.sh": "llama",
    "examples/ppo_trainer/run_deepseek7b_llm_sandbox_fusion.sh": "llama",  # deepseek-ai/deepseek-llm-7b-chat
    "examples/ppo_trainer/run_deepseek7b_llm_sp2.sh": "llama",  # deepseek-ai/deepseek-llm-7b-chat
    "examples/ppo_trainer/run_gemma.sh": "gemma2",  # google/gemma-2-2b-it
    "examples/ppo_trainer/run_qwen2-7b_rm.sh": "qwen2",  # $HOME/models/Qwen2-7B-Instruct
    "examples/ppo_trainer/run_qwen2-7b_rm_legacy.sh": "qwen2",  # $HOME/models/Qwen2.5-3B-Instruct
    "examples/ppo_trainer/run_qwen2-7b_rm_reward_loop_colocate.sh": "qwen2",  # $HOME/models/Qwen2.5-3B-Instruct
    "examples/ppo_trainer/run_qwen2-7b_rm_seq_balance.sh": "qwen2",  # Qwen/Qwen2-7B-Instruct
    "examples/ppo_trainer/run_qwen2-7b_rm_seq_balance_fused_kernels.sh": "qwen2",  # Qwen/Qwen2-7B-Instruct
    "examples/ppo_trainer/run_qwen2-7b_rm_seq_balance_nsys.sh": "qwen2",  # Qwen/Qwen2-7B-Instruct
    "examples/ppo_trainer/run_qwen2-7b_seq_balance.sh": "qwen2",  # Qwen/Qwen2-7B-Instruct
    "examples/ppo_trainer/run_qwen2-7b_sglang_seq_balance.sh": "qwen2",  # Qwen/Qwen2-7B-Instruct
    "examples/ppo_trainer/run_qwen2.5-32b.sh": "qwen2",  # Qwen/Qwen2.5-32B-Instruct
    "examples/ppo_trainer/run_qwen2.5-3b_rm_legacy.sh": "qwen2",  # $HOME/models/Qwen2.5-3B-Instruct
    "examples/ppo_trainer/run_qwen2.5-3b_rm_reward_loop_colocate.sh": "qwen2",  # $HOME/models/Qwen2.5-3B-Instruct
    "examples/ppo_trainer/run_qwen3-8b_npu.sh": "qwen3",  # Qwen/Qwen3-8B
    "examples/prefix_grouper/run_qwen3_prefix_grouper.sh": "qwen3",  # Qwen/Qwen3-8B
    "examples/reinforce_plus_plus_trainer/run_qwen2-7b_math_rf.sh": "qwen2",  # Qwen/Qwen2-7B-Instruct
    "examples/reinforce_plus_plus_trainer/run_qwen2-7b_math_rf_baseline.sh": "qwen2",  # Qwen/Qwen2-7B-Instruct
    "examples/remax_trainer/run_qwen2.5-3b_seq_balance.sh": "qwen2",  # Qwen/Qwen2.5-3B-Instruct
    "examples/remax_trainer/run_qwen2.5-7b_seq_balance.sh": "qwen2",  # Qwen/Qwen2.5-7B-Instruct
    "examples/rloo_trainer/run_qwen2-7b.sh": "qwen2",  # Qwen/Qwen2-7B-Instruct
    "examples/sapo_trainer/run_qwen30b_sapo.sh": "qwen3_moe",  # Qwen/Qwen3-30B-A3B-Base
    "examples/sft/gsm8k/run_deepseek_6b7.sh": "llama",  # deepseek-ai/deepseek-coder-6.7b-instruct
    "examples/sft/gsm8k/run_gemma_2b.sh": "gemma",  # google/gemma-2b-it
    "examples/sft/gsm8k/run_gemma_7b.sh": "gemma",  # google/gemma-1.1-7b-it
    "examples/sft/gsm8k/run_qwen3_8b_sft_peft_sp2_npu.sh": "qwen3",  # Qwen/Qwen3-8B
    "examples/sft/gsm8k/run_qwen_05_peft.sh": "qwen2",  # Qwen/Qwen2.5-0.5B-Instruct
    "examples/sft/gsm8k/run_qwen_05_sp2.sh": "qwen2",  # Qwen/Qwen2.5-0.5B-Instruct
    "examples/sft/gsm8k/run_qwen_05_sp2_liger.sh": "qwen2",  # Qwen/Qwen2.5-0.5B-Instruct
    "examples/sft/gsm8k/run_seed_oss_36b_sft.sh": "seed_oss",  # ByteDance-Seed/Seed-OSS-36B-Base
    "examples/sft/multiturn/run_qwen_05_sp2.sh": "qwen2",  # Qwen/Qwen2.5-0.5B-Instruct
    "examples/sft/vlm/run_qwen3_vl_2b.sh": "qwen3_vl",  # $PROJECT_DIR/model/Qwen3-VL-2B-Instruct
    "examples/sglang_multiturn/geo3k/run_qwen2.5-3b_geo3k_multiturn.sh": "qwen2_5_vl",  # Qwen/Qwen2.5-VL-3B-Instruct
    "examples/sglang_multiturn/geo3k/run_qwen2.5-3b_geo3k_multiturn_4xgpu.sh": "qwen2_5_vl",  # Qwen/Qwen2.5-VL-3B-Instruct
    "examples/sglang_multiturn/gsm8k_toolcall_shaping/run_gsm8k_grpo_toolcall_shaping.sh": "qwen2",  # Qwen/Qwen2.5-0.5B-Instruct
    "examples/sglang_multiturn/run_qwen0.5b_gsm8k_multiturn_curriculum.sh": "qwen2",  # Qwen/Qwen2.5-0.5B-Instruct
    "examples/sglang_multiturn/run_qwen2.5-0.5b_gsm8k_multiturn_w_interaction.sh": "qwen2",  # Qwen/Qwen2.5-0.5B-Instruct
    "examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn.sh": "qwen2",  # Qwen/Qwen2.5-3B-Instruct
    "examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_4xgpu.sh": "qwen2",  # Qwen/Qwen2.5-3B-Instruct
    "examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_4xgpu_server.sh": "qwen2",  # Qwen/Qwen2.5-3B-Instruct
    "examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_server.sh": "qwen2",  # Qwen/Qwen2.5-3B-Instruct
    "examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_tool_agent_mlflow.sh": "qwen2",  # Qwen/Qwen2.5-3B-Instruct
    "examples/sglang_multiturn/run_qwen3-4b_gsm8k_multiturn.sh": "qwen3",  # Qwen/Qwen3-4B
    "examples/sglang_multiturn/run_qwen3_4b_dapo_multiturn.sh": "qwen3",  # font-info/qwen3-4b-sft-SGLang-RL
    "examples/sglang_multiturn/search_r1_like/run_qwen2.5-3b_instruct_search_multiturn.sh": "qwen2",  # Qwen/Qwen2.5-3B-Instruct
    "examples/split_placement/run_deepseek7b_llm.sh": "llama",  # deepseek-ai/deepseek-llm-7b-chat
    "examples/tuning/0.5b/qwen2-0.5b_grpo-lora_1_h100_fsdp_vllm.sh": "qwen2",  # Qwen/Qwen2.5-0.5B-Instruct
    "examples/tuning/1.5b/qwen2-1.5b_grpo-lora_1_h100_fsdp_vllm.sh": "qwen2",  # Qwen/Qwen2.5-1.5B-Instruct
    "examples/tuning/14b/qwen2-14b_grpo-lora_2_h100_fsdp_vllm.sh": "qwen2",  # Qwen/Qwen2.5-14B-Instruct
    "examples/tuning/14b/qwen2_14b_grpo_4_h800_fsdp_vllm.sh": "qwen2",  # Qwen/Qwen2.5-Coder-14B-Instruct
    "examples/tuning/32b/qwen2-32b_grpo-lora_4_h100_fsdp_vllm.sh": "qwen2",  # Qwen/Qwen2.5-32B-Instruct
    "examples/tuning/3b/qwen2-3b_grpo-lora_1_h100_fsdp_vllm.sh": "qwen2",  # Qwen/Qwen2.5-3B-Instruct
    # model.path=model_path (a placeholder); the script's name: Qwen2-70B
    "examples/tuning/70b/qwen2-70b_grpo_32_h20_fsdp_vllm.sh": "qwen2",
    "examples/tuning/70b/qwen2-70b_grpo_32_h800_fsdp_vllm.sh": "qwen2",  # Qwen/Qwen2-72B-Instruct
    "examples/tuning/70b/qwen2-72b_grpo-lora_8_h100_fsdp_vllm.sh": "qwen2",  # Qwen/Qwen2.5-72B-Instruct
    "examples/tuning/7b/qwen2-7b_grpo-lora_1_h100_fsdp_vllm.sh": "qwen2",  # Qwen/Qwen2.5-7B-Instruct
    "examples/tuning/7b/qwen2-7b_grpo_2_h800_fsdp_vllm.sh": "qwen2",  # Qwen/Qwen2-7B-Instruct
}
