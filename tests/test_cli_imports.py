"""The quick commands answer without loading the heavy libraries: `tandem presets`, `tandem config` (a preset,
a verl command line through the translation, a config error), `tandem --help` and a command's `--help` import
neither torch nor transformers, tensordict, vLLM or Ray. Each command runs in a fresh interpreter, which
reports the top-level packages in sys.modules when the command is done; no timing is asserted (bench/cli_startup.py
measures it)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tests.verl.examples_data import example_overrides

HEAVY = ("torch", "transformers", "tensordict", "vllm", "ray")
# main() as the console script runs it, then the heavy packages this process loaded, as the last line of stderr
PROBE = f"""
import json, sys
from tandem.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as stop:
    code = stop.code
loaded = sorted({{name.split(".")[0] for name in sys.modules}} & set({HEAVY!r}))
print(json.dumps(loaded), file=sys.stderr)
sys.exit(code)
"""


def run_tandem(*args: str) -> tuple[int, str, str, list[str]]:
    """(exit status, stdout, stderr without the report, heavy packages loaded) of `tandem ARGS`."""
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120)
    *err, report = done.stderr.rstrip("\n").split("\n")
    return done.returncode, done.stdout, "\n".join(err), json.loads(report)


def test_presets():
    code, out, _, heavy = run_tandem("presets")
    assert (code, heavy) == (0, [])
    assert {"grpo", "ppo", "dapo", "sft", "verl"} <= set(out.split())


def test_config_of_a_preset():
    code, out, _, heavy = run_tandem("config", "grpo", "actor.optim.lr=1e-6")
    assert (code, heavy) == (0, [])
    assert "adv_estimator: grpo" in out and "lr: 1.0e-06" in out


@pytest.mark.parametrize("args", [["--help"], ["config", "--help"], ["train", "--help"]])
def test_help(args):
    code, out, _, heavy = run_tandem(*args)
    assert (code, heavy) == (0, [])
    assert out.startswith("usage: tandem")


@pytest.mark.parametrize(
    "override, named",
    [
        ("actor.optim.lrr=1e-6", "unknown key 'actor.optim.lrr'"),
        ("algorithm.adv_estimator=grpp", "'grpp' is not a known advantage estimator. Did you mean 'grpo'?"),
        ("algorithm.rollout_correction.rollout_rs=token_k4", "unknown rejection-sampling option 'token_k4'"),
    ],
)
def test_a_config_error(override, named):
    code, out, err, heavy = run_tandem("config", "grpo", override)
    assert (code, out, heavy) == (2, "", [])
    assert "tandem config: config error" in err and named in err


def test_a_verl_command_line():
    """verl's GRPO example (Qwen2-7B on GSM8K), read through the translation (Hydra, OmegaConf, verl's defaults);
    its data files are not there, which `tandem config` reports and goes on."""
    code, out, err, heavy = run_tandem("config", *example_overrides("examples/grpo_trainer/run_qwen2-7b.sh"))
    assert (code, heavy) == (0, [])
    assert "actor_rollout_ref.rollout.n=5  " in err and "->  rollout.n=5" in err
    assert "model_path: Qwen/Qwen2-7B-Instruct" in out and "workers_per_node: 8" in out


def test_config_with_a_readable_data_file(tmp_path):
    """A data file that is there: `tandem config` reads its data_source column (pyarrow) and checks each value
    against the reward scorers, whose registry loads without torch (rewards/__init__.py loads the manager
    lazily). A data_source no scorer covers is still the error it was."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    good, bad = tmp_path / "good.parquet", tmp_path / "bad.parquet"
    pq.write_table(pa.table({"data_source": ["openai/gsm8k"], "prompt": ["1+1?"]}), good)
    pq.write_table(pa.table({"data_source": ["no_such_task"], "prompt": ["1+1?"]}), bad)
    code, out, _, heavy = run_tandem("config", "grpo", f"data.train_files=[{good}]")
    assert (code, heavy) == (0, [])
    assert str(good) in out
    code, _, err, heavy = run_tandem("config", "grpo", f"data.train_files=[{bad}]")
    assert (code, heavy) == (2, [])
    assert "no_such_task" in err
