"""verl's megatron keys (`ppo_megatron_trainer.yaml`'s `*.megatron.*`, `override_*_config`, `model.lora.*`) and
what each means in Tandem: merged into the table of `config/verl/keys.py`.

Tandem builds the reference and the critic with the actor's megatron layout (the engines of one process
share megatron's parallel state), so their own sizes are accepted when they equal the actor's and refused
otherwise (`same_as`: checked against the resolved config, config/loader.py).
"""

from __future__ import annotations

from typing import Any

from tandem.config.verl.rules import Rule, UnsupportedValue, maps, no_effect, unsupported
from tandem.config.verl.values import as_list

_SHARED_LAYOUT = (
    "Tandem builds the {role} with the actor's megatron layout (the engines of one process share "
    "megatron's parallel state): accepted when it equals the actor's"
)


def same_as(target: str, role: str, convert: Any = None) -> Rule:
    """A size of the reference / critic that must equal the actor's Tandem key `target`."""
    return Rule("same", target, _SHARED_LAYOUT.format(role=role), convert)


def _expert_tensor_parallel(value: Any) -> None:
    if value not in (None, 1):
        raise UnsupportedValue(
            "Tandem keeps each expert whole on a rank (expert tensor parallel 1; its experts split over "
            "actor.megatron.expert_parallel ranks instead); set it 1"
        )


def _router_replay(value: Any) -> str:
    """verl's router_replay.mode -> actor.router_replay: disabled -> off, R2 / R3 as they are (R3 is refused by
    the config's check, naming what is missing). verl's FSDP workers ignore the key; Tandem replays on FSDP2 too."""
    modes = {None: "off", "disabled": "off", "R2": "R2", "R3": "R3"}
    if value not in modes:
        raise UnsupportedValue(f"router_replay.mode={value!r}: verl takes disabled, R2 or R3")
    return modes[value]


def _no_mtp_training(value: Any) -> None:
    """verl trains a model's multi-token-prediction layers with an extra loss (mtp.enable_train); Tandem has no
    such layers or loss, so only training without them is taken (mtp.enable alone: speculative decoding in
    the rollout, which changes no number of the update)."""
    if value in (True, "true", "True"):
        raise UnsupportedValue(
            "Tandem has no multi-token prediction: it trains no MTP layers and adds no MTP loss, which changes "
            "the update; set it false"
        )


def _null_is_one(value: Any) -> Any:
    return 1 if value is None else value


_OFFLOAD = {
    "param": "parameters in host memory between calls, back on the GPU for each call that needs them",
    "grad": "gradient buffers freed between updates and allocated again, zeroed, for the next (their values are "
    "dead between updates)",
    "optimizer": "optimizer state (master weights, Adam moments) in host memory between updates",
}


def _offload_rule(role: str, kind: str) -> Rule:
    """verl's `{role}.megatron.{kind}_offload`: the actor's three switches and the reference's parameter switch
    are Tandem's; the critic's engine follows the actor's switches; the reference has no gradients or optimizer."""
    if role == "actor":
        return maps(
            f"actor.megatron.{kind}_offload",
            f"the actor's and critic's {_OFFLOAD[kind]}; on a CPU nothing moves",
        )
    if role == "reference" and kind == "param":
        return maps(
            "reference.megatron_param_offload", f"the reference's {_OFFLOAD[kind]}; on a CPU nothing moves"
        )
    if role == "reference":
        return no_effect("the reference is frozen: no gradients, no optimizer state")
    return no_effect(f"the critic's engine follows actor.megatron.{kind}_offload")


_MBRIDGE = "Tandem converts the Hugging Face weights to megatron-core itself (engine/megatron/convert.py), no mbridge"
_REF_OVERRIDES = "the {role} is built with the actor's actor.megatron.override_transformer_config"
# read together, switch and folder, by config/verl/dist_checkpoint.py (these rules name the targets)
_DIST_START = "with {other}: the {role}'s starting weights, a megatron distributed checkpoint"
_DIST_REF = "Tandem's reference is the actor's starting weights: accepted when it names the actor's folder"
_ETP_ONE = "Tandem's expert tensor parallel is 1"
_LORA_TYPE = (
    "Tandem's LoRA is plain LoRA (PEFT's); verl's other adapter types (dora, canonical_lora) are not built"
)
_LORA_ADAPTER = (
    "verl's megatron-bridge adapter checkpoint is not read: Tandem's adapters start from a PEFT adapter folder, "
    "actor.lora.adapter_path (verl: actor_rollout_ref.model.lora_adapter_path), on either engine"
)
_LORA_EXCLUDE = (
    "verl's megatron exclusion (megatron module names, wildcards) is not read: Tandem's is "
    "{actor,critic}.lora.exclude_modules over the Hugging Face model's module names (verl: "
    "actor_rollout_ref.model.exclude_modules), on either engine"
)


def _lora_a_init(value: Any) -> Any:
    """verl's megatron lora_A_init_method (megatron-bridge's: xavier-uniform or kaiming-uniform) as
    actor.lora.init_a; its default, xavier, is what actor.lora.init_a=auto draws on the megatron engine."""
    if value not in ("kaiming", "xavier"):
        raise UnsupportedValue(
            f"lora_A_init_method={value!r}: Tandem draws A kaiming-uniform or xavier-uniform (actor.lora.init_a); "
            "set it to kaiming or xavier"
        )
    return value


def _lora_b_zero(value: Any) -> None:
    if value not in (None, "zero"):
        raise UnsupportedValue(
            f"lora_B_init_method={value!r}: Tandem starts B at 0 (the model starts as the base model); set it to zero"
        )


MEGATRON_KEYS: dict[str, Rule] = {
    "actor_rollout_ref.actor.megatron.override_transformer_config": unsupported(
        "give its keys one at a time: actor_rollout_ref.actor.megatron.override_transformer_config.NAME=VALUE"
    ),
    # verl's megatron LoRA: the same keys as Tandem's LoRA, on either engine (engine/megatron/lora.py: PEFT's
    # adapters inside megatron's linears; the config check refuses a critic's and adapter dropout on megatron)
    "actor_rollout_ref.model.lora.rank": maps("actor.lora.rank"),
    "actor_rollout_ref.model.lora.alpha": maps("actor.lora.alpha"),
    "actor_rollout_ref.model.lora.dropout": maps("actor.lora.dropout"),
    "actor_rollout_ref.model.lora.target_modules": maps(
        "actor.lora.target_modules",
        "verl's megatron names (linear_qkv, linear_proj, linear_fc1, linear_fc2) name the Hugging Face projections "
        "they fuse, a mixture-of-experts model's experts included (engine/megatron/lora.py)",
        as_list,
    ),
    "actor_rollout_ref.model.lora.lora_A_init_method": maps(
        "actor.lora.init_a",
        "auto (Tandem's default) draws xavier on megatron, kaiming on fsdp, as verl",
        _lora_a_init,
    ),
    "actor_rollout_ref.model.lora.lora_B_init_method": maps("", "Tandem starts B at 0", _lora_b_zero),
    "actor_rollout_ref.model.lora.type": unsupported(_LORA_TYPE),
    "actor_rollout_ref.model.lora.adapter_path": unsupported(_LORA_ADAPTER),
    "actor_rollout_ref.model.lora.exclude_modules": unsupported(_LORA_EXCLUDE),
    "critic.model.lora.rank": maps("critic.lora.rank"),
    "critic.model.lora.alpha": maps("critic.lora.alpha"),
    "critic.model.lora.dropout": maps("critic.lora.dropout"),
    "critic.model.lora.type": unsupported(_LORA_TYPE),
    "critic.model.lora.adapter_path": unsupported(_LORA_ADAPTER),
    "critic.model.lora.exclude_modules": unsupported(_LORA_EXCLUDE),
    # router replay's files (record_file, replay_file) have no effect: verl_keys' pattern
    "actor_rollout_ref.actor.router_replay.mode": maps("actor.router_replay", convert=_router_replay),
    "actor_rollout_ref.ref.router_replay.mode": no_effect(
        "verl's reference routes every token itself whatever its mode, as Tandem's does"
    ),
    "actor_rollout_ref.model.mtp.enable_train": maps(
        "", "Tandem has no multi-token prediction", _no_mtp_training
    ),
    # the actor's megatron engine
    "actor_rollout_ref.actor.megatron.param_offload": _offload_rule("actor", "param"),
    "actor_rollout_ref.actor.megatron.grad_offload": _offload_rule("actor", "grad"),
    "actor_rollout_ref.actor.megatron.optimizer_offload": _offload_rule("actor", "optimizer"),
    "actor_rollout_ref.actor.megatron.use_dist_checkpointing": maps(
        "actor.megatron.dist_checkpoint", _DIST_START.format(other="dist_checkpointing_path", role="actor")
    ),
    "actor_rollout_ref.actor.megatron.dist_checkpointing_path": maps(
        "actor.megatron.dist_checkpoint",
        _DIST_START.format(other="use_dist_checkpointing=True", role="actor"),
    ),
    "actor_rollout_ref.actor.megatron.use_mbridge": no_effect(_MBRIDGE),
    "actor_rollout_ref.actor.megatron.vanilla_mbridge": no_effect(_MBRIDGE),
    "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size": maps(
        "", _ETP_ONE, _expert_tensor_parallel
    ),
    # the reference's megatron engine
    "actor_rollout_ref.ref.megatron.param_offload": _offload_rule("reference", "param"),
    "actor_rollout_ref.ref.megatron.grad_offload": _offload_rule("reference", "grad"),
    "actor_rollout_ref.ref.megatron.optimizer_offload": _offload_rule("reference", "optimizer"),
    "actor_rollout_ref.ref.megatron.use_dist_checkpointing": maps(
        "actor.megatron.dist_checkpoint", _DIST_REF
    ),
    "actor_rollout_ref.ref.megatron.dist_checkpointing_path": maps(
        "actor.megatron.dist_checkpoint", _DIST_REF
    ),
    "actor_rollout_ref.ref.megatron.use_mbridge": no_effect(_MBRIDGE),
    "actor_rollout_ref.ref.megatron.vanilla_mbridge": no_effect(_MBRIDGE),
    "actor_rollout_ref.ref.megatron.expert_tensor_parallel_size": maps("", _ETP_ONE, _expert_tensor_parallel),
    "actor_rollout_ref.ref.megatron.tensor_model_parallel_size": same_as(
        "actor.megatron.tensor_parallel", "reference"
    ),
    "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size": same_as(
        "actor.megatron.pipeline_parallel", "reference"
    ),
    "actor_rollout_ref.ref.megatron.virtual_pipeline_model_parallel_size": same_as(
        "actor.megatron.virtual_pipeline", "reference", _null_is_one
    ),
    "actor_rollout_ref.ref.megatron.context_parallel_size": same_as(
        "actor.megatron.context_parallel", "reference"
    ),
    "actor_rollout_ref.ref.megatron.expert_model_parallel_size": same_as(
        "actor.megatron.expert_parallel", "reference"
    ),
    "actor_rollout_ref.ref.megatron.sequence_parallel": same_as(
        "actor.megatron.sequence_parallel", "reference"
    ),
    # the critic's megatron engine
    "critic.megatron.param_offload": _offload_rule("critic", "param"),
    "critic.megatron.grad_offload": _offload_rule("critic", "grad"),
    "critic.megatron.optimizer_offload": _offload_rule("critic", "optimizer"),
    "critic.megatron.use_dist_checkpointing": maps(
        "critic.megatron_dist_checkpoint", _DIST_START.format(other="dist_checkpointing_path", role="critic")
    ),
    "critic.megatron.dist_checkpointing_path": maps(
        "critic.megatron_dist_checkpoint",
        _DIST_START.format(other="use_dist_checkpointing=True", role="critic"),
    ),
    "critic.megatron.use_mbridge": no_effect(_MBRIDGE),
    "critic.megatron.vanilla_mbridge": no_effect(_MBRIDGE),
    "critic.megatron.expert_tensor_parallel_size": maps("", _ETP_ONE, _expert_tensor_parallel),
    "critic.megatron.tensor_model_parallel_size": same_as("actor.megatron.tensor_parallel", "critic"),
    "critic.megatron.pipeline_model_parallel_size": same_as("actor.megatron.pipeline_parallel", "critic"),
    "critic.megatron.virtual_pipeline_model_parallel_size": same_as(
        "actor.megatron.virtual_pipeline", "critic", _null_is_one
    ),
    "critic.megatron.context_parallel_size": same_as("actor.megatron.context_parallel", "critic"),
    "critic.megatron.expert_model_parallel_size": same_as("actor.megatron.expert_parallel", "critic"),
    "critic.megatron.sequence_parallel": same_as("actor.megatron.sequence_parallel", "critic"),
}

# whole subtrees, key by key: verl prefix -> Tandem prefix (the rest of the key is a megatron field name)
MEGATRON_SUBTREES: list[tuple[str, str, str]] = [
    (
        "actor_rollout_ref.actor.megatron.override_transformer_config.",
        "actor.megatron.override_transformer_config.",
        "a field of megatron-core's TransformerConfig",
    ),
    (
        "actor_rollout_ref.actor.optim.override_optimizer_config.",
        "actor.megatron.override_optimizer_config.",
        "a field of megatron-core's OptimizerConfig",
    ),
]

MEGATRON_PATTERNS: list[tuple[str, Rule]] = [
    (
        "actor_rollout_ref.ref.megatron.override_transformer_config.*",
        no_effect(_REF_OVERRIDES.format(role="reference")),
    ),
    ("critic.megatron.override_transformer_config.*", no_effect(_REF_OVERRIDES.format(role="critic"))),
    (
        "critic.optim.override_optimizer_config.*",
        no_effect("the critic's optimizer is built with actor.megatron.override_optimizer_config"),
    ),
    ("actor_rollout_ref.model.lora.*", no_effect("Tandem's LoRA is PEFT's, on either engine (actor.lora.*)")),
]
