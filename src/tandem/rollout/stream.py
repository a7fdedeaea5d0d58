"""Streaming generation (trainer.async_mode=streaming): the rollout pool never waits for the trainer.

A `RolloutStream` runs an asyncio loop in a thread of its own inside the rollout worker, with the
agent loop's samples on the worker's vLLM engine (`VLLMTurnEngine`: continuous batching). `submit`
starts one task per prompt group (its n samples, each a coroutine of the agent loop) and returns at
once; groups finish in any order, so a group whose samples run to the token budget does not hold up
the groups behind it, and wait in the stream until `collect` hands them to the controller.

A weight update drains the engine: turns that have not started wait, the turns in flight finish
with the weights they started with, then the new weights load and the waiting turns go. So every
turn is sampled by one version of the weights (its tokens' rollout log-probs are that policy's), and
each group records, per sample, the oldest and newest version its turns used (`weight_version`,
`weight_version_max`; they differ only for a multi-turn trajectory that spans an update). The
controller numbers versions by actor updates and drops groups that are too old (trainer/streaming.py).

Every call into vLLM happens on the stream's thread: the engine steps there, weights load there
(between steps, once the engine is idle), and validation generates there too (`generate`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import torch

from tandem.batch import Batch
from tandem.rollout.async_engine import TurnEngine, TurnOutput, TurnRequest
from tandem.rollout.base import METRICS_KEY, SamplingParams, check_prompts

VERSION_KEY = "weight_version"  # per sample: the oldest weight version among its turns
VERSION_MAX_KEY = "weight_version_max"  # ... and the newest


class RolloutStream:
    """Prompt groups generated continuously on ``engine`` by ``agent`` (a `tandem.rollout.agent.AgentLoop`)."""

    def __init__(self, agent: Any, engine: TurnEngine) -> None:
        self.agent = agent
        self._engine = engine
        self._admit = asyncio.Event()  # set: turns may start (it binds to the loop that first waits on it)
        self._admit.set()
        self.version = 0
        self._lock = threading.Condition()
        self._ready: list[Batch] = []
        self._errors: list[BaseException] = []
        self._groups_in_flight = 0
        self._turns_in_flight = 0
        self._idle_since: float | None = time.perf_counter()
        self._idle_s = 0.0  # seconds with no turn in the engine, since the last `collect`
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rollout-stream", daemon=True)
        self._thread.start()

    # ---- the controller's side (called from the worker's thread) ----------------------------------

    def submit(self, prompts: Batch, sampling: SamplingParams) -> int:
        """Start generating ``sampling.n`` samples of each prompt; returns at once with the number of groups."""
        prompt_ids, prompt_mask = check_prompts(prompts, "RolloutStream")
        rows = self.agent.rows(prompts, prompt_ids, prompt_mask, sampling)
        with self._lock:
            self._groups_in_flight += len(rows)
        for row, (ids, messages, sample, seeds) in enumerate(rows):
            one = prompts.slice(row, row + 1)
            group = self._group(
                one,
                prompt_ids[row : row + 1],
                prompt_mask[row : row + 1],
                ids,
                messages,
                sample,
                seeds,
                sampling,
            )
            asyncio.run_coroutine_threadsafe(group, self._loop)
        return len(rows)

    def collect(self, min_groups: int, timeout_s: float) -> tuple[list[Batch], dict[str, float]]:
        """The finished groups, after waiting up to ``timeout_s`` for at least ``min_groups`` (fewer when
        fewer are in flight), and the stream's numbers: groups still in flight, engine idle seconds."""
        with self._lock:
            self._lock.wait_for(
                lambda: (
                    self._errors
                    or len(self._ready) >= min(min_groups, len(self._ready) + self._groups_in_flight)
                ),
                timeout=timeout_s,
            )
            if self._errors:
                raise RuntimeError(
                    f"a prompt group failed in the rollout stream: {self._errors[0]!r}"
                ) from self._errors[0]
            out, self._ready = self._ready, []
            now = time.perf_counter()
            idle = self._idle_s + (now - self._idle_since if self._idle_since is not None else 0.0)
            self._idle_s = 0.0
            if self._idle_since is not None:
                self._idle_since = now
            return out, {"groups_in_flight": float(self._groups_in_flight), "idle_s": idle}

    def update_weights(self, load: Callable[[], None], version: int) -> dict[str, float]:
        """Drain the engine, run ``load()`` (which puts the new weights into it) and mark them ``version``."""
        return self._run(self._update(load, version))

    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """A whole batch at once (validation), on the stream's engine beside the groups in flight."""
        return self._run(self.agent.generate_async(lambda: _Versioned(self), prompts, sampling))

    def close(self) -> None:
        """Stop the loop (groups in flight are abandoned)."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    # ---- the loop's side ------------------------------------------------------------------------------

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _group(
        self,
        prompt: Batch,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        ids: list[int],
        messages: list[dict[str, Any]],
        sample: dict[str, Any],
        seeds: list[int | None],
        sampling: SamplingParams,
    ) -> None:
        start = time.perf_counter()
        out: Batch | None = None
        error: BaseException | None = None
        try:
            engines = [_Versioned(self) for _ in seeds]
            samples = [
                self.agent.run_sample(e, ids, messages, sample, sampling, s)
                for e, s in zip(engines, seeds, strict=True)
            ]
            trajectories = await asyncio.gather(*samples)
            out = self.agent.assemble(
                prompt, prompt_ids, prompt_mask, trajectories, sampling, self._engine, start
            )
            out.meta.pop(METRICS_KEY, None)
            out[VERSION_KEY] = torch.tensor([min(e.versions) for e in engines], dtype=torch.long)
            out[VERSION_MAX_KEY] = torch.tensor([max(e.versions) for e in engines], dtype=torch.long)
        except BaseException as err:
            error = err
        with self._lock:
            self._groups_in_flight -= 1
            if error is not None:
                self._errors.append(error)
            else:
                self._ready.append(out)
            self._lock.notify_all()

    async def _update(self, load: Callable[[], None], version: int) -> dict[str, float]:
        start = time.perf_counter()
        self._admit.clear()
        while self._turns_in_flight:  # the engine steps them to the end meanwhile
            await asyncio.sleep(0.002)
        drained = time.perf_counter()
        try:
            load()
            self.version = version
        finally:
            self._admit.set()
        return {"drain_s": drained - start, "load_s": time.perf_counter() - drained}

    def _turn_started(self) -> None:
        if self._turns_in_flight == 0 and self._idle_since is not None:
            with self._lock:
                self._idle_s += time.perf_counter() - self._idle_since
                self._idle_since = None
        self._turns_in_flight += 1

    def _turn_ended(self) -> None:
        self._turns_in_flight -= 1
        if self._turns_in_flight == 0:
            with self._lock:
                self._idle_since = time.perf_counter()


class _Versioned(TurnEngine):
    """One sample's view of the stream's engine: waits while a weight update drains the engine and
    records the weight version of each of its turns."""

    def __init__(self, stream: RolloutStream) -> None:
        self.stream = stream
        self.versions: list[int] = []

    async def generate(self, request: TurnRequest) -> TurnOutput:
        stream = self.stream
        await stream._admit.wait()
        self.versions.append(stream.version)  # no await between the wait and here: no update can slip in
        stream._turn_started()
        try:
            return await stream._engine.generate(request)
        finally:
            stream._turn_ended()
