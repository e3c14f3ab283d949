"""Advantage Actor-Critic, synchronous (A2C; Mnih et al. 2016, arXiv 1602.01783, as OpenAI Baselines and SB3 run it).

One iteration: collect T steps in N envs (``onpolicy.OnPolicy.collect``, the shared collector) → GAE(γ, λ)
advantages over the segment (``onpolicy.gae_targets``; λ = 1, the default: n-step returns bootstrapped from V)
→ one gradient step of RMSprop on the whole batch (:func:`a2c_loss`), no epochs, no minibatches, no clipping.
Seeds are stacked as PPO stacks them: the shared layer keeps each seed's envs, generators and optimizer.

Stable-Baselines3's ``A2C.train()``, term for term: the same defaults, value loss (mean squared error, no ½),
optional advantage normalization, global gradient-norm clip, torch's RMSprop (α = 0.99, ε = 1e-5).
Deliberate deviations, PPO's (``ppo``):
 - Truncation bootstraps from V(final observation); SB3's rollout buffer adds γ·V(final observation) to the
   reward instead, which is the same target.
 - Autoreset steps (NEXT_STEP mode, ``rollout``) are masked out: each seed's means run over its valid samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from agents import advantages as adv
from agents import losses, onpolicy, optimizers
from agents.config import MAX_BATCH, MAX_ENVS, RunConfig, check
from agents.onpolicy import Segment, actor_critic
from agents.registry import Declaration
from agents.stacked import by_seed, masked_mean
from agents.training import Experience, entry_points

STATS = ("losses/policy_loss", "losses/value_loss", "losses/entropy")
"""The update's statistics, each seed's (:func:`a2c_loss`): a NaN in one stops the run, keeping the last checkpoint."""
TAGS = ["charts/episodic_return", "charts/episodic_length", "charts/SPS", "charts/learning_rate", *STATS]
TAGS += ["losses/explained_variance", "eval/return_mean", "eval/return_std"]


@dataclass(frozen=True)
class A2CConfig(RunConfig):
    """Every setting of an A2C run: the shared ones of :class:`RunConfig`, then A2C's own; the defaults are SB3's
    A2C's. Presets: ``agents/presets/a2c.yaml``; overrides: ``--set key=value``."""

    learning_rate: float = 7e-4
    """RMSprop's step size η (its start value when annealed)."""
    n_envs: int = 1
    """N: parallel envs."""
    n_steps: int = 5
    """T: steps per env per iteration, the n of the n-step returns."""
    gae_lambda: float = 1.0
    """λ: 1 gives n-step returns bootstrapped from V (A2C's); lower values GAE(γ, λ)."""
    vf_coef: float = 0.5
    """c_v: weight of the value loss."""
    normalize_advantage: bool = False
    """Standardize each seed's advantages over its batch (SB3's option; not in the original A2C)."""
    rms_prop_eps: float = 1e-5
    """RMSprop's ε, added outside the square root as torch adds it (RMSprop's α is SB3's 0.99)."""
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return (clipped to ±10)."""
    reward_norm_restart: Literal["terminated", "done"] = "terminated"
    """When that discounted return restarts: at terminations (gymnasium) or at every episode end (SB3)."""
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
        check(0.0 <= self.gae_lambda <= 1.0, f"gae_lambda must be in [0, 1], got {self.gae_lambda}")
        check(self.vf_coef >= 0, f"vf_coef must be non-negative, got {self.vf_coef}")
        check(self.rms_prop_eps > 0, f"rms_prop_eps must be positive, got {self.rms_prop_eps}")

    @property
    def batch_size(self) -> int:
        """Samples per iteration, T · N."""
        return self.n_steps * self.n_envs


class A2CLoss(NamedTuple):
    """Each seed's loss and its terms, (S,) each."""

    loss: Tensor
    policy_loss: Tensor
    value_loss: Tensor
    entropy: Tensor


def a2c_loss(
    log_probs: Tensor,
    entropy: Tensor,
    values: Tensor,
    advantages: Tensor,
    returns: Tensor,
    mask: Tensor,
    vf_coef: float,
    ent_coef: float,
) -> A2CLoss:
    """A2C's loss per seed (Mnih et al. 2016, Algorithm S3; SB3's ``A2C.train``), each mean over the seed's
    valid samples j (``mask``), all (S, B)::

        L = −mean_j(Â_j · log π(a_j|s_j)) + c_v · mean_j((R_j − V(s_j))²) − c_e · mean_j(H[π(·|s_j)])

    Â the advantages ``advantages`` (no gradient), R = Â + V_old the value targets ``returns``, V the critic
    ``values``, H the entropy ``entropy``; c_v ``vf_coef``, c_e ``ent_coef``.
    """
    if not (log_probs.shape == entropy.shape == values.shape == advantages.shape == returns.shape == mask.shape):
        raise ValueError("a2c_loss: log_probs, entropy, values, advantages, returns and mask must share one shape")
    mean = partial(masked_mean, mask=mask)
    policy_loss = mean(-advantages * log_probs)
    value_loss = mean(losses.value_loss(values, values, returns, None))  # unclipped: the old values go unused
    entropy_mean = mean(entropy)
    return A2CLoss(policy_loss + vf_coef * value_loss - ent_coef * entropy_mean, policy_loss, value_loss, entropy_mean)


class Learner:
    """S seeds' A2C (a :class:`~agents.training.Trainer`): the shared actor-critic collector with RMSprop per
    seed, and A2C's ``learn``. Collection, saving and closing are the collector's own."""

    tags, finite = TAGS, STATS

    def __init__(self, cfgs: list[A2CConfig]) -> None:
        self.cfgs, self.cfg = list(cfgs), cfgs[0]  # cfg: the settings every seed shares (all but the seed)
        cfg = self.cfg
        own = ("normalize_reward", "reward_norm_restart", "gamma", "vectorization")  # how its training envs are wrapped
        options = onpolicy.env_options(cfg, **{name: getattr(cfg, name) for name in own})
        rule = optimizers.rmsprop(cfg.learning_rate, eps=cfg.rms_prop_eps, alpha=0.99)
        self.onpolicy = o = onpolicy.OnPolicy(cfgs, actor_critic, options, rule=rule)
        self.stack = self.onpolicy.stack  # the networks (S, P), the optimizer, the generators
        self.trainees, self.random = self.stack.trainees, self.stack.random
        # Collection, each seed's env state and closing are the collector's, as they are: bound, not rewrapped.
        self.collect, self.save, self.load, self.close = (o.collect, o.save, o.load, o.close)

    def learn(
        self,
        collected: list[Experience | None],
        iterations: list[int],
        remaining: list[float],
        learning_rates: list[float],
        running: list[bool],
    ) -> list[dict[str, float | None]]:
        """GAE(γ, λ) advantages over the segment, then :func:`update`; returns each seed's losses and explained
        variance."""
        cfg, S = self.cfg, len(self.cfgs)
        self.stack.set_learning_rates(learning_rates)
        segment = onpolicy.join_segments([c.batch if c is not None else None for c in collected])  # (T, S·N)
        gamma, lam = cfg.gamma, cfg.gae_lambda
        advantages, returns = onpolicy.gae_targets(segment, segment.values, segment.next_values, gamma, lam)
        stats = update(self, segment, advantages, returns, torch.tensor(running))  # (S, 3)
        metrics = self.stack.per_seed_metrics(stats, STATS, running)
        onpolicy.add_explained_variances(metrics, segment, returns, S)
        return metrics


def update(learner: Learner, segment: Segment, advantages: Tensor, returns: Tensor, running: Tensor) -> Tensor:
    """One gradient step of every running seed on its whole segment; returns each seed's (policy loss, value loss,
    entropy), (S, 3). ``advantages`` and ``returns`` (the value targets) are (T, S·N), ``running`` (S,) bool."""
    cfg, S, device = learner.cfg, len(learner.cfgs), learner.cfg.device
    # Each seed's row, (S, T·N, …): its samples, where autoreset steps are not (``valid``), and its targets.
    fields = (segment.obs, segment.actions, segment.sample_mask, advantages, returns)
    obs, actions, valid, advantages, returns = (by_seed(x, S).to(device) for x in fields)
    if cfg.normalize_advantage:
        advantages = adv.normalize_rows(advantages, valid)
    log_probs, entropy, values = learner.stack.net.evaluate(obs, actions)  # (S, T·N) each
    terms = a2c_loss(log_probs, entropy, values, advantages, returns, valid, cfg.vf_coef, cfg.ent_coef)
    learner.stack.step(terms.loss, running.to(device), cfg.max_grad_norm)
    return torch.stack([terms.policy_loss, terms.value_loss, terms.entropy], dim=1).detach().cpu()


train, train_stack = entry_points(Learner, "a2c")


ALGORITHMS = (
    Declaration(
        "a2c",
        config=A2CConfig,
        train=train,
        train_stack=train_stack,
        load_policy=partial(onpolicy.load_network, actor_critic),
    ),
)
