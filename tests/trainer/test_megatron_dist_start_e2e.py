"""Two GRPO steps in process (1 rank, megatron-core actor, Hugging Face generate) from a megatron distributed
checkpoint (actor.megatron.dist_checkpoint) that holds other weights than actor.model_path's folder: the
rollout engine loads the folder, so it must be synced before its first generation. Step 1's rollout log-probs
equal the trainer's old log-probs, and both equal transformers' on the checkpoint's own model: the run
generated and trained from the checkpoint's weights, not the folder's."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from tandem.models.tiny import save_tiny
from tandem.trainer import RLTrainer

from .test_adapter_start_e2e import record_step_batches, response_log_probs
from .trainer_helpers import custom_reward, make_assets, run_config

pytest.importorskip("megatron.core")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2}


@pytest.fixture(scope="module")
def assets(one_rank, tmp_path_factory):
    """The folder (seed 0) and a checkpoint of another draw of the same architecture (seed 1)."""
    from tandem.engine.megatron.dist_convert import hf_to_mcore

    root = tmp_path_factory.mktemp("dist_start")
    other = save_tiny(root / "other", seed=1, **SMALL)
    return {**make_assets(root, **SMALL), "other": other, "checkpoint": hf_to_mcore(other, root / "mcore")}


def test_a_run_from_a_dist_checkpoint_generates_and_trains_with_the_checkpoint_s_weights(assets, tmp_path):
    cfg = run_config(
        assets,
        tmp_path,
        "grpo",
        "actor.strategy=megatron",
        f"actor.megatron.dist_checkpoint={assets['checkpoint']}",
        "trainer.backend=inprocess",
        "trainer.workers_per_node=1",
        "trainer.total_training_steps=2",
        "rollout.engine=hf",
        "data.train_batch_size=2",
        "rollout.n=2",
        "actor.ppo_mini_batch_size=1",  # two optimizer steps a step: the actor's own old-log-prob pass
        *custom_reward("by_length"),
    )
    trainer = RLTrainer(cfg)
    batches = record_step_batches(trainer)
    history = trainer.fit()
    assert [m["step"] for m in history] == [1, 2] and history[1]["actor/grad_norm"] > 0

    first = batches[1]
    mask = first["response_mask"].bool()
    checkpoint_model = AutoModelForCausalLM.from_pretrained(assets["other"], dtype=torch.float32).eval()
    folder_model = AutoModelForCausalLM.from_pretrained(assets["model"], dtype=torch.float32).eval()
    expected = response_log_probs(checkpoint_model, first)[mask]
    torch.testing.assert_close(first["old_log_probs"][mask], expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(first["rollout_log_probs"][mask], expected, rtol=0, atol=1e-5)
    # the folder's weights give other log-probs: the check above could tell them apart
    assert (response_log_probs(folder_model, first)[mask] - expected).abs().max() > 1e-2
