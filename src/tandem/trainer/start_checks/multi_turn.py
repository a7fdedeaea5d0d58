"""The agent loop's tool and interaction files (rollout.multi_turn), loaded before any worker starts, the actor's
chat template where the loop inserts messages, and the rows' verl fields for them (tools_kwargs,
interaction_kwargs, agent_name): a file or row that cannot be used is an error naming it, a field this config
would not use a warning."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from tandem.config.errors import ConfigError
from tandem.config.schema import TandemConfig
from tandem.data.rows import DataError
from tandem.engine.hf_io import error_summary
from tandem.rollout.agent import ChatInserter, interaction_from_config, toolset_from_config
from tandem.rollout.base import read_special_ids
from tandem.tools import InteractionRouter, StatefulTool
from tandem.tools.names import TOOL_AGENT
from tandem.trainer.start_checks.rows import MAX_LISTED_ROWS
from tandem.trainer.start_checks.tokenizers import actor_tokenizer_source

logger = logging.getLogger(__name__)


def check_multi_turn(cfg: TandemConfig, datasets: Iterable[Any], tokenizer: Any = None) -> None:
    """Load rollout.multi_turn's tool and interaction files here, before any worker starts (a file that
    cannot be used is a ConfigError naming it, its line and the fix), check that the chat template of the
    actor's `tokenizer` (None: not checked) ends a turn where the agent loop can insert messages
    (check_chat_template_stops), then check the rows' verl fields for them: an interaction name no interaction
    has is a DataError naming the rows; tools_kwargs, interaction_kwargs or agent_name that this config would
    not use are a warning each."""
    m = cfg.rollout.multi_turn
    tools = toolset_from_config(m)
    interaction = interaction_from_config(m)
    agent = cfg.rollout.mode == "async"
    inserts = tools is not None or (interaction is not None and m.max_user_turns > 0)
    if agent and inserts and tokenizer is not None:
        check_chat_template_stops(cfg, tokenizer, tools)
    stateful = {t for t in (tools.names if tools is not None else []) if isinstance(tools[t], StatefulTool)}
    notes: dict[str, list[str]] = {}  # warning -> rows (locations)
    problems = []
    for data in datasets:
        if data is None:
            continue
        for i in range(len(data)):
            item, location = data[i], data.locations[i]
            for note in _row_notes(item, agent, tools, stateful, interaction):
                notes.setdefault(note, []).append(location)
            problem = _interaction_name_problem(item, interaction)
            if problem is not None:
                problems.append(f"{location}: {problem}")
    if problems:
        listed = "\n".join(f"  - {p}" for p in problems[:MAX_LISTED_ROWS])
        more = (
            f"\n  ... and {len(problems) - MAX_LISTED_ROWS} more" if len(problems) > MAX_LISTED_ROWS else ""
        )
        raise DataError(
            f"{len(problems)} row(s) name an interaction rollout.multi_turn.interaction_file lacks:\n{listed}{more}"
        )
    for note, locations in notes.items():
        logger.warning("%s (%d rows, first %s)", note, len(locations), locations[0])


def check_chat_template_stops(cfg: TandemConfig, tokenizer: Any, tools: Any) -> None:
    """The agent loop inserts tool results and user turns after a model turn's stop token, where the chat
    template puts them (rollout/agent.py's ChatInserter), so the template must end an assistant turn with one of
    the rollout's stop ids (rollout/base.py's read_special_ids); else a ConfigError naming the tokenizer, its
    folder, the stop ids and the fix. The worker makes the same check; here it comes before any worker starts."""
    key, folder = actor_tokenizer_source(cfg)
    stop_ids, _ = read_special_ids(cfg.actor.model_path, cfg.actor.tokenizer_path, tokenizer)
    schemas = tools.schemas() if tools is not None and len(tools) else None
    try:
        ChatInserter(tokenizer, stop_ids, schemas, cfg.data.chat_template_kwargs)
    # ValueError: no stop token; transformers' / jinja's own: no template, or a broken one
    except Exception as error:
        raise ConfigError(
            f"rollout.mode=async with tools or a simulated user (rollout.multi_turn): the chat template of {key}="
            f"{folder} ({type(tokenizer).__name__}), with the stop ids {stop_ids} of actor.model_path="
            f"{cfg.actor.model_path}: {error_summary(error) if not isinstance(error, ValueError) else error}; "
            "or give the tokenizer a chat template whose assistant turn ends with one of the stop tokens "
            "(tokenizer_config.json's chat_template, or another tokenizer folder in actor.tokenizer_path)"
        ) from None


def _row_notes(
    item: dict[str, Any], agent: bool, tools: Any, stateful: set[str], interaction: Any
) -> list[str]:
    """What this config would not do with a row's verl fields for the agent loop, one line each."""
    extra = item["extra_info"]
    notes = []
    tools_kwargs = extra.get("tools_kwargs")
    if tools_kwargs and not (agent and tools is not None):
        notes.append(
            "extra_info.tools_kwargs: no tool reads them (they go to the tools of rollout.multi_turn.tool_file "
            "with rollout.mode=async); reward functions still see them in extra_info"
        )
    elif isinstance(tools_kwargs, dict):
        for name in sorted(set(tools_kwargs) - stateful):
            why = (
                "no tool has this name"
                if name not in tools
                else "it has no state (only verl-style tools read them)"
            )
            notes.append(f"extra_info.tools_kwargs['{name}']: not read, {why}")
    if extra.get("need_tools_kwargs") and not tools_kwargs:
        notes.append(
            "extra_info.need_tools_kwargs is true but tools_kwargs is empty: the tools get no create_kwargs"
        )
    if extra.get("interaction_kwargs") and not (agent and interaction is not None):
        notes.append(
            "extra_info.interaction_kwargs: no interaction reads them (set rollout.multi_turn.interaction_file "
            "and rollout.mode=async); reward functions still see them in extra_info"
        )
    if item.get("agent_name") == TOOL_AGENT and not agent:
        notes.append(
            "agent_name=tool_agent: rollout.mode=sync generates one turn without tools; set rollout.mode=async "
            "and rollout.multi_turn.tool_file to run verl's tool agent loop"
        )
    return notes


def _interaction_name_problem(item: dict[str, Any], interaction: Any) -> str | None:
    kwargs = item["extra_info"].get("interaction_kwargs")
    if not isinstance(interaction, InteractionRouter) or not isinstance(kwargs, dict):
        return None
    try:
        interaction.pick(kwargs)
    except ValueError as error:
        return str(error)
    return None
