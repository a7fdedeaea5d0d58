"""Packed attention kernels (engine/attention.py, `actor.fsdp.attn_implementation`): each equals sdpa run on
every sequence alone, by hand on random tensors (values, and gradients where the kernel has a backward here)
and through a transformers model, packed as one row against the padded batch; the FSDP2 engine with
`sdpa_split` on 1 and 2 ranks equals the engine with today's sdpa (tests in test_lm_head.py's runs, which
this file shares). `varlen` needs CUDA: its tests are marked gpu. float32 on CPU, asserted at 1e-5."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from tandem.data.packing import pack_model_inputs
from tandem.engine import attention
from tandem.models.tiny import save_tiny

from . import lm_head_scenarios as sc

CPU = torch.device("cpu")


def per_sequence(q, k, v, lengths):
    """sdpa on each sequence alone, the rows read one after the other: [B, S, H, D]."""
    b, h, s, d = q.shape
    flat = [t.transpose(0, 1).reshape(1, t.shape[1], b * s, d) for t in (q, k, v)]
    out, start = [], 0
    for n in lengths:
        parts = [t[:, :, start : start + n] for t in flat]
        out.append(F.scaled_dot_product_attention(*parts, is_causal=True, enable_gqa=k.shape[1] != h))
        start += n
    return torch.cat(out, dim=2).view(h, b, s, d).permute(1, 2, 0, 3)


def random_qkv(rows: int, width: int, heads: int = 4, kv_heads: int = 2, grad: bool = False):
    gen = torch.Generator().manual_seed(rows * 100 + width)
    shapes = [(rows, heads, width, 8), (rows, kv_heads, width, 8), (rows, kv_heads, width, 8)]
    return [torch.randn(shape, generator=gen).requires_grad_(grad) for shape in shapes]


def test_sequence_bounds_from_packed_position_ids():
    positions = torch.tensor([[0, 1, 2, 0, 1], [0, 1, 2, 3, 0]])  # rows [3, 2] and [4, 1], read in turn
    cu, longest = attention.sequence_bounds(positions)
    assert cu.tolist() == [0, 3, 5, 9, 10] and cu.dtype == torch.int32 and longest == 4
    kwargs = attention.varlen_kwargs(positions)
    assert kwargs["cu_seq_lens_q"] is kwargs["cu_seq_lens_k"] and kwargs["max_length_q"] == 4


@pytest.mark.parametrize("rows, lengths", [(1, [5, 9, 1, 7]), (2, [3, 8, 5, 6])])
def test_sdpa_split_equals_each_sequence_alone_values_and_gradients(rows, lengths):
    width = sum(lengths) // rows
    q, k, v = random_qkv(rows, width, grad=True)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    got = attention._split(q, k, v, cu, max(lengths), None)
    expected = per_sequence(q, k, v, lengths)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    upstream = torch.randn_like(expected)
    got_grads = torch.autograd.grad((got * upstream).sum(), [q, k, v])
    expected_grads = torch.autograd.grad((expected * upstream).sum(), [q, k, v])
    for a, b in zip(got_grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    # and not the whole row attended: the first token of the second sequence sees only itself
    torch.testing.assert_close(
        got[0, lengths[0]], v.transpose(1, 2)[0, lengths[0]].repeat_interleave(2, dim=0), rtol=0, atol=1e-6
    )


def test_bounds_made_once_per_forward_are_remade_for_the_next():
    """The layers of one forward share the bounds on the host; the next forward's (same total, other
    sequences) are its own, even where its bounds tensor reuses the freed one's memory."""
    q, k, v = random_qkv(1, 12)
    for lengths in ([4, 8], [9, 3], [4, 8]):
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        for _layer in range(2):
            got = attention._split(q, k, v, cu, max(lengths), None)
            torch.testing.assert_close(got, per_sequence(q, k, v, lengths), rtol=0, atol=1e-6)
        del cu


def test_flex_attention_forward_equals_each_sequence_alone_on_cpu():
    """flex_attention has no backward on the CPU (torch 2.13): its forward is checked here, the rest on a GPU."""
    lengths = [5, 9, 1, 7, 130]  # a sequence longer than flex's 128-token block
    q, k, v = random_qkv(1, sum(lengths))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    with torch.no_grad():
        got = attention._flex(q, k, v, cu, max(lengths), None)
    torch.testing.assert_close(got, per_sequence(q, k, v, lengths), rtol=0, atol=1e-5)


def test_resolve_picks_and_refuses():
    assert attention.resolve("auto", CPU) == "sdpa"  # the CPU keeps today's path
    assert attention.resolve("sdpa", CPU) == "sdpa"
    assert attention.resolve("sdpa_split", CPU) == "tandem_sdpa_split"
    assert attention.resolve("flex_attention", CPU) == "tandem_flex_attention"
    with pytest.raises(ValueError, match="actor.fsdp.attn_implementation=varlen runs on CUDA only"):
        attention.resolve("varlen", CPU)
    with pytest.raises(ValueError, match="flash_attention_2 needs a CUDA device"):
        attention.resolve("flash_attention_2", CPU)
    with pytest.raises(ValueError, match="flex_attention trains on CUDA only"):
        attention.check_trainable("tandem_flex_attention", CPU, "actor.fsdp.attn_implementation")
    attention.check_trainable("tandem_sdpa_split", CPU, "actor.fsdp.attn_implementation")  # no error


def test_auto_on_cuda_prefers_flash_attn_then_torch_kernels(monkeypatch):
    """CUDA is not here: what auto picks there, with flash-attn installed or not, each torch kernel's
    probe passing or failing (the probes themselves run in the gpu tests)."""
    import transformers.utils

    cuda = torch.device("cuda", 0)
    for flash, runs, expected in (
        (True, {"varlen", "flex_attention"}, "flash_attention_2"),
        (False, {"varlen", "flex_attention"}, "tandem_varlen"),
        (False, {"flex_attention"}, "tandem_flex_attention"),
        (False, set(), "sdpa"),
    ):
        monkeypatch.setattr(transformers.utils, "is_flash_attn_2_available", lambda f=flash: f)
        monkeypatch.setattr(attention, "_runs", lambda kernel, device, r=runs: kernel in r)
        assert attention.resolve("auto", cuda) == expected


def test_a_float32_model_on_cuda_gets_no_flash_kernel(monkeypatch):
    """The flash kernels (flash-attn's and torch's varlen) take fp16 / bf16 only: under float32 compute auto
    passes them over, and asking for one is an error naming the key and the dtype."""
    import transformers.utils

    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(transformers.utils, "is_flash_attn_2_available", lambda: True)
    for runs, expected in (({"varlen", "flex_attention"}, "tandem_flex_attention"), ({"varlen"}, "sdpa")):
        monkeypatch.setattr(attention, "_runs", lambda kernel, device, r=runs: kernel in r)
        assert attention.resolve("auto", cuda, torch.float32) == expected
        assert attention.resolve("auto", cuda, torch.float16) == "flash_attention_2"
    for kernel in ("varlen", "flash_attention_2"):
        with pytest.raises(ValueError, match=rf"attn_implementation={kernel}: .* computes in torch.float32"):
            attention.resolve(kernel, cuda, torch.float32)
    monkeypatch.setattr(attention, "_runs", lambda kernel, device: True)
    assert attention.resolve("sdpa_split", cuda, torch.float32) == "tandem_sdpa_split"


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("attention") / "tiny")


@pytest.mark.parametrize("kernel", ["sdpa_split", "flex_attention"])
def test_model_packed_in_one_row_equals_padded(tiny_path, kernel):
    """A transformers model with the kernel, fed the packed row and its bounds, gives the padded batch's logits
    (and, for sdpa_split, its gradients); a padded forward through the kernel's name is sdpa's."""
    padded = AutoModelForCausalLM.from_pretrained(tiny_path, attn_implementation="sdpa", dtype=torch.float32)
    packed = AutoModelForCausalLM.from_pretrained(
        tiny_path, attn_implementation=attention.transformers_name(kernel), dtype=torch.float32
    )
    lengths = [7, 3, 11, 5]
    mask = torch.tensor([[1] * n + [0] * (max(lengths) - n) for n in lengths])
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(4, 260, mask.shape, generator=gen) * mask
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    inputs, packing = pack_model_inputs(ids, mask, pad_id=0, one_row=True)
    assert packing.packed_shape == (1, sum(lengths))
    grad = kernel != "flex_attention"
    with torch.set_grad_enabled(grad):
        expected = padded(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        got = packing.unpack(packed(**inputs, **attention.varlen_kwargs(inputs["position_ids"])).logits)
        real = mask.bool()
        torch.testing.assert_close(got[real], expected[real], rtol=0, atol=1e-5)
        through_name = packed(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        torch.testing.assert_close(through_name[real], expected[real], rtol=0, atol=1e-5)
    if grad:
        upstream = torch.randn(expected[real].shape, generator=gen)
        (expected[real] * upstream).sum().backward()
        (got[real] * upstream).sum().backward()
        for (name, a), b in zip(packed.named_parameters(), padded.parameters()):
            scale = max(1.0, float(b.grad.abs().max()))  # the tied embedding's gradient reaches ~170 here
            torch.testing.assert_close(
                a.grad, b.grad, rtol=0, atol=1e-5 * scale, msg=lambda m, n=name: f"{n}: {m}"
            )


# ---------------------------------------------------------------------------- through the FSDP2 engine
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_engine_sdpa_split_equals_sdpa_one_and_two_ranks(lm_head_runs):
    """Packed in one row with sdpa_split: the forward's log-probs and entropy, an optimizer step and a step
    in which rank 1 has no rows equal today's packed sdpa engine on 1 rank, and 2 ranks equal 1."""
    from .test_lm_head import assert_pair_equals_single, assert_states_close, assert_step_close

    today, split = lm_head_runs["one"][(sc.CHUNK, True, False)], lm_head_runs["one"][sc.SDPA_SPLIT]
    assert split["packing"] and split["attention"] == "tandem_sdpa_split" and today["attention"] == "sdpa"
    for key in ("log_probs", "entropy", "sft"):
        torch.testing.assert_close(split["forward"][key], today["forward"][key], rtol=1e-5, atol=1e-5)
    assert_step_close(split["step"], today["step"])
    assert_states_close(split["state"], today["state"])
    assert_states_close(split["empty_state"], today["empty_state"])
    assert_pair_equals_single([rank[sc.SDPA_SPLIT] for rank in lm_head_runs["two"]], today)


# ---------------------------------------------------------------------------- CUDA only
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kernel", ["varlen", "flex_attention", "sdpa_split"])
def test_cuda_kernels_equal_each_sequence_alone_with_gradients(kernel):
    device = torch.device("cuda")
    assert attention._runs(kernel, device)
    lengths = [300, 17, 1200, 1, 531]
    q, k, v = (
        t.detach().to(device, torch.bfloat16).requires_grad_(True) for t in random_qkv(1, sum(lengths))
    )
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    got = attention._KERNEL_FUNCTIONS[kernel](q, k, v, cu, max(lengths), None)
    expected = per_sequence(q, k, v, lengths)
    torch.testing.assert_close(got.float(), expected.float(), rtol=0, atol=2e-2)
    upstream = torch.randn_like(expected)
    got_grads = torch.autograd.grad((got * upstream).sum(), [q, k, v])
    expected_grads = torch.autograd.grad((expected * upstream).sum(), [q, k, v])
    for a, b in zip(got_grads, expected_grads):
        torch.testing.assert_close(a.float(), b.float(), rtol=0, atol=5e-2)
