"""The typed step contract: estimators and policy losses declare what they read (tandem/algo_options.py), the
registry checks each function against its spec, and the step passes exactly what the spec names.

DESIGN.md ("Where the next things go") says a new advantage estimator touches its function's module and
its spec; the end-to-end test here registers one with an input no built-in estimator reads (the old-log-prob
pass's entropy) and trains a step through the normal path with no other file changed.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

import tandem.algos  # noqa: F401 - importing registers the built-in names
from tandem import algo_options
from tandem.algo_options import EstimatorSpec, LossSpec
from tandem.algos.registry import ADV_ESTIMATORS, POLICY_LOSSES, Registry
from tandem.batch import Batch
from tandem.config.schema import ActorConfig, AlgorithmConfig
from tandem.trainer import RLTrainer
from tandem.trainer.advantage_step import SETTING_KEYS, estimator_inputs

from .trainer_helpers import custom_reward, make_assets, run_config

ROOT = Path(__file__).resolve().parents[2]


def test_no_function_of_the_rl_math_swallows_keywords():
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "src/tandem/algos").glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\*\*_\b|\*\*_:", line)
    ]
    assert offenders == []


def test_design_names_the_files_a_new_estimator_touches():
    """DESIGN.md's entry names two files: the spec's (every built-in estimator's spec is listed there) and the
    function's (every built-in estimator is defined there, OTB in a module beside it);
    test_a_new_estimator_with_a_new_input_... adds one with no file of src/ changed."""
    design = (ROOT / "docs/DESIGN.md").read_text()
    (entry,) = re.findall(r"^- \*\*A new advantage estimator\*\*:.*?(?=^- \*\*|^#)", design, re.M | re.S)
    files = re.findall(r"`([\w/]+\.py)`", entry)
    assert files[:2] == ["algo_options.py", "algos/advantages.py"], files
    assert set(algo_options.ADV_ESTIMATORS.names()) == set(ADV_ESTIMATORS.names())
    homes = {ADV_ESTIMATORS.get(name).__module__ for name in ADV_ESTIMATORS}
    assert homes == {"tandem.algos.advantages", "tandem.algos.token_baseline"}  # OTB: its own module


def test_registration_checks_the_function_against_its_spec():
    reg = Registry("test estimator")
    spec = EstimatorSpec(inputs=("index",), settings=("gamma",))

    def swallows(rewards, mask, *, index, gamma, **_):
        return rewards, rewards

    def lacks_gamma(rewards, mask, *, index):
        return rewards, rewards

    def needs_more(rewards, mask, *, index, gamma, tau):
        return rewards, rewards

    def right(rewards, mask, *, index, gamma, epsilon=1e-6):
        return rewards, rewards

    with pytest.raises(
        TypeError, match=r"'a' .*takes \*\*kwargs: name each keyword its spec passes \(index, gamma\)"
    ):
        reg.register("a", spec)(swallows)
    with pytest.raises(TypeError, match=r"lacks the keywords its spec passes: \['gamma'\]"):
        reg.register("b", spec)(lacks_gamma)
    with pytest.raises(TypeError, match=r"requires \['tau'\], which its spec does not name"):
        reg.register("c", spec)(needs_more)
    with pytest.raises(KeyError, match="not listed in tandem/algo_options.py: list it there with its spec"):
        reg.register("d")
    reg.register("e", spec)(right)
    assert reg.spec("e") is spec and reg.info("e") == {
        "needs_critic": False,
        "needs_groups": True,
        "needs_reward_baselines": False,
    }


def test_every_setting_a_spec_names_is_a_config_key():
    """The actor reads actor.<setting> for the loss's settings, the step algorithm.<setting> for the
    estimator's: each must be a key of the schema."""
    actor = {f.name for f in dataclasses.fields(ActorConfig)}
    algorithm = {f.name for f in dataclasses.fields(AlgorithmConfig)}
    for name in POLICY_LOSSES:
        assert isinstance(POLICY_LOSSES.spec(name), LossSpec)
        assert set(POLICY_LOSSES.spec(name).settings) <= actor, name
    for name in ADV_ESTIMATORS:
        assert {SETTING_KEYS.get(s, s) for s in ADV_ESTIMATORS.spec(name).settings} <= algorithm, name


def _batch(**extra: torch.Tensor) -> Batch:
    return Batch(
        {"response_mask": torch.ones(4, 3), "values": torch.zeros(4, 3), **extra},
        non_tensors={"uid": ["a", "a", "b", "b"]},
    )


def test_the_step_passes_exactly_what_the_spec_names():
    alg = AlgorithmConfig(gamma=0.9, lam=0.8, gdpo_reward_weights=[1.0, 2.0])
    full = _batch(
        reward_baselines=torch.ones(4),
        old_log_probs=torch.zeros(4, 3),
        sum_pi_squared=torch.ones(4, 3),
        reward_components=torch.ones(4, 2),
    )
    weights = torch.ones(4, 3)
    for name in ADV_ESTIMATORS:
        spec = ADV_ESTIMATORS.spec(name)
        inputs = estimator_inputs(name, spec, full, alg, weights)
        assert list(inputs) == list(spec.keywords()), name
    gae = estimator_inputs("gae", ADV_ESTIMATORS.spec("gae"), full, alg, None)
    assert gae["gamma"] == 0.9 and gae["lam"] == 0.8 and gae["values"] is full["values"]
    gdpo = estimator_inputs("gdpo", ADV_ESTIMATORS.spec("gdpo"), full, alg, None)
    assert gdpo["reward_weights"] == [1.0, 2.0] and list(gdpo["index"]) == ["a", "a", "b", "b"]
    otb = estimator_inputs(
        "optimal_token_baseline", ADV_ESTIMATORS.spec("optimal_token_baseline"), full, alg, weights
    )
    assert otb["rollout_is_weights"] is weights
    with pytest.raises(KeyError, match=r"'remax' reads \['reward_baselines'\] of the batch, which it lacks"):
        estimator_inputs("remax", ADV_ESTIMATORS.spec("remax"), _batch(), alg, None)
    with pytest.raises(AttributeError, match=r"reads the setting algorithm.tau, which the schema lacks"):
        estimator_inputs("x", EstimatorSpec(settings=("tau",)), _batch(), alg, None)


SEEN: list[dict] = []


def entropy_advantage(token_level_rewards, response_mask, *, index, entropy, gamma):
    """A test estimator reading a batch key no built-in estimator reads: A = gamma * entropy on valid tokens."""
    SEEN.append({"index": list(index), "entropy": entropy.clone(), "gamma": gamma})
    advantages = gamma * entropy.float() * response_mask
    return advantages, advantages.clone()


@pytest.fixture
def entropy_estimator():
    ADV_ESTIMATORS.register(
        "entropy_advantage", EstimatorSpec(inputs=("index", "entropy"), settings=("gamma",))
    )(entropy_advantage)
    try:
        yield
    finally:
        ADV_ESTIMATORS.unregister("entropy_advantage")  # the registries stay equal to algo_options' lists


@pytest.mark.slow
def test_a_new_estimator_with_a_new_input_trains_a_step_through_the_normal_path(entropy_estimator, tmp_path):
    SEEN.clear()
    assets = make_assets(tmp_path / "assets")
    cfg = run_config(
        assets,
        tmp_path / "run",
        "grpo",
        "algorithm.adv_estimator=entropy_advantage",  # config validates it against the live registry
        "algorithm.gamma=0.5",
        "trainer.backend=inprocess",
        "trainer.workers_per_node=1",
        "trainer.total_training_steps=1",
        "rollout.engine=hf",  # no vLLM start-up: the advantage step is what is tested
        *custom_reward("by_length"),
    )
    (metrics,) = RLTrainer(cfg).fit()
    (seen,) = SEEN
    assert seen["gamma"] == 0.5
    assert len(seen["index"]) == 16 and sorted(seen["index"].count(u) for u in set(seen["index"])) == [4] * 4
    # the advantages are what the estimator made of the entropy of the old-log-prob pass: 0.5 * its mean
    assert metrics["advantages/mean"] == pytest.approx(0.5 * metrics["actor/entropy"], rel=1e-5)
    assert metrics["actor/entropy"] > 0 and "actor/pg_loss" in metrics
