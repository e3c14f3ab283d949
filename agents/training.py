"""The plumbing every agent's ``train`` shares: envs, evaluation, episode logging, env state in
checkpoints, and the end of a run. The algorithms themselves stay in ``ppo.py`` and ``grpo.py``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import VectorEnv

import envs as envs_pkg
from agents import runlog
from agents.networks import NetworkSpec
from agents.rollout import RolloutState, evaluate_policy
from envs.errors import BadInput

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


def open_envs(
    env_id: str,
    n_envs: int,
    eval_episodes: int,
    normalize_obs: bool,
    normalize_reward: bool,
    gamma: float,
    vectorization: str,
    env_kwargs: dict[str, Any] | None = None,
    reward_delay: int | str | None = None,
    eval_env_kwargs: dict[str, Any] | None = None,
    **train_kwargs: Any,
) -> Envs:
    """Build the training and evaluation envs; refuse action spaces the agents cannot handle.

    ``env_kwargs`` define the env (a task's ``horizon``, say) and go to both envs. ``reward_delay`` and
    ``train_kwargs`` (e.g. ``max_episode_steps``) shape training only: evaluation uses the env as the
    kwargs define it (``eval_env_kwargs`` on top), with its own time limit, so scores stay comparable
    across agents. A delayed reward does not change an episode's return, which is what evaluation reports.
    """
    env_kwargs = env_kwargs or {}
    options = envs_pkg.EnvOptions(normalize_obs=normalize_obs, normalize_reward=normalize_reward, gamma=gamma,
                                  vectorization=vectorization, reward_delay=reward_delay)  # fmt: skip
    train = envs_pkg.make_vector(env_id, n_envs, options, **env_kwargs, **train_kwargs)
    action_space = train.single_action_space
    if not isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box)) or (
        isinstance(action_space, gym.spaces.Box) and len(action_space.shape) != 1
    ):
        train.close()
        raise BadInput(f"{env_id} has action space {action_space}; the agents support Discrete and 1-D Box actions")
    evaluation = make_eval_env(env_id, eval_episodes, normalize_obs, env_kwargs, eval_env_kwargs)
    obs_dim, action_dim, continuous = space_dims(train)
    action_shape = tuple(action_space.shape) if continuous else ()
    return Envs(train, evaluation, continuous, obs_dim, action_dim, action_shape)


def make_eval_env(
    env_id: str,
    episodes: int,
    normalize_obs: bool,
    env_kwargs: dict[str, Any],
    eval_env_kwargs: dict[str, Any] | None = None,
) -> VectorEnv:
    """One sub-env per evaluation episode: sync so each takes its own seed; raw rewards; statistics frozen."""
    options = envs_pkg.EnvOptions(normalize_obs=normalize_obs, vectorization="sync")
    evaluation = envs_pkg.make_vector(env_id, episodes, options, **{**env_kwargs, **(eval_env_kwargs or {})})
    envs_pkg.freeze_normalizers(evaluation)
    return evaluation


def space_dims(env: VectorEnv) -> tuple[int, int, bool]:
    """(obs_dim, action_dim, continuous) of one sub-env: action_dim counts actions or action dimensions."""
    action_space = env.single_action_space
    continuous = isinstance(action_space, gym.spaces.Box)
    action_dim = int(action_space.shape[0]) if continuous else int(action_space.n)
    return int(np.prod(env.single_observation_space.shape)), action_dim, continuous


def network_spec(env: VectorEnv, cfg: Any) -> NetworkSpec:
    """The networks' shape for this env's spaces and the config's network fields (PPO, GRPO, sb3-ppo)."""
    obs_dim, action_dim, continuous = space_dims(env)
    return NetworkSpec(
        obs_dim=obs_dim, action_dim=action_dim, continuous=continuous, hidden_sizes=cfg.hidden_sizes,
        activation=cfg.activation, shared_trunk=getattr(cfg, "shared_trunk", False), ortho_init=cfg.ortho_init,
        log_std_init=cfg.log_std_init,
    )  # fmt: skip


def evaluate(model: torch.nn.Module, envs: Envs, deterministic: bool = True, device: str = "cpu") -> np.ndarray:
    """One episode per eval sub-env, with the training env's observation statistics, frozen."""
    stats = envs_pkg.normalizer_state(envs.train)
    stats.pop("return_rms", None)
    envs_pkg.load_normalizer_state(envs.eval, stats)
    seeds = [EVAL_SEED_BASE + i for i in range(envs.eval.num_envs)]
    return evaluate_policy(model, envs.eval, seeds, deterministic, device)


class EvalSchedule:
    """Deterministic evaluation every ``interval`` env steps (0: only at the end)."""

    def __init__(self, interval: int, device: str, start_step: int) -> None:
        self.interval, self.device = interval, device
        self.next_step = (start_step // interval + 1) * interval if interval else math.inf
        self.last: tuple[int, np.ndarray] | None = None

    def maybe_run(self, model: torch.nn.Module, envs: Envs, step: int) -> dict[str, float]:
        if step < self.next_step:
            return {}
        while self.next_step <= step:
            self.next_step += self.interval
        return self.run(model, envs, step)

    def run(self, model: torch.nn.Module, envs: Envs, step: int) -> dict[str, float]:
        if self.last is None or self.last[0] != step:
            self.last = (step, evaluate(model, envs, True, self.device))
        returns = self.last[1]
        return {"eval/return_mean": float(returns.mean()), "eval/return_std": float(returns.std())}


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


class RunTracker:
    """What every training loop does around its algorithm: the TensorBoard and CSV rows, periodic
    evaluation, the progress line, the checkpoint schedule, the wall clock, and the end of the run."""

    def __init__(
        self, run_dir: Path, algo: str, cfg: Any, tags: list[str], global_step: int, wall_offset: float, resume: bool
    ) -> None:
        self.run_dir, self.algo, self.cfg = run_dir, algo, cfg
        self.log = runlog.MetricLog(run_dir, tags, resume_step=global_step if resume else None)
        self.evals = EvalSchedule(cfg.eval_interval, cfg.device, global_step)
        self.progress = runlog.Progress(cfg.total_steps, global_step, f"{algo} {cfg.env_id} seed {cfg.seed}")
        self.recent_returns: deque[float] = deque(maxlen=20)
        self.start_step = self.last_checkpoint_step = global_step
        self.wall_offset = wall_offset
        self.start_time = time.perf_counter()

    def wall_time(self) -> float:
        """Training time of the whole run, earlier sessions of a resumed run included."""
        return self.wall_offset + time.perf_counter() - self.start_time

    def sps(self, step: int) -> float:
        """Env steps per second in this session."""
        return (step - self.start_step) / max(time.perf_counter() - self.start_time, 1e-9)

    def record(
        self,
        step: int,
        metrics: dict[str, float | None],
        policy: torch.nn.Module,
        envs: Envs,
        episode_returns: Sequence[float],
        episode_lengths: Sequence[float],
    ) -> None:
        """One iteration: every finished episode and the metrics to TensorBoard, a CSV row with the
        episodes' means, an evaluation when one is due, and the progress line."""
        for ret, length in zip(episode_returns, episode_lengths, strict=True):
            self.log.scalars(step, {"charts/episodic_return": ret, "charts/episodic_length": length})
        self.recent_returns.extend(episode_returns)
        sps = self.sps(step)
        metrics = {**metrics, "charts/SPS": sps, **self.evals.maybe_run(policy, envs, step)}
        self.log.scalars(step, metrics)
        self.log.row(step, self.wall_time(), {
            **metrics,
            "charts/episodic_return": float(np.mean(episode_returns)) if len(episode_returns) else None,
            "charts/episodic_length": float(np.mean(episode_lengths)) if len(episode_lengths) else None,
        })  # fmt: skip
        self.progress.update(step, sps, float(np.mean(self.recent_returns)) if self.recent_returns else None)

    def checkpoint_due(self, step: int, stopping: bool) -> bool:
        """Every ``checkpoint_interval`` env steps, and when the run is being stopped."""
        interval = self.cfg.checkpoint_interval
        if stopping or (interval and step - self.last_checkpoint_step >= interval):
            self.last_checkpoint_step = step
            return True
        return False

    def finish(
        self,
        policy: torch.nn.Module,
        envs: Envs,
        status: str,
        error: str | None,
        step: int,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Final evaluation (completed runs only), summary.json, hyperparameters, flushed logs."""
        self.progress.close()
        wall_time_s, sps = self.wall_time(), self.sps(step)
        final: dict[str, float] = {}
        if status == "completed":
            final = self.evals.run(policy, envs, step)
            self.log.scalars(step, final)
        summary = {
            "algo": self.algo,
            "env_id": self.cfg.env_id,
            "seed": self.cfg.seed,
            "status": status,
            "total_steps": step,
            "wall_time_s": round(wall_time_s, 3),
            "sps": round(sps, 1),
            "final_eval_return_mean": final.get("eval/return_mean"),
            "final_eval_return_std": final.get("eval/return_std"),
            "final_eval_episodes": self.cfg.eval_episodes if final else 0,
            "eval_convention": "deterministic policy, one episode per fixed seed 1000000+i, raw env return",
            "error": error,
            **(extra or {}),
        }
        if final:
            self.log.hparams(runlog.config_to_dict(self.cfg), {"final_eval_return_mean": final["eval/return_mean"]})
        self.log.close()
        runlog.write_summary(self.run_dir, summary)
        envs.close()
        return summary


def memory_report(optimizer: torch.optim.Optimizer, **modules: torch.nn.Module) -> dict[str, int]:
    """Parameter counts of each network and the bytes that networks and optimizer state hold."""
    report = {f"parameters_{name}": sum(p.numel() for p in m.parameters()) for name, m in modules.items()}
    tensors = [p for m in modules.values() for p in m.parameters()]
    tensors += [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
    report["model_memory_bytes"] = sum(t.numel() * t.element_size() for t in tensors)
    return report
