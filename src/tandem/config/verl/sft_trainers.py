"""Which of verl's two SFT trainers a command line is written for, and so which defaults it gets:
`verl.trainer.sft_trainer` (preset `verl_sft_engine`) or `verl.trainer.fsdp_sft_trainer` (preset `verl_sft`).
Each trainer is told by the keys its composed config has and the other's lacks; `tandem sft` (cli.py) asks
`verl_sft_preset` when the command line holds verl's SFT keys. The rules for each key are config/verl/sft_keys.py's.
"""

from __future__ import annotations

from collections.abc import Iterable

from tandem.config.coerce import type_at
from tandem.config.errors import ConfigError

# Which of verl's two SFT trainers a command line is written for: the keys (or sections) one trainer's composed
# config has and the other's lacks. `verl.trainer.sft_trainer` composes sft_trainer_engine.yaml (model/hf_model,
# engine/fsdp, optim/fsdp, profiler); `verl.trainer.fsdp_sft_trainer` sft_trainer.yaml (optim/fsdp). Derived from
# those YAMLs at b178a3c plus the keys verl 0.9.1's sft_trainer_engine.yaml adds (0.9.1 has no fsdp_sft_trainer);
# tests/verl/test_sft_engine.py recomputes the two sets from the YAMLs and holds this table to them.
SFT_TRAINER_ONLY: dict[str, tuple[str, ...]] = {
    "sft_trainer": (
        "engine",
        "checkpoint",
        "profiler",
        "model.path",
        "model.tokenizer_path",
        "model.hf_config_path",
        "model.custom_chat_template",
        "model.override_config",
        "model.use_remove_padding",
        "model.enable_activation_offload",
        "model.exclude_modules",
        "model.lora_adapter_path",
        "model.use_fused_kernels",
        "model.fused_kernel_options",
        "model.tiled_mlp",
        "model.mtp",
        "model.lora",  # 0.9.1
        "data.messages_key",
        "data.tools_key",
        "data.enable_thinking_key",
        "data.enable_thinking_default",  # 0.9.1
        "data.ignore_input_ids_mismatch",
        "data.pad_mode",
        "data.use_dynamic_bsz",
        "data.max_token_len_per_gpu",
        "data.num_workers",  # 0.9.1
        "optim.zero_indexed_step",  # 0.9.1
        "trainer.balance_batch",  # 0.9.1
        "trainer.profile_interval",
    ),
    "fsdp_sft_trainer": (
        "model.partial_pretrain",
        "model.strategy",
        "model.fsdp_config",
        "data.prompt_key",
        "data.response_key",
        "data.prompt_dict_keys",
        "data.response_dict_keys",
        "data.multiturn",
        "data.chat_template",
        "data.micro_batch_size",
        "optim.lr_scheduler",
        "trainer.checkpoint",
        "ulysses_sequence_parallel_size",
        "use_remove_padding",
    ),
}


def sft_trainer_of(key: str) -> str | None:
    """The verl SFT trainer ('sft_trainer' or 'fsdp_sft_trainer') whose config alone has `key` (a `+` / `++`
    prefix dropped; a key under one of its sections counts), or None for a key both have or neither."""
    key = key.lstrip("+")
    for trainer, keys in SFT_TRAINER_ONLY.items():
        if any(key == own or key.startswith(own + ".") for own in keys):
            return trainer
    return None


def verl_sft_preset(keys: Iterable[str]) -> str:
    """The preset of the verl SFT trainer that command-line `keys` are written for: `verl_sft_engine`
    (verl.trainer.sft_trainer: `model.path`, `engine.*`, ...) or `verl_sft` (verl.trainer.fsdp_sft_trainer:
    `model.partial_pretrain`, ...; also where no key tells them apart). Keys Tandem has too (`data.prompt_key`,
    `data.messages_key`) do not decide: a Tandem user may add them to either. Raises ConfigError for keys of both."""
    found: dict[str, str] = {}
    for key in keys:
        key = key.lstrip("+")
        trainer = sft_trainer_of(key)
        if trainer and type_at(key) is None:
            found.setdefault(trainer, key)
    if len(found) == 2:
        raise ConfigError(
            f"{found['sft_trainer']} is a key of verl.trainer.sft_trainer and {found['fsdp_sft_trainer']} one of "
            "verl.trainer.fsdp_sft_trainer; each verl trainer takes its own keys: write the command line of one "
            "(sft_trainer: model.path, engine.*, ...; fsdp_sft_trainer: model.partial_pretrain, ...)"
        )
    return "verl_sft_engine" if "sft_trainer" in found else "verl_sft"
