"""The rollout's compute dtype (roles/rollout.py `rollout_dtype`): the actor's, in both layouts, for an engine
whose facts say it computes in the actor's dtype (vLLM); hf keeps float32."""

from types import SimpleNamespace

import torch

from tandem.roles.rollout import rollout_dtype, rollout_spec

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


def test_only_the_vllm_engine_computes_in_the_actors_dtype(tmp_path):
    hf = tiny_config(tmp_path, 1, "rollout.engine=hf", "actor.fsdp.param_dtype=bfloat16")
    assert rollout_spec(hf, CPU).dtype == torch.float32
    vllm = tiny_config(tmp_path, 1, "rollout.engine=vllm", "actor.fsdp.param_dtype=bfloat16")
    assert rollout_spec(vllm, CPU).dtype == torch.bfloat16
    engine = SimpleNamespace(param_dtype=torch.float32)
    assert rollout_spec(vllm, CPU, engine).dtype == torch.float32
    assert rollout_spec(vllm, None).dtype == torch.float32  # no device yet (the start-up check): not resolved
