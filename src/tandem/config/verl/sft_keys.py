"""verl's SFT keys (`fsdp_sft_trainer`'s sft_trainer.yaml, `sft_trainer`'s sft_trainer_engine.yaml) and what
each means in `tandem sft`: read by `config/verl/translate.py` when the config is an SFT run.

An SFT key either has a rule of its own here, or is verl's RL key of the same meaning under another name
(`optim.lr` is `actor_rollout_ref.actor.optim.lr`, `model.lora_rank` is `actor_rollout_ref.model.lora_rank`):
that key's rule in `config/verl/keys.py` applies, and messages name the SFT key as written. Keys verl's SFT
and Tandem share (`data.train_files`, `data.prompt_key`, `data.max_length`, `trainer.total_epochs`, ...)
need no entry. The names and defaults follow verl's examples/ at b178a3c (2026-01).
"""

from __future__ import annotations

from typing import Any

from tandem.config.verl.model_overrides import SFT_MODEL
from tandem.config.verl.rules import Rule, UnsupportedValue, maps, no_effect, unsupported
from tandem.config.verl.values import (
    float32_only,
    fsdp_mixed_precision,
    master_dtype,
    precision,
    verl_loggers,
)


def _sft_truncation(value: Any) -> str:
    if value in ("error", "right"):
        return value
    raise UnsupportedValue(
        f"Tandem's SFT truncation is error or right (cut the end), not {value!r}: cutting the start would "
        "train on a response without the prompt it answers"
    )


def _chat_template_text(value: Any) -> str:
    if value in (None, "", "null"):
        return "auto"
    raise UnsupportedValue(
        "Tandem renders with the tokenizer's own chat template; give a tokenizer folder that holds this "
        "template (actor.tokenizer_path)"
    )


def _engine_group(value: Any) -> str:
    if value in ("fsdp", "fsdp2"):
        return "fsdp"
    if value == "megatron":
        return "megatron"
    raise UnsupportedValue(f"Tandem's training engines are fsdp (FSDP2) and megatron, not {value!r}")


def _all_samples(value: Any) -> None:
    if value is not None and value > 0:
        raise UnsupportedValue(
            "Tandem's SFT reads every row of the files; write the rows you want into a parquet file of "
            "their own (pandas: df.sample(n, random_state=seed).to_parquet(path))"
        )


def _half_cycle(value: Any) -> None:
    if value not in (None, 0.5):
        raise UnsupportedValue("Tandem's cosine schedule makes one half cycle (0.5); set it 0.5")


def _false_only(what: str):
    def check(value: Any) -> None:
        if value in (True, "true", "True"):
            raise UnsupportedValue(what)

    return check


def _fsdp_size(value: Any) -> None:
    if value not in (None, -1):
        raise UnsupportedValue(
            "Tandem shards over every rank (FSDP2 without hybrid sharding groups); set it -1"
        )


def _no_dynamic(value: Any) -> bool:
    return value in (True, "true", "True")


_ROW_TOOLS = (
    "Tandem renders the tools of rollout.multi_turn.tool_file for every row; reading a row's own tools column "
    "is not built"
)
_ROW_THINKING = (
    "Tandem renders each conversation with the chat template's defaults; reading a row's enable_thinking column "
    "is not built"
)
_TANDEM_PADS = "Tandem packs an SFT micro-batch's rows without padding (actor.sequence_packing)"

# verl SFT key -> its rule in Tandem
SFT_KEYS: dict[str, Rule] = {
    "model.partial_pretrain": maps("actor.model_path"),
    "model.path": maps("actor.model_path"),
    "model.strategy": maps("actor.strategy", convert=_engine_group),
    "model.hf_config_path": unsupported("Tandem reads config.json from the model folder (model.path)"),
    "model.custom_chat_template": maps("data.chat_template", convert=_chat_template_text),
    "model.fsdp_config.model_dtype": maps("actor.fsdp.model_dtype", convert=master_dtype),
    "model.fsdp_config.cpu_offload": maps(
        "actor.fsdp.cpu_offload", "one switch: parameters, gradients and optimizer state move together"
    ),
    "model.fsdp_config.offload_params": maps(
        "actor.fsdp.cpu_offload", "one switch: parameters, gradients and optimizer state move together"
    ),
    "ulysses_sequence_parallel_size": maps("actor.fsdp.sequence_parallel"),
    "use_remove_padding": maps("actor.sequence_packing"),
    # data: batch sizes count rows; an SFT step is one optimizer step (Tandem's mini-batch = the batch)
    "data.train_batch_size": maps("data.train_batch_size,actor.ppo_mini_batch_size"),
    "data.micro_batch_size_per_gpu": maps("actor.micro_batch_size_per_rank"),
    "data.micro_batch_size": no_effect(
        "verl's SFT trainers read data.micro_batch_size_per_gpu only (this older key is unused there)"
    ),
    "data.max_token_len_per_gpu": maps("actor.max_tokens_per_micro_batch"),
    "data.use_dynamic_bsz": maps("actor.use_dynamic_bsz", convert=_no_dynamic),
    "data.pad_mode": no_effect(_TANDEM_PADS),
    "data.truncation": maps("data.truncation", convert=_sft_truncation),
    "data.balance_dp_token": no_effect(
        "Tandem always divides the loss by the trained tokens of the whole batch (verl's true); with false "
        "verl averages each rank's own token mean, which weighs a token differently where ranks hold "
        "different token counts"
    ),
    "data.chat_template": maps("data.chat_template", convert=_chat_template_text),
    "data.train_max_samples": maps("", "-1: every row (Tandem reads them all)", convert=_all_samples),
    "data.val_max_samples": maps("", "-1: every row (Tandem reads them all)", convert=_all_samples),
    "data.shuffle": maps("data.shuffle"),
    "data.use_shm": no_effect("Tandem reads the data from disk"),
    "data.custom_cls.path": maps(
        "data.custom_dataset_file",
        "built as verl's SFT trainers build it; its items (input_ids, loss_mask, attention_mask) are read once at "
        "start-up, the padding dropped, the loss mask read as verl's trainers read it",
    ),
    "data.custom_cls.name": maps("data.custom_dataset_class"),
    "data.multiturn.enable": no_effect(
        "Tandem reads a row as a conversation when its data.messages_key field is set, else as a "
        "(prompt, response) pair"
    ),
    "data.multiturn.messages_key": maps("data.messages_key"),
    "data.multiturn.tools_key": unsupported(_ROW_TOOLS),
    "data.tools_key": unsupported(_ROW_TOOLS),
    "data.multiturn.enable_thinking_key": unsupported(_ROW_THINKING),
    "data.enable_thinking_key": unsupported(_ROW_THINKING),
    "data.ignore_input_ids_mismatch": maps(
        "",
        "false: a conversation whose tokens differ is an error naming the row",
        convert=_false_only(
            "Tandem trains a conversation only when its turn-by-turn tokens equal its whole tokens (else the "
            "loss mask would not line up); set it false"
        ),
    ),
    "optim.total_training_steps": no_effect(
        "Tandem's schedule spans the run's steps (trainer.total_training_steps or the epochs)"
    ),
    "optim.num_cycles": maps("", "0.5: Tandem's cosine makes one half cycle", convert=_half_cycle),
    "optim.min_lr": unsupported("give it as a share of optim.lr: optim.min_lr_ratio"),
    "optim.lr_warmup_init": maps(
        "", "0: warm-up starts from 0", convert=_false_only("Tandem's warm-up starts from 0; set it 0")
    ),
    "engine.fsdp_size": maps("", "-1: Tandem shards over every rank", convert=_fsdp_size),
    "engine.strategy": maps("actor.strategy", convert=_engine_group),
    "engine.seed": no_effect("Tandem seeds everything from trainer.seed"),
    "engine.full_determinism": no_effect("Tandem sets no deterministic-algorithms switch"),
    "engine.forward_only": no_effect("`tandem sft` trains; its validation runs forward only"),
    "engine.dtype": maps("actor.fsdp.param_dtype"),
    "engine.model_dtype": maps("actor.fsdp.model_dtype", convert=master_dtype),
    # Hydra's config groups of sft_trainer_engine.yaml (`engine=fsdp optim=fsdp` pick its YAML files)
    "engine": maps("actor.strategy", convert=_engine_group),
    "optim": no_effect("the optimizer's settings are optim.*"),
    "model": no_effect("the model's settings are model.*"),
    "data.num_workers": no_effect(
        "Tandem's SFT reads and tokenizes every row once at start-up; no data-loader workers feed the steps"
    ),
    "trainer.logger": maps(
        "trainer.loggers",
        "verl's file logger is Tandem's jsonl: a JSON line of metrics per step in <run folder>/metrics.jsonl",
        convert=verl_loggers,
    ),
    "engine.mixed_precision": maps(
        "actor.fsdp",
        "verl's FSDP compute and reduce dtypes (bf16 and fp32 where left out)",
        convert=fsdp_mixed_precision,
    ),
    "engine.mixed_precision.param_dtype": maps("actor.fsdp.param_dtype", convert=precision),
    "engine.mixed_precision.reduce_dtype": maps("actor.fsdp.reduce_dtype", convert=precision),
    "engine.mixed_precision.buffer_dtype": maps(
        "", "fp32: Tandem keeps buffers in float32", convert=float32_only
    ),
    "trainer.max_ckpt_to_keep": maps("trainer.max_checkpoints_to_keep"),
    "trainer.profile_interval": no_effect("Tandem's profiler is trainer.profile.*"),
}

# verl SFT prefix -> verl RL prefix whose rules apply (most specific first)
SFT_AS_RL: list[tuple[str, str]] = [
    ("model.fsdp_config.", "actor_rollout_ref.actor.fsdp_config."),
    ("model.", "actor_rollout_ref.model."),
    ("optim.", "actor_rollout_ref.actor.optim."),
    ("engine.", "actor_rollout_ref.actor.fsdp_config."),
    ("checkpoint.", "actor_rollout_ref.actor.checkpoint."),
    ("trainer.checkpoint.", "actor_rollout_ref.actor.checkpoint."),  # sft_trainer.yaml's place for them
    ("profiler.", "actor_rollout_ref.actor.profiler."),
]

# sections only verl's SFT has: a key under one of them that no rule covers is an error, never a guess
SFT_ONLY_PREFIXES = (
    "model.",
    "optim.",
    "engine.",
    "checkpoint.",
    "trainer.checkpoint.",
    "profiler.",
    "data.multiturn.",
)


def sft_rule_key(key: str) -> tuple[Rule | None, str]:
    """(its own rule, or None; the verl RL key whose rule applies otherwise, or '') for SFT key `key`."""
    if key in SFT_KEYS:
        return SFT_KEYS[key], ""
    override = SFT_MODEL.rule(key)
    if override is not None:
        return override, ""
    for sft_prefix, rl_prefix in SFT_AS_RL:
        if key.startswith(sft_prefix):
            return None, rl_prefix + key.removeprefix(sft_prefix)
    return None, ""


def is_sft_key(key: str) -> bool:
    """A key of verl's SFT configs that Tandem reads differently, or not at all."""
    return key in SFT_KEYS or key.startswith(SFT_ONLY_PREFIXES)
