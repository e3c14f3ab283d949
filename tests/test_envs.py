"""Tests for envs/factory.py and envs/vector_state.py: vectorization, NEXT_STEP autoreset, episode
statistics, action clipping, normalization, exact save/restore of a running vector env, and errors; and
every env and wrapper the testbed adds (its tasks, DelayedReward) against gymnasium's and SB3's env checkers
and recreation from its spec."""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.registration import EnvSpec
from gymnasium.utils.env_checker import check_env as gymnasium_check_env
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.wrappers import vector as vector_wrappers
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from envs import (
    BadInput,
    DelayedReward,
    EnvOptions,
    freeze_normalizers,
    load_normalizer_state,
    load_vector_env_state,
    make_vector,
    normalizer_state,
    vector_env_state,
)
from envs.factory import ClipAction, find_wrapper
from envs.normalize import FastRunningMeanStd, NormalizeObservation, SeedStatistics, batch_moments

# CartPole's termination thresholds (gymnasium's cartpole.py).
THETA_LIMIT = 12 * 2 * np.pi / 360  # ≈ 0.2095 rad
X_LIMIT = 2.4

BOTH_NORMS = EnvOptions(normalize_obs=True, normalize_reward=True)


@pytest.fixture
def closing() -> Iterator[list[VectorEnv]]:
    """Envs appended to this list are closed after the test, even when it fails."""
    envs: list[VectorEnv] = []
    yield envs
    for env in envs:
        env.close()


def _actions(env: VectorEnv, n: int, seed: int) -> list[Any]:
    """``n`` batched random actions, the same for every env built alike."""
    space = env.action_space
    space.seed(seed)
    return [space.sample() for _ in range(n)]


# ── vectorization and autoreset ──────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("vectorization", "kind"),
    [
        ("auto", "CartPoleVectorEnv"),
        ("native", "CartPoleVectorEnv"),
        ("sync", "SyncVectorEnv"),
        ("async", "AsyncVectorEnv"),
    ],
)
def test_vectorization_kind_and_autoreset_mode(vectorization: str, kind: str, closing: list[VectorEnv]) -> None:
    env = make_vector("CartPole-v1", 4, EnvOptions(vectorization=vectorization))  # type: ignore[arg-type]
    closing.append(env)
    assert type(env.unwrapped).__name__ == kind
    assert env.num_envs == 4
    assert env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    assert env.unwrapped.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 4)


def test_env_kwargs_fall_back_to_sync(closing: list[VectorEnv]) -> None:
    """``auto`` picks sync when kwargs are given (the native env takes few); the kwargs reach the env."""
    env = make_vector("Pendulum-v1", 2, g=5.0)
    closing.append(env)
    assert type(env.unwrapped).__name__ == "SyncVectorEnv"
    assert env.unwrapped.envs[0].unwrapped.g == 5.0


@pytest.mark.parametrize("vectorization", ["native", "sync", "async"])
def test_next_step_autoreset(vectorization: str, closing: list[VectorEnv]) -> None:
    """The terminating step returns the true final obs; the next step resets that sub-env with reward 0."""
    env = make_vector("CartPole-v1", 3, EnvOptions(vectorization=vectorization))  # type: ignore[arg-type]
    closing.append(env)
    env.reset(seed=1)
    push_right = np.ones(3, dtype=np.int64)
    for _ in range(100):
        obs, reward, terminated, truncated, _ = env.step(push_right)
        if terminated.any():
            break
    else:
        pytest.fail("pushing right always should end an episode within 100 steps")
    assert not truncated.any()
    done = np.flatnonzero(terminated)
    for i in done:
        x, _, theta, _ = obs[i]
        assert abs(theta) > THETA_LIMIT or abs(x) > X_LIMIT, f"sub-env {i}: {obs[i]} is not a terminal obs"
        assert reward[i] == 1.0

    obs, reward, terminated, truncated, _ = env.step(push_right)
    for i in done:
        assert reward[i] == 0.0
        assert not terminated[i] and not truncated[i]
        assert np.all(np.abs(obs[i]) <= 0.05), "the autoreset step returns a fresh start state"


# ── episode statistics ───────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("normalize_reward", [False, True])
def test_episode_statistics_are_raw_returns(normalize_reward: bool, closing: list[VectorEnv]) -> None:
    """info["episode"]["r"] is the sum of the raw rewards of the episode, even when rewards are scaled.

    A twin env without reward scaling, seeded and driven alike, provides the raw rewards.
    """
    n, steps = 2, 250
    env = make_vector("Pendulum-v1", n, EnvOptions(normalize_reward=normalize_reward), max_episode_steps=40)
    raw_env = make_vector("Pendulum-v1", n, max_episode_steps=40)
    closing += [env, raw_env]
    env.reset(seed=[5, 6])
    raw_env.reset(seed=[5, 6])
    running = np.zeros(n)  # (N,) raw return of the current episodes
    episodes_checked = 0
    prev_done = np.zeros(n, dtype=bool)
    for action in _actions(env, steps, seed=0):
        _, reward, terminated, truncated, info = env.step(action)
        _, raw_reward, raw_terminated, raw_truncated, _ = raw_env.step(action)
        assert np.array_equal(terminated, raw_terminated) and np.array_equal(truncated, raw_truncated)
        if normalize_reward and not prev_done.all():
            assert not np.allclose(reward[~prev_done], raw_reward[~prev_done]), "rewards should be scaled"
        running[prev_done] = 0.0  # the autoreset step is not part of any episode
        running[~prev_done] += raw_reward[~prev_done]
        done = terminated | truncated
        if done.any():
            assert np.array_equal(info["_episode"], done)
            for i in np.flatnonzero(done):
                assert info["episode"]["r"][i] == pytest.approx(running[i], rel=1e-9, abs=1e-9)
                assert info["episode"]["l"][i] == 40
                episodes_checked += 1
        else:
            assert "episode" not in info and "_episode" not in info
        prev_done = done
    assert episodes_checked == n * (steps // 41)


def test_episode_statistics_native_cartpole(closing: list[VectorEnv]) -> None:
    """CartPole pays 1 per step: the recorded return equals the recorded length, and the step count."""
    env = make_vector("CartPole-v1", 4, BOTH_NORMS)
    closing.append(env)
    env.reset(seed=0)
    lengths = np.zeros(4, dtype=int)
    prev_done = np.zeros(4, dtype=bool)
    ended = 0
    for action in _actions(env, 200, seed=1):
        _, _, terminated, truncated, info = env.step(action)
        lengths[prev_done] = 0
        lengths[~prev_done] += 1
        done = terminated | truncated
        for i in np.flatnonzero(done):
            assert info["_episode"][i]
            assert info["episode"]["r"][i] == lengths[i] == info["episode"]["l"][i]
            ended += 1
        prev_done = done
    assert ended >= 10


# ── action clipping ──────────────────────────────────────────────────────────────────────────────


def test_continuous_envs_clip_actions(closing: list[VectorEnv]) -> None:
    """A huge action acts like the bound of the action space (Pendulum)."""
    huge = make_vector("Pendulum-v1", 1)
    bound = make_vector("Pendulum-v1", 1)
    closing += [huge, bound]
    assert find_wrapper(huge, ClipAction) is not None
    high = bound.single_action_space.high
    huge.reset(seed=4)
    bound.reset(seed=4)
    for _ in range(20):
        obs_h, rew_h, *_ = huge.step(np.full((1, 1), 100.0, dtype=np.float32))
        obs_b, rew_b, *_ = bound.step(np.array([high], dtype=np.float32))
        assert np.array_equal(obs_h, obs_b) and np.array_equal(rew_h, rew_b)


def test_clipping_is_visible_where_the_env_does_not_clip(closing: list[VectorEnv]) -> None:
    """Pendulum clips torques itself; HalfCheetah's control cost would see an unclipped action."""
    huge = make_vector("HalfCheetah-v5", 1)
    bound = make_vector("HalfCheetah-v5", 1)
    closing += [huge, bound]
    huge.reset(seed=4)
    bound.reset(seed=4)
    space = bound.single_action_space
    action = np.linspace(-100, 100, 6, dtype=np.float32)[None]  # (1, act_dim), far outside [-1, 1]
    clipped = np.clip(action, space.low, space.high)
    for _ in range(5):
        obs_h, rew_h, *_ = huge.step(action)
        obs_b, rew_b, *_ = bound.step(clipped)
        assert np.array_equal(obs_h, obs_b) and np.array_equal(rew_h, rew_b)


def test_the_batch_clip_gives_gymnasium_s_actions_and_space(closing: list[VectorEnv]) -> None:
    ours = make_vector("HalfCheetah-v5", 3)
    theirs = vector_wrappers.ClipAction(gym.make_vec("HalfCheetah-v5", num_envs=3, vectorization_mode="sync"))
    closing += [ours, theirs]
    clip = find_wrapper(ours, ClipAction)
    assert clip.single_action_space == theirs.single_action_space and clip.action_space == theirs.action_space
    actions = np.random.default_rng(0).normal(0.0, 3.0, (3, 6))  # float64, as a policy might give them
    for batch in (actions, actions.astype(np.float32)):
        mine, gym_s = clip.actions(batch), theirs.actions(batch)
        assert mine.dtype == gym_s.dtype == np.float32 and np.array_equal(mine, gym_s)


def test_discrete_actions_are_not_clipped(closing: list[VectorEnv]) -> None:
    env = make_vector("CartPole-v1", 2)
    closing.append(env)
    assert find_wrapper(env, ClipAction) is None


# ── observation and reward normalization ─────────────────────────────────────────────────────────


def _warm_up(env: VectorEnv, steps: int, seed: int = 0) -> np.ndarray:
    """Reset and take random steps; return the observations, (steps, N, obs_dim)."""
    env.reset(seed=seed)
    return np.stack([env.step(a)[0] for a in _actions(env, steps, seed)])


def test_normalized_observations_have_zero_mean_unit_std(closing: list[VectorEnv]) -> None:
    env = make_vector("Pendulum-v1", 8, EnvOptions(normalize_obs=True))
    closing.append(env)
    obs = _warm_up(env, 300)[100:].reshape(-1, 3)  # (200 * 8, 3), after the statistics settle
    # Roughly: the pendulum's state distribution drifts, so the running statistics lag a little.
    assert np.all(np.abs(obs.mean(axis=0)) < 0.35), obs.mean(axis=0)
    assert np.all(np.abs(obs.std(axis=0) - 1) < 0.25), obs.std(axis=0)
    assert np.all(np.abs(obs) <= 10.0)


def test_normalized_observations_use_the_running_statistics(closing: list[VectorEnv]) -> None:
    """Exactly: obs = clip((raw - mean) / sqrt(var + 1e-8), ±clip_obs), checked against a raw twin env."""
    env = make_vector("Pendulum-v1", 2, EnvOptions(normalize_obs=True, clip_obs=1.5))
    raw_env = make_vector("Pendulum-v1", 2)
    closing += [env, raw_env]
    _warm_up(env, 50)
    freeze_normalizers(env)
    rms = normalizer_state(env)["obs_rms"]
    env.reset(seed=21)
    raw_env.reset(seed=21)
    for action in _actions(env, 20, seed=8):
        obs, raw = env.step(action)[0], raw_env.step(action)[0]
        want = np.clip((raw - rms["mean"]) / np.sqrt(rms["var"] + 1e-8), -1.5, 1.5)
        np.testing.assert_allclose(obs, want, rtol=1e-5, atol=1e-6)


def test_batch_moments_by_hand() -> None:
    """x = [[1, 10], [3, 10], [8, 10]]: x̄ = [4, 10], s² = [(9 + 1 + 16) / 3, 0] = [26/3, 0]."""
    mean, var = batch_moments(np.array([[1.0, 10.0], [3.0, 10.0], [8.0, 10.0]]))
    assert np.array_equal(mean, [4.0, 10.0]) and np.array_equal(var, [26 / 3, 0.0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1,), (7,), (1, 5), (9, 17)])
def test_batch_moments_are_numpy_s_bit_for_bit(dtype: type, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(sum(shape))
    for scale in (1e-3, 1.0, 1e4):
        x = (rng.standard_normal(shape) * scale + 300.0).astype(dtype)
        for ours, numpy_s in zip(batch_moments(x), (np.mean(x, axis=0), np.var(x, axis=0)), strict=True):
            assert type(ours) is type(numpy_s) and np.asarray(ours).dtype == np.asarray(numpy_s).dtype
            assert np.array_equal(ours, numpy_s)


def test_normalization_is_gymnasium_s_bit_for_bit(closing: list[VectorEnv]) -> None:
    """Our normalization wrappers, clips folded in, fed the same steps as gymnasium's wrappers with its clip
    wrappers on top, give the same observations, rewards and statistics, float for float, autoresets included."""
    normalized = vector_wrappers.NormalizeObservation(
        vector_wrappers.RecordEpisodeStatistics(
            gym.make_vec(
                "Pendulum-v1",
                num_envs=3,
                vectorization_mode="sync",
                max_episode_steps=30,
                vector_kwargs={"autoreset_mode": AutoresetMode.NEXT_STEP},
            )
        )
    )
    clipped = vector_wrappers.TransformObservation(normalized, lambda obs: np.clip(obs, -0.5, 0.5))
    theirs = vector_wrappers.ClipReward(vector_wrappers.NormalizeReward(clipped, gamma=0.9), -0.5, 0.5)
    ours = make_vector(
        "Pendulum-v1",
        3,
        EnvOptions(normalize_obs=True, normalize_reward=True, gamma=0.9, clip_obs=0.5, clip_reward=0.5),
        max_episode_steps=30,
    )
    closing += [theirs, ours]
    assert isinstance(find_wrapper(ours, vector_wrappers.NormalizeObservation), NormalizeObservation)
    ours.reset(seed=4)
    theirs.reset(seed=4)
    clipped_obs = clipped_rewards = 0
    for action in _actions(ours, 100, seed=5):  # three episodes of 30 steps and their autoresets
        obs, reward, *_ = ours.step(action)
        obs_g, reward_g, *_ = theirs.step(action)
        assert np.array_equal(obs, obs_g) and np.array_equal(reward, reward_g)
        clipped_obs += int(np.sum(np.abs(obs) == 0.5))
        clipped_rewards += int(np.sum(np.abs(reward) == 0.5))
    assert clipped_obs and clipped_rewards, "both clips should bite at ±0.5"
    for name, rms in normalizer_state(ours).items():
        gym_rms = normalized.obs_rms if name == "obs_rms" else theirs.env.return_rms
        assert np.array_equal(rms["mean"], gym_rms.mean) and np.array_equal(rms["var"], gym_rms.var)
        assert rms["count"] == gym_rms.count


@pytest.mark.parametrize("restart", ["terminated", "done"])
def test_the_scaled_return_restarts_at_terminations_or_at_every_episode_end(
    restart: str, closing: list[VectorEnv]
) -> None:
    """Reward 1 every step, episodes truncated after 3 steps, γ = 0.5: G = 1, 1.5, 1.75 in the first
    episode; after the time limit ``terminated`` carries G on (1.875, 1.9375, 1.96875) and ``done`` starts it
    again (1, 1.5, 1.75). The autoreset step between the episodes updates nothing."""
    env = make_vector(
        "tests.toy_envs:testbed-toy/ConstantReward-v0",
        1,
        EnvOptions(normalize_reward=True, gamma=0.5, reward_norm_restart=restart),
        max_episode_steps=3,
    )
    closing.append(env)
    norm = find_wrapper(env, vector_wrappers.NormalizeReward)
    env.reset(seed=0)
    for _ in range(7):  # two episodes and the autoreset step between them
        env.step(np.zeros(1, dtype=np.int64))
    first = [1.0, 1.5, 1.75]
    G = first + ([1.875, 1.9375, 1.96875] if restart == "terminated" else first)
    # Six updates: the running mean is the mean of the six returns (and RunningMeanStd's tiny prior count).
    assert norm.return_rms.count == pytest.approx(6, abs=1e-3)
    assert float(norm.return_rms.mean) == pytest.approx(sum(G) / 6, rel=1e-4)
    assert float(norm.return_rms.var) == pytest.approx(float(np.var(G)), rel=1e-3)
    assert norm.accumulated_reward[0] == (G[-1] if restart == "terminated" else 0.0)


def test_a_return_restarted_at_every_episode_end_scales_rewards_as_sb3s_vecnormalize() -> None:
    """With ``reward_norm_restart=done`` our scaled rewards are those of SB3's VecNormalize fed the same
    episodes (to float32 rounding: SB3's DummyVecEnv keeps rewards as float32); gymnasium's, which carries
    the return over a time limit, part from them after the first episode."""

    def sb3_env() -> VecNormalize:
        venv = DummyVecEnv([lambda: gym.make("Pendulum-v1", max_episode_steps=30)] * 3)
        venv.seed(4)
        return VecNormalize(venv, norm_obs=False, norm_reward=True, gamma=0.9, clip_reward=0.5)

    gaps = {}
    for restart in ("done", "terminated"):
        ours = make_vector(
            "Pendulum-v1",
            3,
            EnvOptions(normalize_reward=True, gamma=0.9, clip_reward=0.5, reward_norm_restart=restart),
            max_episode_steps=30,
        )
        theirs = sb3_env()
        ours.reset(seed=4)
        theirs.reset()
        gap, autoreset = [], False
        for action in _actions(ours, 100, seed=5):  # three episodes of 30 steps and their autoresets
            _, reward, terminated, truncated, _ = ours.step(action)
            if not autoreset:  # SB3 resets inside the episode's last step; it has no autoreset step
                gap.append(np.max(np.abs(reward - theirs.step(action)[1])))
            autoreset = bool(np.any(terminated | truncated))
        gaps[restart] = gap
        ours.close()
        theirs.close()
    assert len(gaps["done"]) == 3 * 30 + 7  # 100 steps less 3 autoreset steps: three episodes, the fourth's start
    assert max(gaps["done"]) < 1e-6
    assert max(gaps["terminated"][:30]) < 1e-6 and max(gaps["terminated"][30:]) > 1e-3


@pytest.mark.parametrize("N", [1, 3, 9])
def test_seed_statistics_are_each_seeds_own_statistics_bit_for_bit(N: int) -> None:
    """Three seeds' statistics in one SeedStatistics, updated with batches of 3·N rows (every row, and some
    rows only), are the floats of three FastRunningMeanStd each updated with its seed's rows."""
    rng = np.random.default_rng(N)
    for shape in [(5,), ()]:
        shared = SeedStatistics([FastRunningMeanStd(shape=shape) for _ in range(3)], N)
        own = [FastRunningMeanStd(shape=shape) for _ in range(3)]
        for step in range(20):
            x = rng.standard_normal((3 * N, *shape)) * rng.uniform(0.1, 100.0)
            rows = np.ones(3 * N, dtype=bool) if step % 2 else rng.random(3 * N) < 0.5
            shared.rows = rows
            shared.update(x[rows])
            for k, stats in enumerate(own):
                if rows[k * N : (k + 1) * N].any():
                    stats.update(x[k * N : (k + 1) * N][rows[k * N : (k + 1) * N]])
        for k, stats in enumerate(own):
            assert np.array_equal(shared.seeds[k].mean, stats.mean) and np.array_equal(shared.seeds[k].var, stats.var)
            assert shared.seeds[k].count == stats.count
        assert np.array_equal(shared.var[N : 2 * N], np.stack([own[1].var] * N))  # a row per sub-env, its seed's


def test_seeds_sharing_a_vector_env_step_as_in_envs_of_their_own(closing: list[VectorEnv]) -> None:
    """Two seeds' 2 sub-envs each in one vector env (stacked_seeds=2): every observation, reward, end and episode
    statistic is what each seed's own vector env gives, and so is each seed's saved state, which loads back."""
    options = EnvOptions(normalize_obs=True, normalize_reward=True, gamma=0.9)
    shared = make_vector("Pendulum-v1", 4, dataclasses.replace(options, stacked_seeds=2), max_episode_steps=30)
    own = [make_vector("Pendulum-v1", 2, options, max_episode_steps=30) for _ in range(2)]
    closing += [shared, *own]
    shared.reset(seed=[4, 5, 9, 10])
    own[0].reset(seed=4)
    own[1].reset(seed=9)
    actions = _actions(shared, 100, seed=5)  # three episodes of 30 steps and their autoresets
    for step, action in enumerate(actions):
        result = shared.step(action)
        for k, env in enumerate(own):
            rows = slice(2 * k, 2 * k + 2)
            theirs = env.step(action[rows])
            for ours, their in zip(result[:4], theirs[:4], strict=True):
                assert np.array_equal(ours[rows], their)
            if "_episode" in theirs[4]:
                assert np.array_equal(result[4]["episode"]["r"][rows], theirs[4]["episode"]["r"])
        if step == 44:  # mid-episode: seed 1's state as its own env's, and back into a shared env
            saved = vector_env_state(shared, 1, 2)
            expected = vector_env_state(own[1])
            assert saved is not None and expected is not None
            for name, stats in normalizer_state(shared, 1, 2).items():
                theirs_stats = normalizer_state(own[1])[name]
                assert all(np.array_equal(stats[key], theirs_stats[key]) for key in ("mean", "var", "count"))
            copy = make_vector("Pendulum-v1", 4, dataclasses.replace(options, stacked_seeds=2), max_episode_steps=30)
            closing.append(copy)
            copy.reset(seed=[0, 1, 2, 3])
            load_vector_env_state(copy, saved, 1, 2)
            obs_copy = copy.step(actions[45])[0][2:]
    assert np.array_equal(obs_copy, _replay(own[1], expected, actions[45][2:]))
    with pytest.raises(BadInput, match="cannot be split evenly"):
        make_vector("Pendulum-v1", 3, dataclasses.replace(options, stacked_seeds=2))


def _replay(env: VectorEnv, state: dict[str, Any], action: np.ndarray) -> np.ndarray:
    """The observations one step with ``action`` gives from ``state``, in ``env`` (which is left there)."""
    load_vector_env_state(env, state)
    return env.step(action)[0]


def test_normalized_observations_are_clipped(closing: list[VectorEnv]) -> None:
    env = make_vector("Pendulum-v1", 4, EnvOptions(normalize_obs=True, clip_obs=0.5))
    closing.append(env)
    obs = _warm_up(env, 100)
    assert np.all(np.abs(obs) <= 0.5)
    assert np.any(np.abs(obs) == 0.5), "some normalized observations should reach the bound"


def test_freeze_normalizers_stops_the_statistics(closing: list[VectorEnv]) -> None:
    env = make_vector("Pendulum-v1", 2, BOTH_NORMS)
    closing.append(env)
    _warm_up(env, 50)
    freeze_normalizers(env)
    frozen = normalizer_state(env)
    assert set(frozen) == {"obs_rms", "return_rms"}
    _warm_up(env, 50, seed=1)
    after = normalizer_state(env)
    for name in frozen:
        for key in ("mean", "var", "count"):
            assert np.array_equal(after[name][key], frozen[name][key]), f"{name}.{key} changed while frozen"


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "InvertedPendulum-v5"])  # float32 and float64 observations
def test_normalizer_state_round_trip(env_id: str, closing: list[VectorEnv]) -> None:
    """Loaded statistics equal the saved ones, dtype included, and a frozen copy normalizes exactly as the
    original. MuJoCo's float64 observations make the running mean float64 although the space says float32."""
    trained = make_vector(env_id, 2, BOTH_NORMS)
    fresh = make_vector(env_id, 2, BOTH_NORMS)
    closing += [trained, fresh]
    _warm_up(trained, 60)
    state = normalizer_state(trained)
    load_normalizer_state(fresh, state)
    loaded = normalizer_state(fresh)
    for name in state:
        for key in ("mean", "var"):
            assert loaded[name][key].dtype == state[name][key].dtype
            assert np.array_equal(loaded[name][key], state[name][key])
        assert loaded[name]["count"] == state[name]["count"]
    assert state["obs_rms"]["count"] > 100, "the statistics were updated during the warm-up"

    for env in (trained, fresh):
        freeze_normalizers(env)
    obs_t, _ = trained.reset(seed=[9, 10])
    obs_f, _ = fresh.reset(seed=[9, 10])
    assert np.array_equal(obs_t, obs_f)
    for action in _actions(trained, 20, seed=2):
        out_t, out_f = trained.step(action), fresh.step(action)
        assert np.array_equal(out_t[0], out_f[0]) and np.array_equal(out_t[1], out_f[1])


@pytest.mark.parametrize(
    "other",
    [EnvOptions(), EnvOptions(normalize_obs=True), EnvOptions(normalize_reward=True)],
    ids=["none", "obs-only", "reward-only"],
)
def test_loading_normalizers_into_other_settings_fails(other: EnvOptions, closing: list[VectorEnv]) -> None:
    source = make_vector("Pendulum-v1", 1, BOTH_NORMS)
    target = make_vector("Pendulum-v1", 1, other)
    closing += [source, target]
    with pytest.raises(ValueError, match="normalization settings"):
        load_normalizer_state(target, normalizer_state(source))


# ── exact save and restore of a running vector env ───────────────────────────────────────────────


def _options(vectorization: str) -> EnvOptions:
    """Both normalizers on, so their statistics are part of the state that must carry over."""
    return EnvOptions(vectorization=vectorization, normalize_obs=True, normalize_reward=True)  # type: ignore[arg-type]


def _run(env: VectorEnv, actions: list[Any]) -> dict[str, np.ndarray]:
    """Step through ``actions``; everything the env returns that must repeat, stacked over steps."""
    out: dict[str, list[Any]] = {k: [] for k in ("obs", "rewards", "terminated", "truncated", "episode_r", "episode_l")}
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        out["obs"].append(np.array(obs, copy=True))
        out["rewards"].append(np.array(reward, copy=True))
        out["terminated"].append(terminated.copy())
        out["truncated"].append(truncated.copy())
        episode = info.get("episode", {"r": np.zeros(env.num_envs), "l": np.zeros(env.num_envs, dtype=int)})
        out["episode_r"].append(np.array(episode["r"], copy=True))
        out["episode_l"].append(np.array(episode["l"], copy=True))
    return {k: np.stack(v) for k, v in out.items()}  # each (steps, N, ...)


def _checkpoint_round_trip(state: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    from agents import runlog

    runlog.save_checkpoint(tmp_path, {"algo": "test", "env_state": state})
    return runlog.load_checkpoint(tmp_path, {"algo": "test"})["env_state"]


@pytest.mark.parametrize(
    ("env_id", "num_envs", "vectorization", "env_kwargs", "warmup", "steps"),
    [
        # CartPole random episodes last ~20 steps: 200 steps cross many episode ends.
        ("CartPole-v1", 4, "native", {}, 30, 200),
        # Pendulum truncates at 200: the snapshot at 170 is followed by an autoreset.
        ("Pendulum-v1", 2, "sync", {}, 170, 50),
        # A short time limit (kwargs) so the 50 steps cross a truncation and an autoreset.
        ("HalfCheetah-v5", 2, "sync", {"max_episode_steps": 40}, 25, 50),
    ],
    ids=["cartpole-native", "pendulum-sync", "halfcheetah-sync"],
)
@pytest.mark.parametrize("via_checkpoint", [False, True], ids=["direct", "checkpoint"])
def test_vector_env_state_continues_exactly(
    env_id: str,
    num_envs: int,
    vectorization: str,
    env_kwargs: dict[str, Any],
    warmup: int,
    steps: int,
    via_checkpoint: bool,
    closing: list[VectorEnv],
    tmp_path: Path,
) -> None:
    original = make_vector(env_id, num_envs, _options(vectorization), **env_kwargs)
    restored = make_vector(env_id, num_envs, _options(vectorization), **env_kwargs)
    closing += [original, restored]
    original.reset(seed=0)
    for action in _actions(original, warmup, seed=3):
        original.step(action)
    state = vector_env_state(original)
    assert state is not None
    if via_checkpoint:
        state = _checkpoint_round_trip(state, tmp_path)

    # As agents.run_envs.restore_envs does: reset with some seed, then load.
    restored.reset(seed=1234)
    load_vector_env_state(restored, state)
    actions = _actions(original, steps, seed=4)
    want = _run(original, actions)
    got = _run(restored, actions)
    assert (want["terminated"] | want["truncated"]).any(), "the replayed window should cross an episode end"
    for key in ("obs", "rewards", "terminated", "truncated", "episode_r", "episode_l"):
        assert np.array_equal(got[key], want[key]), f"{key} differs after load_vector_env_state"


@pytest.mark.parametrize("vectorization", ["native", "sync"])
def test_vector_env_state_with_an_autoreset_pending(vectorization: str, closing: list[VectorEnv]) -> None:
    """A state taken right after an episode end continues with the autoreset step, as the original does."""
    original = make_vector("CartPole-v1", 3, _options(vectorization))
    restored = make_vector("CartPole-v1", 3, _options(vectorization))
    closing += [original, restored]
    original.reset(seed=7)
    for action in _actions(original, 200, seed=5):
        _, _, terminated, truncated, _ = original.step(action)
        if (terminated | truncated).any():
            break
    pending = terminated | truncated
    assert pending.any() and not pending.all()
    state = vector_env_state(original)
    restored.reset(seed=0)
    load_vector_env_state(restored, state)
    actions = _actions(original, 60, seed=6)
    want, got = _run(original, actions), _run(restored, actions)
    assert np.all(want["rewards"][0][pending] == 0.0), "the first step after the state is the autoreset step"
    for key in ("obs", "rewards", "terminated", "truncated", "episode_r", "episode_l"):
        assert np.array_equal(got[key], want[key]), f"{key} differs after load_vector_env_state"


@pytest.mark.parametrize(
    "env_id",
    ["LunarLander-v3", "CarRacing-v3"],
)
def test_vector_env_state_is_none_where_not_restorable(env_id: str, closing: list[VectorEnv]) -> None:
    env = make_vector(env_id, 2)
    closing.append(env)
    env.reset(seed=0)
    assert vector_env_state(env) is None


def test_vector_env_state_refuses_another_kind_of_env(closing: list[VectorEnv]) -> None:
    native = make_vector("CartPole-v1", 2, EnvOptions(vectorization="native"))
    sync = make_vector("CartPole-v1", 2, EnvOptions(vectorization="sync"))
    closing += [native, sync]
    native.reset(seed=0)
    sync.reset(seed=0)
    with pytest.raises(ValueError, match="cannot be loaded"):
        load_vector_env_state(sync, vector_env_state(native))


# ── observation spaces ───────────────────────────────────────────────────────────────────────────


def test_discrete_observations_become_one_hot_vectors(closing: list[VectorEnv]) -> None:
    env = make_vector("FrozenLake-v1", 3)
    closing.append(env)
    assert env.single_observation_space.shape == (16,)
    assert find_wrapper(env, vector_wrappers.FlattenObservation) is not None
    obs, _ = env.reset(seed=0)
    seen = [obs]
    for action in _actions(env, 30, seed=0):
        seen.append(env.step(action)[0])
    for batch in seen:
        assert batch.shape == (3, 16)
        as_float = batch.astype(np.float32)
        assert np.array_equal(as_float, batch), "one-hot values survive the cast to float32 exactly"
        assert set(np.unique(as_float)) <= {0.0, 1.0}
        assert np.array_equal(as_float.sum(axis=1), np.ones(3))
    assert np.array_equal(seen[0][:, 0], np.ones(3)), "FrozenLake starts in state 0"


# ── every env and wrapper the testbed adds, as users get them ────────────────────────────────────

WRAPPED_REMARK = ".*different from the unwrapped version"
"""gymnasium's checker remarks that an env is wrapped. Every env from ``gymnasium.make`` is (OrderEnforcing,
PassiveEnvChecker), and users get ours that way, so this one remark is no failure; every other warning is."""

# The wrapper goes around envs the checkers pass on their own: CartPole's unbounded observation space draws
# gymnasium's "-infinity" warning, a remark on CartPole, not on the wrapper.
USER_ENVS: dict[str, Callable[[list[VectorEnv]], gym.Env]] = {
    "Chain-v0": lambda closing: gym.make("testbed/Chain-v0"),
    "KeyDoor-v0, kwargs": lambda closing: gym.make("testbed/KeyDoor-v0", horizon=5, key_cost=0.25),
    "DelayedReward(MountainCar-v0, 3)": lambda closing: DelayedReward(gym.make("MountainCar-v0"), 3),
    "DelayedReward(Chain-v0, end)": lambda closing: DelayedReward(gym.make("testbed/Chain-v0", horizon=4), "end"),
    # A sub-env of a delayed vector env, as the factory builds it for training.
    "make_vector sub-env, reward_delay=4": lambda closing: _sub_env(
        closing, make_vector("Acrobot-v1", 2, EnvOptions(reward_delay=4))
    ),
}


def _sub_env(closing: list[VectorEnv], env: VectorEnv) -> gym.Env:
    closing.append(env)
    return env.unwrapped.envs[0]


def _rewards_until_done(env: gym.Env, seed: int, actions: list[int]) -> list[float]:
    """Rewards of ``actions`` after ``reset(seed)``, stopping at the episode's end (stepping past it warns)."""
    env.reset(seed=seed)
    rewards = []
    for action in actions:
        _, reward, terminated, truncated, _ = env.step(action)
        rewards.append(float(reward))
        if terminated or truncated:
            break
    return rewards


@pytest.mark.parametrize("name", list(USER_ENVS))
def test_env_passes_both_checkers_and_is_remade_from_its_spec(name: str, closing: list[VectorEnv]) -> None:
    env = USER_ENVS[name](closing)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=WRAPPED_REMARK)
        gymnasium_check_env(env, skip_render_check=True)  # its close check makes env.spec again
        sb3_check_env(env, warn=True)
        remade = gym.make(env.spec)
        try:
            assert remade.spec == env.spec
            assert EnvSpec.from_json(env.spec.to_json()) == env.spec, "the spec serialises, wrappers included"
            first, again = env.reset(seed=11)[0], remade.reset(seed=11)[0]
            assert np.array_equal(first, again) and first.dtype == again.dtype
            actions = [0, 1, 1, 0, 1, 0]
            rewards = _rewards_until_done(env, 11, actions)
            assert _rewards_until_done(remade, 11, actions) == rewards, "the same env, its delay included"
        finally:
            remade.close()
            env.close()


def test_a_remade_delayed_env_delays_as_the_original() -> None:
    """MountainCar pays −1 a step and lasts 200 steps: k = 3 releases −3 at steps 3 and 6."""
    env = DelayedReward(gym.make("MountainCar-v0"), 3)
    remade = gym.make(env.spec)
    assert isinstance(remade, DelayedReward) and remade.delay == 3
    assert env.spec.additional_wrappers[-1].kwargs == {"delay": 3}
    assert _rewards_until_done(remade, 11, [0, 1, 2, 0, 1, 2]) == [0.0, 0.0, -3.0, 0.0, 0.0, -3.0]
    env.close(), remade.close()


# ── errors ───────────────────────────────────────────────────────────────────────────────────────


def test_unknown_id_names_the_closest_ids() -> None:
    with pytest.raises(BadInput, match="CartPole-v1") as error:
        make_vector("CartPol-v1", 2)
    assert "'CartPol-v1'" in str(error.value)


FAKE_ID = "FakeBox2dTestEnv-v0"


@pytest.fixture
def fake_box2d_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A registered id whose entry point (a box2d-named module) raises DependencyNotInstalled."""
    (tmp_path / "fake_box2d_env.py").write_text(
        "import gymnasium\n\n"
        "def make(**kwargs):\n"
        "    raise gymnasium.error.DependencyNotInstalled('Box2D is not installed (fake)')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    gym.register(id=FAKE_ID, entry_point="fake_box2d_env:make")
    try:
        yield FAKE_ID
    finally:
        del gym.registry[FAKE_ID]
        sys.modules.pop("fake_box2d_env", None)


def test_missing_extra_says_what_to_install(fake_box2d_id: str) -> None:
    with pytest.raises(BadInput, match=r"pip install 'gymnasium\[box2d\]'") as error:
        make_vector(fake_box2d_id, 2)
    assert fake_box2d_id in str(error.value)


def test_bad_num_envs_and_vectorization() -> None:
    with pytest.raises(BadInput, match="num_envs"):
        make_vector("CartPole-v1", 0)
    with pytest.raises(BadInput, match="no native vectorized implementation"):
        make_vector("Pendulum-v1", 2, EnvOptions(vectorization="native"))
    with pytest.raises(BadInput, match="vectorization must be one of"):
        make_vector("CartPole-v1", 2, EnvOptions(vectorization="threads"))  # type: ignore[arg-type]


def test_a_reward_offset_shifts_every_training_reward_but_not_the_recorded_return() -> None:
    env = make_vector("CartPole-v1", 2, EnvOptions(reward_offset=1.0, vectorization="sync"))
    env.reset(seed=0)
    rewards, finished = [], []
    for _ in range(200):
        _, reward, _, _, info = env.step(np.zeros(2, dtype=np.int64))  # always left: falls fast
        rewards.append(reward)
        if "_episode" in info:
            finished += info["episode"]["r"][info["_episode"]].tolist()
    env.close()
    assert np.all(np.concatenate(rewards) == 0.0)  # CartPole's +1 per step, less the offset of 1
    assert finished and all(r >= 8 for r in finished)  # the episode statistics keep the env's own return
