"""`tandem sft` killed with SIGKILL (no clean-up) after a checkpoint, then run again with the same command:
it resumes from the newest complete checkpoint and ends where an uninterrupted run ends, step for step."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tandem.config import load_config
from tandem.trainer import SFTTrainer

from .trainer_helpers import make_assets

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
STEPS = 3


def sft_command(assets: dict[str, Path], out: Path, name: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tandem.cli",
        "sft",
        "sft",
        f"actor.model_path={assets['model']}",
        f"data.train_files=[{assets['train']}]",
        "data.max_length=40",
        "data.train_batch_size=4",
        "actor.ppo_mini_batch_size=4",
        "actor.micro_batch_size_per_rank=2",
        f"trainer.total_training_steps={STEPS}",
        "trainer.save_freq=1",
        "trainer.backend=inprocess",
        "trainer.device=cpu",
        f"trainer.output_dir={out}",
        f"trainer.experiment_name={name}",
        "trainer.loggers=[jsonl]",
        "trainer.progress_bar=false",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
    ]


def losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {row["step"]: row["sft/loss"] for row in rows if "sft/loss" in row}


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(next((run / "hf_model").glob("*.safetensors")))


def test_sft_killed_after_a_checkpoint_resumes_to_the_uninterrupted_result(tmp_path):
    assets = make_assets(tmp_path / "assets")
    # the uninterrupted run in this process (the same command line, read as `tandem sft` reads it)
    SFTTrainer(load_config("sft", sft_command(assets, tmp_path, "whole")[5:], require_data=True)).fit()

    command = sft_command(assets, tmp_path, "killed")
    run = tmp_path / "tandem" / "killed"
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (run / "checkpoints" / "global_step_1").is_dir():  # a complete checkpoint of step 1
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint of step 1 in 240 s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    done = sorted(p.name for p in (run / "checkpoints").glob("global_step_*"))
    assert f"global_step_{STEPS}" not in done  # killed before the end, whatever step it had reached

    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    # each step once in the resumed run's metrics, with the uninterrupted run's loss; the same final weights
    assert losses(run) == losses(tmp_path / "tandem" / "whole")
    assert sorted(losses(run)) == list(range(1, STEPS + 1))
    final, expected = weights(run), weights(tmp_path / "tandem" / "whole")
    assert final.keys() == expected.keys()
    assert all(torch.equal(final[k], expected[k]) for k in expected)

    # The window the kill may or may not have hit, forced: stopped after step 1's checkpoint, its metrics line lost
    # (as a kill between the checkpoint and the line leaves it); the resumed run writes the line from the checkpoint.
    overrides = sft_command(assets, tmp_path, "stopped")[5:]
    SFTTrainer(load_config("sft", overrides, require_data=True)).fit(until_step=1)
    stopped = tmp_path / "tandem" / "stopped"
    metrics_file = stopped / "metrics.jsonl"
    metrics_file.write_text("".join(line + "\n" for line in metrics_file.read_text().splitlines()[:-1]))
    assert losses(stopped) == {}
    SFTTrainer(load_config("sft", overrides, require_data=True)).fit()
    assert losses(stopped) == losses(tmp_path / "tandem" / "whole")
