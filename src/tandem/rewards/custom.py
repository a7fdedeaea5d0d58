"""Load a user's scorer function from a Python file given by path.

The file may also define `check_ground_truth(data_source, ground_truth) -> str | None`: it is run on
every dataset row the file scores, when the data is loaded; a string it returns (what was expected)
makes that row an error before training starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from tandem.usercode import load_user_module

# (real path, function name) -> function; a file is executed once per process.
_LOADED: dict[tuple[str, str], Callable[..., Any]] = {}


def load_function(path: str | os.PathLike, function_name: str = "compute_score") -> Callable[..., Any]:
    """`function_name` from the Python file at `path` (the file runs as its own module, once)."""
    where = f"custom reward function '{function_name}' in file '{path}'"
    real = os.path.realpath(os.fspath(path))
    if (real, function_name) in _LOADED:
        return _LOADED[(real, function_name)]
    module = load_user_module(path, where=where, setting="custom_reward_file", prefix="tandem_custom_reward_")
    fn = getattr(module, function_name, None)
    if fn is None:
        available = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise AttributeError(
            f"{where}: the file has no '{function_name}' (set custom_reward_function; "
            f"callables in the file: {', '.join(available) or 'none'})"
        )
    if not callable(fn):
        raise TypeError(f"{where}: '{function_name}' is a {type(fn).__name__}, not a function")
    _LOADED[(real, function_name)] = fn
    return fn


GROUND_TRUTH_CHECK = "check_ground_truth"  # the optional function of a custom reward file


def load_ground_truth_check(path: str | os.PathLike) -> Callable[..., Any] | None:
    """The file's `check_ground_truth` function, or None when the file defines none."""
    try:
        return load_function(path, GROUND_TRUTH_CHECK)
    except AttributeError:  # no such name: the file declares no check
        return None


def split_file_spec(spec: str) -> tuple[str, str] | None:
    """("path/x.py", "fn") for "path/x.py:fn", ("path/x.py", "compute_score") for "path/x.py", else None."""
    path, _, function_name = spec.rpartition(":") if ".py:" in spec else (spec, "", "")
    if not path.endswith(".py"):
        return None
    return path, function_name or "compute_score"
