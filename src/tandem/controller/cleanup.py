"""Kill worker groups and free resource pools when the controller exits or is interrupted (Ctrl-C).

Worker groups and pools register here; at interpreter exit (atexit) and on SIGINT every live one is
released, groups before pools. The SIGINT handler then hands the signal on to the handler that was
installed before it (normally Python's, which raises KeyboardInterrupt).
"""

from __future__ import annotations

import atexit
import contextlib
import signal
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
    _installed = True


def _on_sigint(signum: int, frame: Any) -> None:
    release_all()
    previous = _previous_sigint
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:  # SIG_DFL or a handler not set from Python: stop as Python would
        raise KeyboardInterrupt
