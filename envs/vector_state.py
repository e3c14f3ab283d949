"""The running state of a vector env made by :func:`envs.factory.make_vector`, as plain data.

Two levels:
- the normalizer statistics, always saved in checkpoints and frozen at evaluation;
- the full state (normalizers, episode-statistics accumulators and every sub-env's physics), which
  makes a resumed run continue exactly. It exists for gymnasium's native CartPole and for ``sync``
  vectors of restorable envs (see :mod:`envs.snapshot`); for other envs it is ``None`` and a resumed run
  starts fresh episodes.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.vector import SyncVectorEnv, VectorEnv
from gymnasium.wrappers import vector as vector_wrappers

from envs.snapshot import is_restorable, restore, snapshot
from envs.errors import BadInput
from envs.factory import find_wrapper


def _rms_state(rms: Any) -> dict[str, Any]:
    return {"mean": np.array(rms.mean, copy=True), "var": np.array(rms.var, copy=True), "count": float(rms.count)}


def _load_rms(rms: Any, state: dict[str, Any]) -> None:
    # The saved dtype, not the fresh statistics' own: gymnasium's running mean of float64 observations is
    # float64 after its first update even where the space says float32, and a cast would round it, so a
    # resumed run would normalize differently from one that never stopped.
    rms.mean = np.array(state["mean"], copy=True)
    rms.var = np.array(state["var"], copy=True)
    rms.count = float(state["count"])


def normalizer_state(env: VectorEnv) -> dict[str, Any]:
    """Running statistics of observation and reward normalization (empty where there is none)."""
    state: dict[str, Any] = {}
    obs_norm = find_wrapper(env, vector_wrappers.NormalizeObservation)
    if obs_norm is not None:
        state["obs_rms"] = _rms_state(obs_norm.obs_rms)
    reward_norm = find_wrapper(env, vector_wrappers.NormalizeReward)
    if reward_norm is not None:
        state["return_rms"] = _rms_state(reward_norm.return_rms)
    return state


def load_normalizer_state(env: VectorEnv, state: dict[str, Any]) -> None:
    """Load statistics saved by :func:`normalizer_state`; a mismatch in which normalizers exist is an error."""
    obs_norm = find_wrapper(env, vector_wrappers.NormalizeObservation)
    reward_norm = find_wrapper(env, vector_wrappers.NormalizeReward)
    if (obs_norm is not None) != ("obs_rms" in state) or (reward_norm is not None) != ("return_rms" in state):
        raise BadInput("the checkpoint's normalizer statistics do not match the normalization settings of the run's "
                       "config.yaml (normalize_obs, normalize_reward): restore the settings it was trained with")
    if obs_norm is not None:
        _load_rms(obs_norm.obs_rms, state["obs_rms"])
    if reward_norm is not None:
        _load_rms(reward_norm.return_rms, state["return_rms"])


def freeze_normalizers(env: VectorEnv) -> None:
    """Stop updating the running statistics (evaluation uses the training statistics as they are)."""
    for kind in (vector_wrappers.NormalizeObservation, vector_wrappers.NormalizeReward):
        wrapper = find_wrapper(env, kind)
        if wrapper is not None:
            wrapper.update_running_mean = False


def _base_state(base: VectorEnv) -> dict[str, Any] | None:
    if isinstance(base, CartPoleVectorEnv):
        return {
            "kind": "cartpole_vector",
            "state": np.array(base.state, copy=True),
            "steps": np.array(base.steps, copy=True),
            "prev_done": np.array(base.prev_done, copy=True),
            "rng": copy.deepcopy(base.np_random.bit_generator.state),
        }
    if hasattr(base, "get_state") and hasattr(base, "set_state"):  # the testbed's native task vector envs
        return {"kind": "native_task", "state": base.get_state()}
    if isinstance(base, SyncVectorEnv) and all(is_restorable(e) for e in base.envs):
        return {
            "kind": "sync",
            "envs": [snapshot(e) for e in base.envs],
            "autoreset_envs": np.array(base._autoreset_envs, copy=True),
        }
    return None


def _load_base_state(base: VectorEnv, state: dict[str, Any]) -> None:
    if state["kind"] == "cartpole_vector" and isinstance(base, CartPoleVectorEnv):
        base.state = np.array(state["state"], copy=True)
        base.steps = np.array(state["steps"], copy=True)
        base.prev_done = np.array(state["prev_done"], copy=True)
        base.np_random.bit_generator.state = copy.deepcopy(state["rng"])
    elif state["kind"] == "native_task" and hasattr(base, "set_state"):
        base.set_state(state["state"])
    elif state["kind"] == "sync" and isinstance(base, SyncVectorEnv):
        for sub_env, sub_state in zip(base.envs, state["envs"], strict=True):
            restore(sub_env, sub_state)
        base._autoreset_envs = np.array(state["autoreset_envs"], copy=True)
    else:
        raise ValueError(f"a {state['kind']} env state cannot be loaded into {type(base).__name__}")


def vector_env_state(env: VectorEnv) -> dict[str, Any] | None:
    """Everything needed to continue this vector env exactly, or None where that is not supported."""
    base = _base_state(env.unwrapped)
    if base is None:
        return None
    state: dict[str, Any] = {"base": base, "normalizers": normalizer_state(env)}
    stats = find_wrapper(env, vector_wrappers.RecordEpisodeStatistics)
    state["episode_stats"] = {
        "returns": np.array(stats.episode_returns, copy=True),
        "lengths": np.array(stats.episode_lengths, copy=True),
        "prev_dones": np.array(stats.prev_dones, copy=True),
    }
    reward_norm = find_wrapper(env, vector_wrappers.NormalizeReward)
    if reward_norm is not None:
        state["accumulated_reward"] = np.array(reward_norm.accumulated_reward, copy=True)
        state["reward_prev_dones"] = np.array(reward_norm._prev_dones, copy=True)
    return state


def load_vector_env_state(env: VectorEnv, state: dict[str, Any]) -> None:
    """Put an env made with the same id and options back into a state from :func:`vector_env_state`."""
    _load_base_state(env.unwrapped, state["base"])
    load_normalizer_state(env, state["normalizers"])
    stats = find_wrapper(env, vector_wrappers.RecordEpisodeStatistics)
    stats.episode_returns = np.array(state["episode_stats"]["returns"], copy=True)
    stats.episode_lengths = np.array(state["episode_stats"]["lengths"], copy=True)
    stats.prev_dones = np.array(state["episode_stats"]["prev_dones"], copy=True)
    reward_norm = find_wrapper(env, vector_wrappers.NormalizeReward)
    if reward_norm is not None:
        reward_norm.accumulated_reward = np.array(state["accumulated_reward"], copy=True)
        reward_norm._prev_dones = np.array(state["reward_prev_dones"], copy=True)
