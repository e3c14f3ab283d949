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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from agents import advantages as adv
from agents import losses, runlog
from agents.config import check
from agents.networks import Actor, flatten_parameters
from agents.rollout import Episodes, SegmentBuffers, collect_episodes, concat_episodes
from agents.seeding import seed_everything
from agents.training import RunTracker, memory_report, network_spec, open_envs
from envs import EnvOptions, load_normalizer_state, make_vector, normalizer_state
from envs import start_states as starts
from envs.errors import BadInput
from envs.snapshot import NotRestorable

TAGS = [
    "charts/episodic_return", "charts/episodic_length", "charts/SPS", "charts/learning_rate",
    "losses/policy_loss", "losses/entropy", "losses/approx_kl", "losses/clipfrac",
    "grpo/frac_zero_std_groups", "grpo/group_return_std", "grpo/clipfrac_low", "grpo/clipfrac_high",
    "grpo/kl_ref", "grpo/ratio_mean", "grpo/episode_length_mean", "grpo/episode_length_min",
    "grpo/episode_length_max", "grpo/truncated_fraction", "grpo/wasted_step_fraction", "grpo/dropped_groups",
    "grpo/restore_time_s", "grpo/step_time_s", "eval/return_mean", "eval/return_std",
]  # fmt: skip


@dataclass(frozen=True)
class GRPOConfig:
    """Every setting of a GRPO run. Presets: ``agents/presets/grpo.yaml``; overrides: ``--set key=value``."""

    env_id: str
    """Any registered gymnasium id."""
    seed: int = 0
    """Seeds torch, numpy and the start states."""
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
    advantage: Literal["outcome", "no_std", "batch_std", "rloo", "process"] = "outcome"
    """How a trajectory is scored against its group (see agents/advantages.py)."""
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
    registered = gym.spec(cfg.env_id).max_episode_steps
    H = cfg.max_episode_steps or registered
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
            starts.restore_mode(cfg.env_id)
        except NotRestorable as error:
            raise BadInput(f"start_mode=branch: {error}") from None


def group_advantages(cfg: GRPOConfig, batch: Episodes, returns: Tensor) -> Tensor:
    """Per-step advantages (T, M) of the batch's B·G trajectories; returns (B, G)."""
    T, M = batch.mask.shape
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
    env_steps: int  # all env steps: members, trunks and replays
    restore_time_s: float

    @property
    def kept_groups(self) -> int:
        return self.batch.mask.shape[1] // self.group_returns.shape[1]


def collect_groups(
    cfg: GRPOConfig, env: Any, trunk_env: Any, mode: str | None, actor: Actor, buffers: SegmentBuffers, iteration: int
) -> Groups:
    """B groups of G trajectories; with dynamic sampling, tied groups are dropped and more collected."""
    B, G = cfg.num_groups, cfg.group_size

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
        episodes = collect_episodes(env, actor, np.asarray(first_obs, dtype=np.float32), buffers, cfg.device)
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
    return Groups(concat_episodes(parts), rounds, torch.cat(group_returns), episode_returns, env_steps, restore_time)


def update(
    actor: Actor, reference: Actor, optimizer: torch.optim.Optimizer, batch: Episodes, cfg: GRPOConfig, H: int
) -> dict[str, float]:
    """Epochs × minibatches of trajectories; returns the means of the minibatch statistics."""
    G, M = cfg.group_size, batch.mask.shape[1]
    returns = adv.discounted_returns(batch.rewards, batch.mask, cfg.gamma).view(M // G, G)  # (B', G)
    advantages = group_advantages(cfg, batch, returns)  # (T, M)
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
            nn.utils.clip_grad_norm_(flat_params, cfg.max_grad_norm)
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
    }  # fmt: skip


def train(cfg: GRPOConfig, run_dir: Path, resume: bool = False) -> dict[str, Any]:
    """Train the GRPO agent into ``run_dir``; returns the summary also written to ``summary.json``."""
    # ── setup ───────────────────────────────────────────────────────────────────────────────────────
    validate(cfg)
    seed_everything(cfg.seed)
    H, M = horizon(cfg), cfg.batch_trajectories
    env_kwargs = {"max_episode_steps": cfg.max_episode_steps} if cfg.max_episode_steps else {}
    envs = open_envs(cfg.env_id, M, cfg.eval_episodes, cfg.normalize_obs, False, 1.0, cfg.vectorization, **env_kwargs)
    env = envs.train
    mode = starts.restore_mode(cfg.env_id) if cfg.start_mode == "branch" else None
    trunk_env = None if mode is None else make_vector(cfg.env_id, cfg.num_groups, EnvOptions(vectorization="sync"),
                                                      **env_kwargs)  # B raw envs, no normalization  # fmt: skip
    actor = Actor(network_spec(env, cfg)).to(cfg.device)
    reference = copy.deepcopy(actor).requires_grad_(False)
    flat_params = flatten_parameters(actor)  # one tensor for Adam and the gradient clip: less overhead
    optimizer = torch.optim.Adam([flat_params], lr=cfg.learning_rate, eps=1e-5, fused=True)
    buffers = SegmentBuffers(H, M, envs.obs_dim, envs.action_shape, not envs.continuous)  # (H, B·G)
    global_step, iteration, wall_offset = 0, 0, 0.0
    if resume:
        ckpt = runlog.load_checkpoint(run_dir, {"algo": "grpo", "env_id": cfg.env_id})
        actor.load_state_dict(ckpt["model"])
        reference.load_state_dict(ckpt["reference"])
        optimizer.load_state_dict(ckpt["optimizer"])
        load_normalizer_state(env, ckpt["normalizers"])
        global_step, iteration, wall_offset = ckpt["global_step"], ckpt["iteration"], ckpt["wall_time_s"]
        runlog.load_rng_state(ckpt["rng"])
    run = RunTracker(run_dir, "grpo", cfg, TAGS, global_step, wall_offset, resume)
    status, error = "completed", None

    def checkpoint() -> None:
        runlog.save_checkpoint(run_dir, {
            "algo": "grpo", "env_id": cfg.env_id, "global_step": global_step, "iteration": iteration,
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
                stats = update(actor, reference, optimizer, groups.batch, cfg, H) if groups.kept_groups else {}
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
