"""RewardManager: a batch of generated responses -> token-level scores, extras and metrics."""

from __future__ import annotations

import logging
import math
import os
import pickle
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tandem.rewards.custom import GROUND_TRUTH_CHECK, load_function, load_ground_truth_check, split_file_spec
from tandem.rewards.pool import ScorerPool
from tandem.rewards.registry import (
    GROUND_TRUTH_CHECKS,
    SCORERS,
    GroundTruthCheck,
    UnknownDataSourceError,
    scorer_name_for,
    scorer_name_of,
    unknown_data_source_message,
)
from tandem.rewards.scoring import (
    BATCH_ARGUMENTS,
    BatchTask,
    BoundScorer,
    Outcome,
    ScorerSpec,
    Task,
    resolve,
    score_tasks,
    spec_key,
)
from tandem.rewards.terms import Term, TermInput, check_terms

logger = logging.getLogger(__name__)

# The per-sample column the agent loop adds (rollout/agent.py): messages, tool calls, final answer.
# A scorer reads it as extra_info["trajectory"]; solution_str is the final answer alone.
TRAJECTORY_KEY = "trajectory"
# Parts of a trajectory a scorer also finds at the top of extra_info, where verl's reward functions read
# them: the tools' step rewards and the interaction's turn scores.
TRAJECTORY_TO_EXTRA_INFO = ("tool_rewards", "turn_scores")

RESERVED_EXTRA = ("score", "scorer_score", "error")


def reward_model_only(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float:
    """The rule score of a sample no rule scorer covers while a reward model scores every sample: 0, so the
    sample's reward is the reward model's score alone (as verl scores every sample when a reward model is on)."""
    return 0.0


@dataclass
class _Samples:
    """What scoring reads of a batch (RewardManager._read)."""

    responses: torch.Tensor  # [N, R]
    mask: torch.Tensor  # [N, R] response_mask
    data_sources: list[str]
    ground_truths: list[Any]
    extra_infos: list[Any]
    texts: list[str]  # each decoded response (a trajectory's final answer)


@dataclass
class RewardResult:
    token_level_scores: torch.Tensor  # [N, R] float32: the total score on the last valid response token
    scores: torch.Tensor  # [N] float32: scorer score + terms (0 where the scorer failed)
    extra: dict[str, np.ndarray]  # per-sample: "scorer_score", one column per term, "error", scorer fields
    metrics: dict[str, float]
    first_error: str | None = None  # "sample i (data_source 'x'): ..." of the first failure in this batch


class RewardManager:
    """Scores responses with rule-based scorers in worker processes, with time limits.

    Which scorer scores a sample, first match wins: `scorer_overrides[data_source]` (a registered
    scorer name, or "path/file.py:function"), then `custom_reward_file` (for every data_source),
    then the scorer registered for the data_source, then the one named by `extra_info["style"]`.
    A data_source none of these covers is an error naming the ways to fix it, unless `reward_model`
    (a reward model scores every sample too): then its rule score is 0 (`reward_model_only`).

    `batch=True` is verl's batch reward manager: `custom_reward_file`'s function is called once per
    batch, `fn(data_sources=..., solution_strs=..., ground_truths=..., extra_infos=..., **manager_kwargs)`
    (`custom_reward_kwargs` bound to it as well), and returns one score (a number, or a dict with
    "score") per sample. The call may take `timeout_s` per sample of the batch; a call that raises,
    times out or returns a list of another length scores every sample of the batch 0 and counts each.

    `num_workers=0` scores in this process, one sample after another: good for debugging, but
    there is no hard time limit there (a hung scorer hangs the call; slow ones are logged).
    Not thread-safe: call it from one thread at a time.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        custom_reward_file: str | os.PathLike | None = None,
        custom_reward_function: str = "compute_score",
        custom_reward_kwargs: Mapping[str, Any] | None = None,
        scorer_overrides: Mapping[str, str] | None = None,
        terms: Iterable[Term] = (),
        timeout_s: float = 10.0,
        num_workers: int = 2,
        max_response_length: int | None = None,
        chunk_size: int | None = None,
        reward_model: bool = False,
        batch: bool = False,
        manager_kwargs: Mapping[str, Any] | None = None,
        scorer_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"RewardManager timeout_s must be > 0, got {timeout_s}")
        if num_workers < 0:
            raise ValueError(
                f"RewardManager num_workers must be >= 0 (0 scores in-process), got {num_workers}"
            )
        if chunk_size is not None and chunk_size < 1:
            raise ValueError(f"RewardManager chunk_size must be >= 1 or None, got {chunk_size}")
        self.tokenizer = tokenizer
        self.timeout_s = float(timeout_s)
        self.num_workers = num_workers
        self.chunk_size = chunk_size
        self.reward_model = reward_model
        self.terms = check_terms(terms, max_response_length)
        clashes = [t.name for t in self.terms if t.name in RESERVED_EXTRA]
        if clashes:
            raise ValueError(
                f"reward term names {clashes} are taken by the result's own columns {RESERVED_EXTRA}"
            )
        # Load user code here, in the caller's process, so a wrong path fails now, not in a worker.
        self._custom: ScorerSpec | None = None
        if custom_reward_file is not None:
            kwargs = tuple(sorted((custom_reward_kwargs or {}).items()))
            self._custom = (os.fspath(custom_reward_file), custom_reward_function, kwargs)
            resolve(self._custom)
        elif custom_reward_kwargs:
            raise ValueError("custom_reward_kwargs are given but no custom_reward_file to pass them to")
        self._overrides = {
            source: self._override_spec(source, target) for source, target in (scorer_overrides or {}).items()
        }
        unknown = sorted(set(scorer_kwargs or {}) - set(SCORERS))
        if unknown:
            raise ValueError(f"scorer_kwargs name scorers that are not registered: {unknown}")
        # a built-in scorer's keyword arguments from the config, by scorer name (the code scorer's sandbox)
        self._scorer_kwargs = {
            name: tuple(sorted(kw.items())) for name, kw in (scorer_kwargs or {}).items() if kw
        }
        self.batch = batch
        self._batch_kwargs = self._check_batch(batch, custom_reward_kwargs or {}, manager_kwargs or {})
        self._resolved: dict[tuple[str, str | None], tuple[str, ScorerSpec]] = {}
        self._pool: ScorerPool | None = None
        self.first_error: str | None = None  # the first failure over this manager's life

    def _check_batch(
        self, batch: bool, custom_kwargs: Mapping[str, Any], manager_kwargs: Mapping[str, Any]
    ) -> tuple[tuple[str, Any], ...]:
        """The keyword arguments of each batch call (verl's reward_model.reward_kwargs; custom_reward_kwargs, bound
        to the function, win where both name one, as in verl), after checking batch=True can be built."""
        if not batch:
            if manager_kwargs:
                raise ValueError(
                    f"manager_kwargs {sorted(manager_kwargs)} are passed to a batch function's calls (batch=True); "
                    "a per-sample function takes custom_reward_kwargs (verl's naive manager refuses them too)"
                )
            return ()
        if self._custom is None:
            raise ValueError(
                "batch=True calls custom_reward_file's function with lists of samples: give custom_reward_file"
            )
        if self._overrides:
            raise ValueError("batch=True calls one function for every sample: scorer_overrides cannot apply")
        clash = sorted(set(BATCH_ARGUMENTS) & (set(custom_kwargs) | set(manager_kwargs)))
        if clash:
            raise ValueError(
                f"reward kwargs {clash} clash with the batch call's own arguments {BATCH_ARGUMENTS}: rename them"
            )
        return tuple(sorted((k, v) for k, v in manager_kwargs.items() if k not in custom_kwargs))

    @staticmethod
    def _override_spec(data_source: str, target: str) -> ScorerSpec:
        file_spec = split_file_spec(target)
        if file_spec is not None:
            load_function(*file_spec)
            return file_spec
        if target not in SCORERS:
            raise ValueError(
                f"scorer_overrides['{data_source}'] = '{target}' is neither a registered scorer "
                f"({', '.join(sorted(SCORERS))}) nor a 'path/to/file.py:function'"
            )
        return SCORERS[target]

    # --- scorer resolution ---------------------------------------------------------------------

    def _scorer_for(self, data_source: str, style: str | None) -> tuple[str, ScorerSpec]:
        cached = self._resolved.get((data_source, style))
        if cached is not None:
            return cached
        if data_source in self._overrides:
            spec = self._overrides[data_source]
        elif self._custom is not None:
            spec = self._custom
        else:
            name = scorer_name_for(data_source, style)
            if name is None and not self.reward_model:
                raise UnknownDataSourceError(unknown_data_source_message(data_source))
            spec = SCORERS[name] if name is not None else reward_model_only
        bound = self._scorer_kwargs.get(scorer_name_of(spec) or "")
        if bound:
            spec = BoundScorer(spec, bound)
        if self.num_workers > 0 and not isinstance(spec, tuple):
            try:
                pickle.dumps(spec)
            except Exception as error:
                raise TypeError(
                    f"the scorer for data_source '{data_source}' ({spec!r}) cannot be sent to worker processes "
                    f"({error}); define it at the top level of an importable module, or use num_workers=0"
                ) from None
        self._resolved[(data_source, style)] = result = (spec_key(spec), spec)
        return result

    def check_data_sources(self, sources: Iterable[tuple[str, str | None]]) -> None:
        """Raise UnknownDataSourceError now (before any worker starts) for a (data_source, style) that
        no scorer covers, naming every such data_source."""
        unknown = []
        for source, style in sorted(set(sources), key=str):
            try:
                self._scorer_for(source, style)
            except UnknownDataSourceError as error:
                unknown.append(str(error))
        if unknown:
            raise UnknownDataSourceError("; ".join(unknown))

    def _ground_truth_check(self, data_source: str, style: str | None) -> tuple[str, GroundTruthCheck | None]:
        """(who scores the data_source, in words; its ground-truth check or None)."""
        _, spec = self._scorer_for(data_source, style)
        if isinstance(spec, tuple):  # a user's file: its optional check_ground_truth
            return f"{spec[1]} in {spec[0]}", load_ground_truth_check(spec[0])
        name = scorer_name_of(spec.fn if isinstance(spec, BoundScorer) else spec)
        if name is None:
            return repr(spec), None
        return f"scorer '{name}'", GROUND_TRUTH_CHECKS.get(name)

    def ground_truth_problems(
        self, rows: Iterable[tuple[str, str | None, Any]]
    ) -> Iterator[tuple[int, str, str]]:
        """For each (data_source, style, ground_truth) row that its scorer's check rejects:
        (the row's position, who scores it, what the check expected). Rows whose scorer declares no
        check pass; a check that raises, or returns something other than None or a str, is reported
        as the row's problem too, naming the check."""
        checks: dict[tuple[str, str | None], tuple[str, GroundTruthCheck | None]] = {}
        for i, (data_source, style, ground_truth) in enumerate(rows):
            key = (data_source, style)
            if key not in checks:
                checks[key] = self._ground_truth_check(data_source, style)
            scorer, check = checks[key]
            if check is None:
                continue
            try:
                problem = check(data_source, ground_truth)
            except Exception as error:
                problem = f"{GROUND_TRUTH_CHECK} of {scorer} raised {type(error).__name__}: {error}"
            if problem is not None and not isinstance(problem, str):
                problem = (
                    f"{GROUND_TRUTH_CHECK} of {scorer} returned {problem!r:.40}; it must return None "
                    "(the ground truth is fine) or a string saying what it expected"
                )
            if problem is not None:
                yield i, scorer, problem

    # --- the call --------------------------------------------------------------------------------

    def _decode(self, responses: torch.Tensor, mask: torch.Tensor) -> list[str]:
        ids = [row[valid].tolist() for row, valid in zip(responses, mask.bool())]
        if hasattr(self.tokenizer, "batch_decode"):
            return list(self.tokenizer.batch_decode(ids, skip_special_tokens=True))
        return [self.tokenizer.decode(x, skip_special_tokens=True) for x in ids]

    def _score(self, tasks: list[Task], specs: dict[str, ScorerSpec]) -> list[Outcome]:
        if self.batch:
            return self._score_batch(tasks, specs)
        if self.num_workers == 0:
            cache = {key: resolve(spec) for key, spec in specs.items()}
            outcomes: list[Outcome] = []
            for i, task in enumerate(tasks):
                started = time.monotonic()
                outcomes.extend(score_tasks([task], specs, cache))
                if time.monotonic() - started > self.timeout_s:
                    logger.warning(
                        "reward: sample %d (data_source '%s') took %.1f s > timeout_s=%g; num_workers=0 has no "
                        "hard time limit",
                        i,
                        task.data_source,
                        time.monotonic() - started,
                        self.timeout_s,
                    )
            return outcomes
        chunk_size = self.chunk_size or max(1, min(64, math.ceil(len(tasks) / (4 * self.num_workers))))
        return self._scorer_pool().run(tasks, specs, chunk_size)  # a Task gives an Outcome

    def _score_batch(self, tasks: list[Task], specs: dict[str, ScorerSpec]) -> list[Outcome]:
        """verl's batch reward manager: the function called once over all the samples, with verl's plural keyword
        arguments and reward kwargs. The call may take timeout_s per sample; one that fails fails every sample."""
        n = len(tasks)
        if n == 0:
            return []
        sources = np.empty(n, dtype=object)
        sources[:] = [task.data_source for task in tasks]
        infos = np.empty(n, dtype=object)
        # as verl's batch manager: {} for a missing extra_info, and rollout_reward_scores set on each ({} in verl too)
        infos[:] = [
            {**(task.extra_info if isinstance(task.extra_info, dict) else {}), "rollout_reward_scores": {}}
            for task in tasks
        ]
        texts, truths = [task.solution_str for task in tasks], [task.ground_truth for task in tasks]
        call = BatchTask(tasks[0].scorer_key, sources, texts, truths, infos, self._batch_kwargs)
        limit = self.timeout_s * n
        if self.num_workers == 0:
            started = time.monotonic()
            (result,) = score_tasks([call], specs, {})
            if time.monotonic() - started > limit:
                logger.warning(
                    "reward: the batch call over %d samples took %.1f s > %d x timeout_s=%g; num_workers=0 has no "
                    "hard time limit",
                    n,
                    time.monotonic() - started,
                    n,
                    self.timeout_s,
                )
        else:
            (result,) = self._scorer_pool().run([call], specs, chunk_size=1, time_limits=[limit])
        return result if isinstance(result, list) else [result] * n  # a timeout or crash: every sample's

    def _scorer_pool(self) -> ScorerPool:
        if self._pool is None:
            self._pool = ScorerPool(self.num_workers, self.timeout_s)
        return self._pool

    def __call__(self, batch: Any) -> RewardResult:
        samples = self._read(batch)
        tasks, specs = self._tasks(samples)
        return self._result(samples, self._score(tasks, specs))

    def _read(self, batch: Any) -> _Samples:
        """What scoring reads of `batch`: the decoded responses (a trajectory's final answer), their rows."""
        for key in ("responses", "response_mask", "data_source", "ground_truth"):
            if key not in batch:
                raise KeyError(f"RewardManager needs '{key}' in the batch (has: {', '.join(batch.keys())})")
        responses, mask = batch["responses"], batch["response_mask"]
        if mask.shape != responses.shape:
            raise ValueError(
                f"RewardManager: response_mask has shape {tuple(mask.shape)} but responses {tuple(responses.shape)}; "
                "they must match token for token"
            )
        n = len(batch)
        data_sources = [str(s) for s in batch["data_source"]]
        extra_infos = list(batch["extra_info"]) if "extra_info" in batch else [None] * n
        texts = self._decode(responses, mask)
        if TRAJECTORY_KEY in batch:  # multi-turn (rollout/agent.py): score the final answer, show the rest
            trajectories = list(batch[TRAJECTORY_KEY])
            texts = [str(t.get("final_answer", "")) for t in trajectories]
            extra_infos = [
                {
                    **(info if isinstance(info, dict) else {}),
                    TRAJECTORY_KEY: t,
                    **{key: list(t.get(key) or []) for key in TRAJECTORY_TO_EXTRA_INFO},
                }
                for info, t in zip(extra_infos, trajectories, strict=True)
            ]
        return _Samples(responses, mask, data_sources, list(batch["ground_truth"]), extra_infos, texts)

    def _tasks(self, samples: _Samples) -> tuple[list[Task], dict[str, ScorerSpec]]:
        """One Task per sample, with the scorer that scores it."""
        n = len(samples.texts)
        specs: dict[str, ScorerSpec] = {}
        tasks = []
        for i in range(n):
            info = samples.extra_infos[i] if isinstance(samples.extra_infos[i], dict) else None
            style = info.get("style") if info is not None else None
            source = samples.data_sources[i]
            try:
                key, spec = self._scorer_for(source, style if isinstance(style, str) else None)
            except UnknownDataSourceError as error:  # before any scoring: nothing is half done
                count = samples.data_sources.count(source)
                raise UnknownDataSourceError(
                    f"sample {i} of {n} ({count} with this data_source): {error}"
                ) from None
            specs[key] = spec
            tasks.append(
                Task(key, source, samples.texts[i], samples.ground_truths[i], samples.extra_infos[i])
            )
        return tasks, specs

    def _result(
        self, samples: _Samples, outcomes: list[Outcome], token_level: torch.Tensor | None = None
    ) -> RewardResult:
        """The RewardResult of per-sample `outcomes`, with the reward terms added. Each total goes on the sample's
        last valid response token; with `token_level` (a reward manager class's [N, R] rewards, each outcome's
        score their row sum) those stay where they are and the terms go on the last valid token."""
        responses, mask, data_sources = samples.responses, samples.mask, samples.data_sources
        n = len(outcomes)
        lengths = mask.sum(-1).tolist()
        term_values = {t.name: np.zeros(n) for t in self.terms}
        for i, outcome in enumerate(outcomes):
            if outcome.error is None:  # a failed sample scores 0 in total: no format bonus on a crash
                sample = TermInput(samples.texts[i], int(lengths[i]), data_sources[i], samples.extra_infos[i])
                for term in self.terms:
                    term_values[term.name][i] = float(term(sample))
        scorer_scores = np.array([o.score for o in outcomes], dtype=np.float64)
        terms_total = sum(term_values.values(), np.zeros(n))
        totals = scorer_scores + terms_total
        # Built on the responses' device, so a batch on the GPU gets its scores there too.
        scores = torch.tensor(totals, dtype=torch.float32).to(responses.device)
        valid = mask.bool().to(responses.device)
        has_tokens = valid.any(-1)
        positions = torch.arange(valid.shape[-1], device=valid.device).expand_as(valid)
        last = torch.where(valid, positions, -1).max(-1).values
        rows = torch.nonzero(has_tokens).squeeze(-1)
        if token_level is None:
            token_level_scores = torch.zeros(responses.shape, dtype=torch.float32, device=responses.device)
            token_level_scores[rows, last[rows]] = scores[rows]
        else:
            token_level_scores = token_level.to(device=responses.device, dtype=torch.float32).clone()
            added = torch.tensor(terms_total, dtype=torch.float32).to(responses.device)
            token_level_scores[rows, last[rows]] += added[rows]

        errors = [o.error or "" for o in outcomes]
        extra: dict[str, np.ndarray] = {"scorer_score": scorer_scores, **term_values}
        extra["error"] = np.array(errors, dtype=object)
        extra.update(self._field_columns(outcomes, taken=set(extra)))

        first_error = next(
            (f"sample {i} (data_source '{data_sources[i]}'): {e}" for i, e in enumerate(errors) if e), None
        )
        n_timeouts = sum(o.timed_out for o in outcomes)
        n_errors = sum(1 for o in outcomes if o.error is not None) - n_timeouts
        if first_error is not None:
            self.first_error = self.first_error or first_error
            logger.warning(
                "reward: %d scorer error(s) and %d timeout(s) in %d samples (scored 0); first: %s",
                n_errors,
                n_timeouts,
                n,
                first_error,
            )
        metrics = {
            "reward/score_mean": float(totals.mean()) if n else 0.0,
            "reward/error_count": float(n_errors),
            "reward/timeout_count": float(n_timeouts),
            "reward/empty_response_count": float(n - int(has_tokens.sum())),
        }
        sources = np.array(data_sources, dtype=object)
        for source in sorted(set(data_sources)):
            metrics[f"reward/score_mean/{source}"] = float(totals[sources == source].mean())
        for name, values in term_values.items():
            metrics[f"reward/{name}_mean"] = float(values.mean()) if n else 0.0
        return RewardResult(token_level_scores, scores, extra, metrics, first_error)

    @staticmethod
    def _field_columns(outcomes: list[Outcome], taken: set[str]) -> dict[str, np.ndarray]:
        """One column per field any scorer returned: float (NaN where missing) if all numbers, else object."""
        keys = sorted({k for o in outcomes for k in o.fields})
        columns = {}
        for key in keys:
            values = [o.fields.get(key) for o in outcomes]
            present = [v for v in values if v is not None]
            numeric = all(isinstance(v, bool | int | float) for v in present)
            name = key if key not in taken else f"scorer_{key}"
            if numeric:
                columns[name] = np.array(
                    [np.nan if v is None else float(v) for v in values], dtype=np.float64
                )
            else:
                columns[name] = np.empty(len(values), dtype=object)
                columns[name][:] = values
        return columns

    # --- lifetime --------------------------------------------------------------------------------

    @property
    def worker_pids(self) -> list[int | None]:
        """Process ids of the scorer workers (None: not started yet); empty with num_workers=0."""
        return self._pool.pids if self._pool is not None else []

    def close(self) -> None:
        """Stop the worker processes (also done at garbage collection and interpreter exit)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> RewardManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def reward_components(result: RewardResult, keys: Sequence[str], data_sources: Sequence[str]) -> np.ndarray:
    """[N, K] float64: each sample's value of every named reward term, for gdpo (algorithm.gdpo_reward_keys).

    A key names a column of `result.extra`: a field of the scorer's dict ({"score": 1.0, "correct": 1.0,
    "format": 0.5}), a reward term (format, overlong) or scorer_score. There is no gdpo reward manager as
    in verl: this manager already keeps every field the scorer returns. A sample whose scorer failed
    (error or timeout) gets 0 in every term, as its score is 0 (and is counted in reward/error_count);
    any other sample without a finite number there is an error naming the key, the sample and the fix.
    """
    failed = np.asarray(result.extra["error"], dtype=object) != ""
    fix = (
        "return every term in the scorer's dict for every sample, e.g. "
        '{"score": ..., "correct": 1.0, "format": 0.0}, or change algorithm.gdpo_reward_keys'
    )
    out = np.zeros((len(failed), len(keys)))
    for k, key in enumerate(keys):
        column = result.extra.get(key)
        if column is None:
            if failed.all():
                continue
            fields = ", ".join(sorted(c for c in result.extra if c != "error"))
            raise ValueError(
                f"algorithm.gdpo_reward_keys names '{key}', but no sample's scorer returned a field '{key}' "
                f"(the per-sample fields are: {fields}); {fix}"
            )
        for i in np.flatnonzero(~failed):
            problem = _term_problem(column[i])
            if problem is not None:
                raise ValueError(
                    f"reward term '{key}' (algorithm.gdpo_reward_keys) of sample {i} (data_source "
                    f"'{data_sources[i]}') {problem}; {fix}"
                )
            out[i, k] = float(column[i])
    return out


def _term_problem(value: Any) -> str | None:
    """None for a usable number (bools count as 0 / 1), else what is wrong with `value`."""
    if value is None:
        return "is missing"
    if isinstance(value, bool | np.bool_):
        return None
    if not isinstance(value, int | float | np.number):
        return f"is {value!r}, not a number"
    if math.isnan(value):  # a numeric column holds NaN where a scorer left the field out
        return "is missing or NaN"
    return None if math.isfinite(value) else f"is {value}, not a finite number"
