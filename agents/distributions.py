"""Log-probabilities, entropies and samples of the two policy distributions. Imports only torch.

Written out instead of using ``torch.distributions`` because the update calls them thousands of times
per run and the library's argument validation and broadcasting cost more than the arithmetic. Tests
check every function against ``torch.distributions``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def categorical_log_prob(logits: Tensor, actions: Tensor) -> Tensor:
    """log π(a|s) = logits_a − log Σ_b exp(logits_b).  logits (B, K), actions (B,) int → (B,)."""
    return logits.log_softmax(-1).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


def categorical_entropy(logits: Tensor) -> Tensor:
    """H = −Σ_a π(a|s) log π(a|s).  logits (B, K) → (B,)."""
    log_p = logits.log_softmax(-1)
    return -(log_p.exp() * log_p).sum(-1)


def categorical_log_prob_entropy(logits: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
    """Both of the above from one log-softmax, for the update's hot path.  → (B,), (B,)."""
    log_p = logits.log_softmax(-1)
    return log_p.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1), -(log_p.exp() * log_p).sum(-1)


def categorical_sample(logits: Tensor) -> Tensor:
    """a ~ softmax(logits).  (B, K) → (B,) int64."""
    return torch.multinomial(logits.softmax(-1), 1).squeeze(-1)


def gaussian_log_prob(mean: Tensor, log_std: Tensor, actions: Tensor) -> Tensor:
    """Diagonal Gaussian: log π(a|s) = Σ_d [ −(a_d − μ_d)² / (2σ_d²) − log σ_d − ½ log 2π ].

    mean (B, D), log_std (D,) or (B, D), actions (B, D) → (B,).
    """
    z = (actions - mean) * torch.exp(-log_std)
    return (-0.5 * z.pow(2) - log_std - _LOG_SQRT_2PI).sum(-1)


def gaussian_entropy(log_std: Tensor, batch: int) -> Tensor:
    """H = Σ_d (½ + ½ log 2π + log σ_d); state-independent, so the same for each of the ``batch`` rows."""
    return (0.5 + _LOG_SQRT_2PI + log_std).sum(-1).expand(batch)


def gaussian_sample(mean: Tensor, log_std: Tensor) -> Tensor:
    """a = μ + σ ⊙ ξ, ξ ~ N(0, I).  mean (B, D) → (B, D)."""
    return mean + torch.exp(log_std) * torch.randn_like(mean)


def categorical_from_uniform(logits: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF sampling with given uniforms: a = min{a : Σ_{b ≤ a} π(b|s) > u}, u ~ U[0, 1).

    Two rollouts fed the same u take the same action wherever their π(·|s) agree (common random numbers).
    logits (B, K), u (B,) → (B,) int64.
    """
    cdf = logits.softmax(-1).cumsum(-1)  # (B, K)
    return (cdf <= u.unsqueeze(-1)).sum(-1).clamp(max=logits.shape[-1] - 1)


def gaussian_from_normal(mean: Tensor, log_std: Tensor, xi: Tensor) -> Tensor:
    """a = μ + σ ⊙ ξ with given standard normals ξ (common random numbers).  mean, ξ (B, D) → (B, D)."""
    return mean + torch.exp(log_std) * xi
