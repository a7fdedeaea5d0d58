"""bf16 parameters with fp32 master weights and reduction (FSDP2 MixedPrecisionPolicy), on CPU.

In-process worker groups (one rank, real FSDP2 over a world-size-1 gloo group). Tolerance: bf16
keeps 8 bits of mantissa, so log-probs of a few-unit magnitude agree with fp32 to about 5e-2.
"""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from tandem.controller import WorkerGroup
from tandem.models.tiny import save_tiny
from tandem.roles.worker import RoleWorker
from tandem.rollout import SamplingParams

from .roles_helpers import PROMPTS, prompt_batch, tiny_config, update_batch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_bf16_parameters_match_fp32_within_bf16_tolerance(tmp_path):
    """Both actors score and train on the fp32 group's samples; the bf16 group's own rollout engine computes in
    bf16 too (the rollout follows the actor's dtype), close to its actor and not to the fp32 one."""
    model = save_tiny(tmp_path / "policy")
    groups = {}
    for dtype in ("float32", "bfloat16"):
        cfg = tiny_config(model, 1, f"actor.fsdp.param_dtype={dtype}", "actor.use_kl_loss=false")
        groups[dtype] = WorkerGroup.inprocess(
            RoleWorker, name=f"actor_{dtype}", args=(cfg, ["actor", "rollout"])
        )
    try:
        sampling = SamplingParams(max_tokens=8, n=2, seed=3)
        roll32 = groups["float32"].generate(prompt_batch(PROMPTS[:4]), sampling)
        roll16 = groups["bfloat16"].generate(prompt_batch(PROMPTS[:4]), sampling)
        own16 = groups["bfloat16"].compute_log_probs(roll16, False)["old_log_probs"]
        as32 = groups["float32"].compute_log_probs(roll16, False)["old_log_probs"]
        results = {}
        for dtype, group in groups.items():
            log_probs = group.compute_log_probs(roll32, False)
            metrics = group.update_actor(update_batch(roll32.union(log_probs)), mini_batches=2)[0]
            results[dtype] = (log_probs["old_log_probs"], metrics, group.full_weights("actor"))
    finally:
        for group in groups.values():
            group.shutdown()
    mask16 = roll16["response_mask"] != 0
    to_own = (roll16["rollout_log_probs"] - own16).abs()[mask16].max()
    to_fp32 = (roll16["rollout_log_probs"] - as32).abs()[mask16].max()
    assert to_own < 5e-2 and to_fp32 > 1e-3  # the bf16 actor's rollout really ran in bf16
    (lp32, m32, w32), (lp16, m16, w16) = results["float32"], results["bfloat16"]
    mask = roll32["response_mask"] != 0
    diff = (lp32 - lp16).abs()[mask]
    assert 0 < diff.max() < 5e-2  # bf16 really ran, and stayed close
    assert math.isfinite(m16["actor/grad_norm"]) and m16["actor/skipped_steps"] == 0
    assert m16["actor/grad_norm"] == pytest.approx(m32["actor/grad_norm"], rel=5e-2)
    # Master weights stay fp32 and take nearly the same step. Not element-wise: Adam's g / sqrt(v)
    # turns bf16 noise in near-zero gradient elements into a full +-lr step.
    initial = load_file(model / "model.safetensors")
    step16 = torch.cat([(w16[k] - initial[k]).flatten() for k in initial])
    step32 = torch.cat([(w32[k] - initial[k]).flatten() for k in initial])
    assert all(w.dtype == torch.float32 for w in w16.values())
    cosine = torch.nn.functional.cosine_similarity(step16, step32, dim=0)
    assert cosine > 0.9  # measured 0.996
