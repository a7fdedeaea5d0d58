"""Worker processes that run scorers with a hard per-sample time limit.

Each worker owns a pipe: the parent sends it a chunk of samples, it scores them one by one and
sends back the chunk's outcomes in one message (one round trip per chunk, not per sample). A task
may also be one call of a batch function over several samples (scoring.BatchTask), with a time
limit of its own. Before each task the worker bumps a shared counter, so the parent knows which
one is running and since when. A task running longer than its limit gets its worker killed
(SIGKILL: works for C-level hangs too); that sample is marked timed out, the rest of the chunk
(the ones done but not yet reported, and the ones not yet started) is queued again, and a
fresh worker takes the slot. A worker that dies on its own (segfault, os._exit) is handled
the same way, with an error instead of a timeout.

Workers start with forkserver (spawn where that does not exist), never fork: the caller may
hold Ray, torch or tokenizer threads, and forking a threaded process can deadlock.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import time
import weakref
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from tandem.rewards.scoring import BatchTask, Outcome, ScorerSpec, Task, score_tasks

STARTUP_LIMIT_S = 120.0  # a worker that has not begun its first sample by then is broken
MAX_START_FAILURES = 3  # workers dying in a row before scoring anything: give up with an error


def _warm_up() -> None:
    """Import and exercise the slow parts of the built-in scorers before the clock runs."""
    try:
        from tandem.rewards.scorers.math_answer import math_score

        math_score("math", "\\boxed{1}", "1", None)
    except Exception:  # a broken optional dependency shows up as a per-sample error later
        pass


def _worker_main(conn: Connection, progress: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _warm_up()
    cache: dict[str, Any] = {}

    def on_start() -> None:
        progress.value += 1

    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the parent went away
            return
        if message is None:
            return
        specs, tasks = message
        conn.send(score_tasks(tasks, specs, cache, on_start))


class _Worker:
    def __init__(self, ctx: Any) -> None:
        self.conn, child_conn = ctx.Pipe()
        self.progress = ctx.RawValue("q", 0)  # samples started since this worker was born
        self.process = ctx.Process(
            target=_worker_main, args=(child_conn, self.progress), daemon=True, name="tandem-reward-worker"
        )
        self.process.start()
        child_conn.close()
        self.finished = 0  # samples in the chunks this worker has reported
        self.chunk: list[int] | None = None  # task positions it is scoring now
        self.seen = 0  # samples of the chunk started, as last seen by the parent
        self.seen_at = 0.0  # when the parent saw `seen` change

    def dispatch(self, chunk: list[int], tasks: list[Task | BatchTask], specs: dict[str, ScorerSpec]) -> None:
        self.chunk, self.seen, self.seen_at = chunk, 0, time.monotonic()
        with contextlib.suppress(BrokenPipeError, OSError):  # a dead worker: the poll loop notices
            self.conn.send((specs, tasks))

    def started_in_chunk(self) -> int:
        return self.progress.value - self.finished

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()

    def stop(self) -> None:
        """Ask an idle worker to exit; kill it if it does not."""
        if self.chunk is None and self.process.is_alive():
            try:
                self.conn.send(None)
                self.process.join(timeout=2)
            except (BrokenPipeError, OSError):
                pass
        self.kill()


def _stop_all(workers: list[_Worker | None]) -> None:
    for i, worker in enumerate(workers):
        if worker is not None:
            worker.stop()
            workers[i] = None


class ScorerPool:
    """`num_workers` reusable scorer processes; `run` scores tasks with a per-sample time limit."""

    def __init__(self, num_workers: int, timeout_s: float, start_method: str | None = None) -> None:
        if num_workers < 1:
            raise ValueError(f"ScorerPool needs num_workers >= 1, got {num_workers}")
        if start_method is None:
            start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        if start_method == "fork":
            raise ValueError(
                "the reward pool does not fork (unsafe with threads); use 'forkserver' or 'spawn'"
            )
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            # The fork server imports these once; each worker (and each restart after a kill) is then
            # a cheap fork of it instead of a fresh interpreter importing torch and sympy. This is
            # multiprocessing's process-wide list ("__main__" is its default); it only takes effect
            # if the fork server has not started yet.
            self._ctx.set_forkserver_preload(["__main__", "tandem.rewards.pool", "math_verify"])
        self.timeout_s = float(timeout_s)
        self._poll_s = min(0.05, self.timeout_s / 4)
        self._workers: list[_Worker | None] = [None] * num_workers
        self.restarts = 0  # workers killed or lost and replaced, over the pool's life
        self._limits: list[float] = []  # the time limit of each task of the running `run`
        self._closed = False
        # Stops the workers on close(), garbage collection or interpreter exit, whichever is first.
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)

    @property
    def pids(self) -> list[int | None]:
        return [w.process.pid if w is not None else None for w in self._workers]

    def close(self) -> None:
        self._closed = True
        self._finalizer()

    def run(
        self,
        tasks: Sequence[Task | BatchTask],
        specs: dict[str, ScorerSpec],
        chunk_size: int,
        time_limits: Sequence[float] | None = None,
    ) -> list[Outcome | list[Outcome]]:
        """Results of `tasks` in order (an Outcome per Task, a list of them per BatchTask); a task that timed
        out or crashed gets one error Outcome. `time_limits`: each task's limit in seconds (default timeout_s)."""
        if self._closed:
            raise RuntimeError("this reward worker pool is closed; create a new RewardManager")
        self._limits = list(time_limits) if time_limits is not None else [self.timeout_s] * len(tasks)
        try:
            return self._run(tasks, specs, chunk_size)
        except BaseException:  # e.g. Ctrl-C: busy workers would answer stale chunks next call
            for slot, worker in enumerate(self._workers):
                if worker is not None and worker.chunk is not None:
                    worker.kill()
                    self._workers[slot] = None
            raise

    def _run(
        self, tasks: Sequence[Task | BatchTask], specs: dict[str, ScorerSpec], chunk_size: int
    ) -> list[Outcome | list[Outcome]]:
        outcomes: list[Outcome | list[Outcome] | None] = [None] * len(tasks)
        pending = deque(
            list(range(i, min(i + chunk_size, len(tasks)))) for i in range(0, len(tasks), chunk_size)
        )
        start_failures = 0
        while pending or any(w is not None and w.chunk is not None for w in self._workers):
            for slot, worker in enumerate(self._workers):
                if not pending:
                    break
                if worker is None:
                    worker = self._workers[slot] = _Worker(self._ctx)
                if worker.chunk is None:
                    chunk = pending.popleft()
                    chunk_tasks = [tasks[i] for i in chunk]
                    worker.dispatch(
                        chunk, chunk_tasks, {t.scorer_key: specs[t.scorer_key] for t in chunk_tasks}
                    )
            busy = [w for w in self._workers if w is not None and w.chunk is not None]
            wait([w.conn for w in busy] + [w.process.sentinel for w in busy], timeout=self._poll_s)
            for slot, worker in enumerate(self._workers):
                if worker is None or worker.chunk is None:
                    continue
                if self._collect(worker, outcomes):
                    start_failures = 0
                    continue
                failure = self._check(worker)
                if failure is None:
                    continue
                chunk, started = worker.chunk, worker.seen  # the sample the verdict was about
                worker.kill()
                self._workers[slot] = None
                self.restarts += 1
                if started == 0:  # died before its first sample: retry the chunk elsewhere
                    start_failures += 1
                    if start_failures >= MAX_START_FAILURES:
                        _stop_all(self._workers)
                        raise RuntimeError(
                            f"reward worker processes keep dying before scoring anything ({failure.error}). "
                            "They import your main module: guard a script's top-level code with "
                            "`if __name__ == '__main__':`. Run with num_workers=0 to debug in this process."
                        )
                    pending.appendleft(chunk)
                    continue
                outcomes[chunk[started - 1]] = failure
                rest = chunk[: started - 1] + chunk[started:]
                if rest:
                    pending.appendleft(rest)
        return [
            o if o is not None else Outcome(0.0, {}, "internal error: sample was never scored")
            for o in outcomes
        ]

    def _collect(self, worker: _Worker, outcomes: list[Outcome | list[Outcome] | None]) -> bool:
        """Take a finished chunk's outcomes if they have arrived."""
        try:
            if not worker.conn.poll():
                return False
            results = worker.conn.recv()
        except (EOFError, OSError):  # died without answering: `_check` deals with it
            return False
        assert worker.chunk is not None
        for position, outcome in zip(worker.chunk, results):
            outcomes[position] = outcome
        worker.finished += len(worker.chunk)
        worker.chunk = None
        return True

    def _check(self, worker: _Worker) -> Outcome | None:
        """An Outcome for the running sample if its worker must be replaced, else None."""
        now = time.monotonic()
        started = worker.started_in_chunk()
        if started != worker.seen:
            worker.seen, worker.seen_at = started, now
        if not worker.process.is_alive():
            worker.seen = worker.started_in_chunk()  # final now: blame the sample it died on
            return Outcome(0.0, {}, f"the reward worker process died (exit code {worker.process.exitcode})")
        limit = self._limits[worker.chunk[started - 1]] if started > 0 and worker.chunk else self.timeout_s
        if started > 0 and now - worker.seen_at > limit:
            return Outcome(0.0, {}, f"timed out after {limit:g} s (worker process killed)", timed_out=True)
        if started == 0 and now - worker.seen_at > STARTUP_LIMIT_S:
            return Outcome(0.0, {}, f"the reward worker process did not start within {STARTUP_LIMIT_S:g} s")
        return None
