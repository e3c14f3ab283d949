"""Tests for envs/delay.py: delayed rewards keep the return, release at the right steps, flush at the
episode's end, survive snapshot and restore, and reach the vector envs of envs/factory.py."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from envs import BadInput, DelayedReward, EnvOptions, load_vector_env_state, make_vector, vector_env_state
from envs.snapshot import NotRestorable, restore, snapshot


class Counting(gym.Env):
    """Reward n at the n-th step of an episode (1, 2, 3, …); terminates after ``length`` steps if given."""

    observation_space = gym.spaces.Box(0.0, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int | None = None) -> None:
        self.length, self.n = length, 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.n = 0
        return np.zeros(1, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.n += 1
        return np.full(1, self.n, np.float32), float(self.n), self.n == self.length, False, {}


def _rewards(env: gym.Env, steps: int) -> list[float]:
    """Rewards of ``steps`` steps (action 0), resetting after each episode's end."""
    env.reset(seed=0)
    rewards = []
    for _ in range(steps):
        _, reward, terminated, truncated, _ = env.step(0)
        rewards.append(reward)
        if terminated or truncated:
            env.reset()
    return rewards


@pytest.mark.parametrize(
    ("delay", "want"),
    [
        (1, [1, 2, 3, 4, 5, 6, 7]),
        (3, [0, 0, 1 + 2 + 3, 0, 0, 4 + 5 + 6, 7]),  # the 7th step ends the episode: 7 is flushed
        (7, [0, 0, 0, 0, 0, 0, 28]),
        ("end", [0, 0, 0, 0, 0, 0, 28]),
    ],
)
def test_rewards_are_released_at_the_right_steps(delay: int | str, want: list[float]) -> None:
    assert _rewards(DelayedReward(Counting(length=7), delay), 7) == want


@pytest.mark.parametrize("delay", [1, 2, 3, 4, 6, 100, "end"])
def test_the_return_is_unchanged(delay: int | str) -> None:
    # Two episodes of 1 + … + 6 = 21 each: the counter restarts at each episode.
    rewards = _rewards(DelayedReward(Counting(length=6), delay), 12)
    assert sum(rewards[:6]) == 21 and sum(rewards[6:]) == 21


def test_each_episode_counts_from_its_reset() -> None:
    # k = 4 on episodes of 6: releases at the 4th and the 6th (last) step of each episode.
    assert _rewards(DelayedReward(Counting(length=6), 4), 12) == [0, 0, 0, 10, 0, 11] * 2


@pytest.mark.parametrize(("delay", "want"), [(3, [0, 0, 6, 0, 9]), ("end", [0, 0, 0, 0, 15])])
def test_truncation_flushes_the_buffer(delay: int | str, want: list[float]) -> None:
    env = DelayedReward(gym.wrappers.TimeLimit(Counting(), max_episode_steps=5), delay)
    assert _rewards(env, 5) == want


def test_reset_clears_the_buffer() -> None:
    env = DelayedReward(Counting(), 3)
    env.reset(seed=0)
    env.step(0), env.step(0)  # 1 + 2 buffered
    assert (env.buffered, env.since_release) == (3.0, 2)
    env.reset()
    assert [env.step(0)[1] for _ in range(3)] == [0, 0, 1 + 2 + 3]


@pytest.mark.parametrize("delay", [0, -2, 2.5, "start", True])
def test_bad_delays_are_refused(delay: Any) -> None:
    with pytest.raises(BadInput, match="'end'"):
        DelayedReward(Counting(), delay)
    with pytest.raises(BadInput, match="'end'"):
        EnvOptions(reward_delay=delay)


# ── snapshot and restore ─────────────────────────────────────────────────────────────────────────


def _pendulum(delay: int | str) -> gym.Env:
    return DelayedReward(gym.make("Pendulum-v1", max_episode_steps=20), delay)


def test_snapshot_holds_the_buffered_reward() -> None:
    """Snapshot after 6 steps with k = 4: two rewards are buffered, and the restored env releases them."""
    actions = [np.array([a], np.float32) for a in np.linspace(-2, 2, 16)]
    plain = gym.make("Pendulum-v1", max_episode_steps=20)
    plain.reset(seed=3)
    r = [float(plain.step(a)[1]) for a in actions]  # the undelayed rewards r_0 … r_15
    env = _pendulum(4)
    env.reset(seed=3)
    assert [env.step(a)[1] for a in actions[:6]] == [0, 0, 0, sum(r[:4]), 0, 0]
    state = snapshot(env)
    assert state["delay"] == {"buffered": r[4] + r[5], "since_release": 2}
    want = [0, sum(r[4:8]), 0, 0, 0, sum(r[8:12]), 0, 0, 0, sum(r[12:16])]

    fresh = _pendulum(4)
    fresh.reset(seed=99)
    fresh.step(actions[0])  # something else in its buffer, which the restore must overwrite
    restore(fresh, state)
    assert [fresh.step(a)[1] for a in actions[6:]] == want


def test_snapshot_and_env_must_agree_on_the_delay() -> None:
    delayed, plain = _pendulum("end"), gym.make("Pendulum-v1", max_episode_steps=20)
    delayed.reset(seed=0), plain.reset(seed=0)
    with pytest.raises(NotRestorable, match="DelayedReward"):
        restore(plain, snapshot(delayed))
    with pytest.raises(NotRestorable, match="DelayedReward"):
        restore(delayed, snapshot(plain))


# ── vector envs ──────────────────────────────────────────────────────────────────────────────────


def test_make_vector_delays_each_sub_env() -> None:
    """KeyDoor, H = 6, k = 4: rewards come at steps 4 and 6 only, and sum to the undelayed return."""
    kwargs = {"horizon": 6, "distractor_scale": 0.25}  # 0.25: sums are exact in floating point
    plain = make_vector("testbed/KeyDoor-v0", 2, EnvOptions(vectorization="sync"), **kwargs)
    delayed = make_vector("testbed/KeyDoor-v0", 2, EnvOptions(reward_delay=4), **kwargs)
    assert type(delayed.unwrapped).__name__ == "SyncVectorEnv", "auto picks sync for a delay"
    assert all(isinstance(e, DelayedReward) for e in delayed.unwrapped.envs)
    plain.reset(seed=5), delayed.reset(seed=5)
    take_key = np.array([1, 0])
    got, want = [], []
    for _ in range(6):
        want.append(plain.step(take_key)[1])
        _, reward, terminated, _, info = delayed.step(take_key)
        got.append(reward)
    got, want = np.stack(got), np.stack(want)  # (6, 2)
    assert np.all(got[[0, 1, 2, 4]] == 0)
    assert np.array_equal(got[3], want[:4].sum(axis=0)) and np.array_equal(got[5], want[4:].sum(axis=0))
    assert terminated.all() and np.array_equal(info["episode"]["r"], want.sum(axis=0))
    plain.close(), delayed.close()


def test_a_delay_of_one_is_no_delay() -> None:
    env = make_vector("testbed/Chain-v0", 2, EnvOptions(reward_delay=1), horizon=5)
    assert type(env.unwrapped).__name__ == "ChainVectorEnv"
    env.close()


def test_native_vectorization_refuses_a_delay() -> None:
    with pytest.raises(BadInput, match="vectorization=sync"):
        make_vector("CartPole-v1", 2, EnvOptions(vectorization="native", reward_delay=3))


def test_vector_env_state_holds_each_buffer() -> None:
    """A delayed sync vector env saved mid-buffer continues exactly after loading into a fresh one."""
    options = EnvOptions(reward_delay=3)
    env = make_vector("testbed/Chain-v0", 2, options, horizon=5)
    fresh = make_vector("testbed/Chain-v0", 2, options, horizon=5)
    env.reset(seed=0), fresh.reset(seed=8)
    actions = np.random.default_rng(0).integers(2, size=(14, 2))  # (T, N): crosses two episode ends
    for a in actions[:4]:
        env.step(a)
    assert [e.since_release for e in env.unwrapped.envs] == [1, 1]
    state = vector_env_state(env)
    want = [env.step(a)[1] for a in actions[4:]]
    load_vector_env_state(fresh, state)
    assert np.array_equal(np.stack([fresh.step(a)[1] for a in actions[4:]]), np.stack(want))
    env.close(), fresh.close()
