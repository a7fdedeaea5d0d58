"""The rollout engines' names and what each can run, read without torch.

Config validation (layer 3) must know what a rollout engine can do, whether it runs the agent loop, spans
tensor-parallel ranks, serves LoRA adapters or runs on a CPU, before any worker starts and without importing
the engines (`tandem.rollout` loads torch and transformers: seconds for a command that only prints a
config). So each engine's facts are listed here by name, and everyone outside `rollout/` asks them instead of
comparing an engine's name: `rollout.engine=hf` with `rollout.mode=async` is refused because hf has no turn
engine, not because its name is "hf". The engines themselves are registered in `tandem.rollout`'s
`ROLLOUT_ENGINES`; tests/rollout/test_face.py keeps the two equal, name for name, and each engine class's
methods true to its facts.
"""

from __future__ import annotations

import difflib
import importlib.util
from dataclasses import dataclass

AUTO = "auto"  # rollout.engine=auto: the first engine of AUTO_ORDER that is installed


@dataclass(frozen=True)
class RolloutEngineFacts:
    """What the config checks and the start-up checks ask of a rollout engine."""

    package: str | None  # the Python package it needs installed (None: one of Tandem's own requirements)
    turn_engine: bool  # an asynchronous turn engine: the agent loop (rollout.mode=async), streaming
    tensor_parallel: (
        bool  # one engine over rollout.tensor_parallel ranks (else each rank holds a whole model)
    )
    serves_adapters: bool  # serves LoRA adapters over its base weights (actor.lora.rollout_sync=adapter)
    cpu: bool  # runs on trainer.device=cpu
    actor_dtype: bool  # computes in the actor's compute dtype (else float32 weights and compute)
    max_model_len: bool  # holds a sequence within RolloutSpec.max_model_len tokens (a KV cache sized for it)
    images: bool  # generates from prompts with images (a vision-language actor)
    built: bool = True  # False: a name verl has that Tandem does not run yet (refused at start-up)


ROLLOUT_ENGINES: dict[str, RolloutEngineFacts] = {
    # Hugging Face generate in the worker's process: every rank holds the whole model
    "hf": RolloutEngineFacts(
        package=None,
        turn_engine=False,
        tensor_parallel=False,
        serves_adapters=False,
        cpu=True,
        actor_dtype=False,
        max_model_len=False,
        images=False,
    ),
    "vllm": RolloutEngineFacts(
        package="vllm",
        turn_engine=True,
        tensor_parallel=True,
        serves_adapters=True,
        cpu=True,
        actor_dtype=True,
        max_model_len=True,
        images=True,
    ),
    # verl's other engine; no CPU path here to build and test it on (CUDA-only kernel wheels)
    "sglang": RolloutEngineFacts(
        package="sglang",
        turn_engine=True,
        tensor_parallel=True,
        serves_adapters=True,
        cpu=False,
        actor_dtype=True,
        max_model_len=True,
        images=True,
        built=False,
    ),
}
AUTO_ORDER = ("vllm", "hf")  # rollout.engine=auto takes the first that is built and installed


def facts(name: str) -> RolloutEngineFacts:
    """The facts of engine `name` (not "auto": resolve it first); a KeyError naming the closest engine."""
    if name not in ROLLOUT_ENGINES:
        known = [AUTO, *ROLLOUT_ENGINES]
        close = difflib.get_close_matches(str(name), known, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise KeyError(f"unknown rollout engine '{name}'.{hint} Known: {', '.join(known)}.")
    return ROLLOUT_ENGINES[name]


def named(name: str) -> RolloutEngineFacts | None:
    """The facts of the engine a config names, or None for "auto" (known once resolved, at start-up) and for a
    name no engine has (the schema's choice check names it)."""
    return ROLLOUT_ENGINES.get(name)


def installed(name: str) -> bool:
    """Whether engine `name` can be built in this install: built by Tandem, and its package importable."""
    engine = facts(name)
    return engine.built and (engine.package is None or importlib.util.find_spec(engine.package) is not None)


def resolve_engine(name: str) -> str:
    """The engine a config's rollout.engine means: "auto" is the first of AUTO_ORDER installed (vllm where it
    is, else hf); any other name is itself."""
    if name != AUTO:
        return name
    return next(engine for engine in AUTO_ORDER if installed(engine))


def engines_with(fact: str) -> list[str]:
    """The built engines that have `fact` (a field of RolloutEngineFacts), in AUTO_ORDER first: for messages
    that say which engine to choose instead."""
    order = [*AUTO_ORDER, *(n for n in ROLLOUT_ENGINES if n not in AUTO_ORDER)]
    return [n for n in order if ROLLOUT_ENGINES[n].built and getattr(ROLLOUT_ENGINES[n], fact)]
