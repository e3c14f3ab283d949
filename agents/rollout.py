"""Collecting experience from a vector env, and evaluating a policy.

The envs use the NEXT_STEP autoreset mode (see :mod:`envs.factory`). After a step that ends an episode,
the observation returned is the true final observation, and the next step of that sub-env is an
*autoreset step*: its action is ignored, its reward is 0 and it returns the new episode's first
observation. So:
- ``sample_mask[t]`` is False exactly at autoreset steps; they are never training samples;
- ``next_values[t] = values[t + 1]`` is V of the true next observation for every real step, including
  a truncated one, whose final observation is stored at t + 1. No separate final-observation pass is
  needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from gymnasium.vector import VectorEnv
from torch import Tensor

from agents.networks import ActorCritic


@dataclass
class Segment:
    """T steps of N envs, the input of one PPO iteration."""

    obs: Tensor  # (T, N, obs_dim) float32
    actions: Tensor  # (T, N) int64 or (T, N, act_dim) float32
    log_probs: Tensor  # (T, N)
    values: Tensor  # (T, N)
    next_values: Tensor  # (T, N)  V of the true next observation
    rewards: Tensor  # (T, N)
    terminated: Tensor  # (T, N) bool
    truncated: Tensor  # (T, N) bool
    sample_mask: Tensor  # (T, N) bool  False at autoreset steps

    @property
    def done(self) -> Tensor:
        return self.terminated | self.truncated


@dataclass
class RolloutState:
    """What carries over from one segment to the next (and into checkpoints)."""

    next_obs: np.ndarray  # (N, obs_dim) float32
    next_is_autoreset: np.ndarray  # (N,) bool: the sub-env ended its episode on the previous step
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)


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


def collect_segment(
    env: VectorEnv, model: ActorCritic, state: RolloutState, buffers: SegmentBuffers, device: str = "cpu"
) -> Segment:
    """Run T steps in N envs with the current policy; update ``state`` in place.

    Finished episodes' raw returns and lengths (from ``info["episode"]``) are appended to
    ``state.episode_returns`` / ``state.episode_lengths`` for logging.
    """
    T = buffers.obs.shape[0]
    next_obs, next_is_autoreset = state.next_obs, state.next_is_autoreset
    with torch.inference_mode():
        for t in range(T):
            buffers.obs[t] = next_obs
            buffers.sample_mask[t] = ~next_is_autoreset
            act = model.act(torch.from_numpy(buffers.obs[t]).to(device))
            buffers.actions[t] = act.actions
            buffers.log_probs[t] = act.log_probs
            buffers.values[t] = act.values
            next_obs, reward, terminated, truncated, info = env.step(act.actions.cpu().numpy())
            buffers.rewards[t] = reward
            buffers.terminated[t] = terminated
            buffers.truncated[t] = truncated
            next_is_autoreset = terminated | truncated
            if "_episode" in info:
                finished = info["_episode"]
                state.episode_returns.extend(info["episode"]["r"][finished].tolist())
                state.episode_lengths.extend(info["episode"]["l"][finished].tolist())
        last_values = model.value(torch.from_numpy(np.asarray(next_obs, dtype=np.float32)).to(device)).cpu()  # (N,)
    state.next_obs, state.next_is_autoreset = np.asarray(next_obs, dtype=np.float32), next_is_autoreset
    values = buffers.values.clone()
    return Segment(
        obs=torch.from_numpy(buffers.obs.copy()),
        actions=buffers.actions.clone(),
        log_probs=buffers.log_probs.clone(),
        values=values,
        next_values=torch.cat([values[1:], last_values.unsqueeze(0).clone()]),
        rewards=torch.from_numpy(buffers.rewards.copy()),
        terminated=torch.from_numpy(buffers.terminated.copy()),
        truncated=torch.from_numpy(buffers.truncated.copy()),
        sample_mask=torch.from_numpy(buffers.sample_mask.copy()),
    )


def evaluate_policy(
    model: ActorCritic, env: VectorEnv, seeds: list[int], deterministic: bool = True, device: str = "cpu"
) -> np.ndarray:
    """Play one episode in each of the ``len(seeds)`` sub-envs, sub-env i reset with ``seeds[i]``.

    Returns the raw episode returns, shape (len(seeds),). ``env`` must have one sub-env per seed, must
    not scale rewards, and its observation normalization (if any) must be frozen by the caller.
    """
    if env.num_envs != len(seeds):
        raise ValueError(f"evaluate_policy needs one sub-env per seed: {env.num_envs} envs, {len(seeds)} seeds")
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
