"""models/tp_cuts.py against vLLM's own loaders: for every rank of a tensor-parallel engine, the layer a
weight loads into ends up the same from the whole tensor and from `loader_input` of the rank's cut alone
(NaN elsewhere). vLLM's layers are built with a faked tensor-parallel rank and size (the loaders read
nothing else of the process group); this test fails when vLLM changes how it cuts."""

from __future__ import annotations

from contextlib import ExitStack
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from tandem.models.tp_cuts import TensorParallelCuts, loader_input

HIDDEN, HEAD_DIM, HEADS, INTERMEDIATE, VOCAB = 64, 16, 4, 96, 200  # 200: not a multiple of vLLM's 64


def fake_tensor_parallel(rank: int, size: int) -> ExitStack:
    import vllm.model_executor.layers.linear as linear
    import vllm.model_executor.layers.vocab_parallel_embedding as embedding
    import vllm.model_executor.parameter as parameter

    stack = ExitStack()
    for module in (linear, embedding, parameter):
        for fn, value in (
            ("get_tensor_model_parallel_rank", rank),
            ("get_tensor_model_parallel_world_size", size),
        ):
            if hasattr(module, fn):
                stack.enter_context(mock.patch.object(module, fn, return_value=value))
    return stack


def layers(kv_heads: int) -> dict[str, tuple]:
    """HF name -> (vLLM layer, its parameter, shard id) as vLLM's Llama-family models load them."""
    from vllm.model_executor.layers.linear import (
        MergedColumnParallelLinear,
        QKVParallelLinear,
        RowParallelLinear,
    )
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    f32 = {"params_dtype": torch.float32}
    qkv = QKVParallelLinear(HIDDEN, HEAD_DIM, HEADS, kv_heads, bias=True, **f32)
    gate_up = MergedColumnParallelLinear(HIDDEN, [INTERMEDIATE] * 2, bias=False, **f32)
    o_proj = RowParallelLinear(HEADS * HEAD_DIM, HIDDEN, bias=False, **f32)
    down = RowParallelLinear(INTERMEDIATE, HIDDEN, bias=False, **f32)
    embed, head = VocabParallelEmbedding(VOCAB, HIDDEN, **f32), ParallelLMHead(VOCAB, HIDDEN, **f32)
    out = {
        f"model.layers.0.self_attn.{p}_proj.{w}": (qkv, getattr(qkv, w), p)
        for p in "qkv"
        for w in ("weight", "bias")
    }
    out["model.layers.0.mlp.gate_proj.weight"] = (gate_up, gate_up.weight, 0)
    out["model.layers.0.mlp.up_proj.weight"] = (gate_up, gate_up.weight, 1)
    out["model.layers.0.self_attn.o_proj.weight"] = (o_proj, o_proj.weight, None)
    out["model.layers.0.mlp.down_proj.weight"] = (down, down.weight, None)
    out["model.embed_tokens.weight"] = (embed, embed.weight, None)
    out["lm_head.weight"] = (head, head.weight, None)
    return out


HF_SHAPES = {
    "q_proj.weight": lambda kv: (HEADS * HEAD_DIM, HIDDEN),
    "q_proj.bias": lambda kv: (HEADS * HEAD_DIM,),
    "k_proj.weight": lambda kv: (kv * HEAD_DIM, HIDDEN),
    "k_proj.bias": lambda kv: (kv * HEAD_DIM,),
    "v_proj.weight": lambda kv: (kv * HEAD_DIM, HIDDEN),
    "v_proj.bias": lambda kv: (kv * HEAD_DIM,),
    "gate_proj.weight": lambda kv: (INTERMEDIATE, HIDDEN),
    "up_proj.weight": lambda kv: (INTERMEDIATE, HIDDEN),
    "o_proj.weight": lambda kv: (HIDDEN, HEADS * HEAD_DIM),
    "down_proj.weight": lambda kv: (HIDDEN, INTERMEDIATE),
    "embed_tokens.weight": lambda kv: (VOCAB, HIDDEN),
    "lm_head.weight": lambda kv: (VOCAB, HIDDEN),
}


def load(layer, param, shard, tensor) -> torch.Tensor:
    param.data.zero_()
    if shard is None:
        layer.weight_loader(param, tensor)
    else:
        layer.weight_loader(param, tensor, shard)
    return param.data.clone()


@pytest.mark.parametrize(("tp", "kv_heads"), [(2, 2), (2, 1), (4, 4), (4, 2), (4, 1)])
def test_vllm_loads_the_same_layer_from_the_rank_s_cut_alone(tp, kv_heads):
    pytest.importorskip("vllm")
    config = SimpleNamespace(
        model_type="qwen2",
        num_attention_heads=HEADS,
        num_key_value_heads=kv_heads,
        head_dim=HEAD_DIM,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        vocab_size=VOCAB,
    )
    cuts = TensorParallelCuts.for_model(config, tp, world_size=tp)
    generator = torch.Generator().manual_seed(0)
    for rank in range(tp):
        with fake_tensor_parallel(rank, tp):
            for name, (layer, param, shard) in layers(kv_heads).items():
                shape = next(fn(kv_heads) for suffix, fn in HF_SHAPES.items() if name.endswith(suffix))
                whole = torch.randn(shape, generator=generator)
                cut = cuts.cut(name, shape, rank)
                assert cut is not None, name  # every one of these is cut
                piece = whole.narrow(cut.dim, cut.start, cut.length)
                want = load(layer, param, shard, whole)
                got = load(layer, param, shard, loader_input(piece, cut, shape))
                assert torch.equal(got, want), (tp, kv_heads, rank, name, cut)


def test_unknown_architectures_and_one_rank_engines_are_synced_whole():
    config = SimpleNamespace(model_type="gemma2", num_attention_heads=4, hidden_size=64, intermediate_size=96)
    assert TensorParallelCuts.for_model(config, 2, world_size=2) is None
    assert TensorParallelCuts.for_model(SimpleNamespace(model_type="qwen2"), 1, world_size=2) is None


def test_a_tensor_parallel_size_vllm_cannot_split_by_is_named():
    config = SimpleNamespace(
        model_type="llama",
        num_attention_heads=6,
        num_key_value_heads=3,
        hidden_size=96,
        intermediate_size=128,
        vocab_size=64,
    )
    with pytest.raises(
        ValueError, match="rollout.tensor_parallel=4 does not divide the model's attention heads"
    ):
        TensorParallelCuts.for_model(config, 4, world_size=4)
    config.num_attention_heads = 12
    with pytest.raises(ValueError, match="rollout.tensor_parallel=4 and the model's 3 KV heads"):
        TensorParallelCuts.for_model(config, 4, world_size=4)
