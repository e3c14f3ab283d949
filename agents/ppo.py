"""Proximal Policy Optimization (Schulman et al. 2017, arXiv 1707.06347) with GAE, read top to bottom.

One iteration: collect T steps in N envs (``rollout.collect_segment``) → GAE advantages
(``advantages.gae``) → K epochs of shuffled minibatches of the clipped surrogate, value loss and entropy
bonus (``losses``) → log, evaluate, checkpoint (``runlog``).

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
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from agents import advantages as adv
from agents import losses, runlog
from agents.config import check
from agents.networks import ActorCritic, clip_grad_norm_, flatten_parameters
from agents.rollout import RolloutState, Segment, SegmentBuffers, collect_segment
from agents.seeding import seed_everything
from agents.training import RunTracker, memory_report, network_spec, open_envs, restore_envs, save_envs

TAGS = [
    "charts/episodic_return", "charts/episodic_length", "charts/SPS", "charts/learning_rate",
    "losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl", "losses/clipfrac",
    "losses/explained_variance", "eval/return_mean", "eval/return_std",
]  # fmt: skip


@dataclass(frozen=True)
class PPOConfig:
    """Every setting of a PPO run. Presets: ``agents/presets/ppo.yaml``; overrides: ``--set key=value``."""

    env_id: str
    """Any registered gymnasium id."""
    seed: int = 0
    """Seeds torch, numpy and the training envs."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the env (RL Zoo's ``--env-kwargs``), e.g. ``horizon: 300`` for the testbed's
    tasks; the training and the evaluation envs both get them."""
    eval_env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Env keyword arguments that differ at evaluation, on top of ``env_kwargs`` (RL Zoo's
    ``--eval-env-kwargs``), e.g. the tasks' ``distractor_scale: 0``: their distractor rewards are
    zero-mean and blind to actions, so dropping them keeps a policy's expected return and removes noise."""
    reward_delay: int | Literal["end"] | None = None
    """k: release the rewards accumulated every k steps, or ``end``: only at the episode's end
    (``envs/delay.py``); none: as the env gives them. Training only: the return evaluation reports is
    the same sum either way."""
    total_steps: int = 1_000_000
    """Env steps to train for (every sub-env step counts)."""
    n_envs: int = 1
    """N: parallel envs."""
    n_steps: int = 2048
    """T: steps per env per iteration."""
    minibatch_size: int = 64
    """Samples per gradient step (RL Zoo's ``batch_size``)."""
    n_epochs: int = 10
    """K: passes over each segment."""
    gamma: float = 0.99
    """γ: discount."""
    gae_lambda: float = 0.95
    """λ: GAE's bias-variance trade-off; 0 is one-step TD, 1 is Monte Carlo."""
    learning_rate: float = 3e-4
    """Adam's step size (its start value when annealed)."""
    anneal_lr: bool = False
    """Decay the learning rate linearly to 0 over the run."""
    clip_range: float = 0.2
    """ε: the ratio is clipped to [1 − ε, 1 + ε]."""
    anneal_clip_range: bool = False
    """Decay ε linearly to 0 over the run."""
    clip_range_vf: float | None = None
    """ε_v: clip the value prediction to V_old ± ε_v; None for no clipping."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    target_kl: float | None = None
    """Stop an iteration's epochs once approx_kl exceeds 1.5 × target_kl; None to never stop."""
    normalize_advantage: bool = True
    """Standardize advantages per minibatch."""
    normalize_obs: bool = False
    """Running observation normalization (clipped to ±10)."""
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return (clipped to ±10)."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Widths of the hidden layers of the actor and of the critic."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Hidden activation."""
    shared_trunk: bool = False
    """One trunk for actor and critic instead of two."""
    ortho_init: bool = True
    """Orthogonal initialization; False keeps torch's default."""
    log_std_init: float = 0.0
    """Initial log σ of the Gaussian policy (continuous actions)."""
    vectorization: Literal["auto", "native", "sync", "async"] = "auto"
    """How the N envs run: gymnasium's native vector env where it exists (auto), or sync/async."""
    eval_interval: int = 50_000
    """Env steps between deterministic evaluations; 0 evaluates only at the end."""
    eval_episodes: int = 10
    """Episodes per evaluation, on separate envs with fixed seeds."""
    checkpoint_interval: int = 100_000
    """Env steps between checkpoints (one is also written at the end and on SIGINT/SIGTERM)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the networks live; the envs always run on the CPU."""

    def __post_init__(self) -> None:
        check(self.total_steps > 0, f"total_steps must be positive, got {self.total_steps}")
        check(self.reward_delay in (None, "end") or self.reward_delay >= 1,
              f"reward_delay must be a number of steps >= 1, end or none; got {self.reward_delay}")  # fmt: skip
        check(self.n_envs >= 1, f"n_envs must be at least 1, got {self.n_envs}")
        check(self.n_steps >= 1, f"n_steps must be at least 1, got {self.n_steps}")
        check(
            1 <= self.minibatch_size <= self.batch_size,
            f"minibatch_size must be in [1, n_steps·n_envs = {self.batch_size}], got {self.minibatch_size}",
        )
        check(self.n_epochs >= 1, f"n_epochs must be at least 1, got {self.n_epochs}")
        check(0.0 <= self.gamma <= 1.0, f"gamma must be in [0, 1], got {self.gamma}")
        check(0.0 <= self.gae_lambda <= 1.0, f"gae_lambda must be in [0, 1], got {self.gae_lambda}")
        check(self.learning_rate > 0, f"learning_rate must be positive, got {self.learning_rate}")
        check(0.0 < self.clip_range < 1.0, f"clip_range must be in (0, 1), got {self.clip_range}")
        check(self.clip_range_vf is None or self.clip_range_vf > 0, "clip_range_vf must be positive or none")
        check(self.ent_coef >= 0 and self.vf_coef >= 0, "ent_coef and vf_coef must be non-negative")
        check(self.max_grad_norm > 0, f"max_grad_norm must be positive, got {self.max_grad_norm}")
        check(self.target_kl is None or self.target_kl > 0, "target_kl must be positive or none")
        check(len(self.hidden_sizes) >= 1 and min(self.hidden_sizes) >= 1, "hidden_sizes must be positive widths")
        check(self.eval_interval >= 0, f"eval_interval must be >= 0, got {self.eval_interval}")
        check(self.eval_episodes >= 1, f"eval_episodes must be at least 1, got {self.eval_episodes}")
        check(self.checkpoint_interval >= 0, f"checkpoint_interval must be >= 0, got {self.checkpoint_interval}")

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
    (flat_params,) = optimizer.param_groups[0]["params"]
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

            flat_params.grad.zero_()
            loss.backward()
            clip_grad_norm_(flat_params, cfg.max_grad_norm)
            optimizer.step()

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


def train(cfg: PPOConfig, run_dir: Path, resume: bool = False, name: str = "ppo") -> dict[str, Any]:
    """Train PPO into ``run_dir``; returns the summary also written to ``summary.json``."""
    # ── setup ───────────────────────────────────────────────────────────────────────────────────────
    seed_everything(cfg.seed)
    envs = open_envs(cfg.env_id, cfg.n_envs, cfg.eval_episodes, cfg.normalize_obs, cfg.normalize_reward, cfg.gamma,
                     cfg.vectorization, cfg.env_kwargs, cfg.reward_delay, cfg.eval_env_kwargs)  # fmt: skip
    env = envs.train
    model = ActorCritic(network_spec(env, cfg)).to(cfg.device)
    flat_params = flatten_parameters(model)  # one tensor for Adam and the gradient clip: less overhead
    optimizer = torch.optim.Adam([flat_params], lr=cfg.learning_rate, eps=1e-5, fused=True)
    buffers = SegmentBuffers(cfg.n_steps, cfg.n_envs, envs.obs_dim, envs.action_shape, not envs.continuous)
    global_step, iteration, wall_offset = 0, 0, 0.0
    if resume:
        ckpt = runlog.load_checkpoint(run_dir, {"algo": name, "env_id": cfg.env_id})
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        global_step, iteration, wall_offset = ckpt["global_step"], ckpt["iteration"], ckpt["wall_time_s"]
        state = restore_envs(env, ckpt, cfg.seed)
        runlog.load_rng_state(ckpt["rng"])
    else:
        obs, _ = env.reset(seed=cfg.seed)
        state = RolloutState(np.asarray(obs, dtype=np.float32), np.zeros(cfg.n_envs, dtype=bool))
    run = RunTracker(run_dir, name, cfg, TAGS, global_step, wall_offset, resume)
    status, error = "completed", None

    def checkpoint() -> None:
        runlog.save_checkpoint(run_dir, {
            "algo": name, "env_id": cfg.env_id, "global_step": global_step, "iteration": iteration,
            "wall_time_s": run.wall_time(), "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "rng": runlog.rng_state(), **save_envs(env, state),
        })  # fmt: skip

    with runlog.StopFlag() as stop:
        try:
            while global_step < cfg.total_steps:
                # ── collect T steps in N envs ───────────────────────────────────────────────────────
                segment = collect_segment(env, model, state, buffers, cfg.device)
                global_step += cfg.batch_size
                iteration += 1

                # ── schedules: linear decay by the fraction of the budget still to go after this
                # segment, as SB3 computes it, so the RL Zoo presets mean the same here ────────────────
                remaining = max(1.0 - global_step / cfg.total_steps, 0.0)
                lr = cfg.learning_rate * (remaining if cfg.anneal_lr else 1.0)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                clip = cfg.clip_range * (remaining if cfg.anneal_clip_range else 1.0)

                # ── advantages and update ───────────────────────────────────────────────────────────
                advantages = adv.gae(segment.rewards, segment.values, segment.next_values, segment.terminated,
                                     segment.done, cfg.gamma, cfg.gae_lambda)  # (T, N)  # fmt: skip
                returns = advantages + segment.values  # (T, N)
                stats = update(model, optimizer, segment, advantages, returns, cfg, clip)
                metrics: dict[str, float | None] = {
                    "losses/policy_loss": stats.policy_loss, "losses/value_loss": stats.value_loss,
                    "losses/entropy": stats.entropy, "losses/approx_kl": stats.approx_kl,
                    "losses/clipfrac": stats.clipfrac,
                }  # fmt: skip
                runlog.check_finite(metrics, model)

                # ── log, evaluate, checkpoint ───────────────────────────────────────────────────────
                valid = segment.sample_mask
                metrics["losses/explained_variance"] = losses.explained_variance(segment.values[valid], returns[valid])
                metrics["charts/learning_rate"] = lr
                run.record(global_step, metrics, model, envs, state.episode_returns, state.episode_lengths)
                state.episode_returns.clear()
                state.episode_lengths.clear()
                if run.checkpoint_due(global_step, stop.raised):
                    checkpoint()
                if stop.raised:
                    status = "interrupted"
                    break
            else:
                checkpoint()
        except runlog.NonFiniteError as exc:
            status, error = "failed", str(exc)
        except Exception as exc:  # noqa: BLE001  any crash is recorded in summary.json, then shown in full
            status, error = "failed", f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
    extra = memory_report(optimizer, actor_critic=model)
    return run.finish(model, envs, status, error, global_step, extra)
