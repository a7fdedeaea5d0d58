"""Hugging Face <-> megatron-core conversion (tandem.engine.megatron.convert): pure tensor code, exact."""

from __future__ import annotations

import copy

import pytest
import torch

from tandem.engine.megatron import convert
from tandem.engine.megatron.convert import Shapes, Slot
from tandem.models.tiny import build_model, build_tokenizer

GQA = Shapes(num_heads=4, num_query_groups=2, head_dim=3)
MHA = Shapes(num_heads=4, num_query_groups=4, head_dim=3)
HIDDEN = 5


def _qkv(shapes: Shapes, *trailing: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v with distinct values everywhere: [rows, *trailing]."""
    rows = [shapes.num_heads * shapes.head_dim] + [shapes.num_query_groups * shapes.head_dim] * 2
    width = trailing[0] if trailing else 1
    flat = torch.arange(sum(rows) * width, dtype=torch.float32)
    q, k, v = (
        t.reshape(n, *trailing) for t, n in zip(flat.split([n * width for n in rows]), rows, strict=True)
    )
    return q, k, v


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def tied_lm(tokenizer):
    return build_model(tokenizer, num_layers=4)


@pytest.fixture(scope="module")
def untied_lm(tokenizer):
    return build_model(tokenizer, num_layers=4, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def value_model(tokenizer):
    return build_model(tokenizer, num_layers=4, num_labels=1)


# --- fuse_qkv / split_qkv ---------------------------------------------------------------------------


@pytest.mark.parametrize("shapes", [GQA, MHA], ids=["gqa", "mha"])
@pytest.mark.parametrize("trailing", [(HIDDEN,), ()], ids=["weight", "bias"])
def test_fuse_split_qkv_round_trip_is_exact(shapes, trailing):
    q, k, v = _qkv(shapes, *trailing)
    fused = convert.fuse_qkv(q, k, v, shapes)
    rows = (shapes.num_heads + 2 * shapes.num_query_groups) * shapes.head_dim
    assert fused.shape == (rows, *trailing)
    q2, k2, v2 = convert.split_qkv(fused, shapes)
    assert torch.equal(q2, q)
    assert torch.equal(k2, k)
    assert torch.equal(v2, v)


@pytest.mark.parametrize("trailing", [(2,), ()], ids=["weight", "bias"])
def test_fuse_qkv_layout_is_per_group_q_heads_then_k_then_v(trailing):
    shapes = Shapes(num_heads=4, num_query_groups=2, head_dim=1)

    def rows(values: list[float]) -> torch.Tensor:
        t = torch.tensor(values)
        return torch.stack([t, t + 0.5], dim=1) if trailing else t

    q0, q1, q2, q3 = 0.0, 1.0, 2.0, 3.0
    k0, k1 = 10.0, 11.0
    v0, v1 = 20.0, 21.0
    q, k, v = rows([q0, q1, q2, q3]), rows([k0, k1]), rows([v0, v1])
    expected = rows([q0, q1, k0, v0, q2, q3, k1, v1])
    assert torch.equal(convert.fuse_qkv(q, k, v, shapes), expected)


# --- to_shard / from_shards -------------------------------------------------------------------------


def _full_tensors(kind: str, shapes: Shapes) -> tuple[Slot, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    if kind == "col":
        return Slot("m", ("a",), "col"), [torch.randn(8, HIDDEN, generator=g)]
    if kind == "row":
        return Slot("m", ("a",), "row"), [torch.randn(HIDDEN, 8, generator=g)]
    if kind == "fc1":
        return Slot("m", ("gate", "up"), "fc1"), [torch.randn(8, HIDDEN, generator=g) for _ in range(2)]
    if kind == "rep":
        return Slot("m", ("a",), "rep"), [torch.randn(HIDDEN, generator=g)]
    return Slot("m", ("q", "k", "v"), "qkv"), list(_qkv(shapes, HIDDEN))


QKV_SHAPES = Shapes(num_heads=8, num_query_groups=4, head_dim=3)


@pytest.mark.parametrize("tp_size", [1, 2, 4])
@pytest.mark.parametrize("kind", ["col", "row", "qkv", "fc1", "rep"])
def test_to_shard_then_from_shards_is_exact(kind, tp_size):
    slot, full = _full_tensors(kind, QKV_SHAPES)
    shards = [convert.to_shard(slot, full, QKV_SHAPES, r, tp_size) for r in range(tp_size)]
    back = convert.from_shards(slot, shards, QKV_SHAPES)
    assert len(back) == len(full)
    for got, want in zip(back, full, strict=True):
        assert torch.equal(got, want)
    if kind != "rep":
        assert sum(s.numel() for s in shards) == sum(t.numel() for t in full)


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_fc1_shard_is_gate_chunk_then_up_chunk(tp_size):
    slot, (gate, up) = _full_tensors("fc1", QKV_SHAPES)
    for r in range(tp_size):
        shard = convert.to_shard(slot, [gate, up], QKV_SHAPES, r, tp_size)
        assert torch.equal(shard, torch.cat([gate.chunk(tp_size)[r], up.chunk(tp_size)[r]]))


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_qkv_shard_holds_whole_query_groups(tp_size):
    """Rank r's qkv cut is the fused layout of exactly its query groups (megatron's TP layout)."""
    q, k, v = _qkv(QKV_SHAPES, HIDDEN)
    slot = Slot("m", ("q", "k", "v"), "qkv")
    local = Shapes(
        QKV_SHAPES.num_heads // tp_size, QKV_SHAPES.num_query_groups // tp_size, QKV_SHAPES.head_dim
    )
    for r in range(tp_size):
        want = convert.fuse_qkv(q.chunk(tp_size)[r], k.chunk(tp_size)[r], v.chunk(tp_size)[r], local)
        assert torch.equal(convert.to_shard(slot, [q, k, v], QKV_SHAPES, r, tp_size), want)


@pytest.mark.parametrize("tp_size", [1, 2])
def test_every_slot_of_the_tiny_model_round_trips(tied_lm, tp_size):
    config = tied_lm.config
    state = tied_lm.state_dict()
    shapes = convert.shapes_of(config)
    for slot in convert.slots(
        config, head="lm", layer_offset=0, num_local_layers=4, first_stage=True, last_stage=True
    ):
        full = [state[name] for name in slot.hf]
        shards = [convert.to_shard(slot, full, shapes, r, tp_size) for r in range(tp_size)]
        for got, want in zip(convert.from_shards(slot, shards, shapes), full, strict=True):
            assert torch.equal(got, want), slot.megatron


# --- slots ------------------------------------------------------------------------------------------


def _hf_names(slot_list: list[Slot]) -> set[str]:
    return {name for slot in slot_list for name in slot.hf}


def _one_stage(config, head: str) -> list[Slot]:
    return convert.slots(
        config, head=head, layer_offset=0, num_local_layers=4, first_stage=True, last_stage=True
    )


def _two_stages(config, head: str) -> tuple[list[Slot], list[Slot]]:
    return tuple(
        convert.slots(
            config,
            head=head,
            layer_offset=offset,
            num_local_layers=2,
            first_stage=offset == 0,
            last_stage=offset == 2,
        )
        for offset in (0, 2)
    )


def test_one_stage_tied_lm_slots_cover_the_state_dict(tied_lm):
    assert tied_lm.config.tie_word_embeddings
    stage = _one_stage(tied_lm.config, "lm")
    assert _hf_names(stage) == set(tied_lm.state_dict()) - {"lm_head.weight"}
    megatron_names = [s.megatron for s in stage]
    assert len(megatron_names) == len(set(megatron_names))
    assert "output_layer.weight" not in megatron_names  # one stage shares the embedding


def test_one_stage_value_model_slots_cover_the_state_dict(value_model):
    stage = _one_stage(value_model.config, "value")
    names = _hf_names(stage)
    assert names == set(value_model.state_dict())
    assert {"score.weight", "score.bias"} <= names
    by_name = {s.megatron: s for s in stage}
    assert by_name["output_layer.weight"] == Slot("output_layer.weight", ("score.weight",), "rep")
    assert by_name["output_layer.bias"] == Slot("output_layer.bias", ("score.bias",), "rep")


def test_two_stage_tied_lm_slots_cover_the_state_dict(tied_lm):
    first, last = _two_stages(tied_lm.config, "lm")
    assert _hf_names(first) | _hf_names(last) == set(tied_lm.state_dict()) - {"lm_head.weight"}
    output = [s for s in last if s.megatron == "output_layer.weight"]
    assert output == [Slot("output_layer.weight", ("model.embed_tokens.weight",), "col")]
    assert "embedding.word_embeddings.weight" not in {s.megatron for s in last}
    assert "decoder.final_layernorm.weight" not in {s.megatron for s in first}
    # megatron numbers layers from 0 on every stage; the second stage's layer 0 is global layer 2
    by_name = {s.megatron: s for s in last}
    assert by_name["decoder.layers.0.input_layernorm.weight"].hf == ("model.layers.2.input_layernorm.weight",)
    assert not any(s.megatron.startswith("decoder.layers.2.") for s in last)


def test_two_stage_value_model_slots_cover_the_state_dict(value_model):
    first, last = _two_stages(value_model.config, "value")
    assert _hf_names(first) | _hf_names(last) == set(value_model.state_dict())
    assert {"score.weight", "score.bias"} <= _hf_names(last)


def test_untied_lm_has_an_lm_head_slot(untied_lm):
    assert not untied_lm.config.tie_word_embeddings
    stage = _one_stage(untied_lm.config, "lm")
    assert _hf_names(stage) == set(untied_lm.state_dict())
    assert Slot("output_layer.weight", ("lm_head.weight",), "col") in stage
    first, last = _two_stages(untied_lm.config, "lm")
    assert Slot("output_layer.weight", ("lm_head.weight",), "col") in last
    assert _hf_names(first) | _hf_names(last) == set(untied_lm.state_dict())


def test_qwen2_slots_carry_qkv_biases(tied_lm):
    stage = _one_stage(tied_lm.config, "lm")
    bias = {s.megatron: s for s in stage}["decoder.layers.3.self_attention.linear_qkv.bias"]
    attn = "model.layers.3.self_attn"
    assert bias.hf == (f"{attn}.q_proj.bias", f"{attn}.k_proj.bias", f"{attn}.v_proj.bias")
    assert bias.kind == "qkv"


# --- check_supported / transformer_config_kwargs ---------------------------------------------------


def test_check_supported_rejects_an_unsupported_model_type(tied_lm):
    config = copy.deepcopy(tied_lm.config)
    config.model_type = "gpt2"
    with pytest.raises(ValueError, match="model_type='gpt2'"):
        convert.check_supported(config, 1, 1)


def test_check_supported_rejects_kv_heads_not_divisible_by_tp(tied_lm):
    assert tied_lm.config.num_key_value_heads == 2
    with pytest.raises(ValueError, match="num_key_value_heads=2"):
        convert.check_supported(tied_lm.config, 4, 1)


def test_check_supported_rejects_layers_not_divisible_by_pp(tied_lm):
    assert tied_lm.config.num_hidden_layers == 4
    with pytest.raises(ValueError, match="num_hidden_layers=4"):
        convert.check_supported(tied_lm.config, 1, 3)


@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 2), (2, 4), (1, 2)])
def test_check_supported_accepts_the_tiny_model(tied_lm, tp, pp):
    convert.check_supported(tied_lm.config, tp, pp)


def test_transformer_config_kwargs_map_the_qwen2_config(tied_lm):
    config = tied_lm.config
    kwargs = convert.transformer_config_kwargs(config)
    assert kwargs["num_layers"] == config.num_hidden_layers == 4
    assert kwargs["hidden_size"] == config.hidden_size
    assert kwargs["ffn_hidden_size"] == config.intermediate_size
    assert kwargs["num_attention_heads"] == config.num_attention_heads
    assert kwargs["num_query_groups"] == config.num_key_value_heads == 2
    assert kwargs["kv_channels"] == config.hidden_size // config.num_attention_heads
    assert kwargs["layernorm_epsilon"] == config.rms_norm_eps
    assert kwargs["add_qkv_bias"] is True
    assert kwargs["add_bias_linear"] is False
    assert kwargs["gated_linear_unit"] is True
    assert kwargs["normalization"] == "RMSNorm"


def test_llama_without_attention_bias_has_no_qkv_bias(tied_lm):
    config = copy.deepcopy(tied_lm.config)
    config.model_type = "llama"
    config.attention_bias = False
    assert convert.transformer_config_kwargs(config)["add_qkv_bias"] is False
    stage = _one_stage(config, "lm")
    assert not any(s.megatron.endswith("linear_qkv.bias") for s in stage)


def test_a_model_the_virtual_stages_cannot_split_fails_before_the_workers(tmp_path):
    """4 layers over PP=2 x VP=4 chunks: a start-up error naming the folder's key and both sizes."""
    from tandem.config import ConfigError, load_config
    from tandem.models.tiny import save_tiny
    from tandem.trainer.start_checks.available import check_available

    model = save_tiny(tmp_path / "tiny")  # 4 layers
    base = [f"actor.model_path={model}", "actor.strategy=megatron", "trainer.workers_per_node=2"]
    base.append("actor.megatron.pipeline_parallel=2")
    check_available(load_config("grpo", [*base, "actor.megatron.virtual_pipeline=2"]))
    with pytest.raises(ConfigError, match=r"actor.model_path=.*pipeline_parallel x virtual_pipeline = 8"):
        check_available(load_config("grpo", [*base, "actor.megatron.virtual_pipeline=4"]))


# --- the current families: Qwen3 (q/k norms), Llama 3 (llama3 RoPE), Qwen3-MoE ----------------------------------


@pytest.fixture(scope="module")
def families():
    from .megatron_family_scenarios import family_config

    return {name: family_config(name) for name in ("llama3", "qwen3", "qwen3_moe")}


@pytest.mark.parametrize("name", ["llama3", "qwen3", "qwen3_moe"])
def test_the_current_families_slots_cover_their_state_dicts(families, name):
    from transformers import AutoModelForCausalLM

    config = families[name]
    names = set(AutoModelForCausalLM.from_config(config).state_dict())
    if config.tie_word_embeddings:
        names.discard("lm_head.weight")
    one = convert.slots(
        config, head="lm", layer_offset=0, num_local_layers=2, first_stage=True, last_stage=True
    )
    assert _hf_names(one) == names
    stages = [
        convert.slots(
            config, head="lm", layer_offset=i, num_local_layers=1, first_stage=i == 0, last_stage=i == 1
        )
        for i in (0, 1)
    ]
    assert _hf_names(stages[0]) | _hf_names(stages[1]) == names
    convert.check_supported(config, 1, 2)


def test_qwen3_q_and_k_norms_are_megatron_s_qk_layernorms(families):
    config = families["qwen3"]
    by_name = {s.megatron: s for s in _one_stage_of(config)}
    attn = "model.layers.1.self_attn"
    assert by_name["decoder.layers.1.self_attention.q_layernorm.weight"] == Slot(
        "decoder.layers.1.self_attention.q_layernorm.weight", (f"{attn}.q_norm.weight",), "rep"
    )
    assert by_name["decoder.layers.1.self_attention.k_layernorm.weight"].hf == (f"{attn}.k_norm.weight",)
    kwargs = convert.transformer_config_kwargs(config)
    assert kwargs["qk_layernorm"] is True and kwargs["add_qkv_bias"] is False
    assert kwargs["kv_channels"] == config.head_dim == 32 != config.hidden_size // config.num_attention_heads
    assert convert.transformer_config_kwargs(families["llama3"])["qk_layernorm"] is False


def _one_stage_of(config) -> list[Slot]:
    return convert.slots(
        config,
        head="lm",
        layer_offset=0,
        num_local_layers=config.num_hidden_layers,
        first_stage=True,
        last_stage=True,
    )


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_qwen3_moe_experts_and_router(families, norm_topk_prob):
    config = copy.deepcopy(families["qwen3_moe"])
    config.norm_topk_prob = norm_topk_prob
    kwargs = convert.moe_config_kwargs(config, 2)
    assert kwargs["num_moe_experts"] == 4 and kwargs["moe_router_topk"] == 2
    assert kwargs["moe_ffn_hidden_size"] == config.moe_intermediate_size == 32
    # softmax over all experts, top k, renormalised = top k of the logits, then their softmax (megatron's default)
    assert kwargs["moe_router_pre_softmax"] is (not norm_topk_prob)


def test_mixtral_renormalises_its_top_k(tied_lm):
    from transformers import AutoConfig

    config = AutoConfig.for_model("mixtral", num_local_experts=4, num_experts_per_tok=2, sliding_window=None)
    kwargs = convert.moe_config_kwargs(config, 1)
    assert kwargs["moe_router_pre_softmax"] is False
    assert kwargs["moe_ffn_hidden_size"] == config.intermediate_size


def test_llama3_rope_frequencies_are_transformers(families):
    from transformers import AutoModelForCausalLM

    config = families["llama3"]
    model = AutoModelForCausalLM.from_config(config)
    assert torch.equal(convert.rotary_inv_freq(config), model.model.rotary_emb.inv_freq)
    assert convert.rotary_inv_freq(families["qwen3"]) is None  # the default RoPE: megatron's own


def test_megatron_s_own_llama3_scaling_fixes_the_original_context():
    """Why the engine sets the frequencies itself: megatron-core's RotaryEmbedding(rope_scaling=True) takes the factor
    alone and holds Llama 3.1's other constants (1, 4, 8192). This test fails when megatron reads them from its
    arguments (then GPTModel's own rope_scaling could do)."""
    pytest.importorskip("megatron.core")
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from transformers import LlamaConfig

    def ours(original: int) -> torch.Tensor:
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
        rope["original_max_position_embeddings"] = original
        config = LlamaConfig(hidden_size=512, num_attention_heads=4, rope_scaling=rope, rope_theta=500000.0)
        return convert.rotary_inv_freq(config)

    theirs = RotaryEmbedding(
        128, 1.0, rotary_base=500000, rope_scaling=True, rope_scaling_factor=8.0, use_cpu_initialization=True
    ).inv_freq
    torch.testing.assert_close(theirs, ours(8192), rtol=1e-6, atol=0)  # Llama 3.1's constants: the same
    assert not torch.allclose(theirs, ours(64))


def test_check_supported_names_what_megatron_does_not_build_once_with_fsdp(families):
    config = copy.deepcopy(families["llama3"])
    config.rope_parameters = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}
    config.hidden_act = "gelu"
    with pytest.raises(ValueError) as err:
        convert.check_supported(config, 1, 1)
    message = str(err.value)
    assert "rope_type='yarn'" in message and "hidden_act='gelu'" in message
    assert message.count("actor.strategy=fsdp") == 1
    # the layout's problems follow in the same error; they name the sizes to change, not another engine
    with pytest.raises(
        ValueError, match=r"use actor.strategy=fsdp for it\. .*num_hidden_layers=2 is not a multiple"
    ):
        convert.check_supported(config, 1, 4)


def test_check_supported_refuses_dense_layers_between_moe_layers(families):
    for field, value in (("mlp_only_layers", [1]), ("decoder_sparse_step", 2)):
        config = copy.deepcopy(families["qwen3_moe"])
        setattr(config, field, value)
        with pytest.raises(ValueError, match=f"{field}=.*actor.strategy=fsdp"):
            convert.check_supported(config, 1, 1)
    sliding = copy.deepcopy(families["qwen3"])
    sliding.layer_types = ["sliding_attention", "full_attention"]
    with pytest.raises(ValueError, match="sliding window"):
        convert.check_supported(sliding, 1, 1)


def test_start_checks_name_a_refused_model_once_in_a_run_without_a_critic(tmp_path):
    """GRPO has no critic: its (defaulted) critic.model_path is not checked, so the actor's problem is not repeated."""
    import json

    from tandem.config import ConfigError, load_config
    from tandem.models.tiny import save_tiny
    from tandem.trainer.start_checks.available import check_available

    model = save_tiny(tmp_path / "tiny")
    config = json.loads((model / "config.json").read_text())
    config["hidden_act"] = "gelu"
    (model / "config.json").write_text(json.dumps(config))
    overrides = [f"actor.model_path={model}", "actor.strategy=megatron"]
    with pytest.raises(ConfigError) as err:
        check_available(load_config("grpo", overrides))
    message = str(err.value)
    assert message.count("hidden_act='gelu'") == 1 and "critic.model_path" not in message
    assert "actor.model_path=" in message and "actor.strategy=fsdp" in message
    with pytest.raises(ConfigError) as err:  # PPO's critic reads the same folder: one line still
        check_available(load_config("ppo", overrides))
    assert str(err.value).count("hidden_act='gelu'") == 1
