"""Score one sample with one scorer, or one list of samples with a batch function (verl's batch reward manager),
and turn whatever happens into `Outcome`s.

Shared by the in-process path and the worker processes, so both treat results the same way.
"""

from __future__ import annotations

import functools
import math
import os
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from tandem.rewards.custom import load_function

# What the worker processes are told to run: a function picklable by reference
# (a module-level function, e.g. a registered scorer), or (file path, function name) with an
# optional third item, the keyword arguments bound to it as sorted (name, value) pairs.
ScorerSpec = Callable[..., Any] | tuple[str, str] | tuple[str, str, tuple[tuple[str, Any], ...]]

MAX_ERROR_CHARS = 1000


class Task(NamedTuple):
    scorer_key: str
    data_source: str
    solution_str: str
    ground_truth: Any
    extra_info: Any


# the keyword arguments verl's batch reward manager calls a batch function with, besides its reward kwargs
BATCH_ARGUMENTS = ("data_sources", "solution_strs", "ground_truths", "extra_infos")


class BatchTask(NamedTuple):
    """One call of a batch function over several samples, with verl's batch manager's arguments: data_sources and
    extra_infos are numpy object arrays (verl passes its non-tensor columns so), the texts and ground truths lists."""

    scorer_key: str
    data_sources: np.ndarray
    solution_strs: list[str]
    ground_truths: list[Any]
    extra_infos: np.ndarray
    kwargs: tuple[tuple[str, Any], ...]  # verl's reward_model.reward_kwargs, as sorted (name, value) pairs


class Outcome(NamedTuple):
    score: float  # the scorer's score; 0.0 when it failed
    fields: dict[str, Any]  # the scorer's other returned fields ("acc", ...)
    error: str | None = None
    timed_out: bool = False


@dataclass(frozen=True)
class BoundScorer:
    """A registered scorer with keyword arguments from the config (e.g. the code scorer's Sandbox Fusion URL):
    picklable by reference to the function, so worker processes can run it."""

    fn: Callable[..., Any]
    kwargs: tuple[tuple[str, Any], ...]

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args, **dict(self.kwargs))


def spec_key(spec: ScorerSpec | BoundScorer) -> str:
    """A stable name for a spec, the same in every process."""
    if isinstance(spec, BoundScorer):
        return f"{spec_key(spec.fn)}({', '.join(f'{k}={v!r}' for k, v in spec.kwargs)})"
    if isinstance(spec, tuple):
        bound = f"({', '.join(f'{k}={v!r}' for k, v in spec[2])})" if len(spec) > 2 and spec[2] else ""
        return f"{os.path.realpath(spec[0])}:{spec[1]}{bound}"
    return f"{getattr(spec, '__module__', '?')}.{getattr(spec, '__qualname__', repr(spec))}"


def resolve(spec: ScorerSpec) -> Callable[..., Any]:
    """The callable a spec names, loading a file if needed and binding its keyword arguments."""
    if not isinstance(spec, tuple):
        return spec
    fn = load_function(spec[0], spec[1])
    kwargs = dict(spec[2]) if len(spec) > 2 else {}
    return functools.partial(fn, **kwargs) if kwargs else fn


def describe_error(error: BaseException) -> str:
    """ "ValueError: bad input (at file.py:12 in fn)", cut to MAX_ERROR_CHARS."""
    text = f"{type(error).__name__}: {error}"
    frames = traceback.extract_tb(error.__traceback__)
    if frames:
        last = frames[-1]
        text += f" (at {os.path.basename(last.filename)}:{last.lineno} in {last.name})"
    return text[:MAX_ERROR_CHARS]


def plain_field(value: Any) -> Any:
    """Per-sample extra fields travel between processes and into numpy arrays: keep them plain."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):
        return value.item()
    return repr(value)[:MAX_ERROR_CHARS]


def to_outcome(value: Any) -> Outcome:
    """Check a scorer's return value (a number, or a dict with "score") and normalize it."""
    fields: dict[str, Any] = {}
    if isinstance(value, dict):
        if "score" not in value:
            raise TypeError(f"a scorer's dict must hold 'score'; got keys {sorted(map(str, value))}")
        fields = {str(k): plain_field(v) for k, v in value.items() if k != "score"}
        value = value["score"]
    if isinstance(value, str | bytes) or value is None:
        raise TypeError(f"a scorer must return a number or a dict with 'score', got {value!r}")
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"a scorer must return a number or a dict with 'score', got {type(value).__name__}"
        ) from None
    if not math.isfinite(score):
        raise ValueError(f"the scorer returned a non-finite score ({score})")
    return Outcome(score, fields)


def score_task(fn: Callable[..., Any], task: Task) -> Outcome:
    """Run `fn` on one sample; an exception (or sys.exit) becomes an error Outcome."""
    try:
        return to_outcome(fn(task.data_source, task.solution_str, task.ground_truth, task.extra_info))
    except (Exception, SystemExit) as error:
        return Outcome(0.0, {}, describe_error(error))


def score_batch(fn: Callable[..., Any], task: BatchTask) -> list[Outcome]:
    """Call batch function `fn` once over the samples of `task`, as verl's batch reward manager calls it; one
    Outcome per sample. A call that raises (or returns no list of the batch's length) fails every sample of the
    call; a returned item that is neither a number nor a dict with "score" fails its own sample."""
    n = len(task.solution_strs)
    try:
        values = fn(
            data_sources=task.data_sources,
            solution_strs=task.solution_strs,
            ground_truths=task.ground_truths,
            extra_infos=task.extra_infos,
            **dict(task.kwargs),
        )
        if isinstance(values, str | bytes | dict) or not hasattr(values, "__len__"):
            raise TypeError(
                "a batch reward function must return a list with one score (a number, or a dict with 'score') "
                f"per sample; got {type(values).__name__}"
            )
        if len(values) != n:
            raise ValueError(f"the batch reward function returned {len(values)} scores for {n} samples")
    except (Exception, SystemExit) as error:
        failed = Outcome(
            0.0, {}, f"the batch call over {n} samples failed (each scores 0): {describe_error(error)}"
        )
        return [failed] * n
    outcomes = []
    for value in values:
        try:
            outcomes.append(to_outcome(value))
        except (TypeError, ValueError) as error:
            outcomes.append(Outcome(0.0, {}, describe_error(error)))
    return outcomes


def score_tasks(
    tasks: Sequence[Task | BatchTask],
    specs: dict[str, ScorerSpec],
    cache: dict[str, Callable[..., Any]],
    on_start: Callable[[], None] | None = None,
) -> list[Outcome | list[Outcome]]:
    """Score `tasks` one after another here; `cache` maps scorer keys to loaded functions. A Task gives one
    Outcome, a BatchTask a list of them (one per sample of the call).

    `on_start()` runs before each task (the worker processes count progress with it).
    """
    outcomes = []
    for task in tasks:
        if on_start is not None:
            on_start()
        fn = cache.get(task.scorer_key)
        if fn is None:
            try:
                fn = cache[task.scorer_key] = resolve(specs[task.scorer_key])
            except (Exception, SystemExit) as error:
                outcomes.append(Outcome(0.0, {}, f"cannot load the scorer: {describe_error(error)}"))
                continue
        outcomes.append(score_batch(fn, task) if isinstance(task, BatchTask) else score_task(fn, task))
    return outcomes
