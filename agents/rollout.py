"""Collecting experience from a vector env, and evaluating a policy.

The envs use the NEXT_STEP autoreset mode (see :mod:`envs.factory`). After a step that ends an episode,
the observation returned is the true final observation, and the next step of that sub-env is an
*autoreset step*: its action is ignored, its reward is 0 and it returns the new episode's first
observation. Segments of T steps (PPO's, ``onpolicy.segment_steps``) carry over a :class:`RolloutState`
from one to the next; GRPO's episodes (:func:`episode_steps`) run each member until its own episode ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import torch
from gymnasium.vector import VectorEnv
from torch import Tensor

from agents.networks import Actor, ActorCritic, Sample, stack_layers
from envs.members import step_members


@dataclass
class RolloutState:
    """What carries over from one segment to the next (and into checkpoints)."""

    next_obs: np.ndarray  # (N, obs_dim) float32
    next_is_autoreset: np.ndarray  # (N,) bool: the sub-env ended its episode on the previous step
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    episode_envs: list[int] = field(default_factory=list)  # the sub-env each episode ran in
    episode_last_rewards: list[float] = field(default_factory=list)  # each episode's raw reward at its last step

    def take_episodes(self, rows: slice) -> tuple[list[float], list[int], list[float]]:
        """The returns, lengths and last rewards of the episodes that ended in sub-envs ``rows`` since they were
        last taken, for the logs."""
        envs = range(len(self.next_obs))[rows]
        mine = [i for i, env in enumerate(self.episode_envs) if env in envs]
        taken = (
            [self.episode_returns[i] for i in mine],
            [self.episode_lengths[i] for i in mine],
            [self.episode_last_rewards[i] for i in mine],
        )
        for i in reversed(mine):
            del self.episode_returns[i], self.episode_lengths[i], self.episode_envs[i], self.episode_last_rewards[i]
        return taken


class SegmentBuffers:
    """Preallocated (T, N) storage, reused by every segment."""

    def __init__(self, T: int, N: int, obs_dim: int, action_shape: tuple[int, ...], discrete: bool) -> None:
        self.obs = np.zeros((T, N, obs_dim), dtype=np.float32)  # (T, N, obs_dim)
        self.rewards = np.zeros((T, N), dtype=np.float32)  # (T, N)
        self.terminated = np.zeros((T, N), dtype=np.bool_)  # (T, N)
        self.truncated = np.zeros((T, N), dtype=np.bool_)  # (T, N)
        self.sample_mask = np.zeros((T, N), dtype=np.bool_)  # (T, N)
        self.actions = torch.zeros((T, N, *action_shape), dtype=torch.int64 if discrete else torch.float32)
        self.log_probs = torch.zeros((T, N))  # (T, N)
        self.values = torch.zeros((T, N))  # (T, N)


@dataclass
class Episodes:
    """M = B·G whole trajectories for GRPO, member (b, g) at index b·G + g, run until every one ended.

    A member whose episode has ended takes no more steps (``envs.members.step_members``): ``mask`` is
    False from there on, and only the members' own steps count toward the budget. Where the vector env
    cannot skip a member (async, native), the steps it gave ended members are ``idle_steps``, not counted.
    """

    obs: Tensor  # (T, M, obs_dim)
    actions: Tensor  # (T, M) int64 or (T, M, act_dim)
    log_probs: Tensor  # (T, M)  log π_old(a|s) at collection
    rewards: Tensor  # (T, M)  as the env returned them
    mask: Tensor  # (T, M) bool  True on a member's steps before its episode ended
    terminated: Tensor  # (M,) bool  the trajectory ended by termination
    truncated: Tensor  # (M,) bool  the trajectory ended by the time limit
    idle_steps: int  # steps the vector env gave members after their episode ended; not counted
    step_time_s: float  # time spent stepping the env
    final_obs: Tensor | None = None  # (M, obs_dim)  each member's observation after its last step

    @property
    def lengths(self) -> Tensor:
        return self.mask.sum(0)  # (M,)

    @property
    def env_steps(self) -> int:
        """The steps that produced samples, the ones the budget counts: Σ_i L_i."""
        return int(self.mask.sum())

    def select(self, members: Tensor) -> Episodes:
        """The trajectories at indices ``members`` (the idle steps stay those of the whole collection)."""
        return Episodes(
            obs=self.obs[:, members],
            actions=self.actions[:, members],
            log_probs=self.log_probs[:, members],
            rewards=self.rewards[:, members],
            mask=self.mask[:, members],
            terminated=self.terminated[members],
            truncated=self.truncated[members],
            idle_steps=self.idle_steps,
            step_time_s=self.step_time_s,
            final_obs=None if self.final_obs is None else self.final_obs[members],
        )


def episode_steps(
    env: VectorEnv,
    first_obs: np.ndarray,
    buffers: SegmentBuffers,
    before_step: Callable[[int, np.ndarray], None] | None = None,
) -> Generator[np.ndarray, Sample, Episodes]:
    """Step the M sub-envs from ``first_obs`` (M, obs_dim) until each has ended once; a member whose
    episode has ended is not stepped again. A generator: it yields the live members' observations
    (K, obs_dim) and is sent π_θ's :class:`~agents.networks.Sample` for them, so that one policy call
    (:func:`collect_episodes`) or one batched call for many seeds (``grpo.Learner.collect``) can drive it.

    ``buffers`` is (T_max, M): T_max must bound the episode length (the env's time limit).
    ``before_step(t, alive (M,))`` runs before step t, while the sub-envs are in the states s_t (the
    vine takes its snapshots there).
    """
    T_max, M = buffers.rewards.shape
    alive = np.ones(M, dtype=bool)  # (M,)
    terminated_at_end = np.zeros(M, dtype=bool)  # (M,)
    truncated_at_end = np.zeros(M, dtype=bool)  # (M,)
    actions = np.zeros((M, *buffers.actions.shape[2:]), dtype=buffers.actions.numpy().dtype)  # (M, ...)
    final_obs = np.zeros_like(buffers.obs[0])  # (M, obs_dim)
    obs, t, idle, step_time = first_obs, 0, 0, 0.0
    while alive.any():
        if t == T_max:
            raise RuntimeError(f"an episode outlived max_episode_steps={T_max}; the env's time limit is longer")
        if before_step is not None:
            before_step(t, alive)
        live = torch.from_numpy(np.flatnonzero(alive))  # (K,) the members still in their episode
        buffers.obs[t] = obs
        buffers.sample_mask[t] = alive
        sample = yield buffers.obs[t][alive]
        buffers.actions[t].zero_()
        buffers.log_probs[t].zero_()
        buffers.actions[t, live] = sample.actions.cpu()
        buffers.log_probs[t, live] = sample.log_probs.cpu()
        actions[alive] = sample.actions.cpu().numpy()
        started = time.perf_counter()
        result = step_members(env, actions, alive)
        step_time += time.perf_counter() - started
        obs, idle = result.obs, idle + result.idle_steps
        buffers.rewards[t] = result.rewards
        ended = alive & (result.terminated | result.truncated)
        terminated_at_end |= ended & result.terminated
        truncated_at_end |= ended & result.truncated & ~result.terminated
        final_obs[ended] = obs[ended]
        alive &= ~ended
        t += 1
    return Episodes(
        obs=torch.from_numpy(buffers.obs[:t].copy()),
        actions=buffers.actions[:t].clone(),
        log_probs=buffers.log_probs[:t].clone(),
        rewards=torch.from_numpy(buffers.rewards[:t].copy()),
        mask=torch.from_numpy(buffers.sample_mask[:t].copy()),
        terminated=torch.from_numpy(terminated_at_end),
        truncated=torch.from_numpy(truncated_at_end),
        idle_steps=idle,
        step_time_s=step_time,
        final_obs=torch.from_numpy(final_obs),
    )


R = TypeVar("R")
Policy = Callable[[Tensor], Sample]
"""π_θ acting on observations (B, obs_dim): sampled actions and their log-probabilities, drawn from the
generator of the seed it belongs to (``Actor.act`` draws from the global one)."""


def drive(steps: Generator[np.ndarray, Sample, R], act: Policy) -> R:
    """Run a generator of :func:`episode_steps`'s kind to its end, ``act`` acting on every observation it yields."""
    with torch.inference_mode():
        try:
            obs = next(steps)
            while True:
                obs = steps.send(act(torch.from_numpy(obs)))
        except StopIteration as finished:
            return finished.value


def drive_seeds(
    steps: dict[int, Generator[np.ndarray, Sample, R]],
    act: Callable[[Tensor], list[Callable[[int], Sample]]],
    shape: tuple[int, int, int],
) -> dict[int, R]:
    """Run generators of :func:`episode_steps`'s kind, one per seed k, in lockstep to their ends: at each step,
    every seed's observations (K_k, obs_dim) go to ``act`` at once, as rows 0 … K_k of seed k in one
    (S, M, obs_dim) tensor (``shape``), and ``act`` returns, per seed, how to sample its K_k rows."""
    obs = torch.zeros(shape)  # (S, M, obs_dim)  rows past a seed's K_k unused
    finished: dict[int, R] = {}
    with torch.inference_mode():
        live = {k: next(seed_steps) for k, seed_steps in steps.items()}  # each (K_k, obs_dim)
        while live:
            for k, live_obs in live.items():
                obs[k, : len(live_obs)] = torch.from_numpy(live_obs)
            samplers = act(obs)
            for k in list(live):
                try:
                    live[k] = steps[k].send(samplers[k](len(live[k])))
                except StopIteration as done:
                    finished[k] = done.value
                    del live[k]
    return finished


def collect_episodes(
    env: VectorEnv,
    act: Policy,
    first_obs: np.ndarray,
    buffers: SegmentBuffers,
    before_step: Callable[[int, np.ndarray], None] | None = None,
) -> Episodes:
    """Step the M sub-envs from ``first_obs`` with π_θ until each has ended once (:func:`episode_steps`);
    π_θ acts only for the live members."""
    return drive(episode_steps(env, first_obs, buffers, before_step), act)


def concat_episodes(parts: list[Episodes]) -> Episodes:
    """Join batches of trajectories along M, padding shorter batches in time with masked-out steps."""
    if len(parts) == 1:
        return parts[0]
    T = max(p.mask.shape[0] for p in parts)

    def pad(x: Tensor) -> Tensor:
        return torch.cat([x, x.new_zeros((T - x.shape[0], *x.shape[1:]))]) if x.shape[0] < T else x

    return Episodes(
        obs=torch.cat([pad(p.obs) for p in parts], dim=1),
        actions=torch.cat([pad(p.actions) for p in parts], dim=1),
        log_probs=torch.cat([pad(p.log_probs) for p in parts], dim=1),
        rewards=torch.cat([pad(p.rewards) for p in parts], dim=1),
        mask=torch.cat([pad(p.mask) for p in parts], dim=1),
        terminated=torch.cat([p.terminated for p in parts]),
        truncated=torch.cat([p.truncated for p in parts]),
        idle_steps=sum(p.idle_steps for p in parts),
        step_time_s=sum(p.step_time_s for p in parts),
        final_obs=None if any(p.final_obs is None for p in parts) else torch.cat([p.final_obs for p in parts]),
    )


def evaluate_policy(
    model: Actor | ActorCritic, env: VectorEnv, seeds: list[int], deterministic: bool = True, device: str = "cpu"
) -> np.ndarray:
    """Play one episode in each of the ``len(seeds)`` sub-envs, sub-env i reset with ``seeds[i]``.

    Returns the raw episode returns, shape (len(seeds),). ``env`` must have one sub-env per seed, must
    not scale rewards, and its observation normalization (if any) must be frozen by the caller. Our own
    networks act deterministically through :func:`evaluate_policies` (a stack of one), so that a seed
    evaluated alone and in a stack computes the same; another policy (SB3's) acts through its own methods.
    """
    if deterministic and isinstance(model, (Actor, ActorCritic)):
        return evaluate_policies([model], [env], seeds, device)[0]
    check_eval_envs([env], seeds)
    returns = np.full(len(seeds), np.nan)  # (E,)
    obs, _ = env.reset(seed=list(seeds))
    with torch.inference_mode():
        while np.isnan(returns).any():
            obs_t = torch.from_numpy(np.asarray(obs, dtype=np.float32)).to(device)
            actions = model.deterministic_action(obs_t) if deterministic else model.act(obs_t).actions
            obs, _, _, _, info = env.step(actions.cpu().numpy())
            if "_episode" in info:
                first = info["_episode"] & np.isnan(returns)
                returns[first] = info["episode"]["r"][first]
    return returns


def evaluate_policies(
    models: list[Actor] | list[ActorCritic], envs: list[VectorEnv], seeds: list[int], device: str = "cpu"
) -> list[np.ndarray]:
    """Seed k's deterministic policy ``models[k]`` plays one episode in each sub-env of ``envs[k]``, sub-env i
    reset with ``seeds[i]``, for S seeds at once; returns each seed's raw episode returns, (E,) each.

    One forward pass per step acts for every seed, on the observations (S, E, obs_dim) of all S eval envs
    (:func:`~agents.networks.stack_layers`); each env applies its own frozen normalization. Seed k's env
    steps until each of its E sub-envs has ended one episode, then stops: its row keeps its last
    observations, whose actions go nowhere. Seed k's actions are those it takes evaluated alone (S = 1),
    because every seed computes within its own row (:func:`~agents.networks.linear`).
    """
    check_eval_envs(envs, seeds)
    S, E = len(models), len(seeds)
    returns = np.full((S, E), np.nan)  # (S, E)  NaN until the sub-env's first episode ends
    obs = np.zeros((S, E, models[0].spec.obs_dim), dtype=np.float32)  # (S, E, obs_dim)
    obs_t = torch.from_numpy(obs)  # the same memory: each step's observations are written in place
    for k, env in enumerate(envs):
        obs[k] = env.reset(seed=list(seeds))[0]
    live = list(range(S))  # the seeds with an episode still running
    with torch.inference_mode():
        layers = stack_layers(models)
        while live:
            actions = layers.deterministic_action(obs_t.to(device)).cpu().numpy()  # (S, E) or (S, E, act_dim)
            for k in live:
                obs[k], _, _, _, info = envs[k].step(actions[k])
                if "_episode" in info:
                    first = info["_episode"] & np.isnan(returns[k])
                    returns[k, first] = info["episode"]["r"][first]
            live = [k for k in live if np.isnan(returns[k]).any()]
    return list(returns)


def check_eval_envs(envs: list[VectorEnv], seeds: list[int]) -> None:
    for env in envs:
        if env.num_envs != len(seeds):
            raise ValueError(f"evaluation needs one sub-env per seed: {env.num_envs} envs, {len(seeds)} seeds")
