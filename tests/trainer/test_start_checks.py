"""Start-up checks (tandem/trainer/start_checks/): model and tokenizer folders, the tokenizer round trip
on the run's own prompts, and every row's ground truth against its scorer. No Ray, no training: each
test builds a trainer (or runs the CLI) and stops at the check."""

from __future__ import annotations

import logging
import shutil
import string
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, decoders
from tokenizers.models import BPE
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from tandem.config import ConfigError
from tandem.data import DataError, write_rows, write_splits
from tandem.models.tiny import (
    CHAT_TEMPLATE,
    EOS_TOKEN,
    IM_END,
    IM_START,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    save_tiny,
)
from tandem.trainer import RLTrainer, SFTTrainer
from tandem.trainer.start_checks.tokenizers import load_tokenizer, round_trip_warning

from .trainer_helpers import run_config

TEXT = "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per printable ASCII character (spaces and newlines included), with no byte-level
    pre-tokenizer: the kind of tokenizer a Qwen2 tokenizer class cannot stand in for."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for char in string.printable:
        vocab.setdefault(char, len(vocab))
    backend = Tokenizer(BPE(vocab=vocab, merges=[], unk_token=EOS_TOKEN))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        extra_special_tokens=[IM_START, IM_END],
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def char_folders(tmp_path_factory) -> dict[str, Path]:
    """`qwen2`: a tiny Qwen2 model saved with the character tokenizer; `tokenizer`: that tokenizer alone."""
    root = tmp_path_factory.mktemp("char")
    tokenizer = build_char_tokenizer()
    tokenizer.save_pretrained(root / "tokenizer")
    config = Qwen2Config(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    Qwen2ForCausalLM(config).save_pretrained(root / "qwen2")
    tokenizer.save_pretrained(root / "qwen2")
    return {"qwen2": root / "qwen2", "tokenizer": root / "tokenizer"}


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("assets")
    files = write_splits("addition", root / "data", n_train=16, n_val=8, seed=0, digits=1)
    return {"model": save_tiny(root / "model"), **files}


def test_a_character_tokenizer_in_a_qwen2_folder_loses_spaces_and_newlines(char_folders):
    """The fact the check exists for (DESIGN.md, "Facts measured"): the same tokenizer files decode
    differently by folder, because AutoTokenizer picks Qwen2's class from config.json."""
    alone = AutoTokenizer.from_pretrained(char_folders["tokenizer"])
    in_qwen2 = AutoTokenizer.from_pretrained(char_folders["qwen2"])
    assert alone.decode(alone(TEXT, add_special_tokens=False)["input_ids"]) == TEXT
    lost = in_qwen2.decode(in_qwen2(TEXT, add_special_tokens=False)["input_ids"])
    assert lost == "<|im_start|>userWhatis2+3?<|im_end|>"


def test_round_trip_warning_shows_the_text_and_what_it_decodes_to(char_folders):
    broken = AutoTokenizer.from_pretrained(char_folders["qwen2"])
    samples = [("train.parquet row 0", "1+1=2"), ("train.parquet row 1", TEXT)]
    warning = round_trip_warning(broken, samples, "actor.model_path", "/m")
    assert warning is not None
    assert "actor.model_path=/m" in warning and "actor.tokenizer_path" in warning
    assert "1 of the first 2 prompts change" in warning
    assert "train.parquet row 1" in warning and "'<|im_start|>user\\nWhat is 2 + 3?" in warning
    assert "'<|im_start|>userWhatis2+3?<|im_end|>'" in warning and "character 16" in warning
    good = AutoTokenizer.from_pretrained(char_folders["tokenizer"])
    assert round_trip_warning(good, samples, "actor.tokenizer_path", "/t") is None


def test_trainer_warns_on_a_tokenizer_that_changes_the_prompts_and_tokenizer_path_fixes_it(
    char_folders, assets, tmp_path, caplog
):
    # rollout.engine=hf: the character model's head size (16) is one vLLM's CPU attention does not take
    cfg = run_config({**assets, "model": char_folders["qwen2"]}, tmp_path, "grpo", "rollout.engine=hf")
    with caplog.at_level(logging.WARNING, logger="tandem.trainer.start_checks.tokenizers"):
        RLTrainer(cfg)
    warnings = [r.getMessage() for r in caplog.records if r.name == "tandem.trainer.start_checks.tokenizers"]
    assert len(warnings) == 1 and "Qwen2Tokenizer" in warnings[0] and "train.parquet row 0" in warnings[0]

    caplog.clear()
    cfg = run_config(
        {**assets, "model": char_folders["qwen2"]},
        tmp_path,
        "grpo",
        f"actor.tokenizer_path={char_folders['tokenizer']}",
        "rollout.engine=hf",
    )
    with caplog.at_level(logging.WARNING, logger="tandem.trainer.start_checks.tokenizers"):
        trainer = RLTrainer(cfg)
    assert not [r for r in caplog.records if r.name == "tandem.trainer.start_checks.tokenizers"]
    # The prompts are the character tokenizer's ids: "\n" (one token) survives.
    newline = trainer.tokenizer("\n", add_special_tokens=False)["input_ids"]
    assert len(newline) == 1 and newline[0] in trainer.train_data[0]["input_ids"]


def test_sft_trainer_checks_its_rows_too(char_folders, tmp_path, caplog):
    rows = [{"prompt": [{"role": "user", "content": "2 + 3"}], "response": "is 5", "data_source": "x"}] * 4
    data = write_rows(rows, tmp_path / "sft.parquet")
    cfg = run_config(
        {"model": char_folders["qwen2"], "train": data, "val": data}, tmp_path, "sft", "data.max_length=64"
    )
    with caplog.at_level(logging.WARNING, logger="tandem.trainer.start_checks.tokenizers"):
        SFTTrainer(cfg)
    (message,) = [
        r.getMessage() for r in caplog.records if r.name == "tandem.trainer.start_checks.tokenizers"
    ]
    assert (
        "sft.parquet row 0 is '<|im_start|>user\\n2 + 3<|im_end|>\\n<|im_start|>assistant\\nis 5'" in message
    )
    assert "decodes as '<|im_start|>user2+3<|im_end|><|im_start|>assistantis5'" in message


# --- model folders --------------------------------------------------------------------------------------


def _broken_folders(model: Path, root: Path) -> dict[str, tuple[Path, str]]:
    """Folders that are not a model, each with what the error must say is missing."""
    empty = root / "empty"
    empty.mkdir()
    no_config = root / "no_config"
    shutil.copytree(model, no_config)
    (no_config / "config.json").unlink()
    no_weights = root / "no_weights"
    shutil.copytree(model, no_weights)
    (no_weights / "model.safetensors").unlink()
    no_tokenizer = root / "no_tokenizer"
    shutil.copytree(model, no_tokenizer)
    (no_tokenizer / "tokenizer.json").unlink()
    return {
        "missing": (root / "nope", "the folder does not exist"),
        "empty": (empty, "the folder is empty"),
        "no_config": (no_config, "no config.json in it (it holds: chat_template.jinja"),
        "no_weights": (no_weights, "no weights in it: no *.safetensors"),
        "no_tokenizer": (no_tokenizer, "no tokenizer files in it: none of tokenizer.json"),
    }


@pytest.mark.parametrize("kind", ["missing", "empty", "no_config", "no_weights", "no_tokenizer"])
def test_a_broken_actor_folder_is_a_config_error_naming_key_folder_and_what_is_missing(
    assets, tmp_path, kind
):
    folder, missing = _broken_folders(assets["model"], tmp_path)[kind]
    cfg = run_config({**assets, "model": folder}, tmp_path, "grpo")
    with pytest.raises(ConfigError) as raised:
        RLTrainer(cfg)
    assert str(raised.value).startswith(f"actor.model_path={folder}: {missing}")
    if kind == "no_tokenizer":
        assert "set actor.tokenizer_path to the folder that holds them" in str(raised.value)


def test_every_role_folder_is_checked_and_all_problems_are_listed(assets, tmp_path):
    cfg = run_config(
        assets,
        tmp_path,
        "ppo",  # gae: a critic
        f"critic.model_path={tmp_path / 'critic'}",
        "reward.reward_model.enable=true",
        f"reward.reward_model.model_path={tmp_path / 'rm'}",
        f"actor.tokenizer_path={tmp_path / 'tok'}",
    )
    with pytest.raises(ConfigError) as raised:
        RLTrainer(cfg)
    problems = raised.value.problems
    assert problems == [
        f"critic.model_path={tmp_path / 'critic'}: the folder does not exist; point critic.model_path at a "
        "local Hugging Face folder of the critic (config.json, weights, tokenizer)",
        f"reward.reward_model.model_path={tmp_path / 'rm'}: the folder does not exist; point "
        "reward.reward_model.model_path at a local Hugging Face folder of the reward model (config.json, "
        "weights, tokenizer)",
        f"actor.tokenizer_path={tmp_path / 'tok'}: the folder does not exist; point actor.tokenizer_path at "
        "a folder holding the tokenizer files, or leave it unset",
    ]


def test_eval_and_sft_check_the_actor_folder(assets, tmp_path):
    cfg = run_config({**assets, "model": tmp_path / "gone"}, tmp_path, "grpo")
    with pytest.raises(ConfigError, match="actor.model_path=.*gone: the folder does not exist"):
        RLTrainer(cfg, train=False)
    cfg = run_config({**assets, "model": tmp_path / "gone"}, tmp_path, "sft")
    with pytest.raises(ConfigError, match="actor.model_path=.*gone: the folder does not exist"):
        SFTTrainer(cfg)


def test_a_tokenizer_transformers_cannot_load_names_the_key(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError) as raised:
        load_tokenizer(str(tmp_path), "actor.tokenizer_path")
    assert str(raised.value).startswith(
        f"actor.tokenizer_path={tmp_path}: transformers cannot load a tokenizer"
    )


def test_a_critic_with_another_tokenizer_is_a_warning(assets, char_folders, tmp_path, caplog):
    cfg = run_config(assets, tmp_path, "ppo", f"critic.tokenizer_path={char_folders['tokenizer']}")
    with caplog.at_level(logging.WARNING, logger="tandem.trainer.start_checks.tokenizers"):
        RLTrainer(cfg)
    messages = [r.getMessage() for r in caplog.records if r.name == "tandem.trainer.start_checks.tokenizers"]
    assert len(messages) == 1
    assert messages[0].startswith(f"the critic's tokenizer ({char_folders['tokenizer']}) encodes")
    assert "set critic.tokenizer_path" in messages[0]


# --- ground truth ---------------------------------------------------------------------------------------

PROMPT = [{"role": "user", "content": "1+1="}]


def _data(tmp_path: Path, rows: list[dict]) -> Path:
    return write_rows(rows, tmp_path / "train.jsonl")


def test_bad_ground_truth_is_a_data_error_naming_file_row_field_expected_and_found(assets, tmp_path):
    rows = [
        {"prompt": PROMPT, "data_source": "addition", "reward_model": {"ground_truth": "2"}},
        {"prompt": PROMPT, "data_source": "addition", "reward_model": {"ground_truth": "two"}},
        {"prompt": PROMPT, "data_source": "addition", "reward_model": {"ground_truth": None}},
        {"prompt": PROMPT, "data_source": "gsm8k"},
        {"prompt": PROMPT, "data_source": "countdown", "reward_model": {"ground_truth": {"target": 3}}},
    ]
    train = _data(tmp_path, rows)
    cfg = run_config({**assets, "train": train}, tmp_path, "grpo")
    with pytest.raises(DataError) as raised:
        RLTrainer(cfg)
    lines = str(raised.value).splitlines()
    assert lines[0].startswith("4 row(s) hold a ground truth their scorer cannot use")
    assert lines[1] == (
        f"  - {train} row 1 (line 2): field 'reward_model.ground_truth' (data_source 'addition', scored by "
        "scorer 'addition'): expected a whole number such as 42 or '42'; found 'two' (str)"
    )
    assert lines[2].endswith("expected a whole number such as 42 or '42'; it is null")
    assert f"{train} row 3 (line 4)" in lines[3] and "scorer 'gsm8k'" in lines[3]
    assert lines[3].endswith("the row has no reward_model.ground_truth")
    assert f"{train} row 4 (line 5)" in lines[4] and "found {'target': 3} (dict)" in lines[4]


CUSTOM = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.strip() == ground_truth["answer"])


def check_ground_truth(data_source, ground_truth):
    if not isinstance(ground_truth, dict) or not isinstance(ground_truth.get("answer"), str):
        return "expected {'answer': <text>}"
    return None
"""


def test_a_custom_reward_file_declares_its_check(assets, tmp_path):
    file = tmp_path / "my_reward.py"
    file.write_text(CUSTOM)
    rows = [
        {"prompt": PROMPT, "data_source": "mine", "reward_model": {"ground_truth": {"answer": "2"}}},
        {"prompt": PROMPT, "data_source": "mine", "reward_model": {"ground_truth": "2"}},
    ] * 2  # a batch of 4 prompts
    train = _data(tmp_path, rows)
    cfg = run_config(
        {**assets, "train": train, "val": train}, tmp_path, "grpo", f"reward.custom_reward_file={file}"
    )
    with pytest.raises(DataError) as raised:
        RLTrainer(cfg)
    assert str(raised.value).splitlines()[1] == (
        f"  - {train} row 1 (line 2): field 'reward_model.ground_truth' (data_source 'mine', scored by "
        f"compute_score in {file}): expected {{'answer': <text>}}; found '2' (str)"
    )
    rows[1] = rows[3] = rows[0]
    train = _data(tmp_path, rows)
    cfg = run_config(
        {**assets, "train": train, "val": train}, tmp_path, "grpo", f"reward.custom_reward_file={file}"
    )
    RLTrainer(cfg)  # every row passes


def test_validation_rows_are_checked_too(assets, tmp_path):
    val = write_rows([{"prompt": PROMPT, "data_source": "math"}], tmp_path / "val.parquet")
    cfg = run_config({**assets, "val": val}, tmp_path, "grpo")
    with pytest.raises(
        DataError, match=r"val.parquet row 0: field 'reward_model.ground_truth' \(data_source 'math'"
    ):
        RLTrainer(cfg)


# --- through the CLI: exit 2, no Ray ---------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tandem.cli", *args], capture_output=True, text=True, timeout=300
    )


def _common(assets: dict[str, Path], out: Path) -> list[str]:
    return [
        f"data.train_files=[{assets['train']}]",
        f"data.val_files=[{assets['val']}]",
        f"trainer.output_dir={out}",
        "data.train_batch_size=4",
        "actor.ppo_mini_batch_size=2",
    ]


def test_cli_missing_model_folder_exits_2_for_train_eval_and_sft(assets, tmp_path):
    gone = tmp_path / "gone"
    for command in ("train", "eval", "sft"):
        preset = "sft" if command == "sft" else "grpo"
        done = run_cli(command, preset, f"actor.model_path={gone}", *_common(assets, tmp_path))
        assert done.returncode == 2, (command, done.stderr)
        assert f"actor.model_path={gone}: the folder does not exist" in done.stderr
        assert "Traceback" not in done.stderr and "Started a local Ray" not in done.stderr


def test_cli_bad_ground_truth_exits_2_naming_the_row(assets, tmp_path):
    bad = write_rows(
        [{"prompt": PROMPT, "data_source": "addition", "reward_model": {"ground_truth": "two"}}],
        tmp_path / "bad.parquet",
    )
    done = run_cli(
        "train", "grpo", f"actor.model_path={assets['model']}", *_common({**assets, "train": bad}, tmp_path)
    )
    assert done.returncode == 2
    assert (
        f"{bad} row 0: field 'reward_model.ground_truth'" in done.stderr
        and "found 'two' (str)" in done.stderr
    )
    assert "Started a local Ray" not in done.stderr


def test_cli_prints_the_tokenizer_warning_before_any_worker(assets, char_folders, tmp_path):
    """The warning comes before the ground-truth check, so a bad row stops the run right after it."""
    bad = write_rows(
        [{"prompt": PROMPT, "data_source": "addition", "reward_model": {"ground_truth": "two"}}],
        tmp_path / "bad.parquet",
    )
    done = run_cli(
        "train",
        "grpo",
        f"actor.model_path={char_folders['qwen2']}",
        *_common({**assets, "train": bad}, tmp_path),
    )
    assert done.returncode == 2 and "Started a local Ray" not in done.stderr
    assert "does not give back the text it encodes" in done.stderr
    assert "set actor.tokenizer_path" in done.stderr and "'<|im_start|>user\\n1+1=" in done.stderr


def test_tandem_sft_says_the_dump_folders_have_no_effect(char_folders, tmp_path, caplog):
    rows = [{"prompt": [{"role": "user", "content": "2 + 3"}], "response": "is 5", "data_source": "x"}] * 4
    data = write_rows(rows, tmp_path / "sft.parquet")
    cfg = run_config(
        {"model": char_folders["qwen2"], "train": data, "val": data},
        tmp_path,
        "sft",
        "trainer.rollout_data_dir=dumps",
    )
    with caplog.at_level(logging.WARNING, logger="tandem.trainer.sft"):
        SFTTrainer(cfg)
    (message,) = [r.getMessage() for r in caplog.records if r.name == "tandem.trainer.sft"]
    assert message.startswith(
        "trainer.rollout_data_dir has no effect in tandem sft: SFT trains on the dataset's"
    )


def test_tandem_sft_refuses_the_rl_sampler_and_reads_a_dataset_class_before_any_worker(
    char_folders, tmp_path
):
    rows = [{"prompt": [{"role": "user", "content": "2 + 3"}], "response": "is 5", "data_source": "x"}] * 4
    data = write_rows(rows, tmp_path / "sft.parquet")
    mine = tmp_path / "mine.py"
    mine.write_text("class Mine:\n    pass\n")
    folders = {"model": char_folders["qwen2"], "train": data, "val": data}
    cfg = run_config(folders, tmp_path, "sft", f"data.sampler_file={mine}", "data.sampler_class=Mine")
    with pytest.raises(ConfigError, match="data.sampler_file=.* is read by RL training"):
        SFTTrainer(cfg)
    # a dataset class is tandem sft's too (verl's SFT data.custom_cls): loaded and checked as the trainer is built
    cfg = run_config(
        folders, tmp_path, "sft", f"data.custom_dataset_file={mine}", "data.custom_dataset_class=Mine"
    )
    with pytest.raises(DataError, match=rf"class 'Mine' \({mine} line 1\) is not a torch.utils.data.Dataset"):
        SFTTrainer(cfg)
