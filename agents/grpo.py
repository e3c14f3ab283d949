"""A GRPO-style agent for control (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300), read top to bottom.

No critic. One iteration: reset B start states, each shared by a group of G members (same seed, or
the same state in the middle of an episode) → run the B·G members as one vector env, each until its own
episode ends (``groups.group_steps``) → score each trajectory against its own group (``groups.targets``,
``advantages.group_*``) → epochs × minibatches of trajectories of the clipped surrogate with separate
lower and upper clips, a k3 KL penalty to a reference policy and an optional entropy bonus, averaged by
the chosen aggregation (``losses``). ``training.run_stack`` logs, evaluates and checkpoints around it.

Variants, each a setting: the advantage (outcome, no_std = Dr. GRPO, batch_std, rloo, process, step_baseline,
step_alive and step_horizon: per-step group baselines, vine), the aggregation (trajectory = GRPO, step = DAPO,
constant = Dr. GRPO), ε_low/ε_high (DAPO's clip-higher), β (0 = DAPO's no KL), dynamic sampling (DAPO), masking of
truncated trajectories, the reference refresh, a per-iteration KL target that adapts the step size (``kl_target``),
more policy updates per collection (``update_rounds``) and a floor on log σ (``log_std_min``).

Written once, for S seeds side by side (the seed axis beside the group axis); a single run is a stack of
one. Each seed keeps its own envs, start states, generators, minibatches, KL-target stop, step size,
reference and Adam state, and every shape is fixed by the config alone (``seeds``), so seed k's numbers
are bit-identical whatever seeds share its process.

The budget counts every step that produced a sample, and the trunk steps before a branch point, the
replayed steps of a restore and the vine's branch steps. A member whose episode has ended takes no more
steps; where the vector env cannot skip it (async), its idle steps are not counted.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import torch
from gymnasium.spaces import Box
from gymnasium.vector import VectorEnv
from torch import Tensor

from agents import losses
from agents.config import MAX_ENVS, RunConfig, check
from agents.groups import (
    Groups,
    MemberEnvs,
    close_member_envs,
    diagnostics,
    experience,
    group_steps,
    horizon,
    open_member_envs,
    pad_groups,
    targets,
    validate,
)
from agents.networks import Actor, Sample, StackedNetworks, adapt_step_size, load_weights, refresh_reference
from agents.onpolicy import SeedParts, SeedStack
from agents.registry import Declaration
from agents.rollout import SegmentBuffers, drive_seeds
from agents.run_envs import Envs, network_spec, obs_statistics
from agents.stacked import ROWS, Minibatches, log_probs_at, masked_mean, pick_steps, trajectories_at
from agents.training import Experience, entry_points
from envs import action_space_of, load_normalizer_state, normalizer_state

TAGS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "losses/policy_loss",
    "losses/entropy",
    "losses/approx_kl",
    "losses/clipfrac",
    "grpo/frac_zero_std_groups",
    "grpo/group_return_std",
    "grpo/clipfrac_low",
    "grpo/clipfrac_high",
    "grpo/kl_ref",
    "grpo/ratio_mean",
    "grpo/episode_length_mean",
    "grpo/episode_length_min",
    "grpo/episode_length_max",
    "grpo/truncated_fraction",
    "grpo/idle_step_fraction",
    "grpo/dropped_groups",
    "grpo/restore_time_s",
    "grpo/step_time_s",
    "grpo/vine_points",
    "grpo/vine_branch_step_fraction",
    "grpo/update_kl",
    "grpo/lr_scale",
    "grpo/epochs_run",
    "eval/return_mean",
    "eval/return_std",
]
FINITE = ("losses/policy_loss", "losses/entropy", "losses/approx_kl", "losses/clipfrac")
"""The losses that must stay finite: a NaN in one stops the run, with the last good checkpoint kept."""


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
    advantage: Literal[
        "outcome", "no_std", "batch_std", "rloo", "process", "step_baseline", "step_alive", "step_horizon", "vine"
    ] = "outcome"
    """How a trajectory is scored against its group (see agents/advantages.py); step_horizon: the per-step
    baseline of the rewards in excess of the group's reward per step, which absorbs a constant survival bonus
    (``advantages.group_step_horizon``); vine: from Monte-Carlo values of branches at states along it instead
    (agents/vine.py, the ``grpo-vine`` algo)."""
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
    update_rounds: int = 1
    """U: policy updates per collection. Each round runs n_epochs × num_minibatches gradient steps with the clip
    centred on the policy the round starts from, π_prox, and each step's advantage weighted by
    π_prox / π_old (Hilton et al. 2021's decoupled objective, ``losses.decoupled_advantages``). Within one round
    the clip stops a sample's pull once its ratio has left [1 − ε_low, 1 + ε_high], so more epochs add little;
    a new round re-centres it. U rounds make U policy updates per B·G·L̄ env steps (L̄ the mean episode length);
    1: GRPO's one update per collection."""
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
    log_std_min: float | None = None
    """A floor on the Gaussian policy's log σ (continuous actions), against σ's collapse in long runs; none: no
    floor. Applied as a projection: after every gradient step, log σ ← max(log σ, log_std_min), each action
    dimension on its own (``floor_log_std``). The parameter itself never lies below the floor, so sampling,
    log-probabilities, entropy, evaluation, checkpoints and ``testbed eval`` all see the same floored policy
    with no transform to repeat. Gradients are untouched above the floor; at the floor, a step that would
    lower log σ is undone and one that raises it acts at once. A clamp in the forward pass instead would leave
    the parameter below the floor with no gradient to bring it back, and a soft floor (floor + softplus) would
    bend log σ everywhere and change what log_std_init means. Must not exceed log_std_init."""
    vectorization: Literal["sync", "async"] = "sync"
    """How the B·G members run; branching needs sync."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.group_size >= 2, f"group_size (G) must be at least 2 to compare members, got {self.group_size}")
        check(self.n_epochs >= 1, f"n_epochs must be at least 1, got {self.n_epochs}")
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
        check(self.update_rounds >= 1, f"update_rounds must be at least 1, got {self.update_rounds}")
        check(
            self.log_std_min is None or self.log_std_min <= self.log_std_init,
            f"log_std_min ({self.log_std_min}) must not exceed log_std_init ({self.log_std_init}), where log σ "
            "starts: lower it, or raise log_std_init",
        )
        check(self.vine_points >= 1, f"vine_points must be at least 1, got {self.vine_points}")
        check(
            self.vine_branches >= 1 and self.batch_trajectories % self.vine_branches == 0,
            f"vine_branches (K) must divide B·G = {self.batch_trajectories}, got {self.vine_branches}",
        )
        check(
            self.advantage != "vine" or not self.dynamic_sampling,
            "advantage=vine does not drop groups: set dynamic_sampling=false",
        )
        check(self.advantage != "vine" or self.vectorization == "sync", "advantage=vine needs vectorization=sync")
        check(self.start_mode == "reset" or self.vectorization == "sync", "start_mode=branch needs vectorization=sync")

    @property
    def batch_trajectories(self) -> int:
        """M = B · G trajectories per collection."""
        return self.num_groups * self.group_size


# ── the objective and the update: every seed's minibatch in one batched gradient step ──────────────

STATS = ("policy_loss", "entropy", "approx_kl", "kl_ref", "ratio_mean", "clipfrac_low", "clipfrac_high")


def minibatch_loss(net: StackedNetworks, cfg: GRPOConfig, picked: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """GRPO's objective for every seed, over its minibatch's picked loss steps (S, R, …), R a multiple of ROWS;
    each chunk of ROWS rows goes through the network and the sums on its own:

        L_k = Σ_{i,t} w_{i,t} [ −min(ρ A, clip(ρ, 1 − ε_low, 1 + ε_high) A) + β · k3(π_ref / π_θ) − c_H · H(π_θ) ]

    ρ = π_θ / π_old, π_old the collecting policy (in a round after the first, the proximal one, with A weighted:
    see :func:`update`). w: the aggregation's weights (``losses.aggregation_weights``), 0 off seed k's loss
    steps. Returns L (S,) and the detached sums over each seed's steps of (w · surrogate, entropy, approx_kl,
    kl_ref, ratio, clipped low, clipped high), (S, 7). A chunk past a seed's steps adds exact zeros to its sums
    and gradient.
    """
    loss, sums = 0.0, 0.0
    for start in range(0, picked["mask"].shape[1], ROWS):
        x = {name: value[:, start : start + ROWS] for name, value in picked.items()}  # (S, ROWS, …) each
        log_probs, entropy = net.log_prob_entropy(net.policy(x["obs"]), x["actions"])  # (S, ROWS) each
        log_ratio = log_probs - x["old_log_probs"]
        ratio = log_ratio.exp()
        surrogate = losses.clipped_surrogate(ratio, x["advantages"], cfg.clip_low, cfg.clip_high)
        # k3 at x ~ π_old: a penalty toward π_ref, not KL(π_θ ‖ π_ref)'s exact gradient (see losses.k3_kl).
        kl_ref = losses.k3_kl(x["ref_log_probs"] - log_probs)
        per_step = surrogate + cfg.beta * kl_ref - cfg.ent_coef * entropy
        loss = loss + (x["weight"] * torch.where(x["mask"], per_step, 0.0)).sum(-1)  # (S,)
        with torch.no_grad():
            terms = [
                x["weight"] * surrogate,
                entropy,
                losses.k3_kl(log_ratio),
                kl_ref,
                ratio,
                (ratio < 1.0 - cfg.clip_low).float(),
                (ratio > 1.0 + cfg.clip_high).float(),
            ]
            sums = sums + torch.stack([torch.where(x["mask"], term, 0.0).sum(-1) for term in terms], dim=1)
    return loss, sums  # type: ignore[return-value]


def floor_log_std(net: StackedNetworks, log_std_min: float | None) -> None:
    """The projection onto the floor on log σ (``GRPOConfig.log_std_min``), after a gradient step:

        log σ_{k,d} ← max(log σ_{k,d}, log σ_min)      each seed k, each action dimension d

    In place, on the stack's (S, D) log σ, whose row k seed k's actor holds as views. Nothing to do without a
    floor or without log σ (discrete actions)."""
    if log_std_min is not None and net.log_std is not None:
        with torch.no_grad():
            net.log_std.clamp_(min=log_std_min)


def update(learner: Learner, groups: list[Groups | None]) -> list[dict[str, float]]:
    """Rounds × epochs × minibatches of trajectories for every seed with an informative group; returns each
    seed's means over its minibatches and its whole update's KL.

    Seed k's batch is padded to (H, B·G) (``groups.pad_groups``); each epoch, its own generator shuffles its
    trajectories into near-equal minibatches, padded to ⌈B·G / minibatches⌉ (``stacked.Minibatches``), whose
    loss steps run in chunks (:func:`minibatch_loss`). A seed whose approx_kl passes twice ``kl_target``
    stops stepping, as its epochs end, for the rest of the update. Each round after the first (``update_rounds``)
    centres the clip on the policy as the previous round left it, π_prox, and weights each step's advantage by
    π_prox / π_old (``losses.decoupled_advantages``); approx_kl and the clip fractions are then measured from
    π_prox. After every gradient step, log σ is projected onto its floor (:func:`floor_log_std`).
    """
    cfg, net, S, H, M = learner.cfg, learner.stack.net, len(learner.seeds), learner.H, learner.cfg.batch_trajectories
    padded = pad_groups(groups, partial(targets, cfg, H=H), H, M, cfg.device)
    ref_log_probs = log_probs_at(learner.references, padded.obs, padded.actions, padded.valid)  # fixed this iteration
    advantages = padded.advantages.flatten(1, 2)  # (S, H·M)
    batch = {
        "obs": padded.obs,
        "actions": padded.actions,
        "old_log_probs": padded.old_log_probs,
        "advantages": advantages,
        "ref_log_probs": ref_log_probs,
    }
    members = torch.arange(M).unsqueeze(0) < padded.trajectories.unsqueeze(1)  # (S, M)  each seed's trajectories
    minibatches = Minibatches(members.to(cfg.device), cfg.num_minibatches, learner.stack.random)
    stepping = (padded.trajectories > 0).to(cfg.device)  # (S,)
    epochs = torch.zeros(S, device=cfg.device)  # (S,)
    totals, counts = torch.zeros((S, len(STATS)), device=cfg.device), torch.zeros(S, device=cfg.device)  # (S, 7), (S,)
    for epoch in range(cfg.update_rounds * cfg.n_epochs):
        if epoch > 0 and epoch % cfg.n_epochs == 0:  # a new round: the clip centred on the policy the last one left
            with torch.no_grad():
                proximal = log_probs_at(net, padded.obs, padded.actions, padded.valid)  # (S, H·M)
            batch["old_log_probs"] = proximal
            batch["advantages"] = losses.decoupled_advantages(advantages, proximal, padded.old_log_probs)
        epochs += stepping
        epoch_members = minibatches.shuffle(stepping)  # (S, minibatches·W)
        for m in range(cfg.num_minibatches):
            columns = minibatches.columns(m)
            mb_real, mb_members = minibatches.mask[:, columns], epoch_members[:, columns]  # (S, W) each
            mask = trajectories_at(padded.loss_mask, mb_members) & mb_real.unsqueeze(1)  # (S, H, W)
            weights = losses.aggregation_weights(mask, cfg.aggregation, H, mb_real)  # (S, H, W)
            picked, count = pick_steps(batch, mask, weights, mb_members, M)  # (S, R, …) each, (S,)
            loss, sums = minibatch_loss(net, cfg, picked)  # (S,), (S, 7)
            approx_kl = sums[:, 2] / count.clamp(min=1)  # (S,)
            step_now = stepping & mb_real.any(-1)  # a seed with fewer trajectories may have an empty minibatch
            if cfg.kl_target is not None:
                stopped = step_now & (approx_kl > 2.0 * cfg.kl_target)
                stepping, step_now = stepping & ~stopped, step_now & ~stopped
            if not bool(stepping.any()):
                break

            learner.stack.step(loss, step_now, cfg.max_grad_norm)
            floor_log_std(net, cfg.log_std_min)

            step_stats = torch.cat([sums[:, :1], sums[:, 1:] / count.clamp(min=1).unsqueeze(1)], dim=1)  # (S, 7)
            totals += torch.where(step_now.unsqueeze(1), step_stats, 0.0)
            counts += step_now
        if not bool(stepping.any()):  # no seed steps any more: the epoch loop ends too
            break
    # KL(π_old ‖ π_θ) of each seed's whole update, over every sample of its batch
    log_probs = log_probs_at(net, padded.obs, padded.actions, padded.valid)  # (S, H·M)
    update_kl = masked_mean(losses.k3_kl(log_probs - padded.old_log_probs), padded.valid)  # (S,)
    means = SeedStack.per_seed_metrics(totals / counts.clamp(min=1).unsqueeze(1), STATS, (counts > 0).tolist())
    kl_and_epochs = [{"update_kl": float(update_kl[k]), "epochs_run": float(epochs[k])} for k in range(S)]
    return [{**means[k], **kl_and_epochs[k]} if padded.trajectories[k] else {} for k in range(S)]


@dataclass
class Seed:
    """One seed's own GRPO state."""

    cfg: GRPOConfig
    envs: Envs  # train: the B·G members as one vector env; eval
    groups: MemberEnvs  # the envs its groups run in
    actor: Actor  # π_θ, whose parameters are views of its row of the stack's
    reference: Actor  # π_ref of the KL penalty, likewise
    buffers: SegmentBuffers  # (H, B·G) storage, reused by every collection
    lr_scale: float = 1.0  # kl_target: the factor on the scheduled learning rate, adapted every iteration


class Learner:
    """S seeds' GRPO (a :class:`~agents.training.Trainer`): each seed's own state and groups, on the shared seed
    stack (``onpolicy.SeedStack``: the actors computed together, one optimizer, generators and trainees)."""

    tags, finite = TAGS, FINITE

    def __init__(self, cfgs: list[GRPOConfig]) -> None:
        """Each seed's envs, actor and reference, seeded as a single run seeds them, then stacked
        (``onpolicy.SeedStack``: the actors (S, P), their optimizer, generators and trainees)."""
        self.seeds: list[Seed] = []
        self.H = horizon(cfgs[0])  # H: the training time limit

        def build(k: int, cfg: GRPOConfig) -> SeedParts:
            envs, groups, buffers = open_member_envs(cfg, self.H)
            actor = Actor(network_spec(envs.train, cfg)).to(cfg.device)  # π_ref: π_θ at the start
            self.seeds.append(Seed(cfg, envs, groups, actor, copy.deepcopy(actor).requires_grad_(False), buffers))
            networks = {"actor": actor, "reference": self.seeds[k].reference}
            return SeedParts(actor, envs.eval, partial(obs_statistics, envs.train), networks)

        try:
            self.stack = SeedStack(cfgs, build)
        except BaseException:
            self.close()
            raise
        self.trainees, self.random = self.stack.trainees, self.stack.random
        self.references = StackedNetworks([seed.reference for seed in self.seeds])  # (S, P)

    @property
    def cfg(self) -> GRPOConfig:
        """The settings every seed shares (all but the seed)."""
        return self.seeds[0].cfg

    def collect(self, iterations: list[int], running: list[bool]) -> list[Experience | None]:
        """Every running seed's B groups of G trajectories (``groups.group_steps``). At each step, the live
        members of every seed act through one batched forward pass; each seed draws from its own generator."""
        S, M, obs_dim = len(self.seeds), self.cfg.batch_trajectories, self.seeds[0].envs.obs_dim
        net = self.stack.net
        steps = {
            k: group_steps(
                seed.cfg,
                seed.groups,
                net.seed_policy(k, seed.actor, self.random.torch[k]),
                self.random.numpy[k],
                seed.buffers,
                iterations[k],
            )
            for k, seed in enumerate(self.seeds)
            if running[k]
        }

        def act(obs: Tensor) -> list[Callable[[int], Sample]]:
            out = net.policy(obs.to(self.cfg.device))  # (S, M, action_dim)
            return [
                partial(lambda k, rows: net.sample_seed(k, out[k, :rows], self.random.torch[k]), k) for k in range(S)
            ]

        groups = drive_seeds(steps, act, (S, M, obs_dim))
        return [experience(groups[k]) if running[k] else None for k in range(S)]

    def learn(
        self,
        batches: list[Experience | None],
        iterations: list[int],
        remaining: list[float],
        learning_rates: list[float],
        running: list[bool],
    ) -> list[dict[str, float | None]]:
        """The update at each seed's scheduled learning rate times its KL-target factor; then each seed's step
        size adapted to ``kl_target``, its reference refreshed, and its diagnostics."""
        groups = [c.batch if c is not None else None for c in batches]
        self.stack.set_learning_rates([lr * seed.lr_scale for lr, seed in zip(learning_rates, self.seeds, strict=True)])
        metrics: list[dict[str, float | None]] = []
        for seed, seed_groups, stats, iteration in zip(
            self.seeds, groups, update(self, groups), iterations, strict=True
        ):
            if seed_groups is not None:  # a seed no longer running learns nothing
                if (cfg := seed.cfg).kl_target is not None and stats:
                    seed.lr_scale = adapt_step_size(seed.lr_scale, stats["update_kl"], cfg.kl_target)
                refresh_reference(
                    seed.reference, seed.actor, cfg.ref_update, iteration % cfg.ref_update_interval == 0, cfg.ref_ema
                )
            metrics.append(diagnostics(seed_groups, stats, seed.lr_scale) if seed_groups is not None else {})
        return metrics

    def save(self, k: int) -> dict[str, Any]:  # the reference, the normalizer, the step size (iterations start afresh)
        seed = self.seeds[k]
        return {
            "reference": seed.reference.state_dict(),
            "normalizers": normalizer_state(seed.envs.train),
            "lr_scale": seed.lr_scale,
        }

    def load(self, k: int, checkpoint: dict[str, Any]) -> None:
        seed = self.seeds[k]
        seed.reference.load_state_dict(checkpoint["reference"])
        load_normalizer_state(seed.envs.train, checkpoint["normalizers"])
        seed.lr_scale = checkpoint.get("lr_scale", 1.0)

    def close(self) -> None:
        for seed in self.seeds:
            close_member_envs(seed.envs, seed.groups)


def checks(cfg: GRPOConfig) -> None:
    """GRPO's checks that need the env, run before any work starts: the groups' (``groups.validate``), and a
    floor on log σ only for a policy that has one."""
    validate(cfg)
    check(
        cfg.log_std_min is None or isinstance(action_space_of(cfg.env_id), Box),
        f"log_std_min floors the Gaussian policy's log σ, and {cfg.env_id}'s actions are discrete: drop it",
    )


train, train_stack = entry_points(Learner, "grpo", checks)


# ── Declaration: what the registry, the planner and `testbed tune` know of GRPO ─────────────────────────


def load_policy(cfg: GRPOConfig, env: VectorEnv, weights: dict[str, Any]) -> Actor:
    """The checkpoint's actor (GRPO has no critic), for ``testbed eval`` and the audit."""
    return load_weights(Actor(network_spec(env, cfg)), weights, "the checkpoint")


# GRPO's search space for `testbed tune`. It spans the settings the GRPO sweeps of benchmarks/results/grpo-sweeps/
# moved by hand: the group (G members from each of B start states), the training horizon, the update (epochs,
# minibatches, step size), the exploration noise σ (log_std_init), the KL penalty β, both clip ends, the advantage,
# the loss aggregation and the alive-bonus offset.
SPACE: dict[str, Any] = {
    "group_size": [4, 8, 16, 32],
    "num_groups": [4, 8, 16, 32],
    "max_episode_steps": [None, 100, 200, 400, 1000],  # None: the env's own time limit
    "n_epochs": [1, 4, 10, 20],
    "num_minibatches": [1, 4, 16],
    "learning_rate": {"low": 1.0e-5, "high": 3.0e-3, "log": True},
    "gamma": [0.99, 1.0],
    "log_std_init": {"low": -2.0, "high": 0.0},
    "beta": [0.0, 0.001, 0.01, 0.04, 0.1],
    "clip_low": [0.1, 0.2, 0.3],
    "clip_high": [0.2, 0.28, 0.4],
    "advantage": ["outcome", "rloo", "process", "step_baseline", "step_alive"],
    "reward_offset": [0.0, 1.0],  # ARS's alive-bonus offset: Hopper's, Walker2d's and Ant's healthy reward is 1
    "aggregation": ["trajectory", "step", "constant"],
}

ALGORITHMS = (
    Declaration(
        "grpo",
        config=GRPOConfig,
        train=train,
        train_stack=train_stack,
        load_policy=load_policy,
        checks=checks,
        space=SPACE,
        # The credit-assignment study's methods: the per-step reward-to-go, per-step group baselines, and
        # Monte-Carlo values from branches (agents/vine.py).
        variants={
            "grpo-process": {"advantage": "process"},
            "grpo-step": {"advantage": "step_baseline"},
            "grpo-vine": {"advantage": "vine"},
        },
    ),
)
