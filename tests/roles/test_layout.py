"""Worker groups built from the config: hybrid actor+rollout+ref, critic and reward model colocated or
on pools of their own, and the in-process layout; every layout gives the same numbers."""

from __future__ import annotations

import pytest
import torch

from tandem.models.tiny import save_tiny
from tandem.roles.layout import build_worker_groups
from tandem.rollout import SamplingParams

from .roles_helpers import PROMPTS, prompt_batch, tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("layout")
    return save_tiny(root / "policy"), save_tiny(root / "rm", num_labels=1, seed=3)


def config(paths, workers, *overrides):
    policy, rm = paths
    return tiny_config(
        policy,
        workers,
        "algorithm.adv_estimator=gae",
        "actor.use_kl_loss=true",
        "reward.reward_model.enable=true",
        f"reward.reward_model.model_path={rm}",
        # placement is what differs here: HF generate starts in no time where vLLM takes seconds per engine
        # (vLLM in these placements: tests/trainer/test_rl_e2e.py, test_separate_rollout_e2e.py)
        "rollout.engine=hf",
        *overrides,
    )


def run_every_role(groups):
    """generate on the hybrid group, then every forward of every role on the rollout."""
    rollout = groups.actor.generate(
        prompt_batch(PROMPTS[:2]), SamplingParams(max_tokens=8, n=2, temperature=1.0, seed=5)
    )
    futures = {
        "old": groups.actor.compute_log_probs.async_(rollout, False),
        "ref": groups.ref.compute_ref_log_probs.async_(rollout),
        "values": groups.critic.compute_values.async_(rollout),
        "rm": groups.reward_model.compute_rm_scores.async_(rollout),
    }
    return rollout, {name: f.result(timeout=300) for name, f in futures.items()}


def test_colocated_separate_and_inprocess_layouts_agree(ray_local, paths):
    colocated = build_worker_groups(
        config(paths, 2, "trainer.placement=colocate", "trainer.cpus_per_worker=1")
    )
    try:
        assert colocated.ref is colocated.actor and colocated.critic is colocated.reward_model
        assert colocated.critic is not colocated.actor and len(colocated.pools) == 1
        assert [g.world_size for g in colocated.unique()] == [2, 2]
        rollout, expected = run_every_role(colocated)
    finally:
        colocated.shutdown()

    separate = build_worker_groups(
        config(paths, 1, "trainer.placement=separate", "trainer.cpus_per_worker=0.5")
    )
    try:
        assert separate.ref is separate.actor and separate.critic is not separate.reward_model
        assert len(separate.pools) == 3
        rollout_sep, got_sep = run_every_role(separate)
    finally:
        separate.shutdown()

    inprocess = build_worker_groups(config(paths, 1, "trainer.backend=inprocess"))
    try:
        assert len(inprocess.unique()) == 1
        rollout_inp, got_inp = run_every_role(inprocess)
    finally:
        inprocess.shutdown()

    # Seeded by prompt_index: every layout samples the same tokens and scores them the same way.
    for other_rollout, other in ((rollout_sep, got_sep), (rollout_inp, got_inp)):
        assert torch.equal(other_rollout["responses"], rollout["responses"])
        for name, key in (
            ("old", "old_log_probs"),
            ("ref", "ref_log_probs"),
            ("values", "values"),
            ("rm", "rm_scores"),
        ):
            torch.testing.assert_close(other[name][key], expected[name][key], rtol=0, atol=1e-5, msg=key)
