"""A sampler class of the user's (verl's data.sampler.class_path / class_name): the order of the training prompts,
and, with an `update(batch)` method, a curriculum that reorders what comes next from each step's rewards.

The class, named by data.sampler_file (a .py file, or verl's `pkg://package.module`) and data.sampler_class,
is built once, before any worker starts, as verl builds it::

    cls(data_source=dataset, data_config=config)

- `data_source`: the training prompts (`len`, `[i]`): item i is the row dict of dataset index i, with
  `raw_prompt` (the chat messages), `data_source`, `ground_truth`, `extra_info`, `index` (extra_info.index,
  else the row's position) and `input_ids` (the rendered prompt's token ids).
- `data_config`: the data section as a read-only OmegaConf mapping (train_batch_size, shuffle, seed, ...,
  Tandem's names, verl's where they agree), with verl's `sampler.class_path` / `sampler.class_name`.

It has `__iter__`, yielding dataset indices (ints in [0, len(data_source))), one epoch per call, and
`__len__`, how many indices an epoch yields. Tandem cuts an epoch into batches of the step's prompts
(data.train_batch_size; with dynamic sampling, algorithm.dynamic_sampling.gen_batch_size a round) and, as
verl's dataloader with drop_last, leaves out an incomplete last batch: an epoch is len // batch batches.
Where the class has `set_epoch(epoch)` (as torch's DistributedSampler), Tandem calls it before each epoch's
`iter()` (0, 1, ...), and not when a resumed run goes on with an epoch begun before the checkpoint.

**A curriculum** has `update(batch)`: after each training step Tandem calls it with a `SamplerBatch` (below),
and takes a step's prompts from the iterator only when that step starts, one batch at a time, so the
iterator can read what update() changed. Keep the epoch's order in the object: set_epoch fills a queue,
`__iter__` pops from it, update() reorders what is left.
verl asks for data.dataloader_num_workers=0 for the same reason; Tandem reads no rows ahead at any value.
trainer.async_mode=one_step_off and streaming draw a step's prompts before the previous step trains, so
they refuse a curriculum (a sampler without update() runs in every mode).

**Resume.** A checkpoint records the epoch, how many of its batches were drawn, and, where the class has
`state_dict()` / `load_state_dict(state)`, its state after the step's update(). A resumed run builds the
class afresh and then:

- with `load_state_dict`: gives it the saved state and calls `iter()` for the rest of the epoch in progress
  (no set_epoch): the state says where the sampler is in its epoch (the queue above; torchdata's stateful
  samplers do the same), Tandem skips nothing. Keep plain values in it (lists, dicts, numbers, tensors): it is
  pickled into the checkpoint.
- without: replays it: iterates each finished epoch as far as the run did and skips the indices already
  drawn in the epoch in progress. Exact for a sampler whose order follows from its construction and the
  epochs (seeded with its own generator, not the global one); what a curriculum's update() learned is lost
  (a warning).

Where this differs from verl, and why: verl's update() gets its whole DataProto; Tandem's gets a
`SamplerBatch`, the step's per-sample results on the CPU plus each sample's dataset index, which verl's
batch lacks (a curriculum there maps `index` back to rows itself). verl refuses a curriculum only with
dataloader workers; Tandem refuses it where a step's prompts are drawn before the previous update.
"""

from __future__ import annotations

import copy
import inspect
import logging
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from tandem.batch import Batch
from tandem.data.rows import DataError
from tandem.usercode import PKG_PREFIX, defined_at, describe_load_error, load_user_class

logger = logging.getLogger(__name__)

FILE_KEY = "data.sampler_file"
CLASS_KEY = "data.sampler_class"
DATASET_INDEX = "dataset_index"  # a sample's row of the training data, the index the sampler yielded
STATE_KIND = "user_sampler"  # marks a checkpoint's data order as this module's


@dataclass(frozen=True)
class SamplerBatch:
    """What a curriculum sampler's `update(batch)` gets after each training step: the step's N trained samples
    (its prompts x rollout.n, the samples of a prompt next to each other; with dynamic sampling the kept
    groups only, as trained), every tensor on the CPU.

    - `step`: the training step (1, 2, ...).
    - `dataset_indices`: int64 [N], each sample's row of `data_source`, the index the sampler yielded.
    - `scores`: float [N], `token_level_scores` summed: the reward function's score with the reward terms
      (overlong, format) and the reward model's, before any KL penalty (the dumps' `score`).
    - `rewards`: float [N], `token_level_rewards` summed: the scores less the in-reward KL penalty
      (algorithm.use_kl_in_reward); without one, the scores.
    - `acc`: float [N], the scorer's `acc` where it returns one, else its score.
    - `batch`: the [N, response length] tensors under verl's DataProto names: `token_level_scores`,
      `token_level_rewards`, `advantages`, `response_mask`.
    - `non_tensor_batch`: each per-sample field of the step's batch as a numpy object array [N]: the prompt
      row's `raw_prompt`, `data_source`, `ground_truth`, `extra_info`, `index` (and `agent_name`,
      `multi_modal_data` where rows have them), the prompt's `uid`, and `reward_extra_info` (a dict per
      sample: the terms the reward function returned).

    verl's DataProto carries every tensor of the step (ids, log-probs, values) on the device; this carries the
    results a curriculum reads, copied once, and the dataset indices DataProto lacks.
    """

    step: int
    dataset_indices: np.ndarray
    scores: torch.Tensor
    rewards: torch.Tensor
    acc: torch.Tensor
    batch: dict[str, torch.Tensor]
    non_tensor_batch: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.dataset_indices)


BATCH_KEYS = ("token_level_scores", "token_level_rewards", "advantages", "response_mask")
NON_TENSOR_RENAMES = {"reward_extra": "reward_extra_info"}  # trainer/dumps.py REWARD_EXTRA_KEY -> verl's name


def sampler_batch(step: int, batch: Batch) -> SamplerBatch:
    """The `SamplerBatch` of a trained step's batch (after the advantages)."""
    tensors = {key: batch[key].detach().cpu() for key in BATCH_KEYS if key in batch}
    rewards = tensors.get("token_level_rewards", tensors["token_level_scores"])
    return SamplerBatch(
        step=step,
        dataset_indices=batch[DATASET_INDEX].detach().cpu().numpy().astype(np.int64),
        scores=tensors["token_level_scores"].sum(-1),
        rewards=rewards.sum(-1),
        acc=batch["acc"].detach().cpu().float(),
        batch=tensors,
        non_tensor_batch={NON_TENSOR_RENAMES.get(k, k): v for k, v in batch.non_tensors.items()},
    )


def sampler_config(data: Any) -> Any:
    """The `data_config` a user's sampler gets: the data section as a read-only OmegaConf mapping, with verl's
    `sampler.class_path` / `sampler.class_name`."""
    from omegaconf import OmegaConf

    values = asdict(data)
    values["sampler"] = {"class_path": data.sampler_file, "class_name": data.sampler_class}
    config = OmegaConf.create(values)
    OmegaConf.set_readonly(config, True)
    return config


class UserSampler:
    """The user's sampler as Tandem's batch sampler: `iter()` yields lists of `batch_size` dataset indices,
    taken from the user's iterator only as each batch is asked for; `state_dict()` / `load_state_dict()` as
    the module docstring says. `epoch` and `position` (batches drawn in it) as in `StatefulSampler`: after
    an epoch's last batch the state is (epoch + 1, 0) at once."""

    def __init__(self, path: str, name: str, data_source: Any, data_config: Any, batch_size: int) -> None:
        self.path, self.name = path, name
        self.where = f"{CLASS_KEY}='{name}' in {FILE_KEY}='{path}'"
        try:
            cls = load_user_class(
                path, name, where=self.where, setting=FILE_KEY, prefix="tandem_user_sampler_"
            )
        except (ImportError, TypeError, OSError) as error:
            raise DataError(str(error)) from error
        self._real = "" if path.startswith(PKG_PREFIX) else _source_file(cls)
        self._build = lambda: cls(data_source=data_source, data_config=data_config)
        self.num_items = len(data_source)
        self.batch_size = batch_size
        self.sampler = self._call("building it", self._build, f"{name}(data_source, data_config)")
        missing = [m for m in ("__iter__", "__len__") if not callable(getattr(self.sampler, m, None))]
        if missing:
            raise DataError(
                f"{self.where}: class '{name}'{defined_at(cls)} has no {' or '.join(missing)}; a sampler yields "
                "dataset indices, one epoch per iter(), and says how many an epoch yields (__len__)"
            )
        self.is_curriculum = callable(getattr(self.sampler, "update", None))
        self.stateful = all(
            callable(getattr(self.sampler, m, None)) for m in ("state_dict", "load_state_dict")
        )
        per_epoch = self._call("len()", lambda: len(self.sampler))
        if per_epoch < batch_size:
            raise DataError(
                f"{self.where}: an epoch of it yields {per_epoch} indices (its __len__), fewer than one batch of "
                f"{batch_size} prompts; lower data.train_batch_size or let it yield more"
            )
        self.batches_per_epoch = per_epoch // batch_size
        self.epoch = 0
        self.position = 0
        self._indices: Iterator[Any] | None = None  # the user's iterator over the epoch in progress

    def __len__(self) -> int:
        """Batches per epoch."""
        return self.batches_per_epoch

    def __iter__(self) -> Iterator[list[int]]:
        while self.position < self.batches_per_epoch:
            if self._indices is None:
                self._indices = self._start(self.epoch, new_epoch=self.position == 0)
            batch = self._take(self.batch_size)
            if len(batch) < self.batch_size:  # its iterator ended early: the epoch ends here
                if self.position == 0:
                    raise DataError(
                        f"{self.where}: an epoch of it yielded {len(batch)} indices, fewer than one batch of "
                        f"{self.batch_size} (its __len__ said {len(self.sampler)})"
                    )
                self._next_epoch()
                return
            self.position += 1
            if self.position == self.batches_per_epoch:
                self._next_epoch()
                yield batch
                return
            yield batch

    def _start(self, epoch: int, *, new_epoch: bool) -> Iterator[Any]:
        """The user's iterator over `epoch`: set_epoch(epoch) first where the class has it and the epoch starts
        (not when a resumed run goes on with one), as torch's DistributedSampler gets it."""
        if new_epoch and callable(getattr(self.sampler, "set_epoch", None)):
            self._call("set_epoch(epoch)", lambda: self.sampler.set_epoch(epoch))
        return self._call("iter()", lambda: iter(self.sampler))

    def _next_epoch(self) -> None:
        self.epoch, self.position, self._indices = self.epoch + 1, 0, None

    def _take(self, count: int) -> list[int]:
        """Up to `count` indices from the epoch's iterator, each checked to be a row of the data."""
        assert self._indices is not None
        out: list[int] = []
        for _ in range(count):
            value = self._call("its iterator", lambda: next(self._indices, _END))
            if value is _END:
                break
            index = int(value) if isinstance(value, (int, np.integer)) or _is_int_tensor(value) else None
            if index is None or not 0 <= index < self.num_items:
                raise DataError(
                    f"{self.where}: its iterator yielded {value!r}; a sampler yields dataset indices, ints in "
                    f"[0, {self.num_items})"
                )
            out.append(index)
        return out

    def update(self, batch: SamplerBatch) -> None:
        """The user's update(batch), after a training step (a curriculum only)."""
        self._call("update(batch)", lambda: self.sampler.update(batch))

    # ---- checkpoints ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The data order now: epoch, batches drawn in it and (a copy of) the user's state_dict()."""
        user = copy.deepcopy(self._call("state_dict()", self.sampler.state_dict)) if self.stateful else None
        return {
            "kind": STATE_KIND,
            "class": self.name,
            "batch_size": self.batch_size,
            "epoch": self.epoch,
            "position": self.position,
            "user_state": user,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where `state` was saved, on a sampler built afresh (see the module docstring)."""
        if state.get("kind") != STATE_KIND:
            raise DataError(
                f"cannot resume with {self.where}: the checkpoint's data order was saved by Tandem's own sampler "
                f"(data.shuffle, data.seed); resume without {CLASS_KEY}, or start without resuming"
            )
        for key, now in (("class", self.name), ("batch_size", self.batch_size)):
            if state[key] != now:
                raise DataError(
                    f"cannot resume with {self.where}: the checkpoint's sampler had {key}={state[key]!r}, now "
                    f"{now!r}; restore it, or start without resuming"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        self.sampler = self._call("building it", self._build)
        self.epoch, self.position, self._indices = epoch, position, None
        if self.stateful and state["user_state"] is not None:
            self._call("load_state_dict(state)", lambda: self.sampler.load_state_dict(state["user_state"]))
            return
        if self.is_curriculum:
            logger.warning(
                "%s has update() but no state_dict() / load_state_dict(): the resumed run replays its order "
                "from a fresh instance, without what update() learned before the checkpoint",
                self.where,
            )
        wanted = self.batches_per_epoch * self.batch_size
        for finished in range(epoch):  # each finished epoch as far as the run took it
            self._indices = self._start(finished, new_epoch=True)
            self._take(wanted)
        self._indices = self._start(epoch, new_epoch=True) if position else None
        if position:
            self._take(position * self.batch_size)

    def _call(self, what: str, fn: Any, how: str = "") -> Any:
        """fn(), its failure a DataError naming the class, its file and the line that raised."""
        try:
            return fn()
        except DataError:
            raise
        except Exception as error:
            called = f" (called as {how})" if how else ""
            raise DataError(
                f"{self.where}: {what} failed{called}: {describe_load_error(error, self._real)}"
            ) from error


_END = object()  # the end of the user's iterator


def _is_int_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point()


def _source_file(cls: type) -> str:
    """The real path of the file that defines `cls` ('' where Python cannot tell)."""
    try:
        return os.path.realpath(inspect.getsourcefile(cls) or "")
    except TypeError:
        return ""
