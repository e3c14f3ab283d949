"""A GRPO-style agent for control (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300), read top to bottom.

No critic. One iteration: reset B start states, each shared by a group of G members (same seed, or
the same state in the middle of an episode) → run the B·G members as one vector env, each until its own
episode ends (``groups.collect_groups``) → score each trajectory against its own group
(``advantages.group_*``) → epochs × minibatches of trajectories of the clipped surrogate with separate
lower and upper clips, a k3 KL penalty to a reference policy and an optional entropy bonus, averaged by
the chosen aggregation (``losses``). ``training.run`` logs, evaluates and checkpoints around it.

Variants, each a setting: the advantage (outcome, no_std = Dr. GRPO, batch_std, rloo, process, step_baseline:
per-step group baselines, vine), the aggregation (trajectory = GRPO, step = DAPO, constant = Dr. GRPO),
ε_low/ε_high (DAPO's clip-higher), β (0 = DAPO's no KL), dynamic sampling (DAPO), masking of truncated
trajectories, the reference refresh, and a per-iteration KL target that adapts the step size (``kl_target``).

The budget counts every step that produced a sample, and the trunk steps before a branch point, the
replayed steps of a restore and the vine's branch steps. A member whose episode has ended takes no more
steps; where the vector env cannot skip it (async), its idle steps are not counted.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from agents import advantages as adv
from agents import losses
from agents.config import MAX_ENVS, RunConfig, check
from agents.groups import Groups, collect_groups, diagnostics, horizon, time_limit, validate, vine_interval
from agents.networks import Actor, adam, adapt_step_size, gradient_step, refresh_reference
from agents.rollout import Episodes, SegmentBuffers
from agents.training import Agent, Collected, Envs, network_spec, obs_statistics, open_envs, run
from envs import EnvOptions, load_normalizer_state, make_vector, normalizer_state
from envs import start_states as starts

TAGS = [
    "charts/episodic_return", "charts/episodic_length", "charts/SPS", "charts/learning_rate",
    "losses/policy_loss", "losses/entropy", "losses/approx_kl", "losses/clipfrac",
    "grpo/frac_zero_std_groups", "grpo/group_return_std", "grpo/clipfrac_low", "grpo/clipfrac_high",
    "grpo/kl_ref", "grpo/ratio_mean", "grpo/episode_length_mean", "grpo/episode_length_min",
    "grpo/episode_length_max", "grpo/truncated_fraction", "grpo/idle_step_fraction", "grpo/dropped_groups",
    "grpo/restore_time_s", "grpo/step_time_s", "grpo/vine_points", "grpo/vine_branch_step_fraction",
    "grpo/update_kl", "grpo/lr_scale", "grpo/epochs_run",
    "eval/return_mean", "eval/return_std",
]  # fmt: skip


@dataclass(frozen=True)
class GRPOConfig(RunConfig):
    """Every setting of a GRPO run: the shared ones of :class:`RunConfig`, then GRPO's own. Presets:
    ``agents/presets/grpo.yaml``; overrides: ``--set key=value``."""

    total_steps: int = 1_000_000
    """Env steps to train for: the members' own steps, and trunk, replay and vine-branch steps. A run
    ends after the iteration that reaches it, so it overshoots by at most one iteration."""
    gamma: float = 1.0
    """Discount of the return R that scores a trajectory (1: the plain sum, as DeepSeekMath)."""
    n_epochs: int = 4
    """Passes over each batch of trajectories."""
    group_size: int = 8
    """G: members per group, all from the same start state."""
    num_groups: int = 8
    """B: start states (groups) per iteration."""
    max_episode_steps: int | None = None
    """Time limit for training episodes; None keeps the env's registered limit (one is required)."""
    start_mode: Literal["reset", "branch"] = "reset"
    """reset: groups start from a seeded reset; branch: from a state part-way along a trunk episode."""
    branch_max_depth: int = 100
    """branch: the trunk runs a uniformly drawn 0 … branch_max_depth steps before the branch point."""
    advantage: Literal["outcome", "no_std", "batch_std", "rloo", "process", "step_baseline", "vine"] = "outcome"
    """How a trajectory is scored against its group (see agents/advantages.py); vine: from Monte-Carlo
    values of branches at states along it instead (agents/vine.py, the ``grpo-vine`` algo)."""
    vine_points: int = 4
    """vine: a value every ⌈H / vine_points⌉ steps of each trajectory, from its first step on."""
    vine_branches: int = 4
    """vine: K branches per value; K must divide B·G, the members that branch at once."""
    aggregation: Literal["trajectory", "step", "constant"] = "trajectory"
    """How per-step losses are averaged (see agents/losses.py: aggregate)."""
    clip_low: float = 0.2
    """ε_low: the ratio is clipped below at 1 − ε_low."""
    clip_high: float = 0.2
    """ε_high: the ratio is clipped above at 1 + ε_high (DAPO's clip-higher uses 0.28)."""
    beta: float = 0.04
    """β: weight of the k3 KL penalty to the reference policy (0 drops it, as DAPO)."""
    num_minibatches: int = 4
    """Minibatches of trajectories per epoch; more gradient steps make clipping active."""
    kl_target: float | None = None
    """Per-iteration KL(π_old ‖ π_θ) to aim for: the step size ×1.5 after an update below half of it, ÷1.5
    above twice it; the epochs stop once a minibatch passes twice it (``networks.adapt_step_size``)."""
    ref_update: Literal["never", "periodic", "ema"] = "never"
    """Reference policy refresh: never, a copy every ref_update_interval iterations, or an EMA."""
    ref_update_interval: int = 10
    """periodic: iterations between copies of π_θ into π_ref."""
    ref_ema: float = 0.95
    """ema: π_ref ← ref_ema · π_ref + (1 − ref_ema) · π_θ after every iteration."""
    dynamic_sampling: bool = False
    """Drop groups whose returns all tie and resample until the batch has num_groups informative ones."""
    max_resample_rounds: int = 3
    """dynamic_sampling: at most this many extra collections per iteration."""
    mask_truncated: bool = False
    """Leave trajectories that ended by the time limit out of the loss."""
    vectorization: Literal["sync", "async"] = "sync"
    """How the B·G members run; branching needs sync."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.group_size >= 2, f"group_size (G) must be at least 2 to compare members, got {self.group_size}")
        check(self.num_groups >= 1, f"num_groups (B) must be at least 1, got {self.num_groups}")
        self.check_size(self.group_size * self.num_groups, MAX_ENVS, "G · B, the group members of an iteration,")
        check(self.max_episode_steps is None or self.max_episode_steps >= 1, "max_episode_steps must be positive")
        check(self.branch_max_depth >= 0, f"branch_max_depth must be >= 0, got {self.branch_max_depth}")
        check(0.0 < self.clip_low < 1.0, f"clip_low must be in (0, 1), got {self.clip_low}")
        check(self.clip_high > 0.0, f"clip_high must be positive, got {self.clip_high}")
        check(self.beta >= 0, f"beta must be non-negative, got {self.beta}")
        check(
            1 <= self.num_minibatches <= self.batch_trajectories,
            f"num_minibatches must be in [1, B·G = {self.batch_trajectories}], got {self.num_minibatches}",
        )
        check(self.kl_target is None or self.kl_target > 0, f"kl_target must be positive or none, got {self.kl_target}")
        check(self.ref_update_interval >= 1, "ref_update_interval must be at least 1")
        check(0.0 <= self.ref_ema < 1.0, f"ref_ema must be in [0, 1), got {self.ref_ema}")
        check(self.max_resample_rounds >= 0, "max_resample_rounds must be >= 0")
        check(self.vine_points >= 1, f"vine_points must be at least 1, got {self.vine_points}")
        check(
            self.vine_branches >= 1 and self.batch_trajectories % self.vine_branches == 0,
            f"vine_branches (K) must divide B·G = {self.batch_trajectories}, got {self.vine_branches}",
        )
        check(self.advantage != "vine" or not self.dynamic_sampling, "advantage=vine does not drop groups: "
              "set dynamic_sampling=false")  # fmt: skip
        check(self.advantage != "vine" or self.vectorization == "sync", "advantage=vine needs vectorization=sync")
        check(self.start_mode == "reset" or self.vectorization == "sync", "start_mode=branch needs vectorization=sync")

    @property
    def batch_trajectories(self) -> int:
        """M = B · G trajectories per collection."""
        return self.num_groups * self.group_size


def group_advantages(cfg: GRPOConfig, batch: Episodes, returns: Tensor, vine_values: Tensor | None, H: int) -> Tensor:
    """Per-step advantages (T, M) of the batch's B·G trajectories; returns (B, G), vine values (J, M)."""
    T, M = batch.mask.shape
    if cfg.advantage == "vine":
        A = adv.vine(batch.rewards, batch.mask, vine_values, vine_interval(cfg, H), cfg.gamma)  # (T, M)
        valid = batch.mask.nonzero(as_tuple=True)
        # Standardized over the batch's steps, as PPO's: returns of control tasks run into the hundreds.
        A[valid] = adv.normalize(A[valid])
        return A
    by_group = (T, -1, cfg.group_size)  # (T, B, G)
    if cfg.advantage == "process":
        return adv.group_process(batch.rewards.view(by_group), batch.mask.view(by_group)).view(T, M)
    if cfg.advantage == "step_baseline":
        A = adv.group_step_baseline(batch.rewards.view(by_group), batch.mask.view(by_group), cfg.gamma).view(T, M)
        # One positive scale for the whole batch, which keeps tied groups at 0 and every sign as it is.
        return A / (A[batch.mask].std() + 1e-8) if batch.mask.sum() > 1 else A
    scores = {"outcome": adv.group_outcome, "no_std": adv.group_no_std, "batch_std": adv.group_batch_std,
              "rloo": adv.group_rloo}[cfg.advantage](returns)  # (B, G)  # fmt: skip
    return scores.reshape(1, M).expand(T, M) * batch.mask


def minibatch_loss(
    actor: Actor,
    batch: Episodes,
    members: Tensor,
    advantages: Tensor,
    ref_log_probs: Tensor,
    loss_mask: Tensor,
    cfg: GRPOConfig,
    H: int,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The GRPO objective on the trajectories ``members``, aggregated over their valid steps.

        L = agg_{i,t} [ −min(ρ A, clip(ρ, 1 − ε_low, 1 + ε_high) A) + β · k3(π_ref / π_θ) − c_H · H(π_θ) ]

    ``advantages``, ``ref_log_probs`` and ``loss_mask`` are (T, M); returns the loss and detached stats.
    """
    mask = loss_mask[:, members]  # (T, m)
    steps = mask.nonzero(as_tuple=True)  # K valid (t, i) pairs
    obs = batch.obs[:, members][steps]  # (K, obs_dim)
    actions = batch.actions[:, members][steps]
    log_probs, entropy = actor.log_prob_entropy(actor(obs), actions)  # (K,), (K,)
    log_ratio = log_probs - batch.log_probs[:, members][steps]
    ratio = log_ratio.exp()
    surrogate = losses.clipped_surrogate(ratio, advantages[:, members][steps], cfg.clip_low, cfg.clip_high)
    # k3 at x ~ π_old: a penalty toward π_ref, not KL(π_θ ‖ π_ref)'s exact gradient (see losses.k3_kl).
    kl_ref = losses.k3_kl(ref_log_probs[:, members][steps] - log_probs)
    per_step = surrogate + cfg.beta * kl_ref - cfg.ent_coef * entropy

    def agg(values: Tensor) -> Tensor:
        full = values.new_zeros(mask.shape)  # (T, m)
        full[steps] = values
        return losses.aggregate(full, mask, cfg.aggregation, H)

    with torch.no_grad():
        low, high = losses.clip_fraction(ratio, cfg.clip_low, cfg.clip_high)
        stats = {
            "policy_loss": agg(surrogate), "entropy": entropy.mean(), "approx_kl": losses.k3_kl(log_ratio).mean(),
            "kl_ref": kl_ref.mean(), "ratio_mean": ratio.mean(), "clipfrac_low": low, "clipfrac_high": high,
        }  # fmt: skip
    return agg(per_step), stats


def targets(cfg: GRPOConfig, groups: Groups, H: int) -> tuple[Tensor, Tensor]:
    """The batch's per-step advantages and the mask of the steps that enter the loss, each (T, M)."""
    batch, G = groups.batch, cfg.group_size
    returns = adv.discounted_returns(batch.rewards, batch.mask, cfg.gamma).view(-1, G)  # (B', G)
    advantages = group_advantages(cfg, batch, returns, groups.vine.values if groups.vine else None, H)  # (T, M)
    return advantages, batch.mask & ~batch.truncated if cfg.mask_truncated else batch.mask


def update(
    actor: Actor, reference: Actor, optimizer: torch.optim.Optimizer, groups: Groups, cfg: GRPOConfig, H: int
) -> dict[str, float]:
    """Epochs × minibatches of trajectories, the epochs cut short once a minibatch's approx_kl passes
    twice ``kl_target``; returns the means of the minibatch statistics and the whole update's KL."""
    batch, (advantages, loss_mask) = groups.batch, targets(cfg, groups, H)
    M, valid = batch.mask.shape[1], batch.mask.nonzero(as_tuple=True)
    with torch.no_grad():
        ref_log_probs = torch.zeros(batch.mask.shape)  # (T, M)  fixed during the iteration
        ref_log_probs[valid] = reference.log_prob_entropy(reference(batch.obs[valid]), batch.actions[valid])[0]
    n_minibatches = min(cfg.num_minibatches, M)
    totals: dict[str, Tensor] = {}
    count, epochs, kl_stop = 0, 0, False
    while epochs < cfg.n_epochs and not kl_stop:
        epochs += 1
        for members in torch.randperm(M).tensor_split(n_minibatches):
            loss, stats = minibatch_loss(actor, batch, members, advantages, ref_log_probs, loss_mask, cfg, H)
            if kl_stop := cfg.kl_target is not None and bool(stats["approx_kl"] > 2.0 * cfg.kl_target):
                break
            gradient_step(optimizer, loss, cfg.max_grad_norm)
            count += 1
            totals = {key: totals.get(key, 0.0) + value for key, value in stats.items()}
    with torch.no_grad():  # KL(π_old ‖ π_θ) of the whole update, over every sample of the batch
        log_probs = actor.log_prob_entropy(actor(batch.obs[valid]), batch.actions[valid])[0]
        update_kl = float(losses.k3_kl(log_probs - batch.log_probs[valid]).mean())
    means = {key: float(value) / max(count, 1) for key, value in totals.items()}
    return {**means, "update_kl": update_kl, "epochs_run": float(epochs)}


# ── the iteration: B groups of G trajectories → group advantages → update ─────────────────────────


@dataclass
class Learner:
    """What GRPO carries from one iteration to the next."""

    cfg: GRPOConfig
    envs: Envs  # train: the B·G members as one vector env
    trunk_env: Any  # start_mode=branch: B raw envs that run to the branch points; else None
    restore_mode: str | None  # how a branch point is restored (state or replay); None for resets
    actor: Actor
    reference: Actor  # π_ref of the KL penalty
    optimizer: torch.optim.Optimizer
    buffers: SegmentBuffers  # (H, B·G) storage, reused by every collection
    H: int  # the training time limit
    lr_scale: float = 1.0  # kl_target: the factor on the scheduled learning rate, adapted every iteration


def member_envs(cfg: GRPOConfig) -> Envs:
    """The B·G members as one vector env (train), and the evaluation envs."""
    options = EnvOptions(normalize_obs=cfg.normalize_obs, vectorization=cfg.vectorization,
                         reward_delay=cfg.reward_delay)  # fmt: skip
    return open_envs(cfg, cfg.batch_trajectories, options, **time_limit(cfg))


def build(cfg: GRPOConfig) -> Agent:
    """GRPO's envs, actor, reference and Adam, as the parts that ``training.run`` drives."""
    H, M, limit, envs = horizon(cfg), cfg.batch_trajectories, time_limit(cfg), member_envs(cfg)
    mode = starts.restore_mode(cfg.env_id, **cfg.env_kwargs) if cfg.start_mode == "branch" else None
    trunk_options = EnvOptions(vectorization="sync", reward_delay=cfg.reward_delay)  # B raw envs, no normalization
    trunk_env = None if mode is None else make_vector(cfg.env_id, cfg.num_groups, trunk_options, **cfg.env_kwargs,
                                                      **limit)  # fmt: skip
    actor = Actor(network_spec(envs.train, cfg)).to(cfg.device)
    reference = copy.deepcopy(actor).requires_grad_(False)
    optimizer = adam(actor, cfg.learning_rate)
    buffers = SegmentBuffers(H, M, envs.obs_dim, envs.action_shape, not envs.continuous)  # (H, B·G)
    grpo = Learner(cfg, envs, trunk_env, mode, actor, reference, optimizer, buffers, H)

    def close() -> None:
        envs.close()
        if trunk_env is not None:
            trunk_env.close()

    return Agent(
        model=actor,
        policy=actor,
        optimizer=optimizer,
        eval_env=envs.eval,
        obs_stats=partial(obs_statistics, envs.train),
        collect=partial(collect, grpo),
        update=partial(learn, grpo),
        save=partial(save, grpo),
        load=partial(load, grpo),
        tags=TAGS,
        networks={"actor": actor, "reference": reference},
        close=close,
    )


def collect(grpo: Learner, iteration: int) -> Collected:
    """B groups of G trajectories, every member run until its episode ends."""
    return collected(collect_groups(grpo.cfg, grpo.envs.train, grpo.trunk_env, grpo.restore_mode, grpo.actor,
                                    grpo.buffers, iteration))  # fmt: skip


def collected(groups: Groups) -> Collected:
    """An iteration's groups as the lifecycle counts and logs them."""
    lengths = torch.cat([e.lengths for e in groups.rounds]).tolist()
    return Collected(groups, groups.env_steps, groups.episode_returns, lengths)


def learn(grpo: Learner, collected: Collected, iteration: int, progress_remaining: float) -> dict[str, float | None]:
    """Group advantages, the clipped update, the step size adapted to ``kl_target``, the reference refresh."""
    groups = collected.batch
    for group in grpo.optimizer.param_groups:
        group["lr"] *= grpo.lr_scale
    # Without an informative group (every group tied in every round) there is nothing to learn.
    stats = update(grpo.actor, grpo.reference, grpo.optimizer, groups, grpo.cfg, grpo.H) if groups.kept_groups else {}
    return after_update(grpo, groups, stats, iteration)


def after_update(grpo: Learner, groups: Groups, stats: dict[str, float], iteration: int) -> dict[str, float | None]:
    """The step size adapted to ``kl_target``, the reference refreshed; returns the iteration's diagnostics."""
    if (cfg := grpo.cfg).kl_target is not None and stats:
        grpo.lr_scale = adapt_step_size(grpo.lr_scale, stats["update_kl"], cfg.kl_target)
    refresh_reference(grpo.reference, grpo.actor, cfg.ref_update, iteration % cfg.ref_update_interval == 0, cfg.ref_ema)
    return diagnostics(groups, stats, grpo.lr_scale)


def save(grpo: Learner) -> dict[str, Any]:
    """The reference policy, the observation statistics and the step-size factor (iterations start afresh)."""
    return {"reference": grpo.reference.state_dict(), "normalizers": normalizer_state(grpo.envs.train),
            "lr_scale": grpo.lr_scale}  # fmt: skip


def load(grpo: Learner, ckpt: dict[str, Any]) -> None:
    grpo.reference.load_state_dict(ckpt["reference"])
    load_normalizer_state(grpo.envs.train, ckpt["normalizers"])
    grpo.lr_scale = ckpt.get("lr_scale", 1.0)


def train(cfg: GRPOConfig, run_dir: Path, resume: bool = False, name: str = "grpo") -> dict[str, Any]:
    """Train the GRPO agent into ``run_dir``; returns the summary also written to ``summary.json``."""
    validate(cfg)
    return run(build, cfg, run_dir, resume, name)

