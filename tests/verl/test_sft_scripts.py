"""verl's SFT command lines (fsdp_sft_trainer, sft_trainer) read by `tandem sft` / `tandem config`: verl's 10 SFT
example scripts, each SFT key's meaning, and one script run for 2 steps on verl-format GSM8K rows."""

from __future__ import annotations

import json

import pytest

from tandem.cli import main
from tandem.config import ConfigError, load_config
from tandem.config.verl.translate import translate_overrides
from tandem.data import SFTDataset
from tandem.data.synthetic import write_rows
from tandem.models.tiny import save_tiny

from .sft_scripts import SFT_SCRIPTS
from .test_verl_scripts_e2e import single_turn_rows

# torchrun's --nproc_per_node, which the scripts take as their first argument (8 when extracted)
LAUNCHER = ["trainer.n_gpus_per_node=8"]


def _problems(script: list[str]) -> list[str]:
    try:
        load_config("verl_sft", [*LAUNCHER, *script], sft=True, on_verl=lambda t: None)
    except ConfigError as err:
        return [line.strip() for line in str(err).splitlines()[1:] or [str(err)]]
    return []


def test_every_verl_sft_example_script_is_accepted():
    assert len(SFT_SCRIPTS) == 10
    assert {module for module, _ in SFT_SCRIPTS.values()} == {
        "verl.trainer.fsdp_sft_trainer",
        "verl.trainer.sft_trainer",
    }
    refused = {name: _problems(script) for name, (_, script) in SFT_SCRIPTS.items()}
    assert {name: p for name, p in refused.items() if p} == {}


def test_the_cli_picks_verls_sft_defaults_for_a_verl_sft_command_line(capsys):
    _, script = SFT_SCRIPTS["sft_gsm8k_run_qwen_05_peft"]
    assert main(["config", *LAUNCHER, *script]) == 0
    out, err = capsys.readouterr()
    assert "tandem config verl_sft" in err  # verl's SFT defaults under it
    assert "model.partial_pretrain=Qwen/Qwen2.5-0.5B-Instruct  ->  actor.model_path=" in err
    assert "rank: 32" in out and "- question" in out and "lr: 0.0001" in out
    # the sft preset named: Tandem's SFT defaults, verl's SFT keys read
    assert main(["config", "sft", *script]) == 0
    assert "rank: 32" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("verl", "tandem"),
    [
        ("model.partial_pretrain=M", "actor.model_path=M"),
        ("model.path=M", "actor.model_path=M"),
        ("data.micro_batch_size_per_gpu=4", "actor.micro_batch_size_per_rank=4"),
        ("data.train_batch_size=96", "data.train_batch_size=96 actor.ppo_mini_batch_size=96"),
        ("optim.lr=1e-4", "actor.optim.lr=1e-4"),
        ("optim.lr_warmup_steps_ratio=0.1", "actor.optim.warmup_ratio=0.1"),
        ("optim.clip_grad=2.0", "actor.grad_clip=2.0"),
        ("optim.betas=[0.9,0.95]", "actor.optim.betas=[0.9,0.95]"),
        ("model.lora_rank=32", "actor.lora.rank=32"),
        ("model.target_modules=all-linear", 'actor.lora.target_modules=["all-linear"]'),
        ("model.enable_gradient_checkpointing=false", "actor.activation_checkpointing=false"),
        ("ulysses_sequence_parallel_size=2", "actor.fsdp.sequence_parallel=2"),
        ("engine.ulysses_sequence_parallel_size=2", "actor.fsdp.sequence_parallel=2"),
        ("use_remove_padding=true", "actor.sequence_packing=true"),
        ("data.multiturn.messages_key=conv", "data.messages_key=conv"),
        ("trainer.max_ckpt_to_keep=3", "trainer.max_checkpoints_to_keep=3"),
        ("engine=fsdp", "actor.strategy=fsdp"),
        ("data.custom_cls.path=my.py", "data.custom_dataset_file=my.py"),
        ("data.custom_cls.name=Mine", "data.custom_dataset_class=Mine"),
    ],
)
def test_an_sft_key_maps(verl, tandem):
    t = translate_overrides([verl], sft=True)
    assert t.problems == [] and " ".join(t.overrides) == tandem


@pytest.mark.parametrize(
    ("verl", "words"),
    [
        ("data.truncation=left", "error or right"),
        ("data.train_max_samples=100", "reads every row"),
        ("optim.min_lr=1e-6", "optim.min_lr_ratio"),
        ("model.external_lib=foo", "transformers only"),
        ("data.ignore_input_ids_mismatch=true", "turn-by-turn"),
    ],
)
def test_an_sft_key_or_value_tandem_lacks_is_refused_naming_the_key_written(verl, words):
    t = translate_overrides([verl], sft=True)
    assert len(t.problems) == 1
    key, message = t.problems[0]
    assert key == verl.split("=")[0] and words in message and "actor_rollout_ref" not in message.split(":")[0]


def test_sft_keys_with_no_effect_say_why():
    t = translate_overrides(
        ["data.micro_batch_size=4", "data.balance_dp_token=false", "optim=fsdp"], sft=True
    )
    assert t.problems == [] and t.overrides == []
    assert all(why for _, why in t.no_effect) and len(t.no_effect) == 3


def test_an_sft_key_read_outside_sft_is_a_plain_unknown_key():
    with pytest.raises(ConfigError, match="model"):
        load_config("grpo", ["model.partial_pretrain=M"])


def test_prompt_and_response_dict_keys_read_verls_gsm8k_sft_rows(tmp_path):
    from transformers import AutoTokenizer

    model = save_tiny(tmp_path / "model")
    train = write_rows(single_turn_rows("train", 2), tmp_path / "train.parquet")
    tokenizer = AutoTokenizer.from_pretrained(model)
    data = SFTDataset(
        [train],
        tokenizer,
        max_length=256,
        prompt_key="extra_info",
        response_key="extra_info",
        prompt_dict_keys=["question"],
        response_dict_keys=["answer"],
    )
    item = data[0]
    text = tokenizer.decode(item["input_ids"])
    trained = tokenizer.decode([t for t, m in zip(item["input_ids"], item["loss_mask"]) if m])
    assert "Tom has 3 apples" in text and "user" in text  # the question as the user's message
    assert trained.startswith("He has 3 + 4 = 7 apples.\n#### 7")
    with pytest.raises(Exception, match="'solution'"):
        SFTDataset([train], tokenizer, max_length=256, prompt_key="extra_info", prompt_dict_keys=["solution"])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_verls_sft_script_trains_two_steps(ray_local, tmp_path, capsys):
    """verl's sft/gsm8k/run_qwen_05_peft.sh (LoRA SFT on extra_info.question / answer) through `tandem sft`,
    with the tiny model, 8 verl-format GSM8K rows and the sizes of 2 CPU cores."""
    model = save_tiny(tmp_path / "model")
    train = write_rows(single_turn_rows("train", 8), tmp_path / "gsm8k" / "train.parquet")
    val = write_rows(single_turn_rows("test", 4), tmp_path / "gsm8k" / "test.parquet")
    out = tmp_path / "run"
    changes = {
        "data.train_files": str(train),
        "data.val_files": str(val),
        "model.partial_pretrain": str(model),
        "trainer.default_local_dir": str(out),
        "data.micro_batch_size_per_gpu": "2",
        "model.lora_rank": "8",
        "trainer.logger": "[console,jsonl]",
    }
    _, script = SFT_SCRIPTS["sft_gsm8k_run_qwen_05_peft"]
    script = [f"{k}={changes[k]}" if (k := o.lstrip("+").split("=")[0]) in changes else o for o in script]
    sizes = ["data.train_batch_size=4", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=2"]
    assert main(["sft", *script, *sizes]) == 0
    assert "tandem sft verl_sft" in capsys.readouterr().err
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    steps = [m for m in metrics if "sft/loss" in m]
    assert [m["step"] for m in steps] == [1, 2] and all(m["sft/loss"] > 0 for m in steps)
    assert (out / "hf_model").is_dir()
