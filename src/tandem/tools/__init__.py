"""Tools the model calls and simulated users that answer it, for the agent loop (rollout/agent.py).

Built-in tools: ``calculator`` (safe arithmetic) and ``python`` (a fresh, resource-limited process;
not a sandbox). Your own: functions decorated with `tool` (or `Tool` subclasses in a ``TOOLS``
list) in the Python file named by rollout.multi_turn.tool_file, or verl's tool YAML there
(tools/verl_config.py: verl's GSM8K tool ported, or classes with verl's stateful life cycle,
tools/stateful.py). Built-in interaction: ``try_again``; your own: ``INTERACTION`` in the Python
file rollout.multi_turn.interaction_file, or verl's interaction YAML there.
"""

from tandem.tools.base import ERRORS, Tool, ToolConfigError, ToolResult, ToolSet, truncate
from tandem.tools.calculator import Calculator, evaluate
from tandem.tools.functions import FunctionTool, tool
from tandem.tools.interaction import (
    ForeignInteraction,
    Interaction,
    InteractionReply,
    InteractionRouter,
    TryAgain,
)
from tandem.tools.loading import (
    BUILTIN_INTERACTIONS,
    BUILTIN_TOOLS,
    build_interaction,
    build_toolset,
    load_tools,
)
from tandem.tools.python_tool import PythonTool
from tandem.tools.stateful import ForeignTool, StatefulTool, ToolSession

__all__ = [
    "BUILTIN_INTERACTIONS",
    "BUILTIN_TOOLS",
    "ERRORS",
    "Calculator",
    "ForeignInteraction",
    "ForeignTool",
    "FunctionTool",
    "Interaction",
    "InteractionReply",
    "InteractionRouter",
    "PythonTool",
    "StatefulTool",
    "Tool",
    "ToolConfigError",
    "ToolResult",
    "ToolSession",
    "ToolSet",
    "TryAgain",
    "build_interaction",
    "build_toolset",
    "evaluate",
    "load_tools",
    "tool",
    "truncate",
]
