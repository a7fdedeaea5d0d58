"""What vLLM takes of a model folder and of rollout.engine_kwargs, read without vLLM (rollout/vllm_models.py),
against the installed vLLM's own numbers, and as the trainer's start-up checks report it."""

import json

import pytest
import torch

from tandem.config import ConfigError, load_config
from tandem.config.verl.translate import translate_overrides
from tandem.models.tiny_families import family_config
from tandem.rollout.vllm_models import (
    CPU_ATTENTION_HEAD_SIZES,
    CPU_MLA_LATENT_SIZE,
    current_engine_kwargs,
    default_engine_kwargs,
    engine_kwargs_problems,
    model_problems,
)


def as_json(config) -> dict:
    return json.loads(config.to_json_string())


def test_the_cpu_kernel_sizes_are_the_installed_vllms():
    pytest.importorskip("vllm")
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend

    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == CPU_ATTENTION_HEAD_SIZES
    assert CPUMLABackend.get_supported_head_sizes() == [CPU_MLA_LATENT_SIZE]
    assert (
        CPUMLABackend.get_name() == default_engine_kwargs({"kv_lora_rank": 512}, "cpu")["attention_backend"]
    )


def test_vllms_cpu_rotary_kernel_still_rotates_a_query_of_heads_wrongly():
    """Why MLA models on a CPU turn vLLM's rotary kernel off (CPU_MLA_CUSTOM_OPS): its MLA layer rotates a
    query of [tokens, heads, dim], which the kernel gets wrong, while [tokens, heads * dim] (every other
    family's layout) comes out right. When a vLLM release fixes it, this fails: drop the workaround."""
    pytest.importorskip("vllm")
    from vllm import _custom_ops as ops
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("vLLM's CPU kernel: a CPU build of vLLM")
    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(
            64, max_position=64, is_neox_style=False, rope_parameters={"rope_theta": 1e4}, dtype=torch.float32
        )
    generator = torch.Generator().manual_seed(0)
    positions = torch.arange(4)
    query, key = torch.randn(4, 2, 64, generator=generator), torch.randn(4, 1, 64, generator=generator)
    want_query, want_key = rope.forward_native(positions, query.clone(), key.clone())
    cache = rope.cos_sin_cache
    flat_query, flat_key = query.clone().flatten(1), key.clone().flatten(1)
    ops.rotary_embedding(positions, flat_query, flat_key, 64, cache, False)
    torch.testing.assert_close(flat_query.view(4, 2, 64), want_query)
    torch.testing.assert_close(flat_key.view(4, 1, 64), want_key)
    heads_query, heads_key = query.clone(), key.clone()
    ops.rotary_embedding(positions, heads_query, heads_key, 64, cache, False)
    assert (heads_query - want_query).abs().max() > 0.1  # values of about 1: wrong, not rounding


def test_deepseek_v3_without_its_router_fields_is_refused_naming_them():
    config = as_json(family_config("deepseek_v3"))
    assert model_problems(config, "cpu") == [] and model_problems(config, "cuda") == []
    del config["topk_method"]
    config["scoring_func"] = "softmax"
    problems = model_problems(config, None)
    assert len(problems) == 2
    assert "topk_method is None" in problems[0] and "topk_method='noaux_tc'" in problems[0]
    assert "scoring_func='sigmoid'" in problems[1]


def test_sizes_vllms_cpu_kernels_do_not_take_are_refused_on_a_cpu_only():
    small_heads = as_json(family_config("qwen3", head_dim=16))
    (problem,) = model_problems(small_heads, "cpu")
    assert "head size 16" in problem and "rollout.engine=hf" in problem
    assert model_problems(small_heads, "cuda") == []
    mistral = as_json(family_config("mistral", head_dim=None, hidden_size=96, num_attention_heads=4))
    assert "head size 24" in model_problems(mistral, "cpu")[0]  # hidden / heads where head_dim is unset
    latent = as_json(family_config("deepseek_v3", kv_lora_rank=64))
    assert "kv_lora_rank + qk_rope_head_dim = 128" in model_problems(latent, "cpu")[0]


def test_mla_models_take_cpu_mla_attention_and_pytorchs_rotary_on_a_cpu():
    mla = as_json(family_config("deepseek_v3"))
    assert default_engine_kwargs(mla, "cpu") == {
        "attention_backend": "CPU_MLA",
        "compilation_config": {"custom_ops": ["-rotary_embedding"]},
    }
    assert default_engine_kwargs(mla, "cuda") == {}
    assert default_engine_kwargs(as_json(family_config("llama3")), "cpu") == {}


def test_engine_kwargs_reach_the_config_from_tandems_and_verls_keys_and_tandems_own_are_refused(tmp_path):
    cfg = load_config(
        "grpo", ["rollout.engine_kwargs.max_num_seqs=8", "rollout.engine_kwargs.enforce_eager=true"]
    )
    assert cfg.rollout.engine_kwargs == {"max_num_seqs": 8, "enforce_eager": True}
    verl = translate_overrides(
        [
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.max_num_seqs=8",
            "+actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=fa3",
        ]
    )
    assert verl.overrides == ["rollout.engine_kwargs.max_num_seqs=8"]
    assert [key for key, _ in verl.no_effect] == [
        "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=fa3"
    ]
    problems = engine_kwargs_problems({"seed": 1, "tensor_parallel_size": 2, "max_num_seqs": 8})
    assert len(problems) == 2
    assert "rollout.engine_kwargs.seed" in problems[0] and "trainer.seed" in problems[0]
    assert "rollout.tensor_parallel" in problems[1]


def test_engine_kwargs_older_vllm_names_are_read_as_todays_and_unknown_names_are_named():
    """verl's vision scripts pass vLLM's older disable_mm_preprocessor_cache, which vLLM 0.32 refuses: it is read
    as today's mm_processor_cache_gb=0 (False: vLLM's default, left out); a name vLLM's engine lacks is a
    start-up problem naming it, with the close name, before the worker's vLLM would fail on it."""
    assert current_engine_kwargs({"disable_mm_preprocessor_cache": True, "max_num_seqs": 8}) == {
        "mm_processor_cache_gb": 0,
        "max_num_seqs": 8,
    }
    assert current_engine_kwargs({"disable_mm_preprocessor_cache": False}) == {}
    assert current_engine_kwargs({"disable_mm_preprocessor_cache": True, "mm_processor_cache_gb": 4}) == {
        "mm_processor_cache_gb": 4
    }
    pytest.importorskip("vllm")
    assert engine_kwargs_problems({"disable_mm_preprocessor_cache": True, "max_num_seqs": 8}) == []
    (problem,) = engine_kwargs_problems({"max_num_seq": 8})
    assert problem.startswith(
        "rollout.engine_kwargs.max_num_seq: not an argument of the installed vLLM's engine"
    )
    assert "did you mean max_num_seqs?" in problem


def test_the_start_up_checks_name_what_vllm_would_refuse(tmp_path):
    pytest.importorskip("vllm")
    from tandem.models.tiny_families import save_family
    from tandem.trainer.start_checks.available import check_available

    folder = save_family("deepseek_v3", tmp_path / "ds", topk_method=None)
    cfg = load_config(
        "grpo",
        [
            f"actor.model_path={folder}",
            "trainer.device=cpu",
            "rollout.engine=vllm",
            "rollout.engine_kwargs.dtype=half",
        ],
    )
    with pytest.raises(ConfigError) as error:
        check_available(cfg)
    text = str(error.value)
    assert "rollout.engine_kwargs.dtype" in text
    assert f"actor.model_path={folder} for vLLM: config.json's topk_method is None" in text
    check_available(load_config("grpo", [f"actor.model_path={folder}", "rollout.engine=hf"]))


def test_a_length_past_the_models_positions_is_named_at_start_up(tmp_path):
    """vLLM refuses a max_model_len (prompt + response) above config.json's max_position_embeddings, in the
    worker, where the message is lost to Ray (its pydantic error does not pickle): checked before the workers."""
    pytest.importorskip("vllm")
    from tandem.models.tiny_families import save_family
    from tandem.trainer.start_checks.available import check_available

    folder = save_family("qwen3", tmp_path / "qwen3", max_position_embeddings=256)
    base = [f"actor.model_path={folder}", "trainer.device=cpu", "rollout.engine=vllm"]
    with pytest.raises(
        ConfigError, match=r"max_response_length = 272 is more than its max_position_embeddings=256"
    ):
        check_available(
            load_config("grpo", [*base, "data.max_prompt_length=256", "data.max_response_length=16"])
        )
    check_available(load_config("grpo", [*base, "data.max_prompt_length=240", "data.max_response_length=16"]))
    check_available(load_config("grpo", [*base, "data.max_prompt_length=256", "rollout.engine=hf"]))
