"""The hot paths stay on the tensors' device: no .item() / .cpu() / numpy round trip (meta), CUDA = CPU.

A meta tensor has no data, so any host synchronisation raises; only group ids (a Python list here)
and the scalar that the KL controller needs may cross to the host.
"""

import pytest
import torch

from tandem.algos import (
    ADV_ESTIMATORS,
    AGG_MODES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    compute_advantages,
    entropy_from_logits,
    is_weights,
    kl_loss,
    log_probs_from_logits,
    policy_loss,
    sum_pi_squared_from_logits,
    value_loss,
)

B, T, V = 4, 5, 7
INDEX = [0, 0, 1, 1]
COUNTS = {"global_num_tokens": 13, "global_num_seqs": 3}
# dro has no default beta; clip_cov_ratio 1 drops every candidate, so its random pick (CPU and CUDA
# generators differ) cannot tell the devices apart
LOSS_KEYS = {"dro_beta": 0.5, "clip_cov_ratio": 1.0}


def run_everything(device: str) -> dict[str, torch.Tensor]:
    """Every hot-path function once on `device`; returns the outputs and gradients by name."""
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device)

    mask = (torch.arange(T)[None, :] < torch.tensor([[5], [3], [1], [4]])).double().to(device)
    old, adv, rewards, values = rand(B, T) - 1.0, rand(B, T), rand(B, T), rand(B, T)
    out = {}
    for name in POLICY_LOSSES:
        for mode in AGG_MODES:
            logp = (old + 0.1 * rand(B, T)).requires_grad_(True)
            loss, metrics = policy_loss(
                name, old, logp, adv, mask, loss_agg_mode=mode, agg_kwargs=COUNTS, **LOSS_KEYS
            )
            loss.backward()
            out[f"{name}/{mode}"] = loss.detach()
            out[f"{name}/{mode}/grad"] = logp.grad
            out.update({f"{name}/{mode}/{k}": v for k, v in metrics.items()})
    for kind in KL_ESTIMATORS:
        logp = (old + 0.1 * rand(B, T)).requires_grad_(True)
        loss = kl_loss(logp, old, mask, kind, agg_kwargs=COUNTS)
        loss.backward()
        out[f"kl/{kind}"], out[f"kl/{kind}/grad"] = loss.detach(), logp.grad
    v = values.clone().requires_grad_(True)
    loss, metrics = value_loss(v, values + 0.1 * rand(B, T), rewards, mask, 0.2, agg_kwargs=COUNTS)
    loss.backward()
    out["value"], out["value/grad"], out["value/clipfrac"] = loss.detach(), v.grad, metrics["vf_clipfrac"]
    for name in ADV_ESTIMATORS:
        out[f"adv/{name}"], out[f"ret/{name}"] = compute_advantages(
            name,
            rewards,
            mask,
            index=INDEX,
            values=values,
            reward_baselines=rewards[:, 0],
            reward_components=rewards[:, :2],
            old_log_probs=old,
            sum_pi_squared=old.exp() ** 2 + 0.1,
            gamma=0.9,
            lam=0.8,
        )
    for level in ("token", "sequence"):
        out[f"is/{level}"] = is_weights(old, old + 0.1 * rand(B, T), mask, level=level)
    for dtype in (torch.float32, torch.bfloat16):
        logits = rand(B, T, V).to(dtype).requires_grad_(True)
        labels = torch.randint(0, V, (B, T), generator=gen).to(device)
        total = (
            log_probs_from_logits(logits, labels, chunk_rows=3).sum()
            + entropy_from_logits(logits, 3).sum()
            + sum_pi_squared_from_logits(logits, 3).sum()
        )
        total.backward()
        out[f"logits/{dtype}"], out[f"logits/{dtype}/grad"] = total.detach(), logits.grad
    return out


def test_no_host_round_trip_in_hot_paths():
    out = run_everything("meta")
    assert all(t.device.type == "meta" for t in out.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu():
    cpu, cuda = run_everything("cpu"), run_everything("cuda")
    assert cpu.keys() == cuda.keys()
    for key, expected in cpu.items():
        assert cuda[key].device.type == "cuda", key
        torch.testing.assert_close(cuda[key].cpu(), expected, msg=key)  # tolerances of each dtype
