"""Tier (a) tests of agents/distributions.py: every function against torch.distributions and hand values."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor
from torch.distributions import Categorical, Normal

from agents import distributions as D


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_logits(B: int = 6, K: int = 5, seed: int = 0) -> Tensor:
    return 3.0 * torch.randn(B, K, generator=generator(seed))  # (B, K)


# --------------------------------------------------------------------------------------------------
# Categorical
# --------------------------------------------------------------------------------------------------


def test_categorical_log_prob_matches_torch() -> None:
    logits = random_logits()
    actions = torch.randint(0, 5, (6,), generator=generator(1))  # (B,)
    ours = D.categorical_log_prob(logits, actions)
    assert ours.shape == (6,)
    torch.testing.assert_close(ours, Categorical(logits=logits).log_prob(actions))


def test_categorical_log_prob_accepts_float_actions() -> None:
    # Rollout buffers may store discrete actions as floats; they are cast to indices.
    logits = random_logits()
    actions = torch.tensor([0, 1, 2, 3, 4, 0])
    torch.testing.assert_close(
        D.categorical_log_prob(logits, actions.float()), Categorical(logits=logits).log_prob(actions)
    )


def test_categorical_log_prob_hand_value() -> None:
    # Uniform logits over K = 4 actions: log π = −ln 4 = −1.386294 for every action.
    log_probs = D.categorical_log_prob(torch.zeros(2, 4), torch.tensor([0, 3]))
    torch.testing.assert_close(log_probs, torch.full((2,), -math.log(4.0)))


def test_categorical_entropy_matches_torch() -> None:
    logits = random_logits()
    ours = D.categorical_entropy(logits)
    assert ours.shape == (6,)
    torch.testing.assert_close(ours, Categorical(logits=logits).entropy())


def test_categorical_entropy_hand_values() -> None:
    # Uniform over 4: H = ln 4 = 1.386294.  Near-deterministic (one logit far above): H ≈ 0, not NaN.
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]])
    entropy = D.categorical_entropy(logits)
    assert entropy[0].item() == pytest.approx(math.log(4.0), abs=1e-6)
    assert entropy[1].item() == pytest.approx(0.0, abs=1e-6)
    assert not entropy.isnan().any()


def test_categorical_sample_frequencies_match_probabilities() -> None:
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = probs.log().expand(20_000, 4)  # (B, K)
    torch.manual_seed(0)
    actions = D.categorical_sample(logits)
    assert actions.shape == (20_000,) and actions.dtype == torch.int64
    frequencies = torch.bincount(actions, minlength=4).float() / 20_000
    # Standard error ≤ √(0.25 · 0.75 / 20000) ≈ 0.003; allow 5 of them.
    torch.testing.assert_close(frequencies, probs, atol=0.015, rtol=0.0)


def test_categorical_sample_same_seed_same_actions() -> None:
    logits = random_logits(B=100)
    torch.manual_seed(7)
    first = D.categorical_sample(logits)
    torch.manual_seed(7)
    assert torch.equal(D.categorical_sample(logits), first)


# --------------------------------------------------------------------------------------------------
# Diagonal Gaussian
# --------------------------------------------------------------------------------------------------


def gaussian_inputs(B: int = 6, dim: int = 3) -> tuple[Tensor, Tensor, Tensor]:
    mean = torch.randn(B, dim, generator=generator(2))  # (B, D)
    log_std = 0.5 * torch.randn(dim, generator=generator(3))  # (D,)
    actions = torch.randn(B, dim, generator=generator(4)) * 2.0  # (B, D)
    return mean, log_std, actions


def test_gaussian_log_prob_matches_torch() -> None:
    mean, log_std, actions = gaussian_inputs()
    ours = D.gaussian_log_prob(mean, log_std, actions)
    assert ours.shape == (6,)
    torch.testing.assert_close(ours, Normal(mean, log_std.exp()).log_prob(actions).sum(-1))


def test_gaussian_log_prob_matches_torch_with_per_row_log_std() -> None:
    mean, _, actions = gaussian_inputs()
    log_std = 0.5 * torch.randn(6, 3, generator=generator(5))  # (B, D)
    torch.testing.assert_close(
        D.gaussian_log_prob(mean, log_std, actions), Normal(mean, log_std.exp()).log_prob(actions).sum(-1)
    )


def test_gaussian_log_prob_hand_value() -> None:
    # Standard normal at its mean, D = 2: 2 · (−½ ln 2π) = −ln 2π = −1.837877
    log_prob = D.gaussian_log_prob(torch.zeros(1, 2), torch.zeros(2), torch.zeros(1, 2))
    assert log_prob.item() == pytest.approx(-math.log(2.0 * math.pi), abs=1e-6)


def test_gaussian_entropy_matches_torch() -> None:
    mean, log_std, _ = gaussian_inputs()
    ours = D.gaussian_entropy(log_std, batch=6)
    assert ours.shape == (6,)
    torch.testing.assert_close(ours, Normal(mean, log_std.exp()).entropy().sum(-1))


def test_gaussian_entropy_hand_value() -> None:
    # D = 1, σ = 1: H = ½ ln(2πe) = 1.418939.  σ = e (log σ = 1) adds 1: 2.418939.
    assert D.gaussian_entropy(torch.zeros(1), batch=1).item() == pytest.approx(0.5 * math.log(2 * math.pi * math.e))
    assert D.gaussian_entropy(torch.ones(1), batch=3).tolist() == pytest.approx([2.4189385] * 3, abs=1e-6)


def test_gaussian_sample_mean_and_std() -> None:
    mean = torch.tensor([1.0, -2.0]).expand(20_000, 2)  # (B, D)
    log_std = torch.tensor([0.5, 2.0]).log()  # (D,)
    torch.manual_seed(0)
    actions = D.gaussian_sample(mean, log_std)
    assert actions.shape == (20_000, 2)
    # Standard errors: of the mean σ/√n ≤ 2/141 = 0.014, of the std σ/√(2n) ≤ 0.01; allow ~4 of them.
    torch.testing.assert_close(actions.mean(0), torch.tensor([1.0, -2.0]), atol=0.05, rtol=0.0)
    torch.testing.assert_close(actions.std(0), torch.tensor([0.5, 2.0]), atol=0.0, rtol=0.03)


def test_gaussian_sample_same_seed_same_actions() -> None:
    mean, log_std, _ = gaussian_inputs()
    torch.manual_seed(3)
    first = D.gaussian_sample(mean, log_std)
    torch.manual_seed(3)
    assert torch.equal(D.gaussian_sample(mean, log_std), first)


def test_categorical_from_uniform_inverts_the_cdf_by_hand() -> None:
    # π = (0.2, 0.3, 0.5): CDF 0.2, 0.5, 1.0. u = 0.1 → 0; 0.2 → 1 (the CDF must exceed u); 0.49 → 1; 0.9 → 2.
    logits = torch.log(torch.tensor([0.2, 0.3, 0.5])).expand(4, 3)
    actions = D.categorical_from_uniform(logits, torch.tensor([0.1, 0.2, 0.49, 0.9]))
    assert actions.tolist() == [0, 1, 1, 2]


def test_categorical_from_uniform_has_the_policys_frequencies() -> None:
    logits = torch.log(torch.tensor([0.2, 0.3, 0.5])).expand(20_000, 3)
    actions = D.categorical_from_uniform(logits, torch.rand(20_000, generator=generator(0)))
    frequencies = torch.bincount(actions, minlength=3) / 20_000.0
    torch.testing.assert_close(frequencies, torch.tensor([0.2, 0.3, 0.5]), atol=0.015, rtol=0)


def test_gaussian_from_normal_by_hand() -> None:
    # μ = (1, −1), σ = (2, 0.5), ξ = (0.5, −2): a = (1 + 1, −1 − 1) = (2, −2).
    a = D.gaussian_from_normal(
        torch.tensor([[1.0, -1.0]]), torch.log(torch.tensor([2.0, 0.5])), torch.tensor([[0.5, -2.0]])
    )
    torch.testing.assert_close(a, torch.tensor([[2.0, -2.0]]))
