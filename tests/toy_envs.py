"""Toy environments with known answers, registered under ``testbed-toy/``."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class ConstantReward(gym.Env):
    """Reward 1 every step, never terminates; only a time limit ends an episode.

    The observation is the constant 0, so V(s) = Σ γ^k = 1 / (1 − γ) for the infinite-horizon MDP. A
    critic trained with truncation treated as termination would instead learn the finite sum.
    """

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(1, np.float32), 1.0, False, False, {}


class TwoArms(gym.Env):
    """One step: action 1 gives reward 1 and terminates, action 0 gives reward 0 and terminates."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(1, np.float32), float(action), True, False, {}


class Noisy(ConstantReward):
    """Rewards drawn from an unseeded generator: replaying the same actions gives other rewards, so
    groups cannot branch from its mid-episode states."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        noise = np.random.default_rng().normal()
        return np.full(1, noise, np.float32), float(noise), False, False, {}


class Crash(ConstantReward):
    """Raises after 300 steps: a run on it crashes part-way."""

    steps = 0

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        Crash.steps += 1
        if Crash.steps > 300:
            raise RuntimeError("the toy env crashed on purpose")
        return super().step(action)


class Diverge(ConstantReward):
    """Rewards turn NaN after 300 steps: a run on it fails on non-finite values part-way, as a diverging
    one does."""

    steps = 0

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        Diverge.steps += 1
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, float("nan") if Diverge.steps > 300 else reward, terminated, truncated, info


class Tightrope(gym.Env):
    """A survival trap, Hopper's in one dimension: each step pays 1 for staying up plus the action
    a ∈ [−1, 1] as progress, and a step with a > 0.5 falls (terminates).

    Standing still (a = 0) earns 1 a step; the best policy steps at a = 0.5 and earns 1.5 a step, so over
    the 50-step limit the deterministic returns are 50 (stand) and 75 (best). A Gaussian policy that
    explores near 0.5 falls often, and a baseline that credits survivors for outliving the others pulls it
    back to standing.
    """

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, alive_bonus: float = 1.0) -> None:
        self.alive_bonus = alive_bonus

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        a = float(np.clip(action[0], -1.0, 1.0))
        return np.zeros(1, np.float32), self.alive_bonus + a, a > 0.5, False, {}


def make_two_arms(**kwargs: Any) -> gym.Env:
    """A factory of :class:`TwoArms` episodes of one step (``envs.custom``): ``tests.toy_envs:make_two_arms``."""
    return gym.wrappers.TimeLimit(TwoArms(**kwargs), max_episode_steps=1)


def register() -> None:
    if "testbed-toy/ConstantReward-v0" not in gym.registry:
        gym.register("testbed-toy/ConstantReward-v0", entry_point=ConstantReward, max_episode_steps=20)
        gym.register("testbed-toy/TwoArms-v0", entry_point=TwoArms, max_episode_steps=1)
        gym.register("testbed-toy/Noisy-v0", entry_point=Noisy, max_episode_steps=50)
        gym.register("testbed-toy/Unlimited-v0", entry_point=ConstantReward)
        gym.register("testbed-toy/Crash-v0", entry_point=Crash, max_episode_steps=20)
        gym.register("testbed-toy/Diverge-v0", entry_point=Diverge, max_episode_steps=20)
        gym.register("testbed-toy/Tightrope-v0", entry_point=Tightrope, max_episode_steps=50)


register()  # importing this module registers its envs, so `tests.toy_envs:testbed-toy/…` ids work anywhere
