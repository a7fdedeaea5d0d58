"""The family matrix: each decoder family people train with RL (models/tiny_families.py) trains 2 GRPO steps on
FSDP2 with a vLLM rollout, and after the first weight sync vLLM's log-probs of its own samples equal the
trainer's at fp32 rounding (rollout_mismatch/*: a sync that loaded nothing would leave them far from 1).

In process, one rank, no Ray: each family's trainer builds its FSDP2 engine and vLLM engine in this process,
one after the other. Rollout tensor parallelism (shard-only sync over 2 ranks) runs through Ray for Llama 3.
"""

from __future__ import annotations

import pytest

from tandem.models.tiny_families import FAMILIES, save_family
from tandem.trainer import RLTrainer

from .trainer_helpers import by_step, custom_reward, make_assets, run_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
pytest.importorskip("vllm")

FP32 = 1e-4  # |ratio - 1| at fp32 rounding (measured <= 1e-6; a sync that loaded nothing: 0.5-0.9 at step 2)
STEPS = ("rollout_mismatch/max_ratio", "rollout_mismatch/min_ratio")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("family_assets"))


def train_two_steps(assets, tmp_path, family, *extra):
    """2 GRPO steps on the tiny `family`, a reward by response length and a learning rate that moves the
    weights; the metrics by step."""
    folder = save_family(family, tmp_path / family)
    cfg = run_config(
        {**assets, "model": folder},
        tmp_path / "run",
        "grpo",
        "rollout.engine=vllm",
        "trainer.total_training_steps=2",
        "actor.optim.lr=1e-2",
        "actor.ppo_mini_batch_size=4",
        "actor.use_kl_loss=false",  # no reference: one engine fewer to build
        *extra,
        *custom_reward("by_length"),
    )
    return by_step(RLTrainer(cfg).fit())


def report(family, history):
    ratios = {step: [history[step][key] for key in STEPS] for step in (1, 2)}
    print(f"\n{family}: step 1 max/min {ratios[1]}, step 2 max/min {ratios[2]}")
    return ratios


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_family_trains_and_its_vllm_rollout_follows_the_weights(assets, tmp_path, family):
    history = train_two_steps(
        assets, tmp_path, family, "trainer.backend=inprocess", "trainer.workers_per_node=1"
    )
    ratios = report(family, history)
    assert history[2]["timing_s/weight_sync"] > 0  # the updated actor went into the rollout engine
    assert history[1]["actor/grad_norm"] > 0
    for step in (1, 2):
        for value in ratios[step]:
            assert value == pytest.approx(1.0, abs=FP32), (step, ratios)


def test_llama3_into_a_tensor_parallel_vllm_engine_over_two_ranks(ray_local, assets, tmp_path):
    """rollout.tensor_parallel=2: one vLLM engine over both FSDP2 ranks, each rank sent only its cut of every
    matrix (models/tp_cuts.py: Llama's layout) with the rest NaN, so a wrong cut would poison the log-probs."""
    history = train_two_steps(assets, tmp_path, "llama3", "rollout.tensor_parallel=2")
    ratios = report("llama3 tp2", history)
    assert history[2]["weight_sync/bytes"] < history[2]["weight_sync/full_gather_bytes"]
    for step in (1, 2):
        for value in ratios[step]:
            assert value == pytest.approx(1.0, abs=FP32), (step, ratios)
