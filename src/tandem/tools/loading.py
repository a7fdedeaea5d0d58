"""Tools and interactions by name (the built-ins) and from a user's file (rollout.multi_turn.tool_file,
interaction_file): a Python file, or verl's YAML config (tools/verl_config.py)."""

from __future__ import annotations

import inspect
import os
import types
from collections.abc import Callable

from tandem.tools.base import Tool, ToolConfigError, ToolSet
from tandem.tools.calculator import Calculator
from tandem.tools.functions import FunctionTool
from tandem.tools.interaction import Interaction, TryAgain
from tandem.tools.names import CALCULATOR, PYTHON, TRY_AGAIN
from tandem.tools.python_tool import PythonTool
from tandem.tools.verl_config import YAML_SUFFIXES, load_interaction_yaml, load_tool_yaml
from tandem.usercode import load_user_module

# name (tools/names.py BUILTIN_TOOL_NAMES) -> factory(timeout_s)
BUILTIN_TOOLS: dict[str, Callable[[float], Tool]] = {
    CALCULATOR: lambda timeout_s: Calculator(),
    PYTHON: lambda timeout_s: PythonTool(timeout_s=timeout_s),
}


def load_module(path: str | os.PathLike, setting: str) -> types.ModuleType:
    """Run the Python file at `path` as its own module (once per process); `setting` names the
    config key that points at it, for the error messages."""
    return load_user_module(path, where=f"{setting} '{path}'", setting=setting, prefix="tandem_user_tools_")


PYTHON_SUFFIX = ".py"


def file_kind(path: str | os.PathLike, setting: str) -> str:
    """ "python" or "yaml" by the file's suffix; a `ToolConfigError` for any other file."""
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix == PYTHON_SUFFIX:
        return "python"  # tandem/usercode.py names a missing file
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{setting} '{path}': the file does not exist ({setting} is {os.path.abspath(path)})"
        )
    if suffix in YAML_SUFFIXES:
        return "yaml"
    raise ToolConfigError(
        f"{setting} '{path}': neither a Python file (.py) nor verl's YAML config (.yaml, .yml); "
        f"point {setting} at one of those (rename the file if it is one)"
    )


def load_tools(path: str | os.PathLike, setting: str = "rollout.multi_turn.tool_file") -> list[Tool]:
    """The tools a file defines: verl's tool YAML (tools/verl_config.py), or a Python file's ``TOOLS``
    list if it has one, else its ``@tool`` functions."""
    where = f"{setting} '{path}'"
    if file_kind(path, setting) == "yaml":
        tools = load_tool_yaml(path, setting)
        _check_builtin_names(tools, where)
        return tools
    module = load_module(path, setting)
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
    _check_builtin_names(tools, where)
    return tools


def _check_builtin_names(tools: list[Tool], where: str) -> None:
    for t in tools:
        if t.name in BUILTIN_TOOLS:
            raise ValueError(
                f"{where}: tool '{t.name}' has the name of a built-in tool; rename it (name= in @tool, or "
                "tool_schema.function.name in a YAML), or list the built-in in rollout.multi_turn.tools instead"
            )


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


# name (tools/names.py BUILTIN_INTERACTION_NAMES) -> class
BUILTIN_INTERACTIONS: dict[str, type[Interaction]] = {TRY_AGAIN: TryAgain}


def build_interaction(
    name: str | None, interaction_file: str | os.PathLike | None = None
) -> Interaction | None:
    """The interaction of rollout.multi_turn: built-in `name`, the interactions of verl's interaction
    YAML `interaction_file` (tools/verl_config.py), or the ``INTERACTION`` of the Python file
    `interaction_file` (whose name must then be `name`, if given); None when neither is set."""
    if not interaction_file:
        if not name:
            return None
        if name not in BUILTIN_INTERACTIONS:
            raise ValueError(
                f"interaction '{name}' is not built in ({', '.join(BUILTIN_INTERACTIONS)}); define it in a "
                "Python file (INTERACTION = ...) and set rollout.multi_turn.interaction_file"
            )
        return BUILTIN_INTERACTIONS[name]()
    setting = "rollout.multi_turn.interaction_file"
    where = f"{setting} '{interaction_file}'"
    if file_kind(interaction_file, setting) == "yaml":
        return load_interaction_yaml(interaction_file, name, setting)
    module = load_module(interaction_file, setting)
    found = getattr(module, "INTERACTION", None)
    if found is None:
        raise AttributeError(
            f"{where} has no INTERACTION: define INTERACTION = MyInteraction() (a tandem.tools.Interaction)"
        )
    if inspect.isclass(found) and issubclass(found, Interaction):
        try:
            found = found()
        except TypeError as error:
            raise TypeError(
                f"{where}: INTERACTION is a class that cannot be built without arguments ({error}); "
                "set INTERACTION to an instance"
            ) from error
    if not isinstance(found, Interaction):
        raise TypeError(
            f"{where}: INTERACTION must be a tandem.tools.Interaction (an instance or a subclass), "
            f"got {found!r}"
        )
    if name and found.name != name:
        raise ValueError(
            f"{where} defines interaction '{found.name}', but rollout.multi_turn.interaction is '{name}': "
            f"set it to '{found.name}' or leave it empty"
        )
    return found
