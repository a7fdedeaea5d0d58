import pyarrow.parquet as pq
import pytest
import torch

from tandem.cli import main
from tandem.demo import response_mask_from, run


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


def test_response_mask_stops_after_first_eos():
    eos, pad = 1, 0
    responses = torch.tensor([[5, 6, 1, 7], [5, 1, 1, 0], [5, 6, 7, 8], [1, 0, 0, 0]])
    expected = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    assert torch.equal(response_mask_from(responses, eos, pad), expected)


@pytest.mark.slow
def test_demo_runs_one_real_grpo_step(tmp_path):
    numbers = run(tmp_path, sft_steps=30)
    assert numbers["samples"] == 32  # 8 prompts x n=4
    assert numbers["reward_errors"] == 0 and numbers["reward_timeouts"] == 0
    assert 0.0 <= numbers["accuracy_after_sft"] <= 1.0
    # the update moved the policy: the old/new log-prob gap is non-zero unless every advantage was 0
    assert (numbers["kl_after_update"] != 0.0) == (numbers["advantage_abs_mean"] > 0.0)
    assert numbers["grad_norm"] >= 0.0


def test_config_without_preset_takes_overrides(capsys):
    assert main(["config", "rollout.n=8"]) == 0
    out = capsys.readouterr().out
    assert "n: 8" in out and "adv_estimator: grpo" in out
