"""`tandem generate`'s keys: its own, verl's main_generation keys translated, and the errors."""

from __future__ import annotations

import pytest

from tandem.config import ConfigError
from tandem.config.generate import GenerateConfig, load_generate_config, translate_generation_overrides

PATHS = ["model_path=m", "data_path=d.parquet", "output_path=o.parquet"]


def test_tandem_keys_and_defaults():
    cfg, names = load_generate_config(
        None, [*PATHS, "n=4", "top_p=0.9", "engine=hf", "engine_kwargs.max_num_seqs=8"]
    )
    assert (cfg.n, cfg.top_p, cfg.top_k, cfg.engine, cfg.truncation) == (4, 0.9, -1, "hf", "error")
    assert cfg.engine_kwargs == {"max_num_seqs": 8} and cfg.batch_size == GenerateConfig().batch_size
    assert names == {}


def test_verl_keys_start_from_verls_defaults_and_print_the_same_run_in_tandems_keys():
    seen = []
    cfg, names = load_generate_config(
        None,
        ["model.path=m", "data.path=d.parquet", "data.output_path=o.parquet", "rollout.top_k=0"],
        on_verl=seen.append,
    )
    # generation.yaml's n_samples 5, top_p 0.7, prompt / response length 1536 / 512; top_k 0 is verl's "off"
    assert (cfg.n, cfg.top_p, cfg.top_k, cfg.max_prompt_length, cfg.max_response_length) == (
        5,
        0.7,
        -1,
        1536,
        512,
    )
    assert cfg.truncation == "right"  # verl cuts long prompts
    assert names["model_path"] == "model.path"
    (translation,) = seen
    same_run = translation.summary("tandem generate").splitlines()[-1]
    assert "n=5" in same_run and "truncation=right" in same_run and "top_k=-1" in same_run


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("rollout.do_sample=False", "rollout.temperature=0"),
        ("rollout.name=trtllm", "vllm and hf"),
        ("rollout.ignore_eos=True", "end-of-sequence"),
        ("rollout.n=4", "data.n_samples"),
        ("model.external_lib=my_lib", "transformers only"),
        ("data.n_sample=3", "does not have"),  # a misspelled verl key
    ],
)
def test_verl_keys_tandem_refuses_say_why(override, says):
    with pytest.raises(ConfigError) as err:
        load_generate_config(None, [*PATHS, override])
    assert override.partition("=")[0] in str(err.value) and says in str(err.value)


def test_verl_keys_with_no_effect_are_named():
    out = translate_generation_overrides(["actor.fsdp_config.fsdp_size=-1", "ray_kwargs.ray_init.num_cpus=4"])
    assert [verl for verl, _ in out.no_effect] == [
        "actor.fsdp_config.fsdp_size=-1",
        "ray_kwargs.ray_init.num_cpus=4",
    ]
    assert out.overrides == [] and out.problems == []


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["n=0"], "n=0: must be >= 1"),
        (["data.n_samples=0"], "data.n_samples=0: must be >= 1"),  # the key the user wrote
        (["temperature=0", "n=2"], "greedy"),
        (["batch_size=0"], "batch_size=0"),
        (["top_k=0"], "top_k=0"),
        (["trainer.n_gpus_per_node=3", "rollout.tensor_model_parallel_size=2"], "trainer.n_gpus_per_node=3"),
        (["rollout.tensor_model_parallel_size=2", "rollout.name=hf"], "rollout.tensor_model_parallel_size=2"),
        (["output_path=d.parquet"], "is the input file"),
        (["nn=3"], "unknown key 'nn'; did you mean 'n'?"),
    ],
)
def test_bad_values_name_the_key(overrides, says):
    with pytest.raises(ConfigError) as err:
        load_generate_config(None, [*PATHS, *overrides])
    assert says in str(err.value)


def test_missing_paths_are_named():
    with pytest.raises(ConfigError) as err:
        load_generate_config(None, ["n=2"])
    for key in ("model_path", "data_path", "output_path"):
        assert f"{key} is not set" in str(err.value)


def test_a_yaml_file_of_keys_under_the_overrides(tmp_path):
    path = tmp_path / "gen.yaml"
    path.write_text("model_path: m\ndata_path: d.parquet\noutput_path: o.parquet\nn: 3\ntop_p: 0.5\n")
    cfg, _ = load_generate_config(path, ["n=2", "rollout.top_k=5"])
    assert (cfg.n, cfg.top_p, cfg.top_k) == (2, 0.5, 5)  # the file's top_p stays over verl's default 0.7
