"""The step's advantages: the estimator's spec says what it reads, and this module hands it exactly that.

An estimator's spec (tandem/algo_options.py, or the spec a run-time registration brings) names its inputs
and settings. An input is the batch's key of that name, except `index` (the prompt's uid, batch["uid"])
and `rollout_is_weights` (the rollout correction's IS weights of the whole batch, computed before the
advantages); a setting is `algorithm.<name>`, except `reward_weights` (`algorithm.gdpo_reward_weights`).
So a new estimator that reads a new per-sample tensor names it in its spec and this module reads it from
the batch; nothing here changes (tests/trainer/test_advantage_step.py registers one and runs the step).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from tandem.algo_options import EstimatorSpec
from tandem.algos import ADV_ESTIMATORS
from tandem.batch import Batch
from tandem.config.schema import AlgorithmConfig

BATCH_KEYS = {"index": "uid"}  # an estimator's input name -> the batch key, where the two differ
SETTING_KEYS = {"reward_weights": "gdpo_reward_weights"}  # a setting's name -> its key in `algorithm`


def estimator_inputs(
    name: str, spec: EstimatorSpec, batch: Batch, alg: AlgorithmConfig, is_weights: Tensor | None
) -> dict[str, Any]:
    """The keywords estimator `name` is called with: what `spec` names, from the batch and `alg`."""
    step = {"rollout_is_weights": is_weights}  # what the step computed that is not in the batch
    missing = [n for n in spec.inputs if n not in step and BATCH_KEYS.get(n, n) not in batch]
    if missing:
        keys = [BATCH_KEYS.get(n, n) for n in missing]
        raise KeyError(
            f"advantage estimator '{name}' reads {keys} of the batch, which it lacks; it has {batch.keys()}"
        )
    out = {n: step[n] if n in step else batch.get(BATCH_KEYS.get(n, n)) for n in spec.inputs + spec.optional}
    for setting in spec.settings:
        key = SETTING_KEYS.get(setting, setting)
        if not hasattr(alg, key):
            raise AttributeError(
                f"advantage estimator '{name}' reads the setting algorithm.{key}, which the schema lacks: "
                "add it to AlgorithmConfig (config/schema.py)"
            )
        out[setting] = getattr(alg, key)
    return out


def compute_step_advantages(
    batch: Batch, rewards: Tensor, alg: AlgorithmConfig, is_weights: Tensor | None
) -> tuple[Tensor, Tensor]:
    """(advantages, returns) [B, R] of `algorithm.adv_estimator` on the token-level `rewards`."""
    entry = ADV_ESTIMATORS.entry(alg.adv_estimator)
    inputs = estimator_inputs(entry.name, entry.spec, batch, alg, is_weights)
    return entry.fn(rewards, batch["response_mask"], **inputs)
