"""The names of the built-in tools and interactions, listed once: config validation reads them before any
worker starts (tandem/config/checks/rollout.py), tools/loading.py and tools/interaction.py map each to
what it builds. No imports, so reading the names loads no tool."""

CALCULATOR = "calculator"
PYTHON = "python"
TRY_AGAIN = "try_again"

BUILTIN_TOOL_NAMES = (CALCULATOR, PYTHON)
BUILTIN_INTERACTION_NAMES = (TRY_AGAIN,)

# verl's agent_name values a data row may carry: the agent loop with tools, or one turn without them.
TOOL_AGENT = "tool_agent"
SINGLE_TURN_AGENT = "single_turn_agent"
AGENT_NAMES = (TOOL_AGENT, SINGLE_TURN_AGENT)
