"""Proximal Policy Optimization (Schulman et al. 2017, arXiv 1707.06347) with GAE, read top to bottom.

One iteration, in four files: collect T steps in N envs (``onpolicy.OnPolicy.collect``, the shared collector)
→ GAE advantages (``onpolicy.gae_targets``, ``advantages.gae``) → K epochs of shuffled minibatches of the
clipped surrogate, value loss and entropy bonus (``losses``), here. ``training.run_stack`` logs, evaluates and
checkpoints around it.

Written once, for S seeds side by side: every tensor has the seed axis first, and a single run is a stack
of one. The shared layer (``onpolicy``) keeps what is each seed's own, so that seed k's numbers are
bit-identical whatever seeds share its process (``testbed train --seed k``, ``--seeds``, a bench at any
``--stack``, a tuning trial): its envs and normalizers, its random number generators, its optimizer state
and gradient-norm clip; PPO's update keeps each seed's minibatches (padded to a width the config fixes),
advantage normalization and target-KL stop within its row.

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
   the mean squared error (no ½), clipping replaces the prediction (``value_clip: max`` takes CleanRL's
   larger of the clipped and unclipped errors), and the epoch loop stops before a minibatch whose
   approx_kl exceeds 1.5 × target_kl.
 - Minibatches split the valid samples into exactly ``n_steps · n_envs / minibatch_size`` near-equal
   parts, so the number of gradient steps equals SB3's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import torch
from torch import Tensor

from agents import advantages as adv
from agents import losses
from agents.config import MAX_BATCH, MAX_ENVS, RunConfig, check
from agents.onpolicy import (
    OnPolicy,
    Segment,
    actor_critic,
    add_explained_variances,
    critic_targets,
    env_options,
    gae_targets,
    join_segments,
    load_network,
)
from agents.registry import Declaration
from agents.stacked import Minibatches, by_seed, masked_mean
from agents.training import Experience, entry_points

TAGS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "losses/policy_loss",
    "losses/value_loss",
    "losses/entropy",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/explained_variance",
    "eval/return_mean",
    "eval/return_std",
]
STATS = ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl", "losses/clipfrac")
"""The update's statistics, each seed's mean over its minibatches (:func:`update`)."""
FINITE = STATS
"""The losses that must stay finite: a NaN in one stops the run, with the last good checkpoint kept."""


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
    n_epochs: int = 10
    """K: passes over each iteration's batch."""
    gae_lambda: float = 0.95
    """λ: GAE's bias-variance trade-off; 0 is one-step TD, 1 is Monte Carlo."""
    clip_range: float = 0.2
    """ε: the ratio is clipped to [1 − ε, 1 + ε]."""
    anneal_clip_range: bool = False
    """Decay ε linearly to 0 over the run."""
    clip_range_vf: float | None = None
    """ε_v: clip the value prediction to V_old ± ε_v; None for no clipping."""
    value_clip: Literal["prediction", "max"] = "prediction"
    """With ε_v, the loss: the clipped prediction's error (SB3) or the larger of both errors (CleanRL, ppo2)."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    target_kl: float | None = None
    """Stop an iteration's epochs once approx_kl exceeds 1.5 × target_kl; None to never stop."""
    normalize_advantage: bool = True
    """Standardize advantages per minibatch."""
    recompute_advantages: bool = False
    """Before every epoch after the first, recompute V, GAE advantages and value targets with the critic as
    the previous epoch left it (Tianshou's ``recompute_adv``; Andrychowicz et al. 2021 recommend it)."""
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return (clipped to ±10)."""
    reward_norm_restart: Literal["terminated", "done"] = "terminated"
    """When that discounted return starts again: at terminations only, carried over time limits (gymnasium's
    NormalizeReward), or at every episode end (SB3's VecNormalize, which sb3-ppo always uses)."""
    shared_trunk: bool = False
    """One trunk for actor and critic instead of two."""
    vectorization: Literal["auto", "native", "sync", "async"] = "auto"
    """How the N envs run: gymnasium's native vector env where it exists (auto), or sync/async."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.n_envs >= 1, f"n_envs must be at least 1, got {self.n_envs}")
        check(self.n_steps >= 1, f"n_steps must be at least 1, got {self.n_steps}")
        check(self.n_epochs >= 1, f"n_epochs must be at least 1, got {self.n_epochs}")
        self.check_size(self.n_envs, MAX_ENVS, "n_envs")
        self.check_size(self.batch_size, MAX_BATCH, "n_steps · n_envs, the env steps of one iteration,")
        check(
            1 <= self.minibatch_size <= self.batch_size,
            f"minibatch_size must be in [1, n_steps·n_envs = {self.batch_size}], got {self.minibatch_size}",
        )
        check(0.0 <= self.gae_lambda <= 1.0, f"gae_lambda must be in [0, 1], got {self.gae_lambda}")
        check(0.0 < self.clip_range < 1.0, f"clip_range must be in (0, 1), got {self.clip_range}")
        check(self.clip_range_vf is None or self.clip_range_vf > 0, "clip_range_vf must be positive or none")
        check(
            self.value_clip == "prediction" or self.clip_range_vf is not None,
            "value_clip=max needs a clip_range_vf to clip with (CleanRL's clip_vloss uses the clip range, 0.2)",
        )
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


# ── S seeds' PPO, and one iteration: collect T steps in N envs → GAE → update ───────────────────────


class Learner:
    """S seeds' PPO (a :class:`~agents.training.Trainer`): the shared actor-critic collector
    (``onpolicy.OnPolicy``: each seed's envs, ActorCritic, generators and optimizer) and PPO's ``learn``."""

    tags, finite = TAGS, FINITE

    def __init__(self, cfgs: list[PPOConfig]) -> None:
        cfg = cfgs[0]
        options = env_options(
            cfg,
            normalize_reward=cfg.normalize_reward,
            reward_norm_restart=cfg.reward_norm_restart,
            gamma=cfg.gamma,
            vectorization=cfg.vectorization,
        )
        self.cfgs, self.cfg = list(cfgs), cfg  # cfg: the settings every seed shares (all but the seed)
        self.onpolicy = OnPolicy(cfgs, actor_critic, options)
        self.stack = self.onpolicy.stack  # the networks (S, P), the optimizer, the generators
        self.trainees, self.random = self.stack.trainees, self.stack.random

    def collect(self, iterations: list[int], running: list[bool]) -> list[Experience | None]:
        """T steps of every seed's N envs (``onpolicy.OnPolicy.collect``)."""
        return self.onpolicy.collect(iterations, running)

    def learn(
        self,
        collected: list[Experience | None],
        iterations: list[int],
        remaining: list[float],
        learning_rates: list[float],
        running: list[bool],
    ) -> list[dict[str, float | None]]:
        """GAE advantages, then K epochs of minibatch updates at each seed's scheduled learning rate; returns
        each seed's losses and explained variance."""
        cfg, S, gamma, lam = self.cfg, len(self.cfgs), self.cfg.gamma, self.cfg.gae_lambda
        self.stack.set_learning_rates(learning_rates)
        segment = join_segments([c.batch if c is not None else None for c in collected])  # (T, S·N)
        clip = torch.tensor([cfg.clip_range * (r if cfg.anneal_clip_range else 1.0) for r in remaining]).unsqueeze(1)
        advantages, returns = gae_targets(segment, segment.values, segment.next_values, gamma, lam)  # (T, S·N) each
        recompute = partial(critic_targets, self.onpolicy, segment, gamma, lam) if cfg.recompute_advantages else None
        stats = update(self, segment, advantages, returns, clip.to(cfg.device), torch.tensor(running), recompute)
        metrics = self.stack.per_seed_metrics(stats, STATS, running)  # (S, 5) → each running seed's, by tag
        add_explained_variances(metrics, segment, returns, S)
        return metrics

    def save(self, k: int) -> dict[str, Any]:
        return self.onpolicy.save(k)

    def load(self, k: int, checkpoint: dict[str, Any]) -> None:
        self.onpolicy.load(k, checkpoint)

    def close(self) -> None:
        self.onpolicy.close()


# ── the update: K epochs of minibatches, every seed's in one batched gradient step ─────────────────


def update(
    learner: Learner,
    segment: Segment,
    advantages: Tensor,
    returns: Tensor,
    clip: Tensor,
    running: Tensor,
    recompute: Callable[[], tuple[Tensor, Tensor]] | None = None,
) -> Tensor:
    """K epochs of shuffled minibatches for every running seed; returns each seed's means over its
    minibatches of (policy loss, value loss, entropy, approx_kl, clipfrac), (S, 5).

    ``advantages`` and ``returns`` (the value targets) are (T, S·N); ``clip`` (S, 1), each seed's ε. Seed k's
    valid samples (autoreset steps excluded) are shuffled by its own generator and split into M near-equal
    minibatches, each padded to the width W = ⌈T·N / M⌉ with ``mask`` False on the padding: shapes the
    config alone fixes, so that a seed's numbers never depend on its neighbours'. ``recompute``: new
    (advantages, returns) before every epoch after the first.
    """
    cfg, net, S = learner.cfg, learner.stack.net, len(learner.cfgs)
    M, device = cfg.num_minibatches, cfg.device
    obs, actions, old_log_probs, old_values, advantages, returns, valid = (
        by_seed(x, S).to(device)
        for x in (
            segment.obs,
            segment.actions,
            segment.log_probs,
            segment.values,
            advantages,
            returns,
            segment.sample_mask,
        )
    )  # (S, T·N, …)
    minibatches = Minibatches(valid, M, learner.stack.random)
    stepping = running.to(device)  # (S,)  seeds still updating; a target-KL stop ends a seed's epochs
    totals = torch.zeros((S, 5), device=device)  # (S, 5)  summed to avoid per-step syncs
    counts = torch.zeros(S, device=device)  # (S,)
    for epoch_index in range(cfg.n_epochs):
        if epoch_index and recompute is not None:
            advantages, returns = (by_seed(x, S).to(device) for x in recompute())  # (S, T·N) each
        minibatches.shuffle(stepping)
        epoch = minibatches.gather(obs, actions, old_log_probs, old_values, advantages, returns)
        for m in range(M):
            columns = minibatches.columns(m)
            mb_obs, mb_actions, mb_old_log_probs, mb_old_values, mb_advantages, mb_returns = (
                x[:, columns] for x in epoch
            )
            mask = minibatches.mask[:, columns]  # (S, W)
            mean = partial(masked_mean, mask=mask, count=minibatches.counts[:, m])  # each seed's mean, (S,)

            new_log_probs, entropy, values = net.evaluate(mb_obs, mb_actions)  # (S, W) each
            log_ratio = new_log_probs - mb_old_log_probs
            ratio = log_ratio.exp()
            approx_kl = mean(losses.k3_kl(log_ratio).detach())  # (S,)
            if cfg.target_kl is not None:
                stepping = stepping & ~(approx_kl > 1.5 * cfg.target_kl)
                if not bool(stepping.any()):
                    break
            if cfg.normalize_advantage:
                mb_advantages = adv.normalize_rows(mb_advantages, mask)
            policy_loss = mean(losses.clipped_surrogate(ratio, mb_advantages, clip, clip))  # (S,)
            take_max = cfg.value_clip == "max"
            value_loss = mean(losses.value_loss(values, mb_old_values, mb_returns, cfg.clip_range_vf, take_max))
            entropy_mean = mean(entropy)
            loss = policy_loss + cfg.vf_coef * value_loss  # (S,)
            if cfg.ent_coef:  # skipped at 0 to keep the backward graph small
                loss = loss - cfg.ent_coef * entropy_mean

            learner.stack.step(loss, stepping, cfg.max_grad_norm)

            clip_low, clip_high = losses.clip_fraction(ratio.detach(), clip, clip, mean)
            step_stats = torch.stack(
                [policy_loss.detach(), value_loss.detach(), entropy_mean.detach(), approx_kl, clip_low + clip_high],
                dim=1,
            )  # (S, 5)
            totals += torch.where(stepping.unsqueeze(1), step_stats, 0.0)
            counts += stepping
        if not bool(stepping.any()):  # the target KL stopped every seed: no further epoch
            break
    return (totals / counts.clamp(min=1).unsqueeze(1)).cpu()


train, train_stack = entry_points(Learner, "ppo")


# ── Declaration: what the registry, the planner and `testbed tune` know of PPO ──────────────────────────

# PPO's search space for `testbed tune`. It starts from RL Baselines3 Zoo's PPO sampler (utils/hyperparams_opt.py)
# and departs from it where our configs or budgets call for it:
# - n_steps from 256 up, so that every minibatch size fits in one env's batch; the zoo clamps instead;
# - learning_rate up to 3e-3 (the zoo goes to 1, which no preset of ours or the zoo's approaches);
# - n_steps as a list (so is n_envs, if you tune it): a study rounds its budget up to a multiple of every
#   n_steps · n_envs the space allows, so that every trial trains the same env steps (lab/space.py);
# - log_std_init and anneal_lr added: the v3 presets' log_std_init of -2 is the value most suspected of
#   Hopper-v5's standing still, and CleanRL's continuous defaults anneal the learning rate;
# - recompute_advantages and normalize_advantage added: Tianshou's MuJoCo PPO, the best published PPO on
#   Ant within 1e6 steps, recomputes advantages every epoch and does not normalize them.
SPACE: dict[str, Any] = {
    "n_steps": [256, 512, 1024, 2048, 4096],
    "minibatch_size": [32, 64, 128, 256],
    "n_epochs": [1, 5, 10, 20],
    "gamma": [0.95, 0.98, 0.99, 0.995, 0.999],
    "gae_lambda": [0.8, 0.9, 0.92, 0.95, 0.98, 0.99, 1.0],
    "learning_rate": {"low": 1.0e-5, "high": 3.0e-3, "log": True},
    "anneal_lr": [True, False],
    "ent_coef": {"low": 1.0e-8, "high": 0.1, "log": True},
    "clip_range": [0.1, 0.2, 0.3, 0.4],
    "vf_coef": {"low": 0.0, "high": 1.0},
    "max_grad_norm": [0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 2.0, 5.0],
    "hidden_sizes": [[64, 64], [256, 256]],
    "activation": ["tanh", "relu"],
    "ortho_init": [True, False],
    "recompute_advantages": [False, True],
    "normalize_advantage": [True, False],
    "log_std_init": {"low": -3.0, "high": 0.5},
}

ALGORITHMS = (
    Declaration(
        "ppo",
        config=PPOConfig,
        train=train,
        train_stack=train_stack,
        load_policy=partial(load_network, actor_critic),
        space=SPACE,
        # The credit-assignment study's methods: GAE's λ at its ends (one-step TD, Monte Carlo).
        variants={"ppo-lambda0": {"gae_lambda": 0.0}, "ppo-lambda1": {"gae_lambda": 1.0}},
    ),
)
