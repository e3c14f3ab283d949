"""Tests for envs/tasks.py: the known returns of Chain and KeyDoor, their horizon, the native vector envs
(NEXT_STEP autoreset, seeds, agreement with the single envs), snapshot and restore, and the helpers."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import pytest

import tests.toy_envs  # noqa: F401 - registers testbed-toy/… ids
from envs import (
    BadInput,
    ChainEnv,
    ChainVectorEnv,
    EnvOptions,
    KeyDoorEnv,
    KeyDoorVectorEnv,
    episode_limit,
    make_vector,
    reference_returns,
    tasks,
)
from envs.snapshot import is_restorable, restore, snapshot

CHAIN, KEY_DOOR = "testbed/Chain-v0", "testbed/KeyDoor-v0"
Policy = Callable[[np.ndarray], int]


def _episode(env: gym.Env, seed: int | None, policy: Policy) -> list[float]:
    """The rewards of one whole episode."""
    obs, _ = env.reset(seed=seed)
    rewards, done = [], False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(policy(obs))
        rewards.append(reward)
        assert not truncated, "the tasks end themselves, never by truncation"
        done = terminated
    return rewards


def follow_cue(obs: np.ndarray) -> int:
    return int(obs[1] > 0)  # obs[1] = 2x − 1


# ── known returns ────────────────────────────────────────────────────────────────────────────────


def test_chain_rewards_the_first_action_at_the_final_step() -> None:
    env = ChainEnv(horizon=5, distractor_scale=0.0)
    for seed in range(6):
        assert _episode(env, seed, follow_cue) == [0, 0, 0, 0, 1.0]
        # The wrong first action, then the right ones: only the first counts.
        x = follow_cue(env.reset(seed=seed)[0])
        assert _episode(env, seed, lambda obs, x=x: 1 - x if obs[2] == 0 else x) == [0, 0, 0, 0, -1.0]
    assert env.optimal_return() == 1.0


def test_chain_observations() -> None:
    env = ChainEnv(horizon=4, distractor_scale=0.0)
    obs, _ = env.reset(seed=0)
    x = env.get_state()["cue"]
    assert obs.tolist() == [1.0, 2 * x - 1, 0, 0]
    assert env.step(x)[0].tolist() == [0.75, 2 * x - 1, 1, 1]
    assert env.step(1 - x)[0].tolist() == [0.5, 2 * x - 1, 1, 1], "later actions change nothing"
    env.reset(seed=0)
    assert env.step(1 - x)[0].tolist() == [0.75, 2 * x - 1, 1, -1]


@pytest.mark.parametrize("horizon", [1, 2, 7])
def test_chain_random_policy_return(horizon: int) -> None:
    """E[G] of the uniform policy, by enumerating the only action that matters: ½(+1) + ½(−1) = 0."""
    env = ChainEnv(horizon=horizon, distractor_scale=0.0)
    cues = {env.reset(seed=s)[0][1]: s for s in range(10)}
    assert set(cues) == {-1.0, 1.0}, "both cues occur"
    for seed in cues.values():
        returns = [sum(_episode(env, seed, lambda obs, a0=a0: a0 if obs[2] == 0 else 1)) for a0 in (0, 1)]
        assert sorted(returns) == [-1.0, 1.0]
        assert np.mean(returns) == env.random_return() == 0.0


@pytest.mark.parametrize("horizon", [1, 2, 7])
def test_key_door_returns(horizon: int) -> None:
    env = KeyDoorEnv(horizon=horizon, distractor_scale=0.0, key_cost=0.25)
    take = _episode(env, 0, lambda obs: 1)
    leave = _episode(env, 0, lambda obs: 0)
    if horizon == 1:
        assert take == [-0.25 + 1.0] and leave == [0.0]
    else:
        assert take == [-0.25] + [0.0] * (horizon - 2) + [1.0] and leave == [0.0] * horizon
    assert env.optimal_return() == sum(take) == 0.75
    assert env.random_return() == np.mean([sum(take), sum(leave)]) == 0.375


def test_key_door_observations() -> None:
    env = KeyDoorEnv(horizon=4, distractor_scale=0.0)
    assert env.reset(seed=0)[0].tolist() == [1.0, 1, 0, 0]
    assert [env.step(a)[0].tolist() for a in (1, 0, 0, 0)] == [
        [0.75, 0, 1, 0],
        [0.5, 0, 1, 0],
        [0.25, 0, 1, 1],  # the door step comes next
        [0.0, 0, 1, 0],
    ]
    env.reset(seed=0)
    assert env.step(0)[0].tolist() == [0.75, 0, 0, 0]
    assert env.step(1)[0].tolist() == [0.5, 0, 0, 0], "the key is only there at the first step"


def test_a_key_dearer_than_the_door_is_best_left() -> None:
    env = KeyDoorEnv(key_cost=1.5)
    assert env.optimal_return() == 0.0 and env.random_return() == -0.25


@pytest.mark.parametrize("env_id", [CHAIN, KEY_DOOR])
def test_distractors_are_signs_independent_of_the_actions(env_id: str) -> None:
    env = gym.make(env_id, horizon=40, distractor_scale=0.5)
    rng = np.random.default_rng(0)
    first = _episode(env, 4, lambda obs: 1)
    second = _episode(env, 4, lambda obs: 0 if obs[0] == 1 else int(rng.integers(2)))  # a_0 = 0, then random
    middle = np.array(first[1:-1])  # (38,) distractors only, in both tasks
    assert set(np.abs(middle)) == {0.5} and 5 < (middle > 0).sum() < 33
    assert first[1:-1] == second[1:-1], "the distractors do not depend on the actions after the first"
    # No distractor on the final step, nor on KeyDoor's key step; Chain's first step has one.
    if env_id == CHAIN:
        assert abs(first[0]) == 0.5 and abs(first[-1]) == 1.0
    else:
        assert first[0] == -0.1 and second[0] == 0.0 and first[-1] == 1.0 and second[-1] == 0.0


@pytest.mark.parametrize("env_id", [CHAIN, KEY_DOOR])
def test_uniform_random_policy_mean_return(env_id: str) -> None:
    """Monte Carlo with distractors on: 400 episodes, SE ≤ √(1 + 9·0.05²)/20 ≈ 0.05; 4 SE = 0.2."""
    env = gym.make(env_id, horizon=10)
    rng = np.random.default_rng(1)
    returns = [sum(_episode(env, seed, lambda obs: int(rng.integers(2)))) for seed in range(400)]
    random_return, _ = reference_returns(env_id)
    assert abs(np.mean(returns) - random_return) < 0.2


# ── horizon, checks, registration ────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("env_id", [CHAIN, KEY_DOOR])
@pytest.mark.parametrize("horizon", [10, 100, 1000])
def test_horizon_sets_the_episode_length(env_id: str, horizon: int) -> None:
    assert len(_episode(gym.make(env_id, horizon=horizon), 0, lambda obs: 0)) == horizon
    env = gym.make_vec(env_id, num_envs=2, vectorization_mode="vector_entry_point", horizon=horizon)
    env.reset(seed=0)
    for t in range(1, horizon + 1):
        _, _, terminated, truncated, _ = env.step(np.zeros(2, np.int64))
        assert terminated.all() == (t == horizon) and not truncated.any()


def test_registration_is_idempotent() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tasks.register()
    spec = gym.spec(CHAIN)
    # Import paths, as gymnasium's own ids: the spec serialises. The env checkers: tests/test_envs.py.
    assert spec.entry_point == "envs.tasks:ChainEnv" and spec.vector_entry_point == "envs.tasks:ChainVectorEnv"
    assert spec.max_episode_steps is None


@pytest.mark.parametrize(
    "make",
    [
        lambda: ChainEnv(horizon=0),
        lambda: ChainEnv(horizon=2.5),
        lambda: ChainEnv(distractor_scale=-0.1),
        lambda: KeyDoorEnv(key_cost=float("nan")),
        lambda: KeyDoorVectorEnv(2, horizon=0),
    ],
)
def test_bad_settings_are_refused(make: Callable[[], object]) -> None:
    with pytest.raises(BadInput, match=r">= 1|>= 0"):
        make()


# ── vector envs ──────────────────────────────────────────────────────────────────────────────────


def test_next_step_autoreset() -> None:
    """H = 3: the 3rd step ends with the final obs and reward; the 4th ignores its action and restarts."""
    env = KeyDoorVectorEnv(2, horizon=3, distractor_scale=0.0, key_cost=0.5)
    obs, _ = env.reset(seed=0)
    assert obs.tolist() == [[1, 1, 0, 0]] * 2
    take = np.array([1, 0])
    rewards = [env.step(take)[1].tolist() for _ in range(2)]
    assert rewards == [[-0.5, 0.0], [0.0, 0.0]]
    obs, reward, terminated, truncated, _ = env.step(take)
    assert obs.tolist() == [[0, 0, 1, 0], [0, 0, 0, 0]] and reward.tolist() == [1.0, 0.0]
    assert terminated.tolist() == [True, True] and not truncated.any()
    obs, reward, terminated, truncated, _ = env.step(take)  # the action is ignored: no key is taken
    assert obs.tolist() == [[1, 1, 0, 0]] * 2 and reward.tolist() == [0.0, 0.0]
    assert not terminated.any() and not truncated.any()
    assert env.step(take)[1].tolist() == [-0.5, 0.0], "the new episode's key step"


@pytest.mark.parametrize(("env_id", "make"), [(CHAIN, ChainEnv), (KEY_DOOR, KeyDoorEnv)])
def test_vector_sub_env_equals_the_single_env(env_id: str, make: Callable[..., gym.Env]) -> None:
    """Same seed and actions over 3 episodes (2 autoresets): same observations and rewards."""
    horizon, steps = 6, 20
    vector = gym.make_vec(env_id, num_envs=3, vectorization_mode="vector_entry_point", horizon=horizon)
    actions = np.random.default_rng(0).integers(2, size=(steps, 3))  # (T, N)
    vec_obs, _ = vector.reset(seed=[11, 30, 7])
    vec_obs, vec_rewards = [vec_obs], []
    for t in range(steps):
        obs, reward, *_ = vector.step(actions[t])
        vec_obs.append(obs), vec_rewards.append(reward)
    for i, seed in enumerate([11, 30, 7]):
        single = make(horizon=horizon)
        obs, _ = single.reset(seed=seed)
        want_obs, want_rewards = [obs], []
        for t in range(steps):
            if t % (horizon + 1) == horizon:  # the vector's autoreset step: a seedless reset
                obs, reward = single.reset()[0], 0.0
            else:
                obs, reward, *_ = single.step(actions[t, i])
            want_obs.append(obs), want_rewards.append(reward)
        assert np.array_equal(np.stack(vec_obs)[:, i], np.stack(want_obs))
        assert np.array_equal(np.stack(vec_rewards)[:, i], np.array(want_rewards))


def test_vector_seeds() -> None:
    """An int seeds sub-env i with seed + i, a list with seeds[i]; None keeps each generator."""
    env = ChainVectorEnv(4, horizon=2, distractor_scale=1.0)
    single = ChainEnv(horizon=2, distractor_scale=1.0)
    cues = [single.reset(seed=s)[0][1] for s in range(40)]
    obs, _ = env.reset(seed=10)
    assert obs[:, 1].tolist() == cues[10:14]
    obs, _ = env.reset(seed=[3, 0, 21, 8])
    assert obs[:, 1].tolist() == [cues[3], cues[0], cues[21], cues[8]]
    with pytest.raises(ValueError, match="4 seeds"):
        env.reset(seed=[1, 2])
    single.reset(seed=3)
    want_rewards = [single.step(0)[1], single.step(0)[1]]  # a distractor, then the final reward
    want_cue = single.reset()[0][1]  # seedless: drawn from where the episode left the generator
    env.reset(seed=[3, 0, 21, 8])
    assert [env.step(np.zeros(4, np.int64))[1][0] for _ in range(2)] == want_rewards
    assert env.reset()[0][0, 1] == want_cue


def test_vector_state_round_trip() -> None:
    env, other = KeyDoorVectorEnv(3, horizon=4), KeyDoorVectorEnv(3, horizon=4)
    env.reset(seed=0), other.reset(seed=9)
    actions = np.random.default_rng(1).integers(2, size=(12, 3))  # (T, N)
    for a in actions[:5]:
        env.step(a)
    state = env.get_state()
    want = [env.step(a)[:3] for a in actions[5:]]
    other.set_state(state)
    for (obs, reward, term), (obs_w, reward_w, term_w) in zip([other.step(a)[:3] for a in actions[5:]], want):
        assert np.array_equal(obs, obs_w) and np.array_equal(reward, reward_w) and np.array_equal(term, term_w)


def test_make_vector_is_native_with_the_tasks_kwargs() -> None:
    env = make_vector(CHAIN, 4, EnvOptions(), horizon=30)
    assert type(env.unwrapped) is ChainVectorEnv and env.unwrapped.horizon == 30
    env.reset(seed=0)
    for t in range(1, 31):
        _, _, terminated, _, info = env.step(np.zeros(4, np.int64))
        assert terminated.all() == (t == 30)
    assert info["episode"]["l"].tolist() == [30] * 4
    env.close()
    limited = make_vector(CHAIN, 2, EnvOptions(), horizon=30, max_episode_steps=10)
    assert type(limited.unwrapped).__name__ == "SyncVectorEnv", "a time limit needs the TimeLimit wrapper"
    limited.close()


# ── snapshot, episode limits, reference returns ──────────────────────────────────────────────────


@pytest.mark.parametrize("env_id", [CHAIN, KEY_DOOR])
def test_snapshot_mid_episode_replays_exactly(env_id: str) -> None:
    """Snapshot at t = 4 of H = 10, replay 25 steps (crossing two resets): same obs and rewards."""
    env, fresh = gym.make(env_id, horizon=10), gym.make(env_id, horizon=10)
    env.reset(seed=2)
    for a in (1, 0, 0, 1):
        env.step(a)
    assert is_restorable(env)
    state = snapshot(env)
    assert state["kind"] == "task" and state["task"]["t"] == 4
    actions = np.random.default_rng(0).integers(2, size=25)

    def replay(e: gym.Env) -> list[tuple[list[float], float]]:
        out = []
        for a in actions:
            obs, reward, terminated, _, _ = e.step(a)
            out.append((obs.tolist(), reward))
            if terminated:
                out.append((e.reset()[0].tolist(), 0.0))  # a seedless reset draws from the restored RNG
        return out

    want = replay(env)
    assert len({r for _, r in want}) > 2, "distractors are on"
    fresh.reset(seed=77)
    restore(fresh, state)
    assert replay(fresh) == want


def test_episode_limit() -> None:
    assert episode_limit(CHAIN, horizon=50) == 50
    assert episode_limit(KEY_DOOR, horizon=50, max_episode_steps=20) == 20
    assert episode_limit(KEY_DOOR, horizon=50, max_episode_steps=100) == 50
    assert episode_limit(CHAIN) == 100
    assert episode_limit("CartPole-v1") == 500
    assert episode_limit("CartPole-v1", max_episode_steps=30) == 30
    assert episode_limit("testbed-toy/Unlimited-v0") is None


def test_reference_returns() -> None:
    assert reference_returns(CHAIN, horizon=10) == (0.0, 1.0)
    assert reference_returns(KEY_DOOR) == (0.45, 0.9)
    assert reference_returns(KEY_DOOR, key_cost=0.25) == (0.375, 0.75)
    assert reference_returns("CartPole-v1") is None
