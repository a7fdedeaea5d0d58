"""FSDPEngine with real FSDP2 over gloo: 1 rank and 2 ranks run the same calls (fsdp_scenarios.py),
the results are compared with each other and with the plain Hugging Face model.

Tolerances (float32 on CPU, measured): logits 2 ranks vs 1 rank and vs HF ~6e-7 (asserted 1e-5);
loss and grad norm 2 vs 1 rank ~2e-6 relative (asserted 1e-5); weights after one AdamW step
~4e-7 absolute (asserted 2e-6, the update itself is ~3e-4): Adam's first step divides each
gradient element by its own magnitude, so float noise in near-zero gradient elements shows up
as ~1e-3 of the update there. Resume and activation checkpointing are compared exactly.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from tandem.config.schema import FSDPConfig
from tandem.engine import EngineSpec, FSDPEngine, build_engine, hf_io
from tandem.models.tiny import save_tiny

from . import fsdp_scenarios as sc

HEADS = ("lm", "value")


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("engine") / "tiny")


@pytest.fixture(scope="module")
def one_rank(tiny_path, tmp_path_factory):
    return sc.run(1, tiny_path, tmp_path_factory.mktemp("one_rank"))[0]


@pytest.fixture(scope="module")
def two_ranks(tiny_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("two_ranks")
    return {"ranks": sc.run(2, tiny_path, out), "out": out}


def hf_model(path, head: str):
    """The unsharded reference: what transformers loads (a value head initialised from seed 1)."""
    if head == "lm":
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    config = hf_io.load_config(path, head)
    hf_io.disable_dropout(config)
    return hf_io.load_pretrained(path, config, head, seed=1).eval()


def hf_logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
            use_cache=False,
        ).logits


def cat_ranks(two_ranks, head: str, key: str) -> torch.Tensor:
    return torch.cat([rank[head][key] for rank in two_ranks["ranks"]])


def assert_states_close(actual: dict, expected: dict, atol: float) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(
            actual[name], expected[name], rtol=0, atol=atol, msg=lambda text, name=name: f"{name}: {text}"
        )


# ---------------------------------------------------------------------------- no process group needed
def test_engine_needs_a_process_group(tiny_path, monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)  # whatever ran before
    with pytest.raises(RuntimeError, match="torch.distributed"):
        FSDPEngine(
            EngineSpec(
                model_path=str(tiny_path),
                head="lm",
                device=torch.device("cpu"),
                optim=None,
                fsdp=FSDPConfig(),
                grad_clip=None,
                total_training_steps=None,
            )
        )


def test_build_engine_strategies(monkeypatch):
    with pytest.raises(ValueError, match="unknown engine strategy 'deepspeed'"):
        build_engine(EngineSpec(model_path="unused", head="lm", device="cpu", strategy="deepspeed"))
    import tandem.engine.megatron as megatron_package

    monkeypatch.setattr(megatron_package, "megatron_available", lambda: False)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[megatron\]'"):
        build_engine(EngineSpec(model_path="unused", head="lm", device="cpu", strategy="megatron"))


def test_value_head_init_depends_on_seed_only(tiny_path):
    config = hf_io.load_config(tiny_path, "value")
    rng = torch.get_rng_state()
    a = hf_io.load_pretrained(tiny_path, config, "value", seed=1).score.weight
    assert torch.equal(torch.get_rng_state(), rng)  # the global RNG is left alone
    torch.manual_seed(123)  # ... and does not matter
    b = hf_io.load_pretrained(tiny_path, config, "value", seed=1).score.weight
    c = hf_io.load_pretrained(tiny_path, config, "value", seed=2).score.weight
    torch.set_rng_state(rng)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(a, c)
    assert a.shape == (1, config.hidden_size)


def test_dropout_disabled_and_layers_found(tiny_path):
    config = hf_io.load_config(tiny_path, "value")
    config.attention_dropout = 0.1
    hf_io.disable_dropout(config)
    assert config.attention_dropout == 0.0 and config.classifier_dropout == 0.0
    model = hf_io.build_on_meta(config, "value")
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    layers = hf_io.decoder_layers(model)
    assert [type(layer).__name__ for layer in layers] == ["Qwen2DecoderLayer"] * 4


def test_attention_implementation_reaches_the_model(tiny_path):
    """(What auto picks on each device: test_attention.py.)"""
    # the choice reaches the model, and eager attention gives sdpa's logits
    ids = torch.tensor([[5, 9, 17, 33, 2]])
    logits = {}
    for kind in ("sdpa", "eager"):
        config = hf_io.load_config(tiny_path, "lm", kind)
        model = hf_io.load_pretrained(tiny_path, config, "lm", seed=1)
        assert model.config._attn_implementation == kind
        assert model.model.layers[0].self_attn.config._attn_implementation == kind
        logits[kind] = model(input_ids=ids).logits
    torch.testing.assert_close(logits["eager"], logits["sdpa"], rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------- forward
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("head", HEADS)
def test_forward_logits_equal_hf(head, tiny_path, one_rank, two_ranks):
    expected = hf_logits(hf_model(tiny_path, head), sc.rollout_batch(5, seed=1))
    assert expected.shape[-1] == (320 if head == "lm" else 1)
    torch.testing.assert_close(one_rank[head]["logits0"], expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(cat_ranks(two_ranks, head, "logits0"), expected, rtol=0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_frozen_engine_forwards_and_refuses_to_train(one_rank):
    single = one_rank["single"]
    torch.testing.assert_close(single["frozen_logits"], one_rank["lm"]["logits0"], rtol=0, atol=1e-5)
    assert "frozen engine" in single["frozen_train_error"]
    assert "holds no optimizer state (saved by a frozen engine)" in single["frozen_checkpoint_error"]
    assert single["frozen_weights_loaded"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("head", HEADS)
def test_state_dict_iter_is_the_hf_state_dict(head, tiny_path, two_ranks):
    hf_state = hf_model(tiny_path, head).state_dict()
    tied = {"lm_head.weight"} if head == "lm" else set()
    state0 = two_ranks["ranks"][0][head]["state0"]
    assert list(state0) == [name for name in hf_state if name not in tied]
    assert all(t.dtype == torch.float32 for t in state0.values())
    assert_states_close(state0, {k: v for k, v in hf_state.items() if k not in tied}, atol=0)
    assert all(rank[head]["tied"] for rank in two_ranks["ranks"])  # lm_head is embed_tokens after sharding


# ---------------------------------------------------------------------------- training parity
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("head", HEADS)
def test_two_ranks_train_step_equals_one_rank(head, one_rank, two_ranks):
    single, pair = one_rank[head], two_ranks["ranks"]
    step = single["step1"]
    assert not step["skipped"] and math.isclose(step["lr"], 1e-3 / 3)  # warm-up step 0 of 2
    assert step["grad_norm"] > sc.GRAD_CLIP  # so clipping was exercised
    for rank in pair:  # every rank reports the global numbers
        assert rank[head]["step1"]["loss"] == pytest.approx(step["loss"], rel=1e-5)
        assert rank[head]["step1"]["grad_norm"] == pytest.approx(step["grad_norm"], rel=1e-5)
        assert rank[head]["step1"]["lr"] == step["lr"]
    # per-micro-batch metrics are the rank's own: 2 micro-batches on 1 rank; 2 and 1 on 2 ranks
    assert [len(rank[head]["step1"]["metrics"]["loss"]) for rank in pair] == [2, 1]
    assert sum(sum(rank[head]["step1"]["metrics"]["loss"]) for rank in pair) == pytest.approx(
        step["loss"], rel=1e-5
    )

    updated = pair[0][head]["state1"]
    moved = max((updated[k] - single["state0"][k]).abs().max().item() for k in updated)
    assert moved > 1e-4  # a real update, not two unchanged models agreeing
    # Adam's first step is lr * g / (|g| + eps): an element whose gradient is near eps moves by an
    # amount that depends on the reduction order (one element in 65536 differed by 3e-6 at 2e-6).
    assert_states_close(updated, single["state1"], atol=1e-5)
    torch.testing.assert_close(cat_ranks(two_ranks, head, "logits1"), single["logits1"], rtol=0, atol=1e-5)
    assert single["lr_after_schedule_step"] == pytest.approx(2e-3 / 3)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_empty_shard_takes_part_and_matches_one_rank(one_rank, two_ranks):
    rank0, rank1 = (rank["lm"] for rank in two_ranks["ranks"])
    assert rank1["empty_forward"].shape == (0, *one_rank["lm"]["empty_forward"].shape[1:])
    torch.testing.assert_close(rank0["empty_forward"], one_rank["lm"]["empty_forward"], rtol=0, atol=1e-5)
    expected = one_rank["lm"]["empty_step"]
    for rank in (rank0, rank1):
        assert rank["empty_step"]["loss"] == pytest.approx(expected["loss"], rel=1e-5)
        assert rank["empty_step"]["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)
    assert rank1["empty_step"]["metrics"] == {}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_activation_checkpointing_changes_nothing(one_rank):
    single = one_rank["single"]
    assert single["checkpointed_step1"] == one_rank["lm"]["step1"]
    assert_states_close(single["checkpointed_state1"], one_rank["lm"]["state1"], atol=0)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_non_finite_gradient_skips_the_step(one_rank):
    single = one_rank["single"]
    assert single["nan_step"]["skipped"] and math.isnan(single["nan_step"]["grad_norm"])
    assert single["nan_state_unchanged"]
    after = single["step_after_nan"]  # the bad gradient left nothing behind
    assert not after["skipped"] and math.isfinite(after["grad_norm"]) and math.isfinite(after["loss"])


# ---------------------------------------------------------------------------- checkpoints and export
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_resume_from_checkpoint_equals_continuing(one_rank, two_ranks):
    for result in (one_rank["lm"], *(rank["lm"] for rank in two_ranks["ranks"])):
        assert result["resumed_global_step"] == 2
        assert result["resumed_step"] == result["continued_step"]
        assert result["continued_step"]["lr"] == pytest.approx(
            1e-3
        )  # warm-up over: the schedule was restored
    pair = two_ranks["ranks"][0]["lm"]
    assert_states_close(pair["resumed_state"], pair["continued_state"], atol=0)
    assert_states_close(one_rank["lm"]["resumed_state"], one_rank["lm"]["continued_state"], atol=0)
    assert pair["continued_step"]["loss"] == pytest.approx(one_rank["lm"]["continued_step"]["loss"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("head", HEADS)
def test_export_hf_reloads_with_transformers(head, tiny_path, two_ranks):
    folder = two_ranks["out"] / f"export-{head}"
    auto = AutoModelForCausalLM if head == "lm" else AutoModelForTokenClassification
    model = auto.from_pretrained(folder).eval()
    expected_class = "Qwen2ForCausalLM" if head == "lm" else "Qwen2ForTokenClassification"
    assert model.config.architectures == [expected_class]
    state = model.state_dict()
    assert_states_close(
        {k: state[k] for k in two_ranks["ranks"][0][head]["state1"]},
        two_ranks["ranks"][0][head]["state1"],
        atol=0,
    )
    logits = hf_logits(model, sc.rollout_batch(5, seed=1))
    torch.testing.assert_close(logits, cat_ranks(two_ranks, head, "logits1"), rtol=0, atol=1e-5)
    if head == "value":
        assert model.config.num_labels == 1
    else:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (tiny_path / name).exists():
            assert (folder / name).read_bytes() == (tiny_path / name).read_bytes(), name


# ---------------------------------------------------------------------------- GPU only
@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_bf16_offload_and_cpu_offload(tiny_path, tmp_path):
    result = sc.run_gpu(tiny_path, tmp_path)
    probe = sc.rollout_batch(5, seed=1)
    expected = hf_logits(hf_model(tiny_path, "lm"), probe)
    real = probe["attention_mask"].bool()  # padding positions hold no prediction (they differ freely in bf16)
    torch.testing.assert_close(result["logits"][real], expected[real], rtol=0, atol=5e-2)  # bfloat16 compute
    assert result["weights_dtypes"] == {torch.float32}  # master weights stay float32
    for step in ("step1", "step2", "cpu_offload_step1"):
        assert not result[step]["skipped"] and math.isfinite(result[step]["grad_norm"]), step
    assert result["cpu_offload_step1"]["loss"] == pytest.approx(result["step1"]["loss"], rel=1e-3)
    assert result["freed_bytes"] > 10e6 and result["param_devices_offloaded"] == {"cpu"}
    assert "onload() first" in result["offloaded_forward_error"]
    assert result["onload_unchanged"]
    assert result["cpu_offload_param_devices"] == {"cpu"}
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "export-cpu-offload")
    assert reloaded.config.architectures == ["Qwen2ForCausalLM"]
