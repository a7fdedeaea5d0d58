import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tandem.cli import main
from tandem.data import save_tiny, write_rows, write_splits
from tandem.trainer.quickstart import run as run_quickstart


def test_config_prints_resolved_yaml(capsys):
    assert main(["config", "grpo", "actor.optim.lr=1e-6"]) == 0
    out = capsys.readouterr().out
    assert "lr: 1.0e-06" in out and "adv_estimator: grpo" in out


def test_config_error_exits_2_and_names_the_key(capsys):
    assert main(["config", "grpo", "actor.optim.lrr=1e-6"]) == 2
    err = capsys.readouterr().err
    assert "actor.optim.lrr" in err and "actor.optim.lr" in err


def test_presets_lists_grpo_and_ppo(capsys):
    assert main(["presets"]) == 0
    names = capsys.readouterr().out.split()
    assert {"grpo", "ppo", "dapo"} <= set(names)


def test_data_writes_train_and_val(tmp_path, capsys):
    assert main(["data", "addition", str(tmp_path), "--n-train", "5", "--n-val", "3"]) == 0
    assert pq.read_table(tmp_path / "train.parquet").num_rows == 5
    assert pq.read_table(tmp_path / "val.parquet").num_rows == 3
    assert main(["data", "sudoku", str(tmp_path)]) == 2
    assert "unknown task 'sudoku'" in capsys.readouterr().err


def test_config_without_preset_takes_overrides(capsys):
    assert main(["config", "rollout.n=8"]) == 0
    out = capsys.readouterr().out
    assert "n: 8" in out and "adv_estimator: grpo" in out


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """The real command in a fresh process, so that nothing (Ray, workers) is started in this one."""
    return subprocess.run(
        [sys.executable, "-m", "tandem.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_train_with_a_bad_key_exits_2_naming_it_before_any_worker(tmp_path):
    done = run_cli("train", "grpo", "actor.optim.lrr=1e-6", f"trainer.output_dir={tmp_path}")
    assert done.returncode == 2
    assert "actor.optim.lrr" in done.stderr and "actor.optim.lr" in done.stderr
    assert "Started a local Ray" not in done.stderr and not (tmp_path / "tandem").exists()


def test_train_without_data_or_with_a_missing_file_names_the_key(tmp_path):
    done = run_cli("train", "grpo", f"trainer.output_dir={tmp_path}")
    assert done.returncode == 2 and "data.train_files" in done.stderr and "actor.model_path" in done.stderr
    done = run_cli("train", "grpo", f"data.train_files=[{tmp_path / 'nope.parquet'}]")
    assert done.returncode == 2 and "nope.parquet' does not exist" in done.stderr


def test_train_with_a_bad_row_names_the_file_and_row(tmp_path):
    model = save_tiny(tmp_path / "model")
    bad = write_rows([{"prompt": [{"role": "user", "content": "1+1="}]}], tmp_path / "bad.parquet")
    done = run_cli("train", "grpo", f"actor.model_path={model}", f"data.train_files=[{bad}]")
    assert done.returncode == 2
    assert "bad.parquet row 0" in done.stderr and "data_source" in done.stderr
    assert "Started a local Ray" not in done.stderr


def test_train_with_an_unscorable_data_source_fails_before_the_workers(tmp_path):
    model = save_tiny(tmp_path / "model")
    rows = [{"prompt": [{"role": "user", "content": "1+1="}], "data_source": "my_task"}] * 8
    data = write_rows(rows, tmp_path / "train.parquet")
    done = run_cli("train", "grpo", f"actor.model_path={model}", f"data.train_files=[{data}]")
    assert done.returncode == 2 and "my_task" in done.stderr
    assert "Started a local Ray" not in done.stderr


def test_train_with_an_engine_not_built_yet_fails_before_the_workers(tmp_path):
    model = save_tiny(tmp_path / "model")
    data = write_splits("addition", tmp_path / "data", n_train=8, n_val=4, digits=2)["train"]
    done = run_cli(
        "train", "grpo", f"actor.model_path={model}", f"data.train_files=[{data}]", "rollout.engine=sglang"
    )
    assert done.returncode == 2 and "rollout.engine=sglang" in done.stderr
    assert "Started a local Ray" not in done.stderr


def test_train_with_a_model_megatron_cannot_split_fails_before_the_workers(tmp_path):
    model = save_tiny(tmp_path / "model")  # 2 key-value heads: 4 tensor-parallel ranks cannot share them
    data = write_splits("addition", tmp_path / "data", n_train=8, n_val=4, digits=2)["train"]
    done = run_cli(
        "train",
        "grpo",
        f"actor.model_path={model}",
        f"data.train_files=[{data}]",
        "actor.strategy=megatron",
        "actor.megatron.tensor_parallel=4",
        "actor.megatron.context_parallel=2",
        "trainer.workers_per_node=8",
        "data.train_batch_size=8",
        "actor.ppo_mini_batch_size=8",
    )
    assert done.returncode == 2, done.stderr
    assert "actor.model_path" in done.stderr and "num_key_value_heads=2" in done.stderr
    assert "context_parallel / expert_parallel > 1 are not available yet" in done.stderr
    assert "Started a local Ray" not in done.stderr


def test_export_of_a_folder_that_is_no_checkpoint_exits_2(tmp_path):
    done = run_cli("export", str(tmp_path), str(tmp_path / "out"))
    assert done.returncode == 2 and "not a complete Tandem checkpoint" in done.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quickstart_runs_sft_then_grpo_and_plots(ray_local, tmp_path):
    numbers = run_quickstart(
        tmp_path,
        ["trainer.total_training_steps=2", "trainer.test_freq=1", "trainer.loggers=[jsonl]"],
        sft_overrides=["trainer.total_training_steps=4"],
    )
    assert [step for step, _ in numbers["accuracy_per_validation"]] == [0, 1, 2]
    assert 0 <= numbers["accuracy_after_sft"] <= 1 and 0 <= numbers["accuracy_after_rl"] <= 1
    assert [step for step, _ in numbers["reward_per_step"]] == [1, 2]
    assert Path(numbers["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "quickstart/sft/hf_model/model.safetensors").is_file()
