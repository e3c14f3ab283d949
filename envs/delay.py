"""Delayed rewards for any env: the same return, released in lumps, to test credit assignment."""

from __future__ import annotations

from typing import Any, Literal, SupportsFloat

import gymnasium as gym
from gymnasium.utils import RecordConstructorArgs

from envs.errors import BadInput

Delay = int | Literal["end"]


def check_delay(delay: Any) -> Delay:
    """``delay`` itself if it is an int >= 1 or ``"end"``; else raise BadInput saying the valid values."""
    if delay == "end" or (isinstance(delay, int) and not isinstance(delay, bool) and delay >= 1):
        return delay
    raise BadInput(f"reward delay must be a number of steps >= 1 or 'end' (at the episode's end), got {delay!r}")


class DelayedReward(gym.Wrapper, RecordConstructorArgs):
    """Buffer rewards and release their sum every k steps, or only at the episode's end.

    r'_t = Σ_{u=s}^{t} r_u  if (t + 1 − t0) mod k = 0 or the episode ends at t,  else 0

    - r_u: the env's reward at step u; r'_t: the reward this wrapper returns at step t;
    - t0: the first step of the episode (0, since the counter restarts at each reset);
    - s: the first step after the previous release (t0 if nothing was released yet);
    - k: ``delay`` steps; ``"end"`` is k = ∞ (only the episode's end releases); k = 1 is the identity;
    - "ends at t": ``terminated or truncated`` at step t, so the episode's return is unchanged.

    Put it outside any TimeLimit, so it sees truncation and flushes the buffer there.

    The delay is recorded in the env's spec (``RecordConstructorArgs``), so ``gymnasium.make(env.spec)``
    makes the same delayed env again, as gymnasium's own wrappers allow.
    """

    def __init__(self, env: gym.Env, delay: Delay) -> None:
        self.delay = check_delay(delay)  # before recording it: a spec never holds a delay that was refused
        RecordConstructorArgs.__init__(self, delay=delay)
        gym.Wrapper.__init__(self, env)
        self.buffered = 0.0
        """Σ r_u since the last release: released at the next release step."""
        self.since_release = 0
        """Steps since the last release (or reset): t + 1 − s after step t."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self.buffered, self.since_release = 0.0, 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.buffered += float(reward)
        self.since_release += 1
        if terminated or truncated or self.since_release == self.delay:
            reward, self.buffered, self.since_release = self.buffered, 0.0, 0
            return obs, reward, terminated, truncated, info
        return obs, 0.0, terminated, truncated, info
