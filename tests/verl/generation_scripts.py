"""The override lists of verl's two example generation scripts, written out as configuration facts.

Each list is what the script passes to `python3 -m verl.trainer.main_generation` (verl's examples/ at
its 2026-11 main branch): generation/run_deepseek_v2_lite_math.sh and
generation/run_deepseek7b_mutli_node.sh. `$HOME/...` paths and the model name stand for the user's
files; `tests/verl/test_verl_generation.py` changes only the paths and the sizes 2 CPU cores cannot hold.
"""

DEEPSEEK_V2_LITE_MATH = [
    "trainer.nnodes=1",
    "trainer.n_gpus_per_node=8",
    "data.path=$HOME/data/gsm8k/test.parquet",
    "data.prompt_key=prompt",
    "data.n_samples=1",
    "data.output_path=$HOME/data/gsm8k/deepseek_v2_lite_gen_test.parquet",
    "model.path=deepseek-ai/deepseek-llm-7b-chat",
    "+model.trust_remote_code=True",
    "rollout.temperature=1.0",
    "rollout.top_k=50",
    "rollout.top_p=0.7",
    "rollout.prompt_length=2048",
    "rollout.response_length=1024",
    "rollout.tensor_model_parallel_size=2",
    "rollout.gpu_memory_utilization=0.8",
]

DEEPSEEK7B_MULTI_NODE = [
    "trainer.nnodes=2",
    "trainer.n_gpus_per_node=8",
    "data.path=$HOME/data/rlhf/gsm8k/test.parquet",
    "data.prompt_key=prompt",
    "data.n_samples=1",
    "data.output_path=$HOME/data/rlhf/math/deepseek_v2_lite_gen_test.parquet",
    "model.path=deepseek-ai/deepseek-llm-7b-chat",
    "+model.trust_remote_code=True",
    "rollout.temperature=1.0",
    "rollout.top_k=50",
    "rollout.top_p=0.7",
    "rollout.prompt_length=2048",
    "rollout.response_length=1024",
    "rollout.tensor_model_parallel_size=16",
    "rollout.gpu_memory_utilization=0.8",
]

GENERATION_SCRIPTS = {
    "deepseek_v2_lite_math": DEEPSEEK_V2_LITE_MATH,
    "deepseek7b_multi_node": DEEPSEEK7B_MULTI_NODE,
}
