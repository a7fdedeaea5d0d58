"""megatron-core without Transformer Engine, on any device: the one name 0.16.1 reads from TE regardless.

megatron's router gate (`moe_utils.RouterGatingLinearFunction.forward`) tests `te_general_gemm is not None`, a
name `moe_utils` defines only when Transformer Engine imports, so every mixture-of-experts forward without TE
stops with a NameError: on a GPU as on the CPU (seen on an H100 with megatron-core 0.16.1 and torch 2.11).
Defining it as None takes megatron's own torch path. tests/engine/test_megatron_cpu.py fails when megatron
stops reading the name (then this module can go).
"""

from __future__ import annotations


def install() -> None:
    """Define `moe_utils.te_general_gemm` as None where Transformer Engine did not (idempotent)."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
