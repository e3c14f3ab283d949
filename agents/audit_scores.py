"""How well an advantage estimate Â agrees with the true advantage A on the same samples. Imports only torch.

The audit (``agents/true_advantage.py``) measures A^π(s_n, a_n) = Q^π(s_n, a_n) − V^π(s_n) at N sampled steps by
Monte-Carlo rollouts from the restored state, with a standard error SE_n; every estimator the testbed has
is computed on the same steps. The scores below compare the two vectors (N,). Sign agreement and rank
correlation do not depend on the estimate's scale, so they also judge estimators that normalize (GRPO's
outcome, process, step_alive); bias, variance and MSE are in the estimate's own units.
"""

from __future__ import annotations

import torch
from torch import Tensor

NOISE_TARGET = 0.25
"""A truth whose noise share exceeds this measures little: the report warns, and ``--max-branches`` adds
rollouts until it does not."""


def noise_share(truth: Tensor, truth_se: Tensor) -> float | None:
    """How much of the truth's spread over the samples is its own Monte-Carlo noise:

        η = ((1/N) Σ_n SE_n²) / Var[A],      Var[A] = (1/N) Σ_n (A_n − Ā)²

    Symbols: A_n the truth at sample n (``truth``, (N,)), SE_n its standard error (``truth_se``, (N,)).
    Near 0 the truth resolves what it measures; near 1 its noise is as large as the differences between
    samples. SE² falls as 1/K, so η does too. None when A does not vary.
    """
    spread = float(truth.to(torch.float64).var(unbiased=False))
    return float(truth_se.to(torch.float64).pow(2).mean()) / spread if spread > 0 else None


def sign_agreement(estimate: Tensor, truth: Tensor, truth_se: Tensor, z: float = 2.0) -> tuple[float | None, int]:
    """The fraction of clearly signed samples whose estimate has the truth's sign:

        S = |{n ∈ 𝒩 : sign(Â_n) = sign(A_n)}| / |𝒩|,      𝒩 = {n : |A_n| > z · SE_n}

    Symbols:
        Â_n    the estimator's advantage at sample n                     ``estimate``  (N,)
        A_n    the Monte-Carlo truth there                               ``truth``     (N,)
        SE_n   the truth's standard error                                ``truth_se``  (N,)
        z      how many standard errors make a sign clear                ``z``

    A sample whose truth is within z·SE of 0 has no sign to agree with (an action that changes nothing,
    say); it is left out, and an estimate of exactly 0 never agrees. Returns (S, |𝒩|); S is None when 𝒩 is
    empty.
    """
    signed = truth.abs() > z * truth_se  # (N,)
    count = int(signed.sum())
    if count == 0:
        return None, 0
    agree = torch.sign(estimate[signed]) == torch.sign(truth[signed])
    return float(agree.float().mean()), count


def average_ranks(x: Tensor) -> Tensor:
    """Ranks 1 … N of the values, ties given the mean of the ranks they span.  (N,) → (N,) float64.

    E.g. x = (10, 30, 20, 20): ranks (1, 4, 2.5, 2.5).
    """
    _, inverse, counts = torch.unique(x, sorted=True, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).to(torch.float64)  # (U,) the last rank each distinct value spans
    mean_rank = ends - (counts.to(torch.float64) - 1) / 2
    return mean_rank[inverse]


def rank_correlation(estimate: Tensor, truth: Tensor) -> float | None:
    """Spearman's ρ: the Pearson correlation of the ranks,

        ρ = Σ_n (r_n − r̄)(q_n − q̄) / √(Σ_n (r_n − r̄)² · Σ_n (q_n − q̄)²)

    with r_n the rank of Â_n among the estimates and q_n that of A_n among the truths (ties averaged).
    1: the estimator orders the steps as the truth does; 0: no better than chance. None when either
    side is constant (no order to compare).
    """
    r, q = average_ranks(estimate), average_ranks(truth)
    r, q = r - r.mean(), q - q.mean()
    denominator = (r.pow(2).sum() * q.pow(2).sum()).sqrt()
    if float(denominator) == 0.0:
        return None
    return float((r * q).sum() / denominator)


def error_moments(estimate: Tensor, truth: Tensor) -> dict[str, float]:
    """Bias, variance and mean squared error of the estimate against the truth:

        e_n = Â_n − A_n
        bias = (1/N) Σ_n e_n,   variance = (1/N) Σ_n (e_n − bias)²,   MSE = (1/N) Σ_n e_n² = bias² + variance

    The truth's own noise adds (1/N) Σ_n SE_n² to the MSE and the variance in expectation; the audit
    reports it beside them.
    """
    e = (estimate - truth).to(torch.float64)  # (N,)
    bias = e.mean()
    return {"bias": float(bias), "variance": float((e - bias).pow(2).mean()), "mse": float(e.pow(2).mean())}


def scores(estimate: Tensor, truth: Tensor, truth_se: Tensor) -> dict[str, float | int | None]:
    """Every score of one estimator on N samples: sign agreement (and how many samples had a clear sign),
    Spearman's ρ, bias, variance, MSE, and the truth's noise (1/N) Σ_n SE_n²."""
    if not estimate.shape == truth.shape == truth_se.shape or estimate.dim() != 1 or len(estimate) == 0:
        raise ValueError("scores: estimate, truth and truth_se must be one non-empty (N,) shape each")
    agreement, signed = sign_agreement(estimate, truth, truth_se)
    return {
        "samples": len(estimate),
        "signed": signed,
        "sign_agreement": agreement,
        "rank_correlation": rank_correlation(estimate, truth),
        **error_moments(estimate, truth),
        "truth_noise": float(truth_se.to(torch.float64).pow(2).mean()),
    }
