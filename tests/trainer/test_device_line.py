"""trainer.device=auto, trainer.workers_per_node=auto and the start-up line that says which device, ranks and
dtypes each role got.

This host has no GPU: the cuda branch is checked through `choose_device` with the GPU count passed in, and
the line's text for cuda through `device_line` with the device named (no CUDA call is made for either)."""

import pytest
import torch
import yaml

from tandem.cli import main
from tandem.config import load_config
from tandem.config.derived import choose_device, choose_workers_per_node
from tandem.config.gpus import fewest_gpus
from tandem.roles.layout import device_choice
from tandem.trainer.device_line import device_line


@pytest.mark.parametrize(
    ("setting", "gpus", "where", "expected"),
    [
        ("auto", 0, "found", ("cpu", "auto: no GPU found")),
        ("auto", 1, "found", ("cuda", "auto: 1 GPU found")),
        ("auto", 8, "in the Ray cluster", ("cuda", "auto: 8 GPUs in the Ray cluster")),
        (
            "cpu",
            8,
            "found",
            ("cpu", "set by trainer.device"),
        ),  # an explicit choice wins over the GPUs there are
        ("cuda", 0, "found", ("cuda", "set by trainer.device")),
    ],
)
def test_choose_device(setting, gpus, where, expected):
    assert choose_device(setting, gpus, where) == expected


def test_auto_picks_the_cpu_where_torch_sees_no_gpu():
    cfg = load_config("grpo", ["trainer.backend=inprocess", "trainer.workers_per_node=1"])
    assert cfg.trainer.device == "auto"
    gpus = torch.cuda.device_count()
    assert device_choice(cfg) == choose_device("auto", gpus)
    if gpus == 0:  # this project's CPU machines
        assert device_choice(cfg) == ("cpu", "auto: no GPU found")
    assert device_choice(load_config("grpo", ["trainer.device=cpu"])) == ("cpu", "set by trainer.device")


def test_the_line_on_cuda_names_every_role_of_the_run():
    # critic, reference (KL in the reward), vLLM rollout; one node of 8 GPUs
    ppo = load_config("ppo", ["rollout.engine=vllm"], gpus_per_node=8)
    assert device_line(ppo, "cuda", "auto: 8 GPUs in the Ray cluster") == (
        "device: cuda (auto: 8 GPUs in the Ray cluster); actor bf16 compute, fp32 master; rollout vllm bf16; "
        "reference bf16 compute; critic bf16 compute, fp32 master; 8 ranks (1 x 8: auto: 8 GPUs per node given)"
    )
    grpo = load_config(
        "grpo", ["rollout.engine=hf", "actor.fsdp.param_dtype=float16", "trainer.workers_per_node=1"]
    )
    assert device_line(grpo, "cuda", "set by trainer.device") == (
        "device: cuda (set by trainer.device); actor fp16 compute, fp32 master; rollout hf fp32; reference fp16 compute; "
        "1 rank (1 x 1: set by trainer.workers_per_node)"
    )


def test_the_line_on_cpu_and_for_sft_and_eval():
    # param_dtype=auto on a CPU: float32 here (tests/conftest.py pins the CPU probe's answer)
    cfg = load_config("dapo", ["rollout.engine=vllm"], gpus_per_node=0)  # no KL term: no reference
    assert device_line(cfg, "cpu", "auto: no GPU found") == (
        "device: cpu (auto: no GPU found); actor fp32 compute, fp32 master; rollout vllm fp32; "
        "2 ranks (1 x 2: auto: no GPU given, 2 CPU ranks)"
    )
    grpo = load_config("grpo", ["rollout.engine=hf", "trainer.workers_per_node=2"])
    ranks = "2 ranks (1 x 2: set by trainer.workers_per_node)"
    assert (
        device_line(grpo, "cpu", "x", purpose="sft")
        == f"device: cpu (x); actor fp32 compute, fp32 master; {ranks}"
    )
    assert device_line(grpo, "cpu", "x", purpose="eval") == (
        f"device: cpu (x); actor fp32 compute, fp32 master; rollout hf fp32; {ranks}"
    )
    megatron = load_config("grpo", ["actor.strategy=megatron", "rollout.engine=vllm"])
    assert device_line(megatron, "cuda", "x").startswith("device: cuda (x); actor bf16 compute, fp32 master")


# ------------------------------------------------------------------ trainer.workers_per_node=auto


@pytest.mark.parametrize(
    ("settings", "gpus", "expected"),
    [
        (dict(), 8, (8, 1, "auto: 8 GPUs per node found")),
        (dict(), 1, (1, 1, "auto: 1 GPU per node found")),
        (dict(), 0, (2, 1, "auto: no GPU found, 2 CPU ranks")),
        (dict(device="cpu"), 8, (2, 1, "auto: no GPU found, 2 CPU ranks")),  # trainer.device=cpu wins
        (dict(backend="inprocess"), 8, (1, 1, "auto: 1 rank in process")),
        (dict(trainer=4, rollout=1), 8, (4, 1, "set by trainer.workers_per_node")),
        # the separate layout shares each node: half for the rollout pool (a multiple of its TP size)
        (
            dict(separate=True),
            8,
            (4, 4, "auto: 8 GPUs per node found, 4 for training and 4 for the rollout pool"),
        ),
        (dict(separate=True, rollout_tensor_parallel=4), 6, (2, 4, None)),
        (dict(separate=True, trainer=6), 8, (6, 2, None)),
        (dict(separate=True, rollout=2), 8, (6, 2, None)),
        (dict(separate=True), 0, (2, 1, "auto: no GPU found, 2 CPU ranks")),
    ],
)
def test_choose_workers_per_node(settings, gpus, expected):
    settings = {"trainer": "auto", "rollout": "auto", **settings}
    trainer, rollout = settings.pop("trainer"), settings.pop("rollout")
    chosen = choose_workers_per_node(trainer, rollout, gpus_per_node=gpus, **settings)
    assert chosen[:2] == expected[:2]
    if expected[2] is not None:
        assert chosen[2] == expected[2]


def test_tandem_config_grpo_takes_every_gpu_of_the_node(capsys):
    assert main(["config", "grpo", "--gpus-per-node", "8"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["trainer"]["workers_per_node"] == 8
    assert load_config("grpo", gpus_per_node=8).derived.world_size == 8
    assert load_config("grpo", gpus_per_node=0).derived.world_size == 2  # a CPU: 2 ranks, as always
    separate = load_config("grpo", ["rollout.layout=separate"], gpus_per_node=8)
    assert (separate.trainer.workers_per_node, separate.rollout.workers_per_node) == (4, 4)


@pytest.mark.skipif(
    torch.cuda.device_count() > 0, reason="counts this machine's GPUs: none on the CPU machines"
)
def test_auto_counts_this_machines_gpus_when_not_given():
    cfg = load_config("grpo")
    assert cfg.trainer.workers_per_node == 2
    assert cfg.derived.ranks_why == "auto: no GPU on this machine, 2 CPU ranks"


def test_a_ray_cluster_is_counted_per_node():
    # ray.nodes() rows: the head without GPUs holds no rank; the node with the fewest GPUs bounds the pool
    nodes = [
        {"Alive": True, "Resources": {"CPU": 8.0}},
        {"Alive": True, "Resources": {"CPU": 64.0, "GPU": 8.0}},
        {"Alive": True, "Resources": {"CPU": 64.0, "GPU": 4.0}},
        {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 2.0}},
    ]
    assert fewest_gpus(nodes) == 4
    assert fewest_gpus(nodes[:1]) == 0
