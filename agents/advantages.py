"""Advantage estimators, one pure function per equation. Imports only torch.

Time-index convention: index t holds (s_t, a_t, r_t, flags of the step taken from s_t). ``next_values[t]``
is V(s_{t+1}), where s_{t+1} is the *true* next observation of that step: the final observation when the
step ended the episode, never the first observation of the following episode.
"""

from __future__ import annotations

import torch
from torch import Tensor


def gae(
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    done: Tensor,
    gamma: float,
    lam: float,
) -> Tensor:
    """Generalized Advantage Estimation (Schulman et al. 2016, arXiv 1506.02438, eq. 16).

        δ_t = r_t + γ · (1 − terminated_t) · V(s_{t+1}) − V(s_t)
        A_t = δ_t + γ · λ · (1 − done_t) · A_{t+1},      A_T = 0

    Symbols:
        r_t            reward of the step taken at t                       ``rewards``      (T, N)
        V(s_t)         critic's value of the observation the step started  ``values``       (T, N)
        V(s_{t+1})     value of the true next observation (the final       ``next_values``  (T, N)
                       observation if the episode ended at t)
        terminated_t   the MDP ended at t: nothing to bootstrap            ``terminated``   (T, N) bool
        done_t         terminated_t or truncated_t: the episode stops,     ``done``         (T, N) bool
                       so A_t takes nothing from the next episode
        γ, λ           discount and GAE mixing factor                      ``gamma``, ``lam``

    A truncated step (done, not terminated) bootstraps from V of its true final observation: the time
    limit is not part of the MDP. λ = 0 gives the one-step TD error; λ = 1 gives the Monte-Carlo
    return minus V(s_t), bootstrapped only at truncation and at the end of the segment.

    Returns the advantages A, shape (T, N). Value targets are A + values.
    """
    if not (rewards.shape == values.shape == next_values.shape == terminated.shape == done.shape):
        raise ValueError(
            "gae: rewards, values, next_values, terminated and done must share one (T, N) shape, got "
            f"{[tuple(x.shape) for x in (rewards, values, next_values, terminated, done)]}"
        )
    deltas = rewards + gamma * next_values * (~terminated) - values  # (T, N)
    carry = gamma * lam * (~done).to(rewards.dtype)  # (T, N)
    advantages = torch.empty_like(deltas)  # (T, N)
    running = torch.zeros_like(deltas[0])  # (N,)
    for t in range(deltas.shape[0] - 1, -1, -1):
        running = deltas[t] + carry[t] * running
        advantages[t] = running
    return advantages


def normalize(advantages: Tensor, eps: float = 1e-8) -> Tensor:
    """Per-batch standardization: Â = (A − mean A) / (std A + ε), std with Bessel's correction as SB3."""
    if advantages.numel() < 2:
        return advantages - advantages.mean()
    return (advantages - advantages.mean()) / (advantages.std() + eps)
