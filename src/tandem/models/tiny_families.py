"""Tiny random versions of the decoder families people train with RL, each keeping what makes it that
family, built with transformers' own config classes and saved with the quickstart's tokenizer.

Sized to what vLLM's CPU kernels take: attention heads of 32 (CPU attention's smallest head size), MLA's
latent cache of kv_lora_rank 512 + rope 64 (the one size vLLM's CPU MLA kernel compiles for), experts
of an intermediate size that stays a multiple of 32 per rank (vLLM's CPU MoE kernel pads others).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers

from tandem.models.tiny import build_tokenizer, padded_vocab_size, save_tokenizer

COMMON = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 256,
    "attention_dropout": 0.0,
}

# family -> (transformers config class, its arguments beyond COMMON)
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3": (  # every Llama 3.1-3.3: rope_type llama3, untied head
        "LlamaConfig",
        {
            "tie_word_embeddings": False,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "qwen2.5": ("Qwen2Config", {"tie_word_embeddings": True}),  # q/k/v biases, tied head
    "qwen3": ("Qwen3Config", {"tie_word_embeddings": True}),  # q/k norms
    "qwen3_moe": (
        "Qwen3MoeConfig",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "norm_topk_prob": True},
    ),
    "mistral": (  # head_dim != hidden / heads: 4 heads of 32 over a hidden size of 64
        "MistralConfig",
        {"num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window": None},
    ),
    "gemma2": (  # soft-capping, alternating sliding window, tied head, no lm_head module in vLLM
        "Gemma2Config",
        {"sliding_window": 8, "query_pre_attn_scalar": 32, "tie_word_embeddings": True},
    ),
    "gemma3": (  # gemma3_text: sliding and full layers, q/k norms
        "Gemma3TextConfig",
        {
            "sliding_window": 8,
            "query_pre_attn_scalar": 32,
            "layer_types": ["sliding_attention", "full_attention"],
            "tie_word_embeddings": True,
        },
    ),
    "deepseek_v3": (  # MLA + MoE with a sigmoid router (noaux_tc), one dense layer first
        "DeepseekV3Config",
        {
            "num_key_value_heads": 2,
            "head_dim": 64,  # transformers' rotary size: qk_rope_head_dim
            "kv_lora_rank": 512,
            "q_lora_rank": None,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 32,
            "v_head_dim": 32,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "moe_intermediate_size": 32,
            "n_group": 1,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            "topk_method": "noaux_tc",  # what every released checkpoint says (transformers leaves it out)
            "scoring_func": "sigmoid",
            "tie_word_embeddings": False,
        },
    ),
}


def family_config(family: str, **overrides: Any) -> Any:
    """The transformers config of the tiny `family` (see FAMILIES), with the quickstart tokenizer's ids."""
    class_name, extra = FAMILIES[family]
    tokenizer = build_tokenizer()
    values = {
        **COMMON,
        **extra,
        "vocab_size": padded_vocab_size(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.eos_token_id,
        **overrides,
    }
    config = getattr(transformers, class_name)(**values)
    for name in ("topk_method", "scoring_func"):  # kept in config.json (transformers' class drops them)
        if name in values:
            setattr(config, name, values[name])
    return config


def save_family(family: str, path: str | Path, seed: int = 0, **overrides: Any) -> Path:
    """Write a Hugging Face folder (fp32 safetensors, config, the quickstart tokenizer) of the tiny
    `family`; the same seed gives the same weights."""
    path = Path(path)
    config = family_config(family, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(path, safe_serialization=True)
    save_tokenizer(build_tokenizer(), path)
    return path
