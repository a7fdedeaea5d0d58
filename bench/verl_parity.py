"""Tandem's RL math against verl 0.9.1's own functions, on random inputs (issue 16).

    PYTHONPATH=/tmp/verlpkg/x:/tmp/verldeps .venv/bin/python bench/verl_parity.py [--seeds 6]

verl is not a dependency of Tandem and must not enter .venv. Get its wheel and the few modules that
importing verl.trainer.ppo.core_algos needs beyond what .venv already holds (torch, numpy, tensordict,
pydantic, ray, transformers) into folders of their own:

    .venv/bin/pip download --no-deps verl==0.9.1 -d /tmp/verlpkg
    unzip -q /tmp/verlpkg/verl-0.9.1-py3-none-any.whl -d /tmp/verlpkg/x
    .venv/bin/pip install --no-deps --target /tmp/verldeps omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 \
        codetiming orjson

No verl module is stubbed: every verl function below runs its real code. Both sides get the same
float64 tensors: groups of 2-4 samples, mixed response lengths with right padding (finite junk in the
padding), observation holes inside some responses (multi-turn masks), IS weights on every other seed.
Losses aggregate with the global counts of the batch (Tandem: `global_counts(mask)` as agg_kwargs;
verl: the same numbers in `ActorConfig.global_batch_info`, dp_size 1), under every loss_agg_mode the
loss honours. Gradients are d loss / d log_probs (d loss / d values for the value loss).

Randomness and selection: Clip-Cov drops a random subset of its candidate tokens; with
clip_cov_ratio = 1 the budget covers every candidate, so both sides drop exactly the candidate set.
KL-Cov's top-k is deterministic (continuous covariances have no ties) and runs at kl_cov_ratio = 0.2.

One line per function: max |value diff| and max |grad diff| over seeds and modes, and
  OK        equal within the tolerance (1e-6 in float64: verl's masked means add 1e-8 to counts);
  EXPECTED  a documented difference (README, "The RL math"): the line names it, and the residual after
            accounting for it (shown in the note) is within the tolerance;
  DIFF      anything else.
Exit status 1 when any line says DIFF.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import torch

try:
    from verl.trainer.config import AlgoConfig
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo import core_algos as verl_algos
    from verl.trainer.ppo import rollout_corr_helper as verl_rc
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig
except ImportError as err:
    sys.exit(f"verl 0.9.1 is not importable ({err}); see this script's docstring for the PYTHONPATH")

from tandem.algos import compute_advantages, global_counts, kl_loss, policy_loss, value_loss
from tandem.algos.rollout_correction import rollout_correction, rollout_diagnostics, rollout_is_weights

TOL = 1e-6
TOL_FLOAT32 = 1e-5  # verl's gdpo builds its reward tensors in float32 whatever the input dtype
LENGTH = 12


# ---- results -----------------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    value_diff: float = 0.0
    grad_diff: float | None = None
    residual: float | None = None  # EXPECTED: what is left after accounting for the documented difference
    expected: str = ""  # the documented difference, for EXPECTED lines
    note: str = ""
    tol: float = TOL

    def add(self, value: float, grad: float | None = None, residual: float | None = None) -> None:
        self.value_diff = max(self.value_diff, value)
        if grad is not None:
            self.grad_diff = max(self.grad_diff or 0.0, grad)
        if residual is not None:
            self.residual = max(self.residual or 0.0, residual)

    @property
    def status(self) -> str:
        worst = max(self.value_diff, self.grad_diff or 0.0)
        if worst <= self.tol:
            return "OK"
        if self.expected and self.residual is not None and self.residual <= self.tol:
            return "EXPECTED"
        return "DIFF"


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)

    def row(self, name: str, **kw) -> Row:
        self.rows.append(Row(name, **kw))
        return self.rows[-1]

    def print(self) -> None:
        width = max(len(r.name) for r in self.rows)
        print(f"| {'function':<{width}} | max value diff | max grad diff | status   | note")
        print(f"|{'-' * (width + 2)}|----------------|---------------|----------|-----")
        for r in self.rows:
            grad = "-" if r.grad_diff is None else f"{r.grad_diff:.1e}"
            note = r.note
            if r.status == "EXPECTED":
                note = f"{r.expected} (residual {r.residual:.0e}{', ' + note if note else ''})"
            elif r.status == "DIFF" and r.expected:
                note = f"not explained by: {r.expected} (residual {r.residual})"
            print(f"| {r.name:<{width}} | {r.value_diff:14.1e} | {grad:>13} | {r.status:<8} | {note}")


def max_abs(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None = None) -> float:
    diff = (a.double() - b.double()).abs()
    if mask is not None:
        diff = torch.where(mask != 0, diff, torch.zeros_like(diff))
    return float(diff.max()) if diff.numel() else 0.0


# ---- random inputs -----------------------------------------------------------------------------


def group_index(sizes: tuple[int, ...]) -> np.ndarray:
    return np.array([f"uid{g}" for g, n in enumerate(sizes) for _ in range(n)], dtype=object)


def response_mask(gen: torch.Generator, batch: int, holes: bool) -> torch.Tensor:
    """Right-padded masks of mixed lengths (one full row, one of length 1); with holes, a 2-token
    observation span inside every other row of length >= 6."""
    lengths = torch.randint(2, LENGTH + 1, (batch,), generator=gen)
    lengths[0], lengths[-1] = LENGTH, 1
    mask = (torch.arange(LENGTH)[None, :] < lengths[:, None]).double()
    if holes:
        for i in range(0, batch, 2):
            if lengths[i] >= 6:
                start = int(torch.randint(1, int(lengths[i]) - 3, (1,), generator=gen))
                mask[i, start : start + 2] = 0
    return mask


def with_junk(x: torch.Tensor, mask: torch.Tensor, junk: float) -> torch.Tensor:
    """x at valid tokens, a finite junk value at padding (what padded log-probs look like)."""
    return torch.where(mask != 0, x, torch.full_like(x, junk))


@dataclass
class LossInputs:
    old: torch.Tensor
    log_probs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    is_weights: torch.Tensor | None


def loss_inputs(seed: int, batch: int = 10) -> LossInputs:
    gen = torch.Generator().manual_seed(seed)
    mask = response_mask(gen, batch, holes=True)
    old = -3.0 * torch.rand(batch, LENGTH, generator=gen, dtype=torch.float64)
    # log-ratios of std 0.6: PPO's clip, the dual clip (r > 3) and DPPO's regions all see both sides
    log_probs = (old + 0.6 * torch.randn(batch, LENGTH, generator=gen, dtype=torch.float64)).clamp(max=-1e-3)
    advantages = torch.randn(batch, 1, generator=gen, dtype=torch.float64) + 0.3 * torch.randn(
        batch, LENGTH, generator=gen, dtype=torch.float64
    )
    weights = 0.5 + torch.rand(batch, LENGTH, generator=gen, dtype=torch.float64)
    return LossInputs(
        old=with_junk(old, mask, -7.0),
        log_probs=with_junk(log_probs, mask, -9.0),
        advantages=advantages * mask,
        mask=mask,
        is_weights=weights * mask if seed % 2 else None,
    )


# ---- policy losses -----------------------------------------------------------------------------

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
POLICY_LOSS_KEYS = {f for f in PolicyLossConfig.__dataclass_fields__ if not f.startswith("_")}


def verl_actor_config(mask: torch.Tensor, **settings) -> ActorConfig:
    """An ActorConfig with `settings` (policy_loss keys go to its PolicyLossConfig) and the batch's
    global counts in global_batch_info, as verl's ppo_loss sets them."""
    loss_settings = {k: settings.pop(k) for k in list(settings) if k in POLICY_LOSS_KEYS}
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        policy_loss=PolicyLossConfig(**loss_settings),
        **settings,
    )
    counts = global_counts(mask)
    config.global_batch_info.update(
        dp_size=1,
        batch_num_tokens=counts["global_num_tokens"],
        global_batch_size=counts["global_num_seqs"],
        loss_scale_factor=None,
    )
    return config


def verl_reinforce(old_log_prob, **kw):
    return verl_algos.compute_policy_loss_reinforce(rollout_log_prob=old_log_prob, **kw)


@dataclass
class LossCase:
    name: str  # the row's name
    tandem: str  # Tandem's POLICY_LOSSES name
    verl: Callable  # verl's function, called with verl's keywords
    settings: dict  # the same settings, as both sides name them (Tandem's keywords = verl's config keys)
    modes: tuple[str, ...] = AGG_MODES
    note: str = ""


def tandem_settings(settings: dict) -> dict:
    return {k: v for k, v in settings.items() if k != "rollout_correction"}


LOSS_CASES = [
    LossCase(
        "vanilla (clip-higher, dual clip)",
        "vanilla",
        verl_algos.compute_policy_loss_vanilla,
        dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0),
    ),
    LossCase(
        "gspo", "gspo", verl_algos.compute_policy_loss_gspo, dict(clip_ratio_low=0.1, clip_ratio_high=0.12)
    ),
    LossCase(
        "cispo", "cispo", verl_algos.compute_policy_loss_cispo, dict(clip_ratio_low=0.2, clip_ratio_high=0.28)
    ),
    LossCase(
        "geo_mean",
        "geo_mean",
        verl_algos.compute_policy_loss_geo_mean,
        dict(clip_ratio_low=0.4, clip_ratio_high=0.4),
        modes=("token-mean",),
        note="sequence mean whatever the mode, both sides",
    ),
    LossCase(
        "sapo",
        "sapo",
        verl_algos.compute_policy_loss_sapo,
        dict(tau_pos=1.0, tau_neg=1.05),
        modes=("token-mean",),
        note="seq-mean-token-mean whatever the mode, both sides",
    ),
    LossCase("dro", "dro", verl_algos.compute_policy_loss_dro, dict(dro_beta=0.5)),
    LossCase(
        "dppo_tv",
        "dppo_tv",
        verl_algos.compute_policy_loss_dppo_tv,
        dict(clip_ratio_low=0.15, clip_ratio_high=0.15, clip_ratio_c=10.0),
    ),
    LossCase(
        "dppo_kl",
        "dppo_kl",
        verl_algos.compute_policy_loss_dppo_kl,
        dict(clip_ratio_low=0.05, clip_ratio_high=0.05, clip_ratio_c=10.0),
    ),
    LossCase(
        "clip_cov (ratio 1: every candidate dropped)",
        "clip_cov",
        verl_algos.compute_policy_loss_clip_cov,
        dict(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_cov_ratio=1.0, clip_cov_lb=0.3, clip_cov_ub=2.0),
    ),
    LossCase(
        "kl_cov (top 20%)",
        "kl_cov",
        verl_algos.compute_policy_loss_kl_cov,
        dict(kl_cov_ratio=0.2, ppo_kl_coef=1.0),
    ),
    LossCase("reinforce vs verl reinforce", "reinforce", verl_reinforce, {}),
    LossCase("reinforce vs verl gpg loss", "reinforce", verl_algos.compute_policy_loss_gpg, {}),
]


def run_loss(fn: Callable, log_probs: torch.Tensor, **kw) -> tuple[float, torch.Tensor]:
    leaf = log_probs.clone().requires_grad_(True)
    loss, _ = fn(leaf, **kw)
    loss.backward()
    return loss.detach(), leaf.grad


def compare_loss(
    row: Row, x: LossInputs, tandem_fn: Callable, verl_fn: Callable, at: torch.Tensor | None = None
) -> None:
    """Value and gradient of loss(at) on both sides; `at` = the log-probs unless given."""
    at = x.log_probs if at is None else at
    t_loss, t_grad = run_loss(tandem_fn, at)
    v_loss, v_grad = run_loss(verl_fn, at)
    row.add(abs(float(t_loss - v_loss)), max_abs(t_grad, v_grad, x.mask))


def check_policy_losses(report: Report, seeds: range) -> None:
    for case in LOSS_CASES:
        row = report.row(f"policy_loss {case.name}", note=case.note)
        for seed in seeds:
            x = loss_inputs(seed)
            agg = {**global_counts(x.mask), "norm_length": LENGTH}
            for mode in case.modes:
                config = verl_actor_config(x.mask, **case.settings, loss_agg_mode=mode)

                def tandem(lp, case=case, x=x, mode=mode, agg=agg):
                    return policy_loss(
                        case.tandem, x.old, lp, x.advantages, x.mask, loss_agg_mode=mode,
                        agg_kwargs=agg, is_weights=x.is_weights, **tandem_settings(case.settings),
                    )  # fmt: skip

                def verl(lp, case=case, x=x, mode=mode, config=config):
                    return case.verl(
                        old_log_prob=x.old, log_prob=lp, advantages=x.advantages, response_mask=x.mask,
                        loss_agg_mode=mode, config=config, rollout_is_weights=x.is_weights,
                    )  # fmt: skip

                torch.manual_seed(seed)  # clip_cov draws; with ratio 1 the draw does not matter
                compare_loss(row, x, tandem, verl)


BYPASS_CASES = [
    ("reinforce", dict(rollout_is="token", rollout_is_threshold=2.0)),
    ("reinforce", dict(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token_k1", rollout_rs_threshold="0.6_1.6")),
    ("reinforce", dict(rollout_is="sequence", rollout_is_threshold=2.0, rollout_rs="seq_mean_k3", rollout_rs_threshold=0.1)),
    ("ppo_clip", dict(rollout_is=None, rollout_rs="token_k2", rollout_rs_threshold=0.1)),
    ("ppo_clip", dict(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_max_k3,token_k1", rollout_rs_threshold="0.5,0.6_1.6")),
]  # fmt: skip


def check_bypass(report: Report, seeds: range) -> None:
    """verl's bypass_mode loss against what roles/actor.py does in bypass mode: rollout_correction on
    (this forward's log-probs, the rollout's), then reinforce with the IS weights, or the configured
    loss (vanilla here) on the rejection mask without them."""
    rows = {
        "reinforce": report.row("bypass_mode loss_type=reinforce (IS token/sequence, RS)"),
        "ppo_clip": report.row("bypass_mode loss_type=ppo_clip (vanilla, RS)"),
    }
    for seed in seeds:
        x = loss_inputs(seed)
        agg = {**global_counts(x.mask), "norm_length": LENGTH}
        for loss_type, rc in BYPASS_CASES:
            for mode in AGG_MODES:
                correction = RolloutCorrectionConfig(**{"rollout_is": None, **rc}, loss_type=loss_type)
                config = verl_actor_config(
                    x.mask, clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode=mode,
                    rollout_correction=correction,
                )  # fmt: skip

                def tandem(lp, x=x, rc=rc, loss_type=loss_type, mode=mode, agg=agg):
                    weights, loss_mask, _ = rollout_correction(
                        lp.detach(), x.old, x.mask, with_metrics=False, **{"rollout_is": None, **rc}
                    )
                    name = "reinforce" if loss_type == "reinforce" else "vanilla"
                    weights = weights if loss_type == "reinforce" else None
                    return policy_loss(
                        name, x.old, lp, x.advantages, loss_mask, loss_agg_mode=mode, agg_kwargs=agg,
                        is_weights=weights, clip_ratio_low=0.2, clip_ratio_high=0.28,
                    )  # fmt: skip

                def verl(lp, x=x, mode=mode, config=config):
                    return verl_algos.compute_policy_loss_bypass_mode(
                        old_log_prob=x.old, log_prob=lp, advantages=x.advantages, response_mask=x.mask,
                        loss_agg_mode=mode, config=config,
                    )  # fmt: skip

                compare_loss(rows[loss_type], x, tandem, verl)


def check_value_and_kl(report: Report, seeds: range) -> None:
    row = report.row("value_loss (clipped, 0.2)")
    for seed in seeds:
        x = loss_inputs(seed)
        gen = torch.Generator().manual_seed(1000 + seed)
        old_values = torch.randn(x.mask.shape, generator=gen, dtype=torch.float64)
        values = old_values + 0.4 * torch.randn(x.mask.shape, generator=gen, dtype=torch.float64)
        returns = torch.randn(x.mask.shape, generator=gen, dtype=torch.float64)
        counts = global_counts(x.mask)
        for mode in AGG_MODES:

            def tandem(v, x=x, mode=mode, old_values=old_values, returns=returns, counts=counts):
                loss, metrics = value_loss(v, old_values, returns, x.mask, 0.2, mode, counts)
                return loss, metrics["vf_clipfrac"]

            def verl(v, x=x, mode=mode, old_values=old_values, returns=returns, counts=counts):
                return verl_algos.compute_value_loss(
                    v, returns, old_values, x.mask, 0.2, mode, dp_size=1,
                    batch_num_tokens=counts["global_num_tokens"], global_batch_size=counts["global_num_seqs"],
                )  # fmt: skip

            compare_loss(row, x, tandem, verl, at=values)

    for kind in ("kl", "abs", "mse", "low_var_kl", "kl+", "abs+", "mse+", "low_var_kl+"):
        row = report.row(f"kl_loss {kind}")
        for seed in seeds:
            x = loss_inputs(seed)
            ref = with_junk(x.old + 0.5 * torch.randn(x.old.shape, dtype=torch.float64), x.mask, -5.0)
            for mode in AGG_MODES:
                config = verl_actor_config(x.mask, loss_agg_mode=mode)

                def tandem(lp, x=x, ref=ref, mode=mode, kind=kind):
                    agg = {**global_counts(x.mask), "norm_length": LENGTH}
                    return kl_loss(lp, ref, x.mask, kind, mode, agg), None

                def verl(lp, x=x, ref=ref, mode=mode, kind=kind, config=config):
                    per_token = verl_algos.kl_penalty(lp, ref, kind)
                    return verl_algos.agg_loss(per_token, x.mask, mode, **config.global_batch_info), None

                compare_loss(row, x, tandem, verl)


# ---- advantage estimators ----------------------------------------------------------------------

GROUPS = (4, 4, 3, 2)  # no group of one: every estimator must agree
GROUPS_WITH_SINGLES = (4, 1, 3, 1, 2)  # groups of one: the documented difference


@dataclass
class AdvInputs:
    rewards: torch.Tensor  # token-level, 0 at padding
    mask: torch.Tensor
    index: np.ndarray
    singles: torch.Tensor  # (B,) bool: the sample is alone in its group
    values: torch.Tensor
    baselines: torch.Tensor
    old: torch.Tensor
    sum_pi_squared: torch.Tensor
    is_weights: torch.Tensor
    components: torch.Tensor  # (B, K) reward terms for gdpo


def adv_inputs(seed: int, sizes: tuple[int, ...], binary: bool = False) -> AdvInputs:
    """Token-level rewards on valid tokens (binary: a 0/1 score on the last token, one group all 1)."""
    gen = torch.Generator().manual_seed(seed)
    batch = sum(sizes)
    mask = response_mask(gen, batch, holes=True)
    if binary:
        scores = torch.randint(0, 2, (batch,), generator=gen).double()
        scores[: sizes[0]] = 1.0  # a group whose scores are all equal
        last = (mask.cumsum(-1) == mask.sum(-1, keepdim=True)) & (mask != 0)
        rewards = torch.where(last, scores[:, None], torch.zeros_like(mask))
    else:
        rewards = torch.randn(batch, LENGTH, generator=gen, dtype=torch.float64) * mask
    old = -3.0 * torch.rand(batch, LENGTH, generator=gen, dtype=torch.float64)
    p = old.exp()
    # sum_v pi_v^2 >= pi(y)^2; the rest of the mass spread over some other tokens
    sum_pi_squared = p**2 + (1 - p) ** 2 * torch.rand(batch, LENGTH, generator=gen, dtype=torch.float64)
    index = group_index(sizes)
    counts = {uid: int((index == uid).sum()) for uid in index}
    components = torch.randint(0, 2, (batch, 3), generator=gen).double()
    components[:, 2] = torch.rand(batch, generator=gen, dtype=torch.float64)
    return AdvInputs(
        rewards=rewards,
        mask=mask,
        index=index,
        singles=torch.tensor([counts[uid] == 1 for uid in index]),
        values=torch.randn(batch, LENGTH, generator=gen, dtype=torch.float64),
        baselines=torch.randn(batch, generator=gen, dtype=torch.float64),
        old=old,
        sum_pi_squared=sum_pi_squared,
        is_weights=(0.5 + torch.rand(batch, LENGTH, generator=gen, dtype=torch.float64)) * mask,
        components=components,
    )


def zero_singles(x: AdvInputs) -> AdvInputs:
    """The same inputs with the rewards of samples alone in their group set to 0: verl then gives them
    advantage 0 too, so Tandem on the original inputs must equal verl on these."""
    alone = x.singles[:, None].double()
    return AdvInputs(
        **{
            **x.__dict__,
            "rewards": x.rewards * (1 - alone),
            "components": x.components * (1 - alone),
        }
    )


def verl_gdpo(x: AdvInputs, weights: list[float], norm: bool):
    """verl's gdpo reads each term from non_tensor_batch[key] and puts it on the last response token."""
    keys = [f"term{k}" for k in range(x.components.shape[1])]
    prompts = torch.zeros(x.mask.shape[0], 3, dtype=torch.long)
    positions = torch.arange(LENGTH)
    last = torch.where(x.mask != 0, positions, -1).max(-1).values  # verl: attention_mask's count - 1
    attention = torch.cat([torch.ones_like(prompts), (positions < last[:, None] + 1).long()], -1)
    return verl_algos.compute_gdpo_outcome_advantage(
        token_level_rewards=x.rewards,
        response_mask=x.mask,
        index=x.index,
        norm_adv_by_std_in_grpo=norm,
        config=AlgoConfig(gdpo_reward_keys=keys, gdpo_reward_weights=weights),
        non_tensor_batch={k: x.components[:, i].numpy() for i, k in enumerate(keys)},
        batch={"prompts": prompts, "attention_mask": attention},
    )


GDPO_WEIGHTS = [1.0, 0.5, 2.0]


@dataclass
class AdvCase:
    name: str
    tandem: Callable[[AdvInputs], tuple[torch.Tensor, torch.Tensor]]
    verl: Callable[[AdvInputs], tuple[torch.Tensor, torch.Tensor]]
    grouped: bool = True  # has a group-of-one rule (the EXPECTED line)
    binary: bool = False
    tol: float = TOL
    returns: bool = True  # compare the returns too (OTB's returns of a lone sample are G either way)
    note: str = ""


def tandem_adv(name: str, **fixed) -> Callable[[AdvInputs], tuple[torch.Tensor, torch.Tensor]]:
    return lambda x: compute_advantages(name, x.rewards, x.mask, index=x.index, **fixed)


ADV_CASES = [
    AdvCase(
        "gae (gamma 0.99, lam 0.95)",
        lambda x: compute_advantages("gae", x.rewards, x.mask, values=x.values, gamma=0.99, lam=0.95),
        lambda x: verl_algos.compute_gae_advantage_return(x.rewards, x.values, x.mask, gamma=0.99, lam=0.95),
        grouped=False,
    ),
    AdvCase(
        "grpo",
        tandem_adv("grpo"),
        lambda x: verl_algos.compute_grpo_outcome_advantage(x.rewards, x.mask, x.index),
    ),
    AdvCase(
        "dr_grpo (verl: grpo, norm_adv_by_std_in_grpo=False)",
        tandem_adv("dr_grpo"),
        lambda x: verl_algos.compute_grpo_outcome_advantage(
            x.rewards, x.mask, x.index, norm_adv_by_std_in_grpo=False
        ),
    ),
    AdvCase(
        "rloo",
        tandem_adv("rloo"),
        lambda x: verl_algos.compute_rloo_outcome_advantage(x.rewards, x.mask, x.index),
    ),
    AdvCase(
        "opo",
        tandem_adv("opo"),
        lambda x: verl_algos.compute_opo_outcome_advantage(x.rewards, x.mask, x.index),
    ),
    AdvCase(
        "grpo_passk",
        tandem_adv("grpo_passk"),
        lambda x: verl_algos.compute_grpo_passk_outcome_advantage(
            x.rewards, x.mask, x.index, config=AlgoConfig(norm_adv_by_std_in_grpo=True)
        ),
        grouped=False,  # verl refuses a group of one
    ),
    AdvCase(
        "reinforce_plus_plus (gamma 0.99)",
        lambda x: compute_advantages("reinforce_plus_plus", x.rewards, x.mask, gamma=0.99),
        lambda x: verl_algos.compute_reinforce_plus_plus_outcome_advantage(
            x.rewards, x.mask, config=AlgoConfig(gamma=0.99)
        ),
        grouped=False,
    ),
    AdvCase(
        "reinforce_plus_plus_baseline",
        tandem_adv("reinforce_plus_plus_baseline"),
        lambda x: verl_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(
            x.rewards, x.mask, x.index
        ),
    ),
    AdvCase(
        "remax",
        lambda x: compute_advantages("remax", x.rewards, x.mask, reward_baselines=x.baselines),
        lambda x: verl_algos.compute_remax_outcome_advantage(x.rewards, x.baselines, x.mask),
        grouped=False,
    ),
    AdvCase(
        "gdpo (3 terms, weights 1, 0.5, 2)",
        tandem_adv("gdpo", reward_components=None, reward_weights=GDPO_WEIGHTS),
        lambda x: verl_gdpo(x, GDPO_WEIGHTS, norm=True),
        tol=TOL_FLOAT32,
        note="verl computes gdpo in float32",
    ),
    AdvCase(
        "optimal_token_baseline (handle_zero_tail=True both)",
        lambda x: compute_advantages(
            "optimal_token_baseline",
            x.rewards,
            x.mask,
            index=x.index,
            old_log_probs=x.old,
            sum_pi_squared=x.sum_pi_squared,
            rollout_is_weights=x.is_weights,
            handle_zero_tail=True,
        ),
        lambda x: verl_algos.compute_optimal_token_baseline_advantage(
            x.rewards, x.mask, x.index, x.old, x.sum_pi_squared, x.is_weights, handle_zero_tail=True
        ),
        returns=False,
    ),
    AdvCase(
        "optimal_token_baseline (each side's default)",
        lambda x: compute_advantages(
            "optimal_token_baseline",
            x.rewards,
            x.mask,
            index=x.index,
            old_log_probs=x.old,
            sum_pi_squared=x.sum_pi_squared,
            rollout_is_weights=x.is_weights,
        ),
        lambda x: verl_algos.compute_optimal_token_baseline_advantage(
            x.rewards, x.mask, x.index, x.old, x.sum_pi_squared, x.is_weights
        ),
        grouped=False,  # the line above already shows the group-of-one rule
        returns=False,
        note="handle_zero_tail on by default on both sides",
    ),
    AdvCase(
        "tir_optimal_token_baseline (defaults)",
        lambda x: compute_advantages(
            "tir_optimal_token_baseline",
            x.rewards,
            x.mask,
            index=x.index,
            old_log_probs=x.old,
            sum_pi_squared=x.sum_pi_squared,
            rollout_is_weights=x.is_weights,
        ),
        lambda x: verl_algos.compute_multi_turn_optimal_token_baseline_advantage(
            x.rewards, x.mask, x.index, x.old, x.sum_pi_squared, x.is_weights
        ),
        returns=False,
    ),
]


def adv_diff(case: AdvCase, tandem_out, verl_out, mask: torch.Tensor) -> float:
    """Max |diff| of advantages (and returns) over valid tokens: padding holds nothing either side uses."""
    diff = max_abs(tandem_out[0], verl_out[0], mask)
    if case.returns:
        diff = max(diff, max_abs(tandem_out[1], verl_out[1], mask))
    return diff


def gdpo_tandem(x: AdvInputs):
    return compute_advantages(
        "gdpo", x.rewards, x.mask, index=x.index, reward_components=x.components, reward_weights=GDPO_WEIGHTS
    )


def check_advantages(report: Report, seeds: range) -> None:
    for case in ADV_CASES:
        tandem = gdpo_tandem if case.name.startswith("gdpo") else case.tandem
        row = report.row(f"adv {case.name}", tol=case.tol, note=case.note)
        for seed in seeds:
            x = adv_inputs(seed, GROUPS)
            row.add(adv_diff(case, tandem(x), case.verl(x), x.mask))
        if not case.grouped:
            continue
        row = report.row(
            f"adv {case.name}, with groups of one",
            tol=case.tol,
            expected="a group of one gets 0 (verl: its score)",
            note="verl given 0 rewards there",
        )
        for seed in seeds:
            x = adv_inputs(seed, GROUPS_WITH_SINGLES)
            out = tandem(x)
            row.add(
                adv_diff(case, out, case.verl(x), x.mask),
                residual=adv_diff(case, out, case.verl(zero_singles(x)), x.mask),
            )

    check_gpg(report, seeds)


def paper_alpha(scores: torch.Tensor, index: np.ndarray) -> float:
    """GPG's alpha = B / (B - M), M = samples of groups whose scores are all equal (or alone)."""
    informative = 0
    for uid in set(index):
        group = scores[torch.from_numpy(index == uid)]
        informative += len(group) if len(group) > 1 and bool((group != group[0]).any()) else 0
    return len(scores) / max(informative, 1)


def check_gpg(report: Report, seeds: range) -> None:
    """gpg with 0/1 scores: alpha differs on purpose; the residual rescales verl's advantages by
    alpha_paper / alpha_verl (verl: B / #non-zero scores) and zeroes its groups of one."""
    row = report.row(
        "adv gpg (0/1 scores, one group all 1, groups of one)",
        expected="alpha = B/(B-M) as the GPG paper (verl: B/#non-zero scores), group of one 0",
        note="verl's x alpha ratio",
    )
    for seed in seeds:
        for sizes in (GROUPS, GROUPS_WITH_SINGLES):
            x = adv_inputs(seed, sizes, binary=True)
            scores = (x.rewards * x.mask).sum(-1)
            tandem, _ = compute_advantages("gpg", x.rewards, x.mask, index=x.index)
            verl, _ = verl_algos.compute_gpg_outcome_advantage(x.rewards, x.mask, x.index)
            alpha_verl = len(scores) / max(int((scores != 0).sum()), 1)
            rescaled = verl / alpha_verl * paper_alpha(scores, x.index) * (~x.singles)[:, None]
            row.add(max_abs(tandem, verl, x.mask), residual=max_abs(tandem, rescaled, x.mask))


# ---- rollout correction ------------------------------------------------------------------------


def rc_inputs(seed: int, spread: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(old, rollout, mask): log r = old - rollout of std `spread` per valid token."""
    gen = torch.Generator().manual_seed(2000 + seed)
    mask = response_mask(gen, 10, holes=True)
    old = -3.0 * torch.rand(10, LENGTH, generator=gen, dtype=torch.float64)
    rollout = old - spread * torch.randn(10, LENGTH, generator=gen, dtype=torch.float64)
    return with_junk(old, mask, -7.0), with_junk(rollout, mask, -9.0), mask


# (k1 thresholds bound pi_rollout / pi_old; k2 / k3 an upper bound), each rejecting part of the batch
RS_THRESHOLDS = {
    "token_k1": "0.7_1.5", "token_k2": 0.05, "token_k3": 0.05,
    "seq_sum_k1": "0.5_2.0", "seq_sum_k2": 0.3, "seq_sum_k3": 0.3,
    "seq_mean_k1": "0.9_1.1", "seq_mean_k2": 0.04, "seq_mean_k3": 0.04,
    "seq_max_k2": 0.15, "seq_max_k3": 0.15,
}  # fmt: skip


def verl_correction(old, rollout, mask, **settings):
    proto, loss_mask, metrics = verl_rc.compute_rollout_correction_and_rejection_mask(
        old, rollout, mask, **settings
    )
    weights = None if proto is None else proto.batch["rollout_is_weights"]
    return weights, loss_mask, metrics


def check_is_weights(report: Report, seeds: range) -> None:
    cases = [
        ("token TIS (2.0)", 0.4, dict(rollout_is="token", rollout_is_threshold=2.0), {}),
        ("sequence TIS (2.0)", 0.15, dict(rollout_is="sequence", rollout_is_threshold=2.0), {}),
        ("token IcePop (verl '0.5_2.0', Tandem band)", 0.4,
         dict(rollout_is="token", rollout_is_threshold="0.5_2.0"), dict(band=(0.5, 2.0))),
        ("sequence IcePop", 0.15,
         dict(rollout_is="sequence", rollout_is_threshold="0.5_2.0"), dict(band=(0.5, 2.0))),
        ("token TIS, batch-normalised", 0.4,
         dict(rollout_is="token", rollout_is_threshold=2.0, rollout_is_batch_normalize=True), {}),
        ("sequence TIS, batch-normalised", 0.15,
         dict(rollout_is="sequence", rollout_is_threshold=2.0, rollout_is_batch_normalize=True), {}),
    ]  # fmt: skip
    for name, spread, verl_settings, tandem_extra in cases:
        row = report.row(f"rollout_is weights {name}")
        for seed in seeds:
            old, rollout, mask = rc_inputs(seed, spread)
            v_weights, _, _ = verl_correction(old, rollout, mask, **verl_settings)
            settings = {**verl_settings, "rollout_is_threshold": 2.0, **tandem_extra}
            t_weights, _, _ = rollout_correction(old, rollout, mask, **settings)
            row.add(max_abs(t_weights, v_weights, mask))

    row = report.row(
        "rollout_is batch-normalised after rejection (token_k1)",
        expected="the mean is over the tokens rejection kept (verl: all valid)",
        note="verl's x mean(all) / mean(kept)",
    )
    for seed in seeds:
        old, rollout, mask = rc_inputs(seed, 0.4)
        settings = dict(
            rollout_is="token",
            rollout_is_threshold=2.0,
            rollout_rs="token_k1",
            rollout_rs_threshold="0.7_1.5",
        )
        v_weights, _, _ = verl_correction(old, rollout, mask, **settings, rollout_is_batch_normalize=True)
        t_weights, t_mask, _ = rollout_correction(
            old, rollout, mask, **settings, rollout_is_batch_normalize=True
        )
        raw = rollout_is_weights(old, rollout, mask, "token", 2.0)
        rescale = (raw * mask).sum() / mask.sum() / ((raw * t_mask).sum() / t_mask.sum())
        row.add(
            max_abs(t_weights, v_weights, t_mask), residual=max_abs(t_weights, v_weights * rescale, t_mask)
        )


def check_rejection(report: Report, seeds: range) -> None:
    options = [*RS_THRESHOLDS, "token_k1,seq_max_k3", "seq_mean_k2,seq_sum_k1,token_k3"]
    for option in options:
        threshold = ",".join(str(RS_THRESHOLDS[o]) for o in option.split(","))
        row = report.row(f"rollout_rs {option} ({threshold})")
        rejected = []
        for seed in seeds:
            old, rollout, mask = rc_inputs(seed, 0.3)
            _, v_mask, _ = verl_correction(
                old, rollout, mask, rollout_rs=option, rollout_rs_threshold=threshold
            )
            _, t_mask, _ = rollout_correction(
                old, rollout, mask, rollout_rs=option, rollout_rs_threshold=threshold
            )
            row.add(max_abs(t_mask, v_mask, mask))
            rejected.append(float(((mask != 0) & (t_mask == 0)).sum() / (mask != 0).sum()))
        row.note = f"rejected {min(rejected):.0%}-{max(rejected):.0%} of tokens"


# Metric names whose definitions differ on purpose (README, "The RL math"), per IS level; the
# residual recomputes the Tandem definition from verl's applied weights.
METRIC_CONFIGS = [
    ("token", 0.4, dict(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token_k1,seq_mean_k3", rollout_rs_threshold="0.7_1.5,0.04")),
    ("sequence", 0.15, dict(rollout_is="sequence", rollout_is_threshold=2.0, rollout_rs="seq_sum_k2", rollout_rs_threshold=0.3)),
    # every rejection option at once: its rollout_rs_<option>_* statistics
    ("token", 0.3, dict(rollout_is=None, rollout_is_threshold=2.0, rollout_rs=",".join(RS_THRESHOLDS), rollout_rs_threshold=",".join(map(str, RS_THRESHOLDS.values())))),
]  # fmt: skip


def tandem_definition(name: str, level: str, raw: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor):
    """What Tandem's metric `name` is, computed here from verl's applied weights and the raw ratio r
    (None where the definitions agree and there is nothing to recompute)."""
    if weights is None:  # rejection alone: no IS metric to recompute
        return None
    valid = mask != 0
    has_token = valid.any(-1)
    if level == "sequence":
        unit_w, unit_raw = weights.max(-1).values[has_token], raw.max(-1).values[has_token]
    else:
        unit_w, unit_raw = weights[valid], raw[valid]
    return {
        "rollout_is_mean": float(unit_w.mean()),
        "rollout_is_std": float(unit_w.std(unbiased=False)),
        "rollout_is_eff_sample_size": float(unit_w.sum() ** 2 / (unit_w.numel() * (unit_w**2).sum())),
        "rollout_is_max": float(unit_raw.max()),
        "rollout_is_min": float(unit_raw.min()),
    }.get(name)


DOCUMENTED = {
    "rollout_is_mean": "sequence IS: a mean over sequences (verl: over tokens)",
    "rollout_is_std": "sequence IS: over sequences (verl: over tokens)",
    "rollout_is_eff_sample_size": "sequence IS: ESS of sequences (verl: of tokens)",
    "rollout_is_max": "max of the raw ratio (verl: of the truncated weight)",
    "rollout_is_min": "min of the raw ratio",
}


def check_metrics(report: Report, seeds: range) -> None:
    """Every metric name both log under rollout_corr/ (Tandem: rollout_diagnostics, the step's
    numbers), one line per name and IS level."""
    rows: dict[str, Row] = {}
    for level, spread, settings in METRIC_CONFIGS:
        for seed in seeds:
            old, rollout, mask = rc_inputs(seed, spread)
            v_weights, _, v_metrics = verl_correction(old, rollout, mask, **settings)
            rc = SimpleNamespace(
                rollout_is_band_low=None,
                rollout_is_band_high=None,
                rollout_is_batch_normalize=False,
                **settings,
            )
            _, t_metrics = rollout_diagnostics(old, rollout, mask, rc)
            log_ratio = torch.where(mask != 0, old - rollout, torch.zeros_like(old))
            if level == "sequence":
                log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(log_ratio)
            raw = torch.where(mask != 0, log_ratio.exp(), torch.zeros_like(old))
            for key in sorted(set(v_metrics) & set(t_metrics)):
                name = key.removeprefix("rollout_corr/")
                label = f"metric {key} ({level} IS)" if name.startswith("rollout_is") else f"metric {key}"
                if label not in rows:
                    rows[label] = report.row(label, expected=DOCUMENTED.get(name, ""))
                diff = abs(t_metrics[key] - v_metrics[key])
                tandem_value = tandem_definition(name, level, raw, v_weights, mask)
                residual = None if tandem_value is None else abs(t_metrics[key] - tandem_value)
                rows[label].add(diff, residual=residual)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=6, help="random inputs per check (default 6)")
    seeds = range(parser.parse_args().seeds)
    torch.set_default_dtype(torch.float64)
    report = Report()
    check_policy_losses(report, seeds)
    check_bypass(report, seeds)
    check_value_and_kl(report, seeds)
    check_advantages(report, seeds)
    check_is_weights(report, seeds)
    check_rejection(report, seeds)
    check_metrics(report, seeds)
    report.print()
    counts = {s: sum(r.status == s for r in report.rows) for s in ("OK", "EXPECTED", "DIFF")}
    print(f"\n{len(report.rows)} checks: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return 1 if counts["DIFF"] else 0


if __name__ == "__main__":
    sys.exit(main())
