"""The model kind of each of verl's example scripts that runs the megatron engine, and a tiny model folder of each
kind, for tests/verl/test_all_example_scripts.py's start-up check: `tandem config` reads a script's settings, and
the checks that read a model folder before any worker starts (`check_available`: megatron's `check_buildable`,
convert.check_supported, the vision-language checks) then read a folder of the kind the script trains, not the
test's tiny dense Qwen2.

The kind is written literally per script (the model its path names; where the path is a variable with no default,
the model its name and experiment name say), and `KIND_OF_PATH` says the same from the path's words, so a kind
that disagrees with the path fails the test. The folders hold a config.json of that model_type (no weights: the
checks read the config alone) and the tiny tokenizer, sized so that the largest layout of any script divides it:
16 query heads over 8 key-value heads, 16 experts, 48 layers (pipeline stages of 16, 12, 8, 4), a vocabulary of
a multiple of 8.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from transformers import AutoConfig

from tandem.models.tiny import build_tokenizer, save_tokenizer

# script -> the model_type of the model it trains
MEGATRON_KINDS: dict[str, str] = {
    "examples/gpg_trainer/run_qwen2-7b_math_megatron.sh": "qwen2",  # Qwen2-7B-Instruct
    "examples/grpo_trainer/run_deepseek671b_math_megatron_80gb.sh": "deepseek_v3",  # <path_to_dsv3_config>
    "examples/grpo_trainer/run_deepseek671b_math_megatron_96gb.sh": "deepseek_v3",  # DeepSeek-V3-config-verl
    "examples/grpo_trainer/run_deepseek7b_llm_math_megatron.sh": "llama",  # deepseek-llm-7b-chat (Llama's)
    "examples/grpo_trainer/run_qwen2-7b_math_megatron.sh": "qwen2",
    "examples/grpo_trainer/run_qwen2-7b_math_megatron_lora.sh": "qwen2",
    "examples/grpo_trainer/run_qwen2-7b_seq_balance_math_megatron.sh": "qwen2",
    "examples/grpo_trainer/run_qwen2-7b_sgl_megatron.sh": "qwen2",
    "examples/grpo_trainer/run_qwen2_5-7b_math_megatron_diff_tp.sh": "qwen2",  # Qwen2.5-7B-Instruct
    "examples/grpo_trainer/run_qwen3-235b_megatron_96gb.sh": "qwen3_moe",  # Qwen3-235B-A22B
    "examples/grpo_trainer/run_qwen3_vl-235b-megatron.sh": "qwen3_vl_moe",  # Qwen3-VL-235B-A22B-Instruct
    "examples/grpo_trainer/run_qwen3_vl-30b-megatron.sh": "qwen3_vl_moe",  # Qwen3-VL-30B-A3B-Instruct
    "examples/grpo_trainer/run_qwen3_vl-8b-megatron.sh": "qwen3_vl",  # Qwen3-VL-8B-Instruct
    "examples/grpo_trainer/run_qwen3moe-30b_megatron_96gb.sh": "qwen3_moe",  # Qwen3-30B-A3B-Base
    "examples/grpo_trainer/run_qwen3moe-30b_megatron_lora.sh": "qwen3_moe",  # Qwen3-30B-A3B-Instruct-2507
    "examples/gspo_trainer/run_qwen30b_gspo.sh": "qwen3_moe",  # Qwen3-30B-A3B-Base
    "examples/gspo_trainer/test_gspo_qwen30b_a3b_ep.sh": "qwen3_moe",  # Qwen3-30B-A3B-Base
    "examples/ppo_trainer/run_deepseek_full_hh_rlhf.sh": "llama",  # deepseek-llm-7b-chat
    "examples/ppo_trainer/run_deepseek_math_gsm8k_megatron.sh": "llama",
    "examples/ppo_trainer/run_deepseek_math_gsm8k_megatron_nsys.sh": "llama",
    # model.path= (empty); experiment moonlight_16b_a3b_instruct_1node: Moonlight-16B-A3B is DeepSeek-V3's kind
    "examples/ppo_trainer/run_moonlight16b_a3b_gsm8k_megatron.sh": "deepseek_v3",
    "examples/ppo_trainer/run_qwen1.5_moe_a2.7b-gsm8k_megatron.sh": "qwen2_moe",  # Qwen1.5-MoE-A2.7B-Chat
    "examples/ppo_trainer/run_qwen2-7b_math_gsm8k_megatron.sh": "qwen2",
    # model.path= (empty); the script's name: Qwen3-30B-A3B
    "examples/router_replay/run_qwen30_a3b_megatron_vllm.sh": "qwen3_moe",
    "examples/sglang_multiturn/geo3k/run_qwen2.5-3b_megatron_geo3k_multiturn.sh": "qwen2_5_vl",  # Qwen2.5-VL-3B
    "examples/sglang_multiturn/run_qwen2.5-3b_megatron_gsm8k_multiturn.sh": "qwen2",  # Qwen2.5-3B-Instruct
    "examples/tuning/32b/qwen2_32B_grpo_8_h20_megatron_vllm.sh": "qwen2",  # Qwen2.5-32B
}

# the words of a model path -> its kind, first match wins (an empty or placeholder path says nothing)
KIND_OF_PATH: list[tuple[str, str]] = [
    (r"Qwen3-VL-\d+B-A\d+B", "qwen3_vl_moe"),
    (r"Qwen3-VL-\d+B", "qwen3_vl"),
    (r"Qwen2\.5-VL", "qwen2_5_vl"),
    (r"Qwen3-\d+B-A\d+B", "qwen3_moe"),
    (r"Qwen1\.5-MoE", "qwen2_moe"),
    (r"DeepSeek-V3|dsv3|Moonlight", "deepseek_v3"),
    (r"deepseek-(llm|coder)", "llama"),
    # the FSDP scripts' models too (fsdp_kinds.py)
    (r"GLM-4\.1V", "glm4v"),
    (r"MiniCPM-o", "minicpmo"),
    (r"Mistral", "mistral"),
    (r"gemma-2-", "gemma2"),
    (r"gemma-", "gemma"),
    (r"Seed-OSS", "seed_oss"),
    (r"(?i)qwen3-\d+b", "qwen3"),
    (r"Qwen2(\.5)?(-Math|-Coder)?-[\d.]+B", "qwen2"),
]


def kind_of_path(path: str) -> str | None:
    return next((kind for pattern, kind in KIND_OF_PATH if re.search(pattern, path)), None)


SIZES = {
    "hidden_size": 64,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 4,
    "intermediate_size": 128,
    "num_hidden_layers": 48,
    "vocab_size": 1024,
    "max_position_embeddings": 131072,  # longer than any script's prompt + response (vLLM's check reads it)
}
EXPERTS = {  # each MoE kind's names for its experts
    "qwen3_moe": {"num_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    "qwen2_moe": {"num_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    # DeepSeek-V3's router as every released folder writes it (vLLM's check reads these)
    "deepseek_v3": {
        "n_routed_experts": 16,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
    },
}


# model types whose code comes with the model's folder (trust_remote_code), config.json's own fields
REMOTE_CODE = {
    "minicpmo": {
        "model_type": "minicpmo",
        "architectures": ["MiniCPMO"],
        "auto_map": {"AutoConfig": "configuration_minicpm.MiniCPMOConfig"},
    },
}


def save_kind(folder: Path, kind: str) -> str:
    """A folder of `kind` (a config.json and the tiny tokenizer) sized for every script's layout."""
    folder.mkdir(parents=True, exist_ok=True)
    save_tokenizer(build_tokenizer(), folder)
    if (
        kind in REMOTE_CODE
    ):  # a model_type transformers does not know: its config.json as the release writes it
        (folder / "config.json").write_text(json.dumps({**SIZES, **REMOTE_CODE[kind]}))
        return str(folder)
    if kind in ("qwen3_vl_moe", "qwen3_vl", "qwen2_5_vl", "glm4v"):
        text = {**SIZES, **({"num_experts": 16, "num_experts_per_tok": 2} if kind.endswith("moe") else {})}
        config = AutoConfig.for_model(kind, text_config=text)
    else:
        config = AutoConfig.for_model(kind, **SIZES, **EXPERTS.get(kind, {}))
    config.save_pretrained(folder)
    return str(folder)
