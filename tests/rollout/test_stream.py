"""The rollout stream of trainer.async_mode=streaming: groups come back as they finish (a short group
is not held up by a long one), a failure reaches the controller, streamed groups equal the batch
generate, and a weight update waits for the turns in flight and tags every sample with its version."""

import asyncio
import time

import pytest
import torch

from tandem.batch import Batch
from tandem.models.tiny import save_tiny
from tandem.rollout import PROMPT_INDEX, SamplingParams
from tandem.rollout.agent import AgentLoop
from tandem.rollout.async_engine import TurnEngine, TurnOutput, TurnRequest
from tandem.rollout.stream import VERSION_KEY, VERSION_MAX_KEY, RolloutStream

from .conftest import make_prompts
from .test_vllm import SAMPLED, TINY_VLLM, TOLERANCE, recomputed, start


class SleepyModel(TurnEngine):
    """Answers a context with 3 tokens after a delay chosen by the context's length: the prompt picks
    its group's duration. ``fail`` makes every turn raise."""

    def __init__(self, delays: dict[int, float], fail: bool = False):
        self.delays, self.fail = delays, fail

    async def generate(self, request: TurnRequest) -> TurnOutput:
        await asyncio.sleep(self.delays.get(len(request.prompt_ids), 0.0))
        if self.fail:
            raise ValueError("the engine broke")
        return TurnOutput([5, 6, 2], [-0.5, -0.25, -0.125], "stop", 0.0)


def indexed(prompts: Batch) -> Batch:
    prompts[PROMPT_INDEX] = torch.arange(len(prompts))
    return prompts


def collect_all(stream: RolloutStream, groups: int) -> list[Batch]:
    got: list[Batch] = []
    while len(got) < groups:
        ready, _ = stream.collect(groups - len(got), timeout_s=60)
        got += ready
    return got


def test_a_short_group_is_not_held_up_by_a_long_one(tokenizer):
    prompts = indexed(make_prompts(tokenizer, ["1+2=", "13+45="]))
    lengths = prompts["attention_mask"].sum(-1).tolist()
    assert lengths[0] != lengths[1]
    stream = RolloutStream(
        AgentLoop(tokenizer, [2], pad_token_id=tokenizer.pad_token_id),
        SleepyModel({lengths[0]: 1.0, lengths[1]: 0.0}),
    )
    try:
        stream.submit(prompts, SamplingParams(max_tokens=4, n=2, temperature=1.0))
        first, info = stream.collect(1, timeout_s=30)
        assert len(first) == 1 and info["groups_in_flight"] == 1  # the long group is still generating
        assert first[0][PROMPT_INDEX].tolist() == [1, 1]  # the group submitted second, finished first
        assert first[0]["responses"][:, :3].tolist() == [[5, 6, 2]] * 2
        assert first[0][VERSION_KEY].tolist() == [0, 0]
        (second,) = collect_all(stream, 1)
        assert second[PROMPT_INDEX].tolist() == [0, 0]
        assert stream.collect(1, timeout_s=0.1)[0] == []  # nothing in flight: returns at once
    finally:
        stream.close()


def test_a_failing_group_is_an_error_at_the_next_collect(tokenizer):
    stream = RolloutStream(
        AgentLoop(tokenizer, [2], pad_token_id=tokenizer.pad_token_id), SleepyModel({}, fail=True)
    )
    try:
        stream.submit(indexed(make_prompts(tokenizer, ["1+2="])), SamplingParams(max_tokens=4, n=2))
        with pytest.raises(
            RuntimeError, match="a prompt group failed in the rollout stream.*the engine broke"
        ):
            stream.collect(1, timeout_s=30)
    finally:
        stream.close()


# ---------------------------------------------------------------- on vLLM


@pytest.fixture(scope="module")
def vllm_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("stream") / "model", **TINY_VLLM)


@pytest.mark.slow  # starts a vLLM engine
def test_on_vllm_groups_equal_the_batch_and_an_update_drains_the_turns_in_flight(tokenizer, vllm_dir):
    from transformers import AutoModelForCausalLM

    engine = start(vllm_dir)
    loop = AgentLoop(tokenizer, engine.eos_token_ids, pad_token_id=tokenizer.pad_token_id)
    expected = loop.generate(engine.turn_engine, indexed(make_prompts(tokenizer)), SAMPLED)
    stream = RolloutStream(loop, engine.turn_engine())
    try:
        stream.submit(indexed(make_prompts(tokenizer)), SAMPLED)
        groups = sorted(collect_all(stream, 3), key=lambda g: int(g[PROMPT_INDEX][0]))
        out = Batch.concat(groups, meta="first")
        assert torch.equal(out["responses"], expected["responses"])
        assert torch.equal(out["response_mask"], expected["response_mask"])
        assert (out["rollout_log_probs"] - expected["rollout_log_probs"]).abs().max() < 1e-5
        assert out[VERSION_KEY].tolist() == [0] * 9

        # New weights while long samples are in flight: the update waits for their turns to end.
        old = AutoModelForCausalLM.from_pretrained(vllm_dir, dtype=torch.float32).eval()
        new = AutoModelForCausalLM.from_pretrained(vllm_dir, dtype=torch.float32).eval()
        with torch.no_grad():
            for p in new.parameters():
                p.add_(0.05 * torch.randn_like(p))
        long = SamplingParams(max_tokens=40, n=4, temperature=1.0, seed=7)
        stream.submit(indexed(make_prompts(tokenizer)), long)
        deadline = time.monotonic() + 60
        while stream._turns_in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        seen = []

        def load():
            seen.append(stream._turns_in_flight)
            engine.update_weights((name, p.detach()) for name, p in new.named_parameters())

        times = stream.update_weights(load, version=1)
        assert seen == [0] and times["drain_s"] > 0
        stream.submit(indexed(make_prompts(tokenizer)), long)  # all of these start after the update
        out = Batch.concat(collect_all(stream, 6), meta="first")
        versions = out[VERSION_KEY]
        assert torch.equal(versions, out[VERSION_MAX_KEY])  # single turn: one version per sample
        assert (versions == 0).any() and (versions == 1).sum() >= 12
        for version, model in ((0, old), (1, new)):
            rows = torch.nonzero(versions == version).flatten()
            part = out.reorder(rows)
            with torch.no_grad():
                diff = (recomputed(model, part, long.temperature) - part["rollout_log_probs"]).abs().max()
            assert float(diff) < TOLERANCE, version  # every token sampled by the weights of its version
    finally:
        stream.close()
