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

from envs.errors import BadInput
from envs.factory import find_wrapper
from envs.normalize import seed_statistics
from envs.snapshot import is_restorable, restore, snapshot


def _rms_state(rms: Any) -> dict[str, Any]:
    return {"mean": np.array(rms.mean, copy=True), "var": np.array(rms.var, copy=True), "count": float(rms.count)}


def _load_rms(rms: Any, state: dict[str, Any]) -> None:
    # The saved dtype, not the fresh statistics' own: gymnasium's running mean of float64 observations is
    # float64 after its first update even where the space says float32, and a cast would round it, so a
    # resumed run would normalize differently from one that never stopped.
    rms.mean = np.array(state["mean"], copy=True)
    rms.var = np.array(state["var"], copy=True)
    rms.count = float(state["count"])


def _seed_rows(env: VectorEnv, seed: int, seeds: int) -> slice:
    """Seed ``seed``'s sub-envs where ``seeds`` seeds share ``env``, N each (``EnvOptions.stacked_seeds``)."""
    n = env.num_envs // seeds
    return slice(seed * n, (seed + 1) * n)


def _put(owner: Any, name: str, rows: slice, saved: Any) -> None:
    """Write a saved per-sub-env array into ``owner.name``: a copy of it where it is the whole array, as
    saved (its own dtype), else into the seed's rows."""
    if rows == slice(0, len(getattr(owner, name))):
        setattr(owner, name, np.array(saved, copy=True))
    else:
        getattr(owner, name)[rows] = saved


def _stats(wrapper: Any, name: str, seed: int, seeds: int) -> Any:
    return seed_statistics(getattr(wrapper, name), seed if seeds > 1 else None)


def normalizer_state(env: VectorEnv, seed: int = 0, seeds: int = 1) -> dict[str, Any]:
    """Running statistics of observation and reward normalization (empty where there is none); seed
    ``seed``'s where ``seeds`` seeds share the env."""
    state: dict[str, Any] = {}
    obs_norm = find_wrapper(env, vector_wrappers.NormalizeObservation)
    if obs_norm is not None:
        state["obs_rms"] = _rms_state(_stats(obs_norm, "obs_rms", seed, seeds))
    reward_norm = find_wrapper(env, vector_wrappers.NormalizeReward)
    if reward_norm is not None:
        state["return_rms"] = _rms_state(_stats(reward_norm, "return_rms", seed, seeds))
    return state


def load_normalizer_state(env: VectorEnv, state: dict[str, Any], seed: int = 0, seeds: int = 1) -> None:
    """Load statistics saved by :func:`normalizer_state` (seed ``seed``'s where ``seeds`` seeds share the env);
    a mismatch in which normalizers exist is an error."""
    obs_norm = find_wrapper(env, vector_wrappers.NormalizeObservation)
    reward_norm = find_wrapper(env, vector_wrappers.NormalizeReward)
    if (obs_norm is not None) != ("obs_rms" in state) or (reward_norm is not None) != ("return_rms" in state):
        raise BadInput(
            "the checkpoint's normalizer statistics do not match the normalization settings of the run's config.yaml "
            "(normalize_obs, normalize_reward): restore the settings it was trained with"
        )
    if obs_norm is not None:
        _load_rms(_stats(obs_norm, "obs_rms", seed, seeds), state["obs_rms"])
    if reward_norm is not None:
        _load_rms(_stats(reward_norm, "return_rms", seed, seeds), state["return_rms"])


def freeze_normalizers(env: VectorEnv) -> None:
    """Stop updating the running statistics (evaluation uses the training statistics as they are)."""
    for kind in (vector_wrappers.NormalizeObservation, vector_wrappers.NormalizeReward):
        wrapper = find_wrapper(env, kind)
        if wrapper is not None:
            wrapper.update_running_mean = False


def _base_state(base: VectorEnv, rows: slice) -> dict[str, Any] | None:
    whole = rows == slice(0, base.num_envs)  # a native vector env is saved whole or not at all
    if isinstance(base, CartPoleVectorEnv) and whole:
        return {
            "kind": "cartpole_vector",
            "state": np.array(base.state, copy=True),
            "steps": np.array(base.steps, copy=True),
            "prev_done": np.array(base.prev_done, copy=True),
            "rng": copy.deepcopy(base.np_random.bit_generator.state),
        }
    if hasattr(base, "get_state") and hasattr(base, "set_state") and whole:  # the testbed's native task vector envs
        return {"kind": "native_task", "state": base.get_state()}
    if isinstance(base, SyncVectorEnv) and all(is_restorable(e) for e in base.envs):
        return {
            "kind": "sync",
            "envs": [snapshot(e) for e in base.envs[rows]],
            "autoreset_envs": np.array(base._autoreset_envs[rows], copy=True),
        }
    return None


def _load_base_state(base: VectorEnv, state: dict[str, Any], rows: slice) -> None:
    if state["kind"] == "cartpole_vector" and isinstance(base, CartPoleVectorEnv):
        base.state = np.array(state["state"], copy=True)
        base.steps = np.array(state["steps"], copy=True)
        base.prev_done = np.array(state["prev_done"], copy=True)
        base.np_random.bit_generator.state = copy.deepcopy(state["rng"])
    elif state["kind"] == "native_task" and hasattr(base, "set_state"):
        base.set_state(state["state"])
    elif state["kind"] == "sync" and isinstance(base, SyncVectorEnv):
        for sub_env, sub_state in zip(base.envs[rows], state["envs"], strict=True):
            restore(sub_env, sub_state)
        _put(base, "_autoreset_envs", rows, state["autoreset_envs"])
    else:
        raise ValueError(f"a {state['kind']} env state cannot be loaded into {type(base).__name__}")


def vector_env_state(env: VectorEnv, seed: int = 0, seeds: int = 1) -> dict[str, Any] | None:
    """Everything needed to continue this vector env exactly, or None where that is not supported; seed
    ``seed``'s sub-envs and statistics where ``seeds`` seeds share the env (``EnvOptions.stacked_seeds``),
    in the form a vector env of its own would give."""
    rows = _seed_rows(env, seed, seeds)
    base = _base_state(env.unwrapped, rows)
    if base is None:
        return None
    state: dict[str, Any] = {"base": base, "normalizers": normalizer_state(env, seed, seeds)}
    stats = find_wrapper(env, vector_wrappers.RecordEpisodeStatistics)
    state["episode_stats"] = {
        "returns": np.array(stats.episode_returns[rows], copy=True),
        "lengths": np.array(stats.episode_lengths[rows], copy=True),
        "prev_dones": np.array(stats.prev_dones[rows], copy=True),
    }
    reward_norm = find_wrapper(env, vector_wrappers.NormalizeReward)
    if reward_norm is not None:
        state["accumulated_reward"] = np.array(reward_norm.accumulated_reward[rows], copy=True)
        state["reward_prev_dones"] = np.array(reward_norm._prev_dones[rows], copy=True)
    return state


def load_vector_env_state(env: VectorEnv, state: dict[str, Any], seed: int = 0, seeds: int = 1) -> None:
    """Put an env made with the same id and options back into a state from :func:`vector_env_state` (seed
    ``seed``'s part where ``seeds`` seeds share the env)."""
    rows = _seed_rows(env, seed, seeds)
    _load_base_state(env.unwrapped, state["base"], rows)
    load_normalizer_state(env, state["normalizers"], seed, seeds)
    stats = find_wrapper(env, vector_wrappers.RecordEpisodeStatistics)
    for name, key in (("episode_returns", "returns"), ("episode_lengths", "lengths"), ("prev_dones", "prev_dones")):
        _put(stats, name, rows, state["episode_stats"][key])
    reward_norm = find_wrapper(env, vector_wrappers.NormalizeReward)
    if reward_norm is not None:
        _put(reward_norm, "accumulated_reward", rows, state["accumulated_reward"])
        _put(reward_norm, "_prev_dones", rows, state["reward_prev_dones"])
