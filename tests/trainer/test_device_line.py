"""trainer.device=auto and the start-up line that says which device and dtypes each role got.

This host has no GPU: the cuda branch is checked through `choose_device` with the GPU count passed in, and
the line's text for cuda through `device_line` with the device named (no CUDA call is made for either)."""

import pytest
import torch

from tandem.config import load_config
from tandem.config.derived import choose_device
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
    ppo = load_config("ppo", ["rollout.engine=vllm"])  # critic, reference (KL in the reward), vLLM rollout
    assert device_line(ppo, "cuda", "auto: 1 GPU found") == (
        "device: cuda (auto: 1 GPU found); actor bf16 compute, fp32 master; rollout vllm bf16; "
        "reference bf16 compute; critic bf16 compute, fp32 master"
    )
    grpo = load_config("grpo", ["rollout.engine=hf", "actor.fsdp.param_dtype=float16"])
    assert device_line(grpo, "cuda", "set by trainer.device") == (
        "device: cuda (set by trainer.device); actor fp16 compute, fp32 master; rollout hf fp32; reference fp16 compute"
    )


def test_the_line_on_cpu_and_for_sft_and_eval():
    # param_dtype=auto on a CPU: float32 here (tests/conftest.py pins the CPU probe's answer)
    cfg = load_config("dapo", ["rollout.engine=vllm"])  # no KL term: no reference
    assert device_line(cfg, "cpu", "auto: no GPU found") == (
        "device: cpu (auto: no GPU found); actor fp32 compute, fp32 master; rollout vllm fp32"
    )
    grpo = load_config("grpo", ["rollout.engine=hf"])
    assert device_line(grpo, "cpu", "x", purpose="sft") == "device: cpu (x); actor fp32 compute, fp32 master"
    assert device_line(grpo, "cpu", "x", purpose="eval") == (
        "device: cpu (x); actor fp32 compute, fp32 master; rollout hf fp32"
    )
    megatron = load_config("grpo", ["actor.strategy=megatron", "rollout.engine=vllm"])
    assert device_line(megatron, "cuda", "x").startswith("device: cuda (x); actor bf16 compute, fp32 master")
