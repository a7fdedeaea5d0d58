"""Every key of verl's four composed configs (trainer, megatron trainer, SFT, generation; verl's real folder in
data/verl_config) given at verl's own default value is accepted, one key at a time and all together: what verl
does with the key absent is what Tandem does. A non-default value keeps its rule (the refusal naming the key).
verl's generation default of 8 GPUs per node is 8 engines of tandem generate (a machine without them is refused
when the run starts)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tandem.config import load_config
from tandem.config.generate import generate_layout, load_generate_config, translate_generation_overrides
from tandem.config.verl.translate import translate_overrides
from tandem.config.yaml_io import dotted_leaves
from tandem.models.tiny import save_tiny

from .verl_config import VERL_CONFIG, composed

ROOT = Path(__file__).parents[2]
CONFIGS = {  # verl config -> how its keys are read (False: PPO, True: SFT, "generation": tandem generate)
    "ppo_trainer": False,
    "ppo_megatron_trainer": False,
    "sft_trainer": True,
    "sft_trainer_engine": True,
    "generation": "generation",
}


def hydra_text(value) -> str:
    """A value as a verl command line writes it (Hydra's grammar)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(hydra_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str) and (value == "" or any(c in value for c in " ,[]{}()=:'\"~$")):
        return "'" + value.replace("'", "\\'") + "'"
    return str(value)


def default_overrides(name: str) -> list[str]:
    return [f"{key}={hydra_text(value)}" for key, value in dotted_leaves(composed(name))]


def problems_of(text: str, how) -> list[tuple[str, str]]:
    if how == "generation":
        return translate_generation_overrides([text]).problems
    return translate_overrides([text], sft=how).problems


def test_the_defaults_table_is_up_to_date():
    spec = importlib.util.spec_from_file_location(
        "gen_verl_defaults", ROOT / "scripts" / "gen_verl_defaults.py"
    )
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert (ROOT / "src/tandem/config/verl/defaults.json").read_text() == generator.render(), (
        "src/tandem/config/verl/defaults.json is stale: run `python scripts/gen_verl_defaults.py`"
    )


@pytest.mark.parametrize("name", CONFIGS)
def test_every_key_at_verls_default_is_accepted_one_at_a_time(name):
    overrides = default_overrides(name)
    assert len(overrides) > 40
    refused = {text: problems for text in overrides if (problems := problems_of(text, CONFIGS[name]))}
    assert refused == {}


def test_the_examples_the_issue_names_are_accepted_at_their_default_and_refused_otherwise():
    translation = translate_overrides(["trainer.default_hdfs_dir=null"])
    assert translation.problems == [] and translation.overrides == []
    ((_, why),) = translation.no_effect
    assert "verl's default" in why
    # trainer.val_only is built (validate once and stop, as verl): both values are read
    assert translate_overrides(["trainer.val_only=false"]).overrides == ["trainer.val_only=false"]
    assert translate_overrides(["trainer.val_only=True"]).overrides == ["trainer.val_only=True"]
    ((key, message),) = translate_overrides(["trainer.default_hdfs_dir=hdfs://backup"]).problems
    assert key == "trainer.default_hdfs_dir" and "Tandem saves checkpoints to a local folder only" in message
    # an older global micro-batch key at verl's default (null) is "not set", not a Python error
    translation = translate_overrides(["actor_rollout_ref.actor.ppo_micro_batch_size=null"])
    assert translation.problems == [] and translation.overrides == []


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(save_tiny(tmp_path_factory.mktemp("defaults") / "model"))


PATH_KEYS = ("model.path", "model.partial_pretrain", "model.tokenizer_path")


def with_paths(overrides: list[str], model: str) -> list[str]:
    """verl's placeholder model folders (`~/models/deepseek-llm-7b-chat`) made the test's tiny model: a folder
    Tandem opens when it resolves the config."""
    out = []
    for text in overrides:
        key = text.partition("=")[0]
        out.append(f"{key}={model}" if key.endswith(PATH_KEYS) and not text.endswith("=null") else text)
    return out


@pytest.mark.parametrize("name", ["ppo_trainer", "ppo_megatron_trainer", "sft_trainer", "sft_trainer_engine"])
def test_all_of_verls_defaults_at_once_load_over_verls_own_yaml(name, model):
    """The composed defaults passed back as the command line, over verl's YAML: the config verl's YAML alone gives."""
    sft = CONFIGS[name] is True
    path = str(VERL_CONFIG / f"{name}.yaml")
    overrides = with_paths(default_overrides(name), model)
    quiet = {"on_verl": lambda translation: None, "sft": sft}
    # trainer.device=cuda given on a command line asks for CUDA; verl's YAML says cuda whatever the machine, and
    # Tandem reads the YAML's as the preset's auto (config/verl/translate.py _TREE_DROPS)
    given = load_config(path, [o for o in overrides if o != "trainer.device=cuda"], **quiet)
    paths_only = load_config(path, [o for o in overrides if o.partition("=")[0].endswith(PATH_KEYS)], **quiet)
    assert given == paths_only
    assert load_config(path, overrides, **quiet).trainer.device == "cuda"


def test_all_of_verls_generation_defaults_at_once(model):
    # verl's 8 GPUs per node with one GPU per engine: 8 replicas (a machine without them is refused at start-up)
    overrides = with_paths(default_overrides("generation"), model)
    cfg, _ = load_generate_config(None, overrides)
    assert cfg.n == composed("generation")["data"]["n_samples"]
    assert (cfg.workers_per_node, cfg.tensor_parallel, generate_layout(cfg).replicas) == (8, 1, 8)


def test_fsdp_dtypes_verl_acts_on_are_read_not_swallowed():
    """verl's actor FSDP mixed precision sets the compute and reduce dtypes; its model_dtype keeps weights in that
    dtype (fp32 by default, Tandem's too); the reference's and critic's follow the actor's in Tandem."""
    mixed = translate_overrides(["+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32}"])
    assert mixed.problems == [] and mixed.overrides == [
        'actor.fsdp={"param_dtype": "float32", "reduce_dtype": "float32"}'
    ]
    one = translate_overrides(["+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16"])
    assert one.overrides == ["actor.fsdp.param_dtype=bfloat16"]
    assert translate_overrides(["actor_rollout_ref.actor.fsdp_config.model_dtype=fp32"]).problems == []
    kept = translate_overrides(["actor_rollout_ref.actor.fsdp_config.model_dtype=bf16"])
    assert kept.problems == [] and kept.overrides == [
        "actor.fsdp.model_dtype=bfloat16"
    ]  # bf16 weights, built
    ((key, message),) = translate_overrides(["actor_rollout_ref.actor.fsdp_config.model_dtype=fp16"]).problems
    assert key.endswith("model_dtype") and "fp16 weights are not built" in message
    ((_, message),) = translate_overrides(
        ["+critic.model.fsdp_config.mixed_precision={param_dtype:bf16}"]
    ).problems
    assert "at the actor's dtypes" in message
    # verl's `file` logger is Tandem's jsonl on a PPO command line too
    assert translate_overrides(["trainer.logger=[console,file]"]).overrides == [
        'trainer.loggers=["console", "jsonl"]'
    ]
