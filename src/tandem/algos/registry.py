"""Name -> function registries, so config strings pick the RL math (`adv_estimator: grpo`).

Each name is registered with its spec (tandem/algo_options.py: what the function reads, its typed flags),
and the function's keywords are checked against the spec when it is registered: every keyword the spec
names is a parameter, every other keyword-only parameter has a default, and no `**kwargs` swallows a
misspelt or forgotten one. Callers pass exactly what the spec names (`Registry.spec`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tandem import algo_options
from tandem.algo_options import Names, Spec, unknown_name_message


@dataclass(frozen=True)
class Entry:
    name: str
    fn: Callable[..., Any]
    spec: Any  # the family's spec class: EstimatorSpec, LossSpec, AggSpec, RejectionSpec or Plain

    @property
    def info(self) -> dict[str, Any]:
        return self.spec.info()


def _check_keywords(kind: str, name: str, fn: Callable[..., Any], spec: Any) -> None:
    """A function registered against a spec that names keywords takes each of them and needs no other."""
    if not hasattr(spec, "keywords"):
        return
    params = inspect.signature(fn).parameters
    what = f"{kind} '{name}' ({getattr(fn, '__qualname__', fn)})"
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        raise TypeError(
            f"{what} takes **kwargs: name each keyword its spec passes ({', '.join(spec.keywords())})"
        )
    missing = [k for k in spec.keywords() if k not in params]
    if missing:
        raise TypeError(f"{what} lacks the keywords its spec passes: {missing}; its spec is {spec}")
    required = [
        p.name
        for p in params.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is p.empty and p.name not in spec.keywords()
    ]
    if required:
        raise TypeError(f"{what} requires {required}, which its spec does not name: add them to {spec}")


class Registry:
    """A named table of functions, each with the spec that says what it reads."""

    def __init__(self, kind: str, listed: Names | None = None) -> None:
        self.kind = kind
        self.listed = listed  # the built-in names' specs (algo_options), read without torch
        self._entries: dict[str, Entry] = {}

    def register(
        self, name: str, spec: Spec | None = None
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: register the function under `name` (an error if taken) with `spec`, by default the one
        algo_options lists for `name`; a name it does not list (one added at run time) must bring its spec."""
        if spec is None:
            if self.listed is None or name not in self.listed:
                raise KeyError(
                    f"{self.kind} '{name}' is not listed in tandem/algo_options.py: list it there with its spec, "
                    "or pass register(name, spec=...)"
                )
            spec = self.listed.spec(name)

        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' is registered twice")
            _check_keywords(self.kind, name, fn, spec)
            self._entries[name] = Entry(name, fn, spec)
            return fn

        return wrap

    def unregister(self, name: str) -> None:
        """Remove `name` (a name registered for a while, e.g. by a test)."""
        self.entry(name)
        del self._entries[name]

    def entry(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(self.unknown_message(name)) from None

    def get(self, name: str) -> Callable[..., Any]:
        """The function registered as `name`; a KeyError naming the closest known name otherwise."""
        return self.entry(name).fn

    def spec(self, name: str) -> Any:
        """The spec `name` was registered with."""
        return self.entry(name).spec

    def info(self, name: str) -> dict[str, Any]:
        """The spec of `name` as a dict."""
        return self.entry(name).info

    def call_with(self, name: str, *args: Any, **available: Any) -> Any:
        """fn(*args, **those of `available` that fn takes): a by-name call for tools and tests that hold a
        bag of inputs for any member of the family. A keyword that no registered function takes is an
        error (a misspelling). The step itself passes what the spec names (see the module docstring)."""
        known = {p for entry in self._entries.values() for p in inspect.signature(entry.fn).parameters}
        unknown = sorted(set(available) - known)
        if unknown:
            raise TypeError(f"no {self.kind} takes {unknown}; they take {sorted(known)}")
        fn = self.get(name)
        params = inspect.signature(fn).parameters
        return fn(*args, **{k: v for k, v in available.items() if k in params})

    def unknown_message(self, name: str) -> str:
        return unknown_name_message(self.kind, name, self.names())

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


# The registries the rest of Tandem looks names up in. `import tandem.algos` fills them; their specs are
# algo_options' (each family's spec class says what its functions read).
ADV_ESTIMATORS = Registry("advantage estimator", algo_options.ADV_ESTIMATORS)
POLICY_LOSSES = Registry("policy loss", algo_options.POLICY_LOSSES)
KL_ESTIMATORS = Registry("KL estimator", algo_options.KL_ESTIMATORS)
AGG_MODES = Registry("loss aggregation mode", algo_options.AGG_MODES)
KL_CONTROLLERS = Registry("KL controller", algo_options.KL_CONTROLLERS)
IS_LEVELS = Registry("importance-sampling correction level", algo_options.IS_LEVELS)
ROLLOUT_RS = Registry("rejection-sampling option", algo_options.ROLLOUT_RS)
PF_PPO_WEIGHTS = Registry("PF-PPO reweight method", algo_options.PF_PPO_WEIGHTS)
