"""`tandem generate --check` (and its alias `tandem config generate`): verl's two example generation command
lines resolved and checked without a model being loaded or a file written; a bad config gives the error and
exit status `tandem generate` gives.

The scripts' override lists (generation_scripts.py) are passed with only the changes of `local`: the model,
data and output paths, and the GPU counts and tensor-parallel size of one device.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from tandem.cli import main
from tandem.commands.generate import PARTS_META, parts_folder
from tandem.config.generate import load_generate_config
from tandem.data.synthetic import write_rows
from tandem.models.tiny import save_tiny

from .examples_data import with_values
from .generation_scripts import GENERATION_SCRIPTS

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1}


def local(script: list[str], model, data, out) -> list[str]:
    """The script with these paths and one device; every other key as verl's example gives it."""
    changes = {
        "model.path": model,
        "data.path": data,
        "data.output_path": out,
        "trainer.nnodes": 1,
        "trainer.n_gpus_per_node": 1,
        "rollout.tensor_model_parallel_size": 1,
    }
    return with_values(script, changes)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("generate_check")
    rows = [
        {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{i} + {i} ="}]}
        for i in range(5)
    ]
    return save_tiny(root / "model", **TINY), write_rows(rows, root / "test.parquet")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    printed = capsys.readouterr()
    return code, printed.out, printed.err


# In a fresh interpreter: whether the check imported vLLM or Ray (an in-process test may follow one that did).
CHECK_IN_A_FRESH_PROCESS = """
import json, sys
from tandem.cli import main
code = main(["generate", "--check", *json.loads(sys.argv[1])])
print(json.dumps({"code": code, "vllm": "vllm" in sys.modules, "ray": "ray" in sys.modules}))
"""


def test_deepseek_v2_lite_math_script_is_checked_without_vllm_ray_or_a_written_file(assets, tmp_path):
    model, data = assets
    out = tmp_path / "gen" / "out.parquet"
    args = local(GENERATION_SCRIPTS["deepseek_v2_lite_math"], model, data, out)
    done = subprocess.run(
        [sys.executable, "-c", CHECK_IN_A_FRESH_PROCESS, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    *config_lines, last = done.stdout.splitlines()
    assert json.loads(last) == {"code": 0, "vllm": False, "ray": False}, done.stderr
    printed = yaml.safe_load("\n".join(config_lines))
    # as the command line gives them: data.n_samples=1, rollout.temperature=1.0 / top_k=50 / top_p=0.7 /
    # prompt_length=2048 / response_length=1024 / gpu_memory_utilization=0.8; verl's batch_size 128 beneath
    assert (printed["n"], printed["temperature"], printed["top_k"], printed["top_p"]) == (1, 1.0, 50, 0.7)
    assert (printed["max_prompt_length"], printed["max_response_length"]) == (2048, 1024)
    assert (printed["gpu_memory_utilization"], printed["batch_size"], printed["truncation"]) == (
        0.8,
        128,
        "right",
    )
    assert (printed["model_path"], printed["data_path"], printed["output_path"]) == (
        str(model),
        str(data),
        str(out),
    )
    assert "tandem: read 15 verl keys" in done.stderr  # the translation summary, as tandem generate prints it
    assert "5 prompts x n=1 = 5 samples of up to 1024 tokens, in 1 batch of up to 128 prompts" in done.stderr
    assert f"writes {out}" in done.stderr
    assert not (tmp_path / "gen").exists()  # neither the output nor its parts folder


def test_multi_node_script_config_generate_alias_and_the_yaml_read_back(assets, tmp_path, capsys):
    model, data = assets
    out = tmp_path / "out.parquet"
    args = local(GENERATION_SCRIPTS["deepseek7b_multi_node"], model, data, out)
    code, printed, err = run(capsys, "generate", "--check", *args, "engine=hf")
    assert code == 0 and "engine hf on " in err and not out.exists() and not parts_folder(out).exists()
    cfg = yaml.safe_load(printed)
    assert (cfg["n"], cfg["top_k"], cfg["max_prompt_length"], cfg["output_path"]) == (1, 50, 2048, str(out))
    assert cfg["nnodes"] == 1 and cfg["workers_per_node"] == 1 and cfg["tensor_parallel"] == 1
    assert run(capsys, "config", "generate", *args, "engine=hf") == (code, printed, err)
    saved = tmp_path / "gen.yaml"
    saved.write_text(printed)
    assert load_generate_config(saved)[0] == load_generate_config(None, [*args, "engine=hf"])[0]


def stale_parts(out) -> None:
    """The parts folder of an interrupted run made with other settings."""
    parts_folder(out).mkdir(parents=True)
    (parts_folder(out) / PARTS_META).write_text(json.dumps({"seed": 99}))


@pytest.mark.parametrize(
    ("extra", "setup", "says"),
    [
        (["data.n_sample=3"], None, "data.n_sample: a key verl's main_generation config"),  # misspelled
        (["data.n_samples=0"], None, "data.n_samples=0: must be >= 1"),
        (  # 3 GPUs do not split into engines of 2
            ["trainer.n_gpus_per_node=3", "rollout.tensor_model_parallel_size=2"],
            None,
            "trainer.n_gpus_per_node=3 = 3 devices do not split into engines of rollout.tensor_model_parallel_size=2",
        ),
        (["rollout.prompt_length=4", "truncation=error"], None, "longer than rollout.prompt_length=4"),
        ([], lambda out: out.write_text("earlier"), "data.output_path="),  # exists
        ([], stale_parts, "seed: 99 then, 0 now"),
    ],
)
def test_a_bad_config_gives_the_error_and_status_tandem_generate_gives(
    assets, tmp_path, capsys, extra, setup, says
):
    model, data = assets
    out = tmp_path / "out.parquet"
    if setup:
        setup(out)
    args = [*local(GENERATION_SCRIPTS["deepseek_v2_lite_math"], model, data, out), *extra]
    checked = run(capsys, "generate", "--check", *args)
    assert checked[0] == 2 and says in checked[2] and checked[1] == ""
    assert run(capsys, "generate", *args) == checked
    assert not out.exists() or out.read_text() == "earlier"
