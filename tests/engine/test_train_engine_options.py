"""The training engines' facts by name (tandem/train_engine_options.py) against the one registry
(`tandem.engine.engine_class`), the schema's `Strategy`, each engine's settings section and what its constructor
refuses: the table the config checks, start-up checks and roles ask is the engines' own truth."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from tandem import train_engine_options as options
from tandem.config.schema import ActorConfig, LoraConfig, Strategy
from tandem.engine import EngineSpec, TrainEngine, build_engine, engine_class


def test_the_table_holds_every_engine_the_registry_builds():
    assert list(options.TRAIN_ENGINES) == list(typing.get_args(Strategy)) == ["fsdp", "megatron"]
    classes = {name: engine_class(name) for name in options.TRAIN_ENGINES}
    assert all(issubclass(cls, TrainEngine) for cls in classes.values())
    assert len(set(classes.values())) == len(classes)  # one class an engine
    with pytest.raises(ValueError, match="unknown engine strategy 'deepspeed'"):
        engine_class("deepspeed")  # a name the table lacks, the registry lacks too
    with pytest.raises(KeyError, match="unknown training engine 'megatrn'. Did you mean 'megatron'"):
        options.facts("megatrn")


@pytest.mark.parametrize("name", list(options.TRAIN_ENGINES))
def test_each_engines_facts_name_settings_of_its_own_section(name):
    facts = options.facts(name)
    actor_fields = {f.name: f for f in dataclasses.fields(ActorConfig)}
    spec_fields = {f.name for f in dataclasses.fields(EngineSpec)}
    assert facts.section in actor_fields and facts.section in spec_fields
    section = {f.name: f.type for f in dataclasses.fields(actor_fields[facts.section].default_factory())}
    assert facts.model_parallel and all(section[size] in (int, "int") for size in facts.model_parallel)
    assert facts.pipeline == ({"pipeline_parallel", "virtual_pipeline"} <= set(section))
    assert facts.expert_parallel == ("expert_parallel" in section)
    assert facts.tensor_parallel_weights == ("tensor_parallel" in section)
    assert facts.dist_checkpoint == ("dist_checkpoint" in section)


def test_the_model_parallel_size_and_settings_are_read_from_the_engines_section():
    actor = ActorConfig(strategy="megatron")
    actor.megatron.tensor_parallel, actor.megatron.pipeline_parallel, actor.megatron.context_parallel = (
        2,
        3,
        2,
    )
    actor.fsdp.sequence_parallel = 5  # another engine's section: not read
    assert options.settings(actor) is actor.megatron
    assert options.model_parallel_size(actor) == 2 * 3 * 2
    actor.strategy = "fsdp"
    assert options.settings(actor) is actor.fsdp
    assert options.model_parallel_size(actor) == 5
    assert options.engines_with("lora_dropout") == ["fsdp"]
    assert options.engines_with("dist_checkpoint") == ["megatron"]


@pytest.mark.parametrize("name", list(options.TRAIN_ENGINES))
def test_an_engine_refuses_the_lora_its_facts_deny_and_builds_what_they_allow(name, one_rank):
    """critic_lora / lora_dropout: an engine whose facts deny one refuses it in its constructor, naming the
    setting, before it builds anything; one whose facts allow both builds a LoRA critic with dropout (a tiny
    model, one gloo rank)."""
    facts = options.facts(name)
    critic = EngineSpec(
        model_path=one_rank,
        head="value",
        device="cpu",
        strategy=name,
        lora=LoraConfig(rank=2, dropout=0.1),
    )
    if facts.critic_lora and facts.lora_dropout:
        engine = build_engine(critic)
        trained = {n for n, p in engine.model.named_parameters() if p.requires_grad}
        assert trained and all("lora_" in n or "score" in n for n in trained)
        return
    if not facts.critic_lora:
        with pytest.raises(
            ValueError, match=f"critic.lora with actor.strategy={name}: LoRA on {name} is built for"
        ):
            engine_class(name)(critic)
    if not facts.lora_dropout:
        with pytest.raises(ValueError, match=f"actor.lora.dropout=0.1 with actor.strategy={name}"):
            engine_class(name)(dataclasses.replace(critic, head="lm"))
