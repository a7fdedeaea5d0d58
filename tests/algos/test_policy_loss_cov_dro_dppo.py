"""clip_cov, kl_cov (Cui et al. 2025), dro and dppo_tv / dppo_kl: hand-computed values and gradients,
the limits where they become PPO clip / REINFORCE, and parity with the papers' formulas on a random batch."""

import math

import pytest
import torch

from tandem.algos import policy_loss
from tandem.algos.policy_loss import clip_cov, dppo_kl, dppo_tv, dro, kl_cov, vanilla

F64 = torch.float64
LOG = math.log


def tokens(log_probs, ratios, advantages):
    """(old, logp, A, mask) of one row; logp - old = log r; the last token is padding."""
    logp = torch.tensor([[*log_probs, 0.0]], dtype=F64, requires_grad=True)
    old = logp.detach() - torch.tensor([[*(LOG(r) for r in ratios), 0.0]], dtype=F64)
    adv = torch.tensor([[*advantages, 9.0]], dtype=F64)
    mask = torch.tensor([[1.0] * len(ratios) + [0.0]], dtype=F64)
    return old, logp, adv, mask


def grad_of(loss, logp):
    (grad,) = torch.autograd.grad(loss, logp)
    return grad


# --- clip_cov ------------------------------------------------------------------------------------


def clip_cov_batch():
    # logp (0.5, -2.5, -2.5, 0.5), mean -1; A (1, 1, -1, -1), mean 0
    # cov = A (logp + 1) = (1.5, -1.5, 1.5, -1.5): t0 and t2 lie in (lb, ub) = (1, 5)
    # r = (1.1, 1.5, 0.9, 1.0), clip 0.2: -A r = (-1.1, -1.5, 0.9, 1.0); t1 is clipped to -1.2
    return tokens([0.5, -2.5, -2.5, 0.5], [1.1, 1.5, 0.9, 1.0], [1.0, 1.0, -1.0, -1.0])


def test_clip_cov_drops_the_candidates_hand_computed():
    old, logp, adv, mask = clip_cov_batch()
    # budget max(1, floor(0.5 x 4)) = 2: both candidates t0, t2 dropped -> (0 - 1.2 + 0 + 1.0) / 4
    loss, metrics = clip_cov(old, logp, adv, mask, clip_cov_ratio=0.5)
    assert loss.item() == pytest.approx(-0.05, rel=1e-12)
    assert metrics["pg_clipfrac"].item() == 0.5  # the dropped share (verl's), PPO's clipped t1 not counted
    assert metrics["pg_clipfrac_lower"].item() == 0.0
    assert metrics["ppo_kl"].item() == pytest.approx(-(LOG(1.1) + LOG(1.5) + LOG(0.9)) / 4, rel=1e-12)
    # gradient -A r / 4 on t3 only: t0, t2 dropped, t1 clipped, padding nothing
    expected = torch.tensor([[0.0, 0.0, 0.0, 0.25, 0.0]], dtype=F64)
    torch.testing.assert_close(grad_of(loss, logp), expected)


def test_clip_cov_picks_one_candidate_at_random_from_torch_generator():
    old, logp, adv, mask = clip_cov_batch()
    # verl's default ratio: budget max(1, floor(0.0002 x 4)) = 1 of the two candidates
    both = {0.175: 0, -0.325: 2}  # t0 dropped: (0 - 1.2 + 0.9 + 1) / 4; t2 dropped: (-1.1 - 1.2 + 0 + 1) / 4
    picked = []
    for seed in range(40):
        torch.manual_seed(seed)
        loss, metrics = clip_cov(old, logp, adv, mask)
        value = min(both, key=lambda v: abs(v - loss.item()))
        assert loss.item() == pytest.approx(value, rel=1e-12)
        assert metrics["pg_clipfrac"].item() == 0.25
        grad = grad_of(loss, logp)
        assert grad[0, both[value]] == 0 and grad[0, 2 - both[value]] != 0
        picked.append(both[value])
        torch.manual_seed(seed)  # the same seed picks the same token
        assert clip_cov(old, logp, adv, mask)[0].item() == loss.item()
    assert set(picked) == {0, 2}


def test_clip_cov_without_candidates_is_ppo_clip():
    old, logp, adv, mask = clip_cov_batch()
    loss, metrics = clip_cov(old, logp, adv, mask, clip_cov_lb=2.0)  # no cov in (2, 5)
    assert loss.item() == pytest.approx((-1.1 - 1.2 + 0.9 + 1.0) / 4, rel=1e-12)
    reference, _ = vanilla(old, logp, adv, mask)  # dual clip (c = 3) does not bind here
    torch.testing.assert_close(loss, reference)
    torch.testing.assert_close(grad_of(loss, logp), grad_of(reference, logp))
    assert metrics["pg_clipfrac"].item() == 0.0


def test_clip_cov_rejects_a_zero_ratio():
    with pytest.raises(ValueError, match="clip_cov_ratio must be > 0"):
        clip_cov(*clip_cov_batch(), clip_cov_ratio=0.0)


# --- kl_cov --------------------------------------------------------------------------------------


def kl_cov_batch():
    # logp (0.5, -2.5, -3, 1), mean -1; A (1, 1, -1, -1): cov = A (logp + 1) = (1.5, -1.5, 2, -2)
    # r = (1.1, 1.5, 0.9, 1.0): -A r = (-1.1, -1.5, 0.9, 1.0), no clip
    return tokens([0.5, -2.5, -3.0, 1.0], [1.1, 1.5, 0.9, 1.0], [1.0, 1.0, -1.0, -1.0])


def test_kl_cov_penalises_the_top_covariance_token_hand_computed():
    old, logp, adv, mask = kl_cov_batch()
    # budget max(1, floor(0.0002 x 4)) = 1: t2 (cov 2) gets + 1 x |log 0.9|
    loss, metrics = kl_cov(old, logp, adv, mask, ppo_kl_coef=1.0)
    assert loss.item() == pytest.approx((-1.1 - 1.5 + 0.9 - LOG(0.9) + 1.0) / 4, rel=1e-12)
    assert metrics["pg_clipfrac"].item() == 0.25  # the penalised share
    # d/dlogp: -A r, and on t2 + sign(log 0.9) = -1: (0.9 - 1) / 4
    expected = torch.tensor([[-1.1 / 4, -1.5 / 4, -0.1 / 4, 1.0 / 4, 0.0]], dtype=F64)
    torch.testing.assert_close(grad_of(loss, logp), expected)
    # budget floor(0.5 x 4) = 2: t2 and t0 (cov 1.5); verl's ppo_kl_coef 0.1
    loss, metrics = kl_cov(old, logp, adv, mask, kl_cov_ratio=0.5)
    expected_loss = (-1.1 + 0.1 * LOG(1.1) - 1.5 + 0.9 - 0.1 * LOG(0.9) + 1.0) / 4
    assert loss.item() == pytest.approx(expected_loss, rel=1e-12)
    assert metrics["pg_clipfrac"].item() == 0.5


def test_kl_cov_without_penalty_is_the_unclipped_surrogate_and_on_policy_ppo():
    old, logp, adv, mask = kl_cov_batch()
    loss, _ = kl_cov(old, logp, adv, mask, ppo_kl_coef=0.0, kl_cov_ratio=1.0)
    assert loss.item() == pytest.approx((-1.1 - 1.5 + 0.9 + 1.0) / 4, rel=1e-12)
    # on-policy |logp - old| = 0 (and so is its gradient): PPO clip's value and gradient, -A
    loss, _ = kl_cov(logp.detach(), logp, adv, mask, kl_cov_ratio=1.0)
    reference, _ = vanilla(logp.detach(), logp, adv, mask)
    torch.testing.assert_close(loss, reference)
    torch.testing.assert_close(grad_of(loss, logp), grad_of(reference, logp))


# --- dro -----------------------------------------------------------------------------------------


def test_dro_hand_computed():
    # logp (-1, -2), old (-1.5, -2), A (1, -1), beta 0.5: l = -(A logp - 0.25 (logp - old)^2)
    # t0: -(-1 - 0.25 x 0.25) = 1.0625; t1: -(2 - 0) = -2; token-mean -0.46875
    logp = torch.tensor([[-1.0, -2.0, 5.0]], dtype=F64, requires_grad=True)
    old = torch.tensor([[-1.5, -2.0, 0.0]], dtype=F64)
    adv = torch.tensor([[1.0, -1.0, 3.0]], dtype=F64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=F64)
    loss, metrics = dro(old, logp, adv, mask, dro_beta=0.5)
    assert loss.item() == pytest.approx(-0.46875, rel=1e-12)
    assert metrics["pg_clipfrac"].item() == 0.0
    # gradient (-A + beta (logp - old)) / 2: (-1 + 0.25) / 2, (1 + 0) / 2
    torch.testing.assert_close(grad_of(loss, logp), torch.tensor([[-0.375, 0.5, 0.0]], dtype=F64))
    # IS weights scale each token's loss and carry no gradient
    weights = torch.tensor([[2.0, 0.5, 7.0]], dtype=F64, requires_grad=True)
    loss, _ = dro(old, logp, adv, mask, dro_beta=0.5, is_weights=weights)
    assert loss.item() == pytest.approx((2 * 1.0625 - 0.5 * 2) / 2, rel=1e-12)
    loss.backward()
    assert weights.grad is None


def test_dro_tends_to_reinforce_and_is_reinforce_on_policy():
    gen = torch.Generator().manual_seed(1)
    old = torch.randn(3, 4, generator=gen, dtype=F64) - 2
    logp = (old + 0.3 * torch.randn(3, 4, generator=gen, dtype=F64)).requires_grad_(True)
    adv = torch.randn(3, 4, generator=gen, dtype=F64)
    mask = torch.tensor([[1.0] * 4, [1.0] * 2 + [0.0] * 2, [1.0] * 3 + [0.0]], dtype=F64)
    reference, _ = policy_loss("reinforce", old, logp, adv, mask)
    reference_grad = grad_of(reference, logp)
    loss, _ = dro(old, logp, adv, mask, dro_beta=1e-12)
    torch.testing.assert_close(loss, reference)
    torch.testing.assert_close(grad_of(loss, logp), reference_grad)
    loss, _ = dro(logp.detach(), logp, adv, mask, dro_beta=3.0)
    torch.testing.assert_close(grad_of(loss, logp), reference_grad)


@pytest.mark.parametrize("beta", [None, 0.0, -1.0])
def test_dro_needs_a_positive_beta(beta):
    with pytest.raises(ValueError, match=r"dro_beta .* must be > 0.*set actor.dro_beta"):
        dro(*kl_cov_batch(), dro_beta=beta)


# --- dppo_tv / dppo_kl ---------------------------------------------------------------------------


def dppo_batch():
    # (p_old, p, A) per token; r = p / p_old
    # t0 (0.5, 0.8, +1): p rose 0.3 > 0.2                    -> dropped
    # t1 (0.5, 0.6, +1): rose 0.1, r 1.2                      -> kept
    # t2 (0.5, 0.2, -1): fell 0.3 > 0.2                       -> dropped
    # t3 (0.5, 0.9, -1): rose against the advantage, r 1.8    -> kept
    # t4 (0.01, 0.025, +1): rose 0.015, r 2.5 (PPO clips it)  -> kept
    pairs = [(0.5, 0.8), (0.5, 0.6), (0.5, 0.2), (0.5, 0.9), (0.01, 0.025)]
    logp = torch.tensor([[*(LOG(p) for _, p in pairs), 4.0]], dtype=F64, requires_grad=True)
    old = torch.tensor([[*(LOG(q) for q, _ in pairs), -1.0]], dtype=F64)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0, 2.0]], dtype=F64)
    mask = torch.tensor([[1.0] * 5 + [0.0]], dtype=F64)
    return old, logp, adv, mask


def test_dppo_tv_hand_computed():
    old, logp, adv, mask = dppo_batch()
    loss, metrics = dppo_tv(old, logp, adv, mask)  # TV bounds 0.2 / 0.2, c = 3
    # kept tokens: -A sg(r) logp: t1 -1.2 log 0.6, t3 +1.8 log 0.9, t4 -2.5 log 0.025; / 5 tokens
    assert loss.item() == pytest.approx((-1.2 * LOG(0.6) + 1.8 * LOG(0.9) - 2.5 * LOG(0.025)) / 5, rel=1e-12)
    assert metrics["pg_clipfrac"].item() == pytest.approx(2 / 5)
    assert metrics["pg_clipfrac_lower"].item() == 0.0
    expected = torch.tensor([[0.0, -1.2 / 5, 0.0, 1.8 / 5, -2.5 / 5, 0.0]], dtype=F64)
    torch.testing.assert_close(grad_of(loss, logp), expected)
    # c = 2 truncates t4's weight 2.5 -> 2 (pg_clipfrac_lower: kept but truncated)
    loss, metrics = dppo_tv(old, logp, adv, mask, clip_ratio_c=2.0)
    assert loss.item() == pytest.approx((-1.2 * LOG(0.6) + 1.8 * LOG(0.9) - 2 * LOG(0.025)) / 5, rel=1e-12)
    assert metrics["pg_clipfrac_lower"].item() == pytest.approx(1 / 5)
    assert grad_of(loss, logp)[0, 4].item() == pytest.approx(-2 / 5)
    # the bounds are clip_ratio_low / _high: 0.35 keeps t0 (rose 0.3) and t2 (fell 0.3)
    _, metrics = dppo_tv(old, logp, adv, mask, clip_ratio_low=0.35, clip_ratio_high=0.35)
    assert metrics["pg_clipfrac"].item() == 0.0


def binary_kl(p_old, p):
    return p_old * LOG(p_old / p) + (1 - p_old) * LOG((1 - p_old) / (1 - p))


def test_dppo_kl_hand_computed():
    old, logp, adv, mask = dppo_batch()
    # KL(Bern(p_old) || Bern(p)): t0 0.223 (rose, A > 0: dropped at 0.05), t1 0.0204 (kept),
    # t2 0.223 (fell, A < 0: dropped), t3 0.368 but against the advantage (kept), t4 0.0060 (kept)
    assert binary_kl(0.5, 0.8) > 0.05 and binary_kl(0.5, 0.2) > 0.05 and binary_kl(0.5, 0.9) > 0.05
    assert binary_kl(0.5, 0.6) < 0.05 and binary_kl(0.01, 0.025) < 0.05
    loss, metrics = dppo_kl(old, logp, adv, mask, clip_ratio_low=0.05, clip_ratio_high=0.05)
    assert loss.item() == pytest.approx((-1.2 * LOG(0.6) + 1.8 * LOG(0.9) - 2.5 * LOG(0.025)) / 5, rel=1e-12)
    assert metrics["pg_clipfrac"].item() == pytest.approx(2 / 5)
    # a bound of 0.01 also drops t1 (0.0204), not t4 (0.0060)
    _, metrics = dppo_kl(old, logp, adv, mask, clip_ratio_low=0.01, clip_ratio_high=0.01)
    assert metrics["pg_clipfrac"].item() == pytest.approx(3 / 5)


@pytest.mark.parametrize(("fn", "bound"), [(dppo_tv, 1.0), (dppo_kl, 1e9)])
def test_dppo_with_a_region_that_drops_nothing_has_ppo_gradient(fn, bound):
    # TV <= 1 always and any KL <= 1e9; c huge: the gradient is -A r d logp, PPO's where it clips nothing
    gen = torch.Generator().manual_seed(2)
    old = torch.log(torch.rand(4, 6, generator=gen, dtype=F64) * 0.9 + 0.05)
    logp = (old + 0.3 * (torch.rand(4, 6, generator=gen, dtype=F64) * 2 - 1)).requires_grad_(True)
    adv = torch.randn(4, 6, generator=gen, dtype=F64)
    mask = (torch.arange(6)[None, :] < torch.tensor([[6], [4], [1], [5]])).to(F64)
    loss, metrics = fn(old, logp, adv, mask, clip_ratio_low=bound, clip_ratio_high=bound, clip_ratio_c=1e9)
    assert metrics["pg_clipfrac"].item() == 0.0
    # ratios within e^+-0.3, inside PPO's 0.5..1.5: nothing clipped there either
    reference, ppo_metrics = vanilla(
        old, logp, adv, mask, clip_ratio_low=0.5, clip_ratio_high=0.5, clip_ratio_c=1e9
    )
    assert ppo_metrics["pg_clipfrac"].item() == 0.0
    torch.testing.assert_close(grad_of(loss, logp), grad_of(reference, logp))
    # on-policy (r = 1, p = p_old: nothing leaves the region) with the default bounds: -A d logp too
    loss, _ = fn(logp.detach(), logp, adv, mask)
    reference, _ = vanilla(logp.detach(), logp, adv, mask)
    torch.testing.assert_close(grad_of(loss, logp), grad_of(reference, logp))


# --- parity with the papers' formulas (as verl writes them) on a random batch ------------------------


def random_batch(seed=0, rows=6, length=9):
    gen = torch.Generator().manual_seed(seed)
    old = torch.log(torch.rand(rows, length, generator=gen, dtype=F64) * 0.9 + 0.05)
    logp = (old + 0.4 * torch.randn(rows, length, generator=gen, dtype=F64)).clamp(max=-1e-3)
    adv = (1.5 * torch.randn(rows, 1, generator=gen, dtype=F64)).expand(rows, length).contiguous()
    lengths = torch.randint(1, length + 1, (rows,), generator=gen)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(F64)
    return old, logp.requires_grad_(True), adv, mask


def reference(name, old, logp, adv, mask, **kw):
    """Per-token loss and its gradient from the formulas, in Python floats; token-mean."""
    cells = [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t] != 0]
    n = len(cells)
    lp = {c: logp[c].item() for c in cells}
    lo = {c: old[c].item() for c in cells}
    a = {c: adv[c].item() for c in cells}
    mean_a, mean_lp = sum(a.values()) / n, sum(lp.values()) / n
    cov = {c: (a[c] - mean_a) * (lp[c] - mean_lp) for c in cells}
    loss, grad, flagged = 0.0, torch.zeros_like(logp.detach()), set()
    for c in cells:
        d, r = lp[c] - lo[c], math.exp(lp[c] - lo[c])
        if name == "clip_cov":  # ratio 1: every unclipped token with lb < cov < ub is dropped
            clip = min(max(r, 0.8), 1.2)
            clipped = -a[c] * clip > -a[c] * r
            if not clipped and kw["lb"] < cov[c] < kw["ub"]:
                flagged.add(c)
                value, g = 0.0, 0.0
            else:
                value, g = max(-a[c] * r, -a[c] * clip), (0.0 if clipped else -a[c] * r)
        elif name == "kl_cov":
            k = max(1, int(n * kw["ratio"]))
            top = sorted(cells, key=lambda x: -cov[x])[:k]
            penalty = kw["coef"] * abs(d) if c in top else 0.0
            flagged.update(top)
            value, g = (
                -a[c] * r + penalty,
                -a[c] * r + (kw["coef"] * math.copysign(1, d) if c in top else 0.0),
            )
        elif name == "dro":
            value, g = -(a[c] * lp[c] - 0.5 * kw["beta"] * d * d), -a[c] + kw["beta"] * d
        else:  # dppo: -A sg(min(r, c)) logp where the move towards the advantage stays in the region
            p, q = math.exp(lp[c]), math.exp(lo[c])
            towards = p > q if a[c] > 0 else p < q
            bound = kw["high"] if a[c] > 0 else kw["low"]
            divergence = abs(p - q) if name == "dppo_tv" else binary_kl(q, p)
            kept = not (towards and divergence > bound)
            if not kept:
                flagged.add(c)
            w = min(r, kw["c"])
            value, g = (-a[c] * w * lp[c], -a[c] * w) if kept else (0.0, 0.0)
        loss += value / n
        grad[c] = g / n
    return loss, grad, len(flagged) / n


CASES = [
    ("clip_cov", {"clip_cov_ratio": 1.0}, {"lb": 1.0, "ub": 5.0}),
    ("kl_cov", {"kl_cov_ratio": 0.1, "ppo_kl_coef": 0.1}, {"ratio": 0.1, "coef": 0.1}),
    ("dro", {"dro_beta": 0.3}, {"beta": 0.3}),
    ("dppo_tv", {"clip_ratio_low": 0.15, "clip_ratio_high": 0.1}, {"low": 0.15, "high": 0.1, "c": 3.0}),
    (
        "dppo_kl",
        {"clip_ratio_low": 0.05, "clip_ratio_high": 0.03, "clip_ratio_c": 1.2},
        {"low": 0.05, "high": 0.03, "c": 1.2},
    ),
]


@pytest.mark.parametrize(("name", "keys", "ref_keys"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_parity_with_the_formulas_on_a_random_batch(name, keys, ref_keys, seed):
    old, logp, adv, mask = random_batch(seed)
    loss, metrics = policy_loss(name, old, logp, adv, mask, **keys)
    expected_loss, expected_grad, flagged = reference(name, old, logp, adv, mask, **ref_keys)
    assert loss.item() == pytest.approx(expected_loss, rel=1e-10, abs=1e-12)
    torch.testing.assert_close(grad_of(loss, logp), expected_grad)
    if name != "dro":
        assert metrics["pg_clipfrac"].item() == pytest.approx(flagged)
        assert 0 < flagged < 1, "pick inputs where the rule both acts and spares"


@pytest.mark.parametrize("garbage", [float("-inf"), float("nan")])
@pytest.mark.parametrize("name", ["clip_cov", "kl_cov", "dro", "dppo_tv", "dppo_kl"])
def test_padding_garbage_reaches_neither_loss_nor_gradient(name, garbage):
    old, logp, adv, mask = random_batch(3)
    keys = {"dro_beta": 0.5, "kl_cov_ratio": 0.1}
    torch.manual_seed(0)
    clean_loss, clean_metrics = policy_loss(name, old, logp, adv, mask, **keys)
    clean_grad = grad_of(clean_loss, logp)
    pad = mask == 0
    assert pad.any()
    dirty = [torch.where(pad, torch.full_like(x.detach(), garbage), x) for x in (old, logp, adv)]
    torch.manual_seed(0)
    loss, metrics = policy_loss(name, dirty[0], dirty[1], dirty[2], mask, **keys)
    torch.testing.assert_close(loss, clean_loss)
    torch.testing.assert_close(grad_of(loss, logp), clean_grad)
    for key, value in clean_metrics.items():
        torch.testing.assert_close(metrics[key], value, msg=key)
