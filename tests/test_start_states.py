"""Tests for envs/start_states.py: group seeds, same-seed resets, and exact branch points.

The central check: after :func:`branch_groups`, every member of group b that takes the same actions as a
reference env (reset with the trunk's seed, then driven by the trunk's action prefix) sees bit-identical
observations and rewards, including across an autoreset.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import vector as vector_wrappers

from envs import BadInput, EnvOptions, make_vector
from envs.factory import find_wrapper
from envs.start_states import (
    BranchPoint,
    NotRestorable,
    branch_groups,
    observe,
    reset_groups,
    restore_mode,
    run_trunks,
)

SYNC = EnvOptions(vectorization="sync")
SYNC_NORM_OBS = EnvOptions(vectorization="sync", normalize_obs=True)
TRUNK_SEEDS = [11, 12]
DEPTHS = [5, 40]
G = 3
AFTER_BRANCH = 30
"""Steps compared with the reference env after branching."""


def _random_policy(env: gym.vector.VectorEnv, seed: int) -> Callable[[np.ndarray], np.ndarray]:
    """A seeded random policy for ``env``: ignores the obs, samples the batched action space.

    For Box actions that space is ClipAction's unbounded one, so trunks also check that branch points
    record the clipped actions the sub-envs received.
    """
    space = copy.deepcopy(env.action_space)
    space.seed(seed)
    return lambda obs: space.sample()


def _as_passed(action: np.ndarray) -> Any:
    return action[()] if action.ndim == 0 else action


def _reference(env_id: str, point: BranchPoint) -> gym.Env:
    """A plain env put at the branch point the slow, obviously right way: seed, then the action prefix."""
    ref = gym.make(env_id)
    obs, _ = ref.reset(seed=point.seed)
    prefix_return = 0.0
    for action in point.actions:
        # The prefix holds what the sub-env received: ClipAction's output, inside the env's own bounds.
        assert ref.action_space.contains(_as_passed(action))
        obs, reward, terminated, truncated, _ = ref.step(_as_passed(action))
        prefix_return += float(reward)
        assert not (terminated or truncated)
    assert np.array_equal(obs, point.raw_obs) and prefix_return == point.prefix_return
    return ref


def _group_actions(env: gym.vector.VectorEnv, B: int, T: int, seed: int) -> np.ndarray:
    """(T, B·G, ...) actions: group b's members all take one sequence, the groups take different ones.

    Sampled from the sub-env's own (bounded) action space: ClipAction widens the wrapper's to (-inf, inf),
    and the reference env, which has no ClipAction, must get the same actions as the members.
    """
    per_group = []
    for b in range(B):
        space = copy.deepcopy(env.unwrapped.single_action_space)
        space.seed(seed + b)
        per_group.append(np.stack([np.asarray(space.sample()) for _ in range(T)]))  # (T, ...)
    return np.repeat(np.stack(per_group, axis=1), G, axis=1)  # (T, B·G, ...)


def _until_some_member_done(env: gym.vector.VectorEnv, seed: int, max_steps: int = 60) -> bool:
    """Step with random actions until a member has just ended, so it has an autoreset pending."""
    policy = _random_policy(env, seed)
    for _ in range(max_steps):
        _, _, terminated, truncated, _ = env.step(policy(None))
        if np.any(terminated | truncated):
            return True
    return False


@pytest.fixture
def noisy_env_id() -> Iterator[str]:
    """A toy env whose step adds unseeded noise: it cannot be replayed, and it has no settable state."""

    class Noisy(gym.Env):
        observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float64)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
            super().reset(seed=seed)
            return np.zeros(1), {}

        def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
            noise = np.random.default_rng().normal(size=1)  # no seed: differs in every process and call
            return noise, float(noise[0]), False, False, {}

    env_id = "testbed-test/Noisy-v0"
    gym.register(env_id, entry_point=lambda: Noisy(), max_episode_steps=50)
    try:
        yield env_id
    finally:
        del gym.registry[env_id]


# ---- reset_groups ----------------------------------------------------------------------------------


def _assert_grouped(groups: np.ndarray) -> None:
    """(B, G, obs_dim): members of a group start identically; different groups start differently."""
    for b in range(groups.shape[0]):
        assert np.all(groups[b] == groups[b, :1]), f"group {b}'s members start differently"
        for other in range(b):
            assert not np.array_equal(groups[b, 0], groups[other, 0]), "two groups share a start"


def test_reset_groups_cartpole() -> None:
    env = make_vector("CartPole-v1", 3 * 4, SYNC)
    obs = reset_groups(env, [5, 6, 7], 4)
    assert obs.shape == (12, 4)
    _assert_grouped(obs.reshape(3, 4, 4))
    # The seed of group b is the seed of every member: a plain env reset with it gives the same obs.
    single = gym.make("CartPole-v1")
    for b, seed in enumerate([5, 6, 7]):
        assert np.array_equal(obs[b * 4], single.reset(seed=seed)[0])
    env.close()


def test_reset_groups_halfcheetah_normalized() -> None:
    env = make_vector("HalfCheetah-v5", 2 * 2, SYNC_NORM_OBS)
    obs = reset_groups(env, [5, 6], 2)
    assert obs.shape == (4, 17) and obs.dtype == np.float32
    _assert_grouped(obs.reshape(2, 2, 17))
    env.close()


def test_reset_groups_refuses_native_cartpole_and_wrong_sizes() -> None:
    native = make_vector("CartPole-v1", 4, EnvOptions(vectorization="native"))
    with pytest.raises(BadInput, match="vectorization=sync"):
        reset_groups(native, [1, 2], 2)
    native.close()
    env = make_vector("CartPole-v1", 4, SYNC)
    with pytest.raises(BadInput, match="6 sub-envs"):
        reset_groups(env, [1, 2, 3], 2)
    env.close()


# ---- restore_mode ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env_id", "mode"), [("CartPole-v1", "direct"), ("Hopper-v5", "direct"), ("LunarLander-v3", "replay")]
)
def test_restore_mode(env_id: str, mode: str) -> None:
    assert restore_mode(env_id) == mode


def test_restore_mode_refuses_a_nondeterministic_env(noisy_env_id: str) -> None:
    with pytest.raises(NotRestorable, match=r"(?s)Noisy-v0.*exact restores.*start_mode=reset"):
        restore_mode(noisy_env_id)


# ---- run_trunks + branch_groups: exactness ---------------------------------------------------------


@pytest.mark.parametrize(
    ("env_id", "mode"),
    [
        ("CartPole-v1", "direct"),
        ("HalfCheetah-v5", "direct"),
        ("LunarLander-v3", "replay"),
        ("FrozenLake-v1", "replay"),  # Discrete observations: raw obs are ints, the vector env one-hots them
    ],
)
def test_branch_is_exact(env_id: str, mode: str) -> None:
    assert restore_mode(env_id) == mode
    B = len(TRUNK_SEEDS)
    trunk = make_vector(env_id, B, SYNC)
    points, _ = run_trunks(trunk, TRUNK_SEEDS, DEPTHS, _random_policy(trunk, 0), mode)
    trunk.close()
    assert all((p.state is not None) == (mode == "direct") for p in points)

    group_env = make_vector(env_id, B * G, SYNC)
    reset_groups(group_env, [100, 101], G)
    # Leave autoresets pending, which branching must cancel (HalfCheetah never ends this early).
    assert _until_some_member_done(group_env, seed=1) == (env_id != "HalfCheetah-v5")
    obs, replay_steps = branch_groups(group_env, points, G, mode)
    assert replay_steps == (G * sum(len(p.actions) for p in points) if mode == "replay" else 0)
    stats = find_wrapper(group_env, vector_wrappers.RecordEpisodeStatistics)
    assert np.all(stats.episode_lengths == 0) and np.all(stats.episode_returns == 0)

    refs = [_reference(env_id, p) for p in points]
    ref_obs = [p.raw_obs for p in points]
    ref_done = [False] * B
    since_branch = np.zeros(B, dtype=int)
    expected = observe(group_env, np.repeat(np.stack(ref_obs), G, axis=0))
    assert np.array_equal(obs, expected)
    actions = _group_actions(group_env, B, AFTER_BRANCH, seed=500)  # (T, B·G, ...)
    for t in range(AFTER_BRANCH):
        obs, rewards, terminated, truncated, info = group_env.step(actions[t])
        ref_rewards = np.zeros(B)  # (B,)
        for b, ref in enumerate(refs):
            if ref_done[b]:
                # NEXT_STEP autoreset: the vector env ignores the action and resets without a seed, drawing
                # from the restored RNG, so the reference does the same.
                ref_obs[b], _ = ref.reset()
                ref_done[b], since_branch[b] = False, 0
                continue
            ref_obs[b], ref_rewards[b], term, trunc, _ = ref.step(_as_passed(actions[t, b * G]))
            ref_done[b] = term or trunc
            since_branch[b] += 1
            assert np.all(terminated[b * G : (b + 1) * G] == term) and np.all(truncated[b * G : (b + 1) * G] == trunc)
            if ref_done[b]:
                # Episode statistics count from the branch point (or from the autoreset after it).
                members = slice(b * G, (b + 1) * G)
                assert np.all(info["_episode"][members])
                assert np.all(info["episode"]["l"][members] == since_branch[b])
        assert np.array_equal(obs, observe(group_env, np.repeat(np.stack(ref_obs), G, axis=0))), f"obs differ at {t}"
        assert np.array_equal(rewards, np.repeat(ref_rewards, G)), f"rewards differ at step {t}"
    group_env.close()


def test_branch_with_normalization_leaves_statistics_alone() -> None:
    env_id, B = "HalfCheetah-v5", len(TRUNK_SEEDS)
    trunk = make_vector(env_id, B, SYNC)
    points, _ = run_trunks(trunk, TRUNK_SEEDS, DEPTHS, _random_policy(trunk, 0), "direct")
    trunk.close()
    options = EnvOptions(vectorization="sync", normalize_obs=True, normalize_reward=True)
    env = make_vector(env_id, B * G, options)
    reset_groups(env, [100, 101], G)
    policy = _random_policy(env, 3)
    for _ in range(5):
        env.step(policy(None))
    obs_rms = find_wrapper(env, vector_wrappers.NormalizeObservation).obs_rms
    before = (obs_rms.mean.copy(), obs_rms.var.copy(), obs_rms.count)

    obs, _ = branch_groups(env, points, G, "direct")

    assert np.array_equal(obs_rms.mean, before[0]) and np.array_equal(obs_rms.var, before[1])
    assert obs_rms.count == before[2]
    raw = np.repeat(np.stack([p.raw_obs for p in points]), G, axis=0)  # (B·G, obs_dim)
    assert obs.dtype == np.float32 and np.array_equal(obs, observe(env, raw))
    by_hand = np.clip((raw - before[0]) / np.sqrt(before[1] + 1e-8), -10.0, 10.0).astype(np.float32)
    assert np.array_equal(obs, by_hand)
    assert np.all(observe(env, raw + 1e6) == 10.0)  # the clip at clip_obs=10 is applied too
    assert np.all(find_wrapper(env, vector_wrappers.NormalizeReward).accumulated_reward == 0)
    env.close()


def test_observe_takes_any_batch_size() -> None:
    env = make_vector("FrozenLake-v1", 4, SYNC)
    one_hot = observe(env, np.array([0, 5, 15]))
    assert one_hot.shape == (3, 16)
    assert np.array_equal(one_hot.argmax(axis=1), [0, 5, 15]) and np.all(one_hot.sum(axis=1) == 1)
    env.close()


def test_trunk_policy_sees_raw_observations_that_observe_accepts() -> None:
    group_env = make_vector("FrozenLake-v1", 2 * G, SYNC)  # flattens its Discrete observations to one-hot
    trunk = make_vector("FrozenLake-v1", 2, SYNC)
    seen: list[np.ndarray] = []

    def policy(raw_obs: np.ndarray) -> np.ndarray:
        seen.append(observe(group_env, raw_obs))  # as a caller normalizes inside its policy
        return np.zeros(2, dtype=np.int64)

    points, _ = run_trunks(trunk, TRUNK_SEEDS, [2, 2], policy, "replay")
    assert seen and all(obs.shape == (2, 16) for obs in seen)
    assert all(p.raw_obs.shape == () for p in points)  # a Discrete observation: the state's index
    trunk.close()
    group_env.close()


# ---- run_trunks: fallback and step counts ----------------------------------------------------------


def test_trunk_that_ends_early_falls_back_to_the_reset_state() -> None:
    always_right = lambda obs: np.ones(1, dtype=np.int64)  # noqa: E731 - the pole falls within ~10 steps
    trunk = make_vector("CartPole-v1", 1, SYNC)
    points, steps = run_trunks(trunk, [42], [10_000], always_right, "direct")
    trunk.close()
    single = gym.make("CartPole-v1")
    reset_obs, _ = single.reset(seed=42)
    episode_length = 1
    while not any(single.step(1)[2:4]):
        episode_length += 1
    point = points[0]
    assert point.actions == [] and point.prefix_return == 0.0 and point.seed == 42
    assert np.array_equal(point.raw_obs, reset_obs)
    assert steps == episode_length  # one sub-env, stepped until its episode ended

    group_env = make_vector("CartPole-v1", 2, SYNC)
    obs, replay_steps = branch_groups(group_env, points, 2, "direct")
    assert replay_steps == 0 and np.array_equal(obs, np.stack([reset_obs, reset_obs]))
    group_env.close()


def test_step_counts_are_exact() -> None:
    B = len(TRUNK_SEEDS)
    trunk = make_vector("LunarLander-v3", B, SYNC)
    points, steps = run_trunks(trunk, TRUNK_SEEDS, DEPTHS, _random_policy(trunk, 0), "replay")
    trunk.close()
    assert [len(p.actions) for p in points] == DEPTHS  # neither lander lands or crashes this early
    assert steps == B * 40  # the vector env steps both sub-envs until the deeper one reaches 40
    group_env = make_vector("LunarLander-v3", B * G, SYNC)
    _, replay_steps = branch_groups(group_env, points, G, "replay")
    assert replay_steps == G * (5 + 40)
    group_env.close()

    trunk = make_vector("CartPole-v1", B, SYNC)
    points, steps = run_trunks(trunk, TRUNK_SEEDS, [0, 3], _random_policy(trunk, 0), "direct")
    trunk.close()
    assert [len(p.actions) for p in points] == [0, 3] and steps == B * 3


# ---- refusals --------------------------------------------------------------------------------------


def test_replay_that_does_not_reach_the_trunk_state_is_refused() -> None:
    trunk = make_vector("LunarLander-v3", 1, SYNC)
    points, _ = run_trunks(trunk, [11], [5], _random_policy(trunk, 0), "replay")
    trunk.close()
    group_env = make_vector("LunarLander-v3", 2, SYNC)
    wrong = copy.deepcopy(points[0])
    wrong.raw_obs = wrong.raw_obs + np.float32(1e-3)
    with pytest.raises(NotRestorable, match="start_mode=reset"):
        branch_groups(group_env, [wrong], 2, "replay")
    wrong = copy.deepcopy(points[0])
    wrong.prefix_return += 1.0
    with pytest.raises(NotRestorable, match="start_mode=reset"):
        branch_groups(group_env, [wrong], 2, "replay")
    group_env.close()

    # A prefix that ends the episode: always pushing right topples the pole long before 100 steps.
    cartpole = make_vector("CartPole-v1", 2, SYNC)
    reset_obs, _ = gym.make("CartPole-v1").reset(seed=3)
    toppled = BranchPoint(seed=3, actions=[np.array(1)] * 100, raw_obs=reset_obs, state=None, prefix_return=100.0)
    with pytest.raises(NotRestorable, match="ended the episode"):
        branch_groups(cartpole, [toppled], 2, "replay")
    with pytest.raises(ValueError, match="no snapshot"):
        branch_groups(cartpole, [toppled], 2, "direct")
    cartpole.close()


def test_direct_trunks_need_a_restorable_env() -> None:
    trunk = make_vector("LunarLander-v3", 1, SYNC)
    with pytest.raises(NotRestorable, match="replay"):
        run_trunks(trunk, [1], [3], _random_policy(trunk, 0), "direct")
    trunk.close()


def test_branch_groups_refuses_async_env() -> None:
    env = make_vector("CartPole-v1", 2, EnvOptions(vectorization="async"))
    point = BranchPoint(seed=1, actions=[], raw_obs=np.zeros(4, np.float32), state=None, prefix_return=0.0)
    try:
        with pytest.raises(BadInput, match="vectorization=sync"):
            branch_groups(env, [point], 2, "replay")
    finally:
        env.close()
