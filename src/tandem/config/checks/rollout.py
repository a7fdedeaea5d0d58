"""The rollout section: sampling settings, and the multi-turn agent loop's limits, tools and interaction."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tandem.config.checks.common import at_least, within
from tandem.config.errors import Problems
from tandem.tools.names import BUILTIN_INTERACTION_NAMES, BUILTIN_TOOL_NAMES

if TYPE_CHECKING:
    from tandem.config.schema import TandemConfig


def check_sampling(cfg: TandemConfig, problems: Problems) -> None:
    """rollout.* and rollout.val.* sampling settings, and the inference engine's memory."""
    r = cfg.rollout
    if r.temperature <= 0:
        problems.add(
            "rollout.temperature",
            f"rollout.temperature={r.temperature}: training rollouts must "
            "sample (temperature > 0, usually 1.0); greedy decoding gives a group no variety. "
            "For greedy validation set rollout.val.temperature=0 instead",
        )
    at_least(problems, "rollout.val.temperature", r.val.temperature, 0)
    if r.val.n > 1 and r.val.temperature == 0:
        problems.add(
            ("rollout.val.n", "rollout.val.temperature"),
            f"rollout.val.n={r.val.n} with "
            "rollout.val.temperature=0 gives identical greedy samples: set rollout.val.n=1 or a temperature > 0",
        )
    within(problems, "rollout.top_p", r.top_p, 0, 1, "(]")
    within(problems, "rollout.val.top_p", r.val.top_p, 0, 1, "(]")
    if r.top_k == 0 or r.top_k < -1:
        problems.add("rollout.top_k", f"rollout.top_k={r.top_k}: use -1 (off) or a number of tokens >= 1")
    within(problems, "rollout.gpu_memory_utilization", r.gpu_memory_utilization, 0, 1, "(]")
    if r.cpu_kv_cache_gib < 1:
        problems.add(
            "rollout.cpu_kv_cache_gib",
            f"rollout.cpu_kv_cache_gib must be >= 1 (GiB), got {r.cpu_kv_cache_gib}",
        )


def check_multi_turn(cfg: TandemConfig, problems: Problems) -> None:
    """rollout.multi_turn: turn limits, built-in names, and the files that define tools or an interaction
    (which rollout.mode the agent loop needs is in config/modes.py)."""
    m = cfg.rollout.multi_turn
    for key, value in [
        ("rollout.multi_turn.max_assistant_turns", m.max_assistant_turns),
        ("rollout.multi_turn.max_parallel_calls", m.max_parallel_calls),
        ("rollout.multi_turn.max_tool_response_length", m.max_tool_response_length),
    ]:
        at_least(problems, key, value, 1)
    at_least(problems, "rollout.multi_turn.max_user_turns", m.max_user_turns, 0)
    for key in ("tool_timeout_s", "trajectory_timeout_s"):
        if getattr(m, key) <= 0:
            problems.add(
                f"rollout.multi_turn.{key}", f"rollout.multi_turn.{key}={getattr(m, key)} must be > 0"
            )
    unknown = [name for name in m.tools if name not in BUILTIN_TOOL_NAMES]
    if unknown:
        problems.add(
            "rollout.multi_turn.tools",
            f"rollout.multi_turn.tools names {unknown}, not built-in tools ({', '.join(BUILTIN_TOOL_NAMES)}); tools of your "
            "own go in a Python file named by rollout.multi_turn.tool_file (all of its tools are offered)",
        )
    if m.interaction and m.interaction not in BUILTIN_INTERACTION_NAMES and not m.interaction_file:
        problems.add(
            "rollout.multi_turn.interaction",
            f"rollout.multi_turn.interaction={m.interaction} is not built in ({', '.join(BUILTIN_INTERACTION_NAMES)}); "
            "define it in a Python file and set rollout.multi_turn.interaction_file",
        )
    for key, path in [
        ("rollout.multi_turn.tool_file", m.tool_file),
        ("rollout.multi_turn.interaction_file", m.interaction_file),
    ]:
        if path and not Path(path).expanduser().is_file():
            problems.add(key, f"{key}: '{path}' does not exist")
