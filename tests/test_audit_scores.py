"""agents/audit_scores.py against hand-computed numbers."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from agents import audit_scores as S


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_sign_agreement_counts_only_clearly_signed_samples() -> None:
    # |A| > 2·SE for samples 0, 1, 3 (sample 2: 0.05 < 0.2). Agreements: + vs +, + vs −, − vs + → 1 of 3.
    agreement, signed = S.sign_agreement(t(0.3, 0.2, -9.0, -1.0), t(1.0, -0.5, 0.05, 2.0), t(0.1, 0.1, 0.1, 0.1))
    assert signed == 3
    assert agreement == pytest.approx(1 / 3)


def test_sign_agreement_without_signed_samples_is_none_and_zero_never_agrees() -> None:
    assert S.sign_agreement(t(1.0, 2.0), t(0.0, 0.0), t(0.1, 0.1)) == (None, 0)
    assert S.sign_agreement(t(0.0), t(1.0), t(0.1)) == (0.0, 1)


def test_average_ranks_share_ties() -> None:
    assert S.average_ranks(t(10, 30, 20, 20)).tolist() == [1.0, 4.0, 2.5, 2.5]


def test_rank_correlation_by_hand_and_against_scipy() -> None:
    # Ranks r = (1, 2, 3, 4), q = (1, 4, 2.5, 2.5): Σ(r−r̄)(q−q̄) = 1.5, Σ(r−r̄)² = 5, Σ(q−q̄)² = 4.5 → 1.5/√22.5.
    estimate, truth = t(1, 2, 3, 4), t(10, 30, 20, 20)
    assert S.rank_correlation(estimate, truth) == pytest.approx(1.5 / 22.5**0.5)
    assert S.rank_correlation(estimate, truth) == pytest.approx(stats.spearmanr(estimate, truth).statistic)
    assert S.rank_correlation(t(3, 1, 2), t(30, 10, 20)) == pytest.approx(1.0)
    assert S.rank_correlation(t(1, 1, 1), t(1, 2, 3)) is None


def test_error_moments_by_hand() -> None:
    # e = (1, 2, 3): bias 2, variance (1 + 0 + 1)/3, MSE (1 + 4 + 9)/3 = bias² + variance.
    moments = S.error_moments(t(1, 2, 3), t(0, 0, 0))
    assert moments == pytest.approx({"bias": 2.0, "variance": 2 / 3, "mse": 14 / 3})


def test_scores_gathers_every_score_and_the_truths_noise() -> None:
    result = S.scores(t(1, -1), t(2, -2), t(0.1, 0.3))
    assert result["samples"] == 2 and result["signed"] == 2 and result["sign_agreement"] == 1.0
    assert result["rank_correlation"] == pytest.approx(1.0)
    assert result["bias"] == pytest.approx(0.0) and result["mse"] == pytest.approx(1.0)
    assert result["truth_noise"] == pytest.approx((0.01 + 0.09) / 2)
    with pytest.raises(ValueError):
        S.scores(t(1, 2), t(1), t(1))


def test_noise_share_by_hand() -> None:
    # A = (1, 3, 5, 7): Ā = 4, Var[A] = (9 + 1 + 1 + 9) / 4 = 5.
    # SE = (1, 1, 2, 0): mean SE² = (1 + 1 + 4 + 0) / 4 = 1.5.
    truth, se = torch.tensor([1.0, 3.0, 5.0, 7.0]), torch.tensor([1.0, 1.0, 2.0, 0.0])
    assert S.noise_share(truth, se) == pytest.approx(1.5 / 5)
    assert S.noise_share(torch.full((3,), 2.0), torch.ones(3)) is None  # a truth that does not vary
