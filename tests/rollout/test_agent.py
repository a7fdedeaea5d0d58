"""The agent loop on vLLM's continuously batched engine: parity with the synchronous path, masks
of multi-turn trajectories against a hand-built conversation, and rollout log-probs of model
tokens against the trainer's recomputation."""

from dataclasses import dataclass

import pytest
import torch

from tandem.models.tiny import IM_END, save_tiny
from tandem.rollout import SamplingParams
from tandem.rollout.agent import AgentLoop, AgentSettings
from tandem.rollout.async_engine import TurnEngine, TurnOutput, TurnRequest
from tandem.tools import ToolSet, build_toolset, tool

from .conftest import make_prompts
from .test_vllm import SAMPLED, TINY_VLLM, recomputed, start

pytestmark = pytest.mark.slow  # starts a vLLM engine (seconds)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("agent") / "model", **TINY_VLLM)


@pytest.fixture(scope="module")
def engine(tiny_dir, tokenizer):
    """An engine that stops at <|im_end|> as well as EOS: the tiny chat template ends turns with it."""
    stops = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)]
    return start(tiny_dir, eos_token_ids=stops, pad_token_id=tokenizer.pad_token_id)


def test_single_turn_without_tools_equals_the_synchronous_generate(engine, tokenizer):
    prompts = make_prompts(tokenizer)
    expected = engine.generate(prompts, SAMPLED)
    loop = AgentLoop(tokenizer, engine.eos_token_ids, pad_token_id=tokenizer.pad_token_id)
    out = loop.generate(engine.turn_engine, make_prompts(tokenizer), SAMPLED)
    assert torch.equal(out["responses"], expected["responses"])
    assert torch.equal(out["response_mask"], expected["response_mask"])
    assert torch.equal(out["attention_mask"], expected["attention_mask"])
    assert (out["rollout_log_probs"] - expected["rollout_log_probs"]).abs().max() < 1e-5
    assert out["agent_turns"].tolist() == [1.0] * len(out)
    assert out["agent_inserted_tokens"].sum() == 0


# ---------------------------------------------------------------- multi-turn


class ScriptedModel(TurnEngine):
    """Stands in for the model where a test needs chosen turns (a random tiny model never calls a
    tool): returns the given texts, tokenized, followed by <|im_end|>, with log-prob -1 per token."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.contexts = tokenizer, list(turns), []

    async def generate(self, request: TurnRequest) -> TurnOutput:
        self.contexts.append(list(request.prompt_ids))
        text = self.turns.pop(0)
        ids = [
            *self.tokenizer(text, add_special_tokens=False)["input_ids"],
            self.tokenizer.convert_tokens_to_ids(IM_END),
        ]
        ids = ids[: request.max_tokens]
        finish = "stop" if len(ids) < request.max_tokens or ids[-1] == 3 else "length"
        return TurnOutput(ids, [-1.0] * len(ids), finish, 0.0)


@dataclass(frozen=True)
class Reply:
    text: str | None
    done: bool


class AlwaysTryAgain:
    """A user who asks for another answer every time (the masks and log-probs are what is tested)."""

    name = "always_try_again"

    async def respond(self, messages, sample):
        return Reply("Try again", False)


CALL = '<tool_call>{"name":"calculator","arguments":{"expression":"12*34"}}</tool_call>'


def stops(tokenizer):
    return [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)]


def one_prompt(tokenizer, text="12*34"):
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    batch = make_prompts(tokenizer, [text])
    ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    batch["input_ids"] = torch.tensor([ids])
    batch["attention_mask"] = torch.ones(1, len(ids), dtype=torch.long)
    batch["position_ids"] = torch.arange(len(ids))[None]
    return batch


def tool_loop(tokenizer, tools=None, **settings):
    """An agent loop over the calculator (or ``tools``), with the tiny template's stop ids."""
    return AgentLoop(
        tokenizer,
        stops(tokenizer),
        settings=AgentSettings(**settings),
        tools=tools or build_toolset(["calculator"]),
        pad_token_id=tokenizer.pad_token_id,
    )


def test_tool_turn_masks_equal_a_hand_built_conversation(tokenizer):
    model = ScriptedModel(tokenizer, [CALL, "408"])
    loop = tool_loop(tokenizer, max_assistant_turns=3)
    out = loop.generate(lambda: model, one_prompt(tokenizer), SamplingParams(max_tokens=160))
    response = out["responses"][0][out["attention_mask"][0, -160:].bool()].tolist()
    # What the chat template renders for the same conversation: the trajectory after the prompt.
    model_1 = CALL + "<|im_end|>"
    inserted = "\n<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n"
    model_2 = "408<|im_end|>"
    assert tokenizer.decode(response) == model_1 + inserted + model_2
    expected_mask = [1] * len(tokenizer(model_1)["input_ids"]) + [0] * len(tokenizer(inserted)["input_ids"])
    expected_mask += [1] * len(tokenizer(model_2)["input_ids"])
    assert out["response_mask"][0, : len(expected_mask)].tolist() == expected_mask
    assert out["response_mask"][0, len(expected_mask) :].sum() == 0
    assert out["rollout_log_probs"][0].tolist() == [-1.0 * m for m in out["response_mask"][0].tolist()]
    # The second turn saw the prompt, the call and the tool's answer, exactly.
    assert (
        model.contexts[1]
        == out["input_ids"][0][out["attention_mask"][0].bool()].tolist()[: len(model.contexts[1])]
    )
    trajectory = out["trajectory"][0]
    assert [m["role"] for m in trajectory["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert trajectory["messages"][2]["content"] == "408" and trajectory["final_answer"] == "408"
    assert trajectory["finish"] == "answer" and trajectory["num_tool_calls"] == 1
    assert (out["agent_turns"][0], out["agent_tool_calls"][0], out["agent_tool_errors"][0]) == (2, 1, 0)


def test_bad_calls_become_error_observations_and_are_counted(tokenizer):
    turns = [
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
        "<tool_call>{oops</tool_call>",
        CALL,
        "408",
    ]
    model = ScriptedModel(tokenizer, turns)
    loop = tool_loop(tokenizer, max_assistant_turns=3)
    out = loop.generate(lambda: model, one_prompt(tokenizer), SamplingParams(max_tokens=400))
    messages = out["trajectory"][0]["messages"]
    assert messages[2]["role"] == "tool" and "unknown tool 'nope'" in messages[2]["content"]
    assert messages[4]["role"] == "tool" and "not valid JSON" in messages[4]["content"]
    # the third turn calls correctly but is the last allowed: the trajectory ends there, unanswered,
    # and the call is not run (no turn is left to read its result)
    assert out["trajectory"][0]["finish"] == "max_turns" and len(messages) == 6
    assert messages[5]["tool_calls"] == [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12*34"}}}
    ]
    assert (out["agent_turns"][0], out["agent_tool_calls"][0], out["agent_tool_errors"][0]) == (3, 2, 2)


@tool
def explode(x: int) -> str:
    """Raises."""
    raise RuntimeError("boom")


@tool
def flood(x: int) -> str:
    """Returns far too much."""
    return "a" * 10_000 + "END"


def test_a_raising_tool_a_huge_result_and_calls_past_the_limit_are_error_observations(tokenizer):
    both = (
        '<tool_call>{"name": "explode", "arguments": {"x": 1}}</tool_call>'
        '<tool_call>{"name": "flood", "arguments": {"x": 1}}</tool_call>'
    )
    model = ScriptedModel(
        tokenizer, [both, '<tool_call>{"name": "flood", "arguments": {"x": 1}}</tool_call>', "1"]
    )
    tools = ToolSet([explode, flood], max_result_chars=40, truncate_side="right")
    out = tool_loop(tokenizer, tools, max_assistant_turns=3).generate(
        lambda: model, one_prompt(tokenizer), SamplingParams(max_tokens=600)
    )
    messages = out["trajectory"][0]["messages"]
    assert [m["role"] for m in messages] == [
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert messages[2]["content"] == "error: RuntimeError: boom"
    # max_parallel_calls=1: the turn's second call is not run
    assert messages[3]["content"] == "error: at most 1 tool call(s) per turn; this one was not run"
    assert messages[5]["content"] == "a" * 40  # cut to max_result_chars, from the right
    assert out["trajectory"][0]["finish"] == "answer"
    assert (out["agent_tool_calls"][0], out["agent_tool_errors"][0]) == (3, 2)


def test_token_budget_ends_a_trajectory_without_a_partial_insertion(tokenizer):
    model = ScriptedModel(tokenizer, [CALL, "408"])
    loop = tool_loop(tokenizer)
    budget = len(CALL) + 1 + 10  # the call fits, the tool's answer and the reply do not
    out = loop.generate(lambda: model, one_prompt(tokenizer), SamplingParams(max_tokens=budget))
    assert out["trajectory"][0]["finish"] == "budget"
    assert out["response_mask"][0].tolist() == [1] * (len(CALL) + 1) + [0] * 10
    assert out["attention_mask"][0, -budget:].tolist() == [1] * (len(CALL) + 1) + [0] * 10


def test_multi_turn_log_probs_of_model_tokens_equal_the_trainer_forward(engine, tokenizer, tiny_dir):
    from transformers import AutoModelForCausalLM

    loop = AgentLoop(
        tokenizer,
        engine.eos_token_ids,
        settings=AgentSettings(max_assistant_turns=3, max_user_turns=2),
        interaction=AlwaysTryAgain(),
        pad_token_id=tokenizer.pad_token_id,
    )
    sampling = SamplingParams(max_tokens=48, n=2, temperature=0.8, seed=3)
    out = loop.generate(engine.turn_engine, make_prompts(tokenizer), sampling)
    inserted = (out["attention_mask"][:, -48:] - out["response_mask"]).sum(-1)
    assert (inserted > 0).any()  # some trajectories got a "Try again" and a second turn
    assert (out["response_mask"] <= out["attention_mask"][:, -48:]).all()
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        diff = (recomputed(model, out, sampling.temperature) - out["rollout_log_probs"]).abs().max()
    assert float(diff) < 1e-5
    turns = out["agent_turns"]
    assert turns.max() >= 2 and out["agent_user_turns"].tolist() == (turns - 1).tolist()


def test_a_trajectory_cut_at_its_time_limit_aborts_its_turn_in_vllm(engine, tokenizer):
    """The limit lands while every first turn is in vLLM's engine: each trajectory ends empty with finish
    time_limit, its request is aborted (vLLM holds none afterwards), and the engine serves the next batch."""
    sampling = SamplingParams(max_tokens=48, n=2, temperature=0.8, seed=3)
    cut = AgentLoop(
        tokenizer,
        engine.eos_token_ids,
        settings=AgentSettings(trajectory_timeout_s=1e-6),
        pad_token_id=tokenizer.pad_token_id,
    ).generate(engine.turn_engine, make_prompts(tokenizer), sampling)
    assert list(cut["agent_finish"]) == ["time_limit"] * len(cut)
    assert cut["response_mask"].sum() == 0 and cut["agent_turns"].sum() == 0
    assert not engine.llm.llm_engine.has_unfinished_requests()  # the cut turns are gone from vLLM
    loop = AgentLoop(tokenizer, engine.eos_token_ids, pad_token_id=tokenizer.pad_token_id)
    again = loop.generate(engine.turn_engine, make_prompts(tokenizer), sampling)
    assert set(again["agent_finish"]) <= {"answer", "budget"} and again["response_mask"].sum() > 0
