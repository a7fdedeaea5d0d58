"""`@tool`: a plain Python function (sync or async) as a `Tool`, its schema read from its signature."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

from tandem.tools.base import Tool
from tandem.tools.threads import ToolThreads

# Python annotation -> JSON schema type of an argument.
_SCHEMA_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
}


class FunctionTool(Tool):
    """A function as a tool. A sync function runs in a daemon thread of its own per call, so it does not
    block the event loop; at the time limit the model gets the timeout result and the thread runs on in
    the background, a bounded number of them per tool (tools/threads.py: why a thread, what is bounded)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"@tool wraps a function, got {fn!r}")
        self.fn = fn
        self.name = name or fn.__name__
        qualname = getattr(fn, "__qualname__", self.name)
        where = f"tool '{self.name}'" + (f" (function {qualname})" if qualname != self.name else "")
        self.description = description if description is not None else _first_paragraph(fn)
        if not self.description:
            raise ValueError(
                f"{where} has no description: give the function a docstring or pass description="
            )
        self.parameters = parameters if parameters is not None else schema_from_signature(fn, where)
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"{where}: timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self.is_async = inspect.iscoroutinefunction(fn)
        self.threads = ToolThreads(self.name)

    async def call(self, **arguments: Any) -> str:
        if self.is_async:
            return await self.fn(**arguments)
        return await self.threads.run(self.fn, **arguments)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The decorated function still works as a function (in the user's own tests, say)."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"FunctionTool({self.name!r})"


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
    timeout_s: float | None = None,
) -> Any:
    """Make a function a tool: ``@tool`` or ``@tool(name=..., timeout_s=...)``.

    The description defaults to the docstring's first paragraph; the parameters to a schema of
    the signature (str, int, float, bool, list, dict; a parameter without a default is required)."""

    def wrap(f: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(f, name=name, description=description, parameters=parameters, timeout_s=timeout_s)

    return wrap(fn) if fn is not None else wrap


def _first_paragraph(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def schema_from_signature(fn: Callable[..., Any], where: str) -> dict[str, Any]:
    """The JSON schema of `fn`'s keyword arguments, from its annotations."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception as error:
        raise TypeError(
            f"{where}: cannot read the type annotations ({type(error).__name__}: {error}); fix them or "
            "pass parameters= to @tool"
        ) from error
    properties: dict[str, Any] = {}
    required = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise TypeError(
                f"{where}: parameter '{param.name}' is {param.kind.description}; the model passes keyword "
                "arguments only: use named parameters or pass parameters= to @tool"
            )
        annotation = hints.get(param.name)
        properties[param.name] = (
            {} if annotation is None else {"type": _json_type(annotation, param.name, where)}
        )
        if param.default is param.empty:
            required.append(param.name)
    return {"type": "object", "properties": properties, "required": required}


def _json_type(annotation: Any, param: str, where: str) -> str:
    """ "integer" for int, list[int] or int | None (None is left to the default)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return _json_type(rest[0], param, where)
    kind = _SCHEMA_TYPES.get(origin or annotation)
    if kind is None:
        raise TypeError(
            f"{where}: parameter '{param}' is annotated {annotation!r}; tool arguments are "
            f"{', '.join(t.__name__ for t in _SCHEMA_TYPES)}: use one of those or pass parameters= to @tool"
        )
    return kind
