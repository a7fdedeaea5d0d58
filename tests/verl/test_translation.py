"""verl's keys read as Tandem's: the four example scripts' keys, the printed translation, verl YAML files."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from tandem.cli import hydra_flags_first, main
from tandem.config import ConfigError, config_to_dict, load_config
from tandem.config.loader import verl_yaml_to_tandem
from tandem.config.verl.hydra_yaml import compose
from tandem.config.verl.translate import translate_overrides, translate_tree

from .scripts import MULTITURN_GSM8K_CONFIG, SCRIPTS

DATA = Path(__file__).parent / "data"
VERL_CONFIG = DATA / "verl_config"  # verl's verl/trainer/config, the real folder


def test_every_key_of_verls_four_example_scripts_runs_as_it_is():
    keys = {o.partition("=")[0] for script in SCRIPTS.values() for o in script}
    assert len(keys) == 60  # the count the issue measured
    for name, script in SCRIPTS.items():
        translation = translate_overrides(script)
        assert translation.problems == [], name
    no_effect = {v.partition("=")[0] for s in SCRIPTS.values() for v, _ in translate_overrides(s).no_effect}
    assert no_effect == {  # accepted, each with a reason printed
        "data.return_raw_chat",
        "actor_rollout_ref.ref.fsdp_config.param_offload",
        "actor_rollout_ref.rollout.load_format",
        "actor_rollout_ref.rollout.layered_summon",
        "actor_rollout_ref.rollout.multi_stage_wake_up",
        "actor_rollout_ref.rollout.over_sample_rate",
        "actor_rollout_ref.rollout.mode",
        "critic.model.use_remove_padding",
        "critic.model.enable_gradient_checkpointing",
        "critic.model.fsdp_config.param_offload",
        "critic.model.fsdp_config.optimizer_offload",
        "global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries",
        "global_profiler.global_tool_config.torch_memory.stack_depth",
        "trainer.use_legacy_worker_impl",
    }


def test_values_that_differ_between_verl_and_tandem_are_converted():
    t = translate_overrides(
        [
            "actor_rollout_ref.actor.clip_ratio=0.25",
            "actor_rollout_ref.actor.fsdp_config.param_offload=False",
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",  # either one offloads all
            "actor_rollout_ref.rollout.name=sglang",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.model.target_modules=all-linear",
            'trainer.logger=["console","wandb"]',
            "trainer.default_local_dir=/ckpt/exp",
            "data.train_batch_size=16",  # verl and Tandem share it: untouched
            "data.filter_overlong_prompts=True",
            "data.truncation=error",  # verl filters first: Tandem's filter wins
        ]
    )
    assert t.overrides == [
        "actor.clip_ratio_low=0.25",
        "actor.clip_ratio_high=0.25",
        "actor.fsdp.cpu_offload=True",
        "rollout.engine=auto",
        "rollout.mode=async",
        'actor.lora.target_modules=["all-linear"]',
        'trainer.loggers=["console", "wandb"]',
        "trainer.run_dir=/ckpt/exp",
        "data.train_batch_size=16",
        "data.truncation=filter",
    ]
    sglang = [note for verl, _, note in t.mapped if verl.startswith("actor_rollout_ref.rollout.name")]
    assert sglang == [
        "Tandem has no SGLang engine yet: rollout.engine=auto runs vLLM (Hugging Face generate "
        "where vLLM is not installed), with the same sampling settings"
    ]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("actor_rollout_ref.rollout.name=trtllm", "Tandem's rollout engines are vllm and hf"),
        (
            "reward_model.model.external_lib=mylib",
            "Tandem has no meaning for verl's reward_model.model.external_lib",
        ),
        ("global_profiler.tool=npu", "it has no 'npu' hooks"),
        ("actor_rollout_ref.actor.optim.optimizer=SGD", "Tandem's optimizer is AdamW, not 'SGD'"),
        ("actor_rollout_ref.rollout.made=async", "not a key of verl's config, and none Tandem reads"),
    ],
)
def test_a_verl_key_or_value_tandem_has_no_meaning_for_is_an_error(override, message):
    with pytest.raises(ConfigError) as info:
        load_config("verl", [override])
    assert message in str(info.value) and override.partition("=")[0] in str(info.value)


def test_the_printed_tandem_command_gives_the_same_config_as_the_verl_keys(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    script = [
        o for o in SCRIPTS["ppo_deepseek_7b"] if not o.startswith(("data.", "actor_rollout_ref.model.path"))
    ]
    script += [f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}"]
    assert main(["config", *script]) == 0
    out = capsys.readouterr()
    printed = out.err.splitlines()
    command = shlex.split(printed[printed.index("  the same run in Tandem's keys:") + 1])
    assert command[:3] == ["tandem", "config", "verl"]
    tandem_cfg = load_config("verl", command[3:])
    assert config_to_dict(tandem_cfg) == yaml.safe_load(out.out)
    assert tandem_cfg.critic.model_path == str(model) and tandem_cfg.algorithm.adv_estimator == "gae"
    assert "    trainer.use_legacy_worker_impl=auto: Tandem has one worker implementation" in printed


def test_verls_trainer_yaml_translates_to_a_tandem_config_that_loads_and_names_every_dropped_key(tmp_path):
    text = verl_yaml_to_tandem(VERL_CONFIG / "ppo_trainer.yaml")
    path = tmp_path / "from_verl.yaml"
    path.write_text(text)
    cfg = load_config(str(path))
    assert cfg.algorithm.adv_estimator == "gae" and cfg.trainer.total_epochs == 30
    dropped = [line for line in text.splitlines() if line.startswith("#   ")]
    translation = translate_tree(compose(VERL_CONFIG / "ppo_trainer.yaml"))
    assert len(dropped) == len(translation.dropped) > 300
    assert "#   actor_rollout_ref.rollout.enforce_eager: false  -- a vLLM/SGLang engine argument" in text
    assert "#   trainer.device: cuda  -- verl's YAML always says cuda" in text


def test_the_docs_count_of_dropped_verl_keys_is_the_translations():
    text = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    trainer = int(re.search(r"(\d+) keys are dropped", text).group(1))
    megatron = int(re.search(r"`ppo_megatron_trainer.yaml` likewise \((\d+) dropped\)", text).group(1))
    assert trainer == len(translate_tree(compose(VERL_CONFIG / "ppo_trainer.yaml")).dropped)
    assert megatron == len(translate_tree(compose(VERL_CONFIG / "ppo_megatron_trainer.yaml")).dropped)


def test_the_verl_preset_holds_verls_defaults():
    """Every verl default with a Tandem meaning, read over the verl preset, changes only the keys whose
    difference the preset's comments give a reason for (and the paths verl's YAML names)."""
    translation = translate_tree(compose(VERL_CONFIG / "ppo_trainer.yaml"))
    preset = config_to_dict(load_config("verl"))
    composed = config_to_dict(load_config("verl", translation.overrides))
    changed = {
        f"{section}.{key}"
        for section, values in composed.items()
        for key in values
        if values[key] != preset[section][key]
    }
    assert changed == {
        "actor.model_path",  # verl's placeholder paths
        "critic.model_path",
        "critic.tokenizer_path",
        "data.train_files",
        "data.val_files",
        "reward.reward_model",  # its placeholder model path
        "rollout.tensor_parallel",  # 2 GPUs per engine in verl; 1 in the preset (comment there)
        "rollout.weight_bucket_mb",  # verl's 2 GiB buckets; Tandem's 256 MiB suit a laptop too
        "trainer.loggers",  # wandb
        "trainer.workers_per_node",  # verl's 8 GPUs
        "trainer.run_dir",  # verl's default_local_dir: the same folder as the preset's output_dir nesting
        "trainer.profile",  # verl's profile folder, outputs/profile; nothing is profiled by default
    }


def test_hydra_defaults_are_composed_as_hydra_does(tmp_path, monkeypatch):
    """`group@package: option` lands at the package relative to the including file's, `../group` is a
    sibling folder, `_self_` orders the file's own keys, and interpolations resolve after merging."""
    root = tmp_path / "verl_config"
    (root / "actor").mkdir(parents=True)
    (root / "optim").mkdir()
    (root / "ppo_trainer.yaml").write_text(
        "defaults:\n  - actor@actor_rollout_ref.actor: dp_actor\n  - _self_\n"
        "actor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 64\n"
        "trainer:\n  project_name: p\n  default_local_dir: ckpt/${trainer.project_name}\n"
    )
    (root / "actor" / "dp_actor.yaml").write_text(
        "defaults:\n  - ../optim@optim: fsdp\n  - actor\n  - _self_\nppo_mini_batch_size: 32\n"
        "use_remove_padding: ${oc.select:actor_rollout_ref.model.use_remove_padding,false}\n"
        "ppo_max_token_len_per_gpu: ${oc.env:TANDEM_TEST_TOKENS,100}\n"
    )
    (root / "actor" / "actor.yaml").write_text(
        "ppo_mini_batch_size: 16\nclip_ratio: 0.2\nloss: ${.clip_ratio}\n"
    )
    (root / "optim" / "fsdp.yaml").write_text("lr: 1e-6\n")
    examples = tmp_path / "examples"
    examples.mkdir()
    (examples / "mine.yaml").write_text(
        "hydra:\n  searchpath:\n    - file://verl_config\n"
        "defaults:\n  - ppo_trainer\n  - _self_\n"
        "actor_rollout_ref:\n  actor:\n    optim:\n      lr: 3e-6\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TANDEM_TEST_TOKENS", "4096")
    tree = compose(examples / "mine.yaml")
    actor = tree["actor_rollout_ref"]["actor"]
    assert actor["ppo_mini_batch_size"] == 64  # ppo_trainer's own keys come after its defaults
    assert actor["optim"] == {"lr": 3e-6}  # the including file wins; OmegaConf reads 3e-6 as a number
    assert actor["use_remove_padding"] is False and actor["ppo_max_token_len_per_gpu"] == "4096"
    assert actor["loss"] == 0.2
    assert tree["trainer"]["default_local_dir"] == "ckpt/p"
    cfg = load_config(str(examples / "mine.yaml"))  # a verl YAML given as the config file
    assert cfg.actor.ppo_mini_batch_size == 64 and cfg.actor.optim.lr == 3e-6
    assert cfg.actor.max_tokens_per_micro_batch == 4096 and cfg.trainer.run_dir == "ckpt/p"
    # the command line's keys are applied before the interpolations resolve, as verl's Hydra applies them
    tree = compose(
        examples / "mine.yaml", ["trainer.project_name=q", "actor_rollout_ref.actor.clip_ratio=0.3"]
    )
    assert (
        tree["trainer"]["default_local_dir"] == "ckpt/q" and tree["actor_rollout_ref"]["actor"]["loss"] == 0.3
    )
    # a defaults entry that names no file stops the run, as it stops verl, naming the entry and what to do
    (examples / "broken.yaml").write_text(
        "hydra:\n  searchpath:\n    - file://verl_config\ndefaults:\n  - ppo_trainer\n  - missing_part\n  - _self_\n"
    )
    with pytest.raises(ConfigError, match="missing_part.*Give --config-path the folder"):
        load_config(str(examples / "broken.yaml"))


def write_multiturn_config(root: Path) -> Path:
    """verl's examples/sglang_multiturn/config/gsm8k_multiturn_grpo.yaml beside verl's config folder (the real
    one, data/verl_config), as in a verl checkout; returns its folder."""
    verl_config = root / "verl" / "trainer" / "config"
    verl_config.mkdir(parents=True)
    shutil.copytree(VERL_CONFIG, verl_config, dirs_exist_ok=True)
    examples = root / "examples" / "sglang_multiturn" / "config"
    examples.mkdir(parents=True)
    (examples / "gsm8k_multiturn_grpo.yaml").write_text(
        yaml.safe_dump(MULTITURN_GSM8K_CONFIG, sort_keys=False)
    )
    return examples


def test_hydra_flags_on_the_command_line(tmp_path, monkeypatch, capsys):
    examples = write_multiturn_config(tmp_path)
    monkeypatch.chdir(tmp_path)  # hydra.searchpath file://verl/trainer/config is relative to it
    argv = ["config", f"--config-path={examples}", "--config-name=gsm8k_multiturn_grpo"]
    assert main([*argv, "data.train_batch_size=256", "actor_rollout_ref.actor.ppo_mini_batch_size=64"]) == 0
    out = capsys.readouterr()
    cfg = yaml.safe_load(out.out)
    assert cfg["actor"]["ppo_mini_batch_size"] == 64 and cfg["data"]["max_prompt_length"] == 1024
    assert cfg["rollout"]["mode"] == "async" and cfg["rollout"]["engine"] == "auto"  # sglang: vLLM runs
    assert cfg["rollout"]["multi_turn"]["max_assistant_turns"] == 5
    assert "tandem: read verl config " in out.err and "gsm8k_multiturn_grpo.yaml with its defaults" in out.err
    assert main(["config", "ppo", *argv[1:]]) == 2
    assert "give the config once: the preset or YAML 'ppo', or --config-name" in capsys.readouterr().err
    assert main(["config", "--from-verl", str(examples / "gsm8k_multiturn_grpo.yaml")]) == 0
    assert (
        "#   data.return_raw_chat: true  -- Tandem keeps each row's chat messages" in capsys.readouterr().out
    )


def test_hydra_flags_anywhere_on_the_command_line(tmp_path, monkeypatch, capsys):
    """Hydra takes --config-path / --config-name between the overrides: `tandem config a=1 -cp D -cn N b=2`."""
    examples = write_multiturn_config(tmp_path)
    monkeypatch.chdir(tmp_path)
    argv = [
        "config",
        "data.train_batch_size=256",
        f"--config-path={examples}",
        "--config-name",
        "gsm8k_multiturn_grpo",
        "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    ]
    assert main(argv) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["data"]["train_batch_size"] == 256 and cfg["actor"]["ppo_mini_batch_size"] == 64
    assert cfg["rollout"]["multi_turn"]["max_assistant_turns"] == 5  # from the named config
    assert hydra_flags_first(["train", "a=1", "-cp", "D", "b=2", "-cn=N"]) == [
        "train",
        "-cp",
        "D",
        "-cn=N",
        "a=1",
        "b=2",
    ]


def test_older_global_micro_batch_keys_are_divided_by_the_gpu_counts_of_file_and_command_line(
    tmp_path, monkeypatch
):
    """verl divides its older global micro-batch keys by nnodes x n_gpus_per_node as the whole config gives
    them: a --config-path YAML's counts, with the command line's over them (before: each side alone, and
    verl's default 8 where the command line named no count)."""
    write_multiturn_config(tmp_path)  # verl/trainer/config/ppo_trainer.yaml
    examples = tmp_path / "examples"
    (examples / "mine.yaml").write_text(
        "hydra:\n  searchpath:\n    - file://verl/trainer/config\n"
        "defaults:\n  - ppo_trainer\n  - _self_\n"
        "trainer:\n  nnodes: 1\n  n_gpus_per_node: 2\n"
        "actor_rollout_ref:\n  rollout:\n    log_prob_micro_batch_size: 16\n"
    )
    monkeypatch.chdir(tmp_path)
    path = str(examples / "mine.yaml")
    # the file's 2 GPUs divide a command line's size: 16 / 2, not 16 / 8
    cfg = load_config(path, ["actor_rollout_ref.actor.ppo_micro_batch_size=16"])
    assert cfg.actor.micro_batch_size_per_rank == 8 and cfg.rollout.log_prob_micro_batch_size_per_rank == 8
    # the command line's GPU count divides the file's size too (as Hydra applies it over the file)
    cfg = load_config(path, ["trainer.n_gpus_per_node=4", "trainer.nnodes=2"])
    assert cfg.rollout.log_prob_micro_batch_size_per_rank == 2  # 16 / (2 x 4)
    assert cfg.trainer.nnodes == 2


def test_verls_real_megatron_config_resolves_after_the_command_line_as_verl_does():
    """verl's ppo_megatron_trainer.yaml makes the reference's sizes `${oc.select:<the actor's>,1}`: the command
    line's actor sizes reach them (they were resolved before the command line, so the reference kept 1 and a
    GRPO megatron script was refused); the critic keeps its own engine default (1), read only when it is built."""
    sizes = [
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
    ]
    tree = compose(VERL_CONFIG / "ppo_megatron_trainer.yaml", sizes)
    ref, critic = tree["actor_rollout_ref"]["ref"]["megatron"], tree["critic"]["megatron"]
    assert (ref["tensor_model_parallel_size"], ref["pipeline_model_parallel_size"]) == (2, 2)
    assert (critic["tensor_model_parallel_size"], critic["pipeline_model_parallel_size"]) == (1, 1)
    # a GRPO run with KL loss (the reference is built at the actor's layout; no critic), as verl's script gives it
    cfg = load_config(
        str(VERL_CONFIG / "ppo_megatron_trainer.yaml"),
        [*sizes, "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=True"],
        on_verl=lambda t: None,
    )
    assert cfg.actor.megatron.tensor_parallel == 2 and cfg.derived.reference_needed
    assert not cfg.derived.critic_needed
    # the command line naming another reference size is still refused, naming both
    with pytest.raises(
        ConfigError, match="ref.megatron.tensor_model_parallel_size=1 differs from the actor's"
    ):
        load_config(
            str(VERL_CONFIG / "ppo_megatron_trainer.yaml"),
            [
                *sizes,
                "actor_rollout_ref.actor.use_kl_loss=True",
                "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=1",
            ],
            on_verl=lambda t: None,
        )


@pytest.mark.parametrize("name", ["ppo_trainer", "ppo_megatron_trainer"])
def test_composing_verls_folder_gives_verls_own_generated_config(name):
    """verl writes _generated_<name>.yaml from its own Hydra composition: Tandem's (Hydra's, before resolving)
    equals it key for key, value for value."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(VERL_CONFIG), version_base=None):
        ours = OmegaConf.to_container(hydra_compose(config_name=name))
    theirs = OmegaConf.to_container(OmegaConf.load(VERL_CONFIG / f"_generated_{name}.yaml"))
    assert ours == theirs


def test_verls_sft_yamls_load_over_their_own_trainers_defaults():
    """--config-name sft_trainer_engine (verl.trainer.sft_trainer) is read over the newer trainer's preset,
    sft_trainer (fsdp_sft_trainer) over the older one's: each gets its own trainer's optimizer and batching."""
    quiet = {"on_verl": lambda translation: None, "sft": True}
    engine = load_config(str(VERL_CONFIG / "sft_trainer_engine.yaml"), ["model.path=m"], **quiet)
    assert (engine.actor.optim.lr, engine.actor.optim.lr_scheduler, engine.actor.optim.betas) == (
        1e-3,
        "constant",
        (0.9, 0.999),
    )
    assert engine.actor.sequence_packing and engine.actor.max_tokens_per_micro_batch == 8192
    older = load_config(str(VERL_CONFIG / "sft_trainer.yaml"), ["model.partial_pretrain=m"], **quiet)
    assert (older.actor.optim.lr, older.actor.optim.lr_scheduler, older.actor.optim.betas) == (
        1e-5,
        "cosine",
        (0.9, 0.95),
    )
    assert not older.actor.sequence_packing


def test_a_tandem_command_line_with_a_key_verl_has_too_keeps_tandems_preset(capsys):
    """trainer.device is a key of both: `tandem config trainer.device=cpu` is GRPO's preset with it, not verl's
    defaults under it (and a line with a verl-only key still is verl's)."""
    assert main(["config", "trainer.device=cpu"]) == 0
    out = capsys.readouterr()
    assert (
        "tandem config verl" not in out.err
        and yaml.safe_load(out.out)["algorithm"]["adv_estimator"] == "grpo"
    )
    assert main(["config", "trainer.device=cpu", "trainer.n_gpus_per_node=1"]) == 0
    out = capsys.readouterr()
    assert "tandem config verl" in out.err and yaml.safe_load(out.out)["algorithm"]["adv_estimator"] == "gae"
