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

Seeds side by side can share one vector env (``groups`` S > 1): sub-envs k·N … (k+1)·N − 1 are seed k's, and
each seed keeps statistics of its own (:class:`SeedStatistics`), so its normalized observations and rewards are
the floats it would get from a vector env of its own N sub-envs. One step of S·N sub-envs through one chain of
wrappers costs about a third of S steps through S chains (HalfCheetah, 8 seeds).
"""

from __future__ import annotations

from typing import Any, Literal

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


class SeedStatistics:
    """S seeds' running statistics for one vector env whose sub-envs k·N … (k+1)·N − 1 are seed k's.

    gymnasium's wrappers use it as they use one ``RunningMeanStd``: ``update`` splits the batch by seed and
    updates each seed's statistics with its own rows, as a vector env of its own would; ``mean`` and ``var``
    hold one row per sub-env, its seed's, so the wrappers' element-wise normalization gives each sub-env
    the same float it would get from its seed's statistics alone.

    ``rows`` (S·N,) bool, when set, says which sub-envs the next batch's rows come from (gymnasium's
    ``NormalizeReward`` updates with the returns of the sub-envs that did not just autoreset only); a seed
    with no row in a batch is not updated, as its own wrapper would skip the update.
    """

    def __init__(self, seeds: list[FastRunningMeanStd], envs_per_seed: int) -> None:
        self.seeds = seeds
        self.envs_per_seed = envs_per_seed
        self.shape = np.shape(seeds[0].mean)  # a seed's statistics come back from a checkpoint as 1-D arrays
        self.rows: np.ndarray | None = None  # (S·N,) bool

    def update(self, x: np.ndarray) -> None:
        S, N = len(self.seeds), self.envs_per_seed
        if (self.rows is None or self.rows.all()) and x.dtype.kind == "f":
            # Every seed's moments at once: each reduction adds its seed's N rows in the order its own batch
            # would (tests/test_envs.py checks the floats against a batch per seed).
            means, variances = batch_moments(np.swapaxes(x.reshape(S, N, *x.shape[1:]), 0, 1))  # (S, ...) each
            for stats, mean, var in zip(self.seeds, means, variances, strict=True):
                stats.update_from_moments(mean, var, N)
            return
        rows = np.ones(S * N, dtype=bool) if self.rows is None else self.rows
        counts = rows.reshape(S, N).sum(axis=1)  # (S,) rows of the batch that are each seed's
        for stats, part in zip(self.seeds, np.split(x, np.cumsum(counts)[:-1]), strict=True):
            if len(part):
                stats.update(part)

    @property
    def mean(self) -> np.ndarray:
        return self._per_env([stats.mean for stats in self.seeds])

    @property
    def var(self) -> np.ndarray:
        return self._per_env([stats.var for stats in self.seeds])

    def _per_env(self, per_seed: list[np.ndarray]) -> np.ndarray:
        stacked = np.stack([np.reshape(x, self.shape) for x in per_seed])  # (S, ...)
        return np.repeat(stacked, self.envs_per_seed, axis=0)  # (S·N, ...)


def running_statistics(env: VectorEnv, groups: int, shape: tuple[int, ...], dtype: Any) -> Any:
    """One :class:`FastRunningMeanStd`, or per seed where ``groups`` seeds share ``env``."""
    if groups == 1:
        return FastRunningMeanStd(shape=shape, dtype=dtype)
    if env.num_envs % groups:
        raise ValueError(f"{env.num_envs} sub-envs cannot be split among {groups} seeds")
    return SeedStatistics([FastRunningMeanStd(shape=shape, dtype=dtype) for _ in range(groups)], env.num_envs // groups)


def seed_statistics(stats: Any, group: int | None) -> Any:
    """Seed ``group``'s statistics where seeds share them, else ``stats`` itself."""
    if isinstance(stats, SeedStatistics):
        if group is None:
            raise ValueError("these statistics are several seeds'; say whose")
        return stats.seeds[group]
    return stats


class NormalizeObservation(vector_wrappers.NormalizeObservation):
    """gymnasium's vector ``NormalizeObservation`` with :class:`FastRunningMeanStd` statistics (one per seed for
    ``groups`` seeds); the normalized observations clipped to [−``clip``, ``clip``] (none: not clipped)."""

    def __init__(self, env: VectorEnv, clip: float | None = None, epsilon: float = 1e-8, groups: int = 1) -> None:
        super().__init__(env, epsilon=epsilon)
        self.obs_rms = running_statistics(env, groups, self.obs_rms.mean.shape, self.obs_rms.mean.dtype)
        self.clip = clip

    def observations(self, observations: Any) -> Any:
        normalized = super().observations(observations)
        return normalized if self.clip is None else np.clip(normalized, -self.clip, self.clip)


class NormalizeReward(vector_wrappers.NormalizeReward):
    """gymnasium's vector ``NormalizeReward`` with :class:`FastRunningMeanStd` statistics (one per seed for
    ``groups`` seeds); the scaled rewards clipped to [−``clip``, ``clip``] (none: not clipped).

    Rewards are divided by the running std of a discounted return G kept per sub-env, updated on every step
    but the autoreset ones (NEXT_STEP mode), and ``restart`` says when G starts again:

        terminated (gymnasium's):  G ← γ · G · (1 − terminated_t) + r_t
        done (SB3's VecNormalize, OpenAI baselines' ppo2):  G ← γ · G + r_t, then G ← 0 where done_t

    gymnasium's G carries over a time limit into the next episode, so where episodes end by truncation and
    γ is near 1 (Swimmer at γ = 0.9999) G grows far past any episode's return, and the rewards shrink with
    its std; SB3's G is each episode's own discounted return so far. ``done`` keeps G in float64, as SB3 does.
    """

    def __init__(
        self,
        env: VectorEnv,
        gamma: float = 0.99,
        clip: float | None = None,
        epsilon: float = 1e-8,
        groups: int = 1,
        restart: Literal["terminated", "done"] = "terminated",
    ) -> None:
        super().__init__(env, gamma=gamma, epsilon=epsilon)
        self.return_rms = running_statistics(env, groups, (), np.float64)
        self.clip = clip
        self.restart = restart
        if restart == "done":
            self.accumulated_reward = np.zeros(self.num_envs, dtype=np.float64)

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        active = ~self._prev_dones.astype(bool)  # (N,)  NEXT_STEP: an autoreset step is no step of an episode
        if isinstance(self.return_rms, SeedStatistics):
            self.return_rms.rows = active  # the rows whose returns update the statistics
        if self.restart == "terminated":
            obs, rewards, terminated, truncated, info = super().step(actions)
        else:
            obs, rewards, terminated, truncated, info = self.env.step(actions)
            G = self.accumulated_reward
            G[active] = self.gamma * G[active] + rewards[active]
            if self._update_running_mean and active.any():
                self.return_rms.update(G[active])
            done = np.logical_or(terminated, truncated)
            G[done] = 0.0
            self._prev_dones = done.astype(np.float32)
            rewards = rewards / np.sqrt(self.return_rms.var + self.epsilon)
        if self.clip is not None:
            rewards = np.clip(rewards, -self.clip, self.clip)
        return obs, rewards, terminated, truncated, info
