"""Model FLOPs and MFU of the update phases (`perf/mfu/actor`, `perf/mfu/critic`), every step.

Model FLOPs, as bench/grpo_w1.py and PaLM's appendix B count them (recomputation and padding excluded):

    forward = 2 N T + 4 L H sum_s n_s^2       N: parameters one token goes through (the non-embedding ones,
                                              each MoE layer's routed experts scaled by top-k / experts, plus
                                              the head: vocab x hidden, once though tied), T: tokens,
                                              L layers, H hidden size, n_s: each sequence's length
                                              (attention's QK^T and AV: 2 L H n^2 each, per sequence)
    update  = 3 forward (forward + backward) x ppo_epochs

MFU = update FLOPs / (the phase's seconds x peak FLOP/s of one device x the group's devices). The peak:
`trainer.peak_flops` when set; on CUDA the dense bf16 / fp32 rate of a known GPU from `GPU_PEAKS`; on a CPU
torch.mm measured once per worker at start-up, in the engine's dtype (engine/auto_dtype.matmul_rate).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from tandem.engine.auto_dtype import matmul_rate

logger = logging.getLogger(__name__)

# Dense tensor-core TFLOP/s (no sparsity) by a substring of torch.cuda.get_device_name(): (bf16, fp32)
GPU_PEAKS: dict[str, tuple[float, float]] = {  # checked in this order ("H100 PCIe" before "H100")
    "H200": (989.0, 67.0),
    "H100 PCIe": (756.0, 51.0),
    "H100": (989.0, 67.0),  # SXM / HBM3
    "H800": (989.0, 67.0),
    "A100": (312.0, 19.5),
    "A800": (312.0, 19.5),
    "L40S": (362.0, 91.6),
    "B200": (2250.0, 80.0),
}
CPU_PROBE = (1024, 1024, 1024)  # 2.1 GFLOP: about 0.1 s per worker start in fp32 on 2 cores


@dataclass(frozen=True)
class ModelFlops:
    """What the FLOP formula needs of one model (see the module docstring)."""

    params: float  # N: parameters per token, the head included, MoE experts scaled by top-k / experts
    layers: int
    hidden: int

    @classmethod
    def from_folder(cls, model_path: str | Path, head: str = "lm") -> ModelFlops:
        """Counted on the meta device (no weights read): dense and mixture-of-experts models."""
        from tandem.engine import hf_io

        config = hf_io.load_config(model_path, head)
        model = hf_io.build_on_meta(config, head)
        text = config.get_text_config()
        experts = getattr(text, "num_experts", None) or getattr(text, "num_local_experts", None)
        top_k = getattr(text, "num_experts_per_tok", None)
        routed = top_k / experts if experts and top_k else 1.0
        params = 0.0
        for name, param in model.named_parameters():
            if "embed_tokens" in name or name.startswith(("lm_head", "score")):
                continue
            params += param.numel() * (routed if ".experts." in f".{name}" else 1.0)
        head_params = text.vocab_size * text.hidden_size if head == "lm" else text.hidden_size
        return cls(params=params + head_params, layers=text.num_hidden_layers, hidden=text.hidden_size)

    def forward(self, attention_mask: Tensor) -> float:
        """FLOPs of one forward over the sequences of `attention_mask` [B, T] (their real tokens only)."""
        lengths = attention_mask.sum(-1).double()
        return 2 * self.params * float(lengths.sum()) + 4 * self.layers * self.hidden * float(
            (lengths**2).sum()
        )


def peak_flops(device: torch.device, dtype: torch.dtype, configured: float | None = None) -> float | None:
    """FLOP/s of one device in `dtype`: `configured` when given; a known GPU's from GPU_PEAKS (None for an
    unknown one, with a warning); on a CPU, torch.mm measured here at torch's current threads."""
    if configured is not None:
        return configured
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, (bf16, fp32) in GPU_PEAKS.items():
            if key in name:
                return 1e12 * (fp32 if dtype == torch.float32 else bf16)
        logger.warning("no peak FLOP/s known for %r: set trainer.peak_flops for perf/mfu/*", name)
        return None
    return matmul_rate(dtype, CPU_PROBE, repeats=3)


def mfu_metrics(metrics: dict[str, float], devices: dict[str, int]) -> dict[str, float]:
    """`perf/mfu/<role>` from a step's `perf/update_flops/<role>`, `timing_s/update_<role>` and the workers'
    `perf/peak_flops_per_device`; `devices`: the devices of each role's worker group."""
    peak = metrics.get("perf/peak_flops_per_device")
    out = {}
    for role, count in devices.items():
        flops, seconds = metrics.get(f"perf/update_flops/{role}"), metrics.get(f"timing_s/update_{role}")
        if peak and flops and seconds:
            out[f"perf/mfu/{role}"] = flops / (seconds * peak * count)
    return out
