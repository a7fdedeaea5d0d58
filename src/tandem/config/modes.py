"""Every rule that ties rollout.mode, rollout.layout and trainer.async_mode together, each said once.

rollout.mode: sync (one batched generate call) or async (the agent loop on vLLM's engine).
rollout.layout: hybrid (the rollout engines share the trainer's ranks) or separate (a pool of their own).
trainer.async_mode: synchronous, one_step_off or streaming (generation overlaps training).
`check_modes` runs in validation (tandem/config/validate.py); `rollout_tensor_parallel_problems` runs at
start-up with the other engine checks (tandem/trainer/start_checks/rollout_engine.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tandem.algo_options import EstimatorSpec
from tandem.config.errors import Problems
from tandem.rollout_options import engines_with, named

if TYPE_CHECKING:
    from tandem.config.schema import TandemConfig


def check_modes(cfg: TandemConfig, problems: Problems, estimator: EstimatorSpec) -> None:
    """The modes against one another and against what each needs (engine, backend, estimator, tools);
    `estimator` is the advantage estimator's spec (tandem/algo_options.py)."""
    r, t, m = cfg.rollout, cfg.trainer, cfg.rollout.multi_turn
    est = cfg.algorithm.adv_estimator
    if t.async_mode != "synchronous":
        mode = f"trainer.async_mode={t.async_mode}"
        if r.layout != "separate":
            problems.add(
                ("trainer.async_mode", "rollout.layout"),
                f"{mode} generates while the trainer trains, which needs the rollout "
                "engines in a pool of their own: set rollout.layout=separate",
            )
        if cfg.algorithm.dynamic_sampling.enable:
            problems.add(
                ("trainer.async_mode", "algorithm.dynamic_sampling.enable"),
                f"{mode} draws one round of prompts per step; dynamic sampling's "
                "extra rounds are not supported with it yet: use trainer.async_mode=synchronous",
            )
    if t.async_mode == "streaming" and r.mode != "async":
        problems.add(
            ("trainer.async_mode", "rollout.mode"),
            "trainer.async_mode=streaming runs every sample as a coroutine on the asynchronous engine, so that "
            "a prompt group starts as soon as there is room: set rollout.mode=async (with no tools it is "
            "single-turn generation, the same tokens as rollout.mode=sync)",
        )
    if r.layout == "separate" and t.backend == "inprocess":
        problems.add(
            ("rollout.layout", "trainer.backend"),
            "rollout.layout=separate puts the rollout engines in worker processes of their own, but "
            "trainer.backend=inprocess runs everything in this process: use trainer.backend=ray",
        )
    if cfg.actor.lora.syncs_adapters and r.layout == "separate":
        problems.add(
            ("actor.lora.rollout_sync", "rollout.layout"),
            "actor.lora.rollout_sync=adapter is built for rollout.layout=hybrid; the separate pool's "
            "weight bus sends merged weights: use rollout_sync=merged",
        )
    if estimator.needs_reward_baselines and t.async_mode != "synchronous":
        problems.add(
            ("algorithm.adv_estimator", "trainer.async_mode"),
            f"algorithm.adv_estimator={est} generates a greedy baseline each step, which "
            f"trainer.async_mode={t.async_mode} does not prefetch yet: use trainer.async_mode=synchronous",
        )
    # the agent loop runs on vLLM, and only in async mode
    uses_agent = bool(m.tools or m.tool_file or m.interaction or m.interaction_file)
    if uses_agent and r.mode != "async":
        problems.add(
            "rollout.mode",
            f"rollout.multi_turn names tools or an interaction, but rollout.mode={r.mode}: tools run in the agent "
            "loop; set rollout.mode=async",
        )
    engine = named(r.engine)  # None for auto: the start-up check asks the engine it resolves to
    if r.mode == "async" and engine is not None and not engine.turn_engine:
        problems.add(
            ("rollout.mode", "rollout.engine"),
            f"rollout.mode=async runs on a continuously batched engine; rollout.engine={r.engine} has none. "
            f"Set rollout.engine={' or '.join(engines_with('turn_engine'))} (or auto where vLLM is installed)",
        )


def rollout_tensor_parallel_problems(cfg: TandemConfig) -> list[str]:
    """What a vLLM engine spanning rollout.tensor_parallel ranks does not run with yet. Its ranks must issue
    the same requests in the same engine steps: the synchronous generate call does; the agent loop's
    asynchronous turns (tool calls finishing at different times on each rank) would not."""
    r, t, k = cfg.rollout, cfg.trainer, f"rollout.tensor_parallel={cfg.rollout.tensor_parallel}"
    problems = []
    if r.mode == "async":
        problems.append(
            f"{k} with rollout.mode=async (agent loop) is not available yet; use rollout.mode=sync"
        )
    if r.layout == "separate" or t.async_mode != "synchronous":
        problems.append(
            f"{k} runs in the hybrid layout only (not yet with rollout.layout=separate or trainer.async_mode); "
            "set rollout.tensor_parallel=1 there"
        )
    return problems
