"""Sample dumps: what the model wrote, one JSON line per sample (the fields: `run_folder.SAMPLE_FIELDS`;
docs/run-folder.md says what each holds).

    trainer.rollout_data_dir      <dir>/<step>.jsonl: each training step's samples, with their advantage
                                  and the rollout-vs-trainer log-prob mismatch
    trainer.validation_data_dir   <dir>/<step>.jsonl: each validation pass's samples (0 = before training)
    trainer.log_val_generations   the first sample of the first N validation prompts, for the trackers

A step's rows are built and written by one background thread (texts decoded there, with a copy of the
tokenizer), each file whole (temp file + rename); the step itself only copies the columns it needs
(`timing_s/dump`). A write that fails (disk full, permission) leaves no half file: the first failure in a
folder is one warning naming the file, later ones in that folder are counted and summed up in one more warning
when the run ends; training goes on.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import numbers
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tandem.batch import Batch
from tandem.config.errors import ConfigError
from tandem.config.schema import TandemConfig
from tandem.data.padding import concat_left_padded
from tandem.rollout import PROMPT_INDEX
from tandem.rollout.agent import AGENT_FINISH_KEY, TRAJECTORY_KEY
from tandem.rollout.base import read_special_ids
from tandem.run_folder import DUMP_KINDS, SAMPLE_FIELDS, dump_file, dump_steps

logger = logging.getLogger(__name__)

REWARD_EXTRA_KEY = "reward_extra"  # per-sample dict of the reward terms and scorer fields (Rollouts.score)
# The columns a dump reads; those a batch lacks are left out.
DUMP_KEYS = (
    "prompts",
    "responses",
    "response_mask",
    "attention_mask",
    "score",
    "advantages",
    "old_log_probs",
    "rollout_log_probs",
    "data_source",
    "ground_truth",
    "uid",
    REWARD_EXTRA_KEY,
    AGENT_FINISH_KEY,
    TRAJECTORY_KEY,
)


def sample_rows(
    batch: Batch,
    step: int,
    tokenizer: Any,
    *,
    max_response_length: int,
    trainer_log_probs: bool,
    samples: list[int] | None = None,
    stop_ids: frozenset[int] = frozenset(),
) -> list[dict[str, Any]]:
    """One dict per sample of `batch` (or of its rows `samples`), in order, with the dump's fields.

    Args:
        batch: a scored rollout batch (training: with `advantages`; validation: without).
        step: the global step written in every row.
        tokenizer: decodes the prompt and response tokens (special tokens kept).
        max_response_length: a response this long (trajectory tokens) is truncated.
        trainer_log_probs: `old_log_probs` are the trainer's own, so the rollout mismatch is defined
            (False in rollout_correction.bypass_mode, where they are the rollout's).
        stop_ids: the ids a response ends with when the model stopped: one that ends with one exactly at
            max_response_length finished ("stop"), it was not cut ("length").
    """
    rows_of = list(range(len(batch))) if samples is None else samples
    width = batch["prompts"].shape[1]
    prompt_mask = batch["attention_mask"][:, :width].bool()
    trajectory_mask = batch["attention_mask"][:, width:].bool()
    response_mask = batch["response_mask"].bool()
    prompt_ids = [batch["prompts"][i][prompt_mask[i]].tolist() for i in rows_of]
    response_ids = [batch["responses"][i][trajectory_mask[i]].tolist() for i in rows_of]
    inputs = tokenizer.batch_decode(prompt_ids, skip_special_tokens=False)
    outputs = tokenizer.batch_decode(response_ids, skip_special_tokens=False)
    mismatch = None
    if trainer_log_probs and "old_log_probs" in batch and "rollout_log_probs" in batch:
        mismatch = (batch["rollout_log_probs"] - batch["old_log_probs"]).float() * response_mask
        flat = [[token] for ids in response_ids for token in ids]
        pieces = iter(tokenizer.batch_decode(flat, skip_special_tokens=False))
    rows = []
    for k, i in enumerate(rows_of):
        n_tokens = int(response_mask[i].sum())
        trajectory_length = len(response_ids[k])
        row: dict[str, Any] = {
            "input": inputs[k],
            "output": outputs[k],
            "gts": _plain(batch["ground_truth"][i]) if "ground_truth" in batch else None,
            "score": float(batch["score"][i]),
            "step": step,
        }
        extra = batch[REWARD_EXTRA_KEY][i] if REWARD_EXTRA_KEY in batch else {}
        terms = {name: _plain(value) for name, value in extra.items() if name not in SAMPLE_FIELDS}
        row.update(terms)
        row["reward_keys"] = list(terms)
        stopped = bool(response_ids[k]) and response_ids[k][-1] in stop_ids
        cut = trajectory_length >= max_response_length and not stopped
        finish = "length" if cut else "stop"
        if AGENT_FINISH_KEY in batch:
            finish = str(batch[AGENT_FINISH_KEY][i])
        row.update(
            data_source=str(batch["data_source"][i]) if "data_source" in batch else None,
            uid=str(batch["uid"][i]) if "uid" in batch else None,
            sample=i,
            prompt_length=len(prompt_ids[k]),
            response_length=n_tokens,
            finish_reason=finish,
            truncated=cut or finish in ("length", "budget"),
            advantage=None,
            rollout_mismatch=None,
        )
        if "advantages" in batch:
            advantages = batch["advantages"][i][response_mask[i]]
            row["advantage"] = float(advantages.double().mean()) if n_tokens else 0.0
        if mismatch is not None:
            diff = mismatch[i][trajectory_mask[i]]
            row["rollout_mismatch"] = float(diff.double().abs().sum() / n_tokens) if n_tokens else 0.0
            row["tokens"] = [next(pieces) for _ in range(trajectory_length)]
            row["token_mismatch"] = [round(d, 4) + 0.0 for d in diff.tolist()]  # + 0.0: no -0.0
        if TRAJECTORY_KEY in batch:
            trajectory = batch[TRAJECTORY_KEY][i]
            row["num_turns"] = int(trajectory.get("num_turns", 0))
            row["turns"] = turns_of(trajectory)
        error = extra.get("reward_error")
        if error:
            row["reward_error"] = str(error)
        rows.append(row)
    return rows


def turns_of(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation after the prompt (rollout/agent.py's messages): the model's turns with their tool
    calls, the tools' observations with their error (None when the call worked), the interaction's replies."""
    errors = iter(trajectory.get("tool_call_errors") or [])
    turns = []
    for message in trajectory.get("messages", [])[int(trajectory.get("num_prompt_messages", 0)) :]:
        role = str(message.get("role", ""))
        turn: dict[str, Any] = {"role": role, "text": str(message.get("content", ""))}
        if role == "assistant":
            calls = [entry.get("function", entry) for entry in message.get("tool_calls") or []]
            turn["tool_calls"] = [
                {"name": str(c.get("name", "")), "arguments": _as_text(c.get("arguments", ""))} for c in calls
            ]
        elif role == "tool":
            error = next(errors, None)
            turn["error"] = None if error is None else str(error)
            turn["timed_out"] = error == "timeout"
        turns.append(turn)
    return turns


def first_samples(batch: Batch, prompts: int) -> list[int]:
    """The rows of the first sample of each of the first `prompts` validation prompts (PROMPT_INDEX:
    the prompt's row in the validation data), in prompt order."""
    if prompts <= 0 or PROMPT_INDEX not in batch:
        return []
    chosen: dict[int, int] = {}
    for i, index in enumerate(batch[PROMPT_INDEX].tolist()):
        if index < prompts and index not in chosen:
            chosen[index] = i
    return [chosen[index] for index in sorted(chosen)]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """`rows` as one JSON line each, written whole: a temp file renamed over `path`."""
    temp = path.with_name(f".{path.name}.tmp")
    try:
        with temp.open("w", encoding="utf-8") as file:
            for row in rows:
                file.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def drop_steps_after(folder: Path, step: int) -> list[Path]:
    """Delete the dump files of steps after `step` in `folder` (a resumed run writes them again)."""
    removed = []
    if folder.is_dir():
        for later in (s for s in dump_steps(folder) if s > step):
            path = dump_file(folder, later)
            path.unlink()
            removed.append(path)
    return removed


class DumpWriter:
    """One background thread that runs write jobs in order; `close` waits for them."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], None]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tandem-dumps", daemon=True)
            self._thread.start()
        self._jobs.put(job)

    def close(self) -> None:
        """Run the jobs still queued, then stop the thread."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        if sys.platform == "linux":  # a Linux thread has a nice value of its own: the lowest, so that the
            # dump's decoding waits for the cores rather than taking them from the workers beside it
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while (job := self._jobs.get()) is not None:
            job()


def stop_ids_of(cfg: TandemConfig, tokenizer: Any) -> frozenset[int]:
    """The ids the rollout stops at (rollout/base.py's read_special_ids) where the actor's folder is a
    Hugging Face model folder, else the tokenizer's end-of-sequence id."""
    if cfg.actor.model_path and (Path(cfg.actor.model_path) / "config.json").is_file():
        return frozenset(read_special_ids(cfg.actor.model_path, cfg.actor.tokenizer_path, tokenizer)[0])
    eos = getattr(tokenizer, "eos_token_id", None)
    return frozenset() if eos is None else frozenset([int(eos)])


class SampleDumps:
    """The run's dumps, from trainer.rollout_data_dir, validation_data_dir and log_val_generations."""

    def __init__(self, cfg: TandemConfig, tokenizer: Any) -> None:
        t = cfg.trainer
        if t.log_val_generations < 0:
            raise ConfigError(f"trainer.log_val_generations={t.log_val_generations}: use 0 (none) or more")
        # absolute, so config.yaml in the run folder says where they are (`tandem view` reads it)
        for key in DUMP_KINDS.values():
            if getattr(t, key):
                setattr(t, key, str(Path(getattr(t, key)).expanduser().resolve()))
        self.train_dir = Path(t.rollout_data_dir) if t.rollout_data_dir else None
        self.val_dir = Path(t.validation_data_dir) if t.validation_data_dir else None
        self.val_generations = t.log_val_generations
        self.max_response_length = cfg.data.max_response_length
        self.trainer_log_probs = not cfg.algorithm.rollout_correction.bypass_mode
        self._tokenizer = tokenizer
        self.stop_ids = stop_ids_of(cfg, tokenizer)
        self._writer_tokenizer: Any = None  # a copy: the step's own decoding and the writer's never share one
        self._writer = DumpWriter()
        self._failed: dict[Path, int] = {}  # folder -> dumps that could not be written (the writer thread's)

        self._generations: list[dict[str, Any]] = []

    @property
    def wants_validation(self) -> bool:
        """A validation pass has something to give: its dump or the trackers' generations."""
        return self.val_dir is not None or self.val_generations > 0

    def take_generations(self) -> list[dict[str, Any]]:
        """The last validation pass's rows for the trackers (once; [] when none)."""
        rows, self._generations = self._generations, []
        return rows

    def resume(self, step: int) -> None:
        """A run resumed from the checkpoint of `step`: the dumps of later steps go (they are written again)."""
        for folder in (self.train_dir, self.val_dir):
            if folder is not None:
                drop_steps_after(folder, step)

    def train(self, step: int, batch: Batch) -> dict[str, float]:
        """Queue step `step`'s samples for <rollout_data_dir>/<step>.jsonl; `timing_s/dump`: the step's part."""
        if self.train_dir is None:
            return {}
        start = time.perf_counter()
        self._queue(self.train_dir, step, _snapshot(batch), self.trainer_log_probs)
        return {"timing_s/dump": time.perf_counter() - start}

    def validation(self, step: int, batches: list[Batch]) -> dict[str, float]:
        """Queue a validation pass's samples (its scored batches, in order) for
        <validation_data_dir>/<step>.jsonl, and keep the rows of the first log_val_generations prompts
        (first sample each) for the trackers (`take_generations`). `timing_s/dump_val`: the pass's part."""
        start = time.perf_counter()
        batch = concat_left_padded([_snapshot(b) for b in batches], pad_id=0)  # pads are masked
        if self.val_dir is not None:
            self._queue(self.val_dir, step, batch, False)
        if rows := first_samples(batch, self.val_generations):
            self._generations = self._decode_generations(batch, step, rows)
        return {"timing_s/dump_val": time.perf_counter() - start}

    def _decode_generations(self, batch: Batch, step: int, rows: list[int]) -> list[dict[str, Any]]:
        return sample_rows(
            batch,
            step,
            self._tokenizer,
            max_response_length=self.max_response_length,
            trainer_log_probs=False,
            samples=rows,
            stop_ids=self.stop_ids,
        )

    def close(self) -> None:
        """Wait for the queued dumps; say how many more could not be written than the first warning said."""
        self._writer.close()
        for folder, count in self._failed.items():
            if count > 1:
                logger.warning(
                    "%d more sample dumps in %s could not be written (see the first warning)",
                    count - 1,
                    folder,
                )
        self._failed.clear()

    def _queue(self, folder: Path, step: int, batch: Batch, trainer_log_probs: bool) -> None:
        if self._writer_tokenizer is None:
            self._writer_tokenizer = copy.deepcopy(self._tokenizer)
        tokenizer, max_length, stop_ids = self._writer_tokenizer, self.max_response_length, self.stop_ids

        def job() -> None:
            path = dump_file(folder, step)
            try:
                rows = sample_rows(
                    batch,
                    step,
                    tokenizer,
                    max_response_length=max_length,
                    trainer_log_probs=trainer_log_probs,
                    stop_ids=stop_ids,
                )
                folder.mkdir(parents=True, exist_ok=True)
                write_jsonl(path, rows)
            except (
                Exception
            ) as err:  # a dump is never worth a run: say which file (once per folder) and go on
                self._failed[folder] = self._failed.get(folder, 0) + 1
                if self._failed[folder] == 1:
                    logger.warning(
                        "could not write the sample dump %s (%s: %s); training goes on, and later dumps in this "
                        "folder that fail are counted, not logged",
                        path,
                        type(err).__name__,
                        err,
                    )

        self._writer.submit(job)


def _snapshot(batch: Batch) -> Batch:
    """The columns a dump reads, tensors copied: the writer reads them while the next step runs."""
    keys = [key for key in DUMP_KEYS if key in batch]
    if PROMPT_INDEX in batch:
        keys.append(PROMPT_INDEX)
    part = batch.select(*keys, meta=False)
    for key in keys:
        if isinstance(part[key], torch.Tensor):
            part[key] = part[key].detach().cpu().clone()
    return part


def _plain(value: Any) -> Any:
    """`value` as JSON: numpy scalars and arrays as numbers and lists, non-finite floats as None."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.ndarray | torch.Tensor):
        return _plain(value.tolist())
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return _plain(value.item())
    return str(value)


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(_plain(value), ensure_ascii=False)
