"""rollout.layout=separate: vLLM engines in a pool of their own, weights sent from the trainer over a
WeightBus. Synchronous, it must give the hybrid layout's numbers step for step (issue 17's anchor)."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from tandem.trainer import RLTrainer
from tandem.trainer.checkpoint import TRAINER_STATE

from .trainer_helpers import NOT_COMPARABLE, by_step, custom_reward, make_assets, run_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("assets"))


def model_bytes(folder) -> int:
    """Bytes of the weights the rollout gets: every tensor of the folder (a tied head is not sent twice)."""
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return sum(f.get_tensor(k).numel() * f.get_tensor(k).element_size() for k in f.keys())


def test_separate_rollout_pool_gives_the_hybrid_numbers(ray_local, assets, tmp_path):
    """2 trainer ranks and as many engines in each layout (the same prompts per engine): the trainer's second
    rank takes part in the gathers but not in the bus. (One rank and one engine in a separate pool run in the
    one-step-off and streaming tests below.)"""
    ranks = 2
    common = ["rollout.engine=vllm", f"trainer.workers_per_node={ranks}", "trainer.total_training_steps=3"]
    common += custom_reward("by_length")
    hybrid = by_step(RLTrainer(run_config(assets, tmp_path / "hybrid", "grpo", *common)).fit())
    separate_pool = ["rollout.layout=separate", f"rollout.workers_per_node={ranks}"]
    cfg = run_config(assets, tmp_path / "separate", "grpo", *common, *separate_pool)
    separate = by_step(RLTrainer(cfg).fit())
    assert sorted(separate) == sorted(hybrid) == [1, 2, 3]
    for step in (1, 2, 3):
        h, s = hybrid[step], separate[step]
        compared = [k for k in h if not k.startswith(NOT_COMPARABLE)]
        assert len(compared) > 30 and "actor/pg_loss" in compared and "score/mean" in compared
        for key in compared:
            assert s[key] == pytest.approx(h[key], rel=1e-5, abs=1e-7), (step, key)
        # the whole model crossed the bus before each generation (step 1: the initial weights)
        assert s["weight_sync/bytes"] == model_bytes(assets["model"])
        assert s["weight_sync/buckets"] >= 1 and s["timing_s/weight_sync"] > 0
        assert s["rollout_mismatch/max_ratio"] == pytest.approx(1.0, abs=1e-3)


def test_one_step_off_trains_on_samples_one_update_behind_and_resumes(ray_local, assets, tmp_path):
    """Run to step 2, stop (step 3's generation in flight), resume to step 4: one run with an interruption."""
    common = ["rollout.engine=vllm", "trainer.workers_per_node=1", "trainer.total_training_steps=4"]
    common += ["rollout.layout=separate", "trainer.async_mode=one_step_off", "trainer.save_freq=1"]
    common += custom_reward("by_length")
    first = RLTrainer(run_config(assets, tmp_path / "run", "grpo", *common))
    assert first.cfg.algorithm.rollout_correction.rollout_is == "token"  # on by default in this mode
    history = by_step(first.fit(until_step=2))
    # the queue starts empty after a resume, so step 3 is generated again with the checkpoint's weights
    resumed = by_step(RLTrainer(run_config(assets, tmp_path / "run", "grpo", *common)).fit())
    assert sorted(history) == [1, 2] and sorted(resumed) == [3, 4]
    history.update(resumed)
    assert [history[s]["async/staleness_max"] for s in (1, 2, 3, 4)] == [0, 1, 0, 1]
    # a run's first step samples the actor's own weights; later steps the weights of one update before
    for s in (1, 3):
        assert history[s]["rollout_mismatch/max_ratio"] == pytest.approx(1.0, abs=1e-3)
    assert all(abs(history[s]["rollout_mismatch/max_ratio"] - 1) > 1e-3 for s in (2, 4))
    for s in (1, 2, 3, 4):
        assert 0 < history[s]["rollout_corr/rollout_is_mean"] <= 2 and history[s]["actor/grad_norm"] > 0
    # step 3's prompts were drawn before the checkpoint at step 2 but not trained on: not counted as consumed,
    # so the resumed run draws them again, as an uninterrupted run trains on them
    state = torch.load(first.checkpoints.root / "global_step_2" / TRAINER_STATE, weights_only=False)
    assert (state["sampler"]["epoch"], state["sampler"]["position"]) == (0, 2)


def test_streaming_trains_on_groups_as_they_finish_drops_stale_ones_and_resumes(ray_local, assets, tmp_path):
    """Run to step 2, stop, resume to step 4 (one run with an interruption, to spare a third run)."""
    common = ["rollout.engine=vllm", "trainer.workers_per_node=1", "trainer.total_training_steps=4"]
    common += ["rollout.layout=separate", "rollout.mode=async", "trainer.async_mode=streaming"]
    common += ["trainer.save_freq=2", "trainer.test_freq=2", *custom_reward("by_length")]
    first = RLTrainer(run_config(assets, tmp_path / "run", "grpo", *common))
    assert first.cfg.algorithm.rollout_correction.rollout_is == "token"  # on by default in this mode
    history = by_step(first.fit(until_step=2))
    # The prompts submitted and not trained on are saved with the checkpoint, to be submitted first.
    state = torch.load(first.checkpoints.root / "global_step_2" / TRAINER_STATE, weights_only=False)
    assert 4 <= len(state["extra"]["stream"]["pending"]) <= 8
    resumed = by_step(RLTrainer(run_config(assets, tmp_path / "run", "grpo", *common)).fit())
    assert sorted(history) == [1, 2] and sorted(resumed) == [3, 4]
    # the first step after a start trains on samples of the weights it starts from (the queue is empty)
    for h in (history[1], resumed[3]):
        assert h["async/staleness_max"] == 0
        assert h["rollout_mismatch/max_ratio"] == pytest.approx(1.0, abs=1e-3)
    history.update(resumed)
    dropped = {1: 0.0, 3: 0.0}
    for s in (1, 2, 3, 4):
        h = history[s]
        assert 0 <= h["async/staleness_mean"] <= h["async/staleness_max"] <= 1  # trainer.max_staleness=1
        assert h["async/queue_groups"] <= 8  # 2 batches of 4 prompts submitted and not yet trained on
        assert h["actor/grad_norm"] > 0 and 0 < h["rollout_corr/rollout_is_mean"] <= 2
        run_start = 1 if s < 3 else 3
        dropped[run_start] += h["async/dropped_groups"]
        assert h["async/dropped_groups_total"] == dropped[1] + (dropped[3] if s >= 3 else 0)
    assert history[2]["async/staleness_max"] == 1 and history[4]["async/staleness_max"] == 1
    assert 0 <= history[2]["val/acc"] <= 1 and 0 <= history[4]["val/acc"] <= 1  # on the stream's engine
