"""The chunked LM head (engine/lm_head.py, `actor.fsdp.lm_head_chunk_tokens`): its numbers equal the full
logits' path, by hand on random tensors (values and gradients, any chunk size, a temperature, a bias) and
through the FSDP2 engine with the roles' own functions (forward, one optimizer step, a rank with no rows),
packed and padded, 2 ranks against 1. float32 on CPU; the differences measured are ~1e-7 (matmul
blocking differs with the chunk's shape), asserted at 1e-5."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, Gemma2Config, Gemma2ForCausalLM

from tandem.algos.core import entropy_from_logits, log_probs_from_logits, sum_pi_squared_from_logits
from tandem.config.schema import FSDPConfig
from tandem.engine import EngineSpec, FSDPEngine, lm_head
from tandem.engine.lm_head import (
    ChunkedHead,
    HeadRows,
    _row_spans,
    chunk_tokens,
    compile_wanted,
    hidden_states_out,
    warm_up_compiled,
)
from tandem.models.tiny import save_tiny

from . import lm_head_scenarios as sc


def full_stats(hidden, weight, bias, labels, scale):
    """The numbers from the full logits, in float32 (float64 inputs stay float64: the exact reference)."""
    logits = F.linear(hidden, weight, bias)
    logits = (logits if logits.dtype == torch.float64 else logits.float()) / scale
    return {
        "log_probs": log_probs_from_logits(logits, labels),
        "entropy": entropy_from_logits(logits),
        "sum_pi_squared": sum_pi_squared_from_logits(logits),
    }


@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
@pytest.mark.parametrize("with_bias", [False, True])
def test_head_rows_equal_full_logits_values_and_gradients(chunk, with_bias):
    gen = torch.Generator().manual_seed(chunk)
    rows, hidden_size, vocab = 7, 16, 50
    hidden = torch.randn(rows, hidden_size, generator=gen, requires_grad=True)
    weight = torch.randn(vocab, hidden_size, generator=gen, requires_grad=True)
    bias = torch.randn(vocab, generator=gen, requires_grad=True) if with_bias else None
    labels = torch.randint(0, vocab, (rows,), generator=gen)
    upstream = {k: torch.randn(rows, generator=gen) for k in ("log_probs", "entropy", "sum_pi_squared")}
    leaves = [t for t in (hidden, weight, bias) if t is not None]

    def grads(stats):
        total = sum((stats[k] * upstream[k]).sum() for k in stats)
        return torch.autograd.grad(total, leaves)

    expected = full_stats(hidden, weight, bias, labels, 0.7)
    got = HeadRows(hidden, ChunkedHead(weight, bias, chunk), 0.7).stats(
        labels, entropy=True, sum_pi_squared=True
    )
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name].dtype == torch.float32
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6)
    for g, e in zip(grads(got), grads(expected)):
        assert e.abs().max() > 1e-3  # a real gradient, not zeros agreeing
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6 * float(e.abs().max()))


@pytest.mark.parametrize("asked", [("log_probs",), ("log_probs", "entropy"), ("log_probs", "sum_pi_squared")])
def test_head_rows_frozen_head_and_some_numbers_only(asked):
    """The fused backward with a frozen head (LoRA: only the hidden states want a gradient) and with only some
    of the numbers asked for equals autograd through the full logits."""
    gen = torch.Generator().manual_seed(len(asked))
    hidden = torch.randn(9, 16, generator=gen, requires_grad=True)
    weight = torch.randn(40, 16, generator=gen)
    labels = torch.randint(0, 40, (9,), generator=gen)
    expected = full_stats(hidden, weight, None, labels, 1.3)
    got = HeadRows(hidden, ChunkedHead(weight, None, 4), 1.3).stats(
        labels, entropy="entropy" in asked, sum_pi_squared="sum_pi_squared" in asked
    )
    assert tuple(got) == asked
    upstream = {k: torch.randn(9, generator=gen) for k in asked}
    (g,) = torch.autograd.grad(sum((got[k] * upstream[k]).sum() for k in asked), [hidden])
    (e,) = torch.autograd.grad(sum((expected[k] * upstream[k]).sum() for k in asked), [hidden])
    torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6 * float(e.abs().max()))


def test_head_rows_only_what_is_asked_and_no_rows():
    weight = torch.randn(10, 4, requires_grad=True)
    rows = HeadRows(torch.randn(3, 4), ChunkedHead(weight, None, 2), 1.0)
    assert list(rows.stats(torch.tensor([1, 2, 3]))) == ["log_probs"]
    assert list(rows.stats(torch.tensor([1, 2, 3]), sum_pi_squared=True)) == ["log_probs", "sum_pi_squared"]
    empty = HeadRows(torch.zeros(0, 4), ChunkedHead(weight, None, 2), 1.0).stats(torch.zeros(0), entropy=True)
    assert {k: v.shape for k, v in empty.items()} == {"log_probs": (0,), "entropy": (0,)}
    # with no rows the head still gets a (zero) gradient through zero_term: every rank reduces it
    (grad,) = torch.autograd.grad(ChunkedHead(weight, None, 2).zero_term(), [weight])
    assert torch.equal(grad, torch.zeros_like(weight))


def _stats_and_grads(hidden, weight, bias, labels, scale, chunk, compiled, asked, upstream):
    leaves = [t.detach().clone().requires_grad_() for t in (hidden, weight, bias) if t is not None]
    bias_leaf = leaves[2] if bias is not None else None
    stats = HeadRows(leaves[0], ChunkedHead(leaves[1], bias_leaf, chunk, compiled), scale).stats(
        labels, entropy="entropy" in asked, sum_pi_squared="sum_pi_squared" in asked
    )
    total = sum((stats[k].float() * upstream[k]).sum() for k in stats)
    return stats, torch.autograd.grad(total, leaves)


def test_compiled_chunk_arithmetic_equals_eager_and_float64(compiles):
    """fsdp.lm_head_compile: the chunk functions under torch.compile (inductor's CPU code here; Triton on CUDA)
    give the eager numbers and gradients to 1e-5 in float32, and both are within 1e-5 of autograd through float64
    logits. Ragged
    chunks (a last chunk of 1 row joins the one before), a bias, a temperature, each choice of numbers; one
    bf16 case, whose gradients come back in bf16."""
    gen = torch.Generator().manual_seed(3)
    vocab, hidden_size = 50, 16
    weight = torch.randn(vocab, hidden_size, generator=gen)
    bias = torch.randn(vocab, generator=gen)
    for rows, chunk, asked in [
        (7, 3, ("log_probs", "entropy", "sum_pi_squared")),  # chunks of 3, 4 (the 1-row tail joined)
        (9, 4, ("log_probs",)),
        (23, 5, ("log_probs", "entropy")),
        (30, 7, ("log_probs", "sum_pi_squared")),
    ]:
        hidden = torch.randn(rows, hidden_size, generator=gen)
        labels = torch.randint(0, vocab, (rows,), generator=gen)
        upstream = {k: torch.randn(rows, generator=gen) for k in asked}
        args = (labels, 0.7, chunk)
        eager = _stats_and_grads(hidden, weight, bias, *args, False, asked, upstream)
        compiled = _stats_and_grads(hidden, weight, bias, *args, True, asked, upstream)
        leaves = [t.double().requires_grad_() for t in (hidden, weight, bias)]
        exact_stats = {k: v for k, v in full_stats(*leaves, labels, 0.7).items() if k in asked}
        total = sum((exact_stats[k] * upstream[k].double()).sum() for k in asked)
        exact = exact_stats, torch.autograd.grad(total, leaves)  # autograd through float64 logits
        assert tuple(compiled[0]) == asked
        for name in asked:
            assert compiled[0][name].dtype == torch.float32
            for got in (compiled[0][name], eager[0][name]):
                torch.testing.assert_close(got.double(), exact[0][name], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(compiled[0][name], eager[0][name], rtol=1e-5, atol=1e-6)
        for c, e, x in zip(compiled[1], eager[1], exact[1]):
            scale = float(x.abs().max())
            assert scale > 1e-3  # a real gradient
            torch.testing.assert_close(c, e, rtol=1e-5, atol=1e-5 * scale)
            torch.testing.assert_close(c.double(), x, rtol=1e-5, atol=1e-5 * scale)

    asked, rows = ("log_probs", "entropy"), 12
    hidden = torch.randn(rows, hidden_size, generator=gen)
    labels = torch.randint(0, vocab, (rows,), generator=gen)
    upstream = {k: torch.randn(rows, generator=gen) for k in asked}
    low = [t.bfloat16() for t in (hidden, weight)]
    eager = _stats_and_grads(*low, None, labels, 1.0, 5, False, asked, upstream)
    compiled = _stats_and_grads(*low, None, labels, 1.0, 5, True, asked, upstream)
    for name in asked:  # float32 arithmetic on the same bf16 logits
        torch.testing.assert_close(compiled[0][name], eager[0][name], rtol=1e-5, atol=1e-5)
    for c, e in zip(compiled[1], eager[1]):
        assert c.dtype == e.dtype == torch.bfloat16
        torch.testing.assert_close(c, e, rtol=2**-7, atol=2**-7 * float(e.abs().max()))  # a bf16 rounding
    assert compiles() >= 4  # the forward and the backward, float32 and bf16: compiled, not eager


def test_compile_warm_up_leaves_nothing_to_compile(compiles):
    """After `warm_up_compiled`, chunks of any size (one row included) and any temperature, forward and
    backward, compile nothing more: no step pays a compile."""
    vocab, chunk = 64, 6
    warm_up_compiled(chunk, vocab, torch.float32, torch.device("cpu"))
    graphs = compiles()
    assert graphs == 6  # 3 shapes x (forward, backward), well under torch's limit of 8 a function
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(vocab, 8, generator=gen, requires_grad=True)
    for rows, scale, entropy in [
        (6, 1.0, True),
        (13, 0.6, False),
        (1, 1.3, True),
        (25, 1.0, False),
        (7, 2.0, True),
    ]:
        hidden = torch.randn(rows, 8, generator=gen, requires_grad=True)
        labels = torch.randint(0, vocab, (rows,), generator=gen)
        stats = HeadRows(hidden, ChunkedHead(weight, None, chunk, True), scale).stats(labels, entropy=entropy)
        sum(v.sum() for v in stats.values()).backward()
    assert compiles() == graphs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_head_on_cuda_equals_eager():
    """On CUDA the compiled chunk functions are Triton kernels: a real vocabulary (151 936), chunks of 220
    rows and a ragged last one, bf16 logits as the engine makes them; float32 numbers equal eager to 1e-5,
    bf16 gradients to a bf16 rounding."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    vocab, hidden_size, rows, chunk = 151_936, 896, 700, 220
    weight = (torch.randn(vocab, hidden_size, generator=gen, device="cuda") * 0.02).bfloat16()
    hidden = torch.randn(rows, hidden_size, generator=gen, device="cuda").bfloat16()
    labels = torch.randint(0, vocab, (rows,), generator=gen, device="cuda")
    asked = ("log_probs", "entropy")
    upstream = {k: torch.randn(rows, generator=gen, device="cuda") for k in asked}
    warm_up_compiled(chunk, vocab, torch.bfloat16, torch.device("cuda"))
    eager = _stats_and_grads(hidden, weight, None, labels, 0.8, chunk, False, asked, upstream)
    compiled = _stats_and_grads(hidden, weight, None, labels, 0.8, chunk, True, asked, upstream)
    for name in asked:
        torch.testing.assert_close(compiled[0][name], eager[0][name], rtol=1e-5, atol=1e-5)
    for c, e in zip(compiled[1], eager[1]):
        assert c.dtype == torch.bfloat16
        torch.testing.assert_close(c, e, rtol=2**-7, atol=2**-7 * float(e.abs().max()))


def test_compile_head_off_on_and_when_the_compile_fails(monkeypatch, caplog, compiles):
    """compile_head: nothing under auto on a CPU or false; true compiles (timed); a failed compile is a warning
    and eager under auto, an error naming the key under true. The failure is a stub (`warm_up_compiled`
    raising): a real one needs a machine without Triton or a C++ compiler."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert lm_head.compile_head("auto", 4, 64, torch.float32, cpu) is None  # a tiny vocabulary on a CPU
    assert lm_head.compile_head(False, 4, 64, torch.float32, cuda) is None
    assert lm_head.compile_head(True, 4, 64, torch.float32, cpu) > 0

    def broken(*args):
        raise RuntimeError("no working C++ compiler")

    monkeypatch.setattr(lm_head, "warm_up_compiled", broken)
    with caplog.at_level(logging.WARNING, logger="tandem.engine.lm_head"):
        assert lm_head.compile_head("auto", 4, 64, torch.bfloat16, cuda) is None
    assert "lm_head_compile=auto" in caplog.text and "no working C++ compiler" in caplog.text
    with pytest.raises(RuntimeError, match=r"lm_head_compile=true.*no working C\+\+ compiler.*=false"):
        lm_head.compile_head(True, 4, 64, torch.float32, cpu)


def _head_weight_gradient(hidden, weight, labels, advantages, chunk):
    hidden, weight = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    if chunk is None:  # the full logits (float64 inputs: the exact reference)
        log_probs = full_stats(hidden, weight, None, labels, 1.0)["log_probs"]
    else:
        log_probs = HeadRows(hidden, ChunkedHead(weight, None, chunk), 1.0).stats(labels)["log_probs"]
    (-(advantages * log_probs).mean()).backward()
    return weight.grad.double()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_chunked_head_weight_gradient_sums_in_float32_on_cuda():
    """In bf16 the head's weight gradient over 64 chunks is as close to float64 as one matmul over all rows:
    the chunks' products add into a float32 sum inside the matmul (on this CPU, summed in bf16, its error was
    2x one matmul's: 0.46 % against 0.23 %)."""
    assert lm_head._matmul_adds_into_float32("cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, hidden_size, vocab = 4096, 128, 8192
    hidden = torch.randn(rows, hidden_size, generator=gen, device="cuda").bfloat16()
    weight = (torch.randn(vocab, hidden_size, generator=gen, device="cuda") * 0.05).bfloat16()
    labels = torch.randint(0, vocab, (rows,), generator=gen, device="cuda")
    advantages = torch.randn(rows, generator=gen, device="cuda")
    exact = _head_weight_gradient(hidden.double(), weight.double(), labels, advantages, None)

    def error(chunk):
        got = _head_weight_gradient(hidden, weight, labels, advantages, chunk)
        return float((got - exact).norm() / exact.norm())

    assert error(64) < 1.3 * error(None)


def test_row_spans_and_when_the_head_compiles():
    for rows, chunk in [(1, 4), (4, 4), (5, 4), (9, 4), (10, 4), (7, 1), (0, 3)]:
        spans = _row_spans(rows, chunk)
        assert [i for s in spans for i in range(s.start, s.stop)] == list(range(rows))  # every row, once
        assert all(s.stop - s.start >= 2 for s in spans) or rows <= 1 or chunk == 1  # no 1-row tail
        assert all(s.stop - s.start <= chunk + 1 for s in spans)
    assert [(s.start, s.stop) for s in _row_spans(9, 4)] == [(0, 4), (4, 9)]
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert compile_wanted("auto", cuda, 320) and compile_wanted("auto", cuda, 151_936)
    assert not compile_wanted("auto", cpu, 320)  # a tiny model's head, chunked by hand: eager
    assert compile_wanted(True, cpu, 320) and not compile_wanted(False, cuda, 151_936)
    assert not lm_head._matmul_adds_into_float32(
        "cpu"
    )  # no out_dtype matmul on a CPU: sums in the weight's dtype


def test_auto_compiles_a_real_vocabulary_on_a_cpu_with_a_compiler(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(lm_head.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.delenv("CXX", raising=False)
    assert compile_wanted("auto", cpu, 151_936)
    monkeypatch.setattr(lm_head.shutil, "which", lambda name: None)  # a laptop with no C++ compiler
    assert not compile_wanted("auto", cpu, 151_936)
    monkeypatch.setenv("CXX", "/opt/bin/g++")
    assert compile_wanted("auto", cpu, 151_936)


def test_hidden_states_out_gives_what_the_head_reads(tmp_path):
    model = AutoModelForCausalLM.from_pretrained(save_tiny(tmp_path / "m"), dtype=torch.float32).eval()
    ids = torch.tensor([[5, 9, 11, 40, 7]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        with hidden_states_out(model) as head:
            hidden = model(input_ids=ids).logits
        again = model(input_ids=ids).logits  # the head is itself again after the block
    assert hidden.shape == (1, 5, model.config.hidden_size)
    torch.testing.assert_close(F.linear(hidden, head.weight), logits, rtol=0, atol=1e-5)
    assert torch.equal(again, logits)


# ---------------------------------------------------------------------------- through the FSDP2 engine
@pytest.fixture(scope="module")
def runs(lm_head_runs):
    return lm_head_runs


def assert_step_close(got, expected):
    assert not got["skipped"] and not expected["skipped"]
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)


def assert_states_close(got, expected):
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(
            got[name], expected[name], rtol=0, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}"
        )


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("model", ["one", "untied"])
def test_chunked_head_equals_full_logits_packed_and_padded(runs, model):
    results = runs[model]
    for packing in (
        True,
        False,
    ):  # padded, the outputs at padding are the model's too: compare like with like
        plain, chunked = results[(None, packing, False)], results[(sc.CHUNK, packing, False)]
        assert plain["chunk"] is None and plain["packing"] == packing
        assert chunked["chunk"] == sc.CHUNK and chunked["packing"] == packing
        for key in ("log_probs", "entropy", "sft"):
            torch.testing.assert_close(chunked["forward"][key], plain["forward"][key], rtol=1e-5, atol=1e-5)
        assert plain["forward"]["entropy"].abs().max() > 0.1  # real numbers
        assert_step_close(chunked["step"], plain["step"])
        assert_states_close(chunked["state"], plain["state"])
        assert_step_close(chunked["empty_step"], plain["empty_step"])
        assert_states_close(chunked["empty_state"], plain["empty_state"])


def assert_pair_equals_single(pair, single):
    for key in ("log_probs", "entropy", "sft"):
        joined = torch.cat([rank["forward"][key] for rank in pair])
        torch.testing.assert_close(joined, single["forward"][key], rtol=1e-5, atol=1e-5)
    for rank in pair:
        assert_step_close(rank["step"], single["step"])
        assert_step_close(rank["empty_step"], single["empty_step"])  # rank 1 had no rows at all
    moved = max((single["state"][k] - single["state0"][k]).abs().max().item() for k in single["state"])
    assert moved > 5e-5  # a real update (about lr = 1e-4 per element), not two unchanged models agreeing
    assert_states_close(pair[0]["state"], single["state"])
    assert_states_close(pair[0]["empty_state"], single["empty_state"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_chunked_head_two_ranks_equal_one(runs):
    pair = [rank[(sc.CHUNK, True, False)] for rank in runs["two"]]
    assert all(rank["compiled"] is None for rank in pair)
    assert_pair_equals_single(pair, runs["one"][(sc.CHUNK, True, False)])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_compiled_layers_on_two_ranks_equal_eager_one_rank(runs):
    """fsdp.torch_compile (inductor, dynamic shapes) under FSDP2's hooks on 2 ranks, with the head's chunk
    arithmetic compiled too (fsdp.lm_head_compile): a forward, a training step and a step in which rank 1 has
    no rows (its dummy pass runs the compiled layers too) equal the eager engine on 1 rank."""
    pair = [rank[(sc.CHUNK, True, True)] for rank in runs["two"]]
    assert all(rank["compiled"] > 0 and rank["head_compiled"] for rank in pair)  # the warm-ups ran, timed
    assert not runs["one"][(sc.CHUNK, True, False)]["head_compiled"]  # the eager engine compared with
    assert_pair_equals_single(pair, runs["one"][(sc.CHUNK, True, False)])


def test_auto_chunks_only_real_vocabularies():
    assert chunk_tokens("auto", 320) is None  # the tiny test models keep their full logits
    assert chunk_tokens("auto", 32767) is None
    assert chunk_tokens("auto", 32768) == 1024
    assert chunk_tokens("auto", 151_936) == 220  # 2^25 logits per chunk
    assert chunk_tokens(None, 151_936) is None
    assert chunk_tokens(64, 320) == 64
    cuda = torch.device("cuda", 0)
    assert (
        chunk_tokens("auto", 151_936, cuda) == 883
    )  # 2^27 on CUDA: the matmuls stop being bound by W's reads
    assert chunk_tokens("auto", 151_936, torch.device("cpu")) == 220
    assert chunk_tokens("auto", 320, cuda) is None


def test_a_model_that_post_processes_its_logits_keeps_the_full_head(tmp_path, caplog):
    """Gemma2 soft-caps its logits after the head: the start-up probe sees that and turns chunking off."""
    config = Gemma2Config(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        final_logit_softcapping=0.5,  # small: the capped logits differ clearly from the head's output
        pad_token_id=0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        Gemma2ForCausalLM(config).save_pretrained(tmp_path / "gemma2")
    store = tmp_path / "store"
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        kwargs = dict(model_path=tmp_path / "gemma2", head="lm", device="cpu", optim=None, grad_clip=None)
        with caplog.at_level(logging.WARNING):
            engine = FSDPEngine(
                EngineSpec(**kwargs, fsdp=FSDPConfig(lm_head_chunk_tokens=8), total_training_steps=None)
            )
        assert engine.lm_head_chunk is None
        assert "lm_head_chunk_tokens is ignored for Gemma2ForCausalLM" in caplog.text
    finally:
        if created:
            dist.destroy_process_group()
