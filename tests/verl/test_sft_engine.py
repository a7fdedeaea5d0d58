"""`tandem sft` on the command lines of verl's newer SFT trainer, verl.trainer.sft_trainer (sft_trainer_engine.yaml
composed with optim/fsdp.yaml, engine/fsdp.yaml and model/hf_model.yaml; `messages` rows; written as verl's
tests/special_e2e/sft/run_sft_engine.sh writes them): its defaults, its keys, its trained tokens. The older
trainer's (fsdp_sft_trainer) command lines keep that trainer's defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tandem.cli import main
from tandem.config import ConfigError, load_config
from tandem.config.verl.sft_trainers import SFT_TRAINER_ONLY, sft_trainer_of, verl_sft_preset
from tandem.config.verl.translate import translate_overrides
from tandem.data.synthetic import write_rows
from tandem.models.tiny import save_tiny
from tandem.roles.engines import role_engine

from .sft_scripts import SFT_SCRIPTS
from .verl_config import composed
from .verl_keys_script import load_generator

DATA = Path(__file__).parent / "data"

# run_sft_engine.sh's FSDP command line (NUM_GPUS=1) without its optim.* numbers: the trainer's defaults apply
ENGINE_LINE = [
    "data.train_files=train.parquet",
    "data.train_batch_size=128",
    "data.pad_mode=no_padding",
    "data.truncation=error",
    "data.use_dynamic_bsz=True",
    "data.max_token_len_per_gpu=2048",
    "data.messages_key=messages",
    "model.path=Qwen/Qwen2.5-0.5B",
    "model.use_remove_padding=True",
    "engine=fsdp",
    "optim=fsdp",
    "engine.ulysses_sequence_parallel_size=1",
    "engine.strategy=fsdp",
    "trainer.save_freq=-1",
    "trainer.project_name=verl_sft_test",
    "trainer.total_epochs=2",
    "trainer.total_training_steps=2",
    "trainer.resume_mode=disable",
]


def _resolved(overrides: list[str]):
    preset = verl_sft_preset(o.partition("=")[0] for o in overrides)
    return preset, load_config(preset, overrides, sft=True, on_verl=lambda t: None)


def test_the_keys_of_one_trainer_alone_are_those_its_composed_yaml_alone_has():
    keys = load_generator().config_keys
    engine, older = set(keys("sft_trainer_engine")), set(keys("sft_trainer"))
    assert len(engine - older) == 70 and len(older - engine) == 21
    assert {k for k in engine - older if sft_trainer_of(k) != "sft_trainer"} == set()
    assert {k for k in older - engine if sft_trainer_of(k) != "fsdp_sft_trainer"} == set()
    assert {k for k in engine & older if sft_trainer_of(k) is not None} == set()
    # each entry of the table names keys of that difference (or of verl 0.9.1's sft_trainer_engine.yaml, which
    # adds data.num_workers, data.enable_thinking_default, trainer.balance_batch, optim.zero_indexed_step, model.lora)
    added_in_091 = {
        "data.num_workers",
        "data.enable_thinking_default",
        "trainer.balance_batch",
        "optim.zero_indexed_step",
        "model.lora",
    }
    for trainer, own in SFT_TRAINER_ONLY.items():
        only = engine - older if trainer == "sft_trainer" else older - engine
        for entry in own:
            assert entry in added_in_091 or any(k == entry or k.startswith(entry + ".") for k in only), entry


def test_the_newer_trainers_command_line_gets_its_optimizer_defaults():
    """optim/fsdp.yaml's numbers, as verl's sft_trainer composes them, with no optim.* key on the line."""
    preset, cfg = _resolved(ENGINE_LINE)
    verl = composed("sft_trainer_engine")["optim"]
    assert preset == "verl_sft_engine"
    assert (verl["lr"], verl["betas"], verl["weight_decay"]) == (1e-3, [0.9, 0.999], 0.01)
    assert (verl["lr_warmup_steps_ratio"], verl["lr_scheduler_type"], verl["clip_grad"]) == (
        0.0,
        "constant",
        1.0,
    )
    optim = cfg.actor.optim
    assert optim.lr == verl["lr"] and list(optim.betas) == verl["betas"]
    assert optim.weight_decay == verl["weight_decay"] and cfg.actor.grad_clip == verl["clip_grad"]
    assert optim.warmup_ratio == verl["lr_warmup_steps_ratio"] and optim.warmup_steps == 0
    assert optim.lr_scheduler == verl["lr_scheduler_type"] and optim.min_lr_ratio == verl["min_lr_ratio"]
    # the line's own numbers
    assert cfg.actor.use_dynamic_bsz and cfg.actor.max_tokens_per_micro_batch == 2048
    assert cfg.data.train_batch_size == 128 and cfg.data.messages_key == "messages"


def test_the_newer_trainers_defaults_hold_without_the_lines_data_keys():
    """A line with the model and data files alone: the trainer's data defaults too (dynamic batches of 8192)."""
    _, cfg = _resolved(["model.path=M", "data.train_files=train.parquet"])
    verl = composed("sft_trainer_engine")["data"]
    assert cfg.actor.use_dynamic_bsz is verl["use_dynamic_bsz"] is True
    assert cfg.actor.max_tokens_per_micro_batch == verl["max_token_len_per_gpu"] == 8192
    assert cfg.data.max_length == verl["max_length"] and cfg.data.train_batch_size == verl["train_batch_size"]
    assert cfg.actor.sequence_packing and cfg.actor.optim.lr == 1e-3


def test_the_older_trainers_command_line_keeps_its_defaults():
    """fsdp_sft_trainer's sft_trainer.yaml: lr 1e-5, betas (0.9, 0.95), cosine (its optim.lr_scheduler), warm-up 0.1."""
    _, script = SFT_SCRIPTS["sft_gsm8k_run_gemma_2b"]
    preset, cfg = _resolved(["trainer.n_gpus_per_node=8", *script])
    verl = composed("sft_trainer")["optim"]
    assert preset == "verl_sft"
    assert cfg.actor.optim.lr == verl["lr"] == 1e-5 and list(cfg.actor.optim.betas) == verl["betas"]
    assert cfg.actor.optim.warmup_ratio == verl["lr_warmup_steps_ratio"] == 0.1
    assert cfg.actor.optim.lr_scheduler == "cosine" and cfg.actor.grad_clip == verl["clip_grad"]
    assert cfg.actor.optim.weight_decay == verl["weight_decay"]


def test_the_cli_names_the_newer_trainers_preset(capsys):
    assert main(["config", *ENGINE_LINE]) == 0
    assert "tandem config verl_sft_engine" in capsys.readouterr().err


def test_keys_of_both_trainers_on_one_line_are_refused_naming_both():
    with pytest.raises(ConfigError, match="model.path .*model.partial_pretrain"):
        verl_sft_preset(["model.path", "model.partial_pretrain", "data.train_files"])
    # keys Tandem has too (data.prompt_key, data.messages_key) do not decide
    assert verl_sft_preset(["model.path", "data.prompt_key"]) == "verl_sft_engine"
    assert verl_sft_preset(["model.partial_pretrain", "data.messages_key"]) == "verl_sft"
    assert verl_sft_preset(["+model.override_config.attn_implementation", "optim.lr"]) == "verl_sft_engine"


def test_the_sft_token_budget_is_checked_against_data_max_length():
    """An SFT row is at most data.max_length tokens; max_prompt_length + max_response_length (RL's, 1024 here
    and unused by SFT) does not bound it."""
    keys = ["data.use_dynamic_bsz=True", "data.max_token_len_per_gpu=160"]
    _, cfg = _resolved([*ENGINE_LINE, *keys, "data.max_length=128"])
    assert cfg.actor.max_tokens_per_micro_batch == 160 and cfg.data.max_length == 128
    assert cfg.data.max_prompt_length + cfg.data.max_response_length > 160
    with pytest.raises(ConfigError) as err:
        _resolved([*ENGINE_LINE, *keys, "data.max_length=256"])
    assert "cannot hold one full-length sample (data.max_length = 256 tokens)" in str(err.value)
    # fsdp_sft_trainer has no token budget (micro-batches of data.micro_batch_size_per_gpu rows): its keys are
    # the newer trainer's, so on its line they are refused naming both trainers, as verl's Hydra refuses them
    _, script = SFT_SCRIPTS["sft_gsm8k_run_gemma_2b"]
    with pytest.raises(ConfigError, match="data.use_dynamic_bsz is a key of verl.trainer.sft_trainer"):
        _resolved([*script, *keys])


@pytest.mark.parametrize(
    ("verl", "tandem"),
    [
        ("trainer.logger=['console','file']", 'trainer.loggers=["console", "jsonl"]'),
        ("trainer.logger=[console,jsonl,file]", 'trainer.loggers=["console", "jsonl"]'),
        (
            "+engine.mixed_precision={param_dtype:fp32}",
            'actor.fsdp={"param_dtype": "float32", "reduce_dtype": "float32"}',
        ),
        (
            "+engine.mixed_precision={param_dtype:bf16,reduce_dtype:fp32,buffer_dtype:fp32}",
            'actor.fsdp={"param_dtype": "bfloat16", "reduce_dtype": "float32"}',
        ),
        ("+engine.mixed_precision.param_dtype=fp16", "actor.fsdp.param_dtype=float16"),
        ("+model.override_config.rms_norm_eps=0.001", "actor.override_config.rms_norm_eps=0.001"),
        ("+model.override_config.model_config.rope_theta=5000", "actor.override_config.rope_theta=5000"),
        ("+model.override_config.attn_implementation=eager", "actor.fsdp.attn_implementation=eager"),
        (
            "+model.override_config={rms_norm_eps:0.001,attn_implementation:sdpa}",
            'actor={"override_config": {"rms_norm_eps": 0.001}, "fsdp": {"attn_implementation": "sdpa"}}',
        ),
    ],
)
def test_a_key_verls_sft_trainer_acts_on_maps(verl, tandem):
    t = translate_overrides([verl], sft=True)
    assert t.problems == [] and " ".join(t.overrides) == tandem


def test_data_num_workers_has_no_effect_and_says_why():
    t = translate_overrides(["data.num_workers=8"], sft=True)
    assert t.problems == [] and t.overrides == []
    assert "tokenizes every row once" in t.no_effect[0][1]


@pytest.mark.parametrize(
    ("verl", "words"),
    [
        ("+engine.mixed_precision={param_dtype:fp8}", "not 'fp8'"),
        ("+engine.mixed_precision={buffer_dtype:bf16}", "buffers"),
        ("+engine.mixed_precision={param:bf16}", "param_dtype, reduce_dtype and buffer_dtype"),
        ("+model.override_config=7", "mapping"),
    ],
)
def test_a_value_tandem_cannot_act_on_is_refused_naming_the_key(verl, words):
    t = translate_overrides([verl], sft=True)
    assert (
        len(t.problems) == 1
        and t.problems[0][0] == verl.split("=")[0].lstrip("+")
        and words in t.problems[0][1]
    )


def test_the_compute_dtype_reaches_the_resolved_config():
    _, cfg = _resolved([*ENGINE_LINE, "+engine.mixed_precision={param_dtype:fp32,reduce_dtype:bf16}"])
    assert (cfg.actor.fsdp.param_dtype, cfg.actor.fsdp.reduce_dtype) == ("float32", "bfloat16")
    _, cfg = _resolved([*ENGINE_LINE, "trainer.logger=['console','file']"])
    assert cfg.trainer.loggers == ["console", "jsonl"]


def test_model_override_config_is_set_on_the_sft_model_before_it_is_built(one_rank, tmp_path):
    """The attributes are on the built model's config, the modules built from them use them, and the exported
    config.json keeps them (verl's update_model_config before the model is built)."""
    model = one_rank
    line = [*ENGINE_LINE, f"model.path={model}", "+model.override_config.rms_norm_eps=0.001"]
    line += ["+model.override_config.max_window_layers=1", "+model.override_config.attn_implementation=eager"]
    _, cfg = _resolved(line)
    assert cfg.actor.override_config == {"rms_norm_eps": 0.001, "max_window_layers": 1}
    engine = role_engine(
        cfg,
        torch.device("cpu"),
        str(model),
        "lm",
        cfg.actor.optim,
        1.0,
        2,
        "actor",
        override_config=cfg.actor.override_config,  # as the worker builds the actor
    )
    built = engine.model.config
    assert (
        built.rms_norm_eps == 0.001 and built.max_window_layers == 1 and built._attn_implementation == "eager"
    )
    norms = [m for m in engine.model.modules() if type(m).__name__.endswith("RMSNorm")]
    assert norms and {m.variance_epsilon for m in norms} == {0.001}
    engine.export_hf(tmp_path / "hf")
    exported = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert exported["rms_norm_eps"] == 0.001 and exported["max_window_layers"] == 1
    # the folder's own config is untouched
    assert json.loads((model / "config.json").read_text())["rms_norm_eps"] != 0.001


def test_both_trainers_lines_train_each_assistant_turn_whole_by_default():
    """verl's MultiTurnSFTDataset (both trainers at b178a3c) trains the whole turn; Tandem's own preset the turn up to
    its stop token."""
    _, script = SFT_SCRIPTS["sft_multiturn_run_qwen_05_sp2"]
    assert _resolved(ENGINE_LINE)[1].data.sft_loss_mask == "turn"
    assert _resolved(["trainer.n_gpus_per_node=8", *script])[1].data.sft_loss_mask == "turn"
    assert load_config("sft", ["data.train_files=[t.parquet]"]).data.sft_loss_mask == "stop"


def conversations(n: int) -> list[dict]:
    """Two-turn conversations whose assistant turns are `a{i}` and `b{i}{i}`."""
    return [
        {
            "messages": [
                {"role": "user", "content": f"q{i}"},
                {"role": "assistant", "content": f"a{i}"},
                {"role": "user", "content": "more"},
                {"role": "assistant", "content": f"b{i}{i}"},
            ]
        }
        for i in range(n)
    ]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_newer_trainers_line_trains_a_base_models_multi_turn_rows(tmp_path, capsys):
    """A base model's folder (generation_config eos <|endoftext|> alone; the template ends turns with <|im_end|>):
    verl's sft_trainer line trains its multi-turn rows, every assistant turn whole (`<|im_end|>\\n` included), with
    verl's keys of slice 3 on the line; metrics go to metrics.jsonl through verl's `file` logger."""
    model = save_tiny(tmp_path / "model")
    assert json.loads((model / "generation_config.json").read_text())["eos_token_id"] == 1  # <|endoftext|>
    train = write_rows(conversations(8), tmp_path / "train.parquet")
    out = tmp_path / "run"
    line = [
        o for o in ENGINE_LINE if not o.startswith(("data.train_files", "model.path", "data.train_batch"))
    ]
    line += [
        f"data.train_files={train}",
        f"model.path={model}",
        f"trainer.default_local_dir={out}",
        "data.train_batch_size=4",
        "data.max_length=64",
        "data.num_workers=8",
        "trainer.logger=['console','file']",
        "+engine.mixed_precision={param_dtype:fp32}",
        "+model.override_config.rms_norm_eps=0.001",
        "trainer.n_gpus_per_node=1",
        "trainer.backend=inprocess",
        "trainer.device=cpu",
        "trainer.progress_bar=false",
    ]
    assert main(["sft", *line]) == 0
    assert "tandem sft verl_sft_engine" in capsys.readouterr().err
    steps = [m for m in map(json.loads, (out / "metrics.jsonl").open()) if "sft/loss" in m]
    assert [m["step"] for m in steps] == [1, 2]
    # one epoch of the 8 rows: each assistant turn's content + <|im_end|> + "\n" (one token each, the tiny
    # tokenizer reads a character a token)
    assert sum(m["sft/tokens"] for m in steps) == sum(
        len(f"a{i}") + 2 + len(f"b{i}{i}") + 2 for i in range(8)
    )
    assert json.loads((out / "hf_model" / "config.json").read_text())["rms_norm_eps"] == 0.001
