"""`tandem generate` over several engines: the layout from nnodes x workers_per_node / tensor_parallel (or
replicas=N), its refusals, and 2 Hugging Face replicas on 2 CPU ranks of a real Ray writing the file one engine
in this process writes, interrupted and resumed (tiny model, fp32)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch

from tandem.cli import main
from tandem.commands.generate import parts_folder, run_generation
from tandem.commands.generate_replicas import own_padding
from tandem.config import ConfigError
from tandem.config.generate import GenerateConfig, generate_layout, load_generate_config
from tandem.data.prompts import collate_prompts
from tandem.data.synthetic import write_rows
from tandem.models.tiny import save_tiny

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}


def layout(**keys):
    found = generate_layout(GenerateConfig(**keys))
    return found.nnodes, found.workers_per_node, found.tensor_parallel, found.replicas


def test_the_layout_is_verls_devices_over_tensor_parallel_or_tandems_replicas():
    assert layout() == (1, 1, 1, 1)
    assert layout(workers_per_node=8, tensor_parallel=2) == (1, 8, 2, 4)  # verl's deepseek_v2_lite script
    assert layout(nnodes=2, workers_per_node=8, tensor_parallel=16) == (2, 8, 16, 1)  # an engine on 2 nodes
    assert layout(replicas=2) == (1, 2, 1, 2)  # 2 CPU (or GPU) replicas on this machine
    assert layout(replicas=3, tensor_parallel=2, nnodes=3) == (3, 2, 2, 3)
    assert layout(replicas=4, workers_per_node=4) == (1, 4, 1, 4)  # given both, agreeing


@pytest.mark.parametrize(
    ("keys", "says"),
    [
        (
            {"workers_per_node": 3, "tensor_parallel": 2},
            "1 x workers_per_node=3 = 3 devices do not split into",
        ),
        (
            {"replicas": 2, "workers_per_node": 4},
            "replicas=2 x tensor_parallel=1 = 2 devices, but nnodes=1 x",
        ),
        ({"replicas": 3, "nnodes": 2}, "= 3 devices do not split evenly over nnodes=2 nodes"),
        ({"workers_per_node": 6, "tensor_parallel": 4, "nnodes": 2}, "part of one node and part of the next"),
        ({"tensor_parallel": 0}, "tensor_parallel=0: must be >= 1"),
    ],
)
def test_counts_that_do_not_fit_are_refused_naming_the_keys(keys, says):
    with pytest.raises(ConfigError, match=says.replace("(", r"\(")):
        generate_layout(GenerateConfig(**keys))


def test_verl_keys_are_named_as_written_and_hf_cannot_split_a_model(tmp_path):
    paths = ["model.path=m", "data.path=d.parquet", f"data.output_path={tmp_path / 'o.parquet'}"]
    with pytest.raises(ConfigError, match=r"nnodes=1 x trainer.n_gpus_per_node=3 = 3 devices do not split"):
        load_generate_config(
            None, [*paths, "trainer.n_gpus_per_node=3", "rollout.tensor_model_parallel_size=2"]
        )
    with pytest.raises(ConfigError, match="rollout.tensor_model_parallel_size=2 needs the vLLM engine"):
        load_generate_config(
            None,
            [*paths, "trainer.n_gpus_per_node=2", "rollout.tensor_model_parallel_size=2", "rollout.name=hf"],
        )


def test_a_replicas_batch_is_padded_as_the_batch_alone(tmp_path):
    fields = dict.fromkeys(("raw_prompt", "data_source", "ground_truth", "extra_info", "index"))
    items = [{"input_ids": ids, **fields} for ids in ([5, 6, 7, 8, 9], [1, 2], [3, 4, 5])]
    whole = collate_prompts(items, pad_token_id=0)
    alone = collate_prompts(items[1:], pad_token_id=0)
    mine = own_padding(whole.slice(1, 3))
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert mine[key].equal(alone[key])
    assert own_padding(alone) is alone


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("generate_replicas")
    rows = [
        {"data_source": "arith", "prompt": [{"role": "user", "content": "1+" * i + "1="}]} for i in range(5)
    ]
    return save_tiny(root / "model", **TINY), write_rows(rows, root / "in.parquet")


def keys(assets, out, *extra) -> list[str]:
    model, data = assets
    return [
        f"model_path={model}",
        f"data_path={data}",
        f"output_path={out}",
        "engine=hf",
        "n=2",
        "batch_size=2",
        "max_response_length=5",
        "seed=7",
        "progress_bar=false",
        *extra,
    ]


@pytest.mark.skipif(torch.cuda.device_count() >= 8, reason="this machine holds 8 GPUs")
def test_a_layout_this_machine_cannot_hold_is_checked_then_refused_naming_its_hardware(
    assets, tmp_path, capsys
):
    args = ["generate", *keys(assets, tmp_path / "o.parquet", "device=cuda", "workers_per_node=8")]
    assert main([*args, "--check"]) == 0  # the config and the data are fine
    assert (
        "engine hf on cuda (bfloat16): 8 replicas on 1 node x 8 cuda devices, on Ray"
        in capsys.readouterr().err
    )
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"needs 8 CUDA GPUs (workers_per_node=8); this machine has {torch.cuda.device_count()}" in err
    assert not parts_folder(tmp_path / "o.parquet").exists()  # refused before anything is written


class Killed(Exception):
    pass


@pytest.mark.slow  # two Ray worker groups of 2 ranks
def test_two_replicas_write_what_one_engine_writes_and_resume_per_batch(assets, tmp_path, ray_local):
    """5 rows in batches of 2 (rows 0-1, 2-3, 4): round 0 deals batch 0 to replica 0 and batch 1 to replica 1,
    round 1 batch 2 to replica 0. Byte-equal to one engine: each batch is padded and seeded as one engine
    does it (same host, fp32; a replica's one torch thread against this process's threads sums the tiny
    matrices alike)."""
    one = run_generation(load_generate_config(None, keys(assets, tmp_path / "one.parquet"))[0])

    out = tmp_path / "two.parquet"
    cfg = load_generate_config(None, keys(assets, out, "replicas=2"))[0]
    written: list[tuple[int, int | None]] = []

    def kill_after_first(batch: int, replica: int | None) -> None:
        written.append((batch, replica))
        raise Killed  # the controller dies with round 0's second batch and round 1 unwritten

    with pytest.raises(Killed):
        run_generation(cfg, on_part=kill_after_first)
    assert written == [(0, 0)] and not out.exists()
    assert sorted(p.name for p in parts_folder(out).iterdir()) == ["batch_000000.parquet", "generate.json"]

    written.clear()
    run_generation(cfg, on_part=lambda batch, replica: written.append((batch, replica)))
    assert written == [(1, 0), (2, 1)]  # the two batches left, one per replica; batch 0 not again
    assert pq.read_table(out).equals(pq.read_table(one))
    table = pq.read_table(out).to_pylist()
    assert [len(r["responses"]) for r in table] == [2] * 5
    assert len({t for r in table for t in r["responses"]}) > 1  # sampled, not one text repeated
