"""Tier (a) tests of agents/losses.py against hand-computed numbers and special cases."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from agents.losses import (
    aggregate,
    aggregation_weights,
    clip_fraction,
    clipped_surrogate,
    decoupled_advantages,
    explained_variance,
    k1_kl,
    k2_kl,
    k3_kl,
    value_loss,
)


def t(values: list[float]) -> Tensor:
    return torch.tensor(values, dtype=torch.float32)


# --------------------------------------------------------------------------------------------------
# clipped_surrogate
# --------------------------------------------------------------------------------------------------


def test_clipped_surrogate_hand_values() -> None:
    # ε = 0.2, so clip(ρ) ∈ [0.8, 1.2].   L = −min(ρ·A, clip(ρ)·A)
    #   ρ = 0.5, A =  1: min(0.5,  0.8·1)  = 0.5   → L = −0.5   (unclipped: worse, so counted)
    #   ρ = 1.0, A = −1: min(−1,  1.0·−1)  = −1    → L =  1.0
    #   ρ = 1.5, A =  2: min(3.0, 1.2·2)   = 2.4   → L = −2.4   (clipped: no credit beyond 1.2)
    loss = clipped_surrogate(t([0.5, 1.0, 1.5]), t([1.0, -1.0, 2.0]), 0.2, 0.2)
    torch.testing.assert_close(loss, t([-0.5, 1.0, -2.4]))


def test_clipped_surrogate_ratio_one_is_minus_advantage() -> None:
    # The first minibatch of an iteration has ρ = 1: L = −A whatever ε is.
    advantages = t([3.0, -2.0, 0.0, 0.5])
    torch.testing.assert_close(clipped_surrogate(torch.ones(4), advantages, 0.1, 0.3), -advantages)


def test_clipped_surrogate_asymmetric_clip() -> None:
    # ε_low = 0.2, ε_high = 0.28 (DAPO's clip-higher): clip(ρ) ∈ [0.8, 1.28].
    #   ρ = 0.5,  A = −1: min(−0.5, 0.8·−1) = −0.8 → L = 0.8
    #   ρ = 1.5,  A =  1: min(1.5,  1.28)   = 1.28 → L = −1.28
    #   ρ = 1.25, A =  1: inside the range  = 1.25 → L = −1.25  (a symmetric ε = 0.2 would give −1.2)
    ratio, advantages = t([0.5, 1.5, 1.25]), t([-1.0, 1.0, 1.0])
    torch.testing.assert_close(clipped_surrogate(ratio, advantages, 0.2, 0.28), t([0.8, -1.28, -1.25]))
    torch.testing.assert_close(clipped_surrogate(ratio, advantages, 0.2, 0.2), t([0.8, -1.2, -1.2]))


def test_clipped_surrogate_gradient_is_zero_only_where_clipping_is_pessimistic() -> None:
    # ε = 0.2. dL/dρ = −A where the unclipped term is the minimum, 0 where the clipped term is.
    #   ρ = 1.5, A =  2: improved beyond 1.2      → clipped,  L = −2.4, dL/dρ = 0
    #   ρ = 0.5, A = −1: improved below 0.8       → clipped,  L =  0.8, dL/dρ = 0
    #   ρ = 1.5, A = −1: moved the wrong way      → unclipped, L = 1.5, dL/dρ = 1   (pulls ρ back down)
    #   ρ = 0.5, A =  1: moved the wrong way      → unclipped, L = −0.5, dL/dρ = −1 (pulls ρ back up)
    #   ρ = 1.1, A =  1: inside the trust region  → unclipped, L = −1.1, dL/dρ = −1
    ratio = t([1.5, 0.5, 1.5, 0.5, 1.1]).requires_grad_(True)
    loss = clipped_surrogate(ratio, t([2.0, -1.0, -1.0, 1.0, 1.0]), 0.2, 0.2)
    torch.testing.assert_close(loss.detach(), t([-2.4, 0.8, 1.5, -0.5, -1.1]))
    (grad,) = torch.autograd.grad(loss.sum(), ratio)
    torch.testing.assert_close(grad, t([0.0, 0.0, 1.0, -1.0, -1.0]))


def test_clipped_surrogate_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="differ"):
        clipped_surrogate(torch.ones(3), torch.ones(4), 0.2, 0.2)


def test_decoupled_advantages_hand_values() -> None:
    # w = π_prox / π_behav: 0.5 / 0.25 = 2, 0.2 / 0.4 = 0.5, 0.3 / 0.3 = 1; Ã = w · A.
    advantages = t([2.0, -1.0, 0.5])
    proximal, behaviour = t([0.5, 0.2, 0.3]).log(), t([0.25, 0.4, 0.3]).log()
    torch.testing.assert_close(decoupled_advantages(advantages, proximal, behaviour), t([4.0, -0.5, 0.5]))
    # The decoupled loss −w · min(ρA, clip(ρ)A), ρ = π_θ / π_prox, ε = 0.2, with ρ = (1.5, 0.5, 1.0):
    #   2 · −min(3.0, 2.4) = −4.8;   0.5 · −min(−0.5, −0.8) = 0.4;   1 · −min(0.5, 0.5) = −0.5.
    ratio = t([1.5, 0.5, 1.0])
    decoupled = clipped_surrogate(ratio, decoupled_advantages(advantages, proximal, behaviour), 0.2, 0.2)
    torch.testing.assert_close(decoupled, t([-4.8, 0.4, -0.5]))
    # π_prox = π_behav: w = 1, the advantages as they were.
    assert torch.equal(decoupled_advantages(advantages, behaviour, behaviour), advantages)
    with pytest.raises(ValueError, match="share one shape"):
        decoupled_advantages(advantages, proximal, torch.zeros(2))


# --------------------------------------------------------------------------------------------------
# value_loss
# --------------------------------------------------------------------------------------------------

VALUES = [1.0, 2.0, 0.0]
OLD_VALUES = [0.0, 1.5, 0.5]
RETURNS = [2.0, 0.0, 1.0]


def test_value_loss_unclipped_hand_values() -> None:
    # (V − R)²: (1 − 2)² = 1, (2 − 0)² = 4, (0 − 1)² = 1
    loss = value_loss(t(VALUES), t(OLD_VALUES), t(RETURNS), None)
    torch.testing.assert_close(loss, t([1.0, 4.0, 1.0]))


def test_value_loss_clipped_hand_values() -> None:
    # ε_v = 0.2, V_clip = V_old + clip(V − V_old, −0.2, 0.2):
    #   0.0 + clip( 1.0) = 0.2 → (0.2 − 2)² = 3.24
    #   1.5 + clip( 0.5) = 1.7 → (1.7 − 0)² = 2.89   (smaller than the unclipped 4: SB3 replaces, no max)
    #   0.5 + clip(−0.5) = 0.3 → (0.3 − 1)² = 0.49
    loss = value_loss(t(VALUES), t(OLD_VALUES), t(RETURNS), 0.2)
    torch.testing.assert_close(loss, t([3.24, 2.89, 0.49]))


def test_value_loss_max_form_hand_values() -> None:
    # CleanRL's clip_vloss: max(unclipped, clipped) of the numbers above:
    #   max(1, 3.24) = 3.24;  max(4, 2.89) = 4 (SB3's form took 2.89);  max(1, 0.49) = 1
    loss = value_loss(t(VALUES), t(OLD_VALUES), t(RETURNS), 0.2, take_max=True)
    torch.testing.assert_close(loss, t([3.24, 4.0, 1.0]))
    # Where the unclipped error wins, the gradient flows: 2·(V − R) = 4 on the second sample only.
    values = t(VALUES).requires_grad_(True)
    (grad,) = torch.autograd.grad(value_loss(values, t(OLD_VALUES), t(RETURNS), 0.2, take_max=True).sum(), values)
    torch.testing.assert_close(grad, t([0.0, 4.0, -2.0]))
    assert value_loss(t(VALUES), t(OLD_VALUES), t(RETURNS), None, take_max=True).tolist() == [1.0, 4.0, 1.0]


def test_value_loss_clip_inactive_within_range() -> None:
    # |V − V_old| = 0.1 < ε_v = 0.5: clipping changes nothing. (1.1 − 2)² = 0.81, (−0.1 − 0)² = 0.01
    values, old_values, returns = t([1.1, -0.1]), t([1.0, 0.0]), t([2.0, 0.0])
    torch.testing.assert_close(value_loss(values, old_values, returns, 0.5), t([0.81, 0.01]))
    torch.testing.assert_close(value_loss(values, old_values, returns, None), t([0.81, 0.01]))


def test_value_loss_clipped_gradient_is_zero_outside_range() -> None:
    values = t(VALUES).requires_grad_(True)
    (grad,) = torch.autograd.grad(value_loss(values, t(OLD_VALUES), t(RETURNS), 0.2).sum(), values)
    assert grad.tolist() == [0.0, 0.0, 0.0]  # every sample moved more than 0.2 from V_old
    (grad,) = torch.autograd.grad(value_loss(values, t(OLD_VALUES), t(RETURNS), None).sum(), values)
    torch.testing.assert_close(grad, t([-2.0, 4.0, -2.0]))  # 2·(V − R)


def test_value_loss_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="share one shape"):
        value_loss(torch.zeros(3), torch.zeros(3), torch.zeros(2), None)


# --------------------------------------------------------------------------------------------------
# k3_kl
# --------------------------------------------------------------------------------------------------


def test_k3_kl_zero_at_equal_policies() -> None:
    assert k3_kl(torch.zeros(5)).tolist() == [0.0] * 5


def test_k3_kl_hand_values() -> None:
    # log r = ln 2:  (2 − 1) − ln 2   = 0.306853
    # log r = −ln 2: (0.5 − 1) + ln 2 = 0.193147
    ln2 = math.log(2.0)
    kl = k3_kl(torch.tensor([ln2, -ln2], dtype=torch.float64))
    torch.testing.assert_close(kl, torch.tensor([1.0 - ln2, -0.5 + ln2], dtype=torch.float64))


def test_k3_kl_clamps_the_log_ratio_at_20_so_a_collapsed_policy_stays_finite() -> None:
    # log r = 100 overflows float32's exp (e^88.7 is its largest): clamped to 20, k3 = e^20 − 1 − 20.
    log_ratio = torch.tensor([100.0, 20.0, -100.0, 1.0], requires_grad=True)
    kl = k3_kl(log_ratio)
    e20 = math.exp(20.0)
    torch.testing.assert_close(
        kl.detach(), torch.tensor([e20 - 21.0, e20 - 21.0, math.exp(-20.0) + 19.0, math.e - 2.0])
    )
    kl.sum().backward()
    assert log_ratio.grad is not None and torch.isfinite(log_ratio.grad).all()
    assert log_ratio.grad[0] == 0.0 and log_ratio.grad[2] == 0.0  # past the clamp: no gradient
    assert log_ratio.grad[3] == pytest.approx(math.e - 1.0)  # d/dx (eˣ − 1 − x)


def test_k3_kl_is_non_negative() -> None:
    log_ratio = torch.linspace(-10.0, 5.0, 1001)
    assert (k3_kl(log_ratio) >= 0).all()


def test_k3_kl_mean_estimates_true_kl() -> None:
    # x ~ p = N(0, 1), q = N(0.5, 1): KL(p ‖ q) = 0.5² / 2 = 0.125.
    x = torch.randn(200_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    log_ratio = -0.5 * (x - 0.5) ** 2 + 0.5 * x**2  # log q(x) − log p(x)
    assert k3_kl(log_ratio).mean().item() == pytest.approx(0.125, abs=0.005)


def test_k1_k2_hand_values() -> None:
    # log r = ln 2:  k1 = −ln 2 = −0.693147 (negative where q > p), k2 = ½ ln²2 = 0.240227
    # log r = −ln 2: k1 = ln 2,                                   k2 = 0.240227
    ln2 = math.log(2.0)
    log_ratio = torch.tensor([ln2, -ln2], dtype=torch.float64)
    torch.testing.assert_close(k1_kl(log_ratio), torch.tensor([-ln2, ln2], dtype=torch.float64))
    torch.testing.assert_close(k2_kl(log_ratio), torch.tensor([0.5 * ln2**2] * 2, dtype=torch.float64))


def test_k1_unbiased_k2_biased_on_a_known_pair() -> None:
    # x ~ p = N(0, 1), q = N(1, 1): KL(p ‖ q) = 0.5. log r = x − ½, so E[k1] = ½ exactly, and
    # E[k2] = ½ E[(x − ½)²] = ½ (1 + ¼) = 0.625: k2 overestimates by 0.125 at this distance.
    x = torch.randn(400_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    log_ratio = x - 0.5
    assert k1_kl(log_ratio).mean().item() == pytest.approx(0.5, abs=0.005)
    assert k2_kl(log_ratio).mean().item() == pytest.approx(0.625, abs=0.005)
    assert k3_kl(log_ratio).mean().item() == pytest.approx(0.5, abs=0.01)


# --------------------------------------------------------------------------------------------------
# clip_fraction
# --------------------------------------------------------------------------------------------------


def test_as_loss_terms_k1_has_no_pull_k2_is_the_kl_gradient_and_k3_the_reverse_kl_gradient() -> None:
    # A 3-action softmax π_θ at θ = θ_old, π_ref fixed. The expectation over x ~ π_old is a sum weighted by
    # π_old (exact, no sampling). GRPO's penalty takes r = π_ref/π_θ, so log_ratio = log π_ref − log π_θ.
    theta = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64, requires_grad=True)
    log_ref = torch.log_softmax(torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64), 0)
    log_pi = torch.log_softmax(theta, 0)
    pi_old = log_pi.exp().detach()

    def grad(f: Tensor) -> Tensor:
        return torch.autograd.grad(f, theta, retain_graph=True)[0]

    k1, k2, k3 = (grad((pi_old * k(log_ref - log_pi)).sum()) for k in (k1_kl, k2_kl, k3_kl))
    forward_kl = grad((log_pi.exp() * (log_pi - log_ref)).sum())  # ∇ KL(π_θ ‖ π_ref)
    reverse_kl = grad((log_ref.exp() * (log_ref - log_pi)).sum())  # ∇ KL(π_ref ‖ π_θ)
    # E_old[∇ log π_θ] = 0: no pull toward π_ref
    assert torch.allclose(k1, torch.zeros(3, dtype=torch.float64), atol=1e-15)
    assert torch.allclose(k2, forward_kl, atol=1e-15)
    assert torch.allclose(k3, reverse_kl, atol=1e-15)
    assert not torch.allclose(forward_kl, reverse_kl, atol=1e-3)  # the two directions differ here


def test_clip_fraction_counts_below_and_above() -> None:
    ratio = t([0.5, 0.7, 0.9, 1.0, 1.1, 1.3, 2.0, 3.0])
    # ε = 0.2: below 0.8 → {0.5, 0.7} = 2/8; above 1.2 → {1.3, 2.0, 3.0} = 3/8
    below, above = clip_fraction(ratio, 0.2, 0.2)
    assert (below.item(), above.item()) == (0.25, 0.375)
    # ε_low = 0.4, ε_high = 0.5: below 0.6 → {0.5} = 1/8; above 1.5 → {2.0, 3.0} = 2/8
    below, above = clip_fraction(ratio, 0.4, 0.5)
    assert (below.item(), above.item()) == (0.125, 0.25)


def test_clip_fraction_zero_at_ratio_one() -> None:
    below, above = clip_fraction(torch.ones(10), 0.2, 0.2)
    assert (below.item(), above.item()) == (0.0, 0.0)


# --------------------------------------------------------------------------------------------------
# explained_variance
# --------------------------------------------------------------------------------------------------


def test_explained_variance_perfect_predictor_is_one() -> None:
    targets = t([1.0, -2.0, 3.0, 0.5])
    assert explained_variance(targets.clone(), targets) == 1.0


def test_explained_variance_constant_mean_predictor_is_zero() -> None:
    targets = t([1.0, -2.0, 3.0, 0.5])
    assert explained_variance(torch.full((4,), targets.mean().item()), targets) == pytest.approx(0.0, abs=1e-6)


def test_explained_variance_hand_value() -> None:
    # y = [1, 2, 3, 4], ŷ = [1, 2, 3, 3]: residual [0, 0, 0, 1], Var = 0.75 / 3 = 0.25;
    # Var[y] = 5 / 3.  EV = 1 − 0.25 / (5/3) = 0.85
    assert explained_variance(t([1.0, 2.0, 3.0, 3.0]), t([1.0, 2.0, 3.0, 4.0])) == pytest.approx(0.85, abs=1e-6)


def test_explained_variance_negative_for_a_bad_predictor() -> None:
    # ŷ = −y: residual 2y, Var = 4·Var[y], EV = 1 − 4 = −3
    targets = t([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(-targets, targets) == pytest.approx(-3.0, abs=1e-6)


def test_explained_variance_zero_variance_targets_is_nan() -> None:
    result = explained_variance(t([0.0, 1.0, 2.0]), torch.full((3,), 5.0))
    assert isinstance(result, float) and math.isnan(result)


# --------------------------------------------------------------------------------------------------
# aggregate: the weight each mode gives a step of a long and a short trajectory
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode,long_weight,short_weight",
    [
        ("trajectory", 1 / (2 * 4), 1 / (2 * 1)),  # 1 / (M · L_i): a short trajectory's step weighs 4× more
        ("step", 1 / 5, 1 / 5),  # 1 / Σ L: every step the same
        ("constant", 1 / (2 * 10), 1 / (2 * 10)),  # 1 / (M · H), H = 10
    ],
)
def test_aggregation_weights(mode: str, long_weight: float, short_weight: float) -> None:
    # Trajectory 0 has 4 steps, trajectory 1 has 1 step; T = 4, M = 2.
    mask = torch.tensor([[True, True], [True, False], [True, False], [True, False]])
    per_step = torch.zeros(4, 2, requires_grad=True)
    aggregate(per_step, mask, mode, horizon=10).backward()
    expected = torch.tensor([[long_weight, short_weight], [long_weight, 0], [long_weight, 0], [long_weight, 0]])
    torch.testing.assert_close(per_step.grad, expected)
    # The same weights, written out: and beside them a padding column that must not count.
    torch.testing.assert_close(aggregation_weights(mask, mode, horizon=10), expected)
    padded = torch.cat([mask, torch.zeros(4, 1, dtype=torch.bool)], dim=1)  # (T, M + 1)
    real = torch.tensor([True, True, False])
    weights = aggregation_weights(padded, mode, horizon=10, trajectories=real)
    torch.testing.assert_close(weights, torch.cat([expected, torch.zeros(4, 1)], dim=1))


@pytest.mark.parametrize("mode", ["trajectory", "step", "constant"])
def test_aggregation_weights_of_a_stack_match_aggregate(mode: str) -> None:
    generator = torch.Generator().manual_seed(0)
    per_step = torch.randn(3, 6, 5, generator=generator)  # (S, T, M)
    mask = torch.rand(3, 6, 5, generator=generator) < 0.6  # (S, T, M), some columns may be empty
    weights = aggregation_weights(mask, mode, horizon=6)
    for k in range(3):
        torch.testing.assert_close((weights[k] * per_step[k]).sum(), aggregate(per_step[k], mask[k], mode, horizon=6))
