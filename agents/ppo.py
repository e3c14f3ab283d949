"""Proximal Policy Optimization (Schulman et al. 2017, arXiv 1707.06347) with GAE, read top to bottom.

One iteration: collect T steps in N envs (``rollout.collect_segment``) → GAE advantages
(``advantages.gae``) → K epochs of shuffled minibatches of the clipped surrogate, value loss and entropy
bonus (``losses``). ``training.run`` logs, evaluates and checkpoints around it.

Implementation details followed ("The 37 implementation details of PPO", Huang et al. 2022):
 1. vectorized envs;  2. orthogonal init (√2 hidden, 0.01 policy, 1 value), switchable;
 3. Adam with ε = 1e-5;  4. optional linear annealing of the learning rate (and of the clip range);
 5. GAE(γ, λ);  6. epochs × shuffled minibatches;  7. per-minibatch advantage normalization;
 8. clipped surrogate;  9. optional value clipping;  10. entropy bonus;  11. global gradient-norm clipping;
 12. approx_kl (k3) and clipfrac diagnostics, optional early stop at a target KL;
 13. separate actor and critic MLPs by default;  14. continuous actions: state-independent log-std,
 actions clipped to the bounds by the env, observation normalization and reward scaling with clipping.

Deliberate deviations:
 - Truncation bootstraps from V(final observation); the original baselines (and CleanRL) treat a time
   limit as termination, which biases values near the limit.
 - Autoreset steps (NEXT_STEP mode, see ``rollout``) are masked out: about one env step per episode is
   counted in the step budget but is not a training sample.
 - Value loss and target KL follow Stable-Baselines3, whose tuned presets we carry over: the value loss is
   the mean squared error (no ½), clipping replaces the prediction instead of taking the maximum of the
   clipped and unclipped errors, and the epoch loop stops before a minibatch whose approx_kl exceeds
   1.5 × target_kl.
 - Minibatches split the valid samples into exactly ``n_steps · n_envs / minibatch_size`` near-equal
   parts, so the number of gradient steps equals SB3's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from agents import advantages as adv
from agents import losses
from agents.config import MAX_BATCH, MAX_ENVS, RunConfig, check
from agents.networks import ActorCritic, adam, gradient_step
from agents.rollout import RolloutState, Segment, SegmentBuffers, collect_segment
from agents.training import (
    Agent,
    Collected,
    Envs,
    network_spec,
    obs_statistics,
    open_envs,
    restore_envs,
    run,
    save_envs,
)
from envs import EnvOptions

TAGS = [
    "charts/episodic_return", "charts/episodic_length", "charts/SPS", "charts/learning_rate",
    "losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl", "losses/clipfrac",
    "losses/explained_variance", "eval/return_mean", "eval/return_std",
]  # fmt: skip


@dataclass(frozen=True)
class PPOConfig(RunConfig):
    """Every setting of a PPO run: the shared ones of :class:`RunConfig`, then PPO's own. Presets:
    ``agents/presets/ppo.yaml``; overrides: ``--set key=value``."""

    n_envs: int = 1
    """N: parallel envs."""
    n_steps: int = 2048
    """T: steps per env per iteration."""
    minibatch_size: int = 64
    """Samples per gradient step (RL Zoo's ``batch_size``)."""
    gae_lambda: float = 0.95
    """λ: GAE's bias-variance trade-off; 0 is one-step TD, 1 is Monte Carlo."""
    clip_range: float = 0.2
    """ε: the ratio is clipped to [1 − ε, 1 + ε]."""
    anneal_clip_range: bool = False
    """Decay ε linearly to 0 over the run."""
    clip_range_vf: float | None = None
    """ε_v: clip the value prediction to V_old ± ε_v; None for no clipping."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    target_kl: float | None = None
    """Stop an iteration's epochs once approx_kl exceeds 1.5 × target_kl; None to never stop."""
    normalize_advantage: bool = True
    """Standardize advantages per minibatch."""
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return (clipped to ±10)."""
    shared_trunk: bool = False
    """One trunk for actor and critic instead of two."""
    vectorization: Literal["auto", "native", "sync", "async"] = "auto"
    """How the N envs run: gymnasium's native vector env where it exists (auto), or sync/async."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.n_envs >= 1, f"n_envs must be at least 1, got {self.n_envs}")
        check(self.n_steps >= 1, f"n_steps must be at least 1, got {self.n_steps}")
        self.check_size(self.n_envs, MAX_ENVS, "n_envs")
        self.check_size(self.batch_size, MAX_BATCH, "n_steps · n_envs, the env steps of one iteration,")
        check(
            1 <= self.minibatch_size <= self.batch_size,
            f"minibatch_size must be in [1, n_steps·n_envs = {self.batch_size}], got {self.minibatch_size}",
        )
        check(0.0 <= self.gae_lambda <= 1.0, f"gae_lambda must be in [0, 1], got {self.gae_lambda}")
        check(0.0 < self.clip_range < 1.0, f"clip_range must be in (0, 1), got {self.clip_range}")
        check(self.clip_range_vf is None or self.clip_range_vf > 0, "clip_range_vf must be positive or none")
        check(self.vf_coef >= 0, f"vf_coef must be non-negative, got {self.vf_coef}")
        check(self.target_kl is None or self.target_kl > 0, "target_kl must be positive or none")

    @property
    def batch_size(self) -> int:
        """Samples per iteration, T · N."""
        return self.n_steps * self.n_envs

    @property
    def num_minibatches(self) -> int:
        return max(1, self.batch_size // self.minibatch_size)

    @property
    def num_iterations(self) -> int:
        return math.ceil(self.total_steps / self.batch_size)


@dataclass
class UpdateStats:
    policy_loss: float
    value_loss: float
    entropy: float
    approx_kl: float
    clipfrac: float


def update(
    model: ActorCritic,
    optimizer: torch.optim.Optimizer,
    segment: Segment,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    cfg: PPOConfig,
    clip: float,
) -> UpdateStats:
    """K epochs of shuffled minibatches over one segment; returns the means over all minibatches.

    ``advantages`` and ``returns`` (the value targets) are (T, N); autoreset steps are skipped.
    """
    valid = segment.sample_mask.flatten().nonzero().squeeze(1)  # (≤T·N,)
    obs = segment.obs.flatten(0, 1).to(cfg.device)  # (T·N, obs_dim)
    actions = segment.actions.flatten(0, 1).to(cfg.device)
    old_log_probs = segment.log_probs.flatten().to(cfg.device)
    old_values = segment.values.flatten().to(cfg.device)
    advantages, returns = advantages.flatten().to(cfg.device), returns.flatten().to(cfg.device)
    totals = torch.zeros(5)  # policy, value, entropy, approx_kl, clipfrac; summed to avoid per-step syncs
    count = 0
    for _ in range(cfg.n_epochs):
        for idx in valid[torch.randperm(len(valid))].tensor_split(cfg.num_minibatches):
            new_log_probs, entropy, values = model.evaluate(obs[idx], actions[idx])
            log_ratio = new_log_probs - old_log_probs[idx]
            ratio = log_ratio.exp()
            approx_kl = losses.k3_kl(log_ratio).mean().detach()
            if cfg.target_kl is not None and approx_kl.item() > 1.5 * cfg.target_kl:
                break
            mb_advantages = adv.normalize(advantages[idx]) if cfg.normalize_advantage else advantages[idx]
            policy_loss = losses.clipped_surrogate(ratio, mb_advantages, clip, clip).mean()
            value_loss = losses.value_loss(values, old_values[idx], returns[idx], cfg.clip_range_vf).mean()
            entropy_mean = entropy.mean()
            loss = policy_loss + cfg.vf_coef * value_loss
            if cfg.ent_coef:  # skipped at 0 to keep the backward graph small
                loss = loss - cfg.ent_coef * entropy_mean

            gradient_step(optimizer, loss, cfg.max_grad_norm)

            clip_low, clip_high = losses.clip_fraction(ratio.detach(), clip, clip)
            totals += torch.stack(
                [policy_loss.detach(), value_loss.detach(), entropy_mean.detach(), approx_kl, clip_low + clip_high]
            )
            count += 1
        else:
            continue
        break  # the target-KL stop leaves the epoch loop too
    means = (totals / max(count, 1)).tolist()
    return UpdateStats(*means)


# ── the iteration: collect T steps in N envs → GAE → update ───────────────────────────────────────


@dataclass
class Learner:
    """What PPO carries from one iteration to the next."""

    cfg: PPOConfig
    envs: Envs
    model: ActorCritic
    optimizer: torch.optim.Optimizer
    buffers: SegmentBuffers  # (T, N) storage, reused by every segment
    rollout: RolloutState  # the envs' next observations, carried across segments


def build(cfg: PPOConfig) -> Agent:
    """PPO's envs, actor-critic and Adam, as the parts that ``training.run`` drives."""
    envs = open_envs(cfg, cfg.n_envs, env_options(cfg))
    model = ActorCritic(network_spec(envs.train, cfg, cfg.shared_trunk)).to(cfg.device)
    optimizer = adam(model, cfg.learning_rate)
    buffers = SegmentBuffers(cfg.n_steps, cfg.n_envs, envs.obs_dim, envs.action_shape, not envs.continuous)
    obs, _ = envs.train.reset(seed=cfg.seed)
    rollout = RolloutState(np.asarray(obs, dtype=np.float32), np.zeros(cfg.n_envs, dtype=bool))  # (N, obs_dim)
    ppo = Learner(cfg, envs, model, optimizer, buffers, rollout)
    return Agent(
        model=model,
        policy=model,
        optimizer=optimizer,
        eval_env=envs.eval,
        obs_stats=partial(obs_statistics, envs.train),
        collect=partial(collect, ppo),
        update=partial(learn, ppo),
        save=lambda: save_envs(envs.train, ppo.rollout),
        load=partial(load, ppo),
        tags=TAGS,
        networks={"actor_critic": model},
        close=envs.close,
    )


def env_options(cfg: PPOConfig) -> EnvOptions:
    """How PPO's training envs are wrapped: normalization, vectorization, a delayed reward."""
    return EnvOptions(normalize_obs=cfg.normalize_obs, normalize_reward=cfg.normalize_reward, gamma=cfg.gamma,
                      vectorization=cfg.vectorization, reward_delay=cfg.reward_delay)


def collect(ppo: Learner, iteration: int) -> Collected:
    """T steps in each of the N envs with the current policy."""
    segment = collect_segment(ppo.envs.train, ppo.model, ppo.rollout, ppo.buffers, ppo.cfg.device)
    returns, lengths = list(ppo.rollout.episode_returns), list(ppo.rollout.episode_lengths)
    ppo.rollout.episode_returns.clear()
    ppo.rollout.episode_lengths.clear()
    return Collected(segment, ppo.cfg.batch_size, returns, lengths)


def learn(ppo: Learner, collected: Collected, iteration: int, progress_remaining: float) -> dict[str, float | None]:
    """GAE advantages, then K epochs of minibatch updates; returns the losses and explained variance."""
    cfg, segment = ppo.cfg, collected.batch
    clip = cfg.clip_range * (progress_remaining if cfg.anneal_clip_range else 1.0)
    advantages = adv.gae(segment.rewards, segment.values, segment.next_values, segment.terminated, segment.done,
                         cfg.gamma, cfg.gae_lambda)  # (T, N)  # fmt: skip
    returns = advantages + segment.values  # (T, N)
    stats = update(ppo.model, ppo.optimizer, segment, advantages, returns, cfg, clip)
    valid = segment.sample_mask
    return {
        "losses/policy_loss": stats.policy_loss, "losses/value_loss": stats.value_loss,
        "losses/entropy": stats.entropy, "losses/approx_kl": stats.approx_kl, "losses/clipfrac": stats.clipfrac,
        "losses/explained_variance": losses.explained_variance(segment.values[valid], returns[valid]),
    }  # fmt: skip


def load(ppo: Learner, ckpt: dict[str, Any]) -> None:
    """The envs exactly as the checkpoint left them, where their state can be captured."""
    ppo.rollout = restore_envs(ppo.envs.train, ckpt, ppo.cfg.seed)


def train(cfg: PPOConfig, run_dir: Path, resume: bool = False, name: str = "ppo") -> dict[str, Any]:
    """Train PPO into ``run_dir``; returns the summary also written to ``summary.json``."""
    return run(build, cfg, run_dir, resume, name)
