"""The agent loop: multi-turn rollouts in which the model calls tools and reads their results.

One coroutine per sample (`AgentLoop.run_sample`): generate a turn on the `TurnEngine`; if the
turn holds tool calls, run them concurrently, insert their results as ``tool`` messages rendered
by the model's chat template, and generate again; stop at an answer, ``max_assistant_turns`` or the
response token budget. An optional `Interaction` (a simulated user) may answer an answer and ask
for another turn.

Per trajectory, the row's ``extra_info.tools_kwargs`` go to its tools (a `ToolSession`: stateful
tools are created on their first call with their ``create_kwargs`` and released when the trajectory
ends, on every path) and ``extra_info.interaction_kwargs`` to the interaction's ``start``. The tools'
step rewards and the interaction's turn scores are kept in the trajectory (``tool_rewards``,
``turn_scores``: verl's names), where the reward manager finds them. A row whose ``agent_name`` is
verl's ``single_turn_agent`` gets one turn without tools or interaction; ``tool_agent`` (or none)
the loop above.

A trajectory has a wall-clock limit (``trajectory_timeout_s``): one over it ends with the tokens it
has -- a turn still being generated is dropped (its vLLM request aborted), tool calls still running
are cancelled -- with finish reason ``time_limit``; it is a sample like any other, not an error. So
no tool, chain of tools or slow interaction holds a training step longer than that.

The trajectory is the exact concatenation of what the model generated (its token ids, never
decoded and re-encoded) and what the environment inserted (tokenized once). ``response_mask`` is
1 on the model's tokens and 0 on inserted ones; ``attention_mask`` is 1 on both: the model reads
the tool results, the losses only count its own tokens. The batch layout is rollout/base.py's,
with ``responses`` holding the whole trajectory after the prompt (R = the token budget) and these
per-sample columns added: ``trajectory`` (messages, tool calls and results, finish reason, final
answer: what reward functions see) and the counts the controller turns into ``agent/*`` metrics.

Inserted tokens: the chat template renders the new messages after a fixed one-exchange
conversation; the text after the assistant's end-of-turn token is what follows the model's own
stop token in a rendering of the whole conversation. So the trajectory equals what the chat
template would render for the same messages, wherever the template is prefix-stable.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tandem.batch import Batch
from tandem.models.chat_template import render_chat
from tandem.rollout.async_engine import TurnEngine, TurnRequest
from tandem.rollout.base import (
    SamplingParams,
    assemble,
    check_prompts,
    refuse_images,
    request_seed,
    sample_keys,
)
from tandem.rollout.tool_calls import ToolCall, parse_tool_calls
from tandem.tools.names import SINGLE_TURN_AGENT
from tandem.tools.stateful import ToolSession, maybe_await

FINISH_REASONS = ("answer", "max_turns", "budget", "time_limit")
# Per-sample count columns the controller reduces into agent/* metrics (trainer/metrics.py).
AGENT_COUNT_KEYS = (
    "agent_turns",
    "agent_user_turns",
    "agent_tool_calls",
    "agent_tool_errors",
    "agent_tool_timeouts",
    "agent_tool_seconds",
    "agent_generated_tokens",
    "agent_inserted_tokens",
)
AGENT_FINISH_KEY = "agent_finish"
TRAJECTORY_KEY = "trajectory"

PROBE_USER, PROBE_ASSISTANT = "ping", "pong"


@dataclass(frozen=True)
class AgentSettings:
    """Limits of one trajectory (rollout.multi_turn.* in the config)."""

    max_assistant_turns: int = 5  # model turns per trajectory
    max_user_turns: int = 0  # interaction replies per trajectory (0: the interaction is not asked)
    max_parallel_calls: int = 1  # tool calls run per turn; further calls in the turn get an error result
    tool_call_format: str = "hermes"
    trajectory_timeout_s: float | None = None  # wall-clock seconds per trajectory (None: no limit)


@dataclass
class Trajectory:
    """One sample's conversation as it grows: tokens after the prompt, masks, and what happened."""

    token_ids: list[int] = field(default_factory=list)
    model_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    user_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    tool_seconds: float = 0.0
    finish: str = "answer"
    final_answer: str = ""
    tool_rewards: list[float] = field(default_factory=list)  # step rewards of the calls, in order
    turn_scores: list[float] = field(default_factory=list)  # the interaction's score of each answer
    tool_scores: dict[str, float] = field(default_factory=dict)  # calc_reward of each stateful tool
    tool_call_errors: list[str | None] = field(default_factory=list)  # per tool message: None = it worked
    prompt_messages: int = 0  # how many of `messages` are the prompt's

    def add(self, ids: Sequence[int], *, model: bool, log_probs: Sequence[float] | None = None) -> None:
        self.token_ids.extend(ids)
        self.model_mask.extend([int(model)] * len(ids))
        self.log_probs.extend(log_probs if log_probs is not None else [0.0] * len(ids))

    def summary(self) -> dict[str, Any]:
        """What reward functions get (``extra_info["trajectory"]``)."""
        return {
            "messages": self.messages,
            "num_turns": self.turns,
            "num_user_turns": self.user_turns,
            "num_tool_calls": self.tool_calls,
            "num_tool_errors": self.tool_errors,
            "num_tool_timeouts": self.tool_timeouts,
            "finish": self.finish,
            "final_answer": self.final_answer,
            "tool_rewards": self.tool_rewards,
            "turn_scores": self.turn_scores,
            "tool_scores": self.tool_scores,
            "tool_call_errors": self.tool_call_errors,
            "num_prompt_messages": self.prompt_messages,
        }


class ChatInserter:
    """Token ids of messages the environment inserts after a model turn, rendered by the chat template.

    ``stop_token_ids`` are the ids a model turn ends with; the template must end an assistant turn
    with one of them (else the model's turn and the rendering could never line up). ``template_kwargs``
    are the template's own variables (data.chat_template_kwargs), the same the prompt was rendered with:
    with Qwen3's ``enable_thinking=False`` every next assistant turn opens with the empty think block, as
    the first one did."""

    def __init__(
        self,
        tokenizer: Any,
        stop_token_ids: Sequence[int],
        tools: list[dict] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = tools
        self.template_kwargs = dict(template_kwargs or {})
        self._probe = [
            {"role": "user", "content": PROBE_USER},
            {"role": "assistant", "content": PROBE_ASSISTANT},
        ]
        prefix = self._render(self._probe, generation_prompt=False)
        stops = [tokenizer.convert_ids_to_tokens(int(t)) for t in stop_token_ids]
        content_end = prefix.rfind(PROBE_ASSISTANT) + len(PROBE_ASSISTANT)
        ends = [(prefix.find(s, content_end), s) for s in stops if s and prefix.find(s, content_end) >= 0]
        if not ends:
            raise ValueError(
                f"the chat template does not end an assistant turn with a stop token ({', '.join(map(repr, stops))}); "
                f"it renders {prefix[content_end:]!r} after the content. A model turn ends at a stop token, so the "
                "tool results could not be placed where the template puts them: add the template's end-of-turn token "
                "to the stop ids (generation_config.json eos_token_id)"
            )
        position, stop = min(ends)
        self._cut = position + len(stop)
        self._prefix = prefix[: self._cut]

    def _render(self, messages: list[dict[str, Any]], *, generation_prompt: bool) -> str:
        return render_chat(
            self.tokenizer,
            messages,
            generation_prompt=generation_prompt,
            tools=self.tools,
            template_kwargs=self.template_kwargs,
        )

    def text(self, messages: list[dict[str, Any]]) -> str:
        """The text that follows a model turn's stop token when ``messages`` come next, up to and
        including the opening of the next assistant turn."""
        full = self._render([*self._probe, *messages], generation_prompt=True)
        if not full.startswith(self._prefix):
            raise ValueError(
                "the chat template renders an earlier assistant turn differently once more messages follow; "
                "multi-turn rollouts need a template whose rendering of a conversation starts with the rendering "
                "of its beginning"
            )
        return full[self._cut :]

    def ids(self, messages: list[dict[str, Any]]) -> list[int]:
        return list(self.tokenizer(self.text(messages), add_special_tokens=False)["input_ids"])


class AgentLoop:
    """Runs multi-turn rollouts of a prompt batch on a `TurnEngine` (see the module docstring).

    ``tools`` is a `tandem.tools.ToolSet` (or None: no tools, every turn is an answer);
    ``interaction`` a `tandem.tools.Interaction` or None; ``template_kwargs`` the chat template's variables
    the prompts were rendered with (data.chat_template_kwargs), for the inserted turns."""

    def __init__(
        self,
        tokenizer: Any,
        stop_token_ids: Sequence[int],
        *,
        settings: AgentSettings = AgentSettings(),
        tools: Any = None,
        interaction: Any = None,
        pad_token_id: int,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if settings.max_assistant_turns < 1:
            raise ValueError(f"max_assistant_turns must be >= 1, got {settings.max_assistant_turns}")
        if settings.trajectory_timeout_s is not None and not settings.trajectory_timeout_s > 0:
            raise ValueError(
                f"trajectory_timeout_s must be > 0 (or None), got {settings.trajectory_timeout_s}"
            )
        self.tokenizer = tokenizer
        self.settings = settings
        self.tools = tools
        self.interaction = interaction
        self.pad_token_id = int(pad_token_id)
        schemas = tools.schemas() if tools is not None and len(tools) else None
        # Only a loop that inserts messages needs the chat template to end turns at a stop id.
        inserts = tools is not None or (interaction is not None and settings.max_user_turns > 0)
        self.inserter = ChatInserter(tokenizer, stop_token_ids, schemas, template_kwargs) if inserts else None

    # ---------------------------------------------------------------- one sample
    async def run_sample(
        self,
        engine: TurnEngine,
        prompt_ids: list[int],
        prompt_messages: list[dict[str, Any]],
        sample: dict[str, Any],
        sampling: SamplingParams,
        seed: int | None,
    ) -> Trajectory:
        """One trajectory of at most ``sampling.max_tokens`` tokens after the prompt; the row's tools_kwargs
        and interaction_kwargs (``sample["extra_info"]``) go to its tools and interaction."""
        traj = Trajectory(messages=[dict(m) for m in prompt_messages], prompt_messages=len(prompt_messages))
        extra_info = sample.get("extra_info") if isinstance(sample.get("extra_info"), dict) else {}
        single_turn = sample.get("agent_name") == SINGLE_TURN_AGENT
        session = (
            None
            if self.tools is None or single_turn
            else ToolSession(self.tools, extra_info.get("tools_kwargs"))
        )
        interaction = None if single_turn else self.interaction
        kwargs = extra_info.get("interaction_kwargs")
        kwargs = dict(kwargs) if isinstance(kwargs, dict) else {}
        sample = {**sample, "instance_id": uuid.uuid4().hex, "interaction_kwargs": kwargs}
        try:
            if hasattr(interaction, "start"):  # an interaction of respond() alone works too
                await maybe_await(interaction.start(sample["instance_id"], **kwargs))
            deadline = asyncio.timeout(self.settings.trajectory_timeout_s)
            try:
                async with deadline:
                    await self._turns(engine, prompt_ids, traj, session, interaction, sample, sampling, seed)
            except TimeoutError:
                if not deadline.expired():  # not the trajectory's limit
                    raise
                traj.finish = "time_limit"
        finally:  # answered, failed or cancelled: the tools' and the interaction's state is released
            try:
                if session is not None:
                    traj.tool_scores = await session.close()
            finally:
                if hasattr(interaction, "finish"):
                    await maybe_await(interaction.finish(sample["instance_id"]))
        return traj

    async def _turns(
        self,
        engine: TurnEngine,
        prompt_ids: list[int],
        traj: Trajectory,
        session: ToolSession | None,
        interaction: Any,
        sample: dict[str, Any],
        sampling: SamplingParams,
        seed: int | None,
    ) -> None:
        """Generate, run tools, ask the interaction, until the trajectory ends (see the module docstring)."""
        budget = sampling.max_tokens
        while True:
            remaining = budget - len(traj.token_ids)
            if remaining <= 0:
                traj.finish = "budget"
                break
            turn_seed = None if seed is None else (seed if traj.turns == 0 else _turn_seed(seed, traj.turns))
            out = await engine.generate(
                TurnRequest(
                    [*prompt_ids, *traj.token_ids],
                    remaining,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    top_k=sampling.top_k,
                    seed=turn_seed,
                )
            )
            traj.turns += 1
            traj.add(out.token_ids, model=True, log_probs=out.log_probs)
            text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
            calls = parse_tool_calls(text, self.settings.tool_call_format) if session is not None else []
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = [c.as_message_entry() for c in calls if c.error is None]
            traj.messages.append(message)
            if out.finish == "length":
                traj.final_answer = text
                traj.finish = "budget"
                break
            if calls:
                if traj.turns >= self.settings.max_assistant_turns:
                    traj.finish = "max_turns"
                    break
                inserted = await self._run_tools(calls, traj, session)
            else:
                traj.final_answer = text
                reply = await self._ask_interaction(traj, interaction, sample)
                if reply is None:
                    traj.finish = "answer"
                    break
                if traj.turns >= self.settings.max_assistant_turns:
                    traj.finish = "max_turns"
                    break
                inserted = [{"role": "user", "content": reply}]
            traj.messages.extend(inserted)
            assert self.inserter is not None  # built whenever tools or an interaction can insert
            ids = self.inserter.ids(inserted)
            if len(traj.token_ids) + len(ids) >= budget:  # no room to insert and still let the model answer
                traj.finish = "budget"
                break
            traj.add(ids, model=False)
            traj.user_turns += not calls

    async def _run_tools(
        self, calls: list[ToolCall], traj: Trajectory, session: ToolSession
    ) -> list[dict[str, Any]]:
        """Run the turn's calls concurrently; every call gets a tool message, errors included."""
        limit = self.settings.max_parallel_calls
        runnable = [c for c in calls[:limit] if c.error is None]
        results = iter(await asyncio.gather(*(session.run(c.name, c.arguments) for c in runnable)))
        messages = []
        for i, call in enumerate(calls):
            traj.tool_calls += 1
            if i >= limit:
                text, error, seconds = (
                    f"error: at most {limit} tool call(s) per turn; this one was not run",
                    "limit",
                    0.0,
                )
            elif call.error is not None:
                text, error, seconds = f"error: {call.error}", "bad_call", 0.0
            else:
                result = next(results)
                text, error, seconds = result.text, result.error, result.seconds
                if result.reward is not None:
                    traj.tool_rewards.append(result.reward)
            traj.tool_errors += error is not None
            traj.tool_call_errors.append(error)
            traj.tool_timeouts += error == "timeout"
            traj.tool_seconds += seconds
            message = {"role": "tool", "content": text}
            if call.name:
                message["name"] = call.name
            messages.append(message)
        return messages

    async def _ask_interaction(
        self, traj: Trajectory, interaction: Any, sample: dict[str, Any]
    ) -> str | None:
        """The interaction's next user message, or None when the conversation ends here."""
        if interaction is None or traj.user_turns >= self.settings.max_user_turns:
            return None
        reply = await interaction.respond(traj.messages, sample)
        score = getattr(reply, "score", None)
        if score is not None:
            traj.turn_scores.append(float(score))
        return None if reply.done or reply.text is None else reply.text

    # ---------------------------------------------------------------- a batch
    def generate(self, engine_factory: Any, prompts: Batch, sampling: SamplingParams) -> Batch:
        """``sampling.n`` trajectories per prompt, in the layout of the module docstring.

        ``engine_factory()`` builds the `TurnEngine` inside the event loop that runs the samples.
        Samples are seeded as the synchronous vLLM path seeds them (`rows`), so a run with no tools
        gives the same tokens as that path."""
        refuse_images(prompts, "the agent loop (rollout.mode=async)")
        return asyncio.run(self.generate_async(engine_factory, prompts, sampling))

    async def generate_async(self, engine_factory: Any, prompts: Batch, sampling: SamplingParams) -> Batch:
        start = time.perf_counter()
        engine = engine_factory()
        prompt_ids, prompt_mask = check_prompts(prompts, "AgentLoop")
        jobs = [
            self.run_sample(engine, ids, messages, sample, sampling, seed)
            for ids, messages, sample, seeds in self.rows(prompts, prompt_ids, prompt_mask, sampling)
            for seed in seeds
        ]
        trajectories = await asyncio.gather(*jobs)
        return self.assemble(prompts, prompt_ids, prompt_mask, trajectories, sampling, engine, start)

    def rows(
        self, prompts: Batch, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, sampling: SamplingParams
    ) -> list[tuple[list[int], list[dict[str, Any]], dict[str, Any], list[int | None]]]:
        """Per prompt: its token ids (padding removed), its messages, what reward functions and
        interactions read of it, and the seeds of its ``sampling.n`` samples. ``prompt_ids`` and
        ``prompt_mask`` are what `check_prompts` returned for ``prompts``. Sample j of a prompt is
        seeded as the synchronous vLLM path seeds it (its request seed + j)."""
        n = sampling.n
        keys = sample_keys(prompts, n)[::n]
        raw = prompts.get("raw_prompt")
        out = []
        for row in range(len(prompts)):
            ids = prompt_ids[row][prompt_mask[row].bool()].tolist()
            messages = list(raw[row]) if raw is not None and isinstance(raw[row], list | np.ndarray) else []
            sample = {
                key: (prompts[key][row] if key in prompts else None)
                for key in ("ground_truth", "data_source", "extra_info", "agent_name")
            }
            base = None if sampling.seed is None else request_seed(sampling.seed, int(keys[row]))
            out.append((ids, messages, sample, [None if base is None else base + j for j in range(n)]))
        return out

    def assemble(
        self,
        prompts: Batch,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        trajectories: list[Trajectory],
        sampling: SamplingParams,
        engine: Any,
        start: float,
    ) -> Batch:
        n, width = sampling.n, sampling.max_tokens
        rows = prompts.repeat(n, interleave=True)
        total = len(rows)
        responses = torch.full((total, width), self.pad_token_id, dtype=torch.long)
        response_mask = torch.zeros((total, width), dtype=torch.long)
        trajectory_mask = torch.zeros((total, width), dtype=torch.long)
        log_probs = torch.zeros((total, width), dtype=torch.float32)
        for i, traj in enumerate(trajectories):
            length = len(traj.token_ids)
            responses[i, :length] = torch.tensor(traj.token_ids, dtype=torch.long)
            response_mask[i, :length] = torch.tensor(traj.model_mask, dtype=torch.long)
            trajectory_mask[i, :length] = 1
            log_probs[i, :length] = torch.tensor(traj.log_probs, dtype=torch.float32)
        counts = {
            "agent_turns": [t.turns for t in trajectories],
            "agent_user_turns": [t.user_turns for t in trajectories],
            "agent_tool_calls": [t.tool_calls for t in trajectories],
            "agent_tool_errors": [t.tool_errors for t in trajectories],
            "agent_tool_timeouts": [t.tool_timeouts for t in trajectories],
            "agent_tool_seconds": [t.tool_seconds for t in trajectories],
            "agent_generated_tokens": [sum(t.model_mask) for t in trajectories],
            "agent_inserted_tokens": [len(t.model_mask) - sum(t.model_mask) for t in trajectories],
        }
        for key, values in counts.items():
            rows[key] = torch.tensor(values, dtype=torch.float32)
        rows[AGENT_FINISH_KEY] = np.array([t.finish for t in trajectories], dtype=object)
        rows[TRAJECTORY_KEY] = np.array([t.summary() for t in trajectories], dtype=object)
        metrics = {
            "engine_steps": float(getattr(engine, "steps", 0)),
            "max_in_flight": float(getattr(engine, "max_in_flight", 0)),
        }
        return assemble(
            rows,
            prompt_ids.repeat_interleave(n, dim=0),
            prompt_mask.repeat_interleave(n, dim=0),
            responses,
            response_mask,
            log_probs,
            time.perf_counter() - start,
            trajectory_mask=trajectory_mask,
            **metrics,
        )


def _turn_seed(seed: int, turn: int) -> int:
    """The seed of a later turn of a sample: a different stream per turn, fixed by the sample's seed."""
    return (seed * 1_000_003 + 7919 * turn) % (2**31 - 1)


# What loading a tool or interaction file raises for the file's own faults (each message names the file).
TOOL_FILE_ERRORS = (ValueError, TypeError, ImportError, AttributeError, OSError)


def toolset_from_config(m: Any) -> Any:
    """The `tandem.tools.ToolSet` of ``rollout.multi_turn`` (``m``), or None when it names no tools; a file
    that cannot be used is a ConfigError naming it."""
    if not (m.tools or m.tool_file):
        return None
    from tandem.config.errors import ConfigError
    from tandem.tools import build_toolset

    try:
        return build_toolset(
            m.tools,
            m.tool_file,
            timeout_s=m.tool_timeout_s,
            max_result_chars=m.max_tool_response_length,
            truncate_side=m.tool_response_truncate_side,
        )
    except TOOL_FILE_ERRORS as error:
        raise ConfigError(str(error)) from None


def interaction_from_config(m: Any) -> Any:
    """The `tandem.tools.Interaction` of ``rollout.multi_turn`` (``m``), or None; a file that cannot be used
    is a ConfigError naming it."""
    from tandem.config.errors import ConfigError
    from tandem.tools import build_interaction

    try:
        return build_interaction(m.interaction, m.interaction_file)
    except TOOL_FILE_ERRORS as error:
        raise ConfigError(str(error)) from None


def tool_schemas(m: Any) -> list[dict] | None:
    """The OpenAI-style schemas of ``rollout.multi_turn``'s tools, as prompts declare them (None: no
    tools). The data of RL and of SFT render them the same way, so a warm start sees the prompts RL
    will see."""
    tools = toolset_from_config(m)
    return tools.schemas() if tools is not None and len(tools) else None
