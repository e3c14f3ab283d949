"""GRPO's groups: B start states, each shared by G members, each run until its own episode ends.

A group's members start from the same state: a seeded reset (``start_mode=reset``), or a state part-way
along a trunk episode (``start_mode=branch``, see ``envs/start_states.py``). With dynamic sampling (DAPO),
groups whose returns all tie carry no learning signal; they are dropped and more are collected. With vine
values (``advantage=vine``), states along the trajectories are recorded, then branched from. Last, the
iteration's diagnostics: the groups' grpo/ tags beside the update's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from agents import advantages as adv
from agents import vine
from agents.networks import Sample
from agents.onpolicy import env_options
from agents.rollout import Episodes, Policy, SegmentBuffers, concat_episodes, episode_steps
from agents.run_envs import Envs, open_envs
from agents.seeding import start_seeds
from agents.training import Experience
from agents.vine import VineValues
from envs import EnvOptions, episode_limit, make_vector
from envs import start_states as starts
from envs.errors import BadInput
from envs.snapshot import NotRestorable


class GroupSettings(Protocol):
    """What the groups read of a GRPO config (``grpo.GroupSettings``, which imports this module)."""

    env_id: str
    env_kwargs: dict[str, Any]
    seed: int
    gamma: float
    max_episode_steps: int | None
    start_mode: str
    branch_max_depth: int
    advantage: str
    vine_points: int
    vine_branches: int
    num_groups: int
    group_size: int
    dynamic_sampling: bool
    max_resample_rounds: int
    mask_truncated: bool


@dataclass
class MemberEnvs:
    """The envs one seed's groups run in."""

    members: Any  # the B·G members as one vector env
    trunks: Any  # start_mode=branch: B raw envs that run to the branch points; None for resets
    restore_mode: str | None  # how a branch point is restored (state or replay); None for resets


def time_limit(cfg: GroupSettings) -> dict[str, int]:
    """The training envs' keyword for the time limit: ``max_episode_steps`` if set, else nothing."""
    return {"max_episode_steps": cfg.max_episode_steps} if cfg.max_episode_steps else {}


def horizon(cfg: GroupSettings) -> int:
    """H: the longest an episode can run in training (the time limit)."""
    H = episode_limit(cfg.env_id, **cfg.env_kwargs, **time_limit(cfg))
    if H is None:
        raise BadInput(f"{cfg.env_id} has no time limit; GRPO needs whole episodes: --set max_episode_steps=N")
    return H


def validate(cfg: GroupSettings) -> None:
    """Checks that need the env, run before any work starts. A budget smaller than one iteration is not
    among them: the run takes one whole iteration and its summary reports the steps it took."""
    horizon(cfg)  # raises BadInput for an env without a time limit
    starts.check_seeded_reset(cfg.env_id, **cfg.env_kwargs)
    if cfg.start_mode == "branch":
        try:
            starts.restore_mode(cfg.env_id, **cfg.env_kwargs)
        except NotRestorable as error:
            raise BadInput(f"start_mode=branch: {error}") from None
    if cfg.advantage == "vine" and not starts.settable(cfg.env_id, **cfg.env_kwargs):
        raise BadInput(
            f"advantage=vine restores states along trajectories, which needs an env whose state can be "
            f"set (MuJoCo, classic control, the testbed's tasks, an env with get_state and set_state); {cfg.env_id}'s "
            "cannot"
        )


def vine_interval(cfg: GroupSettings, H: int) -> int:
    """m: steps between vine points, ⌈H / vine_points⌉."""
    return -(-H // cfg.vine_points)


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
    episode_last_rewards: list[float] = field(default_factory=list)  # raw, each episode's last step's

    @property
    def kept_groups(self) -> int:
        return self.batch.mask.shape[1] // self.group_returns.shape[1]


def group_steps(
    cfg: GroupSettings,
    envs: MemberEnvs,
    act: Policy,
    rng: np.random.RandomState,
    buffers: SegmentBuffers,
    iteration: int,
) -> Generator[np.ndarray, Sample, Groups]:
    """B groups of G trajectories; with dynamic sampling, tied groups are dropped and more collected. With
    advantage=vine, the trajectories' states every m steps are recorded, then branched from.

    A generator of the members' steps (``rollout.episode_steps``): it yields the live members' observations
    and is sent π_θ's samples, so that one batched call acts for many seeds' members. ``act`` (π_θ alone,
    from this seed's generator) acts for the trunks (start_mode=branch) and the vine's branches; ``rng``
    draws the trunks' depths."""
    B, G, H = cfg.num_groups, cfg.group_size, buffers.rewards.shape[0]
    env, trunk_env, mode = envs.members, envs.trunks, envs.restore_mode
    recorder = vine.PointRecorder(env, vine_interval(cfg, H)) if cfg.advantage == "vine" else None

    def policy_on_raw(raw_obs: np.ndarray) -> np.ndarray:
        """The trunk's policy: raw observations through the members' normalizer, then π_θ."""
        with torch.inference_mode():
            return act(torch.from_numpy(starts.observe(env, raw_obs))).actions.cpu().numpy()

    kept, parts, rounds, group_returns, episode_returns, last_rewards = 0, [], [], [], [], []
    env_steps, restore_time = 0, 0.0
    for round_ in range(cfg.max_resample_rounds + 1 if cfg.dynamic_sampling else 1):
        seeds = start_seeds(cfg.seed, iteration * (cfg.max_resample_rounds + 1) + round_, B)
        started = time.perf_counter()
        if mode is None:
            first_obs, prefix_returns = starts.reset_groups(env, seeds, G), np.zeros(B)
        else:
            depths = rng.randint(0, cfg.branch_max_depth + 1, size=B).tolist()
            points, trunk_steps = starts.run_trunks(trunk_env, seeds, depths, policy_on_raw, mode)
            first_obs, replay_steps = starts.branch_groups(env, points, G, mode)
            env_steps += trunk_steps + replay_steps
            prefix_returns = np.array([p.prefix_return for p in points])
        restore_time += time.perf_counter() - started
        episodes = yield from episode_steps(
            env, np.asarray(first_obs, dtype=np.float32), buffers, recorder.record if recorder else None
        )
        env_steps += episodes.env_steps
        rounds.append(episodes)
        returns = adv.discounted_returns(episodes.rewards, episodes.mask, cfg.gamma).view(B, G)  # (B, G)
        group_returns.append(returns)
        # The env's own return: a reward offset c shifted each of the L steps by −c.
        raw_returns = ((episodes.rewards * episodes.mask).sum(0) + cfg.reward_offset * episodes.mask.sum(0)).numpy()
        episode_returns += (np.repeat(prefix_returns, G) + raw_returns).tolist()
        ends = (episodes.lengths - 1).clamp(min=0)  # (M,) each member's last step
        last_rewards += (episodes.rewards[ends, torch.arange(B * G)] + cfg.reward_offset).tolist()
        informative = returns.amax(1) != returns.amin(1) if cfg.dynamic_sampling else torch.ones(B, dtype=torch.bool)
        groups = informative.nonzero().squeeze(1)[: B - kept]
        parts.append(episodes.select((groups.unsqueeze(1) * G + torch.arange(G)).flatten()))
        kept += len(groups)
        if kept >= B:
            break
    values = None
    if recorder is not None:
        J = -(-H // recorder.interval)
        values = vine.branch_values(env, act, recorder, J, cfg.vine_branches, cfg.gamma, buffers)
        env_steps += values.branch_steps
        restore_time += values.restore_time_s
    batch = concat_episodes(parts)
    return Groups(
        batch, rounds, torch.cat(group_returns), episode_returns, env_steps, restore_time, values, last_rewards
    )


def open_member_envs(cfg: Any, H: int) -> tuple[Envs, MemberEnvs, SegmentBuffers]:
    """A seed's envs: the B·G members as one vector env (train) and the evaluation envs, the B trunks
    (start_mode=branch), and its (H, B·G) buffers. ``cfg``: a GRPO config."""
    envs = open_envs(cfg, cfg.batch_trajectories, env_options(cfg, vectorization=cfg.vectorization), **time_limit(cfg))
    mode = starts.restore_mode(cfg.env_id, **cfg.env_kwargs) if cfg.start_mode == "branch" else None
    trunk_options = EnvOptions(vectorization="sync", reward_delay=cfg.reward_delay)  # B raw envs, no normalization
    trunks = (
        None
        if mode is None
        else make_vector(cfg.env_id, cfg.num_groups, trunk_options, **cfg.env_kwargs, **time_limit(cfg))
    )
    buffers = SegmentBuffers(H, cfg.batch_trajectories, envs.obs_dim, envs.action_shape, not envs.continuous)
    return envs, MemberEnvs(envs.train, trunks, mode), buffers


def close_member_envs(envs: Envs, groups: MemberEnvs) -> None:
    envs.close()
    if groups.trunks is not None:
        groups.trunks.close()


# ── scoring each trajectory against its group, and the batch the update learns from ──────────────────


def group_advantages(
    cfg: GroupSettings, batch: Episodes, returns: Tensor, vine_values: Tensor | None, H: int
) -> Tensor:
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
    if cfg.advantage == "step_alive":  # already on one scale: per time index
        return adv.group_step_alive(batch.rewards.view(by_group), batch.mask.view(by_group), cfg.gamma).view(T, M)
    if cfg.advantage in ("step_baseline", "step_horizon"):
        per_step = adv.group_step_baseline if cfg.advantage == "step_baseline" else adv.group_step_horizon
        A = per_step(batch.rewards.view(by_group), batch.mask.view(by_group), cfg.gamma).view(T, M)
        # One positive scale for the whole batch, which keeps tied groups at 0 and every sign as it is.
        return A / (A[batch.mask].std() + 1e-8) if batch.mask.sum() > 1 else A
    scores = {
        "outcome": adv.group_outcome,
        "no_std": adv.group_no_std,
        "batch_std": adv.group_batch_std,
        "rloo": adv.group_rloo,
    }[cfg.advantage](returns)  # (B, G)
    return scores.reshape(1, M).expand(T, M) * batch.mask


def targets(cfg: GroupSettings, groups: Groups, H: int) -> tuple[Tensor, Tensor]:
    """The batch's per-step advantages and the mask of the steps that enter the loss, each (T, M)."""
    batch, G = groups.batch, cfg.group_size
    returns = adv.discounted_returns(batch.rewards, batch.mask, cfg.gamma).view(-1, G)  # (B', G)
    advantages = group_advantages(cfg, batch, returns, groups.vine.values if groups.vine else None, H)  # (T, M)
    return advantages, batch.mask & ~batch.truncated if cfg.mask_truncated else batch.mask


@dataclass
class PaddedGroups:
    """S seeds' batches of trajectories for one batched update, each padded to (H, M) and masked: seed k's
    M_k ≤ M = B·G trajectories (fewer where dynamic sampling ran short, none without an informative group)
    fill its first columns. Steps are flattened time-major: (S, H·M, …)."""

    obs: Tensor  # (S, H·M, obs_dim)
    actions: Tensor  # (S, H·M) int64 or (S, H·M, act_dim)
    old_log_probs: Tensor  # (S, H·M)  log π_old(a|s) at collection
    valid: Tensor  # (S, H·M) bool  the steps of a trajectory
    advantages: Tensor  # (S, H, M)
    loss_mask: Tensor  # (S, H, M) bool  the steps that enter the loss
    trajectories: Tensor  # (S,)  M_k


def pad_groups(
    groups: list[Groups | None], targets: Callable[[Groups], tuple[Tensor, Tensor]], H: int, M: int, device: str
) -> PaddedGroups:
    """Every seed's batch of an iteration, padded (:class:`PaddedGroups`); ``targets(groups)`` gives a batch's
    per-step advantages and loss mask, each (T, M_k)."""
    S = len(groups)
    template = next(g.batch for g in groups if g is not None)
    obs = torch.zeros((S, H, M, template.obs.shape[-1]))  # (S, H, M, obs_dim)
    actions = torch.zeros((S, H, M, *template.actions.shape[2:]), dtype=template.actions.dtype)  # (S, H, M, …)
    old_log_probs, advantages = torch.zeros((S, H, M)), torch.zeros((S, H, M))  # (S, H, M)
    valid, loss_mask = torch.zeros((S, H, M), dtype=torch.bool), torch.zeros((S, H, M), dtype=torch.bool)
    trajectories = torch.zeros(S, dtype=torch.int64)  # (S,)
    for k, seed_groups in enumerate(groups):
        if seed_groups is not None and seed_groups.kept_groups:
            batch = seed_groups.batch
            T, trajectories[k] = batch.mask.shape
            seed_advantages, seed_loss_mask = targets(seed_groups)
            for x, value in (
                (obs, batch.obs),
                (actions, batch.actions),
                (old_log_probs, batch.log_probs),
                (advantages, seed_advantages),
                (valid, batch.mask),
                (loss_mask, seed_loss_mask),
            ):
                x[k, :T, : value.shape[1]] = value
    flat = partial(torch.flatten, start_dim=1, end_dim=2)  # (S, H, M, …) → (S, H·M, …)
    return PaddedGroups(
        flat(obs).to(device),
        flat(actions).to(device),
        flat(old_log_probs).to(device),
        flat(valid).to(device),
        advantages.to(device),
        loss_mask.to(device),
        trajectories,
    )


def experience(groups: Groups) -> Experience:
    """An iteration's groups as the lifecycle counts and logs them."""
    lengths = torch.cat([e.lengths for e in groups.rounds]).tolist()
    return Experience(groups, groups.env_steps, groups.episode_returns, lengths, groups.episode_last_rewards)


def group_statistics(groups: Groups) -> dict[str, float | None]:
    """The grpo/ tags of a collection: ties, spread, episode lengths, idle steps, restores, the vine."""
    lengths = torch.cat([e.lengths for e in groups.rounds]).float()  # every collected trajectory
    truncated = torch.cat([e.truncated for e in groups.rounds]).float()
    tied = groups.group_returns.amax(1) == groups.group_returns.amin(1)
    idle_steps = sum(e.idle_steps for e in groups.rounds)
    stepped = sum(e.env_steps for e in groups.rounds) + idle_steps
    return {
        "grpo/frac_zero_std_groups": float(tied.float().mean()),
        "grpo/group_return_std": float(groups.group_returns.std(1).mean()),
        "grpo/episode_length_mean": float(lengths.mean()),
        "grpo/episode_length_min": float(lengths.min()),
        "grpo/episode_length_max": float(lengths.max()),
        "grpo/truncated_fraction": float(truncated.mean()),
        "grpo/idle_step_fraction": idle_steps / stepped,
        "grpo/dropped_groups": float(len(tied) - groups.kept_groups),
        "grpo/restore_time_s": groups.restore_time_s,
        "grpo/step_time_s": sum(e.step_time_s for e in groups.rounds),
        "grpo/vine_points": groups.vine.points if groups.vine else None,
        "grpo/vine_branch_step_fraction": groups.vine.branch_steps / groups.env_steps if groups.vine else None,
    }


def diagnostics(groups: Groups, stats: dict[str, float], lr_scale: float) -> dict[str, float | None]:
    """PPO's loss tags where they mean the same thing, the update's grpo/ tags and the groups' own."""
    clipfrac = stats["clipfrac_low"] + stats["clipfrac_high"] if "clipfrac_low" in stats else None
    return {
        "losses/policy_loss": stats.get("policy_loss"),
        "losses/entropy": stats.get("entropy"),
        "losses/approx_kl": stats.get("approx_kl"),
        "losses/clipfrac": clipfrac,
        "grpo/clipfrac_low": stats.get("clipfrac_low"),
        "grpo/clipfrac_high": stats.get("clipfrac_high"),
        "grpo/kl_ref": stats.get("kl_ref"),
        "grpo/ratio_mean": stats.get("ratio_mean"),
        "grpo/update_kl": stats.get("update_kl"),
        "grpo/epochs_run": stats.get("epochs_run"),
        "grpo/lr_scale": lr_scale,
        **group_statistics(groups),
    }
