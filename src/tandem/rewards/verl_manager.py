"""A reward-manager class of your own, written against verl's interface, scoring Tandem's batches.

verl loads one with `reward_manager.source=importlib`, `reward_manager.module.path=FILE` and
`reward_manager.name=CLASS` (Tandem's reward.manager_source / manager_file / manager), builds it once as
`CLASS(tokenizer=, num_examine=0, compute_score=, reward_fn_key="data_source", **reward_model.reward_kwargs)`
and calls `manager(data, return_dict=True)` on each batch (without return_dict when that raises). `data` is
verl's DataProto; Tandem has none, and gives the class a `VerlData` holding the fields verl's managers read.
The class returns the token-level rewards [N, R] (or {"reward_tensor": ..., "reward_extra_info": {key: one value
per sample}}); Tandem's reward terms are added on each sample's last response token.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from tandem.batch import ROLLOUT_KEYS
from tandem.rewards.custom import load_function
from tandem.rewards.manager import RewardManager, RewardResult
from tandem.rewards.registry import (
    SCORERS,
    UnknownDataSourceError,
    scorer_name_for,
    unknown_data_source_message,
)
from tandem.rewards.scoring import Outcome, describe_error, plain_field, resolve
from tandem.rewards.terms import Term
from tandem.usercode import load_user_class

logger = logging.getLogger(__name__)

# the tensors of a Tandem batch a verl manager finds in data.batch: a rollout's, under verl's own names
# (attention_mask: prompt + response)
VERL_TENSORS = ROLLOUT_KEYS
# the per-sample columns it finds in data.non_tensor_batch, besides reward_model ({"ground_truth": ...})
VERL_NON_TENSORS = ("data_source", "extra_info", "uid", "index", "raw_prompt", "agent_name")


class VerlData:
    """verl's DataProto as a reward manager reads it: `batch` (a TensorDict of VERL_TENSORS), `non_tensor_batch`
    (numpy object arrays: data_source, reward_model = {"ground_truth": ...}, extra_info, uid, ...), `meta_info`,
    `len(data)`, `data[i]` (one sample: .batch, .non_tensor_batch, .meta_info), `data[a:b]` or `data[indices]`,
    and iteration over the samples. Nothing else of DataProto is here: using it is an AttributeError naming this."""

    def __init__(self, batch: TensorDict, non_tensor_batch: dict[str, np.ndarray], meta_info: dict[str, Any]):
        self.batch = batch
        self.non_tensor_batch = non_tensor_batch
        self.meta_info = meta_info

    def __len__(self) -> int:
        return int(self.batch.batch_size[0])

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, int | np.integer):
            row = {key: values[index] for key, values in self.non_tensor_batch.items()}
            return VerlItem(self.batch[int(index)], row, self.meta_info)
        if isinstance(index, slice | list | np.ndarray | torch.Tensor):
            rows = torch.arange(len(self))[index] if isinstance(index, slice) else torch.as_tensor(index)
            picked = {key: values[rows.numpy()] for key, values in self.non_tensor_batch.items()}
            return VerlData(self.batch[rows], picked, self.meta_info)
        raise TypeError(f"indexing verl's data with {type(index).__name__} is not supported")

    def __iter__(self) -> Iterator[VerlItem]:
        return (self[i] for i in range(len(self)))

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"Tandem gives a reward manager verl's data as `batch`, `non_tensor_batch`, `meta_info`, len(), [i], "
            f"[a:b] and iteration; DataProto's '{name}' is not there"
        )


class VerlItem:
    """One sample of VerlData, as verl's DataProtoItem: `batch` (a TensorDict row), `non_tensor_batch`, `meta_info`."""

    def __init__(self, batch: TensorDict, non_tensor_batch: dict[str, Any], meta_info: dict[str, Any]):
        self.batch = batch
        self.non_tensor_batch = non_tensor_batch
        self.meta_info = meta_info


def verl_data(batch: Any) -> VerlData:
    """A Tandem batch (rollout output) as VerlData: its tensors and columns under verl's names."""
    n = len(batch)
    tensors = {key: batch[key] for key in VERL_TENSORS if key in batch}
    columns = {key: _objects(batch[key]) for key in VERL_NON_TENSORS if key in batch}
    columns["reward_model"] = _objects([{"ground_truth": truth} for truth in batch["ground_truth"]])
    if (
        "extra_info" in columns
    ):  # verl's rows carry a dict; a row without one gets {} (verl's managers write to it)
        columns["extra_info"] = _objects(
            [dict(i) if isinstance(i, dict) else {} for i in columns["extra_info"]]
        )
    return VerlData(TensorDict(tensors, batch_size=[n]), columns, {})


def _objects(values: Iterable[Any]) -> np.ndarray:
    values = list(values)
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def load_manager_class(path: str, name: str) -> type:
    """Class `name` of the Python file at `path` (or of the module `pkg://package/module`), as verl loads it."""
    where = f"reward manager class '{name}' in '{path}'"
    cls = load_user_class(
        path, name, where=where, setting="reward.manager_file", prefix="tandem_reward_manager_"
    )
    if any(base.__name__ == "RewardManagerBase" for base in cls.__mro__):
        raise TypeError(
            f"{where} is one of verl's reward-loop managers (RewardManagerBase: built with verl's whole config, "
            "called per sample by run_single); Tandem runs verl's AbstractRewardManager interface, "
            "__init__(tokenizer, num_examine, compute_score, reward_fn_key, **kwargs) and __call__(data, return_dict)"
        )
    return cls


def builtin_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    **_verl_extras: Any,
) -> Any:
    """Tandem's built-in scorer for `data_source` (else the one extra_info["style"] names): the compute_score a
    reward manager class gets without reward.custom_reward_file, where verl gives its default_compute_score.
    `_verl_extras`: verl's sandbox arguments, which no Tandem scorer reads."""
    style = extra_info.get("style") if isinstance(extra_info, dict) else None
    name = scorer_name_for(data_source, style if isinstance(style, str) else None)
    if name is None:
        raise UnknownDataSourceError(unknown_data_source_message(data_source))
    return resolve(SCORERS[name])(data_source, solution_str, ground_truth, extra_info)


def _with_bound_kwargs(fn: Callable[..., Any], bound: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs), `bound` over the call's keyword arguments (verl binds custom_reward_function's so)."""
    return fn(*args, **{**kwargs, **bound})


class ManagerClassRewards(RewardManager):
    """Scores each batch with a reward-manager class of your own (verl's interface), in this process as verl's
    trainer calls it: no time limit (reward.timeout_s, reward.num_workers do not apply), and an exception stops
    the run with the class's error. Tandem's reward terms are added on the last response token."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        manager_file: str,
        manager_class: str,
        manager_kwargs: Mapping[str, Any] | None = None,
        custom_reward_file: str | os.PathLike | None = None,
        custom_reward_function: str = "compute_score",
        custom_reward_kwargs: Mapping[str, Any] | None = None,
        terms: Iterable[Term] = (),
        max_response_length: int | None = None,
    ) -> None:
        super().__init__(tokenizer, terms=terms, num_workers=0, max_response_length=max_response_length)
        cls = load_manager_class(manager_file, manager_class)
        if custom_reward_file is not None:
            fn = load_function(custom_reward_file, custom_reward_function)
            compute_score = functools.partial(_with_bound_kwargs, fn, dict(custom_reward_kwargs or {}))
        else:
            compute_score = builtin_compute_score
        self.where = f"reward manager class '{manager_class}' in '{manager_file}'"
        kwargs = dict(manager_kwargs or {})
        try:
            self.manager = cls(
                tokenizer=tokenizer,
                num_examine=0,
                compute_score=compute_score,
                reward_fn_key="data_source",
                **kwargs,
            )
        except Exception as error:
            raise TypeError(
                f"{self.where}: building it as verl does, {manager_class}(tokenizer=..., num_examine=0, "
                f"compute_score=..., reward_fn_key='data_source', **reward.manager_kwargs {sorted(kwargs)}), "
                f"failed: {describe_error(error)}"
            ) from error

    def check_data_sources(self, sources: Iterable[tuple[str, str | None]]) -> None:
        """Nothing to check: the class decides how each data_source is scored."""

    def ground_truth_problems(
        self, rows: Iterable[tuple[str, str | None, Any]]
    ) -> Iterator[tuple[int, str, str]]:
        """None: the class reads the ground truths its own way."""
        return iter(())

    def __call__(self, batch: Any) -> RewardResult:
        samples = self._read(batch)
        n = len(samples.texts)
        tensor, extra_info = self._call_manager(verl_data(batch))
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != tuple(samples.responses.shape):
            shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise TypeError(
                f"{self.where} returned rewards of shape {shape}; a reward manager returns a tensor shaped like "
                f"data.batch['responses'] {tuple(samples.responses.shape)} (or a dict holding it as 'reward_tensor')"
            )
        tensor = tensor.detach().float()
        if not torch.isfinite(tensor).all():
            rows = torch.nonzero(~torch.isfinite(tensor).all(-1)).squeeze(-1).tolist()
            raise ValueError(f"{self.where} returned non-finite rewards for samples {rows[:10]}")
        columns = {}
        for key, values in extra_info.items():
            values = list(values)
            if len(values) != n:
                raise ValueError(
                    f"{self.where}: reward_extra_info['{key}'] has {len(values)} values for {n} samples; "
                    "it needs one per sample"
                )
            columns[str(key)] = values
        totals = tensor.sum(-1).tolist()
        outcomes = [
            Outcome(totals[i], {key: plain_field(values[i]) for key, values in columns.items()})
            for i in range(n)
        ]
        return self._result(samples, outcomes, token_level=tensor)

    def _call_manager(self, data: VerlData) -> tuple[Any, Mapping[str, Any]]:
        """(reward tensor, reward_extra_info) of the class on `data`, called as verl's compute_reward calls it."""
        try:
            try:
                out = self.manager(data, return_dict=True)
            except Exception as error:  # verl calls it again without return_dict
                logger.warning(
                    "reward: %s raised with return_dict=True (%s); calling it without", self.where, error
                )
                out = self.manager(data)
        except Exception as error:
            raise RuntimeError(
                f"{self.where} raised on a batch of {len(data)}: {describe_error(error)}"
            ) from error
        if isinstance(out, Mapping):
            return out.get("reward_tensor"), out.get("reward_extra_info") or {}
        return out, {}
