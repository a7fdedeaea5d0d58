import json
import logging
import shutil

import pytest
import torch

from tandem.algos.core import log_probs_from_logits
from tandem.batch import Batch
from tandem.models.tiny import build_model
from tandem.rollout import ROLLOUT_KEYS, HFRollout, RolloutSpec, SamplingParams, build_rollout
from tandem.rollout.base import METRICS_KEY, PROMPT_INDEX, read_special_ids

from .conftest import PROMPTS, TINY, make_prompts

VOCAB = 320  # the tiny tokenizer's 260 ids padded to a multiple of 64
# Every 7th id ends a response: random weights then stop rows at different steps, mid-response.
EVERY_7TH = list(range(0, VOCAB, 7))
SAMPLED = SamplingParams(max_tokens=12, n=3, temperature=0.7, top_k=40, top_p=0.9, seed=1234)


def engine(tiny_dir, **kwargs) -> HFRollout:
    kwargs.setdefault("eos_token_ids", EVERY_7TH)
    kwargs.setdefault("pad_token_id", 0)
    return HFRollout(tiny_dir, **kwargs)


@torch.no_grad()
def full_forward_logits(model, out) -> torch.Tensor:
    """Logits predicting each response token, from ONE forward over the whole sequences (no cache)."""
    device = next(model.parameters()).device
    logits = (
        model(
            input_ids=out["input_ids"].to(device),
            attention_mask=out["attention_mask"].to(device),
            position_ids=out["position_ids"].to(device),
            use_cache=False,
        )
        .logits.float()
        .cpu()
    )
    prompt_width = out["prompts"].shape[1]
    return logits[:, prompt_width - 1 : -1]


def stop_positions(out) -> list[int]:
    return out["response_mask"].sum(dim=1).tolist()


# ---------------------------------------------------------------- layout


def test_layout(tiny_dir, prompts):
    out = engine(tiny_dir).generate(prompts, SAMPLED)
    n, rows, width, plen = (
        SAMPLED.n,
        len(prompts) * SAMPLED.n,
        SAMPLED.max_tokens,
        prompts["input_ids"].shape[1],
    )

    for key in ROLLOUT_KEYS:
        assert key in out.keys()
    assert len(out) == rows
    for key, shape, dtype in [
        ("prompts", (rows, plen), torch.long),
        ("responses", (rows, width), torch.long),
        ("response_mask", (rows, width), torch.long),
        ("input_ids", (rows, plen + width), torch.long),
        ("attention_mask", (rows, plen + width), torch.long),
        ("position_ids", (rows, plen + width), torch.long),
        ("rollout_log_probs", (rows, width), torch.float32),
    ]:
        assert tuple(out[key].shape) == shape, key
        assert out[key].dtype == dtype, key

    # Each prompt's n samples sit next to each other; non-tensors and meta come along.
    repeated = torch.arange(len(prompts)).repeat_interleave(n)
    assert torch.equal(out["prompts"], prompts["input_ids"][repeated])
    assert [p[0]["content"] for p in out["raw_prompt"]] == [PROMPTS[i] for i in repeated.tolist()]
    assert out["ground_truth"].tolist() == [str(i) for i in repeated.tolist()]
    assert out.meta["step"] == 7
    metrics = out.meta[METRICS_KEY]
    assert metrics["samples"] == rows
    assert metrics["generated_tokens"] == int(out["response_mask"].sum())
    assert metrics["prompt_tokens"] == int(out["attention_mask"][:, :plen].sum())

    responses, mask = out["responses"], out["response_mask"]
    is_eos = torch.isin(responses, torch.tensor(EVERY_7TH))
    lengths = stop_positions(out)
    assert any(0 < n_tok < width for n_tok in lengths), "no row stopped mid-response: the test checks little"
    for r in range(rows):
        stops = is_eos[r].nonzero().flatten().tolist()
        # 1 up to and including the first stop token, 0 after it, and only pad ids after it.
        length = stops[0] + 1 if stops else width
        assert mask[r].tolist() == [1] * length + [0] * (width - length)
        assert responses[r, length:].eq(0).all()
        assert (out["rollout_log_probs"][r, length:] == 0).all()
        assert (out["rollout_log_probs"][r, :length] < 0).all()

    assert torch.equal(out["input_ids"], torch.cat([out["prompts"], responses], dim=1))
    assert torch.equal(out["attention_mask"], torch.cat([prompts["attention_mask"][repeated], mask], dim=1))
    assert torch.equal(out["position_ids"], (out["attention_mask"].cumsum(-1) - 1).clamp(min=0))
    # A response's positions continue its prompt's: prompt length, prompt length + 1, ...
    prompt_lengths = prompts["attention_mask"].sum(-1)[repeated]
    first = out["position_ids"][:, plen]
    assert torch.equal(first, prompt_lengths)


# ---------------------------------------------------------------- log-prob parity


@pytest.mark.parametrize(
    "sampling, max_batch_size",
    [
        (SAMPLED, None),
        (SamplingParams(max_tokens=10, n=2, temperature=1.3, seed=5), 4),  # no filters; chunked
        (SamplingParams(max_tokens=10, temperature=0), None),
    ],
    ids=["T0.7-topk-topp", "T1.3-chunked", "greedy"],
)
def test_rollout_log_probs_equal_one_full_forward(tiny_dir, prompts, sampling, max_batch_size):
    rollout = engine(tiny_dir, max_batch_size=max_batch_size)
    out = rollout.generate(prompts, sampling)
    logits = full_forward_logits(rollout.model, out)
    temperature = sampling.temperature if sampling.temperature > 0 else 1.0
    recomputed = log_probs_from_logits(logits / temperature, out["responses"])
    mask = out["response_mask"].bool()
    assert mask.sum() > len(out)  # more than one token per row is compared
    torch.testing.assert_close(out["rollout_log_probs"][mask], recomputed[mask], atol=1e-5, rtol=0)


def test_greedy_is_argmax_of_full_forward(tiny_dir, prompts):
    rollout = engine(tiny_dir)
    out = rollout.generate(prompts, SamplingParams(max_tokens=10, temperature=0))
    logits = full_forward_logits(rollout.model, out)
    mask = out["response_mask"].bool()
    assert torch.equal(out["responses"][mask], logits.argmax(-1)[mask])


def test_top_k_1_and_tiny_top_p_sample_the_greedy_tokens(tiny_dir, prompts):
    rollout = engine(tiny_dir)
    greedy = rollout.generate(prompts, SamplingParams(max_tokens=10, temperature=0))
    for sampling in [
        SamplingParams(max_tokens=10, n=2, temperature=0.9, top_k=1, seed=3),
        SamplingParams(max_tokens=10, n=2, temperature=0.9, top_p=1e-6, seed=3),
    ]:
        out = rollout.generate(prompts, sampling)
        assert torch.equal(out["responses"][::2], greedy["responses"])
        assert torch.equal(out["responses"][1::2], greedy["responses"])


# ---------------------------------------------------------------- seeds and chunks


def test_same_seed_same_samples_other_seed_other_samples(tiny_dir, prompts):
    rollout = engine(tiny_dir)
    first = rollout.generate(prompts, SAMPLED)
    again = rollout.generate(prompts, SAMPLED)
    other = rollout.generate(prompts, SamplingParams(**{**SAMPLED.__dict__, "seed": 4321}))
    assert torch.equal(first["responses"], again["responses"])
    assert torch.equal(first["rollout_log_probs"], again["rollout_log_probs"])
    assert not torch.equal(first["responses"], other["responses"])
    # The n samples of one prompt differ from each other (each row draws from its own stream).
    assert not torch.equal(first["responses"][0], first["responses"][1])


def test_unseeded_sampling_varies(tiny_dir, prompts):
    rollout = engine(tiny_dir)
    sampling = SamplingParams(max_tokens=8, n=2, temperature=1.0)
    a, b = rollout.generate(prompts, sampling), rollout.generate(prompts, sampling)
    assert not torch.equal(a["responses"], b["responses"])


def test_chunking_does_not_change_the_samples(tiny_dir, prompts):
    whole = engine(tiny_dir).generate(prompts, SAMPLED)
    for max_batch_size in (1, 4):
        chunked = engine(tiny_dir, max_batch_size=max_batch_size).generate(prompts, SAMPLED)
        assert torch.equal(chunked["responses"], whole["responses"])
        assert torch.equal(chunked["response_mask"], whole["response_mask"])
        torch.testing.assert_close(
            chunked["rollout_log_probs"], whole["rollout_log_probs"], atol=1e-6, rtol=0
        )


def test_prompt_index_makes_samples_independent_of_the_split(tiny_dir, prompts):
    """Prompts split over two "ranks" with their step-wide prompt_index sample what one call samples."""
    indexed = prompts.union(Batch.from_dict({PROMPT_INDEX: torch.arange(len(prompts))}))
    rollout = engine(tiny_dir)
    whole = rollout.generate(indexed, SAMPLED)
    parts = [rollout.generate(part, SAMPLED) for part in indexed.chunk(2)]
    assert torch.equal(Batch.concat(parts, meta="first")["responses"], whole["responses"])
    # without the index, the second half would be sampled as if it were the first
    second_alone = rollout.generate(prompts.chunk(2)[1], SAMPLED)
    assert not torch.equal(second_alone["responses"], parts[1]["responses"])


# ---------------------------------------------------------------- stopping


def test_rows_stop_at_max_tokens_without_eos(tiny_dir, prompts):
    out = engine(tiny_dir, eos_token_ids=[VOCAB + 1]).generate(prompts, SamplingParams(max_tokens=5, seed=0))
    assert out["responses"].shape[1] == 5
    assert out["response_mask"].eq(1).all()
    assert out.meta[METRICS_KEY]["decode_steps"] == 4  # the prefill gives the first token


def test_stop_early_when_every_row_has_stopped(tiny_dir, prompts):
    # Every id stops: each row ends after one token and no decode step runs.
    out = engine(tiny_dir, eos_token_ids=range(VOCAB)).generate(prompts, SamplingParams(max_tokens=6, seed=0))
    assert out["response_mask"].tolist() == [[1, 0, 0, 0, 0, 0]] * len(prompts)
    assert out["responses"][:, 1:].eq(0).all()
    assert out.meta[METRICS_KEY]["decode_steps"] == 0


def test_a_row_stops_at_its_first_eos_and_the_others_go_on(tiny_dir, prompts):
    greedy = SamplingParams(max_tokens=8, temperature=0)
    free = engine(tiny_dir, eos_token_ids=[VOCAB + 1]).generate(prompts, greedy)["responses"]
    stop_token = int(free[0, 3])
    stopped = engine(tiny_dir, eos_token_ids=[stop_token]).generate(prompts, greedy)
    for r in range(len(prompts)):
        hits = (free[r] == stop_token).nonzero().flatten().tolist()
        length = hits[0] + 1 if hits else 8
        assert stop_positions(stopped)[r] == length
        assert torch.equal(stopped["responses"][r, :length], free[r, :length])
    assert stop_positions(stopped)[0] <= 4


# ---------------------------------------------------------------- weights


def test_update_weights_makes_the_engine_the_other_model(tokenizer, prompts):
    rollout = HFRollout(
        model=build_model(tokenizer, seed=0, **TINY), eos_token_ids=[VOCAB + 1], pad_token_id=0
    )
    other = build_model(tokenizer, seed=1, **TINY)
    reference = HFRollout(
        model=build_model(tokenizer, seed=1, **TINY), eos_token_ids=[VOCAB + 1], pad_token_id=0
    )
    before = rollout.generate(prompts, SAMPLED)

    rollout.update_weights(other.state_dict().items())

    after, expected = rollout.generate(prompts, SAMPLED), reference.generate(prompts, SAMPLED)
    assert not torch.equal(before["responses"], after["responses"])
    assert torch.equal(after["responses"], expected["responses"])
    torch.testing.assert_close(after["rollout_log_probs"], expected["rollout_log_probs"], atol=1e-6, rtol=0)
    recomputed = log_probs_from_logits(
        full_forward_logits(other, after) / SAMPLED.temperature, after["responses"]
    )
    torch.testing.assert_close(after["rollout_log_probs"], recomputed, atol=1e-5, rtol=0)


def test_update_weights_is_lazy_casts_and_reports(tokenizer, caplog):
    rollout = HFRollout(model=build_model(tokenizer, seed=0, **TINY), eos_token_ids=[1], pad_token_id=0)
    params = dict(rollout.model.named_parameters())
    source = build_model(tokenizer, seed=1, dtype=torch.float64, **TINY).state_dict()

    def stream():
        previous = None
        for name, tensor in source.items():
            if previous is not None:  # the previous tensor is in place before the next is asked for
                torch.testing.assert_close(params[previous], source[previous].float())
            previous = name
            yield name, tensor

    with caplog.at_level(logging.DEBUG, logger="tandem.rollout.hf"):
        rollout.update_weights(stream())
    assert params["model.norm.weight"].dtype == torch.float32
    assert f"loaded {len(source)} tensors" in caplog.text


def test_tied_lm_head_follows_embed_tokens(tokenizer):
    rollout = HFRollout(model=build_model(tokenizer, seed=0, **TINY), eos_token_ids=[1], pad_token_id=0)
    model = rollout.model
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    new = torch.randn_like(model.model.embed_tokens.weight)
    rollout.update_weights([("model.embed_tokens.weight", new)])
    assert torch.equal(model.lm_head.weight, new)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_update_weights_rejects_unknown_names_and_wrong_shapes(tokenizer):
    rollout = HFRollout(model=build_model(tokenizer, seed=0, **TINY), eos_token_ids=[1], pad_token_id=0)
    with pytest.raises(KeyError, match="module.model.norm.weight"):
        rollout.update_weights([("module.model.norm.weight", torch.ones(32))])
    with pytest.raises(ValueError, match=r"'model.norm.weight' has shape \(16,\)"):
        rollout.update_weights([("model.norm.weight", torch.ones(16))])


# ---------------------------------------------------------------- construction, errors, sleep


def test_from_pretrained_reads_stop_and_pad_ids(tiny_dir, tmp_path):
    assert read_special_ids(tiny_dir) == ([1], 0)
    folder = shutil.copytree(tiny_dir, tmp_path / "model")
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": [3]}))
    rollout = HFRollout.from_pretrained(folder)
    assert (rollout.eos_token_ids, rollout.pad_token_id) == ([3, 1], 0)  # the tokenizer's eos is added


def test_build_rollout(tiny_dir):
    rollout = build_rollout(RolloutSpec("hf", tiny_dir, eos_token_ids=[5]))
    assert isinstance(rollout, HFRollout)
    assert (rollout.eos_token_ids, rollout.pad_token_id) == ([5], 0)
    with pytest.raises(NotImplementedError, match="not available yet"):
        build_rollout(RolloutSpec("sglang", tiny_dir))
    with pytest.raises(ValueError, match="unknown rollout engine 'hff'"):
        build_rollout(RolloutSpec("hff", tiny_dir))


def test_constructor_and_prompt_errors(tiny_dir, tokenizer, prompts):
    with pytest.raises(ValueError, match="exactly one of model_path"):
        HFRollout(eos_token_ids=[1], pad_token_id=0)
    with pytest.raises(ValueError, match="eos_token_ids is empty"):
        HFRollout(tiny_dir, eos_token_ids=[], pad_token_id=0)
    rollout = engine(tiny_dir)
    right_padded = make_prompts(tokenizer)
    right_padded["attention_mask"] = right_padded["attention_mask"].flip(1)
    with pytest.raises(ValueError, match="LEFT-padded"):
        rollout.generate(right_padded, SAMPLED)
    with pytest.raises(KeyError, match="attention_mask"):
        rollout.generate(prompts.select("input_ids"), SAMPLED)


def test_sleep_is_a_logged_no_op_on_cpu(tiny_dir, prompts, caplog):
    rollout = engine(tiny_dir)
    before = rollout.generate(prompts, SAMPLED)
    with caplog.at_level(logging.INFO, logger="tandem.rollout.hf"):
        rollout.sleep()
        rollout.wake()
        rollout.sleep()
    assert caplog.text.count("sleep is a no-op on CPU") == 1
    assert torch.equal(rollout.generate(prompts, SAMPLED)["responses"], before["responses"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_generate_parity_and_sleep_frees_memory(tiny_dir, prompts):
    rollout = engine(tiny_dir, device="cuda")
    out = rollout.generate(prompts, SAMPLED)
    assert out["responses"].device.type == "cpu"
    logits = full_forward_logits(rollout.model, out)
    recomputed = log_probs_from_logits(logits / SAMPLED.temperature, out["responses"])
    mask = out["response_mask"].bool()
    torch.testing.assert_close(out["rollout_log_probs"][mask], recomputed[mask], atol=1e-5, rtol=0)

    torch.cuda.synchronize()
    awake = torch.cuda.memory_allocated()
    rollout.sleep()
    assert torch.cuda.memory_allocated() < awake
    with pytest.raises(RuntimeError, match="wake"):
        rollout.generate(prompts, SAMPLED)
    rollout.wake()
    assert torch.equal(rollout.generate(prompts, SAMPLED)["responses"], out["responses"])
