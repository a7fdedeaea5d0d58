"""Kill worker groups and free resource pools when the controller exits or is interrupted (Ctrl-C).

Worker groups and pools register here; at interpreter exit (atexit), on SIGINT and on SIGTERM every
live one is released, groups before pools. The SIGINT handler then hands the signal on to the handler
that was installed before it (normally Python's, which raises KeyboardInterrupt). SIGTERM (a cluster
scheduler's preemption, `kill`) then exits with status 143 through SystemExit, so `finally` blocks run
(the run folder's lock is dropped) instead of Ray's own handler aborting the process.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import sys
import threading
import weakref
from typing import Any, Protocol


class Releasable(Protocol):
    release_order: int  # lower first: worker groups (0) before the pools they live on (1)

    def release(self) -> None: ...


_live: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.RLock()  # re-entrant: the SIGINT handler runs on the main thread, maybe inside track()
_installed = False
_previous_sigint: Any = None


def track(obj: Releasable) -> None:
    """Release `obj` at exit or on Ctrl-C unless `untrack`ed first."""
    with _lock:
        _live.add(obj)
        _install()


def untrack(obj: Releasable) -> None:
    with _lock:
        _live.discard(obj)


def release_all() -> None:
    """Release every tracked group and pool now (errors are swallowed: this runs while shutting down)."""
    with _lock:
        objs = sorted(_live, key=lambda o: o.release_order)
    for obj in objs:
        with contextlib.suppress(Exception):
            obj.release()


def _install() -> None:
    global _installed, _previous_sigint
    if _installed:
        return
    atexit.register(release_all)
    # signal handlers can only be set from the main thread; elsewhere atexit still covers us
    if threading.current_thread() is threading.main_thread():
        previous = signal.getsignal(signal.SIGINT)
        if previous is not signal.SIG_IGN:  # ignored on purpose (a shell's background job): leave it so
            _previous_sigint = previous
            signal.signal(signal.SIGINT, _on_sigint)
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
            signal.signal(signal.SIGTERM, _on_sigterm)
    _installed = True


def _on_sigint(signum: int, frame: Any) -> None:
    release_all()
    previous = _previous_sigint
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:  # SIG_DFL or a handler not set from Python: stop as Python would
        raise KeyboardInterrupt


def _on_sigterm(signum: int, frame: Any) -> None:
    print("[tandem] terminated (SIGTERM): stopping the workers", file=sys.stderr, flush=True)
    release_all()
    raise SystemExit(128 + signum)
