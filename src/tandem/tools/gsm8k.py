"""Tandem's ports of verl's GSM8K tool and interaction, which verl's YAML files name by class
(``verl.tools.gsm8k_tool.Gsm8kTool``, ``verl.interactions.gsm8k_interaction.Gsm8kInteraction``).

Same names, schema (from the YAML), answer checks and rewards as verl's (the texts the model reads
are Tandem's own words, with the same facts: the parsed answer and its reward); the
answer is read by Tandem's GSM8K scorer (tandem/rewards/scorers/gsm8k.py) in the mode verl uses
for each, spelt out here rather than left to the scorer's default:

- the tool is lenient (verl's ``flexible``): the last number of the answer counts;
- the interaction is strict (verl's ``strict``): only a number after ``####`` counts.

A number is right when it equals the ground truth's as a number (verl compares the strings, so
"72.0" is wrong there and right here).
"""

from __future__ import annotations

import asyncio
from typing import Any

from tandem.tools.interaction import Interaction, InteractionReply
from tandem.tools.stateful import StatefulTool

ANSWER_MARK = "####"
# The schema when the YAML entry gives none (verl's example YAML gives this name).
GSM8K_TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calc_gsm8k_reward",
        "description": "Scores a GSM8K answer: 1.0 if it is correct, else 0.0.",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "The final answer, a number"}},
            "required": ["answer"],
        },
    },
}
NOT_IMPROVED_PENALTY = -0.05  # verl's step reward for an answer that scores no better than the last one
INCORRECT_REPLY = "That answer is wrong. Check your work and answer again."


def gsm8k_answer_score(text: str, ground_truth: Any, *, method: str) -> float:
    """1.0 when the answer in `text` equals `ground_truth` by the GSM8K scorer's `method` (verl's tool reads
    ``flexible``, its interaction ``strict``), else 0.0; no ground truth: 0.0."""
    from tandem.rewards.scorers.gsm8k import extract_gsm8k_answer, gsm8k_score

    if ground_truth is None or extract_gsm8k_answer(str(ground_truth)) is None:
        return 0.0
    return gsm8k_score("openai/gsm8k", text, ground_truth, method=method)["score"]


class Gsm8kTool(StatefulTool):
    """The model submits an answer; the tool says how it scored. Step reward (verl's rule): 0.0 when
    the answer scores higher than the instance's previous answer (the first scores against 0.0),
    else -0.05 (a repeated or a wrong answer). ``calc_reward``: the last answer's score.

    ``create_kwargs``: ``ground_truth`` (the row's tools_kwargs[name]["create_kwargs"])."""

    def __init__(
        self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None
    ) -> None:
        super().__init__(config, tool_schema or GSM8K_TOOL_SCHEMA)
        self.instances: dict[str, dict[str, Any]] = {}

    async def create(self, instance_id: str, ground_truth: Any = None, **create_kwargs: Any) -> None:
        self.instances[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **execute_kwargs: Any
    ) -> tuple[str, float, dict]:
        state = self.instances[instance_id]
        answer = str(parameters.get("answer", ""))
        state["response"] = answer if answer.startswith(f"{ANSWER_MARK} ") else f"{ANSWER_MARK} {answer}"
        reward = await self.calc_reward(instance_id)
        step_reward = 0.0 if reward > state["reward"] else NOT_IMPROVED_PENALTY
        state["reward"] = reward
        return f"parsed answer {answer!r}: reward {reward}", step_reward, {}

    async def calc_reward(self, instance_id: str, **calc_reward_kwargs: Any) -> float:
        state = self.instances[instance_id]
        return gsm8k_answer_score(state["response"], state["ground_truth"], method="flexible")

    async def release(self, instance_id: str, **release_kwargs: Any) -> None:
        self.instances.pop(instance_id, None)


class Gsm8kInteraction(Interaction):
    """A user who says whether the last answer is right (strict: ``#### N``) and, if not, asks the
    model to reflect and try again; the turn's score is the answer's (1.0 or 0.0).

    ``interaction_kwargs``: ``ground_truth`` (the row's extra_info.interaction_kwargs). verl also
    inserts "correct" as a last user message before it stops; here a right answer ends the
    conversation at once (that message would be masked out of every loss anyway)."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = dict(config or {})
        self.name = self.config.get("name", "gsm8k")
        self.instances: dict[str, Any] = {}

    async def start(self, instance_id: str, ground_truth: Any = None, **interaction_kwargs: Any) -> None:
        self.instances[instance_id] = ground_truth

    async def respond(self, messages: list[dict[str, Any]], sample: dict[str, Any]) -> InteractionReply:
        answer = next(
            (m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), ""
        )
        ground_truth = self.instances.get(sample.get("instance_id"))
        score = await asyncio.to_thread(gsm8k_answer_score, str(answer), ground_truth, method="strict")
        if score == 1.0:
            return InteractionReply(None, True, score)
        return InteractionReply(INCORRECT_REPLY, False, score)

    async def finish(self, instance_id: str) -> None:
        self.instances.pop(instance_id, None)
