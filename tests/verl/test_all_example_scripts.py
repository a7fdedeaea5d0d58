"""All 139 of verl's example scripts (examples/**/*.sh at verl b178a3cd), resolved as `tandem config` resolves
them, in this one process: each is accepted, or refused for a reason listed in REFUSED below.

The command lines are data (tests/verl/data/examples.json, written by scripts/extract_verl_examples.py). What
the test changes, and nothing else: the files a script names are the test's own (the tiny model, a GSM8K
parquet, verl's GSM8K tool and interaction YAML, a reward file defining the function the script names),
since `tandem config` opens them and the user's files are not here. No size is changed: `tandem config`
resolves a layout for the 8-GPU nodes the scripts name without needing the GPUs.

Every PPO and SFT command line is composed as verl's Hydra composes it, by Hydra itself, from verl's real
config folder (tests/verl/data/verl_config: verl/trainer/config at that commit, with its defaults lists) as a
user's `tandem config --config-path=<verl>/verl/trainer/config --config-name=NAME ...` gives it: NAME is the
script's --config-name, or its entry point's own (ppo_trainer for main_ppo, sft_trainer / sft_trainer_engine
for the SFT trainers); an example's own YAML (examples/*/config/*.yaml, kept in examples.json) is composed with
verl's folder on its hydra.searchpath. main_generation command lines go through `tandem generate`'s config.

A script the config accepts that runs the megatron engine is then put through the checks that run before any
worker starts and read its model folders (`check_available`: megatron's check_buildable, the rollout engine's
and the vision-language checks), on a tiny folder of the model kind the script trains (megatron_kinds.py: a
Qwen3-MoE for Qwen3-30B-A3B, a DeepSeek-V3 for Moonlight, ...) sized so that its layout divides it; what they
refuse is the script's refusal. So is every FSDP run of main_ppo / main_ppo_split and every SFT run (its "sft"
checks: the trainer runs them too), on a folder of its kind (fsdp_kinds.py); main_generation runs none.
"""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tandem.config import ConfigError, load_config
from tandem.config.generate import load_generate_config
from tandem.engine.hf_io import auto_class, unloadable_folders
from tandem.engine.hf_io import load_config as load_hf_config
from tandem.models.tiny import save_tiny
from tandem.train_engine_options import facts
from tandem.trainer.start_checks.available import check_available

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: the shared verl-format fixtures
from tools.verl_rows import INTERACTION_YAML, TOOL_YAML, gsm8k_rows, write_parquet
from verl.fsdp_kinds import FSDP_KINDS
from verl.megatron_kinds import MEGATRON_KINDS, kind_of_path, save_kind

DATA = Path(__file__).parent / "data"
VERL_CONFIG = DATA / "verl_config"  # verl's verl/trainer/config, as a user's --config-path names it
EXAMPLES = json.loads((DATA / "examples.json").read_text())
SCRIPTS = {s["script"]: s for s in EXAMPLES["scripts"]}

HARDWARE = (
    "hardware"  # an accelerator or cluster Tandem does not run on (NPU, a layout larger than the nodes)
)
MISSING = "missing feature"  # a feature Tandem names as missing in the message
SCRIPT_ERROR = "the script's own error"  # verl would fail on it too (an unset shell variable)
NOT_READ_YET = "not read yet"  # a key or value verl takes that Tandem does not read yet (to fix)

# script -> (class, the text every problem line of it holds one of); a script refused otherwise, or one listed
# here that is accepted, fails the test
# use_dist_checkpointing=True with an empty dist_checkpointing_path, a folder the script leaves to its user
_DIST_CKPT = ("dist_checkpointing_path=FOLDER, the megatron distributed checkpoint",)


def _megatron_builds(model_type: str) -> str:
    """convert.check_supported's refusal of a model_type megatron does not convert."""
    return (
        "actor.strategy=megatron builds qwen2, qwen3, llama, mixtral, qwen3_moe models; this folder's "
        f"config.json has model_type='{model_type}'"
    )


def _agent_loop_tp(tp: int = 2) -> str:
    """rollout_engine.py's refusal of the agent loop's engine over `tp` tensor-parallel rollout ranks."""
    return f"rollout.tensor_parallel={tp} with rollout.mode=async (agent loop) is not available yet"


def _fsdp_builds(kind: str) -> str:
    """hf_io.unloadable_folders' refusal of a vision-language `kind` the FSDP2 engine does not build."""
    return f"a {kind!r} vision-language model; the FSDP2 engine builds qwen2_vl"


_AGENT_LOOP_TP = _agent_loop_tp()
REFUSED: dict[str, tuple[str, tuple[str, ...]]] = {
    # hardware
    "examples/grpo_trainer/run_qwen2_5_7b_grpo_discrete_prof_npu.sh": (HARDWARE, ("no 'npu' hooks",)),
    "examples/grpo_trainer/run_qwen2_5_7b_grpo_e2e_prof_npu.sh": (HARDWARE, ("no 'npu' hooks",)),
    "examples/gspo_trainer/run_qwen3_32b_gspo_npu.sh": (HARDWARE, ("not 'npu'",)),
    # a feature Tandem names as missing
    "examples/grpo_trainer/run_moonlight16b_math_megatron.sh": (SCRIPT_ERROR, _DIST_CKPT),
    "examples/grpo_trainer/run_qwen2_5_vl-7b-megatron.sh": (SCRIPT_ERROR, _DIST_CKPT),
    "examples/grpo_trainer/run_qwen2-7b_math_megatron_trtllm.sh": (MISSING, ("not 'trtllm'",)),
    "examples/grpo_trainer/run_qwen2-7b_math_trtllm.sh": (MISSING, ("not 'trtllm'",)),
    "examples/mtp_trainer/test_dapo_mimo_7b_with_mtp_math_megatron.sh": (
        MISSING,
        ("no multi-token prediction",),
    ),
    # vision-language models the FSDP2 engine does not build (it builds qwen2_vl), and a model of its own code: the
    # start-up check that reads the folder (engine/hf_io.py unloadable_folders) refuses them
    "examples/grpo_trainer/run_qwen2_5_vl-7b-sglang.sh": (MISSING, (_fsdp_builds("qwen2_5_vl"),)),
    "examples/grpo_trainer/run_qwen2_5_vl-7b.sh": (MISSING, (_fsdp_builds("qwen2_5_vl"),)),
    "examples/grpo_trainer/run_qwen2_5_vl-7b_freeze_vision.sh": (MISSING, (_fsdp_builds("qwen2_5_vl"),)),
    "examples/grpo_trainer/run_qwen2_5_vl-7b_lora.sh": (MISSING, (_fsdp_builds("qwen2_5_vl"),)),
    "examples/grpo_trainer/run_qwen2_5_vl-7b_seq_balance.sh": (MISSING, (_fsdp_builds("qwen2_5_vl"),)),
    "examples/grpo_trainer/run_qwen2_5_vl_32b_npu.sh": (MISSING, (_fsdp_builds("qwen2_5_vl"),)),
    "examples/grpo_trainer/run_qwen2_5_vl_3b_npu.sh": (MISSING, (_fsdp_builds("qwen2_5_vl"),)),
    "examples/grpo_trainer/run_qwen2_5_vl_7b_npu.sh": (MISSING, (_fsdp_builds("qwen2_5_vl"),)),
    "examples/grpo_trainer/run_glm41v_9b.sh": (MISSING, (_fsdp_builds("glm4v"),)),
    "examples/sft/vlm/run_qwen3_vl_2b.sh": (MISSING, (_fsdp_builds("qwen3_vl"),)),
    "examples/grpo_trainer/run_minicpmo2_6.sh": (
        MISSING,
        ("names code of its own (auto_map, model_type 'minicpmo')",),
    ),
    # R3: the rollout engine's routing, which no rollout engine here returns (R2, the vLLM script, is accepted);
    # rollout.name=sglang reads as auto (SGLANG_NOTE), and vLLM returns routed experts only from its Model Runner
    # V2, which needs Triton (its CPU backend on vLLM's CPU build): tests/rollout/test_vllm_routed_experts.py
    "examples/router_replay/run_qwen30_a3b_megatron_sglang.sh": (
        MISSING,
        ("Tandem's rollout engines do not return them",),
    ),
    # megatron runs refused by the start-up checks on a model folder of their kind (megatron_kinds.py): the
    # megatron engine converts qwen2, qwen3, llama, mixtral and qwen3_moe folders only
    "examples/grpo_trainer/run_deepseek671b_math_megatron_80gb.sh": (
        MISSING,
        (_megatron_builds("deepseek_v3"),),
    ),
    "examples/grpo_trainer/run_deepseek671b_math_megatron_96gb.sh": (
        MISSING,
        (_megatron_builds("deepseek_v3"),),
    ),
    "examples/ppo_trainer/run_moonlight16b_a3b_gsm8k_megatron.sh": (
        MISSING,
        (_megatron_builds("deepseek_v3"),),
    ),
    "examples/ppo_trainer/run_qwen1.5_moe_a2.7b-gsm8k_megatron.sh": (
        MISSING,
        (_megatron_builds("qwen2_moe"),),
    ),
    "examples/grpo_trainer/run_qwen3_vl-235b-megatron.sh": (MISSING, (_megatron_builds("qwen3_vl_moe"),)),
    "examples/grpo_trainer/run_qwen3_vl-30b-megatron.sh": (MISSING, (_megatron_builds("qwen3_vl_moe"),)),
    "examples/grpo_trainer/run_qwen3_vl-8b-megatron.sh": (MISSING, (_megatron_builds("qwen3_vl"),)),
    # ... and the agent loop's engine over tensor-parallel rollout ranks (rollout_engine.py's start-up check)
    "examples/sglang_multiturn/geo3k/run_qwen2.5-3b_megatron_geo3k_multiturn.sh": (
        MISSING,
        (_megatron_builds("qwen2_5_vl"), _AGENT_LOOP_TP),
    ),
    "examples/sglang_multiturn/run_qwen2.5-3b_megatron_gsm8k_multiturn.sh": (MISSING, (_AGENT_LOOP_TP,)),
    # FSDP runs refused by the same start-up checks (fsdp_kinds.py): the agent loop over tensor-parallel rollout
    # ranks
    "examples/sglang_multiturn/geo3k/run_qwen2.5-3b_geo3k_multiturn.sh": (
        MISSING,
        (_AGENT_LOOP_TP, _fsdp_builds("qwen2_5_vl")),
    ),
    "examples/sglang_multiturn/geo3k/run_qwen2.5-3b_geo3k_multiturn_4xgpu.sh": (
        MISSING,
        (_AGENT_LOOP_TP, _fsdp_builds("qwen2_5_vl")),
    ),
    "examples/sglang_multiturn/gsm8k_toolcall_shaping/run_gsm8k_grpo_toolcall_shaping.sh": (
        MISSING,
        (_AGENT_LOOP_TP,),
    ),
    "examples/sglang_multiturn/run_qwen0.5b_gsm8k_multiturn_curriculum.sh": (MISSING, (_AGENT_LOOP_TP,)),
    "examples/sglang_multiturn/run_qwen2.5-0.5b_gsm8k_multiturn_w_interaction.sh": (
        MISSING,
        (_AGENT_LOOP_TP,),
    ),
    "examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_4xgpu.sh": (MISSING, (_AGENT_LOOP_TP,)),
    "examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_4xgpu_server.sh": (
        MISSING,
        (_agent_loop_tp(4),),
    ),
    "examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_tool_agent_mlflow.sh": (MISSING, (_AGENT_LOOP_TP,)),
    "examples/sglang_multiturn/run_qwen3-4b_gsm8k_multiturn.sh": (MISSING, (_AGENT_LOOP_TP,)),
    # the script's own error
    "examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_vllm_fsdp.sh": (
        SCRIPT_ERROR,
        ("actor.use_kl_loss needs a value",),  # use_kl_loss=${use_kl_loss}, a variable it never sets
    ),
    # verl's YAML says trainer.n_gpus_per_node=8 and rollout.n=1: a per-rank mini-batch of 32 x 1 / 8 = 4 samples,
    # which verl's own check (mini-batch % ppo_micro_batch_size_per_gpu=8) refuses as well
    "examples/rollout_correction/run_with_rollout_corr_multi_rs.sh": (
        SCRIPT_ERROR,
        ("does not divide the per-rank mini-batch of 4 samples",),
    ),
    # the same on verl's 8 GPUs: train_batch_size=128, ppo_mini_batch_size=32, rollout.n=1 (verl's default)
    "examples/rollout_correction/run_with_rollout_corr.sh": (
        SCRIPT_ERROR,
        ("does not divide the per-rank mini-batch of 4 samples",),
    ),
    # `+` on a key verl's config has (actor.fsdp_config.model_dtype): verl's Hydra stops on it as well
    "examples/grpo_trainer/run_gptoss_20b.sh": (SCRIPT_ERROR, ("Could not append to config",)),
    # a stray '}' in trainer.experiment_name=qwen3_4b_grpo_8npu}: Hydra's grammar refuses it on verl as well
    "examples/grpo_trainer/run_qwen3_4b_grpo_vllm_1k_npu.sh": (SCRIPT_ERROR, ("extraneous input '}'",)),
    # model.torch_dtype is no key of verl's config, which Hydra refuses without `+` (its clip_ratio_low=10, CISPO's
    # "no lower clip", is read as verl reads it)
    "examples/cispo_trainer/run_cispo_qwen2_5_0_5b_gsm8k.sh": (SCRIPT_ERROR, ("torch_dtype",)),
    # not read yet: verl takes these values (none left; rollout.n=1 with GRPO / RLOO now runs as verl runs it,
    # the raw score as the advantage, with a start-up warning)
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The test's own files in place of the user's, and verl's config folder for the example YAMLs."""
    tmp = tmp_path_factory.mktemp("verl_examples")
    model = save_tiny(tmp / "model")
    parquet = write_parquet(tmp / "train.parquet", gsm8k_rows(4, interaction=False))
    reward = tmp / "reward.py"
    names = {"compute_score"} | {
        o.partition("=")[2]
        for s in SCRIPTS.values()
        for o in s["overrides"]
        if o.lstrip("+").startswith("custom_reward_function.name=")
    }
    reward.write_text(
        "".join(
            f"def {n}(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"
            for n in names
        )
    )
    # the class data.custom_cls.name names (`tandem config` only checks that the file is there)
    dataset = tmp / "dataset.py"
    dataset.write_text("from torch.utils.data import Dataset\n\n\nclass RLHFDataset(Dataset):\n    pass\n")
    for rel, tree in EXAMPLES[
        "configs"
    ].items():  # the examples' own YAMLs, verl's folder on their searchpath
        tree = {**tree, "hydra": {"searchpath": [f"file://{VERL_CONFIG}"]}}
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(yaml.safe_dump(tree, sort_keys=False))
    paths = {
        "model": str(model),
        "data": str(parquet),
        "actor_rollout_ref.rollout.multi_turn.tool_config_path": str(TOOL_YAML),
        "actor_rollout_ref.rollout.multi_turn.interaction_config_path": str(INTERACTION_YAML),
        "custom_reward_function.path": str(reward),
        "data.custom_cls.path": str(dataset),
        "actor_rollout_ref.model.lora_adapter_path": str(adapter_folder(tmp / "adapter")),
        "data.output_path": str(tmp / "out.parquet"),
        # a megatron distributed checkpoint the script names (an empty one stays empty: the script's error)
        "dist_checkpoint": str(dist_checkpoint_folder(tmp / "mcore")),
    }
    for kind in {*MEGATRON_KINDS.values(), *FSDP_KINDS.values()}:  # a script's model, by kind
        paths[f"model:{kind}"] = save_kind(tmp / "kinds" / kind, kind)
    return tmp, paths


def dist_checkpoint_folder(folder: Path) -> Path:
    """A folder the start-up check takes for a megatron distributed checkpoint (its metadata.json; the weights
    are read by the engine)."""
    folder.mkdir()
    (folder / "metadata.json").write_text("{}")
    return folder


def adapter_folder(folder: Path) -> Path:
    """A PEFT adapter folder as `tandem config` reads it: its adapter_config.json (the weights are read by the
    engine; an empty file stands for them)."""
    folder.mkdir()
    config = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    (folder / "adapter_model.safetensors").write_bytes(b"")
    return folder


MODEL_KEYS = (
    "actor_rollout_ref.model.path",
    "critic.model.path",
    "reward_model.model.path",
    "model.path",
    "model.partial_pretrain",
)
DATA_KEYS = ("data.train_files", "data.val_files", "data.path")
DIST_CHECKPOINT_KEYS = tuple(
    f"{role}.megatron.dist_checkpointing_path"
    for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")
)


def with_test_files(overrides: list[str], paths: dict[str, str]) -> list[str]:
    """The overrides with every file the script names replaced by the test's own (the only change made)."""
    out = []
    for text in overrides:
        key, _, value = text.partition("=")
        bare = key.lstrip("+")
        if bare == "reward_model.model.path" and f"model:{kind_of_path(value)}" in paths:
            value = paths[f"model:{kind_of_path(value)}"]  # a reward model of the kind its path names
        elif bare in MODEL_KEYS:
            value = paths["model"]
        elif bare in DATA_KEYS:
            value = paths["data"]
        elif bare in DIST_CHECKPOINT_KEYS and value:
            value = paths["dist_checkpoint"]
        elif bare in paths:
            value = paths[bare]
        out.append(f"{key}={value}")
    return out


def problems(script: dict, tmp: Path, paths: dict[str, str]) -> list[str]:
    """The problem lines `tandem config` (or `tandem config sft`, `tandem generate`) reports, then for a megatron
    run the start-up checks on a model folder of its kind; [] accepted."""
    kind = MEGATRON_KINDS.get(script["script"], FSDP_KINDS.get(script["script"]))
    if kind is not None:
        paths = {**paths, "model": paths[f"model:{kind}"]}
    overrides = with_test_files(script["overrides"], paths)
    entry = script["entry_point"]
    quiet = {"on_verl": lambda translation: None}
    config = script["config_file"]  # the YAML Hydra composes: verl's own folder, or the example's file
    config = (
        VERL_CONFIG / config.removeprefix("verl/trainer/config/")
        if config.startswith("verl/")
        else tmp / config
    )
    try:
        if entry == "verl.trainer.main_generation":
            load_generate_config(None, overrides, **quiet)
        elif entry in ("verl.trainer.fsdp_sft_trainer", "verl.trainer.sft_trainer"):
            # torchrun's --nproc_per_node: the scripts' first argument, 8 when extracted
            cfg = load_config(str(config), ["trainer.n_gpus_per_node=8", *overrides], sft=True, **quiet)
            return available_problems(cfg, script, "sft")
        else:
            cfg = load_config(str(config), overrides, **quiet)
            return available_problems(cfg, script, "rl")
    except ConfigError as err:
        return [line.strip().removeprefix("- ") for line in str(err).splitlines()[1:]] or [str(err)]
    return []


def available_problems(cfg, script: dict, purpose: str) -> list[str]:
    """The start-up checks' problems (`check_available`), one a line, of a run the config accepts, on the model
    folder of its kind; [] accepted."""
    megatron = facts(cfg.actor.strategy).section == "megatron"
    table = MEGATRON_KINDS if megatron else FSDP_KINDS
    if script["script"] not in table:
        return [f"runs megatron: {megatron}; not in {'megatron' if megatron else 'fsdp'}_kinds"]
    try:
        check_available(cfg, purpose)
    except ConfigError as err:
        return str(err).splitlines()
    return []


def test_the_data_holds_all_139_scripts_by_entry_point():
    assert EXAMPLES["verl_commit"].startswith("b178a3cd")
    assert EXAMPLES["counts"] == {
        "verl.trainer.fsdp_sft_trainer": 9,
        "verl.trainer.main_generation": 2,
        "verl.trainer.main_ppo": 126,
        "verl.trainer.main_ppo_split": 1,
        "verl.trainer.sft_trainer": 1,
    }
    assert len(SCRIPTS) == sum(EXAMPLES["counts"].values()) == 139


def test_every_example_script_is_accepted_or_refused_for_its_listed_reason(files):
    tmp, paths = files
    wrong, accepted = {}, Counter()
    for path, script in SCRIPTS.items():
        found = problems(script, tmp, paths)
        accepted[script["entry_point"]] += not found
        if path not in REFUSED:
            if found:
                wrong[path] = found
            continue
        _, reasons = REFUSED[path]
        unexplained = [line for line in found if not any(r in line for r in reasons)]
        if not found or unexplained:
            wrong[path] = unexplained or ["accepted: remove it from REFUSED"]
    assert wrong == {}
    # accepted per entry point (the rest are in REFUSED)
    assert dict(accepted) == ACCEPTED


ACCEPTED = {
    "verl.trainer.main_ppo": 83,
    "verl.trainer.main_ppo_split": 1,
    "verl.trainer.fsdp_sft_trainer": 9,
    "verl.trainer.sft_trainer": 0,
    "verl.trainer.main_generation": 2,
}


def test_each_megatron_script_s_model_kind_is_the_one_its_model_path_names():
    named = 0
    for path, kind in MEGATRON_KINDS.items():
        model = next(
            o.partition("=")[2]
            for o in SCRIPTS[path]["overrides"]
            if o.lstrip("+").startswith("actor_rollout_ref.model.path=")
        )
        assert kind_of_path(model) in (kind, None), (path, model)
        named += kind_of_path(model) is not None
    assert (len(MEGATRON_KINDS), named) == (27, 25)  # 2 paths are empty: their kind from the script's name


MODEL_PATH_KEYS = ("actor_rollout_ref.model.path=", "model.partial_pretrain=", "model.path=")


def test_each_fsdp_script_s_model_kind_is_the_one_its_model_path_names():
    named = 0
    for path, kind in FSDP_KINDS.items():
        overrides = SCRIPTS[path]["overrides"]
        model = next(
            (o.partition("=")[2] for o in overrides if o.lstrip("+").startswith(MODEL_PATH_KEYS)), ""
        )
        assert kind_of_path(model) in (kind, None), (path, model)
        named += kind_of_path(model) is not None
    # 95 = 84 main_ppo + 1 main_ppo_split + 10 SFT the config accepts; 2 name no model (pfppo: ppo_trainer.yaml's
    # deepseek-llm-7b-chat; tuning/70b h20: model_path), their kind from the script's name
    assert (len(FSDP_KINDS), named) == (95, 93)


# the FSDP scripts whose model the start-up checks accept and the FSDP engine does not build: it loads a model
# through transformers' AutoModelForCausalLM (AutoModelForImageTextToText for qwen2_vl alone, hf_io.auto_class),
# which has no class for these vision-language types, and without trust_remote_code for MiniCPM-o's own code.
# check_available reads no model_type outside VISION_LANGUAGE_TYPES, so they fail only in the workers. A Tandem
# gap (reported), kept here rather than in REFUSED: when the start-up check refuses them, this test fails.
NOT_BUILT_KINDS = {"qwen2_5_vl", "glm4v", "qwen3_vl", "minicpmo"}


def _fsdp_engine_builds(folder: str) -> bool:
    """Whether the FSDP engine's loader has a model class for the folder's config (hf_io.load_config/auto_class)."""
    try:
        config = load_hf_config(folder, "lm")
    except ValueError:  # transformers does not know the model_type (its code is the folder's own)
        return False
    return type(config) in auto_class("lm", config)._model_mapping


def test_the_start_up_check_refuses_exactly_the_kinds_the_fsdp_engine_does_not_build(files):
    """For every model kind an FSDP script trains, the engine's start-up check (hf_io.unloadable_folders) refuses
    the folder exactly when the loader (hf_io.auto_class) has no model class for it."""
    _, paths = files
    refused = set()
    for kind in set(FSDP_KINDS.values()):
        folder = paths[f"model:{kind}"]
        problems = unloadable_folders({"actor.model_path": folder})
        assert (problems == []) == _fsdp_engine_builds(folder), (kind, problems)
        refused |= {kind} if problems else set()
    assert refused == NOT_BUILT_KINDS


def test_every_refusal_names_its_class():
    assert {cls for cls, _ in REFUSED.values()} <= {HARDWARE, MISSING, SCRIPT_ERROR, NOT_READ_YET}
    assert set(REFUSED) <= set(SCRIPTS)


# the one accepted script with rollout.n=1 and a group estimator (run_with_rollout_corr_multi_rs.sh has them too, but
# its micro-batch does not divide verl's per-rank mini-batch on the 8 GPUs verl's YAML names: REFUSED)
ONE_SAMPLE_PER_PROMPT = ("examples/tuning/0.5b/qwen2-0.5b_grpo-lora_1_h100_fsdp_vllm.sh",)


def test_one_sample_per_prompt_runs_as_verl_with_a_warning(files, caplog):
    # verl runs GRPO / RLOO with rollout.n=1: no baseline, the raw score as the advantage
    tmp, paths = files
    for path in ONE_SAMPLE_PER_PROMPT:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tandem.config.checks.algorithm"):
            assert problems(SCRIPTS[path], tmp, paths) == []
        (message,) = [r.getMessage() for r in caplog.records if r.name == "tandem.config.checks.algorithm"]
        assert "rollout.n=1 gives one sample per prompt" in message and "its raw score" in message
