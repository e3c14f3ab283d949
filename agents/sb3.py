"""Stable-Baselines3's PPO and A2C as reference runs (``--algo sb3-ppo``, ``--algo sb3-a2c``), logged exactly as
our PPO and A2C log.

Each takes our algorithm's config and presets (:class:`agents.ppo.PPOConfig`, :class:`agents.a2c.A2CConfig`;
:data:`REFERENCES` pairs them); :func:`sb3_arguments` is the one place where a config becomes SB3's ``PPO(...)``
or ``A2C(...)`` arguments, and :func:`make_sb3_env` builds SB3's vector env with our factory's normalization
(VecNormalize, clipped to ±10). Both fit the one run lifecycle (``training.run_stack``, a stack of one seed):
``collect`` is SB3's ``collect_rollouts`` and ``learn`` its ``train()``, the two phases
``OnPolicyAlgorithm.learn`` alternates, with learn's set-up and schedule called as learn calls them. So a run
directory is ``ppo``'s or ``a2c``'s (tags, ``progress.csv``, evaluations, checkpoint, summary), with SB3's own
numbers: its ``train/approx_kl`` averages only the last epoch's minibatches, and every env step is a sample.

Where they differ from ``ppo`` and ``a2c`` (docs/training.md has the details):
 - Resume is not exact: SB3's ``save``/``load`` unpickle, which this project refuses, so a checkpoint holds
   weights, the optimizer's state (Adam's, RMSprop's), VecNormalize's statistics and the RNG states, and the
   envs start new episodes.
 - A NaN in SB3's update ends the run as ``failed`` (:class:`runlog.NonFiniteError`); ``shared_trunk`` is
   refused (SB3 2.x's MlpPolicy has separate actor and critic MLPs).
 - PPO's ``recompute_advantages``, which SB3 lacks, runs one ``train()`` of one epoch per epoch, the buffer's
   advantages and targets recomputed in between (:func:`recompute_advantages`); ``target_kl`` is refused
   with it, since SB3's early stop would end only the epoch it fired in.
 - VecNormalize restarts the return that scales rewards at every episode end: ``reward_norm_restart=done``.
 - SB3's A2C takes every env step as a sample and averages over them; ``a2c`` leaves out the autoreset steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv, VecNormalize
from torch import Tensor, nn

import envs as envs_pkg
from agents import a2c, runlog
from agents.a2c import A2CConfig
from agents.config import check
from agents.networks import load_weights
from agents.ppo import FINITE, TAGS, PPOConfig
from agents.registry import Declaration
from agents.run_envs import make_eval_env, observation_statistics
from agents.seeding import env_seeds, generator_seeds, restart_seeds, seed_everything
from agents.training import Callback, Experience, Trainee, run_stack
from envs.delay import DelayedReward
from envs.errors import BadInput

ALGO = "sb3-ppo"
# SB3's logger keys → our tags; SB3 logs the entropy *loss*, −H, so its sign flips.
LOSS_KEYS = {
    "losses/policy_loss": ("train/policy_gradient_loss", 1.0),
    "losses/value_loss": ("train/value_loss", 1.0),
    "losses/entropy": ("train/entropy_loss", -1.0),
    "losses/approx_kl": ("train/approx_kl", 1.0),
    "losses/clipfrac": ("train/clip_fraction", 1.0),
}
A2C_LOSS_KEYS = {
    "losses/policy_loss": ("train/policy_loss", 1.0),
    "losses/value_loss": ("train/value_loss", 1.0),
    "losses/entropy": ("train/entropy_loss", -1.0),
}


# ── our config as SB3's arguments and env ────────────────────────────────────────────────────────


@dataclass(frozen=True)
class LinearSchedule:
    """SB3's schedule convention: value = progress_remaining · start, progress_remaining going 1 → 0."""

    start: float

    def __call__(self, progress_remaining: float) -> float:
        return progress_remaining * self.start


def _spaces(env_id: str) -> tuple[gym.Space, gym.Space]:
    """Observation and action space of one env as SB3's policy sees it (an array observation flattened, as
    :func:`make_sb3_env` flattens it), validating the id and its dependencies first."""
    envs_pkg.check_env_installed(env_id)
    with gym.make(env_id) as env:
        return _flat(env.observation_space), env.action_space


def _flat(space: gym.Space) -> gym.Space:
    """A Box of any shape as the flat Box our factory's ``FlattenObservation`` makes of it (bsuite's (1, n)
    observations); other spaces as they are."""
    return gym.spaces.flatten_space(space) if isinstance(space, gym.spaces.Box) and len(space.shape) > 1 else space


def _wrap(env: gym.Env, delay: Any = None) -> gym.Env:
    """Each SB3 sub-env: its rewards delayed (``reward_delay``), its array observations flattened as our vector
    envs flatten them, so that SB3's policy and our evaluation envs take the same observations."""
    if delay:
        env = DelayedReward(env, delay)
    if _flat(env.observation_space) is not env.observation_space:
        env = gym.wrappers.FlattenObservation(env)
    return env


def check_expressible(cfg: PPOConfig | A2CConfig) -> None:
    """Settings of our PPO or A2C that SB3's cannot run, refused by name."""
    name, ours = reference(cfg).name, reference(cfg).ours
    check(not cfg.shared_trunk, f"{name}: SB3 2.x has no shared actor-critic trunk; use shared_trunk=false")
    check(cfg.reward_offset == 0.0, f"{name} trains on the env's own reward; drop reward_offset or use --algo {ours}")
    if isinstance(cfg, A2CConfig):
        return
    check(
        cfg.value_clip == "prediction",
        "sb3-ppo clips the value prediction only (SB3's clip_range_vf); use "
        "value_clip=prediction, or --algo ppo for CleanRL's value_clip=max",
    )
    check(
        cfg.target_kl is None or not cfg.recompute_advantages,
        "sb3-ppo runs recompute_advantages one epoch per "
        "SB3 train() call, where target_kl would stop only that epoch; drop target_kl or recompute_advantages",
    )


def validate(cfg: PPOConfig | A2CConfig) -> None:
    """Checks that need the env, before anything is written (``lab.cli``'s ``Algo.validate``)."""
    check_expressible(cfg)
    obs_space, action_space = _spaces(cfg.env_id)
    # Our eval envs flatten other observation spaces (Discrete → one-hot), which SB3's policy would re-encode;
    # array observations are flattened for SB3 too (_wrap), so _spaces gives them flat.
    check(
        isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1,
        f"{reference(cfg).name} supports flat Box observations; {cfg.env_id} has {obs_space}. "
        f"Use --algo {reference(cfg).ours}.",
    )
    check(
        isinstance(action_space, gym.spaces.Discrete)
        or (isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1),
        f"{cfg.env_id} has action space {action_space}; the agents support Discrete and 1-D Box actions",
    )


def sb3_arguments(cfg: PPOConfig | A2CConfig, continuous: bool | None = None) -> dict[str, Any]:
    """``PPO("MlpPolicy", env, **sb3_arguments(cfg))`` (``A2C(...)`` for an A2C config): our config as SB3's
    keyword arguments.

    ``continuous`` (whether the actions are a Box) is looked up from the env id when not given; it decides
    whether ``log_std_init`` is passed. Annealed values become :class:`LinearSchedule`.
    """
    check_expressible(cfg)
    if continuous is None:
        continuous = isinstance(_spaces(cfg.env_id)[1], gym.spaces.Box)
    return reference(cfg).arguments(cfg, policy_kwargs(cfg, continuous))


def policy_kwargs(cfg: PPOConfig | A2CConfig, continuous: bool) -> dict[str, Any]:
    """SB3's ``policy_kwargs`` for our network settings: the same ActorCriticPolicy for PPO and A2C."""
    hidden = list(cfg.hidden_sizes)
    kwargs: dict[str, Any] = {
        "net_arch": {"pi": hidden, "vf": list(hidden)},
        "activation_fn": {"tanh": nn.Tanh, "relu": nn.ReLU}[cfg.activation],
        "ortho_init": cfg.ortho_init,  # SB3's gains equal ours: √2 hidden, 0.01 policy, 1 value
        "share_features_extractor": cfg.shared_trunk,  # only a parameter-free flatten layer either way
    }
    if continuous:
        kwargs["log_std_init"] = cfg.log_std_init
    return kwargs


def ppo_arguments(cfg: PPOConfig, policy_kwargs: dict[str, Any]) -> dict[str, Any]:
    """SB3's ``PPO(...)`` keyword arguments for our PPO config."""
    return {
        "n_steps": cfg.n_steps,
        "batch_size": cfg.minibatch_size,
        "n_epochs": 1 if cfg.recompute_advantages else cfg.n_epochs,  # then Learner.learn runs the epochs
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
        "seed": generator_seeds(cfg.seed)[2],  # SB3 seeds its generators with one int: our torch seed
        "device": cfg.device,
        "verbose": 0,
    }


def a2c_arguments(cfg: A2CConfig, policy_kwargs: dict[str, Any]) -> dict[str, Any]:
    """SB3's ``A2C(...)`` keyword arguments for our A2C config: RMSprop (SB3's α = 0.99) with our ε."""
    return {
        "n_steps": cfg.n_steps,
        "gamma": cfg.gamma,
        "gae_lambda": cfg.gae_lambda,
        "learning_rate": LinearSchedule(cfg.learning_rate) if cfg.anneal_lr else cfg.learning_rate,
        "ent_coef": cfg.ent_coef,
        "vf_coef": cfg.vf_coef,
        "max_grad_norm": cfg.max_grad_norm,
        "use_rms_prop": True,
        "rms_prop_eps": cfg.rms_prop_eps,
        "normalize_advantage": cfg.normalize_advantage,
        "policy_kwargs": policy_kwargs,
        "seed": generator_seeds(cfg.seed)[2],  # as ppo_arguments: our torch seed
        "device": cfg.device,
        "verbose": 0,
    }


@dataclass(frozen=True)
class Reference:
    """One SB3 algorithm as a reference for ours: the class, its arguments and what its logs are called here."""

    name: str
    """Its algo name, ``sb3-<ours>``."""
    ours: str
    """Our algo whose config, presets and tags it takes."""
    model: type[OnPolicyAlgorithm]
    arguments: Callable[[Any, dict[str, Any]], dict[str, Any]]
    """(config, policy_kwargs) → SB3's keyword arguments."""
    loss_keys: dict[str, tuple[str, float]]
    """Our tag → (SB3's logger key, sign)."""
    tags: list[str]
    finite: tuple[str, ...]


REFERENCES: dict[type, Reference] = {
    PPOConfig: Reference("sb3-ppo", "ppo", PPO, ppo_arguments, LOSS_KEYS, TAGS, FINITE),
    A2CConfig: Reference("sb3-a2c", "a2c", A2C, a2c_arguments, A2C_LOSS_KEYS, a2c.TAGS, a2c.STATS),
}


def reference(cfg: PPOConfig | A2CConfig) -> Reference:
    """The SB3 reference of the algorithm ``cfg`` configures."""
    return REFERENCES[type(cfg)]


def make_sb3_env(cfg: PPOConfig | A2CConfig) -> VecEnv:
    """N Monitor-wrapped envs (DummyVecEnv; SubprocVecEnv for ``vectorization=async``), then VecNormalize
    with our factory's settings when either normalization is on. ``Learner`` sets the seeds of its first reset."""
    vec_env_cls = SubprocVecEnv if cfg.vectorization == "async" else DummyVecEnv  # SB3 has no native vector envs
    env = make_vec_env(
        cfg.env_id,
        n_envs=cfg.n_envs,
        seed=cfg.seed,
        vec_env_cls=vec_env_cls,
        env_kwargs=cfg.env_kwargs,
        wrapper_class=_wrap,
        wrapper_kwargs={"delay": cfg.reward_delay},
    )
    if cfg.normalize_obs or cfg.normalize_reward:
        env = VecNormalize(
            env,
            norm_obs=cfg.normalize_obs,
            norm_reward=cfg.normalize_reward,
            clip_obs=10.0,
            clip_reward=10.0,
            gamma=cfg.gamma,
        )
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
        raise BadInput(
            "the checkpoint's normalizer statistics do not match the normalization settings of the run's "
            "config.yaml (normalize_obs, normalize_reward): restore the settings it was trained with"
        )
    for name, attr in (("obs_rms", "obs_rms"), ("return_rms", "ret_rms")):
        if name in state:
            rms: RunningMeanStd = getattr(env, attr)
            rms.mean = np.array(state[name]["mean"], dtype=np.float64, copy=True)
            rms.var = np.array(state[name]["var"], dtype=np.float64, copy=True)
            rms.count = float(state[name]["count"])


# ── SB3's PPO as the parts that training.run_stack drives ──────────────────────────────────────────────


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


def load_policy(cfg: PPOConfig | A2CConfig, state_dict: dict[str, Tensor]) -> SB3Policy:
    """The policy of a checkpoint's ``model`` (for ``testbed eval`` and videos), without building PPO or A2C."""
    obs_space, action_space = _spaces(cfg.env_id)
    check_expressible(cfg)
    kwargs = policy_kwargs(cfg, isinstance(action_space, gym.spaces.Box))
    policy = ActorCriticPolicy(obs_space, action_space, lr_schedule=lambda _: 0.0, **kwargs)
    load_weights(policy, state_dict, "the checkpoint")
    return SB3Policy(policy.eval())


class EpisodeRecorder(BaseCallback):
    """Collects Monitor's raw return and length of every episode that ends during a rollout, and its raw last
    reward (VecNormalize's original reward where it scales them)."""

    def __init__(self) -> None:
        super().__init__()
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.last_rewards: list[float] = []

    def _on_step(self) -> bool:
        env = self.model.get_env()
        rewards = env.get_original_reward() if isinstance(env, VecNormalize) else self.locals["rewards"]  # (N,)
        for i, info in enumerate(self.locals["infos"]):
            episode = info.get("episode")
            if episode is not None:
                self.returns.append(float(episode["r"]))
                self.lengths.append(int(episode["l"]))
                self.last_rewards.append(float(rewards[i]))
        return True


class ProcessGenerators:
    """The process's global random number generators, which SB3 draws from: one seed per process."""

    def state(self, k: int) -> dict[str, Any]:
        return runlog.rng_state()

    def load(self, k: int, state: dict[str, Any]) -> None:
        runlog.load_rng_state(state)


class Learner:
    """SB3's PPO or A2C for one seed (a :class:`~agents.training.Trainer`): SB3's own VecEnv and model, with our
    evaluation env; ``training.run_stack`` drives SB3's two phases. Its random numbers are the process's
    global generators, which SB3 draws from."""

    def __init__(self, cfgs: list[PPOConfig] | list[A2CConfig]) -> None:
        self.reference = reference(cfgs[0])
        self.tags, self.finite = self.reference.tags, self.reference.finite
        check(len(cfgs) == 1, f"{self.reference.name} trains one seed per process; run its seeds as separate runs")
        self.cfg = cfg = cfgs[0]
        seed_everything(cfg.seed)
        self.env = make_sb3_env(cfg)
        try:
            continuous = isinstance(self.env.action_space, gym.spaces.Box)
            self.model = self.reference.model("MlpPolicy", self.env, **sb3_arguments(cfg, continuous))
            self.env.unwrapped._seeds = env_seeds(cfg.seed, cfg.n_envs)  # our seeds; the model's env.seed(s) set s + i
            eval_env = make_eval_env(cfg, cfg.eval_episodes)
        except BaseException:
            self.env.close()
            raise
        self.recorder: BaseCallback = EpisodeRecorder()
        self.started = False
        policy = self.model.policy
        self.trainees = [
            Trainee(
                policy,
                SB3Policy(policy),
                policy.optimizer,
                eval_env,
                lambda: observation_statistics(normalizer_state(self.env)),
                {"actor_critic": policy},
            )
        ]
        self.random = ProcessGenerators()

    def collect(self, iterations: list[int], running: list[bool]) -> list[Experience | None]:
        """One rollout of ``n_steps`` in each env, as ``OnPolicyAlgorithm.learn`` makes it."""
        model = self.model
        if not self.started:  # learn()'s set-up: the first reset, and the step count it schedules against
            _, self.recorder = model._setup_learn(
                self.cfg.total_steps - model.num_timesteps, self.recorder, reset_num_timesteps=False
            )
            self.started = True
        before = model.num_timesteps
        model.collect_rollouts(model.env, self.recorder, model.rollout_buffer, n_rollout_steps=model.n_steps)
        model._update_current_progress_remaining(model.num_timesteps, model._total_timesteps)
        recorder: EpisodeRecorder = self.recorder  # type: ignore[assignment]
        returns, lengths, last = list(recorder.returns), list(recorder.lengths), list(recorder.last_rewards)
        for taken in (recorder.returns, recorder.lengths, recorder.last_rewards):
            taken.clear()
        return [Experience(None, model.num_timesteps - before, returns, lengths, last)]

    def learn(
        self,
        collected: list[Experience | None],
        iterations: list[int],
        remaining: list[float],
        learning_rates: list[float],
        running: list[bool],
    ) -> list[dict[str, float | None]]:
        """SB3's own ``train()``, at SB3's own schedule (the same as ours); its logged values under our tags.
        With PPO's ``recompute_advantages``, one ``train()`` of one epoch per epoch, the advantages recomputed
        before each after the first."""
        recompute = isinstance(self.cfg, PPOConfig) and self.cfg.recompute_advantages
        epochs = self.cfg.n_epochs if recompute else 1
        logged: list[dict[str, float]] = []
        for epoch in range(epochs):
            if epoch:
                recompute_advantages(self.model)
            try:
                self.model.train()
            except ValueError:
                # torch.distributions refuses NaN parameters mid-update: that is a non-finite failure.
                runlog.check_finite({}, self.model.policy)
                raise
            logged.append(dict(self.model.logger.name_to_value))
        metrics: dict[str, float | None] = {
            tag: sign * float(np.mean([values[key] for values in logged]))
            for tag, (key, sign) in self.reference.loss_keys.items()
        }
        metrics["losses/explained_variance"] = float(logged[0]["train/explained_variance"])
        return [metrics]

    def save(self, k: int) -> dict[str, Any]:
        return {"normalizers": normalizer_state(self.env)}

    def load(self, k: int, checkpoint: dict[str, Any]) -> None:
        """The VecNormalize statistics; the envs start new episodes, from their restart seeds at the step count."""
        load_normalizer_state(self.model.get_env(), checkpoint["normalizers"])
        self.model.num_timesteps = checkpoint["global_step"]  # learn's set-up counts on from here
        self.env.unwrapped._seeds = restart_seeds(self.cfg.seed, checkpoint["global_step"], self.cfg.n_envs)

    def close(self) -> None:
        self.trainees[0].eval_env.close()
        self.env.close()


def recompute_advantages(model: PPO) -> None:
    """GAE(γ, λ) advantages Â_t and value targets Â_t + V(s_t) of the rollout buffer, from the current
    critic's V(s_t) and V(s_T) (the state after the rollout, ``model._last_obs``), as SB3 computes them after
    collecting. The buffer keeps the collection's V(s_t) as the old values that ``clip_range_vf`` clips
    around. ``get()`` flattens the buffer to (N·T, ...), env-major; it is put back to (T, N, ...) first."""
    buffer = model.rollout_buffer
    T, N = buffer.buffer_size, buffer.n_envs
    if buffer.generator_ready:
        features = {"observations": tuple(buffer.obs_shape), "actions": (buffer.action_dim,)}
        for name in ("observations", "actions", "values", "log_probs", "advantages", "returns"):
            flat = getattr(buffer, name)
            setattr(buffer, name, flat.reshape(N, T, *features.get(name, ())).swapaxes(0, 1))
        buffer.generator_ready = False
    with torch.no_grad():
        states = obs_as_tensor(buffer.observations.reshape(T * N, *buffer.obs_shape), model.device)
        values = model.policy.predict_values(states).cpu().numpy().reshape(T, N)  # (T, N)
        last_values = model.policy.predict_values(obs_as_tensor(model._last_obs, model.device))  # (N, 1)
    collected = buffer.values
    buffer.values = values
    buffer.compute_returns_and_advantage(last_values=last_values, dones=model._last_episode_starts)
    buffer.values = collected


def train(
    cfg: PPOConfig | A2CConfig,
    run_dir: Path,
    resume: bool = False,
    name: str | None = None,
    callback: Callback | None = None,
) -> dict[str, Any]:
    """Train SB3's PPO or A2C (as ``cfg`` configures ours) into ``run_dir``; returns the summary also written to
    ``summary.json``. ``callback``: called after each iteration (``training.Callback``)."""
    validate(cfg)
    return run_stack(Learner, [cfg], [run_dir], resume, name or reference(cfg).name, callback)[0]


# ── Declaration: SB3's PPO and A2C, with our PPO's and A2C's configs and presets ──────────────────────────

ALGORITHMS = (
    Declaration(
        "sb3-ppo",
        presets="ppo",  # it mirrors our PPO: same config, same presets
        config=PPOConfig,
        train=train,
        checks=validate,
        load_policy=lambda cfg, env, weights: load_policy(cfg, weights),  # its policy needs no env to be built
    ),
    Declaration(
        "sb3-a2c",
        presets="a2c",  # it mirrors our A2C: same config, same presets
        config=A2CConfig,
        train=train,
        checks=validate,
        load_policy=lambda cfg, env, weights: load_policy(cfg, weights),
    ),
)
