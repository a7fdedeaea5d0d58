"""VLLMTurnEngine's scheduling on a fake vLLM engine (no model): a request that needs one step
finishes while a long one is still running, and an engine failure reaches every awaiting turn."""

import asyncio
from types import SimpleNamespace

import pytest

from tandem.rollout.async_engine import TurnOutput, TurnRequest, VLLMTurnEngine

# generate() builds vLLM's own request objects: import them once, at collection
pytest.importorskip("vllm.inputs")
pytest.importorskip("vllm.sampling_params")


class FakeEngine:
    """The part of vLLM's LLMEngine that VLLMTurnEngine uses. A request whose prompt is [k] needs k
    steps; it then yields tokens [k, k + 1] with log-probs [-k, -k / 2] (finish "stop"), or, when
    k >= max_tokens, finish "length". ``fail_at`` makes that step raise; ``after_step[s]()`` runs at
    the end of step s (a caller that submits work there is served from step s + 1 on)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.steps = 0
        self.fail_at = fail_at
        self.after_step: dict = {}
        self.running: dict[str, list[int]] = {}  # request id -> [steps left, k, max_tokens]
        self.added_at: dict[str, int] = {}
        self.finished_at: dict[str, int] = {}
        self.aborted: list[str] = []

    def add_request(
        self, request_id, prompt, params, lora_request=None
    ) -> None:  # vLLM's LLMEngine signature
        k = prompt["prompt_token_ids"][0]
        self.running[request_id] = [k, k, params.max_tokens]
        self.added_at[request_id] = self.steps

    def step(self) -> list:
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError("engine died")
        outputs = []
        for request_id, state in list(self.running.items()):
            state[0] -= 1
            finished = state[0] == 0
            k, max_tokens = state[1], state[2]
            tokens = [k, k + 1]
            logprobs = [{t: SimpleNamespace(logprob=lp)} for t, lp in zip(tokens, (-k, -k / 2))]
            completion = SimpleNamespace(
                token_ids=tokens if finished else [],
                logprobs=logprobs if finished else [],
                finish_reason=("length" if k >= max_tokens else "stop") if finished else None,
            )
            outputs.append(SimpleNamespace(request_id=request_id, finished=finished, outputs=[completion]))
            if finished:
                del self.running[request_id]
                self.finished_at[request_id] = self.steps
        if self.steps in self.after_step:
            self.after_step[self.steps]()
        return outputs

    def abort_request(self, request_ids) -> None:
        self.aborted.extend(request_ids)
        for request_id in request_ids:
            self.running.pop(request_id, None)


def turn_engine(fake: FakeEngine) -> VLLMTurnEngine:
    return VLLMTurnEngine(SimpleNamespace(llm_engine=fake), stop_token_ids=[3], max_model_len=64)


def test_a_short_request_added_mid_flight_finishes_before_a_long_one():
    fake = FakeEngine()
    engine = turn_engine(fake)

    async def timed(request: TurnRequest) -> tuple[TurnOutput, int]:
        output = await engine.generate(request)
        return output, fake.steps  # the engine step at which this turn's awaiter got its result

    async def main():
        short: list[asyncio.Task] = []
        # B is submitted once A has taken its first step, from inside the engine's step loop
        fake.after_step[1] = lambda: short.append(asyncio.create_task(timed(TurnRequest([1], max_tokens=8))))
        long_turn = asyncio.create_task(timed(TurnRequest([5], max_tokens=8)))
        while not short:
            await asyncio.sleep(0)
        done_order = []
        for task in asyncio.as_completed([long_turn, short[0]]):
            done_order.append(await task)
        return done_order, await long_turn, await short[0]

    done_order, (a, a_step), (b, b_step) = asyncio.run(asyncio.wait_for(main(), timeout=5))
    assert fake.added_at == {"turn-0": 0, "turn-1": 1}  # B joined while A was running
    assert fake.finished_at == {"turn-1": 2, "turn-0": 5}
    assert done_order[0][0] is b  # B's awaiter got its result first ...
    assert b_step == 2 and a_step == 5 and b_step < a_step  # ... at step 2, not after A's 5 steps
    assert engine.max_in_flight == 2
    assert engine.steps == 5
    assert (b.token_ids, b.log_probs, b.finish) == ([1, 2], [-1.0, -0.5], "stop")
    assert (a.token_ids, a.log_probs, a.finish) == ([5, 6], [-5.0, -2.5], "stop")
    assert fake.aborted == []


def test_finish_reason_length_is_reported_as_length():
    fake = FakeEngine()
    out = asyncio.run(asyncio.wait_for(turn_engine(fake).generate(TurnRequest([2], max_tokens=2)), 5))
    assert (out.token_ids, out.finish) == ([2, 3], "length")


def test_an_engine_step_that_raises_fails_every_awaiting_turn():
    fake = FakeEngine(fail_at=2)
    engine = turn_engine(fake)

    async def main():
        turns = [engine.generate(TurnRequest([k], max_tokens=8)) for k in (3, 4, 5)]
        return await asyncio.gather(*turns, return_exceptions=True)

    # wait_for: a turn left waiting on a future nobody will set fails the test instead of hanging it
    results = asyncio.run(asyncio.wait_for(main(), timeout=5))
    assert [type(r) for r in results] == [RuntimeError] * 3
    assert [str(r) for r in results] == ["engine died"] * 3
    assert sorted(fake.aborted) == ["turn-0", "turn-1", "turn-2"]  # the engine does not keep them running
    assert engine._pending == {}


def test_a_turn_longer_than_the_engine_allows_is_an_error_naming_the_limit():
    engine = turn_engine(FakeEngine())
    with pytest.raises(ValueError, match="60 tokens \\+ max_tokens=8 exceeds the engine's max_model_len=64"):
        asyncio.run(engine.generate(TurnRequest([1] * 60, max_tokens=8)))
