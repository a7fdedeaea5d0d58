"""Asynchronous generation: one awaitable request per turn, continuously batched by vLLM.

The agent loop (agent.py) runs one coroutine per sample; each awaits `TurnEngine.generate` for
its next turn while other samples run tools or wait for theirs. `VLLMTurnEngine` adds every
request to vLLM's engine as soon as it is awaited and steps the engine while any are in flight,
so a sample's second turn joins the running batch at the next step instead of waiting for the
slowest sample of the first turn (continuous batching).

Why vLLM's incremental engine (`LLMEngine.add_request` / `step`) and not its `AsyncLLM`: in vLLM
0.32 `AsyncLLM` always runs the engine core in a separate process, so the trainer's weights would
have to cross a process boundary at every sync (its IPC weight transfer is CUDA-only). Driving the
in-process engine from an asyncio loop keeps what `VLLMRollout` has (weights streamed by reference,
one engine per worker, no copy on disk) and gives the same scheduling: `AsyncLLM`'s own output
loop does exactly this add / step / dispatch, one process away. Token ids go in and come out;
nothing the model wrote is decoded and re-encoded.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def vllm_sampling(*, stop_token_ids: Sequence[int], seed: int | None, **kwargs: Any) -> Any:
    """vLLM's SamplingParams as both rollout paths ask for them: token ids out (no detokenizing), the
    sampled token's log-prob, stop at ``stop_token_ids`` only. One place, so that the agent loop and
    the synchronous generate sample the same tokens from the same seeds."""
    from vllm import SamplingParams

    return SamplingParams(
        stop_token_ids=list(stop_token_ids),
        ignore_eos=False,
        logprobs=0,
        seed=seed,
        detokenize=False,
        skip_special_tokens=False,
        **kwargs,
    )


@dataclass(frozen=True)
class TurnRequest:
    """One turn to generate: the whole context so far as token ids, and how to sample."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None


@dataclass(frozen=True)
class TurnOutput:
    """The turn's token ids with their sampling log-probs; ``finish``: "stop" or "length"."""

    token_ids: list[int]
    log_probs: list[float]
    finish: str
    seconds: float


class TurnEngine(ABC):
    """Generates one turn per awaited call; many calls may be in flight at once."""

    @abstractmethod
    async def generate(self, request: TurnRequest) -> TurnOutput:
        """Sample one continuation of ``request.prompt_ids`` (stopping at the engine's stop ids)."""


class VLLMTurnEngine(TurnEngine):
    """`TurnEngine` over the vLLM engine a `VLLMRollout` holds (in this process; see the docstring).

    ``stop_token_ids`` end a turn; ``max_model_len`` bounds context + turn. Create one per event
    loop (the engine's pump task belongs to the loop that first awaits `generate`)."""

    def __init__(
        self, llm: Any, stop_token_ids: Sequence[int], max_model_len: int, lora_request: Any = None
    ) -> None:
        self._engine = llm.llm_engine
        self.lora_request = lora_request  # the LoRA adapters every turn is generated with (None: the base)
        self.stop_token_ids = [int(t) for t in stop_token_ids]
        self.max_model_len = max_model_len
        self._pending: dict[str, tuple[asyncio.Future[TurnOutput], float]] = {}
        self._ids = itertools.count()
        self._pump: asyncio.Task[None] | None = None
        self.steps = 0  # engine steps taken: with continuous batching, about the longest chain of turns
        self.max_in_flight = 0  # the most requests the engine held at once

    async def generate(self, request: TurnRequest) -> TurnOutput:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if len(request.prompt_ids) + request.max_tokens > self.max_model_len:
            raise ValueError(
                f"a turn's context of {len(request.prompt_ids)} tokens + max_tokens={request.max_tokens} exceeds "
                f"the engine's max_model_len={self.max_model_len}"
            )
        params = vllm_sampling(
            n=1,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            max_tokens=request.max_tokens,
            stop_token_ids=self.stop_token_ids,
            seed=request.seed,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        request_id = f"turn-{next(self._ids)}"
        future: asyncio.Future[TurnOutput] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = (future, time.perf_counter())
        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_ids))
        self._engine.add_request(request_id, prompt, params, lora_request=self.lora_request)
        self.max_in_flight = max(self.max_in_flight, len(self._pending))
        if self._pump is None or self._pump.done():
            self._pump = asyncio.get_running_loop().create_task(self._run())
        try:
            return await future
        except asyncio.CancelledError:  # its trajectory ended (a time limit): vLLM stops generating it
            if self._pending.pop(request_id, None) is not None:
                self._engine.abort_request([request_id])
            raise

    async def _run(self) -> None:
        """Step the engine while requests are in flight, handing each finished one to its awaiter."""
        try:
            while self._pending:
                for output in self._engine.step():
                    if not output.finished:
                        continue
                    future, started = self._pending.pop(output.request_id)
                    completion = output.outputs[0]
                    tokens = list(completion.token_ids)
                    log_probs = [
                        entry[token].logprob for entry, token in zip(completion.logprobs, tokens, strict=True)
                    ]
                    finish = "length" if completion.finish_reason == "length" else "stop"
                    if not future.done():
                        future.set_result(
                            TurnOutput(tokens, log_probs, finish, time.perf_counter() - started)
                        )
                self.steps += 1
                await asyncio.sleep(0)  # let finished samples run their tools and queue their next turn
        except BaseException as error:  # an engine failure reaches every awaiting sample, not a silent hang
            pending, self._pending = self._pending, {}
            self._engine.abort_request(list(pending))
            for future, _ in pending.values():
                if not future.done():
                    future.set_exception(error if isinstance(error, Exception) else RuntimeError(repr(error)))
            if not isinstance(error, Exception):
                raise
