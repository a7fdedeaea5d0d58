"""The training engines' names and what each builds, read without torch.

Config validation (layer 3), the start-up checks and the roles must know what a training engine
(`actor.strategy`) does, which settings section it reads, how many ranks one model spans, whether its weights are
cut over tensor-parallel ranks, what of LoRA it builds, before any worker starts and without importing the
engines (`tandem.engine` loads torch). So each engine's facts are listed here by name, and everyone outside
`engine/` asks them instead of comparing the strategy's name: `critic.lora.rank=8` with actor.strategy=megatron is
refused because that engine builds LoRA for the actor only, not because its name is "megatron". The engines
themselves are registered in `tandem.engine`'s `engine_class`; tests/engine/test_train_engine_options.py keeps the
two equal, name for name, and each fact true to the engine's settings section and to what its constructor refuses.
verl has no such table: its workers branch on `strategy` where they build (fsdp_workers.py, megatron_workers.py).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TrainEngineFacts:
    """What the config checks, the start-up checks and the roles ask of a training engine."""

    section: str  # its settings: actor.<section> and EngineSpec.<section> (the others' sections are ignored)
    model_parallel: tuple[str, ...]  # the sizes of its section whose product is the ranks one model spans
    pipeline: bool  # cuts the layers into stages: its section's pipeline_parallel and virtual_pipeline
    expert_parallel: bool  # spreads a mixture-of-experts model's experts over its section's expert_parallel
    tensor_parallel_weights: bool  # holds each weight cut over its section's tensor_parallel ranks
    critic_lora: bool  # builds LoRA adapters on the critic (a value head) too, not on the actor alone
    lora_dropout: bool  # dropout on the adapters' input (actor.lora.dropout > 0)
    lora_init_a: str  # how A is drawn with lora.init_a=auto: what verl's LoRA on this engine draws
    dist_checkpoint: bool  # starts from megatron distributed checkpoints (actor.megatron.dist_checkpoint)
    override_config: bool  # applies actor.override_config / critic.override_config to the model's config
    vision_language: bool  # trains a vision-language actor (pixel values in its batches)


TRAIN_ENGINES: dict[str, TrainEngineFacts] = {
    # FSDP2 (fully_shard) over Hugging Face models; Ulysses sequence parallel
    "fsdp": TrainEngineFacts(
        section="fsdp",
        model_parallel=("sequence_parallel",),
        pipeline=False,
        expert_parallel=False,
        tensor_parallel_weights=False,
        critic_lora=True,
        lora_dropout=True,
        lora_init_a="kaiming",  # PEFT's default, which verl's FSDP workers keep
        dist_checkpoint=False,
        override_config=True,
        vision_language=True,
    ),
    # megatron-core's own model, converted from the Hugging Face folder (engine/megatron/convert.py)
    "megatron": TrainEngineFacts(
        section="megatron",
        model_parallel=("tensor_parallel", "pipeline_parallel", "context_parallel"),
        pipeline=True,
        expert_parallel=True,
        tensor_parallel_weights=True,
        critic_lora=False,  # adapters inside megatron's linears for a causal LM (engine/megatron/lora.py)
        lora_dropout=False,
        lora_init_a="xavier",  # verl's megatron LoRA default (lora_A_init_method: megatron-bridge's xavier-uniform)
        dist_checkpoint=True,
        override_config=False,  # builds from config.json; its own is actor.megatron.override_transformer_config
        vision_language=False,
    ),
}


def facts(name: str) -> TrainEngineFacts:
    """The facts of training engine `name`; a KeyError naming the closest engine."""
    if name not in TRAIN_ENGINES:
        close = difflib.get_close_matches(str(name), list(TRAIN_ENGINES), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise KeyError(f"unknown training engine '{name}'.{hint} Known: {', '.join(TRAIN_ENGINES)}.")
    return TRAIN_ENGINES[name]


def settings(actor: Any) -> Any:
    """The settings section of `actor` (config's ActorConfig) that its engine reads: actor.fsdp or actor.megatron."""
    return getattr(actor, facts(actor.strategy).section)


def model_parallel_size(actor: Any) -> int:
    """The ranks one model spans under `actor`'s engine: the product of its section's model-parallel sizes."""
    section, size = settings(actor), 1
    for name in facts(actor.strategy).model_parallel:
        size *= getattr(section, name)
    return size


def engines_with(fact: str) -> list[str]:
    """The engines that have `fact` (a field of TrainEngineFacts), in table order: for messages that say which
    actor.strategy to choose instead."""
    return [name for name, engine in TRAIN_ENGINES.items() if getattr(engine, fact)]


def lora_init_a(name: str, init_a: str) -> str:
    """How training engine `name` draws each adapter's A for lora.init_a=`init_a` (auto: the engine's verl
    default)."""
    return facts(name).lora_init_a if init_a == "auto" else init_a
