"""The names a LoRA setting reads that the config check and the engines share (the engines import no config
check): a PEFT adapter folder's files, and verl's megatron target names as the Hugging Face projections they
fuse."""

from __future__ import annotations

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"  # a PEFT adapter folder

# verl's megatron LoRA names its targets by megatron's fused linears; Tandem's adapters sit on the Hugging Face
# projections each of them fuses (engine/megatron/lora.py), on either engine
MEGATRON_TARGETS = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"),
    "linear_fc2": ("down_proj",),
}


def hf_target_modules(targets: list[str]) -> list[str]:
    """`lora.target_modules` with each of verl's megatron names replaced by the projections it fuses, in order,
    once each: [linear_qkv, o_proj] -> [q_proj, k_proj, v_proj, o_proj]."""
    names: list[str] = []
    for target in targets:
        names += [name for name in MEGATRON_TARGETS.get(target, (target,)) if name not in names]
    return names
