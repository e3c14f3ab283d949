"""Snapshot and restore of one running gymnasium environment, by direct state setting.

A snapshot is plain data (numbers, lists, dicts and numpy arrays), so checkpoints can store it and
load it back without unpickling code. Restoring a snapshot and taking the same actions gives the same
observations and rewards as the original environment did.

Supported families:
- MuJoCo (``gymnasium.envs.mujoco``): the full integration state (``mj_getState`` with
  ``mjSTATE_INTEGRATION``: time, qpos, qvel, act, warm-start accelerations, controls, mocap), the
  env's RNG and the time-limit counter.
- classic control with a ``state`` array (CartPole, Acrobot, MountainCar, Pendulum): the array, the
  post-termination counter, the RNG and the time-limit counter.
- tasks whose unwrapped env has ``get_state``/``set_state`` (the testbed's own, :mod:`envs.tasks`): that
  state, the RNG and the time-limit counter.
- bsuite's envs through Shimmy (:mod:`envs.bsuite`): every attribute of the bsuite env and its ``RandomState``
  (which stands in for the gymnasium RNG), and the time-limit counter.

For every kind, a :class:`envs.delay.DelayedReward` in the wrapper chain adds its buffered reward and its
steps since the last release. Anything else raises :class:`NotRestorable`, never a silently wrong state.
"""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np

from envs import bsuite
from envs.delay import DelayedReward
from envs.factory import wrapper_chain


class NotRestorable(RuntimeError):
    """The environment's state cannot be captured and set exactly."""


def _wrapper(env: gym.Env, kind: type) -> Any | None:
    """The outermost wrapper of type ``kind`` in the env's chain, or None."""
    return next((layer for layer in wrapper_chain(env) if isinstance(layer, kind)), None)


def _time_limits(env: gym.Env) -> list[gym.wrappers.TimeLimit]:
    """The env's time limits, outermost first: one where gym.make set it; a factory's env (``envs.custom``) may
    hold one of its own inside the one ``max_episode_steps`` adds."""
    return [layer for layer in wrapper_chain(env) if isinstance(layer, gym.wrappers.TimeLimit)]


def _is_mujoco(base: gym.Env) -> bool:
    return hasattr(base, "model") and hasattr(base, "data") and hasattr(base, "frame_skip")


def _is_classic(base: gym.Env) -> bool:
    # Only gymnasium's classic-control envs keep their whole dynamics state in `state` (set by their first
    # reset); other envs (CarRacing's rendered frame, say) use the name for something else.
    return type(base).__module__.startswith("gymnasium.envs.classic_control")


def _is_task(base: gym.Env) -> bool:
    return callable(getattr(base, "get_state", None)) and callable(getattr(base, "set_state", None))


def is_restorable(env: gym.Env) -> bool:
    """Whether :func:`snapshot` supports this environment."""
    base = env.unwrapped
    return _is_mujoco(base) or _is_classic(base) or _is_task(base) or bsuite.is_settable(base)


def snapshot(env: gym.Env) -> dict[str, Any]:
    """Capture everything that decides the env's next observations and rewards, as plain data."""
    base = env.unwrapped
    time_limits = _time_limits(env)
    delay: DelayedReward | None = _wrapper(env, DelayedReward)
    settable_bsuite = bsuite.is_settable(base)  # its RandomState is part of its own state
    state: dict[str, Any] = {
        "rng": None if settable_bsuite else copy.deepcopy(base.np_random.bit_generator.state),
        "elapsed_steps": time_limits[0]._elapsed_steps if time_limits else None,
        "delay": None if delay is None else {"buffered": delay.buffered, "since_release": delay.since_release},
    }
    if len(time_limits) > 1:
        state["inner_elapsed_steps"] = [limit._elapsed_steps for limit in time_limits[1:]]
    if _is_mujoco(base):
        import mujoco

        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        physics = np.empty(mujoco.mj_stateSize(base.model, spec), dtype=np.float64)
        mujoco.mj_getState(base.model, base.data, physics, spec)
        state["kind"] = "mujoco"
        state["physics"] = physics
    elif _is_classic(base):
        state["kind"] = "classic"
        state["state"] = np.array(base.state, copy=True)
        state["steps_beyond_terminated"] = getattr(base, "steps_beyond_terminated", None)
    elif _is_task(base):
        state["kind"] = "task"
        state["task"] = copy.deepcopy(base.get_state())
    elif settable_bsuite:
        state["kind"] = "bsuite"
        state["bsuite"] = bsuite.state(base)
    else:
        raise NotRestorable(
            f"{env.spec.id if env.spec else type(base).__name__} has no state that can be set directly; only MuJoCo, "
            "classic-control, bsuite and get_state/set_state environments are restorable by state"
        )
    return state


def restore(env: gym.Env, state: dict[str, Any]) -> None:
    """Set the env to a state taken by :func:`snapshot` on an env of the same id."""
    base = env.unwrapped
    delay: DelayedReward | None = _wrapper(env, DelayedReward)
    if (delay is None) != (state.get("delay") is None):
        # Restoring across the mismatch would drop or invent buffered rewards.
        raise NotRestorable("the snapshot and the env differ in having a DelayedReward wrapper")
    if state["rng"] is not None:
        base.np_random.bit_generator.state = copy.deepcopy(state["rng"])
    time_limits = _time_limits(env)
    if time_limits and state["elapsed_steps"] is not None:
        time_limits[0]._elapsed_steps = state["elapsed_steps"]
    for limit, elapsed in zip(time_limits[1:], state.get("inner_elapsed_steps") or [], strict=False):
        limit._elapsed_steps = elapsed
    if delay is not None:
        delay.buffered = float(state["delay"]["buffered"])
        delay.since_release = int(state["delay"]["since_release"])
    if state["kind"] == "mujoco":
        import mujoco

        if not _is_mujoco(base):
            raise NotRestorable("a MuJoCo snapshot cannot be restored into a non-MuJoCo env")
        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        mujoco.mj_setState(base.model, base.data, np.asarray(state["physics"], dtype=np.float64), spec)
        # Derived quantities (contacts, sensor data) follow from the integration state.
        mujoco.mj_forward(base.model, base.data)
    elif state["kind"] == "classic":
        base.state = np.array(state["state"], copy=True)
        if "steps_beyond_terminated" in state and hasattr(base, "steps_beyond_terminated"):
            base.steps_beyond_terminated = state["steps_beyond_terminated"]
    elif state["kind"] == "task":
        if not _is_task(base):
            raise NotRestorable("a task snapshot cannot be restored into an env without set_state")
        base.set_state(copy.deepcopy(state["task"]))
    elif state["kind"] == "bsuite":
        if not bsuite.is_settable(base):
            raise NotRestorable("a bsuite snapshot cannot be restored into another kind of env")
        bsuite.set_state(base, state["bsuite"])
    else:
        raise NotRestorable(f"unknown snapshot kind {state['kind']!r}")
