"""gymnasium's vector normalization wrappers, with running statistics that cost a third as much per step.

``NormalizeObservation`` and ``NormalizeReward`` update a ``RunningMeanStd`` on every step from the batch's
mean and variance. ``np.mean`` and ``np.var`` reach their few ufunc calls through several layers of Python
(argument checks, counting, dispatch): about 40 µs of a HalfCheetah step's 100 µs of physics. The
subclasses here make the same ufunc calls directly, so every statistic, and every normalized observation
and reward, is the same float, bit for bit, as gymnasium's (``tests/test_envs.py`` checks it). Being
subclasses, they are found by ``isinstance`` wherever gymnasium's are (saving, loading and freezing the
statistics, applying them to a subset of members).

Each also clips what it normalizes, as SB3's ``VecNormalize`` does (``clip_obs``, ``clip_reward``): the same
``np.clip`` that gymnasium's ``TransformObservation`` and ``ClipReward`` would apply on top, without their two
wrapper layers, each about 20–40 µs of every step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv
from gymnasium.wrappers import vector as vector_wrappers
from gymnasium.wrappers.utils import RunningMeanStd


def batch_moments(x: np.ndarray) -> tuple[Any, Any]:
    """The mean and the (population) variance of ``x`` over its first axis, computed as ``np.mean(x, axis=0)``
    and ``np.var(x, axis=0)`` compute them for a float array, with the same results and types:

        x̄ = (Σ_i x_i) / n,    s² = (Σ_i (x_i − x̄)²) / n

    x: (n, ...) samples of a float dtype; n: the count, divided as an ``np.intp`` as numpy divides it.
    """
    n = np.intp(x.shape[0])
    mean = np.add.reduce(x, axis=0, keepdims=True)  # (1, ...)
    np.true_divide(mean, n, out=mean, casting="unsafe")
    squared = np.square(np.subtract(x, mean))  # (n, ...)
    var = np.add.reduce(squared, axis=0)
    # np.var divides an array result in place and a scalar one (x of shape (n,)) as its own type.
    var = np.true_divide(var, n, out=var, casting="unsafe") if isinstance(var, np.ndarray) else var.dtype.type(var / n)
    return mean[0], var


class FastRunningMeanStd(RunningMeanStd):
    """gymnasium's ``RunningMeanStd`` whose batch moments come from :func:`batch_moments` for float batches."""

    def update(self, x: np.ndarray) -> None:
        if x.dtype.kind != "f" or x.shape[0] == 0:
            super().update(x)  # integer batches (np.mean casts them) and empty ones (it warns) as gymnasium does
            return
        batch_mean, batch_var = batch_moments(x)
        self.update_from_moments(batch_mean, batch_var, x.shape[0])


class NormalizeObservation(vector_wrappers.NormalizeObservation):
    """gymnasium's vector ``NormalizeObservation`` with :class:`FastRunningMeanStd` statistics; the normalized
    observations clipped to [−``clip``, ``clip``] (none: not clipped)."""

    def __init__(self, env: VectorEnv, clip: float | None = None, epsilon: float = 1e-8) -> None:
        super().__init__(env, epsilon=epsilon)
        self.obs_rms = FastRunningMeanStd(shape=self.obs_rms.mean.shape, dtype=self.obs_rms.mean.dtype)
        self.clip = clip

    def observations(self, observations: Any) -> Any:
        normalized = super().observations(observations)
        return normalized if self.clip is None else np.clip(normalized, -self.clip, self.clip)


class NormalizeReward(vector_wrappers.NormalizeReward):
    """gymnasium's vector ``NormalizeReward`` with :class:`FastRunningMeanStd` statistics; the scaled rewards
    clipped to [−``clip``, ``clip``] (none: not clipped)."""

    def __init__(self, env: VectorEnv, gamma: float = 0.99, clip: float | None = None, epsilon: float = 1e-8) -> None:
        super().__init__(env, gamma=gamma, epsilon=epsilon)
        self.return_rms = FastRunningMeanStd(shape=())
        self.clip = clip

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        obs, rewards, terminated, truncated, info = super().step(actions)
        if self.clip is not None:
            rewards = np.clip(rewards, -self.clip, self.clip)
        return obs, rewards, terminated, truncated, info
