"""Tools by name (the built-ins) and from a user's Python file (rollout.multi_turn.tool_file)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import types
from collections.abc import Callable

from tandem.tools.base import Tool, ToolSet
from tandem.tools.calculator import Calculator
from tandem.tools.functions import FunctionTool
from tandem.tools.python_tool import PythonTool

# name -> factory(timeout_s); keep in step with config/validate.py BUILTIN_TOOLS.
BUILTIN_TOOLS: dict[str, Callable[[float], Tool]] = {
    "calculator": lambda timeout_s: Calculator(),
    "python": lambda timeout_s: PythonTool(timeout_s=timeout_s),
}


def load_module(path: str | os.PathLike, setting: str) -> types.ModuleType:
    """Run the Python file at `path` as its own module (once per process); `setting` names the
    config key that points at it, for the error messages."""
    from tandem.rewards.custom import _describe_load_error  # the same wording as reward files

    where = f"{setting} '{path}'"
    real = os.path.realpath(os.fspath(path))
    if os.path.isdir(real):
        raise IsADirectoryError(f"{where} is a directory; point {setting} at the .py file itself")
    if not os.path.isfile(real):
        raise FileNotFoundError(f"{where} does not exist (looked for {os.path.abspath(path)}); fix {setting}")
    module_name = "tandem_user_tools_" + hashlib.sha1(real.encode()).hexdigest()[:12]
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, real)
    if spec is None or spec.loader is None:
        raise ImportError(f"{where} cannot be loaded as a Python module (does it end in .py?)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up here
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as error:
        del sys.modules[module_name]
        raise ImportError(
            f"{where}: running the file failed: {_describe_load_error(error, real)}; fix it, or run the file "
            "with python to see the full error"
        ) from error
    except BaseException:  # KeyboardInterrupt: not the file's fault
        del sys.modules[module_name]
        raise
    return module


def load_tools(path: str | os.PathLike, setting: str = "rollout.multi_turn.tool_file") -> list[Tool]:
    """The tools a file defines: its ``TOOLS`` list if it has one, else its ``@tool`` functions."""
    module = load_module(path, setting)
    where = f"{setting} '{path}'"
    if hasattr(module, "TOOLS"):
        tools = module.TOOLS
        bad = [t for t in tools if not isinstance(t, Tool)] if isinstance(tools, list | tuple) else None
        if bad is None or bad:
            shown = type(tools).__name__ if bad is None else ", ".join(f"{t!r}" for t in bad[:3])
            raise TypeError(
                f"{where}: TOOLS must be a list of tandem.tools.Tool instances (subclasses, or functions "
                f"decorated with @tandem.tools.tool), but holds {shown}"
            )
        tools = list(tools)
    else:
        tools = list({id(v): v for v in vars(module).values() if isinstance(v, FunctionTool)}.values())
    if not tools:
        raise ValueError(
            f"{where} defines no tools: decorate functions with @tandem.tools.tool, or define "
            "TOOLS = [...] (a list of tandem.tools.Tool instances)"
        )
    for t in tools:
        if t.name in BUILTIN_TOOLS:
            raise ValueError(
                f"{where}: tool '{t.name}' has the name of a built-in tool; rename it (name= in @tool), "
                "or list the built-in in rollout.multi_turn.tools instead"
            )
    return tools


def build_toolset(
    names: list[str] | None,
    tool_file: str | os.PathLike | None = None,
    *,
    timeout_s: float = 10.0,
    max_result_chars: int = 256,
    truncate_side: str = "middle",
) -> ToolSet:
    """The built-in tools `names` plus every tool of `tool_file`, run with these limits."""
    tools = []
    for name in names or []:
        if name not in BUILTIN_TOOLS:
            raise ValueError(
                f"'{name}' is not a built-in tool ({', '.join(BUILTIN_TOOLS)}); fix rollout.multi_turn.tools, "
                "or define it in a Python file named by rollout.multi_turn.tool_file"
            )
        tools.append(BUILTIN_TOOLS[name](timeout_s))
    if tool_file:
        tools.extend(load_tools(tool_file))
    return ToolSet(tools, timeout_s=timeout_s, max_result_chars=max_result_chars, truncate_side=truncate_side)
