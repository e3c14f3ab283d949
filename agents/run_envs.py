"""A run's envs, around every algorithm: the training envs a stack's seeds share, the evaluation envs, the
networks' shape for their spaces, the observation statistics evaluation uses, and the env part of a checkpoint."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv, VectorEnv

import envs as envs_pkg
from agents.config import RunConfig
from agents.networks import NetworkSpec
from agents.rollout import RolloutState
from agents.seeding import env_seeds, restart_seeds
from envs.errors import BadInput, brief
from envs.snapshot import is_restorable

# Evaluation episodes use seeds EVAL_SEED_BASE, EVAL_SEED_BASE + 1, …: the same start states for every
# run, algorithm and training seed (common random numbers), and never a training seed, which are at least
# seeding.RESET_SEED_FLOOR = 2**31.
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
    train = open_train_env(cfg, n_envs, options, **train_kwargs)
    return envs_with_shapes(train, make_eval_env(cfg, cfg.eval_episodes))


def open_train_env(cfg: RunConfig, n_envs: int, options: envs_pkg.EnvOptions, **train_kwargs: Any) -> VectorEnv:
    """The training vector env of :func:`open_envs`; BadInput for action spaces the agents cannot handle."""
    train = envs_pkg.make_vector(cfg.env_id, n_envs, options, **cfg.env_kwargs, **train_kwargs)
    action_space = train.single_action_space
    if not isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box)) or (
        isinstance(action_space, gym.spaces.Box) and len(action_space.shape) != 1
    ):
        train.close()
        raise BadInput(f"{cfg.env_id} has action space {action_space}; the agents support Discrete and 1-D Box actions")
    return train


def envs_with_shapes(train: VectorEnv, evaluation: VectorEnv) -> Envs:
    """A training and an evaluation env with the shapes of the training env's spaces."""
    obs_dim, action_dim, continuous = space_dims(train)
    action_shape = tuple(train.single_action_space.shape) if continuous else ()
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
    spaces = []
    for kwargs in [cfg.env_kwargs] + ([{**cfg.env_kwargs, **cfg.eval_env_kwargs}] if cfg.eval_env_kwargs else []):
        try:
            env = gym.make(cfg.env_id, **kwargs)
        except (TypeError, ValueError) as error:
            raise BadInput(
                f"{cfg.env_id} does not accept env_kwargs {brief(kwargs)} ({brief(str(error))}). Check the keyword "
                "names and values the env's constructor takes."
            ) from None
        spaces.append((env.observation_space, env.action_space))
        env.close()
    if len(spaces) == 2:  # the policy trained in the first env acts in both
        for name, trained, evaluated in zip(("observation", "action"), *spaces):
            if trained != evaluated:
                raise BadInput(
                    f"eval_env_kwargs {brief(cfg.eval_env_kwargs)} change {cfg.env_id}'s {name} space from "
                    f"{_space_text(trained)} to {_space_text(evaluated)}: the policy could not act in that "
                    "env. Evaluate with kwargs that keep the spaces (a reward's weight, say)."
                )


def _space_text(space: gym.Space) -> str:
    """A space in a few words: a Box by its shape and bounds' type, as the bounds can be long arrays."""
    if isinstance(space, gym.spaces.Box):
        return f"Box of shape {space.shape} ({space.dtype})"
    return str(space)


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
        obs_dim=obs_dim,
        action_dim=action_dim,
        continuous=continuous,
        hidden_sizes=cfg.hidden_sizes,
        activation=cfg.activation,
        shared_trunk=shared_trunk,
        ortho_init=cfg.ortho_init,
        log_std_init=cfg.log_std_init,
    )


def observation_statistics(normalizers: dict[str, Any]) -> dict[str, Any]:
    """The part of a training env's normalizer statistics that evaluation uses: observations, not rewards."""
    return {name: stats for name, stats in normalizers.items() if name != "return_rms"}


def obs_statistics(env: VectorEnv) -> dict[str, Any]:
    """The observation statistics of a training env, as evaluation uses them (no reward scaling)."""
    return observation_statistics(envs_pkg.normalizer_state(env))


# ── a stack's training envs: one vector env for all its seeds where that is exact ─────────────


@dataclass
class SharedEnv:
    """A training vector env of ``seeds`` consecutive seeds of a stack, from its ``first``: N sub-envs each,
    sub-envs j·N … (j+1)·N − 1 the j-th seed's, each seed with normalizer statistics of its own
    (``EnvOptions.stacked_seeds``). ``rollout`` carries its S_b·N rows from segment to segment."""

    env: VectorEnv
    first: int
    seeds: int
    rollout: RolloutState

    @property
    def stack(self) -> slice:
        """Its seeds' places in the stack."""
        return slice(self.first, self.first + self.seeds)

    def rows(self, j: int) -> slice:
        """The sub-envs of its j-th seed."""
        n = self.env.num_envs // self.seeds
        return slice(j * n, (j + 1) * n)


def seed_env(shared_envs: list[SharedEnv], k: int) -> tuple[SharedEnv, int]:
    """Seed k's training env and the seed's place j among the env's seeds."""
    shared = next(shared for shared in shared_envs if shared.first <= k < shared.first + shared.seeds)
    return shared, k - shared.first


def seed_obs_statistics(shared: SharedEnv, j: int) -> dict[str, Any]:
    """Its j-th seed's observation statistics, as evaluation uses them (:func:`obs_statistics`)."""
    return observation_statistics(envs_pkg.normalizer_state(shared.env, j, shared.seeds))


def reset_with(env: VectorEnv, seeds: list[int]) -> Any:
    """Reset sub-env i with ``seeds[i]``; returns the observations. A native vector env of gymnasium's, which
    draws one stream for all its sub-envs, takes one seed: ``seeds[0]``."""
    base = env.unwrapped
    per_env = isinstance(base, SyncVectorEnv | AsyncVectorEnv | envs_pkg.ChainVectorEnv | envs_pkg.KeyDoorVectorEnv)
    obs, _ = env.reset(seed=seeds if per_env else seeds[0])
    return obs


def open_shared_envs(cfgs: list[RunConfig], n_envs: int, options: envs_pkg.EnvOptions) -> list[SharedEnv]:
    """The training envs of a stack's seeds, reset with their seeds (``seeding.env_seeds``: sub-env i of the
    seed s with the i-th of ``env_seeds(s, N)``).

    One vector env for all S seeds where its sub-envs step one by one (sync) and can be saved exactly
    (``envs.snapshot``): a seed's sub-envs are then stepped and saved as in a vector env of their own, with
    one pass through the wrappers per step instead of S. Otherwise (a native vector env draws one stream of
    random numbers for all its sub-envs) each seed has its own.
    """
    first = open_train_env(cfgs[0], n_envs, options)
    base = first.unwrapped
    if len(cfgs) > 1 and isinstance(base, SyncVectorEnv) and all(is_restorable(e) for e in base.envs):
        first.close()
        stacked = dataclasses.replace(options, stacked_seeds=len(cfgs))
        shared = [(open_train_env(cfgs[0], n_envs * len(cfgs), stacked), 0, cfgs)]
    else:
        shared = [(first if k == 0 else open_train_env(cfg, n_envs, options), k, [cfg]) for k, cfg in enumerate(cfgs)]
    opened = []
    for env, k, seeds in shared:
        obs = reset_with(env, [s for cfg in seeds for s in env_seeds(cfg.seed, n_envs)])
        rows = RolloutState(np.asarray(obs, dtype=np.float32), np.zeros(env.num_envs, dtype=bool))
        opened.append(SharedEnv(env, k, len(seeds), rows))
    return opened


def save_envs(shared: SharedEnv, j: int) -> dict[str, Any]:
    """The env part of seed j's checkpoint, as from a vector env of its own: its full env state where
    supported, always its normalizers, and its rows of the rollout state."""
    rows, state = shared.rows(j), shared.rollout
    return {
        "env_state": envs_pkg.vector_env_state(shared.env, j, shared.seeds),
        "normalizers": envs_pkg.normalizer_state(shared.env, j, shared.seeds),
        "rollout": {"next_obs": state.next_obs[rows], "next_is_autoreset": state.next_is_autoreset[rows]},
    }


def restore_envs(shared: SharedEnv, j: int, ckpt: dict[str, Any], seed: int) -> None:
    """Put seed j's training envs back as its checkpoint left them.

    Exact where the checkpoint holds the full env state; otherwise the normalizer statistics are
    restored and, in an env of its own, every sub-env starts a new episode from its restart seed at the
    step count (``seeding.restart_seeds``; in a shared env, which holds only envs whose state is saved, the
    episodes go on from the stack's reset).
    """
    rows, state = shared.rows(j), shared.rollout
    if ckpt["env_state"] is not None:
        if shared.seeds == 1:
            reset_with(shared.env, env_seeds(seed, shared.env.num_envs))
        envs_pkg.load_vector_env_state(shared.env, ckpt["env_state"], j, shared.seeds)
        state.next_obs[rows] = np.asarray(ckpt["rollout"]["next_obs"], dtype=np.float32)
        state.next_is_autoreset[rows] = np.asarray(ckpt["rollout"]["next_is_autoreset"])
        return
    envs_pkg.load_normalizer_state(shared.env, ckpt["normalizers"], j, shared.seeds)
    if shared.seeds == 1:
        obs = reset_with(shared.env, restart_seeds(seed, ckpt["global_step"], shared.env.num_envs))
        shared.rollout = RolloutState(np.asarray(obs, dtype=np.float32), np.zeros(shared.env.num_envs, dtype=bool))
