"""The rollout engines' face: one registry by name (tandem.rollout.ROLLOUT_ENGINES), their facts by name without
torch (tandem/rollout_options.py), one RolloutSpec from the config, a start-up check per engine.

The last test registers an engine of its own, written here, and runs a GRPO step through the trainer with it:
the trainer, the rollout role and the checks take it as they take hf or vLLM, so a new engine is one module
and one registry line (with its facts)."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import Tensor

from tandem import rollout, rollout_options
from tandem.batch import Batch
from tandem.config.generate import GenerateConfig
from tandem.config.schema import RolloutEngineName
from tandem.roles.rollout import rollout_spec
from tandem.rollout import RolloutEngine, RolloutSpec, SamplingParams, check_buildable, engine_class
from tandem.rollout.base import assemble, check_prompts
from tandem.rollout_options import RolloutEngineFacts
from tandem.trainer import RLTrainer
from tandem.trainer.device_line import device_line
from trainer.trainer_helpers import custom_reward, make_assets, run_config

BUILT = [name for name, facts in rollout_options.ROLLOUT_ENGINES.items() if facts.built]


def test_the_registry_holds_every_built_engine_the_facts_list():
    assert sorted(rollout.ROLLOUT_ENGINES) == sorted(BUILT) == ["hf", "vllm"]
    # the schema offers every listed engine, "auto" first; tandem generate the built ones
    assert typing.get_args(RolloutEngineName) == ("auto", *rollout_options.ROLLOUT_ENGINES)
    generate_engines = typing.get_args(typing.get_type_hints(GenerateConfig)["engine"])
    assert sorted(generate_engines) == sorted(["auto", *BUILT])
    assert set(rollout_options.AUTO_ORDER) <= set(BUILT)


@pytest.mark.parametrize("name", BUILT)
def test_each_engine_class_does_what_its_facts_say(name):
    cls, facts = engine_class(name), rollout_options.facts(name)
    assert issubclass(cls, RolloutEngine)
    overrides = lambda method: getattr(cls, method) is not getattr(RolloutEngine, method)  # noqa: E731
    assert overrides("turn_engine") == facts.turn_engine  # the base class raises: no agent loop
    assert overrides("load_adapter") == facts.serves_adapters  # the base class raises: merged weights only
    assert ("tensor_parallel" in inspect.signature(cls.__init__).parameters) == facts.tensor_parallel


def test_auto_resolves_to_the_first_installed_engine_and_unknown_names_are_named():
    installed = [n for n in rollout_options.AUTO_ORDER if rollout_options.installed(n)]
    assert rollout_options.resolve_engine("auto") == installed[0]
    assert rollout_options.resolve_engine("hf") == "hf"
    assert rollout_options.engines_with("turn_engine") == ["vllm"]  # sglang is not built: never suggested
    with pytest.raises(KeyError, match="unknown rollout engine 'vlm'. Did you mean 'vllm'"):
        rollout_options.facts("vlm")
    with pytest.raises(NotImplementedError, match="not available yet"):
        engine_class("sglang")
    with pytest.raises(ValueError, match="unknown rollout engine 'hff'"):
        engine_class("hff")
    assert check_buildable(RolloutSpec("sglang", "model")) == [
        "rollout.engine=sglang is not available yet; use vllm or hf"
    ]


# ---- an engine of the test's own, registered by name -------------------------------------------------------

COUNTING_FACTS = RolloutEngineFacts(
    package=None,
    turn_engine=False,
    tensor_parallel=False,
    serves_adapters=False,
    cpu=True,
    actor_dtype=False,
    max_model_len=False,
    images=False,
)
BUILT_ENGINES: list[CountingRollout] = []


class CountingRollout(RolloutEngine):
    """Writes the token after each prompt's last one, `max_tokens` times (never a stop id); each token's log-prob
    is -2. Counts the tensors of each weight sync."""

    def __init__(self, model_path, *, tokenizer_path, eos_token_ids, pad_token_id, device, dtype) -> None:
        self.model_path, self.eos_token_ids, self.pad_token_id = model_path, list(eos_token_ids), pad_token_id
        self.synced: list[int] = []
        BUILT_ENGINES.append(self)

    @staticmethod
    def check_buildable(spec: RolloutSpec) -> list[str]:
        return (
            []
            if (Path(spec.model_path) / "config.json").is_file()
            else [f"{spec.model_path}: no config.json"]
        )

    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        ids, mask = check_prompts(prompts, "CountingRollout")
        rows = prompts.repeat(sampling.n, interleave=True)
        ids, mask = ids.repeat_interleave(sampling.n, 0), mask.repeat_interleave(sampling.n, 0)
        token = ids[:, -1:] + 1
        token[torch.isin(token, torch.tensor(self.eos_token_ids))] += 1  # never stop early
        responses = token.expand(-1, sampling.max_tokens).clone()
        ones = torch.ones_like(responses)
        return assemble(rows, ids, mask, responses, ones, -2.0 * ones.float(), seconds=0.0)

    def update_weights(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        self.synced.append(sum(1 for _ in weights))


@pytest.fixture
def counting(monkeypatch):
    """The engine registered as "counting": one registry line, its facts, and its name among the schema's."""
    monkeypatch.setitem(rollout.ROLLOUT_ENGINES, "counting", CountingRollout)
    monkeypatch.setitem(rollout_options.ROLLOUT_ENGINES, "counting", COUNTING_FACTS)
    BUILT_ENGINES.clear()
    return "counting"


@pytest.mark.slow
def test_a_registered_engine_runs_a_grpo_step_through_the_trainer(counting, tmp_path, capsys):
    assets = make_assets(tmp_path / "assets")
    cfg = run_config(
        assets,
        tmp_path / "run",
        "grpo",
        "trainer.backend=inprocess",
        "trainer.workers_per_node=1",
        "trainer.total_training_steps=1",
        "trainer.test_freq=1",
        "data.train_batch_size=2",
        "rollout.n=2",
        "actor.ppo_mini_batch_size=2",
        *custom_reward("by_length"),
    )
    cfg.rollout.engine = counting  # the schema's choices are rollout_options' names at import time
    spec = rollout_spec(cfg, torch.device("cpu"))
    assert (spec.engine, spec.dtype, spec.max_model_len) == ("counting", torch.float32, 32 + 6)
    assert check_buildable(spec) == []
    assert check_buildable(RolloutSpec(counting, tmp_path)) == [f"{tmp_path}: no config.json"]
    assert "rollout counting fp32" in device_line(cfg, "cpu", "set by trainer.device")

    (metrics,) = RLTrainer(cfg).fit()
    (engine,) = BUILT_ENGINES  # the rollout role built it from the spec, once
    assert Path(engine.model_path) == assets["model"]
    # every response is 6 copies of one token: 2 prompts x 2 samples of 6 tokens, each log-prob -2
    assert metrics["response_length/mean"] == 6 and metrics["perf/samples"] == 4
    assert metrics["rollout/generated_tokens"] == 4 * 6
    assert metrics["rollout_corr/rollout_log_ppl"] == pytest.approx(2.0)  # mean -log-prob of the engine's
    assert metrics["val/response_length/mean"] == 6  # validation generated through it too
    # the update moved the actor: synced into the engine before validation, each tensor of the model once
    assert engine.synced == [len(load_file(assets["model"] / "model.safetensors"))]
