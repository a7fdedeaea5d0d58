"""data.chat_template_kwargs at each place a run renders a chat, through the trainers' own construction (no
workers start): the training and validation prompts of RLTrainer, the SFT rows of SFTTrainer, the prompts
`tandem generate` hands its engine (Hugging Face generate on the tiny model), and the agent loop built from the
config (its first turn is the dataset's prompt, its inserted turns rendered with the same variables). Expected
tokens are written by hand (tests/data/thinking_template.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

from data.data_helpers import char_ids
from data.thinking_template import block, opening, thinking_tokenizer
from tandem.commands.generate import run_generation
from tandem.config.generate import load_generate_config
from tandem.data import collate_prompts, write_splits
from tandem.models.tiny import save_tiny, save_tokenizer
from tandem.roles.rollout import agent_loop_from_config
from tandem.rollout import SamplingParams, build_rollout
from tandem.rollout.async_engine import TurnEngine, TurnOutput, TurnRequest
from tandem.trainer import RLTrainer, SFTTrainer

from .trainer_helpers import run_config

OFF = "data.chat_template_kwargs.enable_thinking=false"
# head size 32: vLLM's CPU attention takes it (rollout.engine=auto is vLLM where installed)
TINY = {"hidden_size": 64, "intermediate_size": 64, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("template_kwargs")
    files = write_splits("addition", root / "data", n_train=4, n_val=2, seed=0, digits=1)
    tokenizer_dir = save_tokenizer(thinking_tokenizer(), root / "thinking_tokenizer")
    return {
        **files,
        "model": save_tiny(root / "model", stop_at_im_end=True, **TINY),
        "tokenizer": tokenizer_dir,
    }


def rendered(messages, *, no_thinking: bool) -> list[int]:
    """The hand-written ids of a prompt's messages and the generation prompt."""
    return [token for m in messages for token in block(m["role"], m["content"])] + opening(no_thinking)


def rl_config(assets, tmp_path, *extra):
    return run_config(
        assets,
        tmp_path,
        "grpo",
        f"actor.tokenizer_path={assets['tokenizer']}",
        "data.max_prompt_length=64",
        *extra,
    )


def test_training_and_validation_prompts(assets, tmp_path):
    trainer = RLTrainer(rl_config(assets, tmp_path, OFF))
    for data in (trainer.train_data, trainer.val_data):
        for i in range(len(data)):
            assert data[i]["input_ids"] == rendered(data[i]["raw_prompt"], no_thinking=True)
    default = RLTrainer(rl_config(assets, tmp_path))
    assert default.val_data[0]["input_ids"] == rendered(default.val_data[0]["raw_prompt"], no_thinking=False)


def test_sft_rows(assets, tmp_path):
    cfg = run_config(
        assets, tmp_path, "sft", f"actor.tokenizer_path={assets['tokenizer']}", "data.max_length=64", OFF
    )
    trainer = SFTTrainer(cfg)
    rows = pq.read_table(assets["train"]).to_pylist()
    for i, row in enumerate(rows):
        prompt, response = rendered(row["prompt"], no_thinking=True), char_ids(row["response"])
        assert trainer.train_data[i]["input_ids"] == [*prompt, *response, 1]  # 1: EOS
        assert trainer.train_data[i]["loss_mask"] == [0] * len(prompt) + [1] * (len(response) + 1)


def test_generate_hands_the_engine_the_rendered_prompts(assets, tmp_path):
    seen = []

    def build(spec):
        engine = build_rollout(spec)
        generate = engine.generate

        def recorded(prompts, sampling):
            seen.extend(
                row[mask.bool()].tolist()
                for row, mask in zip(prompts["input_ids"], prompts["attention_mask"])
            )
            return generate(prompts, sampling)

        engine.generate = recorded
        return engine

    keys = [
        f"model_path={assets['model']}",
        f"tokenizer_path={assets['tokenizer']}",
        f"data_path={assets['val']}",
    ]
    keys += [
        f"output_path={tmp_path / 'out.parquet'}",
        "engine=hf",
        "max_response_length=2",
        "progress_bar=false",
    ]
    cfg, _ = load_generate_config(None, [*keys, "chat_template_kwargs.enable_thinking=false"])
    run_generation(cfg, build_engine=build)
    prompts = pq.read_table(assets["val"]).column("prompt").to_pylist()
    assert seen == [rendered(p, no_thinking=True) for p in prompts]


class ScriptedModel(TurnEngine):
    """Stands in for the model (a random tiny model never calls a tool): the given turns, each ended by
    <|im_end|>; records the context of every turn."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.contexts = tokenizer, list(turns), []

    async def generate(self, request: TurnRequest) -> TurnOutput:
        self.contexts.append(list(request.prompt_ids))
        ids = [*self.tokenizer(self.turns.pop(0), add_special_tokens=False)["input_ids"], 3]
        return TurnOutput(ids, [-1.0] * len(ids), "stop", 0.0)


def test_agent_loop_first_turn_and_inserted_turns(assets, tmp_path):
    agent = ["rollout.mode=async", "rollout.engine=vllm", "rollout.multi_turn.tools=[calculator]"]
    cfg = rl_config(
        assets, tmp_path, OFF, *agent, "rollout.multi_turn.max_assistant_turns=2", "data.max_prompt_length=96"
    )
    trainer = RLTrainer(cfg)  # its start-up check renders the template with the variables too
    loop = agent_loop_from_config(cfg, SimpleNamespace(eos_token_ids=[1, 3], pad_token_id=0))
    item = trainer.train_data[0]
    call = '<tool_call>{"name":"calculator","arguments":{"expression":"6+9"}}</tool_call>'
    model = ScriptedModel(trainer.tokenizer, [call, "15"])
    loop.generate(lambda: model, collate_prompts([item], 0), SamplingParams(max_tokens=200))
    first = [*block("system", "tools: calculator"), *rendered(item["raw_prompt"], no_thinking=True)]
    assert item["input_ids"] == first
    assert model.contexts[0] == first
    # the tool's answer, then the next assistant turn opened with the empty think block as the first one was
    inserted = [*char_ids("\n"), *block("tool", "15"), *opening(True)]
    assert model.contexts[1] == [*first, *char_ids(call), 3, *inserted]
