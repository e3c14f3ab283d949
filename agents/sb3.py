"""Stable-Baselines3's PPO as a reference run (``--algo sb3-ppo``), logged exactly as our PPO logs.

The config is our :class:`agents.ppo.PPOConfig` and its presets (``presets/ppo.yaml``); :func:`sb3_arguments`
is the one place where it becomes SB3's ``PPO(...)`` arguments, and :func:`make_sb3_env` builds the SB3
vector env with the normalization our env factory uses (VecNormalize, clipped to ±10). SB3 trains; a
callback writes the run directory of :mod:`agents.runlog`: the same TensorBoard tags and ``progress.csv``
columns (``ppo.TAGS``) at the same x-axis (env steps), the same deterministic evaluations
(``agents.training``: fixed seeds, raw returns, the training observation statistics frozen), a
weights-only ``checkpoint.pt`` and ``summary.json``. So ``sb3-ppo`` curves lie on the axes of ``ppo``'s.

One row per rollout/update cycle, at ``global_step = model.num_timesteps`` after the rollout, holding that
rollout's finished episodes and the losses of the update made on it, as ours does. SB3 runs ``train()``
after the callback's ``on_rollout_end``, so the row is written at the next ``on_rollout_start`` (and at
``on_training_end`` for the last update), reading the update's ``train/*`` values from
``model.logger.name_to_value``. Reading them at ``on_rollout_end`` would pair each rollout with the
previous rollout's update. The numbers are SB3's own: its ``train/approx_kl`` averages only the last
epoch's minibatches (ours averages all), and SB3 has no autoreset step, so every env step is a sample.

Differences from ``ppo`` in the run's life, by necessity:
 - **Resume is not exact.** SB3's own ``save``/``load`` unpickles arbitrary objects, which this project
   refuses. ``checkpoint.pt`` holds the policy weights, the VecNormalize statistics and the global RNG
   states, and a resumed run loads them into a fresh ``PPO`` and continues from the checkpoint's step
   (same schedules: ``num_timesteps`` continues). Adam's moments and step count restart from zero, every
   env starts a new episode (seeded ``seed + global_step``) and VecNormalize's running discounted return
   restarts at 0. A resumed run therefore differs from an uninterrupted one; its CSV and TensorBoard
   still hold each step once.
 - **SIGINT/SIGTERM** stop at the next env step. The unfinished rollout is dropped untrained, so the
   checkpoint and summary hold the last completed update and its step.
 - A NaN in SB3's update usually surfaces as torch.distributions' ``ValueError`` on NaN parameters in the
   next minibatch; it is reported, like a NaN loss, as status ``failed`` with the
   :class:`runlog.NonFiniteError` message, and the last good checkpoint is kept. Any other crash is
   recorded as ``failed`` with its message, as ``ppo.train`` does.
 - ``shared_trunk`` is refused: SB3 2.x's MlpPolicy has separate actor and critic MLPs, and its
   ``share_features_extractor`` shares only the parameter-free flatten layer.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv, VecNormalize
from torch import Tensor, nn

import envs as envs_pkg
from agents import runlog
from agents.config import check
from agents.ppo import TAGS, PPOConfig
from agents.seeding import seed_everything
from agents.training import Envs, RunTracker, make_eval_env, memory_report
from envs.delay import DelayedReward

ALGO = "sb3-ppo"
# SB3's logger keys → our tags; SB3 logs the entropy *loss*, −H, so its sign flips.
LOSS_KEYS = {
    "losses/policy_loss": ("train/policy_gradient_loss", 1.0), "losses/value_loss": ("train/value_loss", 1.0),
    "losses/entropy": ("train/entropy_loss", -1.0), "losses/approx_kl": ("train/approx_kl", 1.0),
    "losses/clipfrac": ("train/clip_fraction", 1.0),
}  # fmt: skip


# ── our config as SB3's arguments and env ────────────────────────────────────────────────────────


@dataclass(frozen=True)
class LinearSchedule:
    """SB3's schedule convention: value = progress_remaining · start, progress_remaining going 1 → 0."""

    start: float

    def __call__(self, progress_remaining: float) -> float:
        return progress_remaining * self.start


def _spaces(env_id: str) -> tuple[gym.Space, gym.Space]:
    """Observation and action space of one env (validating the id and its dependencies first)."""
    envs_pkg.check_env_installed(env_id)
    env = gym.make(env_id)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def validate(cfg: PPOConfig) -> None:
    """Checks that need the env, before anything is written (``lab.cli``'s ``Algo.validate``)."""
    check(not cfg.shared_trunk, "sb3-ppo: SB3 2.x has no shared actor-critic trunk; use shared_trunk=false")
    obs_space, action_space = _spaces(cfg.env_id)
    # Our eval envs flatten other observation spaces (Discrete → one-hot), which SB3's policy would re-encode.
    check(
        isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1,
        f"sb3-ppo supports flat Box observations; {cfg.env_id} has {obs_space}. Use --algo ppo.",
    )
    check(
        isinstance(action_space, gym.spaces.Discrete)
        or (isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1),
        f"{cfg.env_id} has action space {action_space}; the agents support Discrete and 1-D Box actions",
    )


def sb3_arguments(cfg: PPOConfig, continuous: bool | None = None) -> dict[str, Any]:
    """``PPO("MlpPolicy", env, **sb3_arguments(cfg))``: our config as SB3's keyword arguments.

    ``continuous`` (whether the actions are a Box) is looked up from the env id when not given; it decides
    whether ``log_std_init`` is passed. Annealed values become :class:`LinearSchedule`.
    """
    check(not cfg.shared_trunk, "sb3-ppo: SB3 2.x has no shared actor-critic trunk; use shared_trunk=false")
    if continuous is None:
        continuous = isinstance(_spaces(cfg.env_id)[1], gym.spaces.Box)
    hidden = list(cfg.hidden_sizes)
    policy_kwargs: dict[str, Any] = {
        "net_arch": {"pi": hidden, "vf": list(hidden)},
        "activation_fn": {"tanh": nn.Tanh, "relu": nn.ReLU}[cfg.activation],
        "ortho_init": cfg.ortho_init,  # SB3's gains equal ours: √2 hidden, 0.01 policy, 1 value
        "share_features_extractor": cfg.shared_trunk,  # only a parameter-free flatten layer either way
    }
    if continuous:
        policy_kwargs["log_std_init"] = cfg.log_std_init
    return {
        "n_steps": cfg.n_steps,
        "batch_size": cfg.minibatch_size,
        "n_epochs": cfg.n_epochs,
        "gamma": cfg.gamma,
        "gae_lambda": cfg.gae_lambda,
        "learning_rate": LinearSchedule(cfg.learning_rate) if cfg.anneal_lr else cfg.learning_rate,
        "clip_range": LinearSchedule(cfg.clip_range) if cfg.anneal_clip_range else cfg.clip_range,
        "clip_range_vf": cfg.clip_range_vf,
        "ent_coef": cfg.ent_coef,
        "vf_coef": cfg.vf_coef,
        "max_grad_norm": cfg.max_grad_norm,
        "target_kl": cfg.target_kl,
        "normalize_advantage": cfg.normalize_advantage,
        "policy_kwargs": policy_kwargs,
        "seed": cfg.seed,
        "device": cfg.device,
        "verbose": 0,
    }


def make_sb3_env(cfg: PPOConfig, seed: int | None = None) -> VecEnv:
    """N Monitor-wrapped envs (DummyVecEnv; SubprocVecEnv for ``vectorization=async``), then VecNormalize
    with our factory's settings when either normalization is on. Sub-env i is seeded ``seed + i``
    (default ``cfg.seed``) at its first reset."""
    vec_env_cls = SubprocVecEnv if cfg.vectorization == "async" else DummyVecEnv  # SB3 has no native vector envs
    delay = {"wrapper_class": DelayedReward, "wrapper_kwargs": {"delay": cfg.reward_delay}} if cfg.reward_delay else {}
    env = make_vec_env(cfg.env_id, n_envs=cfg.n_envs, seed=cfg.seed if seed is None else seed, vec_env_cls=vec_env_cls,
                       env_kwargs=cfg.env_kwargs, **delay)  # fmt: skip
    if cfg.normalize_obs or cfg.normalize_reward:
        env = VecNormalize(env, norm_obs=cfg.normalize_obs, norm_reward=cfg.normalize_reward, clip_obs=10.0,
                           clip_reward=10.0, gamma=cfg.gamma)  # fmt: skip
    return env


# ── normalizer statistics, in the format of envs.vector_state.normalizer_state ───────────────────


def normalizer_state(env: VecEnv) -> dict[str, Any]:
    """``obs_rms`` / ``return_rms`` of a VecNormalize, present exactly where that normalization is on."""
    if not isinstance(env, VecNormalize):
        return {}
    pairs = [("obs_rms", env.norm_obs, env.obs_rms), ("return_rms", env.norm_reward, env.ret_rms)]
    return {
        name: {"mean": np.array(rms.mean, copy=True), "var": np.array(rms.var, copy=True), "count": float(rms.count)}
        for name, used, rms in pairs
        if used
    }


def load_normalizer_state(env: VecEnv, state: dict[str, Any]) -> None:
    """Inverse of :func:`normalizer_state`; a mismatch in which normalizers exist is an error."""
    if normalizer_state(env).keys() != state.keys():
        raise ValueError("the saved normalizer statistics do not match this env's normalization settings")
    for name, attr in (("obs_rms", "obs_rms"), ("return_rms", "ret_rms")):
        if name in state:
            rms: RunningMeanStd = getattr(env, attr)
            rms.mean = np.array(state[name]["mean"], dtype=np.float64, copy=True)
            rms.var = np.array(state[name]["var"], dtype=np.float64, copy=True)
            rms.count = float(state[name]["count"])


# ── SB3's policy and envs behind the interfaces of agents.training ───────────────────────────────


class SampledActions(NamedTuple):
    actions: Tensor  # (N,) int64 or (N, act_dim)


class SB3Policy(nn.Module):
    """An SB3 ActorCriticPolicy with the two methods ``rollout.evaluate_policy`` calls."""

    def __init__(self, policy: ActorCriticPolicy) -> None:
        super().__init__()
        self.policy = policy

    def deterministic_action(self, obs: Tensor) -> Tensor:
        return self.policy._predict(obs, deterministic=True)

    def act(self, obs: Tensor) -> SampledActions:
        return SampledActions(self.policy._predict(obs, deterministic=False))


def load_policy(cfg: PPOConfig, state_dict: dict[str, Tensor]) -> SB3Policy:
    """The policy of a checkpoint's ``model`` (for ``testbed eval`` and videos), without building PPO."""
    obs_space, action_space = _spaces(cfg.env_id)
    kwargs = sb3_arguments(cfg, isinstance(action_space, gym.spaces.Box))["policy_kwargs"]
    policy = ActorCriticPolicy(obs_space, action_space, lr_schedule=lambda _: 0.0, **kwargs)
    policy.load_state_dict(state_dict)
    return SB3Policy(policy.eval())


@dataclass
class SB3Envs(Envs):
    """``training.Envs`` for an SB3 run, so that ``RunTracker`` evaluates it unchanged.

    ``training.evaluate`` copies the observation statistics of ``train`` into ``eval``. SB3 trains on
    its own VecEnv, not a gymnasium vector env, so here ``train`` is the eval env itself, and
    :meth:`sync` copies VecNormalize's statistics into it before every evaluation (the copy inside
    ``evaluate`` is then a no-op). ``sb3`` is the env SB3 trains on.
    """

    sb3: VecEnv | None = None

    @classmethod
    def open(cls, cfg: PPOConfig, sb3_env: VecEnv) -> SB3Envs:
        evaluation = make_eval_env(cfg.env_id, cfg.eval_episodes, cfg.normalize_obs, cfg.env_kwargs,
                                   cfg.eval_env_kwargs)  # fmt: skip
        space = evaluation.single_action_space
        continuous = isinstance(space, gym.spaces.Box)
        return cls(train=evaluation, eval=evaluation, continuous=continuous,
                   obs_dim=int(np.prod(evaluation.single_observation_space.shape)),
                   action_dim=int(space.shape[0]) if continuous else int(space.n),
                   action_shape=tuple(space.shape) if continuous else (), sb3=sb3_env)  # fmt: skip

    def sync(self) -> None:
        stats = normalizer_state(self.sb3)
        stats.pop("return_rms", None)
        envs_pkg.load_normalizer_state(self.eval, stats)

    def close(self) -> None:
        self.eval.close()
        self.sb3.close()


# ── the callback that turns SB3's loop into our run directory ────────────────────────────────────


class RunCallback(BaseCallback):
    """Logs a row per update, evaluates, checkpoints; returns False from ``_on_step`` on SIGINT/SIGTERM."""

    def __init__(self, cfg: PPOConfig, run_dir: Path, envs: SB3Envs, stop: runlog.StopFlag, resumed: bool,
                 global_step: int, iteration: int, wall_offset: float) -> None:  # fmt: skip
        super().__init__()
        self.cfg, self.run_dir, self.envs, self.stop = cfg, run_dir, envs, stop
        self.global_step, self.iteration = global_step, iteration
        self.run = RunTracker(run_dir, ALGO, cfg, TAGS, global_step, wall_offset, resumed)
        self.episode_returns: list[float] = []  # Monitor's raw returns and lengths since the last row
        self.episode_lengths: list[int] = []
        self.update_pending = False  # SB3 runs train() after on_rollout_end; its row is not yet written

    def policy(self) -> SB3Policy:
        return SB3Policy(self.model.policy)

    def checkpoint(self) -> None:
        runlog.save_checkpoint(self.run_dir, {
            "algo": ALGO, "env_id": self.cfg.env_id, "global_step": self.global_step, "iteration": self.iteration,
            "wall_time_s": self.run.wall_time(), "model": self.model.policy.state_dict(),
            "normalizers": normalizer_state(self.envs.sb3), "rng": runlog.rng_state(),
        })  # fmt: skip

    def _on_training_start(self) -> None:
        self.run.start_time = time.perf_counter()  # after PPO's construction, as ours starts after its setup

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:  # Monitor's raw return and length of each finished episode
            episode = info.get("episode")
            if episode is not None:
                self.episode_returns.append(float(episode["r"]))
                self.episode_lengths.append(int(episode["l"]))
        return not self.stop.raised

    def _on_rollout_end(self) -> None:
        self.update_pending = True

    def _on_rollout_start(self) -> None:
        if self.update_pending:
            self.write_row()

    def _on_training_end(self) -> None:
        if self.update_pending:  # the last update, after which no rollout starts
            self.write_row()

    def write_row(self) -> None:
        """The row of the rollout ending at ``num_timesteps`` and of the update SB3 just made on it."""
        self.update_pending = False
        values = self.model.logger.name_to_value
        metrics: dict[str, float | None] = {tag: sign * float(values[key]) for tag, (key, sign) in LOSS_KEYS.items()}
        runlog.check_finite(metrics, self.model.policy)  # type: ignore[arg-type]
        self.global_step, self.iteration = self.model.num_timesteps, self.iteration + 1
        metrics["losses/explained_variance"] = float(values["train/explained_variance"])
        metrics["charts/learning_rate"] = float(values["train/learning_rate"])
        self.envs.sync()  # the evaluation env normalizes with VecNormalize's current statistics
        self.run.record(self.global_step, metrics, self.policy(), self.envs, self.episode_returns, self.episode_lengths)
        self.episode_returns.clear()
        self.episode_lengths.clear()
        if self.run.checkpoint_due(self.global_step, stopping=False):
            self.checkpoint()


def _non_finite_error(policy: nn.Module) -> str | None:
    """The NonFiniteError message if ``policy`` holds NaN or inf parameters, else None."""
    try:
        runlog.check_finite({}, policy)
    except runlog.NonFiniteError as exc:
        return str(exc)
    return None


# ── train ────────────────────────────────────────────────────────────────────────────────────────


def train(cfg: PPOConfig, run_dir: Path, resume: bool = False) -> dict[str, Any]:
    """Train SB3's PPO into ``run_dir``; returns the summary also written to ``summary.json``."""
    validate(cfg)
    seed_everything(cfg.seed)
    global_step, iteration, wall_offset, ckpt = 0, 0, 0.0, None
    if resume:
        ckpt = runlog.load_checkpoint(run_dir, {"algo": ALGO, "env_id": cfg.env_id})
        global_step, iteration, wall_offset = ckpt["global_step"], ckpt["iteration"], ckpt["wall_time_s"]
    # A resumed run's envs start new episodes, from seeds derived from the step count (as training.restore_envs).
    sb3_env = make_sb3_env(cfg, seed=cfg.seed + global_step)
    model = PPO("MlpPolicy", sb3_env, **sb3_arguments(cfg, isinstance(sb3_env.action_space, gym.spaces.Box)))
    if ckpt is not None:
        model.policy.load_state_dict(ckpt["model"])
        load_normalizer_state(sb3_env, ckpt["normalizers"])
        runlog.load_rng_state(ckpt["rng"])  # after PPO(seed=…), which reseeds the global generators
        model.num_timesteps = global_step  # learn(reset_num_timesteps=False) counts on from here
    envs = SB3Envs.open(cfg, sb3_env)
    status, error = "completed", None
    with runlog.StopFlag() as stop:
        callback = RunCallback(cfg, run_dir, envs, stop, resume, global_step, iteration, wall_offset)
        try:
            if global_step < cfg.total_steps:  # a run interrupted after its last update has none left
                model.learn(cfg.total_steps - global_step, callback=callback, reset_num_timesteps=False)
            if stop.raised:
                status = "interrupted"
            callback.checkpoint()  # weights after the last completed update, at its step
        except runlog.NonFiniteError as exc:
            status, error = "failed", str(exc)
        except Exception as exc:  # noqa: BLE001  any crash is recorded in summary.json, as ppo.train does
            # torch.distributions refuses NaN parameters mid-update (ValueError): that is a non-finite failure.
            status, error = "failed", _non_finite_error(model.policy)
            if error is None:
                error = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
    envs.sync()
    extra = memory_report(model.policy.optimizer, actor_critic=model.policy)
    return callback.run.finish(callback.policy(), envs, status, error, callback.global_step, extra)
