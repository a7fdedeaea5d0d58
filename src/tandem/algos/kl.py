"""KL between the policy and the reference: per-token estimators, KL controllers, KL-in-reward.

Estimators of KL(pi || pi_ref) from samples of pi, with d = logp - ref (Schulman's k1/k2/k3):
  kl / k1:          d
  abs:              |d|
  mse / k2:         0.5 d^2
  low_var_kl / k3:  exp(-d) + d - 1, clamped to [-10, 10]
A trailing "+" (kl+ / k1+, abs+, mse+ / k2+, low_var_kl+ / k3+) keeps the named estimator's value in the forward
pass and takes k2's gradient (unbiased for the gradient of KL), via a straight-through term.
Estimators compute in float32 at least (exp() of d overflows float16 at 11).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tandem.algos.aggregation import agg_loss
from tandem.algos.core import masked_mean, upcast, zero_padding
from tandem.algos.registry import KL_CONTROLLERS, KL_ESTIMATORS

K3_CLAMP = 10.0
# Clamping d before exp() changes no value inside [-K3_CLAMP, K3_CLAMP] (k3(20) and k3(-20) are
# both far outside it) and keeps exp() from overflowing into inf * 0 = NaN gradients.
K3_MAX_LOG_RATIO = 20.0


@KL_ESTIMATORS.register("kl")
@KL_ESTIMATORS.register("k1")
def kl_k1(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k1 = logp - ref."""
    return log_probs - ref_log_probs


@KL_ESTIMATORS.register("abs")
def kl_abs(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """|logp - ref|."""
    return (log_probs - ref_log_probs).abs()


@KL_ESTIMATORS.register("mse")
@KL_ESTIMATORS.register("k2")
def kl_k2(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k2 = 0.5 (logp - ref)^2."""
    return 0.5 * (log_probs - ref_log_probs) ** 2


@KL_ESTIMATORS.register("low_var_kl")
@KL_ESTIMATORS.register("k3")
def kl_k3(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k3 = exp(ref - logp) - (ref - logp) - 1, clamped to [-10, 10]."""
    d = torch.clamp(ref_log_probs - log_probs, -K3_MAX_LOG_RATIO, K3_MAX_LOG_RATIO)
    return torch.clamp(torch.exp(d) - d - 1.0, -K3_CLAMP, K3_CLAMP)


def _straight_through(value_fn: Any) -> Any:
    def fn(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
        k2 = kl_k2(log_probs, ref_log_probs)
        # k2 - k2.detach() is exactly 0 in the forward pass and carries k2's gradient.
        return value_fn(log_probs, ref_log_probs).detach() + (k2 - k2.detach())

    fn.__doc__ = f"Forward: {value_fn.__doc__.rstrip('.')}; gradient: k2's, 0.5 (logp - ref)^2."
    return fn


# k1+ / k2+ / k3+ too: verl's documentation spells them that way, and configs get ported from it.
for _names, _fn in (
    (("kl", "k1"), kl_k1),
    (("abs",), kl_abs),
    (("mse", "k2"), kl_k2),
    (("low_var_kl", "k3"), kl_k3),
):
    _plus = _straight_through(_fn)
    for _name in _names:
        KL_ESTIMATORS.register(f"{_name}+")(_plus)


def kl_penalty(log_probs: Tensor, ref_log_probs: Tensor, kind: str = "low_var_kl") -> Tensor:
    """Per-token KL estimate (B, T) of the estimator `kind` (see the module docstring)."""
    return KL_ESTIMATORS.get(kind)(upcast(log_probs), upcast(ref_log_probs))


def kl_loss(
    log_probs: Tensor,
    ref_log_probs: Tensor,
    response_mask: Tensor,
    kind: str = "low_var_kl",
    loss_agg_mode: str = "token-mean",
    agg_kwargs: dict[str, Any] | None = None,
) -> Tensor:
    """The actor's KL loss term: agg_loss(kl_penalty(logp, ref, kind), mask, loss_agg_mode, **agg_kwargs).

    The reference is a constant; padding (even -inf log-probs there) gives neither value nor
    gradient. The result is this micro-batch's contribution, as for the policy losses.
    """
    # Zero both inputs at padding: -inf - -inf would be NaN inside the estimator's backward.
    log_probs = zero_padding(upcast(log_probs), response_mask)
    ref_log_probs = zero_padding(upcast(ref_log_probs).detach(), response_mask)
    kl = kl_penalty(log_probs, ref_log_probs, kind)
    return agg_loss(kl, response_mask, loss_agg_mode, **(agg_kwargs or {}))


@KL_CONTROLLERS.register("fixed")
class FixedKLController:
    """A constant KL coefficient beta."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """beta stays beta."""

    def state_dict(self) -> dict[str, float]:
        """{'value': beta}."""
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore beta."""
        self.value = float(state["value"])


@KL_CONTROLLERS.register("adaptive")
class AdaptiveKLController:
    """Adaptive beta (Ziegler et al. 2019): e = clip(KL / target - 1, -0.2, 0.2); beta *= 1 + e n / H.

    KL is what `apply_kl_penalty` measures: the per-token KL (verl's convention). Ziegler et al. and
    TRL measure the per-sequence sum (their target 6 nats), so divide such a target by the length.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        if target_kl <= 0:
            raise ValueError(f"target_kl must be > 0, got {target_kl}")
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target_kl = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """beta *= 1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon."""
        error = min(max(float(current_kl) / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        """{'value': beta} (target and horizon come from the config)."""
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore beta."""
        self.value = float(state["value"])


KLController = FixedKLController | AdaptiveKLController


def make_kl_controller(kind: str, **kwargs: Any) -> KLController:
    """KL_CONTROLLERS[kind](**kwargs), e.g. make_kl_controller('fixed', kl_coef=0.001)."""
    return KL_CONTROLLERS.get(kind)(**kwargs)


def kl_controller_from_config(kl_ctrl: Any) -> KLController:
    """The controller that a config's `algorithm.kl_ctrl` (type, kl_coef, target_kl, horizon) describes."""
    if kl_ctrl.type == "adaptive":
        return make_kl_controller(
            "adaptive", init_kl_coef=kl_ctrl.kl_coef, target_kl=kl_ctrl.target_kl, horizon=kl_ctrl.horizon
        )
    return make_kl_controller(kl_ctrl.type, kl_coef=kl_ctrl.kl_coef)


@torch.no_grad()
def apply_kl_penalty(
    token_level_scores: Tensor,
    log_probs: Tensor,
    ref_log_probs: Tensor,
    response_mask: Tensor,
    kl_ctrl: KLController,
    kind: str = "kl",
) -> tuple[Tensor, dict[str, float]]:
    """r_t = s_t - beta * KL_t (KL_t = 0 at padding); KL = mean over sequences of the token-mean KL.

    Updates the controller with n_steps = batch size; metric kl_coef is the beta that was used.
    Sequences without a valid token do not enter the KL mean.
    """
    mask = response_mask.to(token_level_scores.dtype)
    kl = zero_padding(kl_penalty(log_probs, ref_log_probs, kind).to(token_level_scores.dtype), mask)
    beta = kl_ctrl.value
    rewards = token_level_scores - beta * kl
    per_seq = masked_mean(kl, mask, dim=-1)
    has_tokens = mask.sum(dim=-1) > 0
    current_kl = float(masked_mean(per_seq, has_tokens).item())
    kl_ctrl.update(current_kl, n_steps=token_level_scores.shape[0])
    return rewards, {"kl": current_kl, "kl_coef": float(beta)}
