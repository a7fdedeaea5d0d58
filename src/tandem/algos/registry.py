"""Name -> function registries, so config strings pick the RL math (`adv_estimator: grpo`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tandem.algo_options import unknown_name_message


@dataclass(frozen=True)
class Entry:
    name: str
    fn: Callable[..., Any]
    info: dict[str, Any] = field(default_factory=dict)


class Registry:
    """A named table of functions with free-form metadata (e.g. `needs_critic=True`)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, **info: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: register the function under `name` (an error if taken), with `info` as its metadata."""

        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            self._entries[name] = Entry(name, fn, dict(info))
            return fn

        return wrap

    def entry(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(self.unknown_message(name)) from None

    def get(self, name: str) -> Callable[..., Any]:
        """The function registered as `name`; a KeyError naming the closest known name otherwise."""
        return self.entry(name).fn

    def info(self, name: str) -> dict[str, Any]:
        """The metadata `name` was registered with."""
        return self.entry(name).info

    def unknown_message(self, name: str) -> str:
        return unknown_name_message(self.kind, name, self.names())

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


# The registries the rest of Tandem looks names up in. `import tandem.algos` fills them.
# info: needs_critic, needs_groups, needs_reward_baselines (+ needs_two_per_group: a group of one is refused)
ADV_ESTIMATORS = Registry("advantage estimator")
POLICY_LOSSES = Registry("policy loss")
KL_ESTIMATORS = Registry("KL estimator")
AGG_MODES = Registry("loss aggregation mode")
KL_CONTROLLERS = Registry("KL controller")
IS_LEVELS = Registry("importance-sampling correction level")
ROLLOUT_RS = Registry("rejection-sampling option")  # info: level (token / sequence), ratio_bounds (k1)
PF_PPO_WEIGHTS = Registry("PF-PPO reweight method")
