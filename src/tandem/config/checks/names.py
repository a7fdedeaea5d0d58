"""Registry names: estimators, policy losses, KL estimators and controllers, aggregation modes, IS levels."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from tandem.algo_options import EstimatorSpec
from tandem.config.errors import Problems, closest

if TYPE_CHECKING:
    from tandem.algo_options import Names
    from tandem.algos.registry import Registry
    from tandem.config.schema import TandemConfig


def registries() -> dict[str, Registry | Names]:
    """The names a config may give, per registry: tandem.algos' registries where that package is loaded (a name
    registered at run time counts), else the same names listed without torch (tandem/algo_options.py, which a
    test keeps equal to what `import tandem.algos` registers): `tandem config` checks a config without torch."""
    if "tandem.algos" in sys.modules:
        from tandem.algos import registry
    else:
        from tandem import algo_options as registry

    return {
        "adv": registry.ADV_ESTIMATORS,
        "loss": registry.POLICY_LOSSES,
        "kl": registry.KL_ESTIMATORS,
        "agg": registry.AGG_MODES,
        "ctrl": registry.KL_CONTROLLERS,
        "is": registry.IS_LEVELS,
    }


def estimator_spec(name: str, regs: dict[str, Registry]) -> EstimatorSpec:
    """What the advantage estimator `name` reads (its typed flags); an unknown name (which `check_names`
    reports) reads nothing, so no other rule fires on it."""
    return regs["adv"].spec(name) if name in regs["adv"] else EstimatorSpec()


def check_name(
    problems: Problems, key: str, value: str, registry: Registry, extra: tuple[str, ...] = ()
) -> None:
    known = [*extra, *registry.names()]
    if value in known:
        return
    match = closest(str(value), known)
    hint = f" Did you mean '{match}'?" if match else ""
    problems.add(key, f"{key}: '{value}' is not a known {registry.kind}.{hint} Known: {', '.join(known)}.")


def check_names(cfg: TandemConfig, problems: Problems, regs: dict[str, Registry]) -> None:
    check_name(problems, "algorithm.adv_estimator", cfg.algorithm.adv_estimator, regs["adv"])
    check_name(problems, "actor.policy_loss", cfg.actor.policy_loss, regs["loss"])
    check_name(problems, "actor.loss_agg_mode", cfg.actor.loss_agg_mode, regs["agg"])
    check_name(problems, "critic.loss_agg_mode", cfg.critic.loss_agg_mode, regs["agg"])
    check_name(problems, "actor.kl_loss_type", cfg.actor.kl_loss_type, regs["kl"])
    check_name(problems, "algorithm.kl_penalty", cfg.algorithm.kl_penalty, regs["kl"])
    check_name(problems, "algorithm.kl_ctrl.type", cfg.algorithm.kl_ctrl.type, regs["ctrl"])
    check_name(problems, "rollout.is_correction", cfg.rollout.is_correction, regs["is"], extra=("none",))
