"""PF-PPO through the trainer (in process, 1 rank, the tiny model, 2 steps of 16 samples): the critic's and the
actor's updates receive the step's rows drawn again by their scores, the draw seeded by trainer.seed and the step.

The worker groups' update calls are wrapped to record what they are given and then run as they are (spies, not
mocks: the real updates run)."""

from __future__ import annotations

import pytest
import torch

from tandem.algos import resample_indices
from tandem.trainer import RLTrainer

from .trainer_helpers import custom_reward, make_assets, run_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


class RecordingTrainer(RLTrainer):
    """Records each step's generated batch and what the two updates are handed."""

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.seen: dict[str, list] = {"generated": [], "actor": [], "critic": []}
        next_batch = self.source.next

        def record_next(step, timer):
            batch, metrics = next_batch(step, timer)
            self.seen["generated"].append(batch)
            return batch, metrics

        self.source.next = record_next

    def workers_started(self, groups) -> None:
        super().workers_started(groups)
        for role, group, name in [
            ("actor", groups.actor, "update_actor"),
            ("critic", groups.critic, "update_critic"),
        ]:
            call = getattr(group, name)

            def record(update, *, mini_batches, _call=call, _role=role):
                self.seen[_role].append(update)
                return _call(update, mini_batches=mini_batches)

            setattr(group, name, record)


def test_the_updates_train_on_the_rows_drawn_by_their_scores(tmp_path):
    assets = make_assets(tmp_path / "assets")
    cfg = run_config(
        assets,
        tmp_path / "run",
        "ppo",  # GAE with a critic, as verl's PF-PPO example
        "trainer.backend=inprocess",
        "trainer.workers_per_node=1",
        "trainer.total_training_steps=2",
        "trainer.seed=3",
        "rollout.engine=hf",  # no vLLM start-up: the rows the updates get are what is tested
        "algorithm.use_pf_ppo=true",  # verl's key
        "algorithm.pf_ppo.reweight_method=pow",
        "algorithm.pf_ppo.weight_pow=2.0",
        *custom_reward("by_characters"),  # scores in [0, 1) that rarely tie
    )
    trainer = RecordingTrainer(cfg)
    history = trainer.fit()
    assert [m["step"] for m in history] == [1, 2]
    seen = trainer.seen
    assert len(seen["generated"]) == len(seen["actor"]) == len(seen["critic"]) == 2
    for step, (generated, actor, critic) in enumerate(
        zip(seen["generated"], seen["actor"], seen["critic"]), 1
    ):
        scores = generated["token_level_scores"].sum(-1)
        rows = resample_indices(scores, "pow", 2.0, torch.Generator().manual_seed(3 * 1_000_003 + step))
        assert len(rows) == len(generated) == 16
        assert len(set(rows.tolist())) < 16  # drawn with replacement: some rows twice, some not at all
        drawn = generated.reorder(rows)
        for update in (actor, critic):
            assert len(update) == 16
            for key in ("input_ids", "attention_mask", "responses"):
                assert torch.equal(update[key], drawn[key]), key
        # a row drawn twice carries its advantages and returns twice
        twice = [i for i in set(rows.tolist()) if rows.tolist().count(i) > 1]
        assert twice
        for i in twice:
            at = (rows == i).nonzero().flatten()
            assert torch.equal(actor["advantages"][at[0]], actor["advantages"][at[1]])
            assert torch.equal(critic["returns"][at[0]], critic["returns"][at[1]])
        metrics = history[step - 1]
        assert metrics["pf_ppo/unique_rows_fraction"] == len(set(rows.tolist())) / 16
        assert metrics["pf_ppo/score_mean"] == pytest.approx(float(scores.double()[rows].mean()), abs=1e-12)
        # the logged score is of the rows generated, not of the drawn ones
        assert metrics["score/mean"] == pytest.approx(float(scores.mean()), abs=1e-6)
