"""Ray backend of `WorkerGroup`: one `WorkerHost` actor per rank, on the bundles of a resource pool.

Failure detection: a call's per-rank results are collected with `ray.wait` in a short polling loop.
The first rank that raises or dies ends the wait (the others may be stuck in a collective that will
never complete): a death at once, a raised error after looking up to ROOT_CAUSE_GRACE_S for a dead
rank, because a vanished peer often shows up first as a collective error on the survivors and the
dead rank is the cause worth reporting.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections import Counter
from typing import Any

from tandem.batch import Batch
from tandem.controller.context import WorkerContext
from tandem.controller.dispatch import RankCall
from tandem.controller.errors import WorkerError, WorkerTimeoutError
from tandem.controller.host import DEFAULT_PG_TIMEOUT_S, Shared, WorkerHost, thread_env
from tandem.controller.resources import ResourcePool

POLL_S = 0.5  # how often a blocked wait wakes up (deadlines, Ctrl-C)
ROOT_CAUSE_GRACE_S = 1.0  # after a rank raises, how long to look for a dead rank that explains it

_remote_host_cls: Any = None


def _host_actor_cls() -> Any:
    global _remote_host_cls
    if _remote_host_cls is None:
        import ray

        # no restarts and no retries: a rank that died lost its process-group membership for good
        _remote_host_cls = ray.remote(max_restarts=0, max_task_retries=0)(WorkerHost)
    return _remote_host_cls


class RayBackend:
    """The actors of one Ray worker group, started and joined into one torch.distributed group."""

    def __init__(self, hosts: list[Any], group: str, worker_name: str, call_timeout_s: float | None):
        self.hosts = hosts
        self.group = group
        self.worker_name = worker_name
        self.call_timeout_s = call_timeout_s
        self.call_timeout_name = "call_timeout_s"  # the setting a timeout's message names
        self.device = "cpu"

    @property
    def world_size(self) -> int:
        return len(self.hosts)

    @classmethod
    def start(
        cls,
        worker_cls: type,
        pool: ResourcePool,
        *,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        share: float,
        num_threads: int | None,
        call_timeout_s: float | None,
        setup_timeout_s: float | None,
        call_timeout_name: str = "call_timeout_s",
        env: dict[str, str] | None,
        log_dir: str | None = None,
        nsight: dict[str, str] | None = None,
    ) -> RayBackend:
        """Create one host per rank, rendezvous at rank 0's address, and build the workers."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not 0 < share <= 1:
            raise ValueError(f"worker group '{name}': share must be in (0, 1], got {share}")
        if pool.removed:
            raise RuntimeError(f"worker group '{name}': resource pool '{pool.name}' was removed")
        cpus = pool.cpus_per_worker * share
        gpus = pool.gpus_per_worker * share
        if num_threads is None:
            num_threads = max(1, math.floor(cpus + 1e-9))
        runtime_env: dict[str, Any] = {"env_vars": {**thread_env(num_threads), **(env or {})}}
        if nsight is not None:
            runtime_env["nsight"] = dict(nsight)

        hosts: list[Any] = []
        backend = cls(hosts, name, worker_cls.__name__, call_timeout_s)
        backend.call_timeout_name = call_timeout_name
        backend.device = pool.device
        try:
            for rank in range(pool.world_size):
                pg, bundle, _, _ = pool.placement(rank)
                strategy = PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=bundle
                )
                options: dict[str, Any] = {
                    "num_cpus": cpus,
                    "scheduling_strategy": strategy,
                    "runtime_env": runtime_env,
                }
                if gpus > 0:
                    options["num_gpus"] = gpus
                hosts.append(_host_actor_cls().options(**options).remote(name, rank, log_dir))

            address = RayCall(
                backend,
                [hosts[0].address.remote()],
                "WorkerHost.address()",
                setup_timeout_s,
                "setup_timeout_s",
            )
            address.wait(None)
            master_addr, master_port = address.results[0]
            refs = []
            for rank, host in enumerate(hosts):
                _, _, node_rank, local_rank = pool.placement(rank)
                ctx = WorkerContext(
                    group_name=name,
                    rank=rank,
                    world_size=pool.world_size,
                    local_rank=local_rank,
                    node_rank=node_rank,
                    device=pool.device,
                    num_threads=num_threads,
                    backend="ray",
                )
                # init_process_group is collective: every rank's setup is in flight at once
                refs.append(
                    host.setup.remote(
                        ctx, master_addr, master_port, DEFAULT_PG_TIMEOUT_S, worker_cls, args, kwargs
                    )
                )
            label = f"{worker_cls.__name__}.__init__()"
            RayCall(backend, refs, label, setup_timeout_s, "setup_timeout_s").wait(None)
        except BaseException:
            backend.kill()
            raise
        return backend

    def submit(self, method: str, rank_calls: list[RankCall]) -> RayCall:
        """Start `method` on every rank with its own arguments; returns the pending call."""
        rank_calls = _share_repeated_batches(rank_calls)
        refs = [
            host.execute.remote(method, a, k) for host, (a, k) in zip(self.hosts, rank_calls, strict=True)
        ]
        label = f"{self.worker_name}.{method}()"
        return RayCall(self, refs, label, self.call_timeout_s, self.call_timeout_name)

    def kill(self) -> None:
        """Kill every rank's actor now (idempotent; ignores actors that are already gone)."""
        import ray

        if not ray.is_initialized():
            return
        for host in self.hosts:
            with contextlib.suppress(Exception):
                ray.kill(host, no_restart=True)


class RayCall:
    """One method running on every rank; results are collected as the ranks finish."""

    def __init__(
        self,
        backend: RayBackend,
        refs: list[Any],
        label: str,
        timeout_s: float | None,
        limit_name: str = "call_timeout_s",
    ) -> None:
        self.backend = backend
        self.label = label  # "Worker.method()": what the errors name
        self.results: list[Any] = [None] * len(refs)
        self._rank_of = {ref: rank for rank, ref in enumerate(refs)}
        self._pending = list(refs)
        self._timeout_s = timeout_s
        self._limit_name = limit_name
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def wait(self, timeout: float | None) -> bool:
        """Collect finished ranks for up to `timeout` s (None: until done); True when all have finished."""
        import ray

        end = None if timeout is None else time.monotonic() + timeout
        while self._pending:
            now = time.monotonic()
            if self._deadline is not None and now >= self._deadline:
                raise self._timeout_error()
            wait_s = POLL_S
            if self._deadline is not None:
                wait_s = min(wait_s, self._deadline - now)
            if end is not None:
                wait_s = max(0.0, min(wait_s, end - now))
            ready, self._pending = ray.wait(self._pending, num_returns=1, timeout=wait_s)
            if ready and self._pending:  # take every rank that has finished, not just the first
                more, self._pending = ray.wait(self._pending, num_returns=len(self._pending), timeout=0)
                ready += more
            for ref in ready:
                try:
                    self.results[self._rank_of[ref]] = ray.get(ref)
                except Exception as exc:
                    raise self._failure(self._rank_of[ref], exc) from None
            if end is not None and self._pending and time.monotonic() >= end:
                return False
        return True

    def _failure(self, rank: int, exc: BaseException) -> WorkerError:
        """The WorkerError for a failed call, blaming a dead rank over ranks that raised."""
        import ray
        from ray.exceptions import RayActorError

        failures = {rank: exc}
        if not isinstance(exc, RayActorError) and self._pending:
            # a peer's death often shows up first as a collective error on the survivors: look briefly
            ready, _ = ray.wait(self._pending, num_returns=len(self._pending), timeout=ROOT_CAUSE_GRACE_S)
            for ref in ready:
                try:
                    ray.get(ref)
                except Exception as other:
                    failures[self._rank_of[ref]] = other
        died = [r for r, e in failures.items() if isinstance(e, RayActorError)]
        first = died[0] if died else rank
        error_type, message, tb = describe_ray_error(failures[first])
        others = [(r, "{}: {}".format(*describe_ray_error(e)[:2])) for r, e in failures.items() if r != first]
        return WorkerError(self.backend.group, self.label, first, error_type, message, tb, others)

    def _timeout_error(self) -> WorkerTimeoutError:
        running = sorted(self._rank_of[ref] for ref in self._pending)
        limit = f"{self._limit_name}={self._timeout_s:g} s"
        return WorkerTimeoutError(
            self.backend.group,
            self.label,
            None,
            "Timeout",
            f"not finished within {limit}; ranks still running: {running}",
            summary=(
                f"worker group '{self.backend.group}': {self.label} did not finish within {limit}; "
                f"ranks still running: {running} (stuck, e.g. in a collective, or it needs a larger "
                f"{self._limit_name})"
            ),
        )


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def describe_ray_error(exc: BaseException) -> tuple[str, str, str]:
    """(error type, message, traceback text) of what `ray.get` raised for a failed rank."""
    from ray.exceptions import RayActorError, RayTaskError

    text = _ANSI.sub("", str(exc))
    if isinstance(exc, RayTaskError):
        cause = getattr(exc, "cause", None)
        if cause is not None:
            return type(cause).__name__, str(cause), text
        return "RayTaskError", text.splitlines()[-1] if text else "", text
    if isinstance(exc, RayActorError):
        reason = next((line for line in text.splitlines() if "Worker exit detail" in line), "")
        reason = reason.split("Worker exit detail:", 1)[-1].split(". ")[0].strip()
        message = "the worker process died" + (f" ({reason})" if reason else "")
        return "WorkerDied", message, text
    return type(exc).__name__, text, ""


def _share_repeated_batches(rank_calls: list[RankCall]) -> list[RankCall]:
    """Put each Batch that goes to several ranks into the object store once, not once per rank."""
    import ray

    counts = Counter(
        id(v) for args, kwargs in rank_calls for v in (*args, *kwargs.values()) if isinstance(v, Batch)
    )
    shared: dict[int, Shared] = {}

    def swap(v: Any) -> Any:
        if isinstance(v, Batch) and counts[id(v)] > 1:
            if id(v) not in shared:
                shared[id(v)] = Shared(ray.put(v))
            return shared[id(v)]
        return v

    return [
        (tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}) for args, kwargs in rank_calls
    ]
