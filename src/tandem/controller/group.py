"""`WorkerGroup`: the controller's handle on the ranks of one role (Ray actors, or one in-process worker)."""

from __future__ import annotations

import threading
from typing import Any

from tandem.controller import cleanup
from tandem.controller.dispatch import (
    LAYOUT_METHODS,
    CallPlan,
    Dispatch,
    RankLayout,
    dispatch_mode,
    dispatch_parts,
    plan_call,
)
from tandem.controller.errors import WorkerError
from tandem.controller.resources import ResourcePool


class GroupFuture:
    """The pending result of `WorkerGroup.call_async`: `.result(timeout)` blocks, `.done()` does not."""

    def __init__(self, group: WorkerGroup, method: str, pending: Any, plan: CallPlan) -> None:
        self._group = group
        self._method = method
        self._pending = pending
        self._plan = plan
        self._finished = False
        self._value: Any = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        """True when `result()` would return or raise without waiting."""
        if not self._finished:
            self._advance(0.0)
        return self._finished

    def result(self, timeout: float | None = None) -> Any:
        """The dispatched result; raises WorkerError if a rank failed, TimeoutError if `timeout` s pass first.

        A `timeout` here only stops waiting (the call goes on and can be waited for again); the group's
        `call_timeout_s` instead fails the call and breaks the group.
        """
        if not self._finished:
            self._advance(timeout)
            if not self._finished:
                raise TimeoutError(
                    f"worker group '{self._group.name}': {self._method}() still running after {timeout:g} s "
                    "(the call goes on; wait again or shut the group down)"
                )
        if self._error is not None:
            raise self._error
        return self._value

    def _advance(self, timeout: float | None) -> None:
        try:
            if not self._pending.wait(timeout):
                return
        except WorkerError as err:
            self._error = self._group._broken_by(err)
            self._finished = True
            return
        self._finished = True
        try:  # a merge error is the controller's: the workers are fine, the group stays usable
            self._value = self._plan.gather(self._pending.results)
        except Exception as exc:
            self._error = exc

    def __repr__(self) -> str:
        state = "done" if self._finished else "running"
        return f"GroupFuture({self._group.name}.{self._method}, {state})"


class _Method:
    """`group.method(...)` calls and blocks; `group.method.async_(...)` returns a GroupFuture."""

    def __init__(self, group: WorkerGroup, name: str) -> None:
        self._group = group
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._group.call(self._name, *args, **kwargs)

    def async_(self, *args: Any, **kwargs: Any) -> GroupFuture:
        return self._group.call_async(self._name, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<{self._group.name}.{self._name} ({dispatch_mode(getattr(self._group.worker_cls, self._name)).name})>"


class WorkerGroup:
    """The ranks of one role; calls run a worker method on every rank and return the dispatched result.

    Build with `WorkerGroup.ray(...)` (one Ray actor per rank on a ResourcePool) or
    `WorkerGroup.inprocess(...)` (world size 1, in this process); both are called the same way:
    `group.call("compute_values", batch)`, `group.compute_values(batch)`, or without blocking
    `group.call_async(...)` / `group.compute_values.async_(...)`.

    When a rank raises, dies or exceeds `call_timeout_s`, the call raises WorkerError, the group's
    workers are shut down (others may be stuck in a collective) and every later call raises at once.

    A worker method named like one of the group's own attributes (`call`, `name`, `world_size`,
    `device`, `broken`, `shutdown`) is reached with `group.call("name", ...)`. Over Ray, the worker
    class must be importable in the actors (an installed package, or a module beside the script).
    """

    release_order = 0

    def __init__(self, worker_cls: type, name: str, backend: Any) -> None:
        # use WorkerGroup.ray / WorkerGroup.inprocess
        self.worker_cls = worker_cls
        self.name = name
        self._backend = backend
        self._layouts: dict[Dispatch, RankLayout] = {}  # per layout-driven mode (dispatch.LAYOUT_METHODS)
        self._lock = threading.Lock()
        self._broken: WorkerError | None = None
        self._closed = False
        cleanup.track(self)

    @classmethod
    def ray(
        cls,
        worker_cls: type,
        pool: ResourcePool,
        *,
        name: str,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        share: float = 1.0,
        num_threads: int | None = None,
        call_timeout_s: float | None = None,
        call_timeout_name: str = "call_timeout_s",
        setup_timeout_s: float | None = 1800.0,
        env: dict[str, str] | None = None,
        log_dir: str | None = None,
        nsight: dict[str, str] | None = None,
    ) -> WorkerGroup:
        """One Ray actor per bundle of `pool`, each building `worker_cls(ctx, *args, **kwargs)`.

        `share`: the fraction of every bundle this group takes (colocation, see ResourcePool).
        `num_threads`: torch threads per rank (default: the CPUs of its share, at least 1).
        `call_timeout_s`: the longest one method call may take (None: no limit); `call_timeout_name`: the
        setting a timeout's message tells the user to raise (the config key). `setup_timeout_s`:
        the longest building the group may take (actors, rendezvous, the workers' constructors).
        torch.distributed's own timeout is 30 min. `env`: extra environment variables for the workers.
        `log_dir`: each rank's stdout and stderr go to `<log_dir>/<name>_rank<r>.log` instead of the
        controller's console. `nsight`: run each rank under Nsight Systems with these `nsys profile` options
        (Ray's runtime_env "nsight"; a CUDA machine with nsys installed).
        """
        from tandem.controller.ray_backend import RayBackend

        backend = RayBackend.start(
            worker_cls,
            pool,
            name=name,
            args=tuple(args),
            kwargs=dict(kwargs or {}),
            share=share,
            num_threads=num_threads,
            call_timeout_s=call_timeout_s,
            call_timeout_name=call_timeout_name,
            setup_timeout_s=setup_timeout_s,
            env=env,
            log_dir=log_dir,
            nsight=nsight,
        )
        return cls(worker_cls, name, backend)

    @classmethod
    def inprocess(
        cls,
        worker_cls: type,
        *,
        name: str,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        num_threads: int | None = None,
        device: str = "cpu",
    ) -> WorkerGroup:
        """One worker in this process (world size 1, a world-size-1 torch.distributed group).

        `num_threads` sets torch's threads for the whole process (they are shared with the controller).
        """
        from tandem.controller.inprocess import InProcessBackend

        backend = InProcessBackend.start(
            worker_cls,
            name=name,
            args=tuple(args),
            kwargs=dict(kwargs or {}),
            num_threads=num_threads,
            device=device,
        )
        return cls(worker_cls, name, backend)

    @property
    def world_size(self) -> int:
        return self._backend.world_size

    @property
    def dp_size(self) -> int:
        """Data-parallel parts a Dispatch.MP call splits a batch into (the workers' dispatch_info)."""
        return self._layout(Dispatch.MP).dp_size

    @property
    def replicas(self) -> int:
        """Rollout replicas a Dispatch.REPLICA call splits a batch into (the workers' replica_info)."""
        return self._layout(Dispatch.REPLICA).dp_size

    @property
    def device(self) -> str:
        return self._backend.device

    @property
    def broken(self) -> WorkerError | None:
        """The failure that broke the group, or None."""
        return self._broken

    def call(self, method: str, /, *args: Any, **kwargs: Any) -> Any:
        """Run `method` on the ranks as its dispatch mode says and wait for the result."""
        return self.call_async(method, *args, **kwargs).result()

    def call_async(self, method: str, /, *args: Any, **kwargs: Any) -> GroupFuture:
        """Start `method` on the ranks and return at once; calls on one group run in the order made."""
        self._check_usable()
        fn = self._method(method)
        mode = dispatch_mode(fn)
        layout = self._layout(mode) if mode in LAYOUT_METHODS else None
        plan = plan_call(mode, self.world_size, args, kwargs, layout, dispatch_parts(fn))
        return GroupFuture(self, method, self._backend.submit(method, plan.rank_calls), plan)

    def shutdown(self) -> None:
        """Kill the group's workers (idempotent). Its resource pool stays: `pool.remove()` frees it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        cleanup.untrack(self)
        self._backend.kill()

    release = shutdown

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __getattr__(self, name: str) -> _Method:
        # private names, pickle/copy probes and lookups before __init__ ran are not worker methods
        if name.startswith("_") or "worker_cls" not in self.__dict__:
            raise AttributeError(name)
        self._method(name)
        return _Method(self, name)

    def __repr__(self) -> str:
        state = "broken" if self._broken else "shut down" if self._closed else "live"
        return (
            f"WorkerGroup('{self.name}', {self.worker_cls.__name__}, world_size={self.world_size}, {state})"
        )

    # ---------------------------------------------------------------- internals
    def _method(self, name: str) -> Any:
        attr = getattr(self.worker_cls, name, None)
        if name.startswith("_") or not callable(attr):
            raise AttributeError(
                f"worker group '{self.name}': {self.worker_cls.__name__} has no public method '{name}'"
            )
        return attr

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise WorkerError(
                self.name,
                self._broken.method,
                self._broken.rank,
                self._broken.error_type,
                self._broken.error_message,
                summary=(
                    f"worker group '{self.name}' is broken and its workers were shut down: {self._broken.summary}. "
                    "Build a new group to go on."
                ),
            )
        if self._closed:
            raise WorkerError(
                self.name,
                "(no call)",
                None,
                "Shutdown",
                "the group was shut down",
                summary=f"worker group '{self.name}' was shut down (shutdown(), Ctrl-C or exit); build a new one",
            )

    def _broken_by(self, err: WorkerError) -> WorkerError:
        """Record the failure that broke the group and kill its workers; returns the error to raise."""
        with self._lock:
            closed, first = self._closed, self._broken
            if first is None and not closed:
                self._broken = err
        if closed and first is None:  # shutdown() killed the workers under this call
            return WorkerError(
                self.name,
                err.method,
                err.rank,
                err.error_type,
                err.error_message,
                summary=f"worker group '{self.name}' was shut down while {err.method} was running",
            )
        if first is None:
            self.shutdown()
            return err
        # an earlier call broke the group; this call's ranks died because of it
        if err.error_type == "WorkerDied":
            return WorkerError(
                self.name,
                err.method,
                first.rank,
                first.error_type,
                first.error_message,
                summary=f"worker group '{self.name}': {err.method} was cut short because {first.summary}",
            )
        return err

    def _layout(self, mode: Dispatch) -> RankLayout:
        """The group's layout for `mode`, asked of the workers once (their `dispatch_info` / `replica_info`)."""
        if mode not in self._layouts:
            method = LAYOUT_METHODS[mode]
            if not callable(getattr(self.worker_cls, method, None)):
                raise AttributeError(
                    f"worker group '{self.name}': Dispatch.{mode.name} needs {self.worker_cls.__name__}.{method}() "
                    "-> (part, parts, collect); subclass tandem.controller.Worker or define it"
                )
            plan = plan_call(Dispatch.ONE_TO_ALL, self.world_size, (), {})
            infos = GroupFuture(self, method, self._backend.submit(method, plan.rank_calls), plan)
            self._layouts[mode] = RankLayout.from_dispatch_info(
                infos.result(), group=f"worker group '{self.name}'", method=method
            )
        return self._layouts[mode]
