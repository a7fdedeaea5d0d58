"""A CUDA out-of-memory error in a training pass names the pass, the micro-batch and the keys that lower
the memory (engine/micro.py `explain_out_of_memory`). The error is raised here by a stub loss / forward
function on CPU, through a real 1-rank FSDP2 engine."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tandem.config.schema import FSDPConfig
from tandem.models.tiny import save_tiny

from .fsdp_scenarios import make_engine, rollout_batch

TORCH_SAYS = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB"


def out_of_memory(output, micro):
    raise torch.OutOfMemoryError(TORCH_SAYS)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("oom")
    store = dist.FileStore(str(root / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield make_engine(
            str(save_tiny(root / "model")),
            "lm",
            fsdp=FSDPConfig(param_dtype="float32"),
            max_tokens_per_micro_batch=24,
        )
    finally:
        dist.destroy_process_group()


def test_out_of_memory_in_an_update_names_the_micro_batch_and_the_keys(engine):
    batch = rollout_batch(6, seed=0)
    with pytest.raises(torch.OutOfMemoryError) as caught:
        engine.train_step(batch, out_of_memory, micro_batch_size=4)
    message = str(caught.value)
    assert message.startswith("CUDA out of memory in the update after 0 optimizer step(s), micro-batch 1 of ")
    for key in (
        "actor.max_tokens_per_micro_batch=24",
        "actor.activation_checkpointing=true",
        "rollout.gpu_memory_utilization",
        "actor.fsdp.cpu_offload=true",
        "docs/tuning.md",
    ):
        assert key in message
    assert " tokens in " in message and "sequence(s)" in message
    assert message.endswith(f"torch: {TORCH_SAYS}")
    assert isinstance(caught.value.__cause__, torch.OutOfMemoryError)


def test_out_of_memory_in_a_forward_says_forward(engine):
    with pytest.raises(torch.OutOfMemoryError, match=r"^CUDA out of memory in the forward after 0 optimizer"):
        engine.forward(rollout_batch(3, seed=1), out_of_memory, micro_batch_size=4)


def test_other_errors_pass_unchanged(engine):
    def broken(output, micro):
        raise ValueError("a bug in the loss")

    with pytest.raises(ValueError, match="^a bug in the loss$"):
        engine.train_step(rollout_batch(2, seed=2), broken, micro_batch_size=4)
