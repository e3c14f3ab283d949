"""agents/gradient_audit.py against hand-computed numbers; agents/true_gradient.py against the chain's closed form."""

from __future__ import annotations

import math

import pytest
import torch

from agents import gradient_audit as GA
from agents.losses import clipped_surrogate


def test_cosine_and_relative_error_by_hand() -> None:
    assert GA.cosine_similarity(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0])) == pytest.approx(1 / math.sqrt(2))
    assert GA.cosine_similarity(torch.tensor([-2.0, 0.0]), torch.tensor([3.0, 0.0])) == pytest.approx(-1.0)
    assert GA.cosine_similarity(torch.zeros(2), torch.tensor([1.0, 1.0])) is None
    # ‖(1, 0) − (0, 2)‖ / ‖(0, 2)‖ = √5 / 2; the zero estimate is off by exactly 1.
    assert GA.relative_error(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])) == pytest.approx(math.sqrt(5) / 2)
    assert GA.relative_error(torch.zeros(2), torch.tensor([0.0, 2.0])) == pytest.approx(1.0)
    assert GA.relative_error(torch.ones(2), torch.zeros(2)) is None
    with pytest.raises(ValueError, match="one \\(P,\\)"):
        GA.cosine_similarity(torch.ones(2), torch.ones(3))


def test_the_mean_and_its_standard_error_plain_and_clustered() -> None:
    terms = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [6.0, 0.0]])  # (N, P) = (4, 2)
    mean, se = GA.mean_and_standard_error(terms)
    # Independent samples: s² = (4 + 1 + 0 + 9) / 3 = 14/3, SE = √(s²/4) = √(7/6).
    assert mean.tolist() == [3.0, 0.0]
    assert se.tolist() == pytest.approx([math.sqrt(7 / 6), 0.0])
    # Clusters {1, 2}, {3, 6}: S = (3, 9), N_c = 2, residuals S − N_c·3 = (−3, 3); SE² = 2/1 · 18 / 16 = 9/4.
    mean, se = GA.mean_and_standard_error(terms, torch.tensor([0, 0, 5, 5]))
    assert mean.tolist() == [3.0, 0.0]
    assert se.tolist() == pytest.approx([1.5, 0.0])
    # One sample per cluster is the plain standard error.
    _, same = GA.mean_and_standard_error(terms, torch.tensor([3, 1, 2, 0]))
    assert same.tolist() == pytest.approx([math.sqrt(7 / 6), 0.0])
    with pytest.raises(ValueError, match="at least 2 clusters"):
        GA.mean_and_standard_error(terms, torch.zeros(4, dtype=torch.long))


def bernoulli_log_probs(theta: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """log π_θ(a) for π_θ(1) = σ(θ): log σ(θ) for a = 1, log(1 − σ(θ)) for a = 0."""
    return torch.where(actions == 1, torch.nn.functional.logsigmoid(theta), torch.nn.functional.logsigmoid(-theta))


def test_the_policy_gradient_of_a_batch_by_hand_equals_the_clipped_objectives_at_theta_old() -> None:
    # π_θ(1) = σ(θ) at θ = 0: ∇ log π(1) = 1 − σ = ½, ∇ log π(0) = −σ = −½.
    # Batch a = (1, 0, 1), Â = (2, −1, 4), the third masked out: g = (2·½ + (−1)(−½)) / 2 = 0.75.
    theta = torch.zeros((), requires_grad=True)
    actions, advantages = torch.tensor([1, 0, 1]), torch.tensor([2.0, -1.0, 4.0])
    mask = torch.tensor([True, True, False])
    log_pi = bernoulli_log_probs(theta, actions)
    g = GA.flat_gradient(GA.surrogate(log_pi, advantages, mask), [theta], retain_graph=True)
    assert g.tolist() == pytest.approx([0.75])
    # At θ = θ_old the ratio is 1, inside the clip range: PPO's clipped objective has the same gradient.
    ratio = torch.exp(log_pi - log_pi.detach())
    clipped = -torch.where(mask, clipped_surrogate(ratio, advantages, 0.2, 0.2), 0.0).sum() / mask.sum()
    assert GA.flat_gradient(clipped, [theta]).tolist() == pytest.approx([0.75])
    # Away from θ_old the two part: at θ = 2 with θ_old = 0, ρ(a=1) = σ(2)/σ(0) ≈ 1.76 is clipped for Â > 0.
    theta2 = torch.tensor(2.0, requires_grad=True)
    ratio = torch.exp(bernoulli_log_probs(theta2, actions) - log_pi.detach())
    clipped = -torch.where(mask, clipped_surrogate(ratio, advantages, 0.2, 0.2), 0.0).sum() / mask.sum()
    plain = GA.surrogate(bernoulli_log_probs(theta2, actions), advantages, mask)
    assert GA.flat_gradient(clipped, [theta2]) != pytest.approx(GA.flat_gradient(plain, [theta2]))
    with pytest.raises(ValueError, match="one shape"):
        GA.surrogate(log_pi, advantages[:2])


def test_a_parameter_the_objective_does_not_reach_gets_zeros() -> None:
    a, b = torch.ones(2, requires_grad=True), torch.ones(3, requires_grad=True)
    assert GA.flat_gradient((2 * a).sum(), [a, b]).tolist() == [2.0, 2.0, 0.0, 0.0, 0.0]


def test_the_variance_split_by_hand() -> None:
    # S = 2 states × M = 2 actions × R = 2 trajectories, P = 1:
    #   s0: a0 → (1, 3), a1 → (5, 7);   s1: a0 → (0, 0), a1 → (2, 2)
    # ḡ_{s,a} = (2, 6), (0, 2); s²_τ = 2, 2, 0, 0 → W = 1.
    # s²_a(ḡ_{s,a}) = 8, 2 → mean 5; action = 5 − W/2 = 4.5.
    # ḡ_s = 4, 1 → s²_s = 4.5; state = 4.5 − 5/2 = 2.
    g = torch.tensor([[[1.0, 3.0], [5.0, 7.0]], [[0.0, 0.0], [2.0, 2.0]]]).unsqueeze(-1)  # (2, 2, 2, 1)
    split = GA.variance_split(g)
    assert split == pytest.approx({"state": 2.0, "action": 4.5, "trajectory": 1.0, "total": 7.5})
    with pytest.raises(ValueError, match="S, M, R >= 2"):
        GA.variance_split(g[:, :1])


def test_the_variance_split_recovers_known_parts() -> None:
    # g = μ_s + α_{s,a} + ε_{s,a,τ} with standard deviations 1, 2 and ½ in each of P = 3 coordinates:
    # the parts are 3·1, 3·4 and 3·¼.
    generator = torch.Generator().manual_seed(0)
    S, M, R, P = 2000, 4, 4, 3
    mu = torch.randn(S, 1, 1, P, generator=generator)
    alpha = 2 * torch.randn(S, M, 1, P, generator=generator)
    epsilon = 0.5 * torch.randn(S, M, R, P, generator=generator)
    split = GA.variance_split(mu + alpha + epsilon)
    assert split["state"] == pytest.approx(3.0, rel=0.15)
    assert split["action"] == pytest.approx(12.0, rel=0.05)
    assert split["trajectory"] == pytest.approx(0.75, rel=0.05)


def test_the_chains_expected_return_by_hand() -> None:
    # π(x|s_0(x)) = 0.7 for cue 0 and 0.6 for cue 1, γ = 0.9, H = 3: J = 0.81 · ½ · (0.4 + 0.2) = 0.243.
    assert float(GA.chain_return(torch.tensor([0.7, 0.6]), 0.9, 3)) == pytest.approx(0.243)
