"""Tests for envs/snapshot.py: restoring a snapshot and taking the same actions repeats the episode exactly."""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

import gymnasium as gym
import numpy as np
import pytest

from envs.snapshot import NotRestorable, is_restorable, restore, snapshot

WARMUP = 5
"""Random steps before the snapshot."""
REPLAY = 30
"""Steps recorded after the snapshot and replayed after each restore."""
MAX_STEPS = 12
"""Time limit: WARMUP < MAX_STEPS < WARMUP + REPLAY, so truncation happens inside the replayed window."""

RESTORABLE_IDS = [
    "CartPole-v1",
    "Pendulum-v1",
    "Acrobot-v1",
    "HalfCheetah-v5",
    "Hopper-v5",
    "testbed/Chain-v0",
    "testbed/KeyDoor-v0",
]


def _replay(env: gym.Env, actions: list[Any]) -> dict[str, np.ndarray]:
    """Take ``actions``; an episode end is followed by a seedless reset, whose obs is recorded too.

    A seedless reset draws from the env's RNG, so the replay also checks that the RNG was restored.
    """
    obs, rewards, terminated, truncated, reset_obs = [], [], [], [], []
    for action in actions:
        o, r, term, trunc, _ = env.step(action)
        obs.append(np.array(o, copy=True))
        rewards.append(float(r))
        terminated.append(bool(term))
        truncated.append(bool(trunc))
        if term or trunc:
            o, _ = env.reset()
            reset_obs.append(np.array(o, copy=True))
    return {
        "obs": np.stack(obs),  # (REPLAY, obs_dim)
        "rewards": np.array(rewards),  # (REPLAY,)
        "terminated": np.array(terminated),  # (REPLAY,)
        "truncated": np.array(truncated),  # (REPLAY,)
        "reset_obs": np.array(reset_obs),  # (episode ends, obs_dim)
    }


def _assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    for key, value in want.items():
        assert np.array_equal(got[key], value), f"{key} differs after restore"


def _assert_plain_data(value: Any, where: str = "snapshot") -> None:
    """Numbers, strings, None, numpy arrays, lists and dicts only: what a weights-only checkpoint holds."""
    if isinstance(value, dict):
        for k, v in value.items():
            assert isinstance(k, str), f"{where}: key {k!r} is not a string"
            _assert_plain_data(v, f"{where}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _assert_plain_data(v, f"{where}[{i}]")
    else:
        assert value is None or isinstance(value, (bool, int, float, str, np.ndarray, np.generic)), (
            f"{where} holds a {type(value).__name__}"
        )


@pytest.mark.parametrize("env_id", RESTORABLE_IDS)
def test_restore_replays_exactly(env_id: str) -> None:
    env = gym.make(env_id, max_episode_steps=MAX_STEPS)
    fresh = gym.make(env_id, max_episode_steps=MAX_STEPS)
    try:
        env.action_space.seed(1)
        env.reset(seed=123)
        assert is_restorable(env)
        for _ in range(WARMUP):
            _, _, term, trunc, _ = env.step(env.action_space.sample())
            assert not (term or trunc), "the warm-up should stay inside the first episode"
        state = snapshot(env)
        _assert_plain_data(state)
        actions = [env.action_space.sample() for _ in range(REPLAY)]

        original = _replay(env, actions)
        # The window must cross the time limit, so the restored counter is what decides truncation.
        assert original["truncated"][MAX_STEPS - WARMUP - 1], "the replayed window should reach the time limit"

        # (a) the same env, which has moved on by REPLAY steps and some resets.
        restore(env, state)
        _assert_same(_replay(env, actions), original)

        # (b) a fresh env, reset with another seed before the restore.
        fresh.reset(seed=999)
        restore(fresh, state)
        _assert_same(_replay(fresh, actions), original)

        # The snapshot is not aliased to the env: restoring it again still works.
        restore(fresh, state)
        _assert_same(_replay(fresh, actions), original)
    finally:
        env.close()
        fresh.close()


def test_snapshot_mid_episode_without_time_limit() -> None:
    """Without a TimeLimit wrapper the snapshot has no counter, and restore still works."""
    env = gym.make("Pendulum-v1", max_episode_steps=None).unwrapped
    env.reset(seed=0)
    env.step(np.array([1.0], dtype=np.float32))
    state = snapshot(env)
    assert state["elapsed_steps"] is None
    actions = [np.array([a], dtype=np.float32) for a in np.linspace(-2, 2, 10)]
    want = [env.step(a)[:2] for a in actions]
    restore(env, state)
    got = [env.step(a)[:2] for a in actions]
    for (obs_got, r_got), (obs_want, r_want) in zip(got, want, strict=True):
        assert np.array_equal(obs_got, obs_want) and r_got == r_want


@pytest.mark.parametrize(
    "env_id",
    ["LunarLander-v3", "CarRacing-v3"],
)
def test_envs_without_settable_state_are_not_restorable(env_id: str) -> None:
    env = gym.make(env_id)
    try:
        env.reset(seed=0)
        assert not is_restorable(env)
        with pytest.raises(NotRestorable, match=env_id) as error:
            snapshot(env)
        message = str(error.value)
        assert "MuJoCo" in message and "classic-control" in message
    finally:
        env.close()


def test_mujoco_snapshot_cannot_be_restored_into_classic_env() -> None:
    cheetah = gym.make("HalfCheetah-v5")
    pole = gym.make("CartPole-v1")
    try:
        cheetah.reset(seed=0)
        pole.reset(seed=0)
        with pytest.raises(NotRestorable):
            restore(pole, snapshot(cheetah))
    finally:
        cheetah.close()
        pole.close()
