import pyarrow.parquet as pq
import pytest

from tandem.cli import main
from tandem.demo import run


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


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_runs_grpo_steps_on_ray_workers(tmp_path):
    numbers = run(tmp_path, sft_steps=30, rl_steps=2)
    assert numbers["samples_per_step"] == 32  # 8 prompts x n=4
    assert numbers["step1_reward_errors"] == 0 and numbers["step2_reward_errors"] == 0
    # the second generation first synced the updated actor into the workers' rollout engines
    assert numbers["step1_weight_sync_s"] == 0 and numbers["step2_weight_sync_s"] > 0
    # rollout log-probs are the trainer's (fp32): the largest probability ratio is 1
    assert numbers["step2_rollout_vs_trainer_max_ratio"] == pytest.approx(1.0, abs=1e-4)
    assert numbers["step1_grad_norm"] > 0 and 0.0 <= numbers["accuracy_after_rl"] <= 1.0


def test_config_without_preset_takes_overrides(capsys):
    assert main(["config", "rollout.n=8"]) == 0
    out = capsys.readouterr().out
    assert "n: 8" in out and "adv_estimator: grpo" in out
