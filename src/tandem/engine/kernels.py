"""Fused kernels for the elementwise work of a decoder layer (`actor.fsdp.liger`, verl's `use_liger`).

Issue 33's profile of a 1.5 B update on an H200 had about 30 % of the GPU time in elementwise kernels: the
RMSNorms (each an fp32 upcast and a cast back), the rotary embedding (rotate_half's cat and neg), SiLU x up,
the residual adds. The Liger kernels (the `liger-kernel` package, Triton, CUDA only) fuse RMSNorm, RoPE and
SwiGLU, each into one kernel. `apply_liger` patches a built model in place: the modules keep their classes'
parameters and names (checkpoints, weight sync, export and LoRA see the same model), only their forwards
change. Liger's own LM-head losses stay off: Tandem's head is engine/lm_head.py's.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)

LIGER_PARTS = {"rope": True, "rms_norm": True, "swiglu": True, "cross_entropy": False}


def check_liger(enabled: bool, device: torch.device, key: str = "actor.fsdp.liger") -> None:
    """`key`=true where Liger cannot run is an error naming what is missing and what to do."""
    if not enabled:
        return
    if device.type != "cuda":
        raise ValueError(
            f"{key}=true needs a CUDA device (Liger's kernels are Triton); device here: {device.type}"
        )
    if importlib.util.find_spec("liger_kernel") is None:
        raise ValueError(
            f"{key}=true needs the liger-kernel package: pip install liger-kernel, or set {key}=false"
        )


def apply_liger(model: nn.Module, key: str = "actor.fsdp.liger") -> None:
    """Liger's RMSNorm, RoPE and SwiGLU in `model` (in place, before it is sharded); a model type Liger does
    not know is an error naming it."""
    from liger_kernel.transformers import monkey_patch

    model_type = model.config.model_type
    apply = monkey_patch.MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if apply is None:
        raise ValueError(
            f"{key}=true: Liger has no kernels for model type {model_type!r} (it has "
            f"{', '.join(sorted(monkey_patch.MODEL_TYPE_TO_APPLY_LIGER_FN))}); set {key}=false"
        )
    accepted = inspect.signature(apply).parameters
    parts = {name: on for name, on in LIGER_PARTS.items() if name in accepted}
    if "fused_linear_cross_entropy" in accepted:
        parts["fused_linear_cross_entropy"] = False
    names = [name for name, _ in model.named_parameters()]
    apply(model=model, **parts)
    # Liger's promise, checked here: export and weight sync read the parameters by name
    if [name for name, _ in model.named_parameters()] != names:
        raise RuntimeError(f"{key}=true changed the parameter names of {type(model).__name__}")
    logger.info(
        "actor.fsdp.liger: %s kernels on %s", ", ".join(n for n, on in parts.items() if on), model_type
    )
