"""Rollout engines: token ids in, sampled token ids + their log-probs out (layout in `base.py`).

The face everyone outside this package uses: `RolloutEngine` (the interface), `RolloutSpec` (what to build),
`build_rollout(spec)` and `check_buildable(spec)` (the engine's start-up check), and the engines' facts by
name in tandem/rollout_options.py (torch-free, for config). Nobody outside asks which engine it is
(tests/test_structure.py: no engine name compared, no engine module imported): a new engine is one module
here, one line in ROLLOUT_ENGINES and its facts in rollout_options.py."""

from __future__ import annotations

import importlib

from tandem.batch import ROLLOUT_KEYS
from tandem.rollout.base import PROMPT_INDEX, RolloutEngine, RolloutSpec, SamplingParams
from tandem.rollout.hf import HFRollout
from tandem.rollout_options import facts, installed, resolve_engine

# The one registry: an engine's name -> its class, "module:Class" (imported when first built or checked; importing
# rollout/vllm.py imports no vLLM, building the engine does). Its names are rollout_options' built engines.
ROLLOUT_ENGINES: dict[str, str | type[RolloutEngine]] = {
    "hf": "tandem.rollout.hf:HFRollout",
    "vllm": "tandem.rollout.vllm:VLLMRollout",
}

__all__ = [
    "PROMPT_INDEX",
    "ROLLOUT_ENGINES",
    "ROLLOUT_KEYS",
    "HFRollout",
    "RolloutEngine",
    "RolloutSpec",
    "SamplingParams",
    "availability_problems",
    "build_rollout",
    "check_buildable",
    "engine_class",
    "resolve_engine",
]


def engine_class(name: str) -> type[RolloutEngine]:
    """The class registered as `name` (resolved: not "auto"); a name rollout_options knows but this release has
    not built is NotImplementedError, an unknown one a ValueError naming the known ones."""
    if name not in ROLLOUT_ENGINES:
        try:
            known = facts(name)
        except KeyError as err:
            raise ValueError(err.args[0]) from None
        if not known.built:
            raise NotImplementedError(f"rollout engine {name!r} is not available yet; use 'vllm' or 'hf'")
        raise ValueError(f"rollout engine {name!r} is listed in rollout_options but not in ROLLOUT_ENGINES")
    target = ROLLOUT_ENGINES[name]
    if isinstance(target, str):
        module, _, cls = target.partition(":")
        target = getattr(importlib.import_module(module), cls)
    return target


def build_rollout(spec: RolloutSpec) -> RolloutEngine:
    """The engine `spec` describes, built by its class's ``from_spec`` (stop / pad ids the spec leaves None are
    the folder's)."""
    return engine_class(resolve_engine(spec.engine)).from_spec(spec)


def availability_problems(name: str) -> list[str]:
    """Engine `name` (resolved) as this release and install have it: not built yet, or its package missing."""
    if not facts(name).built:
        return [f"rollout.engine={name} is not available yet; use vllm or hf"]
    if not installed(name):
        return [
            f"rollout.engine={name} but {facts(name).package} is not installed; see README (Installing) or use hf"
        ]
    return []


def check_buildable(spec: RolloutSpec) -> list[str]:
    """The start-up check of the engine `spec` names, before any worker starts: `availability_problems`, then
    what its class's ``check_buildable`` finds in the spec (read without importing the engine's library). One
    line per problem; [] when it builds."""
    return availability_problems(spec.engine) or engine_class(spec.engine).check_buildable(spec)
