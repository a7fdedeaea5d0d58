"""Interactions: a simulated user that reads the model's answer and may ask for another turn.

The agent loop calls ``start`` when a trajectory begins (with the row's
``extra_info.interaction_kwargs``, verl's ``start_interaction``), ``respond`` after each answer, and
``finish`` when the trajectory ends, on every path (verl's ``finalize_interaction``). The sample that
``respond`` gets carries the trajectory's ``instance_id`` and ``interaction_kwargs``, so one object
can hold many trajectories' state. ``start`` and ``finish`` do nothing by default: an interaction
without state implements ``respond`` alone."""

from __future__ import annotations

import asyncio
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from tandem.tools.names import TRY_AGAIN
from tandem.tools.stateful import maybe_await

# A tool call block (closed, or cut off at the end): a request, never an answer.
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class InteractionReply:
    """The user's next message (``text``), or ``done=True`` when the conversation ends here; ``score``
    is the turn's score (verl's ``generate_response`` reward), kept as the trajectory's turn_scores."""

    text: str | None
    done: bool
    score: float | None = None


class Interaction(ABC):
    """A simulated user. ``respond`` gets the conversation so far (OpenAI-style messages, the
    model's answer last) and the sample's fields (``ground_truth``, ``data_source``, ``extra_info``,
    ``instance_id``, ``interaction_kwargs``)."""

    name: str = ""

    async def start(self, instance_id: str, **interaction_kwargs: Any) -> None:  # noqa: B027 - optional hook
        """A trajectory begins (`interaction_kwargs`: the row's extra_info.interaction_kwargs)."""

    @abstractmethod
    async def respond(self, messages: list[dict[str, Any]], sample: dict[str, Any]) -> InteractionReply:
        """The reply to the model's last answer."""

    async def finish(self, instance_id: str) -> None:  # noqa: B027 - optional hook
        """The trajectory ended (answered, cut, failed or cancelled): drop its state."""


class TryAgain(Interaction):
    """Ends the conversation when the last answer is right, else says so without the answer.

    "Right" is what the reward scorer registered for the sample's ``data_source`` (or its
    ``extra_info["style"]``) counts as correct ("acc", else a score of 1); where there is no such
    scorer, the last whole number of the answer must equal the ground truth. A sample without a
    ground truth cannot be judged: the conversation ends. A custom reward file is not consulted."""

    name = TRY_AGAIN

    def __init__(self, message: str = "That is not right. Try again.") -> None:
        self.message = message

    async def respond(self, messages: list[dict[str, Any]], sample: dict[str, Any]) -> InteractionReply:
        answer = next(
            (m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), ""
        )
        if sample.get("ground_truth") is None:
            return InteractionReply(None, True)
        right = await asyncio.to_thread(is_right, str(answer), sample)
        return InteractionReply(None, True) if right else InteractionReply(self.message, False)


def is_right(answer: str, sample: dict[str, Any]) -> bool:
    """Whether `answer` is correct for the sample, by its data source's scorer (see `TryAgain`)."""
    from tandem.rewards.registry import UnknownDataSourceError, default_scorer_for
    from tandem.rewards.scorers.arithmetic import last_integer, whole_number
    from tandem.rewards.scoring import Task, score_task

    ground_truth, extra_info = sample.get("ground_truth"), sample.get("extra_info")
    style = extra_info.get("style") if isinstance(extra_info, dict) else None
    try:
        scorer = default_scorer_for(str(sample.get("data_source")), style)
    except UnknownDataSourceError:
        scorer = None
    if scorer is not None:
        task = Task("", str(sample.get("data_source")), answer, ground_truth, extra_info)
        outcome = score_task(scorer, task)
        if outcome.error is None:
            return bool(outcome.fields["acc"]) if "acc" in outcome.fields else outcome.score >= 1.0
    try:
        target = whole_number(ground_truth, "ground_truth")
    except ValueError:  # not a whole number: compare the text
        return answer.strip() == str(ground_truth).strip()
    return last_integer(_TOOL_CALL_BLOCK.sub(" ", answer)) == target


class ForeignInteraction(Interaction):
    """An object of another class with verl's interaction methods (``start_interaction``,
    ``generate_response`` -> (done, text, score, metrics), ``finalize_interaction``) as an `Interaction`."""

    def __init__(self, target: Any, name: str) -> None:
        self.target, self.name = target, name

    async def start(self, instance_id: str, **interaction_kwargs: Any) -> None:
        if hasattr(self.target, "start_interaction"):
            await maybe_await(self.target.start_interaction(instance_id, **interaction_kwargs))

    async def respond(self, messages: list[dict[str, Any]], sample: dict[str, Any]) -> InteractionReply:
        kwargs = sample.get("interaction_kwargs") or {}
        done, text, score, _ = await maybe_await(
            self.target.generate_response(sample.get("instance_id"), messages, **kwargs)
        )
        return InteractionReply(None if text is None else str(text), bool(done), score)

    async def finish(self, instance_id: str) -> None:
        if hasattr(self.target, "finalize_interaction"):
            await maybe_await(self.target.finalize_interaction(instance_id))


class InteractionRouter(Interaction):
    """The interactions of a verl interaction YAML by name: a trajectory gets the one its row's
    ``interaction_kwargs["name"]`` names (verl's rule), else ``default``."""

    def __init__(self, interactions: dict[str, Interaction], default: str | None) -> None:
        self.interactions, self.default = interactions, default
        self.name = default or ""
        self._chosen: dict[str, Interaction] = {}

    def pick(self, interaction_kwargs: dict[str, Any]) -> Interaction:
        """The interaction a row's interaction_kwargs name; a ValueError naming the known ones if none."""
        name = interaction_kwargs.get("name", self.default)
        if name not in self.interactions:
            known = ", ".join(self.interactions)
            raise ValueError(
                f"interaction_kwargs name the interaction {name!r}, which the interaction file does not "
                f"define ({known}); set the rows' extra_info.interaction_kwargs.name to one of those"
            )
        return self.interactions[name]

    async def start(self, instance_id: str, **interaction_kwargs: Any) -> None:
        chosen = self._chosen[instance_id] = self.pick(interaction_kwargs)
        await chosen.start(instance_id, **interaction_kwargs)

    async def respond(self, messages: list[dict[str, Any]], sample: dict[str, Any]) -> InteractionReply:
        chosen = self._chosen.get(sample.get("instance_id")) or self.pick(
            sample.get("interaction_kwargs") or {}
        )
        return await chosen.respond(messages, sample)

    async def finish(self, instance_id: str) -> None:
        chosen = self._chosen.pop(instance_id, None)
        if chosen is not None:
            await chosen.finish(instance_id)
