"""Learning-rate schedules and AdamW construction, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from tandem.config.schema import OptimConfig
from tandem.engine.base import resolve_param_dtype
from tandem.engine.optim import build_optimizer, build_scheduler, lr_multiplier, warmup_steps


def multipliers(optim: OptimConfig, total: int | None, steps: int) -> list[float]:
    fn = lr_multiplier(optim, total)
    return [fn(s) for s in range(steps)]


def test_constant_with_warmup():
    got = multipliers(OptimConfig(warmup_steps=3), None, 6)
    assert got == pytest.approx([1 / 4, 2 / 4, 3 / 4, 1.0, 1.0, 1.0])


def test_constant_without_warmup_is_flat():
    assert multipliers(OptimConfig(), None, 3) == [1.0, 1.0, 1.0]


def test_cosine_with_warmup_decays_to_min_ratio():
    optim = OptimConfig(lr_scheduler="cosine", warmup_steps=2, min_lr_ratio=0.1)
    got = multipliers(optim, 10, 13)
    # W=2, T=10: p = (s - 2) / 8; m + (1 - m) (1 + cos(pi p)) / 2
    expected = [1 / 3, 2 / 3] + [
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - 2) / 8)) for s in range(2, 11)
    ]
    expected += [0.1, 0.1]  # past the end: stays at the floor
    assert got == pytest.approx(expected)
    assert got[2] == pytest.approx(1.0) and got[6] == pytest.approx(0.55) and got[10] == pytest.approx(0.1)


def test_linear_decay_from_warmup_ratio():
    optim = OptimConfig(lr_scheduler="linear", warmup_ratio=0.25, min_lr_ratio=0.0)
    assert warmup_steps(optim, 8) == 2
    # W=2, T=8: (s+1)/3 while warming up, then 1 - (s - 2) / 6
    assert multipliers(optim, 8, 9) == pytest.approx(
        [1 / 3, 2 / 3, 1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6, 0.0]
    )


def test_warmup_steps_win_over_ratio():
    assert warmup_steps(OptimConfig(warmup_steps=3, warmup_ratio=0.5), 100) == 3


@pytest.mark.parametrize(
    ("optim", "match"),
    [
        (OptimConfig(lr_scheduler="cosine"), "lr_scheduler='cosine'.*total_training_steps"),
        (OptimConfig(lr_scheduler="linear"), "lr_scheduler='linear'.*total_training_steps"),
        (OptimConfig(warmup_ratio=0.1), "warmup_ratio=0.1.*total_training_steps"),
    ],
)
def test_schedules_that_need_the_run_length_say_so(optim, match):
    with pytest.raises(ValueError, match=match):
        lr_multiplier(optim, None)


def test_scheduler_drives_the_optimizer_lr():
    optim = OptimConfig(
        lr=0.2, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.05, warmup_steps=1, lr_scheduler="linear"
    )
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = build_optimizer([weight], optim)
    group = optimizer.param_groups[0]
    assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.8, 0.9), 1e-6, 0.05)
    scheduler = build_scheduler(optimizer, optim, total_training_steps=3)
    lrs = [group["lr"]]
    for _ in range(3):
        weight.grad = torch.zeros_like(weight)
        optimizer.step()  # torch expects an optimizer step before each scheduler step
        scheduler.step()
        lrs.append(group["lr"])
    assert lrs == pytest.approx([0.1, 0.2, 0.1, 0.0])  # W=1, T=3: 1/2, then 1 - (s - 1) / 2


def test_param_dtype_auto():
    assert resolve_param_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_param_dtype("auto", torch.device("cuda", 0)) == torch.bfloat16
    assert resolve_param_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ValueError, match="fsdp.param_dtype='fp8'"):
        resolve_param_dtype("fp8", torch.device("cpu"))


def test_adamw_implementations_take_the_same_step():
    """fused (the default), foreach and for_loop: the same AdamW update, up to float rounding, equal to
    the formula by hand (step 1: m = (1 - b1) g, v = (1 - b2) g^2, bias-corrected, decoupled decay)."""
    gen = torch.Generator().manual_seed(0)
    start, grads = torch.randn(64, generator=gen), [torch.randn(64, generator=gen) for _ in range(3)]
    lr, (b1, b2), eps, decay = 0.01, (0.9, 0.999), 1e-8, 0.1
    results = {}
    for impl in ("fused", "foreach", "for_loop"):
        optim = OptimConfig(lr=lr, betas=(b1, b2), eps=eps, weight_decay=decay, implementation=impl)
        weight = torch.nn.Parameter(start.clone())
        optimizer = build_optimizer([weight], optim)
        assert bool(optimizer.param_groups[0]["fused"]) == (impl == "fused")
        steps = []
        for grad in grads:
            weight.grad = grad.clone()
            optimizer.step()
            steps.append(weight.detach().clone())
        results[impl] = steps
    first = start * (1 - lr * decay) - lr * grads[0] / (grads[0].abs() + eps)  # m_hat / sqrt(v_hat) = sign(g)
    torch.testing.assert_close(results["for_loop"][0], first, rtol=0, atol=1e-6)
    for impl in ("fused", "foreach"):
        for got, expected in zip(results[impl], results["for_loop"]):
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert OptimConfig().implementation == "fused"
    with pytest.raises(ValueError, match="optim.implementation='adam8bit' is unknown"):
        build_optimizer([torch.nn.Parameter(torch.ones(1))], OptimConfig(implementation="adam8bit"))
