"""The rollout's compute dtype (roles/rollout.py `rollout_dtype`): the actor's, in both layouts."""

from types import SimpleNamespace

import torch

from tandem.roles.rollout import rollout_dtype, rollout_kwargs

from .roles_helpers import tiny_config

CPU = torch.device("cpu")


def test_a_hybrid_rollout_takes_the_dtype_the_actor_engine_resolved(tmp_path):
    cfg = tiny_config(tmp_path, 1, "actor.fsdp.param_dtype=float32")
    engine = SimpleNamespace(param_dtype=torch.bfloat16)  # e.g. param_dtype=auto, measured and agreed on
    assert rollout_dtype(cfg, CPU, engine) == torch.bfloat16


def test_a_separate_rollout_resolves_the_actor_config_as_its_engine_does(tmp_path):
    assert rollout_dtype(tiny_config(tmp_path, 1, "actor.fsdp.param_dtype=bfloat16"), CPU) == torch.bfloat16
    auto = tiny_config(tmp_path, 1, "actor.fsdp.param_dtype=auto")
    assert rollout_dtype(auto, torch.device("cuda", 0)) == torch.bfloat16
    megatron = tiny_config(tmp_path, 1, "actor.strategy=megatron", "actor.megatron.param_dtype=auto")
    assert rollout_dtype(megatron, CPU) == torch.float32  # megatron-core: float32 on a CPU, no probe


def test_only_the_vllm_engine_is_given_a_dtype(tmp_path):
    assert "dtype" not in rollout_kwargs(tiny_config(tmp_path, 1, "rollout.engine=hf"), CPU)
    vllm = tiny_config(tmp_path, 1, "rollout.engine=vllm", "actor.fsdp.param_dtype=bfloat16")
    assert rollout_kwargs(vllm, CPU)["dtype"] == torch.bfloat16
    engine = SimpleNamespace(param_dtype=torch.float32)
    assert rollout_kwargs(vllm, CPU, engine)["dtype"] == torch.float32
