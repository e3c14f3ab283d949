"""A GRPO-style agent for control (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300), read top to bottom.

No critic. One iteration: reset B start states, each shared by a group of G members (same seed, or
the same state in the middle of an episode) → run the B·G members as one vector env until every one
has ended (``rollout.collect_episodes``) → score each trajectory against its own group
(``advantages.group_*``) → epochs × minibatches of trajectories of the clipped surrogate with separate
lower and upper clips, a k3 KL penalty to a reference policy and an optional entropy bonus, averaged by
the chosen aggregation (``losses``) → log, evaluate, checkpoint (``runlog``).

Variants, each a setting: the advantage (outcome, no_std = Dr. GRPO, batch_std, rloo, process), the
aggregation (trajectory = GRPO, step = DAPO, constant = Dr. GRPO), ε_low/ε_high (DAPO's clip-higher),
β (0 = DAPO's no KL), dynamic sampling (DAPO), masking of truncated trajectories, the reference refresh.

Every env step counts toward the budget: the wasted steps a member takes after its episode ended, the
trunk steps before a branch point and the replayed steps of a restore included.
"""

from __future__ import annotations

import copy
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from agents import advantages as adv
from agents import losses, runlog, vine
from agents.config import check
from agents.networks import Actor, clip_grad_norm_, flatten_parameters
from agents.rollout import Episodes, SegmentBuffers, collect_episodes, concat_episodes
from agents.seeding import seed_everything
from agents.training import RunTracker, memory_report, network_spec, open_envs
from agents.vine import VineValues
from envs import EnvOptions, episode_limit, load_normalizer_state, make_vector, normalizer_state
from envs import start_states as starts
from envs.errors import BadInput
from envs.snapshot import NotRestorable

TAGS = [
    "charts/episodic_return", "charts/episodic_length", "charts/SPS", "charts/learning_rate",
    "losses/policy_loss", "losses/entropy", "losses/approx_kl", "losses/clipfrac",
    "grpo/frac_zero_std_groups", "grpo/group_return_std", "grpo/clipfrac_low", "grpo/clipfrac_high",
    "grpo/kl_ref", "grpo/ratio_mean", "grpo/episode_length_mean", "grpo/episode_length_min",
    "grpo/episode_length_max", "grpo/truncated_fraction", "grpo/wasted_step_fraction", "grpo/dropped_groups",
    "grpo/restore_time_s", "grpo/step_time_s", "grpo/vine_points", "grpo/vine_branch_step_fraction",
    "eval/return_mean", "eval/return_std",
]  # fmt: skip


@dataclass(frozen=True)
class GRPOConfig:
    """Every setting of a GRPO run. Presets: ``agents/presets/grpo.yaml``; overrides: ``--set key=value``."""

    env_id: str
    """Any registered gymnasium id."""
    seed: int = 0
    """Seeds torch, numpy and the start states."""
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
    """Env steps to train for; every sub-env step counts, wasted and replayed ones included."""
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
    advantage: Literal["outcome", "no_std", "batch_std", "rloo", "process", "vine"] = "outcome"
    """How a trajectory is scored against its group (see agents/advantages.py); vine: from Monte-Carlo
    values of branches at states along it instead (agents/vine.py, the ``grpo-vine`` algo)."""
    vine_points: int = 4
    """vine: a value every ⌈H / vine_points⌉ steps of each trajectory, from its first step on."""
    vine_branches: int = 4
    """vine: K branches per value; K must divide B·G, the members that branch at once."""
    gamma: float = 1.0
    """Discount of the return R that scores a trajectory (1: the plain sum, as DeepSeekMath)."""
    aggregation: Literal["trajectory", "step", "constant"] = "trajectory"
    """How per-step losses are averaged (see agents/losses.py: aggregate)."""
    clip_low: float = 0.2
    """ε_low: the ratio is clipped below at 1 − ε_low."""
    clip_high: float = 0.2
    """ε_high: the ratio is clipped above at 1 + ε_high (DAPO's clip-higher uses 0.28)."""
    beta: float = 0.04
    """β: weight of the k3 KL penalty to the reference policy (0 drops it, as DAPO)."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    n_epochs: int = 4
    """Passes over each batch of trajectories."""
    num_minibatches: int = 4
    """Minibatches of trajectories per epoch; more gradient steps make clipping active."""
    learning_rate: float = 3e-4
    """Adam's step size (its start value when annealed)."""
    anneal_lr: bool = False
    """Decay the learning rate linearly to 0 over the run."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
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
    normalize_obs: bool = False
    """Running observation normalization, one set of statistics for all members (clipped to ±10)."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Widths of the actor's hidden layers."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Hidden activation."""
    ortho_init: bool = True
    """Orthogonal initialization; False keeps torch's default."""
    log_std_init: float = 0.0
    """Initial log σ of the Gaussian policy (continuous actions)."""
    vectorization: Literal["sync", "async"] = "sync"
    """How the B·G members run; branching needs sync."""
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
        check(self.group_size >= 2, f"group_size (G) must be at least 2 to compare members, got {self.group_size}")
        check(self.num_groups >= 1, f"num_groups (B) must be at least 1, got {self.num_groups}")
        check(self.max_episode_steps is None or self.max_episode_steps >= 1, "max_episode_steps must be positive")
        check(self.branch_max_depth >= 0, f"branch_max_depth must be >= 0, got {self.branch_max_depth}")
        check(0.0 <= self.gamma <= 1.0, f"gamma must be in [0, 1], got {self.gamma}")
        check(0.0 < self.clip_low < 1.0, f"clip_low must be in (0, 1), got {self.clip_low}")
        check(self.clip_high > 0.0, f"clip_high must be positive, got {self.clip_high}")
        check(self.beta >= 0 and self.ent_coef >= 0, "beta and ent_coef must be non-negative")
        check(self.n_epochs >= 1, f"n_epochs must be at least 1, got {self.n_epochs}")
        check(
            1 <= self.num_minibatches <= self.batch_trajectories,
            f"num_minibatches must be in [1, B·G = {self.batch_trajectories}], got {self.num_minibatches}",
        )
        check(self.learning_rate > 0, f"learning_rate must be positive, got {self.learning_rate}")
        check(self.max_grad_norm > 0, f"max_grad_norm must be positive, got {self.max_grad_norm}")
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
        check(len(self.hidden_sizes) >= 1 and min(self.hidden_sizes) >= 1, "hidden_sizes must be positive widths")
        check(self.start_mode == "reset" or self.vectorization == "sync", "start_mode=branch needs vectorization=sync")
        check(self.eval_interval >= 0, f"eval_interval must be >= 0, got {self.eval_interval}")
        check(self.eval_episodes >= 1, f"eval_episodes must be at least 1, got {self.eval_episodes}")
        check(self.checkpoint_interval >= 0, f"checkpoint_interval must be >= 0, got {self.checkpoint_interval}")

    @property
    def batch_trajectories(self) -> int:
        """M = B · G trajectories per collection."""
        return self.num_groups * self.group_size


def horizon(cfg: GRPOConfig) -> int:
    """H: the longest an episode can run in training (the time limit)."""
    limit = {"max_episode_steps": cfg.max_episode_steps} if cfg.max_episode_steps else {}
    H = episode_limit(cfg.env_id, **cfg.env_kwargs, **limit)
    if H is None:
        raise BadInput(f"{cfg.env_id} has no time limit; GRPO needs whole episodes: --set max_episode_steps=N")
    return H


def validate(cfg: GRPOConfig) -> None:
    """Checks that need the env, run before any work starts."""
    H = horizon(cfg)
    if cfg.batch_trajectories * H > cfg.total_steps:
        raise BadInput(
            f"one iteration can take B·G·H = {cfg.num_groups}·{cfg.group_size}·{H} = {cfg.batch_trajectories * H} "
            f"env steps, more than total_steps = {cfg.total_steps}. Lower num_groups, group_size or "
            "max_episode_steps, or raise --total-steps."
        )
    if cfg.start_mode == "branch":
        try:
            starts.restore_mode(cfg.env_id, **cfg.env_kwargs)
        except NotRestorable as error:
            raise BadInput(f"start_mode=branch: {error}") from None
    if cfg.advantage == "vine":
        J = -(-H // vine_interval(cfg, H))
        # Point j of a full-length trunk has H − j·m = H·(J − j)/J steps left; K branches from each of the J
        # points take K·H·(J + 1)/2 steps in all.
        per_iteration = cfg.batch_trajectories * H * (1 + cfg.vine_branches * (J + 1) // 2)
        if per_iteration > cfg.total_steps:
            raise BadInput(
                f"one iteration with vine values takes about B·G·H·(1 + K·(J + 1)/2) = {per_iteration} env steps "
                f"(J = {J} points per trajectory, K = {cfg.vine_branches} branches each), more than total_steps = "
                f"{cfg.total_steps}. Lower vine_points, vine_branches, num_groups or group_size, or raise "
                "--total-steps."
            )
    if cfg.advantage == "vine" and not starts.settable(cfg.env_id, **cfg.env_kwargs):
        raise BadInput(f"advantage=vine restores states along trajectories, which needs an env whose state can be "
                       f"set (MuJoCo, classic control, the testbed's tasks); {cfg.env_id}'s cannot")  # fmt: skip


def vine_interval(cfg: GRPOConfig, H: int) -> int:
    """m: steps between vine points, ⌈H / vine_points⌉."""
    return -(-H // cfg.vine_points)


def group_advantages(
    cfg: GRPOConfig, batch: Episodes, returns: Tensor, vine_values: Tensor | None, H: int
) -> Tensor:
    """Per-step advantages (T, M) of the batch's B·G trajectories; returns (B, G), vine values (J, M)."""
    T, M = batch.mask.shape
    if cfg.advantage == "vine":
        A = adv.vine(batch.rewards, batch.mask, vine_values, vine_interval(cfg, H), cfg.gamma)  # (T, M)
        valid = batch.mask.nonzero(as_tuple=True)
        # Standardized over the batch's steps, as PPO's: returns of control tasks run into the hundreds.
        A[valid] = adv.normalize(A[valid])
        return A
    if cfg.advantage == "process":
        rewards = batch.rewards.view(T, -1, cfg.group_size)  # (T, B, G)
        return adv.group_process(rewards, batch.mask.view(T, -1, cfg.group_size)).view(T, M)
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

        L = agg_{i,t} [ −min(ρ A, clip(ρ, 1 − ε_low, 1 + ε_high) A) + β · k3(π_ref ‖ π_θ) − c_H · H(π_θ) ]

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
    kl_ref = losses.k3_kl(ref_log_probs[:, members][steps] - log_probs)  # KL(π_θ ‖ π_ref), x ~ π_θ
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


def refresh_reference(reference: Actor, actor: Actor, cfg: GRPOConfig, iteration: int) -> None:
    if cfg.ref_update == "periodic" and iteration % cfg.ref_update_interval == 0:
        reference.load_state_dict(actor.state_dict())
    elif cfg.ref_update == "ema":
        with torch.no_grad():
            for ref_p, p in zip(reference.parameters(), actor.parameters(), strict=True):
                ref_p.lerp_(p, 1.0 - cfg.ref_ema)


@dataclass
class Groups:
    """One iteration's collection: the batch to learn from, and everything collected for diagnostics."""

    batch: Episodes  # B' ≤ B groups; fewer than B only when dynamic sampling ran out of rounds
    rounds: list[Episodes]  # every collection, dropped groups included
    group_returns: Tensor  # (every collected group, G)
    episode_returns: list[float]  # raw, undiscounted, from the episode's start (a trunk prefix included)
    env_steps: int  # all env steps: members, trunks, replays and vine branches
    restore_time_s: float
    vine: VineValues | None = None  # advantage=vine: the values along the batch's trajectories

    @property
    def kept_groups(self) -> int:
        return self.batch.mask.shape[1] // self.group_returns.shape[1]


def collect_groups(
    cfg: GRPOConfig, env: Any, trunk_env: Any, mode: str | None, actor: Actor, buffers: SegmentBuffers, iteration: int
) -> Groups:
    """B groups of G trajectories; with dynamic sampling, tied groups are dropped and more collected.
    With advantage=vine, the trajectories' states every m steps are recorded, then branched from."""
    B, G, H = cfg.num_groups, cfg.group_size, buffers.rewards.shape[0]
    recorder = vine.PointRecorder(env, vine_interval(cfg, H)) if cfg.advantage == "vine" else None

    def policy_on_raw(raw_obs: np.ndarray) -> np.ndarray:
        """The trunk's policy: raw observations through the members' normalizer, then π_θ."""
        with torch.inference_mode():
            return actor.act(torch.from_numpy(starts.observe(env, raw_obs)).to(cfg.device)).actions.cpu().numpy()

    kept, parts, rounds, group_returns, episode_returns = 0, [], [], [], []
    env_steps, restore_time = 0, 0.0
    for round_ in range(cfg.max_resample_rounds + 1 if cfg.dynamic_sampling else 1):
        seeds = starts.group_seeds(cfg.seed, iteration * (cfg.max_resample_rounds + 1) + round_, B)
        started = time.perf_counter()
        if mode is None:
            first_obs, prefix_returns = starts.reset_groups(env, seeds, G), np.zeros(B)
        else:
            depths = np.random.randint(0, cfg.branch_max_depth + 1, size=B).tolist()
            points, trunk_steps = starts.run_trunks(trunk_env, seeds, depths, policy_on_raw, mode)
            first_obs, replay_steps = starts.branch_groups(env, points, G, mode)
            env_steps += trunk_steps + replay_steps
            prefix_returns = np.array([p.prefix_return for p in points])
        restore_time += time.perf_counter() - started
        episodes = collect_episodes(env, actor, np.asarray(first_obs, dtype=np.float32), buffers, cfg.device,
                                    recorder.record if recorder else None)  # fmt: skip
        env_steps += episodes.env_steps
        rounds.append(episodes)
        returns = adv.discounted_returns(episodes.rewards, episodes.mask, cfg.gamma).view(B, G)  # (B, G)
        group_returns.append(returns)
        raw_returns = (episodes.rewards * episodes.mask).sum(0).numpy()  # (B·G,)
        episode_returns += (np.repeat(prefix_returns, G) + raw_returns).tolist()
        informative = returns.amax(1) != returns.amin(1) if cfg.dynamic_sampling else torch.ones(B, dtype=torch.bool)
        groups = informative.nonzero().squeeze(1)[: B - kept]
        parts.append(episodes.select((groups.unsqueeze(1) * G + torch.arange(G)).flatten()))
        kept += len(groups)
        if kept >= B:
            break
    values = None
    if recorder is not None:
        J = -(-H // recorder.interval)
        values = vine.branch_values(env, actor, recorder, J, cfg.vine_branches, cfg.gamma, buffers, cfg.device)
        env_steps += values.branch_steps
        restore_time += values.restore_time_s
    batch = concat_episodes(parts)
    return Groups(batch, rounds, torch.cat(group_returns), episode_returns, env_steps, restore_time, values)


def update(
    actor: Actor, reference: Actor, optimizer: torch.optim.Optimizer, groups: Groups, cfg: GRPOConfig, H: int
) -> dict[str, float]:
    """Epochs × minibatches of trajectories; returns the means of the minibatch statistics."""
    batch = groups.batch
    G, M = cfg.group_size, batch.mask.shape[1]
    returns = adv.discounted_returns(batch.rewards, batch.mask, cfg.gamma).view(M // G, G)  # (B', G)
    vine_values = groups.vine.values if groups.vine else None
    advantages = group_advantages(cfg, batch, returns, vine_values, H)  # (T, M)
    loss_mask = batch.mask & ~batch.truncated if cfg.mask_truncated else batch.mask  # (T, M)
    with torch.no_grad():
        valid = batch.mask.nonzero(as_tuple=True)
        ref_log_probs = torch.zeros(batch.mask.shape)  # (T, M)  fixed during the iteration
        ref_log_probs[valid] = reference.log_prob_entropy(reference(batch.obs[valid]), batch.actions[valid])[0]
    (flat_params,) = optimizer.param_groups[0]["params"]
    n_minibatches = min(cfg.num_minibatches, M)
    totals: dict[str, Tensor] = {}
    for _ in range(cfg.n_epochs):
        for members in torch.randperm(M).tensor_split(n_minibatches):
            loss, stats = minibatch_loss(actor, batch, members, advantages, ref_log_probs, loss_mask, cfg, H)
            flat_params.grad.zero_()
            loss.backward()
            clip_grad_norm_(flat_params, cfg.max_grad_norm)
            optimizer.step()
            for key, value in stats.items():
                totals[key] = totals.get(key, 0.0) + value
    return {key: float(value) / (cfg.n_epochs * n_minibatches) for key, value in totals.items()}


def diagnostics(groups: Groups, stats: dict[str, float]) -> dict[str, float | None]:
    """PPO's loss tags where they mean the same thing, and the grpo/ group statistics."""
    lengths = torch.cat([e.lengths for e in groups.rounds]).float()  # every collected trajectory
    truncated = torch.cat([e.truncated for e in groups.rounds]).float()
    tied = groups.group_returns.amax(1) == groups.group_returns.amin(1)
    member_steps = sum(e.env_steps for e in groups.rounds)
    clipfrac = stats["clipfrac_low"] + stats["clipfrac_high"] if stats else None
    return {
        "losses/policy_loss": stats.get("policy_loss"), "losses/entropy": stats.get("entropy"),
        "losses/approx_kl": stats.get("approx_kl"), "losses/clipfrac": clipfrac,
        "grpo/frac_zero_std_groups": float(tied.float().mean()),
        "grpo/group_return_std": float(groups.group_returns.std(1).mean()),
        "grpo/clipfrac_low": stats.get("clipfrac_low"), "grpo/clipfrac_high": stats.get("clipfrac_high"),
        "grpo/kl_ref": stats.get("kl_ref"), "grpo/ratio_mean": stats.get("ratio_mean"),
        "grpo/episode_length_mean": float(lengths.mean()), "grpo/episode_length_min": float(lengths.min()),
        "grpo/episode_length_max": float(lengths.max()), "grpo/truncated_fraction": float(truncated.mean()),
        "grpo/wasted_step_fraction": sum(e.wasted_steps for e in groups.rounds) / member_steps,
        "grpo/dropped_groups": float(len(tied) - groups.kept_groups),
        "grpo/restore_time_s": groups.restore_time_s, "grpo/step_time_s": sum(e.step_time_s for e in groups.rounds),
        "grpo/vine_points": groups.vine.points if groups.vine else None,
        "grpo/vine_branch_step_fraction": groups.vine.branch_steps / groups.env_steps if groups.vine else None,
    }  # fmt: skip


def train(cfg: GRPOConfig, run_dir: Path, resume: bool = False, name: str = "grpo") -> dict[str, Any]:
    """Train the GRPO agent into ``run_dir``; returns the summary also written to ``summary.json``."""
    # ── setup ───────────────────────────────────────────────────────────────────────────────────────
    validate(cfg)
    seed_everything(cfg.seed)
    H, M = horizon(cfg), cfg.batch_trajectories
    limit = {"max_episode_steps": cfg.max_episode_steps} if cfg.max_episode_steps else {}
    envs = open_envs(cfg.env_id, M, cfg.eval_episodes, cfg.normalize_obs, False, 1.0, cfg.vectorization,
                     cfg.env_kwargs, cfg.reward_delay, cfg.eval_env_kwargs, **limit)  # fmt: skip
    env = envs.train
    mode = starts.restore_mode(cfg.env_id, **cfg.env_kwargs) if cfg.start_mode == "branch" else None
    trunk_options = EnvOptions(vectorization="sync", reward_delay=cfg.reward_delay)  # B raw envs, no normalization
    trunk_env = None if mode is None else make_vector(cfg.env_id, cfg.num_groups, trunk_options, **cfg.env_kwargs,
                                                      **limit)  # fmt: skip
    actor = Actor(network_spec(env, cfg)).to(cfg.device)
    reference = copy.deepcopy(actor).requires_grad_(False)
    flat_params = flatten_parameters(actor)  # one tensor for Adam and the gradient clip: less overhead
    optimizer = torch.optim.Adam([flat_params], lr=cfg.learning_rate, eps=1e-5, fused=True)
    buffers = SegmentBuffers(H, M, envs.obs_dim, envs.action_shape, not envs.continuous)  # (H, B·G)
    global_step, iteration, wall_offset = 0, 0, 0.0
    if resume:
        ckpt = runlog.load_checkpoint(run_dir, {"algo": name, "env_id": cfg.env_id})
        actor.load_state_dict(ckpt["model"])
        reference.load_state_dict(ckpt["reference"])
        optimizer.load_state_dict(ckpt["optimizer"])
        load_normalizer_state(env, ckpt["normalizers"])
        global_step, iteration, wall_offset = ckpt["global_step"], ckpt["iteration"], ckpt["wall_time_s"]
        runlog.load_rng_state(ckpt["rng"])
    run = RunTracker(run_dir, name, cfg, TAGS, global_step, wall_offset, resume)
    status, error = "completed", None

    def checkpoint() -> None:
        runlog.save_checkpoint(run_dir, {
            "algo": name, "env_id": cfg.env_id, "global_step": global_step, "iteration": iteration,
            "wall_time_s": run.wall_time(), "model": actor.state_dict(), "reference": reference.state_dict(),
            "optimizer": optimizer.state_dict(), "rng": runlog.rng_state(), "normalizers": normalizer_state(env),
        })  # fmt: skip

    with runlog.StopFlag() as stop:
        try:
            while global_step < cfg.total_steps:
                # ── collect B groups of G trajectories ──────────────────────────────────────────────
                groups = collect_groups(cfg, env, trunk_env, mode, actor, buffers, iteration)
                global_step += groups.env_steps
                iteration += 1

                # ── schedule (as PPO's), group advantages and update ─────────────────────────────────
                lr = cfg.learning_rate * (max(1.0 - global_step / cfg.total_steps, 0.0) if cfg.anneal_lr else 1.0)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                # Without an informative group (every group tied in every round) there is nothing to learn.
                stats = update(actor, reference, optimizer, groups, cfg, H) if groups.kept_groups else {}
                refresh_reference(reference, actor, cfg, iteration)
                runlog.check_finite({k: v for k, v in stats.items() if k == "policy_loss"}, actor)

                # ── log, evaluate, checkpoint ───────────────────────────────────────────────────────
                metrics = {**diagnostics(groups, stats), "charts/learning_rate": lr}
                lengths = torch.cat([e.lengths for e in groups.rounds]).tolist()
                run.record(global_step, metrics, actor, envs, groups.episode_returns, lengths)
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
        finally:
            if trunk_env is not None:
                trunk_env.close()
    extra = memory_report(optimizer, actor=actor, reference=reference)
    return run.finish(actor, envs, status, error, global_step, extra)
