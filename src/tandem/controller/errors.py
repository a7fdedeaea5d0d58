"""Errors the controller raises: a worker failed, a call ran too long, or a call cannot be dispatched."""

from __future__ import annotations


class DispatchError(ValueError):
    """A call's arguments or its ranks' outputs do not fit its dispatch mode (raised on the controller)."""


class WorkerError(RuntimeError):
    """A worker of a group raised, died or hung; the group is broken and its workers were shut down.

    `rank` is the rank that failed first (None when the whole group timed out), `error_type` and
    `error_message` describe its exception, `worker_traceback` is the traceback text from the worker
    and `other_failures` lists (rank, one-line description) of ranks that failed in the same call.
    """

    def __init__(
        self,
        group: str,
        method: str,
        rank: int | None,
        error_type: str,
        error_message: str,
        worker_traceback: str = "",
        other_failures: list[tuple[int, str]] | None = None,
        summary: str | None = None,
    ) -> None:
        self.group = group
        self.method = method
        self.rank = rank
        self.error_type = error_type
        self.error_message = error_message
        self.worker_traceback = worker_traceback
        self.other_failures = list(other_failures or [])
        if summary is None:
            where = f"rank {rank}" if rank is not None else "all ranks"
            summary = f"worker group '{group}': {where} failed in {method}: {error_type}: {error_message}"
        self.summary = summary
        lines = [summary]
        lines += [f"  rank {r} also failed: {what}" for r, what in self.other_failures]
        if worker_traceback:
            lines += [f"--- traceback of rank {rank} ---", worker_traceback.rstrip()]
        super().__init__("\n".join(lines))

    def __reduce__(self):  # keep the fields when pickled (e.g. sent through a queue)
        return (
            type(self),
            (
                self.group,
                self.method,
                self.rank,
                self.error_type,
                self.error_message,
                self.worker_traceback,
                self.other_failures,
                self.summary,
            ),
        )


class WorkerTimeoutError(WorkerError, TimeoutError):
    """A call did not finish within the group's `call_timeout_s`; the group is broken."""
