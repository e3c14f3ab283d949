"""Stepping only some members of a vector env, below its wrappers.

A GRPO group runs until its longest episode ends. A vector env steps all its sub-envs together, so
members whose episode has ended would keep stepping (and autoresetting) for nothing. :func:`step_members`
steps only the live ones:

- ``SyncVectorEnv``: each live sub-env is stepped on its own; ended ones take no step at all.
- any other vector env (``AsyncVectorEnv``, a native vectorized env): skipping a sub-env is impossible,
  so every sub-env steps; the steps of ended members are returned apart, so that they are not counted.

Either way the vector env's wrappers see only the live members: actions go through the chain's action
transforms (``ClipAction``), observations through its observation transforms (``FlattenObservation``,
``NormalizeObservation`` whose running statistics are updated with the live members' observations only,
the clip ``TransformObservation``), and rewards through its reward offset (``RewardOffset``). Episode
statistics (``RecordEpisodeStatistics``) are bypassed: the caller sums rewards itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium.vector import SyncVectorEnv, VectorActionWrapper, VectorEnv, VectorObservationWrapper
from gymnasium.wrappers import vector as vector_wrappers
from gymnasium.wrappers.vector.vectorize_observation import VectorizeTransformObservation

from envs.factory import RewardOffset, find_wrapper, vector_layers


def observe(env: VectorEnv, raw_obs: np.ndarray, update: bool = False) -> np.ndarray:
    """Apply ``env``'s observation transforms to sub-env observations (K, ...) -> (K, obs_dim).

    The transforms are those of the wrapper chain, inner to outer: ``FlattenObservation``,
    ``NormalizeObservation`` (its statistics updated with these K rows only if ``update`` and the wrapper
    itself is updating), the clip ``TransformObservation``. K need not equal ``env.num_envs``. The dtype
    is the one the vector env delivers: float32 whenever observations are normalized, the env's own
    dtype otherwise.
    """
    obs: Any = np.asarray(raw_obs)
    for layer in reversed(vector_layers(env)):
        if isinstance(layer, vector_wrappers.NormalizeObservation):
            # The wrapper's own formula; with updates off, branching does not shift the statistics.
            updating = layer.update_running_mean
            layer.update_running_mean = updating and update
            try:
                obs = layer.observations(obs)
            finally:
                layer.update_running_mean = updating
        elif isinstance(layer, VectorizeTransformObservation):
            # Row by row with the single-env transform: the batched version writes into a buffer sized
            # for num_envs, and K may differ.
            obs = np.stack([np.asarray(layer.wrapper.observation(row)) for row in obs])
        elif isinstance(layer, vector_wrappers.TransformObservation):
            obs = layer.func(obs)
        elif isinstance(layer, VectorObservationWrapper):
            raise TypeError(f"observe does not know how to apply {type(layer).__name__} without side effects")
    if obs is raw_obs:
        obs = np.array(obs, copy=True)  # never hand back the caller's array as the env's output
    return obs  # (K, obs_dim)


def sub_env_actions(env: VectorEnv, actions: Any) -> Any:
    """The batch of actions after the chain's action transforms (ClipAction), as the sub-envs get them."""
    for layer in vector_layers(env):
        if isinstance(layer, VectorActionWrapper):
            actions = layer.actions(actions)
    return actions


def as_passed(action: np.ndarray) -> Any:
    """One sub-env's action as SyncVectorEnv passes it: a discrete action is a numpy scalar, not a 0-d array."""
    return action[()] if action.ndim == 0 else action


@dataclass
class MemberStep:
    """One step of the live members of an M-member vector env; rows of ended members are zero."""

    obs: np.ndarray  # (M, obs_dim)  as the vector env delivers them
    rewards: np.ndarray  # (M,) float32
    terminated: np.ndarray  # (M,) bool
    truncated: np.ndarray  # (M,) bool
    idle_steps: int  # steps the vector env gave ended members (0 for sync: they are not stepped)


def step_members(env: VectorEnv, actions: np.ndarray, live: np.ndarray) -> MemberStep:
    """Step the members where ``live`` (M,) is True with ``actions`` (M, ...); the others stay as they are.

    The sub-envs of a ``SyncVectorEnv`` are stepped one by one, so its bookkeeping (each sub-env's last
    observation and pending autoreset) is kept as its own ``step`` keeps it. Any other vector env steps
    every member; the ended members' rows are dropped and their steps reported as ``idle_steps``.
    """
    base = env.unwrapped
    M = env.num_envs
    index = np.flatnonzero(live)
    passed = np.asarray(sub_env_actions(env, actions))
    rewards = np.zeros(M, dtype=np.float32)  # (M,)
    terminated = np.zeros(M, dtype=bool)  # (M,)
    truncated = np.zeros(M, dtype=bool)  # (M,)
    if isinstance(base, SyncVectorEnv):
        raw = []
        for i in index:
            obs_i, reward, term, trunc, _ = base.envs[i].step(as_passed(passed[i]))
            base._env_obs[i] = obs_i
            base._autoreset_envs[i] = term or trunc
            raw.append(obs_i)
            rewards[i], terminated[i], truncated[i] = reward, term, trunc
        idle = 0
    else:
        all_obs, all_rewards, all_terminated, all_truncated, _ = base.step(passed)
        raw = [all_obs[i] for i in index]
        rewards[index], terminated[index], truncated[index] = (
            all_rewards[index],
            all_terminated[index],
            all_truncated[index],
        )
        idle = M - len(index)
    offset = find_wrapper(env, RewardOffset)  # the chain's reward transform, which stepping the sub-envs skips
    if offset is not None:
        rewards[index] -= offset.offset
    obs = np.zeros((M, *env.single_observation_space.shape), dtype=env.single_observation_space.dtype)  # (M, obs_dim)
    if len(index):
        obs[index] = observe(env, np.stack(raw), update=True)
    return MemberStep(obs, rewards, terminated, truncated, idle)
