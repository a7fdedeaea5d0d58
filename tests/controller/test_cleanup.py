"""Exit and Ctrl-C release every live worker group and pool, groups first, then pass the signal on."""

import pickle
import signal
import weakref

import pytest

from tandem.controller import WorkerError, cleanup


class Fake:
    def __init__(self, order: int, log: list) -> None:
        self.release_order = order
        self.log = log

    def release(self) -> None:
        self.log.append(self.release_order)
        cleanup.untrack(self)


@pytest.fixture
def fresh_registry(monkeypatch):
    """A registry that has installed nothing yet, in a process whose Ctrl-C is Python's: a job started in the
    background by a non-interactive shell (nohup, `&`) inherits SIGINT ignored, which cleanup leaves so."""
    monkeypatch.setattr(cleanup, "_live", weakref.WeakSet())
    monkeypatch.setattr(cleanup, "_installed", False)
    monkeypatch.setattr(cleanup.atexit, "register", lambda fn: fn)  # the session's own hook is enough
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def test_sigint_releases_groups_before_pools_then_raises_keyboard_interrupt(fresh_registry, monkeypatch):
    log: list[int] = []
    pool, group = Fake(1, log), Fake(0, log)
    cleanup.track(pool)
    cleanup.track(group)
    assert signal.getsignal(signal.SIGINT) is cleanup._on_sigint  # installed on first use (main thread)
    monkeypatch.setattr(cleanup, "_previous_sigint", signal.default_int_handler)
    with pytest.raises(KeyboardInterrupt):
        cleanup._on_sigint(signal.SIGINT, None)
    assert log == [0, 1]
    cleanup.release_all()  # released objects untracked themselves: nothing runs twice
    assert log == [0, 1]


def test_sigint_chains_to_a_custom_previous_handler(fresh_registry, monkeypatch):
    seen = []
    monkeypatch.setattr(cleanup, "_previous_sigint", lambda signum, frame: seen.append(signum))
    cleanup._on_sigint(signal.SIGINT, None)
    assert seen == [signal.SIGINT]


def test_worker_error_keeps_its_fields_when_pickled():
    err = WorkerError("critic", "Critic.values()", 1, "ValueError", "bad", "Traceback ...", [(0, "X: y")])
    back = pickle.loads(pickle.dumps(err))
    assert (back.group, back.rank, back.error_type, back.other_failures) == (
        "critic",
        1,
        "ValueError",
        [(0, "X: y")],
    )
    assert str(back) == str(err)


def test_sigterm_releases_everything_then_exits_143(fresh_registry):
    log: list[int] = []
    pool, group = Fake(1, log), Fake(0, log)  # held here: the registry only keeps weak references
    cleanup.track(pool)
    cleanup.track(group)
    assert signal.getsignal(signal.SIGTERM) is cleanup._on_sigterm
    with pytest.raises(SystemExit) as stopped:
        cleanup._on_sigterm(signal.SIGTERM, None)
    assert stopped.value.code == 143 and log == [0, 1]
