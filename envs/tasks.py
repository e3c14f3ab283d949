"""Two synthetic long-horizon tasks for credit assignment: Chain and KeyDoor, registered as ``testbed/…``.

Both last exactly ``horizon`` steps and end with ``terminated`` (no time limit is needed). Only the first
action matters, and its effect shows in the reward of the final step, H steps later: the credit must be
carried across the whole episode. Time steps are t = 0, …, H−1 (the action taken at t earns r_t); the
observation before the action at t shows the time left 1 − t/H, so every observation is Markov.

Distractors: at the steps in between, r_t = σ·ξ_t with ξ_t uniform on {−1, +1} from the env's
``np_random`` (σ = ``distractor_scale``). They are zero-mean and independent of the actions, so they add
variance to every return without changing any policy's expected return.

- **Chain** (in the spirit of bsuite's umbrella length). At reset a cue x ∈ {0, 1} is drawn uniformly.
  The first action is right iff a_0 = x; the final step pays r_{H−1} = +1 if right, else −1. Observation:
  [1 − t/H, 2x − 1, decided, outcome] with decided = 1 after the first action (else 0) and outcome = +1
  right, −1 wrong (0 before the first action). Distractors at 0 ≤ t < H−1. E[G] optimal +1, random 0.
- **KeyDoor** (key-to-door). The first step is the key phase: a_0 = 1 takes the key at an immediate cost,
  r_0 = −c (c = ``key_cost``, no distractor); a_0 = 0 gives r_0 = 0. The final step opens the door:
  r_{H−1} += 1 if the key was taken. Later actions do nothing. Observation: [1 − t/H, key_phase (t = 0),
  has_key, door_phase (t = H−1)]. Distractors at 0 < t < H−1. E[G] optimal max(1 − c, 0), uniformly
  random ½(1 − c), never taking the key 0. With H = 1 the key step is the door step: r_0 = 1 − c if taken.

The dynamics are batched numpy functions over arrays of shape (N,), shared by the single envs (N = 1,
driven by the env's ``np_random``) and the native vector envs (one generator per sub-env, seeded as a
single env would be), so a single env and a vector sub-env with the same seed and actions agree exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from envs.errors import BadInput

State = dict[str, np.ndarray]
"""A batch of task states: name → int64 array of shape (N,); always holds ``t``, the steps taken."""

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACTION_SPACE = gym.spaces.Discrete(2)


class Task(NamedTuple):
    """The batched dynamics of one task; ``act`` updates the state in place except ``t``."""

    start: Callable[[Sequence[np.random.Generator]], State]
    """The state at reset, drawing from each sub-env's generator."""
    act: Callable[[State, np.ndarray, int, dict[str, float]], np.ndarray]
    """(state, actions (N,), H, params) → the reward of step t without distractors, (N,)."""
    observe: Callable[[State, int], np.ndarray]
    """(state, H) → observations, (N, 4) float32."""
    distracts: Callable[[np.ndarray, int], np.ndarray]
    """(t (N,), H) → whether step t pays a distractor, (N,) bool."""


def _coin(rng: np.random.Generator) -> bool:
    """One fair coin flip: the only way either task draws randomness (cheaper than ``integers``)."""
    return bool(rng.random() < 0.5)


def _time_left(t: np.ndarray, horizon: int) -> np.ndarray:
    return 1.0 - t / horizon  # (N,)


# ── Chain ────────────────────────────────────────────────────────────────────────────────────────


def _chain_start(rngs: Sequence[np.random.Generator]) -> State:
    n = len(rngs)
    cue = np.array([_coin(rng) for rng in rngs], dtype=np.int64)  # (N,) x ∈ {0, 1}
    return {"t": np.zeros(n, np.int64), "cue": cue, "outcome": np.zeros(n, np.int64)}  # (N,) each


def _chain_act(state: State, actions: np.ndarray, horizon: int, params: dict[str, float]) -> np.ndarray:
    """r_t = o·[t = H−1], where o = +1 if a_0 = x else −1 is set at t = 0 (0 before)."""
    t = state["t"]
    right = np.where(actions == state["cue"], 1, -1)  # (N,)
    state["outcome"] = np.where(t == 0, right, state["outcome"])
    return np.where(t == horizon - 1, state["outcome"], 0).astype(np.float64)  # (N,)


def _chain_observe(state: State, horizon: int) -> np.ndarray:
    outcome = state["outcome"]
    columns = (_time_left(state["t"], horizon), 2 * state["cue"] - 1, outcome != 0, outcome)
    return np.stack(columns, axis=1).astype(np.float32)  # (N, 4)


CHAIN = Task(_chain_start, _chain_act, _chain_observe, lambda t, horizon: t < horizon - 1)


# ── KeyDoor ──────────────────────────────────────────────────────────────────────────────────────


def _key_door_start(rngs: Sequence[np.random.Generator]) -> State:
    n = len(rngs)  # nothing random at reset
    return {"t": np.zeros(n, np.int64), "has_key": np.zeros(n, np.int64)}  # (N,) each


def _key_door_act(state: State, actions: np.ndarray, horizon: int, params: dict[str, float]) -> np.ndarray:
    """r_t = −c·[t = 0 ∧ a_0 = 1] + [t = H−1 ∧ has_key], with has_key set by a_0 = 1."""
    t = state["t"]
    takes = (t == 0) & (actions == 1)  # (N,)
    state["has_key"] = state["has_key"] | takes
    door = (t == horizon - 1) & (state["has_key"] == 1)  # (N,)
    return door.astype(np.float64) - params["key_cost"] * takes  # (N,)


def _key_door_observe(state: State, horizon: int) -> np.ndarray:
    t = state["t"]
    columns = (_time_left(t, horizon), t == 0, state["has_key"], t == horizon - 1)
    return np.stack(columns, axis=1).astype(np.float32)  # (N, 4)


KEY_DOOR = Task(_key_door_start, _key_door_act, _key_door_observe, lambda t, horizon: (t > 0) & (t < horizon - 1))


# ── shared by both tasks ─────────────────────────────────────────────────────────────────────────


def _check(horizon: int, distractor_scale: float, **costs: float) -> None:
    if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
        raise BadInput(f"horizon must be an integer number of steps >= 1, got {horizon!r}")
    for name, value in {"distractor_scale": distractor_scale, **costs}.items():
        if not (isinstance(value, (int, float, np.number)) and math.isfinite(value) and value >= 0):
            raise BadInput(f"{name} must be a finite number >= 0, got {value!r}")


def _advance(
    task: Task,
    state: State,
    actions: np.ndarray,
    rngs: Sequence[np.random.Generator],
    horizon: int,
    distractor_scale: float,
    params: dict[str, float],
) -> np.ndarray:
    """One step of every sub-env: r_t = task reward + σ·ξ_t where step t distracts; returns (N,).

    A sub-env awaiting its autoreset has t = H, where no task distracts: it leaves its RNG untouched.
    """
    t = state["t"]
    rewards = task.act(state, actions, horizon, params)  # (N,)
    for i in np.flatnonzero(task.distracts(t, horizon)):
        rewards[i] += distractor_scale * (1.0 if _coin(rngs[i]) else -1.0)
    state["t"] = t + 1
    return rewards


class _TaskEnv(gym.Env[np.ndarray, np.int64]):
    """One episode of a task; subclasses name the task and its parameters."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    task: ClassVar[Task]

    def __init__(self, horizon: int, distractor_scale: float, **params: float) -> None:
        _check(horizon, distractor_scale, **params)
        self.horizon, self.distractor_scale, self.params = int(horizon), float(distractor_scale), params
        self.observation_space, self.action_space = OBS_SPACE, ACTION_SPACE
        self._state: State | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._state = self.task.start([self.np_random])
        return self.task.observe(self._state, self.horizon)[0], {}

    def step(self, action: int | np.integer) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self._state is None:
            raise RuntimeError("call reset before step")
        actions = np.array([action], dtype=np.int64)  # (1,)
        args = (self.horizon, self.distractor_scale, self.params)
        reward = _advance(self.task, self._state, actions, [self.np_random], *args)
        terminated = bool(self._state["t"][0] >= self.horizon)
        return self.task.observe(self._state, self.horizon)[0], float(reward[0]), terminated, False, {}

    def get_state(self) -> dict[str, int]:
        """The task state after reset or a step (t and the cue, outcome or key), as plain ints."""
        if self._state is None:
            raise RuntimeError("call reset before get_state")
        return {name: int(value[0]) for name, value in self._state.items()}

    def set_state(self, state: dict[str, int]) -> None:
        """Set a state from :meth:`get_state` (the RNG is the caller's: see :mod:`envs.snapshot`)."""
        self._state = {name: np.array([value], dtype=np.int64) for name, value in state.items()}


class _TaskVectorEnv(VectorEnv):
    """N episodes of a task as numpy arrays, NEXT_STEP autoreset as gymnasium's CartPoleVectorEnv."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}
    task: ClassVar[Task]

    def __init__(
        self, num_envs: int, horizon: int, distractor_scale: float, render_mode: None = None, **params: float
    ) -> None:
        _check(horizon, distractor_scale, **params)
        if render_mode is not None:
            raise BadInput(f"the testbed's tasks do not render; got render_mode={render_mode!r}")
        self.num_envs, self.render_mode = num_envs, None
        self.horizon, self.distractor_scale, self.params = int(horizon), float(distractor_scale), params
        self.single_observation_space, self.single_action_space = OBS_SPACE, ACTION_SPACE
        self.observation_space = batch_space(OBS_SPACE, num_envs)
        self.action_space = batch_space(ACTION_SPACE, num_envs)
        self._rngs: list[np.random.Generator | None] = [None] * num_envs
        self._state: State | None = None
        self._autoreset = np.zeros(num_envs, bool)  # (N,) the sub-env ended last step: reset it now

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict]:
        """Sub-env i is seeded ``seed[i]`` (a list, as the testbed's runs reset it: ``agents.seeding``) or, as
        gymnasium's sync vector env does, ``seed + i`` (an int); None keeps its generator."""
        if isinstance(seed, (int, np.integer)):
            seed = [int(seed) + i for i in range(self.num_envs)]
        seeds = [None] * self.num_envs if seed is None else list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} seeds, got {len(seeds)}")
        for i, sub_seed in enumerate(seeds):
            if sub_seed is not None or self._rngs[i] is None:
                # As gym.Env.reset seeds its np_random, so a single env with this seed draws the same.
                self._rngs[i] = seeding.np_random(None if sub_seed is None else int(sub_seed))[0]
        self._state = self.task.start(self._rngs)
        self._autoreset[:] = False
        return self.task.observe(self._state, self.horizon), {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        if self._state is None:
            raise RuntimeError("call reset before step")
        actions = np.asarray(actions, dtype=np.int64)  # (N,)
        if actions.shape != (self.num_envs,):
            raise ValueError(f"expected actions of shape ({self.num_envs},), got {actions.shape}")
        resets = self._autoreset
        args = (self.horizon, self.distractor_scale, self.params)
        rewards = _advance(self.task, self._state, actions, self._rngs, *args)  # (N,)
        terminated = self._state["t"] >= self.horizon  # (N,)
        if resets.any():
            # The step after an episode's end ignores the action and starts the next episode.
            fresh = self.task.start([self._rngs[i] for i in np.flatnonzero(resets)])
            for name, value in fresh.items():
                self._state[name][resets] = value
            rewards[resets], terminated[resets] = 0.0, False
        self._autoreset = terminated.copy()
        truncated = np.zeros(self.num_envs, bool)  # (N,) the task ends itself
        return self.task.observe(self._state, self.horizon), rewards, terminated, truncated, {}

    def get_state(self) -> dict[str, Any]:
        """Task arrays, pending autoresets and every sub-env's RNG state, as plain data."""
        if self._state is None:
            raise RuntimeError("call reset before get_state")
        rngs = [rng.bit_generator.state for rng in self._rngs if rng is not None]
        state = {name: value.copy() for name, value in self._state.items()}
        return {"task": state, "autoreset": self._autoreset.copy(), "rngs": rngs}

    def set_state(self, state: dict[str, Any]) -> None:
        self._state = {name: np.array(value, dtype=np.int64) for name, value in state["task"].items()}
        self._autoreset = np.array(state["autoreset"], dtype=bool)
        self._rngs = [np.random.Generator(np.random.PCG64()) for _ in range(self.num_envs)]
        for rng, rng_state in zip(self._rngs, state["rngs"], strict=True):
            rng.bit_generator.state = rng_state


# ── the two tasks, single and vectorized ─────────────────────────────────────────────────────────


class ChainEnv(_TaskEnv):
    """Chain: the first action must match the cue; the answer comes at the final step (module docstring)."""

    task = CHAIN

    def __init__(self, horizon: int = 100, distractor_scale: float = 0.05) -> None:
        super().__init__(horizon, distractor_scale)

    def optimal_return(self) -> float:
        return 1.0

    def random_return(self) -> float:
        return 0.0  # ½·(+1) + ½·(−1)


class KeyDoorEnv(_TaskEnv):
    """KeyDoor: a costly key at the first step opens the door at the final step (module docstring)."""

    task = KEY_DOOR

    def __init__(self, horizon: int = 100, distractor_scale: float = 0.05, key_cost: float = 0.1) -> None:
        super().__init__(horizon, distractor_scale, key_cost=key_cost)

    def optimal_return(self) -> float:
        return max(1.0 - self.params["key_cost"], 0.0)  # a key dearer than the door is best left

    def random_return(self) -> float:
        return 0.5 * (1.0 - self.params["key_cost"])


class ChainVectorEnv(_TaskVectorEnv):
    task = CHAIN

    def __init__(
        self, num_envs: int = 1, horizon: int = 100, distractor_scale: float = 0.05, render_mode: None = None
    ) -> None:
        super().__init__(num_envs, horizon, distractor_scale, render_mode)


class KeyDoorVectorEnv(_TaskVectorEnv):
    task = KEY_DOOR

    def __init__(
        self,
        num_envs: int = 1,
        horizon: int = 100,
        distractor_scale: float = 0.05,
        key_cost: float = 0.1,
        render_mode: None = None,
    ) -> None:
        super().__init__(num_envs, horizon, distractor_scale, render_mode, key_cost=key_cost)


ENTRY_POINTS: dict[str, tuple[type[_TaskEnv], type[_TaskVectorEnv]]] = {
    "testbed/Chain-v0": (ChainEnv, ChainVectorEnv),
    "testbed/KeyDoor-v0": (KeyDoorEnv, KeyDoorVectorEnv),
}
TASK_IDS = tuple(ENTRY_POINTS)


def _import_path(cls: type) -> str:
    """``module:Class``, the form gymnasium's own envs register with."""
    return f"{cls.__module__}:{cls.__qualname__}"


def register() -> None:
    """Register the tasks with gymnasium (idempotent); importing :mod:`envs` calls it.

    Entry points are import paths, not the classes: a spec then serialises (``EnvSpec.to_json``) and a
    made env's ``spec`` recreates it in another process, as gymnasium's own ids do.
    """
    for env_id, (single, vector) in ENTRY_POINTS.items():
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=_import_path(single), vector_entry_point=_import_path(vector))


def reference_returns(env_id: str, **env_kwargs: Any) -> tuple[float, float] | None:
    """(random, optimal) expected returns of a testbed task built with ``env_kwargs``; None for other ids."""
    entry = ENTRY_POINTS.get(env_id.rpartition(":")[2])
    if entry is None:
        return None
    env = entry[0](**env_kwargs)
    return env.random_return(), env.optimal_return()


register()
