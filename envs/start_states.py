"""Shared start states for groups of sub-envs: same-seed resets, and branch points inside an episode.

A GRPO-style agent compares G members that start from one state. Its vector env holds B·G sub-envs;
member (b, g) is sub-env ``b·G + g``. Two ways to give a group one start:

- :func:`reset_groups`: every member of group b is reset with the same seed ``seeds[b]``.
- branch points: a trunk episode runs from a seed for some steps (:func:`run_trunks`), then every
  member of the group is put into exactly that state (:func:`branch_groups`):
  - ``direct``: reset with the trunk's seed, then set the state taken by :func:`envs.snapshot.snapshot`
    (classic control, MuJoCo);
  - ``replay``: reset with the trunk's seed and take the trunk's action prefix again (any deterministic
    env, e.g. Box2D). The replayed observation is compared bit for bit with the trunk's.

:func:`restore_mode` says which applies to an env id, and refuses envs that cannot be restored exactly:
a group whose members silently start from different states would make group-relative advantages noise.

Raw observations here are a sub-env's own observations (before the vector env's ``FlattenObservation``
and normalization); :func:`observe` turns them into what the vector env delivers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv, VectorEnv
from gymnasium.vector.utils import iterate
from gymnasium.wrappers import vector as vector_wrappers

from envs import snapshot
from envs.custom import SeedlessReset
from envs.errors import BadInput
from envs.factory import check_env_installed, find_wrapper, wrapper_chain
from envs.members import as_passed, observe, sub_env_actions
from envs.snapshot import NotRestorable

__all__ = [
    "BranchPoint",
    "NotRestorable",
    "RestoreMode",
    "branch_groups",
    "check_seeded_reset",
    "member_point",
    "observe",
    "reset_groups",
    "restore_mode",
    "run_trunks",
    "settable",
]

RestoreMode = Literal["direct", "replay"]

REPLAY_CHECK_STEPS = 200
"""Random steps :func:`restore_mode` takes in two envs to check that replay is exact."""


@dataclass
class BranchPoint:
    """A state inside a trunk episode, and what is needed to put another env of the same id into it."""

    seed: int
    """The trunk's reset seed."""
    actions: list[np.ndarray]
    """The action prefix taken since reset, as the sub-env received it (after the vector env's action
    clipping); 0-d arrays for discrete actions."""
    raw_obs: np.ndarray
    """The sub-env's own observation at the branch point (not normalized, not flattened)."""
    state: dict[str, Any] | None
    """:func:`envs.snapshot.snapshot` of the trunk sub-env there for mode ``direct``, else None."""
    prefix_return: float | None
    """Sum of the raw rewards along the prefix; None where it was not recorded exactly (a replay then checks
    the observation alone)."""


def _check_groups(env: VectorEnv, B: int, G: int) -> None:
    if G < 1:
        raise BadInput(f"group size G must be at least 1, got {G}")
    if env.num_envs != B * G:
        raise BadInput(f"{B} start states × G={G} members need {B * G} sub-envs, but the env has {env.num_envs}")


def reset_groups(env: VectorEnv, seeds: list[int], G: int) -> np.ndarray:
    """Reset member (b, g) with ``seeds[b]``; return the observations (B·G, obs_dim) as the env returns them.

    The seed goes in as the list ``[s0]*G + [s1]*G + ...``: gymnasium spreads a single int seed to
    ``seed + i``. Raises BadInput for an env that can't take a seed per sub-env (gymnasium's native
    CartPole vector env can't).
    """
    if not isinstance(env.unwrapped, SyncVectorEnv | AsyncVectorEnv):
        raise BadInput(
            f"{type(env.unwrapped).__name__} cannot reset its sub-envs with different seeds, which shared "
            "start states need; make the env with vectorization=sync"
        )
    _check_groups(env, len(seeds), G)
    obs, _ = env.reset(seed=[int(s) for s in seeds for _ in range(G)])
    return obs  # (B·G, obs_dim)


def _same(a: Any, b: Any) -> bool:
    """Bit-identical observations (arrays of the same shape and dtype, or dicts/tuples of them)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    a, b = np.asarray(a), np.asarray(b)
    floating = a.dtype.kind in "fc"
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=floating)


def _replay_differs(env_id: str, **env_kwargs: Any) -> str | None:
    """Drive two fresh envs with the same seeds and random actions; describe the first difference, if any."""
    first, second = gym.make(env_id, **env_kwargs), gym.make(env_id, **env_kwargs)
    try:
        seed = 0
        obs_1, _ = first.reset(seed=seed)
        obs_2, _ = second.reset(seed=seed)
        if not _same(obs_1, obs_2):
            return f"two resets with seed {seed} gave different observations"
        # The action sampler has its own fixed seed, so the check itself is reproducible.
        sampler = first.action_space
        sampler.seed(0)
        for t in range(REPLAY_CHECK_STEPS):
            action = sampler.sample()
            step_1, step_2 = first.step(action), second.step(action)
            for name, x, y in zip(("observation", "reward", "terminated", "truncated"), step_1[:4], step_2[:4]):
                if not _same(x, y):
                    return f"the same seed and actions gave a different {name} at step {t + 1}"
            if step_1[2] or step_1[3]:
                seed += 1
                obs_1, _ = first.reset(seed=seed)
                obs_2, _ = second.reset(seed=seed)
                if not _same(obs_1, obs_2):
                    return f"two resets with seed {seed} gave different observations"
        return None
    finally:
        first.close()
        second.close()


def check_seeded_reset(env_id: str, **env_kwargs: Any) -> None:
    """BadInput, in one line, for an env that cannot give a group one start state: one whose ``reset`` takes no
    seed (a factory's env, ``envs.custom.SeedlessReset``), or whose two resets with one seed differ."""
    check_env_installed(env_id)
    env = gym.make(env_id, **env_kwargs)
    try:
        if any(isinstance(layer, SeedlessReset) for layer in wrapper_chain(env)):  # its own reset takes no seed
            raise BadInput(
                f"{env_id}'s reset takes no seed, and GRPO starts a group's members from one state by resetting them "
                "with one seed: give it reset(self, *, seed=None, options=None) that calls super().reset(seed=seed)"
            )
        first, _ = env.reset(seed=0)
        second, _ = env.reset(seed=0)
        if not _same(first, second):
            raise BadInput(
                f"{env_id}'s reset ignores its seed (two resets with seed 0 gave different observations), and GRPO "
                "starts a group's members from one state by resetting them with one seed: draw the start from "
                "self.np_random after super().reset(seed=seed)"
            )
    finally:
        env.close()


def settable(env_id: str, **env_kwargs: Any) -> bool:
    """Whether a fresh ``gym.make(env_id, **env_kwargs)`` (after reset) is :func:`envs.snapshot.is_restorable`."""
    check_env_installed(env_id)
    env = gym.make(env_id, **env_kwargs)
    try:
        env.reset(seed=0)
        return snapshot.is_restorable(env)
    finally:
        env.close()


def restore_mode(env_id: str, **env_kwargs: Any) -> RestoreMode:
    """How branch points of ``env_id`` are restored exactly.

    ``direct`` if a fresh ``gym.make(env_id)`` (after reset) is :func:`envs.snapshot.is_restorable`;
    else ``replay`` if two fresh envs reset with the same seed and driven by the same 200 random actions
    (re-reset with the same new seed at each episode end) give bit-identical observations, rewards,
    terminated and truncated. Otherwise raises NotRestorable. ``env_kwargs`` go to ``gym.make``.
    """
    if settable(env_id, **env_kwargs):
        return "direct"
    difference = _replay_differs(env_id, **env_kwargs)
    if difference is not None:
        raise NotRestorable(
            f"{env_id} cannot be restored exactly: it has no settable state and is not deterministic "
            f"({difference}). Branching from the middle of an episode needs exact restores; "
            "use start_mode=reset"
        )
    return "replay"


def _check_mode(mode: str) -> None:
    if mode not in ("direct", "replay"):
        raise BadInput(f"restore mode must be 'direct' or 'replay' (see restore_mode), got {mode!r}")


def _sync_base(env: VectorEnv, what: str) -> SyncVectorEnv:
    base = env.unwrapped
    if not isinstance(base, SyncVectorEnv):
        raise BadInput(
            f"{what} needs direct access to each sub-env, which {type(base).__name__} does not give; "
            "make the env with vectorization=sync"
        )
    return base


def run_trunks(
    env: VectorEnv,
    seeds: list[int],
    depths: list[int],
    policy: Callable[[np.ndarray], np.ndarray],
    mode: RestoreMode,
) -> tuple[list[BranchPoint], int]:
    """Run one trunk episode per seed and take branch point b after ``depths[b]`` steps of sub-env b.

    ``env`` is a sync vector env with ``len(seeds)`` sub-envs and no normalization wrappers (the caller
    normalizes inside ``policy``, e.g. with :func:`observe` of the group env). Sub-env b is reset with
    ``seeds[b]`` and driven by ``policy(raw_obs (B, ...)) -> actions (B, ...)``, where raw_obs are the
    sub-envs' own observations (not flattened: (B, obs_dim) for Box observations). If sub-env b's
    episode ends at or before its ``depths[b]``-th step, its branch point is the reset state (no actions):
    an ended episode is no state to branch from. For mode ``direct`` the point holds a snapshot.

    Returns the points and the env steps taken: every sub-env step counts, also those after a sub-env
    reached its depth, because the vector env steps all sub-envs together.
    """
    base = _sync_base(env, "run_trunks")
    _check_mode(mode)
    B = len(seeds)
    if env.num_envs != B or len(depths) != B:
        raise BadInput(
            f"run_trunks needs one seed and one depth per sub-env: {env.num_envs} sub-envs, "
            f"{B} seeds, {len(depths)} depths"
        )
    if any(d < 0 for d in depths):
        raise BadInput(f"branch depths must be non-negative, got {depths}")
    for kind in (vector_wrappers.NormalizeObservation, vector_wrappers.NormalizeReward):
        if find_wrapper(env, kind) is not None:
            raise BadInput(
                f"the trunk env must be built without normalization ({kind.__name__} found): "
                "branch points hold raw observations and rewards"
            )
    if mode == "direct" and not all(snapshot.is_restorable(e) for e in base.envs):
        raise NotRestorable(
            f"{base.envs[0].spec.id if base.envs[0].spec else 'this env'} has no settable "
            "state; use restore mode 'replay'"
        )

    def point_here(b: int, actions: list[np.ndarray], prefix_return: float) -> BranchPoint:
        return BranchPoint(
            seed=int(seeds[b]),
            actions=actions,
            raw_obs=np.array(base._env_obs[b], copy=True),
            state=snapshot.snapshot(base.envs[b]) if mode == "direct" else None,
            prefix_return=prefix_return,
        )

    def raw_batch() -> np.ndarray:
        # The sub-envs' own observations, the kind `observe` takes, not the (maybe flattened) wrapper output.
        return np.stack([np.asarray(o) for o in base._env_obs])  # (B, ...)

    env.reset(seed=[int(s) for s in seeds])
    # The reset state is every trunk's fallback, so take it now, before any step moves it.
    points = [point_here(b, [], 0.0) for b in range(B)]
    prefixes: list[list[np.ndarray]] = [[] for _ in range(B)]
    returns = [0.0] * B
    pending = [depths[b] > 0 for b in range(B)]
    steps = 0
    while any(pending):
        actions = policy(raw_batch())  # (B, ...)
        # Record the actions as the sub-envs receive them (clipped), since a replay bypasses the wrappers.
        received = sub_env_actions(env, np.array(actions, copy=True))
        rows = [np.array(row, copy=True) for row in iterate(base.action_space, received)]
        _, rewards, terminated, truncated, _ = env.step(actions)
        steps += B
        for b in range(B):
            if not pending[b]:
                continue
            prefixes[b].append(rows[b])
            returns[b] += float(rewards[b])
            if terminated[b] or truncated[b]:
                pending[b] = False  # keep the reset state taken above
            elif len(prefixes[b]) == depths[b]:
                points[b] = point_here(b, prefixes[b], returns[b])
                pending[b] = False
    return points, steps


def member_point(env: VectorEnv, i: int, mode: RestoreMode = "direct") -> BranchPoint:
    """Sub-env i's current state as a branch point, for :func:`branch_groups` later.

    ``direct``: the point holds a snapshot (env state, RNG, time-limit counter, buffered delayed reward) and
    the sub-env's own observation; its reset seed is 0, since a direct restore overwrites all the reset
    sets. ``replay``: only the observation; the caller fills in the episode's reset seed and action prefix.
    """
    base = _sync_base(env, "member_point")
    _check_mode(mode)
    state = snapshot.snapshot(base.envs[i]) if mode == "direct" else None
    return BranchPoint(
        seed=0,
        actions=[],
        raw_obs=np.array(base._env_obs[i], copy=True),
        state=state,
        prefix_return=0.0 if mode == "direct" else None,
    )


def _clear_episode_bookkeeping(env: VectorEnv, base: SyncVectorEnv, members: np.ndarray) -> None:
    """Make the wrappers treat ``members`` as starting a fresh episode at their current state."""
    # Otherwise a member that had just ended would be reset by the next step, throwing the branch away.
    base._autoreset_envs[members] = False
    stats = find_wrapper(env, vector_wrappers.RecordEpisodeStatistics)
    if stats is not None:
        # Episode returns and lengths count from the branch point.
        stats.episode_start_times[members] = time.perf_counter()
        stats.episode_returns[members] = 0
        stats.episode_lengths[members] = 0
        stats.prev_dones[members] = False
    reward_norm = find_wrapper(env, vector_wrappers.NormalizeReward)
    if reward_norm is not None:
        reward_norm.accumulated_reward[members] = 0
        reward_norm._prev_dones[members] = 0


def _replay(sub_env: gym.Env, point: BranchPoint, b: int) -> Any:
    """Reset with the point's seed and take its actions again; return the final observation."""
    obs, _ = sub_env.reset(seed=point.seed)
    total = 0.0
    for t, action in enumerate(point.actions):
        obs, reward, terminated, truncated, _ = sub_env.step(as_passed(action))
        total += float(reward)
        if terminated or truncated:
            raise NotRestorable(
                f"replaying branch point {b} (seed {point.seed}, {len(point.actions)} actions) ended the episode "
                f"at step {t + 1}: the env is not deterministic, so branching needs start_mode=reset"
            )
    if not _same(obs, point.raw_obs) or (point.prefix_return is not None and total != point.prefix_return):
        raise NotRestorable(
            f"replaying branch point {b} (seed {point.seed}, {len(point.actions)} actions) did not reach the "
            "trunk's observation and return: the env is not deterministic, so branching needs start_mode=reset"
        )
    return obs


def branch_groups(env: VectorEnv, points: list[BranchPoint], G: int, mode: RestoreMode) -> tuple[np.ndarray, int]:
    """Put members b·G … b·G+G−1 of the B·G sync vector env ``env`` into branch point b.

    ``direct``: reset the sub-env with the point's seed, then restore its snapshot. ``replay``: reset with
    the seed and take the action prefix again; an early episode end, or a final observation or prefix
    return that differs from the trunk's, raises NotRestorable. Afterwards the members start a fresh
    episode at the branch point: no pending autoreset, episode statistics and the reward normalizer's
    return counted from there.

    Returns ``(obs (B·G, obs_dim), replay_steps)``: the obs as the vector env delivers them (through
    :func:`observe`, so the normalizer statistics are not updated) and the env steps spent replaying
    (``G · Σ len(actions)``; 0 for ``direct``).
    """
    base = _sync_base(env, "branching")
    B = len(points)
    _check_groups(env, B, G)
    _check_mode(mode)
    raw: list[Any] = []
    steps = 0
    for b, point in enumerate(points):
        if mode == "direct" and point.state is None:
            raise ValueError(f"branch point {b} holds no snapshot: it was taken with mode 'replay'")
        for i in range(b * G, (b + 1) * G):
            sub_env = base.envs[i]
            if mode == "direct":
                # The reset clears the wrappers' per-episode checks; the snapshot then sets every state
                # that decides what follows (physics, RNG, time-limit counter).
                sub_env.reset(seed=point.seed)
                snapshot.restore(sub_env, point.state)
                obs = np.array(point.raw_obs, copy=True)
            else:
                obs = _replay(sub_env, point, b)
                steps += len(point.actions)
            base._env_obs[i] = obs
            raw.append(obs)
    _clear_episode_bookkeeping(env, base, np.arange(B * G))
    return observe(env, np.stack(raw)), steps  # (B·G, obs_dim)
