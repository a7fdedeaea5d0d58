"""verl's example generation scripts through `tandem generate`, on verl-format GSM8K rows: what verl's
`main_generation` writes (the input's columns + `responses`, per row the list of its n texts).

Each script's override list (tests/verl/generation_scripts.py) is passed as it is, with only the changes
of `cpu_changes`: the model, data and output paths, the GPU counts and tensor-parallel size of one CPU
process, and a response length a 2-core CPU generates in seconds.
"""

from __future__ import annotations

import re

import pyarrow.parquet as pq
import pytest

from tandem.cli import main
from tandem.config.generate import generate_layout, load_generate_config
from tandem.data.synthetic import write_rows
from tandem.models.tiny import save_tiny

from .examples_data import with_values
from .generation_scripts import GENERATION_SCRIPTS
from .test_verl_scripts_e2e import single_turn_rows

# head_dim 32: vLLM's CPU attention takes 32 and up
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1}


def cpu_changes(script: list[str], model, data, out) -> list[str]:
    """The script with the paths and sizes one CPU process needs, every change listed here."""
    changes = {
        "model.path": str(model),
        "data.path": str(data),
        "data.output_path": str(out),
        "trainer.nnodes": "1",
        "trainer.n_gpus_per_node": "1",
        "rollout.tensor_model_parallel_size": "1",
        "rollout.response_length": "12",
    }
    return with_values(script, changes)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("verl_generation")
    model = save_tiny(root / "model", **TINY)
    data = write_rows(single_turn_rows("test", 5), root / "gsm8k" / "test.parquet")
    return model, data


# as written: (nodes, GPUs per node, tensor parallel, replicas = GPUs / tensor parallel)
LAYOUTS = {"deepseek_v2_lite_math": (1, 8, 2, 4), "deepseek7b_multi_node": (2, 8, 16, 1)}


@pytest.mark.parametrize("name", sorted(GENERATION_SCRIPTS))
def test_the_scripts_keys_translate_with_their_layout_of_engines(name, tmp_path):
    script = GENERATION_SCRIPTS[name]
    cfg, _ = load_generate_config(None, script)
    found = generate_layout(cfg)
    assert (found.nnodes, found.workers_per_node, found.tensor_parallel, found.replicas) == LAYOUTS[name]
    cfg, names = load_generate_config(None, cpu_changes(script, "m", "d.parquet", tmp_path / "o.parquet"))
    assert (cfg.n, cfg.top_k, cfg.top_p, cfg.temperature) == (1, 50, 0.7, 1.0)
    assert (cfg.max_prompt_length, cfg.max_response_length, cfg.gpu_memory_utilization) == (2048, 12, 0.8)
    assert cfg.batch_size == 128 and cfg.engine == "auto"  # verl's generation.yaml defaults under the script
    assert names["n"] == "data.n_samples" and names["model_path"] == "model.path"


def run_script(assets, tmp_path, capsys, *extra) -> list[dict]:
    model, data = assets
    out = tmp_path / "gen" / "out.parquet"
    args = cpu_changes(GENERATION_SCRIPTS["deepseek_v2_lite_math"], model, data, out)
    assert main(["generate", *args, "data.n_samples=3", *extra]) == 0
    printed = capsys.readouterr()
    assert f"tandem: read {16 + len(extra)} verl keys" in printed.err and re.search(
        r"data.n_samples=3 +->  n=3", printed.err
    )
    assert printed.out.strip() == str(out)
    written = pq.read_table(out)
    original = pq.read_table(data)
    assert written.column_names[: original.num_columns] == original.column_names
    assert written.select(original.column_names).equals(original)  # the input, unchanged
    assert written.column_names[original.num_columns :] == ["responses", "response_lengths", "finish_reasons"]
    assert str(written.schema.field("responses").type) == "list<element: string>"
    rows = written.to_pylist()
    assert len(rows) == 5
    for row in rows:
        assert len(row["responses"]) == 3 and all(isinstance(t, str) for t in row["responses"])
        assert all(1 <= n <= 12 for n in row["response_lengths"])
        assert set(row["finish_reasons"]) <= {"stop", "length"}
    assert not (tmp_path / "gen" / "out.parquet.parts").exists()
    return rows


def test_deepseek_v2_lite_math_script_on_hf_generate(assets, tmp_path, capsys):
    rows = run_script(assets, tmp_path, capsys, "rollout.name=hf")
    assert len({t for row in rows for t in row["responses"]}) > 1  # sampled, not one text repeated


@pytest.mark.slow  # starts a vLLM engine
def test_deepseek_v2_lite_math_script_on_vllm(assets, tmp_path, capsys):
    rows = run_script(assets, tmp_path, capsys)  # rollout.name is verl's default there: vllm
    assert len({t for row in rows for t in row["responses"]}) > 1
