"""Stepping only the live members of a vector env (envs/members.py) and GRPO's step budget built on it:
an ended member takes no step, and no step of an ended member is counted."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium.wrappers import vector as vector_wrappers

from agents.networks import Actor, NetworkSpec
from agents.rollout import SegmentBuffers, collect_episodes
from envs import EnvOptions, make_vector
from envs.factory import find_wrapper
from envs.members import step_members
from envs.start_states import reset_groups


def cartpole_states(env) -> np.ndarray:
    return np.stack([np.array(sub.unwrapped.state) for sub in env.unwrapped.envs])


def test_sync_steps_only_live_members_and_normalizes_with_their_observations() -> None:
    env = make_vector("CartPole-v1", 4, EnvOptions(normalize_obs=True, vectorization="sync"))
    _obs, _ = env.reset(seed=[1, 2, 3, 4])
    before = cartpole_states(env)
    norm = find_wrapper(env, vector_wrappers.NormalizeObservation)
    count = norm.obs_rms.count
    live = np.array([True, False, True, False])
    result = step_members(env, np.array([1, 1, 0, 0]), live)
    after = cartpole_states(env)
    assert np.array_equal(after[~live], before[~live])  # not stepped
    assert not np.array_equal(after[live], before[live])
    assert result.idle_steps == 0
    assert norm.obs_rms.count == pytest.approx(count + 2)  # the two live observations only
    assert np.all(result.obs[~live] == 0) and np.all(result.rewards == np.array([1, 0, 1, 0]))
    # Same observations as the env's own step delivers, on an env in the same state.
    twin = make_vector("CartPole-v1", 4, EnvOptions(normalize_obs=True, vectorization="sync"))
    twin.reset(seed=[1, 2, 3, 4])
    find_wrapper(twin, vector_wrappers.NormalizeObservation).obs_rms = norm.obs_rms
    norm.update_running_mean = False
    expected = step_members(env, np.array([0, 0, 1, 1]), np.ones(4, dtype=bool)).obs
    find_wrapper(twin, vector_wrappers.NormalizeObservation).update_running_mean = False
    twin.step(np.array([1, 1, 0, 0]))
    np.testing.assert_allclose(expected[live], twin.step(np.array([0, 0, 1, 1]))[0][live], rtol=1e-6)
    env.close()
    twin.close()


def test_members_get_the_chain_s_reward_offset() -> None:
    env = make_vector("CartPole-v1", 3, EnvOptions(reward_offset=0.25, vectorization="sync"))
    env.reset(seed=[1, 2, 3])
    result = step_members(env, np.array([1, 0, 1]), np.array([True, False, True]))
    assert result.rewards.tolist() == [0.75, 0.0, 0.75]  # CartPole's 1 less 0.25; the ended member earns nothing
    env.close()


def test_async_steps_every_member_and_reports_the_ended_ones_as_idle() -> None:
    env = make_vector("CartPole-v1", 2, EnvOptions(vectorization="async"))
    env.reset(seed=[5, 6])
    result = step_members(env, np.array([0, 1]), np.array([True, False]))
    assert result.idle_steps == 1 and result.rewards[1] == 0 and not result.terminated[1]
    env.close()


def test_collection_counts_exactly_the_members_own_steps() -> None:
    torch.manual_seed(0)
    B, G, H = 2, 4, 500
    env = make_vector("CartPole-v1", B * G, EnvOptions(vectorization="sync"))
    actor = Actor(NetworkSpec(obs_dim=4, action_dim=2, continuous=False))
    buffers = SegmentBuffers(H, B * G, 4, (), True)
    first = reset_groups(env, [11, 12], G)
    episodes = collect_episodes(env, actor.act, np.asarray(first, dtype=np.float32), buffers)
    lengths = episodes.lengths
    assert lengths.min() < lengths.max()  # an untrained policy: lengths differ within the batch
    assert episodes.env_steps == int(lengths.sum()) and episodes.idle_steps == 0
    # Each sub-env's time limit counted exactly its member's steps: none was stepped after its episode ended.
    elapsed = [sub._elapsed_steps for sub in env.unwrapped.envs]
    assert elapsed == lengths.tolist()
    assert torch.all(episodes.terminated)  # CartPole's untrained episodes fall long before 500 steps
    env.close()
