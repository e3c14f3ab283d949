"""Env plumbing around every algorithm: the training and evaluation envs a run opens, the networks' shape
for their spaces, the observation statistics evaluation uses, and the env part of a checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv

import envs as envs_pkg
from agents.config import RunConfig
from agents.networks import NetworkSpec
from agents.rollout import RolloutState
from envs.errors import BadInput, brief

# Evaluation episodes use seeds EVAL_SEED_BASE, EVAL_SEED_BASE + 1, …: the same start states for every
# run, algorithm and training seed, and never a training seed.
EVAL_SEED_BASE = 1_000_000


@dataclass
class Envs:
    """The training vector env, the evaluation vector env (one sub-env per episode) and their shapes."""

    train: VectorEnv
    eval: VectorEnv
    continuous: bool
    obs_dim: int
    action_dim: int
    action_shape: tuple[int, ...]

    def close(self) -> None:
        self.train.close()
        self.eval.close()


def open_envs(cfg: RunConfig, n_envs: int, options: envs_pkg.EnvOptions, **train_kwargs: Any) -> Envs:
    """Build the training and evaluation envs; refuse action spaces the agents cannot handle.

    ``cfg.env_kwargs`` define the env (a task's ``horizon``, say) and go to both envs. ``options`` and
    ``train_kwargs`` (e.g. ``max_episode_steps``) shape training only: evaluation uses the env as the
    kwargs define it (``eval_env_kwargs`` on top), with its own time limit, so scores stay comparable
    across agents. A delayed reward does not change an episode's return, which is what evaluation reports.
    """
    train = envs_pkg.make_vector(cfg.env_id, n_envs, options, **cfg.env_kwargs, **train_kwargs)
    action_space = train.single_action_space
    if not isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box)) or (
        isinstance(action_space, gym.spaces.Box) and len(action_space.shape) != 1
    ):
        train.close()
        raise BadInput(f"{cfg.env_id} has action space {action_space}; the agents support Discrete and 1-D Box actions")
    evaluation = make_eval_env(cfg, cfg.eval_episodes)
    obs_dim, action_dim, continuous = space_dims(train)
    action_shape = tuple(action_space.shape) if continuous else ()
    return Envs(train, evaluation, continuous, obs_dim, action_dim, action_shape)


def make_eval_env(cfg: RunConfig, episodes: int) -> VectorEnv:
    """One sub-env per evaluation episode: sync so each takes its own seed; raw rewards; statistics frozen."""
    options = envs_pkg.EnvOptions(normalize_obs=cfg.normalize_obs, vectorization="sync")
    evaluation = envs_pkg.make_vector(cfg.env_id, episodes, options, **{**cfg.env_kwargs, **cfg.eval_env_kwargs})
    envs_pkg.freeze_normalizers(evaluation)
    return evaluation


def check_env(cfg: RunConfig) -> None:
    """Build the env once with the config's keyword arguments, so that a wrong one is refused before any
    run directory exists rather than crashing the run."""
    envs_pkg.check_env_installed(cfg.env_id)
    for kwargs in [cfg.env_kwargs] + ([{**cfg.env_kwargs, **cfg.eval_env_kwargs}] if cfg.eval_env_kwargs else []):
        try:
            gym.make(cfg.env_id, **kwargs).close()
        except (TypeError, ValueError) as error:
            raise BadInput(f"{cfg.env_id} does not accept env_kwargs {brief(kwargs)} ({brief(str(error))}). Check the keyword names "
                           "and values the env's constructor takes.") from None  # fmt: skip


def space_dims(env: VectorEnv) -> tuple[int, int, bool]:
    """(obs_dim, action_dim, continuous) of one sub-env: action_dim counts actions or action dimensions."""
    action_space = env.single_action_space
    continuous = isinstance(action_space, gym.spaces.Box)
    action_dim = int(action_space.shape[0]) if continuous else int(action_space.n)
    return int(np.prod(env.single_observation_space.shape)), action_dim, continuous


def network_spec(env: VectorEnv, cfg: RunConfig, shared_trunk: bool = False) -> NetworkSpec:
    """The networks' shape for this env's spaces and the config's network fields (PPO, GRPO, sb3-ppo)."""
    obs_dim, action_dim, continuous = space_dims(env)
    return NetworkSpec(
        obs_dim=obs_dim, action_dim=action_dim, continuous=continuous, hidden_sizes=cfg.hidden_sizes,
        activation=cfg.activation, shared_trunk=shared_trunk, ortho_init=cfg.ortho_init,
        log_std_init=cfg.log_std_init,
    )  # fmt: skip


def observation_statistics(normalizers: dict[str, Any]) -> dict[str, Any]:
    """The part of a training env's normalizer statistics that evaluation uses: observations, not rewards."""
    return {name: stats for name, stats in normalizers.items() if name != "return_rms"}


def obs_statistics(env: VectorEnv) -> dict[str, Any]:
    """The observation statistics of a training env, as evaluation uses them (no reward scaling)."""
    return observation_statistics(envs_pkg.normalizer_state(env))


def save_envs(env: VectorEnv, state: RolloutState) -> dict[str, Any]:
    """The env part of a checkpoint: the full env state where supported, always the normalizers."""
    return {
        "env_state": envs_pkg.vector_env_state(env),
        "normalizers": envs_pkg.normalizer_state(env),
        "rollout": {"next_obs": state.next_obs, "next_is_autoreset": state.next_is_autoreset},
    }


def restore_envs(env: VectorEnv, ckpt: dict[str, Any], seed: int) -> RolloutState:
    """Put the training env back as the checkpoint left it.

    Exact where the checkpoint holds the full env state; otherwise the normalizer statistics are
    restored and every sub-env starts a new episode from a seed derived from the step count.
    """
    if ckpt["env_state"] is not None:
        env.reset(seed=seed)
        envs_pkg.load_vector_env_state(env, ckpt["env_state"])
        rollout = ckpt["rollout"]
        return RolloutState(np.asarray(rollout["next_obs"], dtype=np.float32), np.asarray(rollout["next_is_autoreset"]))
    envs_pkg.load_normalizer_state(env, ckpt["normalizers"])
    obs, _ = env.reset(seed=seed + ckpt["global_step"])
    return RolloutState(np.asarray(obs, dtype=np.float32), np.zeros(env.num_envs, dtype=bool))
