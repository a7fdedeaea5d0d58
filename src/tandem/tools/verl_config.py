"""verl's tool and interaction config files (YAML), read as they are.

A tool file (rollout.multi_turn.tool_file)::

    tools:
      - class_name: verl.tools.gsm8k_tool.Gsm8kTool
        config: {type: native}
        tool_schema: {type: function, function: {name: ..., description: ..., parameters: {...}}}

An interaction file (rollout.multi_turn.interaction_file)::

    interaction:
      - name: gsm8k
        class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction
        config: {}

``class_name`` is one of verl's own classes that Tandem ports (`PORTS`), or any ``package.module.Class``
importable from the Python path, built as verl builds it: ``Class(config=..., tool_schema=...)`` for a
tool (the schema as a plain dict), ``Class(config=...)`` for an interaction (``config["name"]`` set to
the entry's name). A tool class implements verl's life cycle (tools/stateful.py), an interaction class
verl's methods or `tandem.tools.Interaction`. Every problem is a `ToolConfigError` naming the file, the
entry's line and the fix.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import yaml

from tandem.tools.base import Tool, ToolConfigError
from tandem.tools.interaction import ForeignInteraction, Interaction, InteractionRouter
from tandem.tools.stateful import ForeignTool, StatefulTool

# verl's class -> Tandem's port ("module:attribute", imported when named).
PORTS = {
    "verl.tools.gsm8k_tool.Gsm8kTool": "tandem.tools.gsm8k:Gsm8kTool",
    "verl.interactions.gsm8k_interaction.Gsm8kInteraction": "tandem.tools.gsm8k:Gsm8kInteraction",
}
# verl's classes Tandem does not port -> what to do instead.
NOT_PORTED = {
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": "the built-in python tool (rollout.multi_turn.tools=[python]) runs code",
    "verl.tools.search_tool.SearchTool": "write a tool that queries your retrieval service",
    "verl.tools.mcp_search_tool.MCPSearchTool": "write a tool that calls your MCP server",
    "verl.tools.mcp_base_tool.MCPBaseTool": "write a tool that calls your MCP server",
    "verl.tools.image_zoom_in_tool.ImageZoomInTool": "the agent loop has no image tools yet",
    "verl.tools.geo3k_tool.Geo3kTool": "write a tool that scores the answer with your own check",
    "verl.interactions.weather_interaction.WeatherInteraction": "write the interaction yourself",
}
YAML_SUFFIXES = (".yaml", ".yml")


def read_entries(path: str | os.PathLike, setting: str, key: str) -> list[tuple[dict[str, Any], int]]:
    """The entries of the YAML file's top-level list `key`, each with its line number."""
    where = f"{setting} '{path}'"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ToolConfigError(f"{where}: cannot be read ({error}); check {setting}") from None
    try:
        data = yaml.safe_load(text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ToolConfigError(f"{where}: not valid YAML{at} ({problem}); fix the file") from None
    other = {"tools": "interaction", "interaction": "tools"}[key]
    if isinstance(data, dict) and data.get(key) == []:
        raise ToolConfigError(f"{where}: '{key}:' lists nothing; add an entry or leave {setting} unset")
    if not isinstance(data, dict) or not isinstance(data.get(key), list) or not data[key]:
        hint = (
            f"; it holds {other!r}: it belongs in rollout.multi_turn.{'interaction_file' if other == 'interaction' else 'tool_file'}"
            if isinstance(data, dict) and other in data
            else ""
        )
        shape = "class_name, config, tool_schema" if key == "tools" else "name, class_name, config"
        raise ToolConfigError(
            f"{where}: not verl's {'tool' if key == 'tools' else 'interaction'} config: expected a top-level "
            f"'{key}:' list of entries with {shape}{hint}"
        )
    lines = _item_lines(root, key)
    return [(entry, lines[i] if i < len(lines) else 0) for i, entry in enumerate(data[key])]


def _item_lines(root: Any, key: str) -> list[int]:
    """The 1-based line of each item of the top-level sequence `key` of a composed YAML document."""
    for name, value in getattr(root, "value", []):
        if getattr(name, "value", None) == key and isinstance(value, yaml.SequenceNode):
            return [item.start_mark.line + 1 for item in value.value]
    return []


def resolve_class(class_name: Any, where: str) -> type:
    """The class a YAML entry names: Tandem's port of a verl class, or ``package.module.Class`` imported."""
    if not isinstance(class_name, str) or "." not in class_name:
        raise ToolConfigError(
            f"{where}: class_name must be a dotted path such as my_package.my_tools.MyTool, got {class_name!r}"
        )
    if class_name in NOT_PORTED or (class_name.startswith("verl.") and class_name not in PORTS):
        instead = NOT_PORTED.get(class_name, "write the class yourself")
        package = class_name.split(".")[1] if class_name.count(".") > 1 else ""
        ported = ", ".join(p for p in PORTS if p.split(".")[1] == package) or "none of this kind"
        raise ToolConfigError(
            f"{where}: {class_name} is verl's own class, and Tandem has no port of it (ported: {ported}); "
            f"{instead}, and name your class by its dotted path in class_name"
        )
    module_name, attribute = (
        PORTS[class_name].split(":") if class_name in PORTS else class_name.rsplit(".", 1)
    )
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise ToolConfigError(
            f"{where}: cannot import module '{module_name}' of class_name {class_name} "
            f"({type(error).__name__}: {error}); put its package on the Python path (PYTHONPATH) or fix class_name"
        ) from None
    found = getattr(module, attribute, None)
    if not isinstance(found, type):
        raise ToolConfigError(f"{where}: module '{module_name}' has no class '{attribute}'; fix class_name")
    return found


def _build(cls: type, where: str, **kwargs: Any) -> Any:
    try:
        return cls(**kwargs)
    except Exception as error:
        raise ToolConfigError(
            f"{where}: {cls.__qualname__}({', '.join(f'{k}=...' for k in kwargs)}) failed "
            f"({type(error).__name__}: {error}); fix the entry's config or the class"
        ) from None


def _schema(entry: dict[str, Any], where: str) -> dict[str, Any] | None:
    schema = entry.get("tool_schema")
    if schema is None:
        return None
    function = schema.get("function") if isinstance(schema, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise ToolConfigError(
            f"{where}: tool_schema must be {{type: function, function: {{name: ..., description: ..., "
            f"parameters: {{type: object, properties: ...}}}}}}, got {schema!r:.80}"
        )
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        raise ToolConfigError(
            f"{where}: tool_schema.function.parameters must have type: object, got {parameters!r:.80}"
        )
    return schema


def load_tool_yaml(path: str | os.PathLike, setting: str = "rollout.multi_turn.tool_file") -> list[Tool]:
    """The tools of verl's tool YAML at `path` (see the module docstring)."""
    tools: list[Tool] = []
    for i, (entry, line) in enumerate(read_entries(path, setting, "tools")):
        where = f"{setting} '{path}' tools[{i}] (line {line})"
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise ToolConfigError(
                f"{where}: each entry needs class_name (and config, tool_schema), got {entry!r:.80}"
            )
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            raise ToolConfigError(f"{where}: config must be a mapping, got {config!r:.80}")
        if config.get("type", "native") != "native":
            raise ToolConfigError(
                f"{where}: config.type={config['type']!r}: Tandem builds native tools only (verl's MCP tools "
                "fetch their schemas from a server); use type: native and a class of your own"
            )
        schema = _schema(entry, where)
        cls = resolve_class(entry["class_name"], where)
        built = _build(cls, where, config=config, tool_schema=schema)
        tools.append(_as_tool(built, schema, where))
    return tools


def _as_tool(built: Any, schema: dict[str, Any] | None, where: str) -> Tool:
    if isinstance(built, Tool):
        if schema is not None and not isinstance(built, StatefulTool):
            function = schema["function"]
            built.name, built.parameters = function["name"], function.get("parameters", built.parameters)
            built.description = function.get("description", built.description)
        if not getattr(built, "name", None):
            raise ToolConfigError(f"{where}: the tool has no name; give the entry a tool_schema")
        return built
    if not callable(getattr(built, "execute", None)):
        raise ToolConfigError(
            f"{where}: {type(built).__qualname__} has no execute(instance_id, parameters): a tool class implements "
            "verl's life cycle (create, execute, calc_reward, release) or subclasses tandem.tools.StatefulTool"
        )
    if schema is None:
        raise ToolConfigError(
            f"{where}: the entry has no tool_schema; add one (name, description, parameters)"
        )
    return ForeignTool(built, schema)


def load_interaction_yaml(
    path: str | os.PathLike, name: str | None = None, setting: str = "rollout.multi_turn.interaction_file"
) -> Interaction:
    """The interactions of verl's interaction YAML at `path`, routed by each row's interaction_kwargs name
    (default: `name`, else the file's only entry)."""
    interactions: dict[str, Interaction] = {}
    for i, (entry, line) in enumerate(read_entries(path, setting, "interaction")):
        where = f"{setting} '{path}' interaction[{i}] (line {line})"
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise ToolConfigError(
                f"{where}: each entry needs class_name (and name, config), got {entry!r:.80}"
            )
        config = dict(entry.get("config") or {})
        cls = resolve_class(entry["class_name"], where)
        entry_name = entry.get("name") or _default_name(str(entry["class_name"]))
        if entry_name in interactions:
            raise ToolConfigError(
                f"{where}: a second interaction is named '{entry_name}'; names must be unique"
            )
        config["name"] = entry_name
        built = _build(cls, where, config=config)
        if isinstance(built, Interaction):
            built.name = entry_name
        elif callable(getattr(built, "generate_response", None)):
            built = ForeignInteraction(built, entry_name)
        else:
            raise ToolConfigError(
                f"{where}: {cls.__qualname__} has no generate_response(instance_id, messages): an interaction class "
                "implements verl's methods or subclasses tandem.tools.Interaction"
            )
        interactions[entry_name] = built
    if name and name not in interactions:
        raise ToolConfigError(
            f"{setting} '{path}' defines the interactions {', '.join(interactions)}, but rollout.multi_turn.interaction "
            f"is '{name}': set it to one of those or leave it empty"
        )
    default = name or (next(iter(interactions)) if len(interactions) == 1 else None)
    return InteractionRouter(interactions, default)


def _default_name(class_name: str) -> str:
    """verl's name of an unnamed entry: the class's name without "Interaction", lower case."""
    simple = class_name.rsplit(".", 1)[-1]
    return (simple[: -len("Interaction")] if simple.endswith("Interaction") else simple).lower()
