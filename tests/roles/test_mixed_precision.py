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
from tandem.data.tiny import save_tiny
from tandem.roles.worker import RoleWorker
from tandem.rollout import SamplingParams

from .roles_helpers import PROMPTS, prompt_batch, tiny_config, update_batch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_bf16_parameters_match_fp32_within_bf16_tolerance(tmp_path):
    model = save_tiny(tmp_path / "policy")
    results = {}
    for dtype in ("float32", "bfloat16"):
        cfg = tiny_config(model, 1, f"actor.fsdp.param_dtype={dtype}", "actor.use_kl_loss=false")
        group = WorkerGroup.inprocess(RoleWorker, name=f"actor_{dtype}", args=(cfg, ["actor", "rollout"]))
        try:
            rollout = group.generate(prompt_batch(PROMPTS[:4]), SamplingParams(max_tokens=8, n=2, seed=3))
            log_probs = group.compute_log_probs(rollout, False)
            metrics = group.update_actor(update_batch(rollout.union(log_probs)))[0]
            results[dtype] = (rollout, log_probs["old_log_probs"], metrics, group.full_weights("actor"))
        finally:
            group.shutdown()
    (roll32, lp32, m32, w32), (roll16, lp16, m16, w16) = results["float32"], results["bfloat16"]
    assert torch.equal(roll32["responses"], roll16["responses"])  # the rollout engine is fp32 in both
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
