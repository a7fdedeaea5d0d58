"""Load a user's scorer function from a Python file given by path.

The file may also define `check_ground_truth(data_source, ground_truth) -> str | None`: it is run on
every dataset row the file scores, when the data is loaded; a string it returns (what was expected)
makes that row an error before training starts.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

# (real path, function name) -> function; a file is executed once per process.
_LOADED: dict[tuple[str, str], Callable[..., Any]] = {}


def load_function(path: str | os.PathLike, function_name: str = "compute_score") -> Callable[..., Any]:
    """`function_name` from the Python file at `path` (the file runs as its own module, once)."""
    where = f"custom reward function '{function_name}' in file '{path}'"
    real = os.path.realpath(os.fspath(path))
    if (real, function_name) in _LOADED:
        return _LOADED[(real, function_name)]
    if os.path.isdir(real):
        raise IsADirectoryError(
            f"{where}: that is a directory; point custom_reward_file at the .py file itself"
        )
    if not os.path.isfile(real):
        raise FileNotFoundError(
            f"{where}: the file does not exist (custom_reward_file is {os.path.abspath(path)})"
        )
    module_name = "tandem_custom_reward_" + hashlib.sha1(real.encode()).hexdigest()[:12]
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, real)
        if spec is None or spec.loader is None:
            raise ImportError(f"{where}: cannot be loaded as a Python module (does it end in .py?)")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses and pickling look modules up here
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as error:
            del sys.modules[module_name]
            raise ImportError(
                f"{where}: running the file failed: {_describe_load_error(error, real)}; fix it, or run the "
                "file with python to see the full error"
            ) from error
        except BaseException:  # KeyboardInterrupt: not the file's fault, pass it on as it is
            del sys.modules[module_name]
            raise
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


def _describe_load_error(error: BaseException, real: str) -> str:
    """ "SyntaxError: invalid syntax at line 2: `return 1 +`" or "ModuleNotFoundError: ... (line 1)"."""
    if isinstance(error, SyntaxError):
        code = (error.text or "").strip()
        other = f" of {error.filename}" if error.filename and os.path.realpath(error.filename) != real else ""
        return f"{type(error).__name__}: {error.msg} at line {error.lineno}{other}" + (
            f": `{code}`" if code else ""
        )
    lines = [f.lineno for f in traceback.extract_tb(error.__traceback__) if f.filename == real]
    where = f" (line {lines[-1]})" if lines else ""
    return f"{type(error).__name__}: {error}{where}"


def split_file_spec(spec: str) -> tuple[str, str] | None:
    """("path/x.py", "fn") for "path/x.py:fn", ("path/x.py", "compute_score") for "path/x.py", else None."""
    path, _, function_name = spec.rpartition(":") if ".py:" in spec else (spec, "", "")
    if not path.endswith(".py"):
        return None
    return path, function_name or "compute_score"
