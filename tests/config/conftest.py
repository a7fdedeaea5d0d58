import pytest

from tandem.algos.registry import Registry
from tandem.config import validate

# The names agreed with tandem/algos, so these tests do not depend on how far that package is.
_ESTIMATORS = {
    "gae": dict(needs_critic=True, needs_groups=False, needs_reward_baselines=False),
    "grpo": dict(needs_critic=False, needs_groups=True, needs_reward_baselines=False),
    "dr_grpo": dict(needs_critic=False, needs_groups=True, needs_reward_baselines=False),
    "rloo": dict(needs_critic=False, needs_groups=True, needs_reward_baselines=False),
    "reinforce_plus_plus": dict(needs_critic=False, needs_groups=False, needs_reward_baselines=False),
    "reinforce_plus_plus_baseline": dict(needs_critic=False, needs_groups=True, needs_reward_baselines=False),
    "remax": dict(needs_critic=False, needs_groups=False, needs_reward_baselines=True),
    "opo": dict(needs_critic=False, needs_groups=True, needs_reward_baselines=False),
    "gpg": dict(needs_critic=False, needs_groups=True, needs_reward_baselines=False),
}
_NAMES = {
    "loss": ["vanilla", "gspo", "reinforce"],
    "kl": ["kl", "abs", "mse", "low_var_kl", "kl+", "abs+", "mse+", "low_var_kl+", "k1", "k2", "k3"],
    "agg": ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"],
    "ctrl": ["fixed", "adaptive"],
    "is": ["token", "sequence"],
}


def _fake_registries() -> dict[str, Registry]:
    regs = {"adv": Registry("advantage estimator")}
    for name, info in _ESTIMATORS.items():
        regs["adv"].register(name, **info)(lambda: None)
    kinds = {
        "loss": "policy loss",
        "kl": "KL estimator",
        "agg": "loss aggregation mode",
        "ctrl": "KL controller",
        "is": "importance-sampling correction level",
    }
    for key, names in _NAMES.items():
        regs[key] = Registry(kinds[key])
        for name in names:
            regs[key].register(name)(lambda: None)
    return regs


@pytest.fixture
def real_registries():
    """Requested by tests that validate against what `import tandem.algos` registers; skips while empty."""
    regs = validate._registries()
    if not all(reg.names() for reg in regs.values()):
        pytest.skip("tandem.algos has not filled its registries yet")
    return regs


@pytest.fixture(autouse=True)
def agreed_registries(request, monkeypatch):
    """Validate against the agreed names, unless the test asks for the real registries."""
    if "real_registries" not in request.fixturenames:
        monkeypatch.setattr(validate, "_registries", _fake_registries)
