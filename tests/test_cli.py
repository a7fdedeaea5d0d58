import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from tandem import cli
from tandem.cli import headline, main, write_error_log
from tandem.commands import quickstart
from tandem.commands.quickstart import prepare as prepare_quickstart
from tandem.commands.quickstart import run as run_quickstart
from tandem.controller.errors import WorkerError
from tandem.data import write_rows, write_splits
from tandem.models.tiny import save_tiny
from tandem.trainer.checkpoint import CheckpointManager, save_trainer_state
from tandem.trainer.run_lock import RunLock


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
        "trainer.workers_per_node=8",
        "data.train_batch_size=8",
        "actor.ppo_mini_batch_size=8",
    )
    assert done.returncode == 2, done.stderr
    assert "actor.model_path" in done.stderr and "num_key_value_heads=2" in done.stderr
    assert "Started a local Ray" not in done.stderr


def test_export_of_a_folder_that_is_no_checkpoint_exits_2(tmp_path):
    done = run_cli("export", str(tmp_path), str(tmp_path / "out"))
    assert done.returncode == 2 and "not a complete Tandem checkpoint" in done.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quickstart_runs_sft_then_grpo_and_plots(ray_local, tmp_path, monkeypatch):
    # SFT stops at its first validation
    fast = dataclasses.replace(quickstart.RECIPES["addition"], target_val_loss=100.0)
    monkeypatch.setitem(quickstart.RECIPES, "addition", fast)
    numbers = run_quickstart(
        tmp_path,
        ["trainer.total_training_steps=2", "trainer.test_freq=1", "trainer.loggers=[jsonl]"],
        sft_overrides=["trainer.total_training_steps=6", "trainer.test_freq=2"],
    )
    sft_steps = [json.loads(line)["step"] for line in (tmp_path / "quickstart/sft/metrics.jsonl").open()]
    assert sft_steps[-1] == 2 and numbers["sft_steps"] == 2
    assert [step for step, _ in numbers["accuracy_per_validation"]] == [0, 1, 2]
    assert 0 <= numbers["accuracy_after_sft"] <= 1 and 0 <= numbers["accuracy_after_rl"] <= 1
    assert [step for step, _ in numbers["reward_per_step"]] == [1, 2]
    assert Path(numbers["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from view.browser import check_real_run  # tests/view/browser.py

    check_real_run(tmp_path / "quickstart/grpo")  # `tandem view` of the run folder, in headless Chromium
    assert (tmp_path / "quickstart/sft/hf_model/model.safetensors").is_file()
    check_quickstart_dumps(tmp_path / "quickstart/grpo", numbers["samples_per_step"])


def check_quickstart_dumps(run: Path, samples_per_step: int) -> None:
    """The quickstart's dumps in its run folder, one line per sample, agreeing with metrics.jsonl."""
    import yaml

    metrics = {m["step"]: m for m in map(json.loads, (run / "metrics.jsonl").open())}
    trainer = yaml.safe_load((run / "config.yaml").read_text())["trainer"]
    assert (trainer["rollout_data_dir"], trainer["validation_data_dir"]) == (
        str(run / "rollouts"),
        str(run / "validation"),
    )
    mean = lambda rows, key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
    for step in (1, 2):
        rows = [json.loads(line) for line in (run / "rollouts" / f"{step}.jsonl").open()]
        assert len(rows) == samples_per_step and {r["step"] for r in rows} == {step}
        assert mean(rows, "score") == pytest.approx(metrics[step]["score/mean"], abs=1e-6)
        assert mean(rows, "response_length") == pytest.approx(metrics[step]["response_length/mean"])
        assert mean(rows, "prompt_length") == pytest.approx(metrics[step]["prompt_length/mean"])
        # the texts decoded (an output of a few stray bytes may decode to nothing at all)
        assert all("+" in r["input"] and r["data_source"] == "addition" for r in rows)
        assert sum(bool(r["output"]) for r in rows) > len(rows) / 2
        assert all(isinstance(r["advantage"], float) for r in rows)
    validations = []
    for step in (0, 1, 2):
        rows = [json.loads(line) for line in (run / "validation" / f"{step}.jsonl").open()]
        assert len(rows) == 256 and [r["sample"] for r in rows] == list(range(256))  # greedy, n=1
        assert mean(rows, "score") == pytest.approx(metrics[step]["val/score_mean"], abs=1e-6)
        assert mean(rows, "acc") == pytest.approx(metrics[step]["val/acc"], abs=1e-6)
        assert all(r["advantage"] is None and r["rollout_mismatch"] is None for r in rows)
        validations.append([r["input"] for r in rows])
    assert validations[0] == validations[1] == validations[2]  # the same prompts every pass
    generations = [json.loads(line) for line in (run / "val_generations.jsonl").open()]
    assert [g["step"] for g in generations] == [0] * 4 + [1] * 4 + [2] * 4
    assert (
        [g["input"] for g in generations[:4]] == validations[0][:4] == [g["input"] for g in generations[8:]]
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_vision_quickstart_runs_sft_on_images_then_grpo_with_vllm(ray_local, tmp_path, monkeypatch):
    """`tandem quickstart --task vision` cut short: the tiny Qwen2-VL, SFT on image rows on 2 Ray ranks, its
    export (a Qwen2-VL folder with its processor), GRPO from it with vLLM rolling out the images, greedy
    validation on the held-out images."""
    fast = dataclasses.replace(quickstart.RECIPES["vision"], target_val_loss=100.0)
    monkeypatch.setitem(quickstart.RECIPES, "vision", fast)
    numbers = run_quickstart(
        tmp_path,
        ["trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.loggers=[jsonl]"],
        sft_overrides=["trainer.total_training_steps=4", "trainer.test_freq=2"],
        task="vision",
    )
    sft = [json.loads(line) for line in (tmp_path / "quickstart/sft/metrics.jsonl").open()]
    assert [m["step"] for m in sft] == [1, 2] and 0 < sft[1]["val/loss"] < 10
    assert (tmp_path / "quickstart/sft/hf_model/processor_config.json").is_file()
    assert [step for step, _ in numbers["accuracy_per_validation"]] == [0, 2]
    assert 0 <= numbers["accuracy_after_rl"] <= 1
    grpo = [json.loads(line) for line in (tmp_path / "quickstart/grpo/metrics.jsonl").open()]
    assert [m["step"] for m in grpo if "score/mean" in m] == [1, 2]
    for m in grpo:  # vLLM's log-probs of the image prompts' samples are the trainer's (fp32 in tests)
        if "score/mean" in m:
            assert m["rollout_mismatch/max_ratio"] == pytest.approx(1.0, abs=1e-5)


def test_quickstart_seed_picks_model_data_and_training_seeds(tmp_path):
    def made(seed: int, name: str) -> tuple[dict, list[str], list[str], list[str]]:
        model_dir, overrides = prepare_quickstart(tmp_path / name, seed)
        prompts = [
            pq.read_table(tmp_path / name / "data" / f"{split}.parquet").column("prompt").to_pylist()
            for split in ("train", "val")
        ]
        return load_file(model_dir / "model.safetensors"), overrides, *prompts

    weights0, overrides0, train0, val0 = made(0, "a")
    weights0_again, _, train0_again, val0_again = made(0, "b")
    weights1, overrides1, train1, val1 = made(1, "c")
    assert len(val0) == 256 and not {str(p) for p in val0} & {str(p) for p in train0}  # held out
    assert all(torch.equal(weights0[k], weights0_again[k]) for k in weights0)
    assert (train0, val0) == (train0_again, val0_again)
    assert not torch.equal(weights0["model.embed_tokens.weight"], weights1["model.embed_tokens.weight"])
    assert val0 != val1 and train0[:32] != train1[:32]
    assert {"trainer.seed=0", "data.seed=0"} <= set(overrides0)
    assert {"trainer.seed=1", "data.seed=1"} <= set(overrides1)


def test_the_calculator_quickstart_declares_the_tool_and_stops_turns_at_im_end(tmp_path):
    """Its configs resolve and validate (no run: tests/trainer/test_agent_e2e.py runs the agent
    loop end to end); the model stops at <|im_end|>; SFT rows are the tool-use conversations."""
    from tandem.config import load_config
    from tandem.rollout.base import read_special_ids

    recipe = quickstart.RECIPES["calculator"]
    model_dir, shared = prepare_quickstart(tmp_path, 0, recipe)
    assert read_special_ids(model_dir)[0] == [1, 3]  # <|endoftext|>, <|im_end|>
    shape = json.loads((model_dir / "config.json").read_text())
    assert (shape["num_hidden_layers"], shape["num_attention_heads"]) == (2, 4)  # the recipe's 2 layers
    rl = load_config("grpo", [*recipe.common, *recipe.grpo, *shared, f"actor.model_path={model_dir}"])
    sft = load_config("sft", [*recipe.common, *recipe.sft, *shared, f"actor.model_path={model_dir}"])
    assert rl.rollout.mode == "async" and rl.rollout.multi_turn.tools == ["calculator"]
    assert sft.rollout.multi_turn.tools == ["calculator"] and sft.data.messages_key == "messages"
    rows = pq.read_table(tmp_path / "data" / "val.parquet").to_pylist()
    train = pq.read_table(tmp_path / "data" / "train.parquet").to_pylist()
    roles = {tuple(m["role"] for m in row["messages"]) for row in rows + train}
    assert len(rows) == 256 and roles == {("user", "assistant", "tool", "assistant"), ("user", "assistant")}
    uses_tool = [len(row["messages"]) == 4 for row in train]
    assert abs(sum(uses_tool) / len(train) - 0.25) < 0.02  # the teacher calls on 25 %, declines the rest
    assert rows[0]["prompt"][0]["content"].startswith('What is "')
    # SFT validates on the first 48 held-out rows that use the tool (its loss target is theirs)
    sft_val = pq.read_table(tmp_path / "data" / quickstart.SFT_VAL_FILE).to_pylist()
    assert (
        sft_val == [row for row in rows if len(row["messages"]) == 4][:48]
        and len(sft_val) == recipe.sft_val_rows == 48
    )
    with pytest.raises(ValueError, match="quickstart task 'nope' is not one of"):
        run_quickstart(tmp_path / "x", task="nope")


def test_the_warm_start_stops_at_its_loss_target():
    def stops(target_loss: float | None, **metrics: float) -> bool:
        warm = object.__new__(quickstart.WarmStart)  # only the stop rule: no workers
        warm.target_loss = target_loss
        return warm.stop_early({k.replace("_", "/", 1): v for k, v in metrics.items()})

    assert stops(0.06, val_loss=0.06) and not stops(0.06, val_loss=0.061)
    assert not stops(0.06, sft_loss=0.0)  # a training step without validation goes on
    assert not stops(None, val_loss=0.0)  # trainer.total_training_steps ends it
    warm = object.__new__(quickstart.WarmStart)
    warm.target_loss = 0.05
    assert warm.shortfall({"step": 800, "val/loss": 0.05}) is None
    told = warm.shortfall({"step": 800, "val/loss": 0.3})
    assert "SFT ended at step 800 without reaching its validation loss target 0.05" in told
    warm.target_loss = None  # a fixed number of steps (the vision recipe): nothing falls short
    assert warm.shortfall({"step": 60, "val/loss": 9.0}) is None


# ---- run folders: one run at a time, finished runs, damaged checkpoints (before any worker) ----------


def small_run(tmp_path: Path, *overrides: str) -> list[str]:
    model = save_tiny(tmp_path / "model")
    data = write_splits("addition", tmp_path / "data", n_train=8, n_val=4, digits=1)["train"]
    return [
        "grpo",
        f"actor.model_path={model}",
        f"data.train_files=[{data}]",
        f"trainer.output_dir={tmp_path / 'out'}",
        "trainer.experiment_name=exp",
        "data.train_batch_size=4",
        "actor.ppo_mini_batch_size=4",
        "trainer.total_training_steps=3",
        *overrides,
    ]


def fake_checkpoint(run: Path, step: int) -> Path:
    """A complete checkpoint folder as the trainer writes one (no worker shards: nothing loads it here)."""
    manager = CheckpointManager(run / "checkpoints")
    with manager.writing(step) as folder:
        (folder / "actor").mkdir()
        (folder / "actor" / "shard.distcp").write_bytes(b"weights")
        save_trainer_state(folder, {"step": step})
    return run / "checkpoints" / f"global_step_{step}"


def test_a_second_run_on_a_folder_in_use_exits_2_naming_folder_and_holder(tmp_path):
    run = tmp_path / "out" / "tandem" / "exp"
    with RunLock(run):
        done = run_cli("train", *small_run(tmp_path))
    assert done.returncode == 2, done.stderr
    assert f"run folder {run} is in use by another Tandem run: pid {os.getpid()}" in done.stderr
    assert "Started a local Ray" not in done.stderr


def test_a_finished_run_says_so_and_exits_0_without_workers(tmp_path):
    run = tmp_path / "out" / "tandem" / "exp"
    fake_checkpoint(run, 3)
    done = run_cli("train", *small_run(tmp_path))
    assert done.returncode == 0, done.stderr
    assert f"run folder {run} finished at step 3 (of 3); use trainer.resume=disable" in done.stdout
    assert "Started a local Ray" not in done.stderr and not (run / ".lock").exists()


def test_a_damaged_checkpoint_named_explicitly_exits_2_naming_the_missing_file(tmp_path):
    checkpoint = fake_checkpoint(tmp_path / "out" / "tandem" / "exp", 2)
    (checkpoint / "actor" / "shard.distcp").unlink()
    done = run_cli("train", *small_run(tmp_path, f"trainer.resume={checkpoint}"))
    assert done.returncode == 2, done.stderr
    assert f"checkpoint {checkpoint} is damaged: actor/shard.distcp is missing" in done.stderr
    assert "Started a local Ray" not in done.stderr
    done = run_cli("export", str(checkpoint), str(tmp_path / "hf"))
    assert done.returncode == 2 and "actor/shard.distcp is missing" in done.stderr


# ---- errors people can read --------------------------------------------------------------------------


def test_a_worker_failure_is_one_headline_and_the_tracebacks_go_to_the_run_log(tmp_path):
    err = WorkerError(
        "actor_rollout_ref",
        "update_actor",
        1,
        "KeyError",
        "'advantages'\nsecond line of the message",
        'Traceback (most recent call last):\n  File "/x/tandem/roles/actor.py", line 88, in update\n'
        "KeyError: 'advantages'\n",
    )
    assert headline(err) == (
        "worker group 'actor_rollout_ref': rank 1 failed in update_actor: KeyError: 'advantages' "
        "(at /x/tandem/roles/actor.py:88)"
    )
    log = write_error_log(err, tmp_path / "logs")
    assert log == tmp_path / "logs" / "error.log"
    assert "--- traceback of rank 1 ---" in log.read_text() and 'actor.py", line 88' in log.read_text()


def test_a_controller_failure_names_the_root_cause(monkeypatch, tmp_path, capsys):
    def fail(args):
        args.log_dir = tmp_path / "logs"
        try:
            raise OSError("disk full writing /data/x.parquet")
        except OSError as err:
            raise RuntimeError("could not write the rows") from err

    monkeypatch.setattr(cli, "_run", fail)
    assert main(["presets"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("tandem presets: OSError: disk full writing /data/x.parquet (at ")
    assert lines[1] == f"  full tracebacks: {tmp_path / 'logs' / 'error.log'}" and len(lines) == 2
    assert "could not write the rows" in (tmp_path / "logs" / "error.log").read_text()


def test_ctrl_c_exits_130(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_run", interrupted)
    assert main(["presets"]) == 130
    assert capsys.readouterr().err == "tandem presets: interrupted\n"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_real_worker_failure_prints_a_headline_and_keeps_the_tracebacks_in_the_run_folder(tmp_path):
    args = small_run(tmp_path)
    model = tmp_path / "model" / "model.safetensors"
    model.write_bytes(model.read_bytes()[:1000])  # passes the start-up checks, fails in the workers' load
    done = run_cli("train", *args)
    assert done.returncode == 1, done.stderr
    ours = [
        line for line in done.stderr.splitlines() if line.startswith(("tandem train:", "  full tracebacks:"))
    ]
    run = tmp_path / "out" / "tandem" / "exp"
    assert ours == [ours[0], f"  full tracebacks: {run / 'logs' / 'error.log'}"]
    assert ours[0].startswith("tandem train: worker group 'actor_rollout_ref': rank ")
    assert "SafetensorError" in ours[0] and "Traceback" not in done.stderr
    log = (run / "logs" / "error.log").read_text()
    assert "--- traceback of rank" in log and "load_pretrained" in log
    assert sorted(p.name for p in (run / "logs").glob("*_rank*.log")) == [
        "actor_rollout_ref_rank0.log",
        "actor_rollout_ref_rank1.log",
    ]
    assert not (run / ".lock").exists()


def test_fewer_rows_than_one_batch_exits_2_before_any_worker(tmp_path):
    done = run_cli("train", *small_run(tmp_path, "data.train_batch_size=16", "actor.ppo_mini_batch_size=16"))
    assert done.returncode == 2, done.stderr
    assert "the dataset has 8 items, fewer than one batch of 16" in done.stderr
    assert "Started a local Ray" not in done.stderr
