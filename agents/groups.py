"""GRPO's groups: B start states, each shared by G members, each run until its own episode ends.

A group's members start from the same state: a seeded reset (``start_mode=reset``), or a state part-way
along a trunk episode (``start_mode=branch``, see ``envs/start_states.py``). With dynamic sampling (DAPO),
groups whose returns all tie carry no learning signal; they are dropped and more are collected. With vine
values (``advantage=vine``), states along the trajectories are recorded, then branched from. Last, the
iteration's diagnostics: the groups' grpo/ tags beside the update's.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from agents import advantages as adv
from agents import vine
from agents.networks import Actor, Sample
from agents.rollout import Episodes, SegmentBuffers, concat_episodes, drive, episode_steps
from agents.vine import VineValues
from envs import episode_limit
from envs import start_states as starts
from envs.errors import BadInput
from envs.snapshot import NotRestorable

if TYPE_CHECKING:
    from agents.grpo import GRPOConfig


def time_limit(cfg: GRPOConfig) -> dict[str, int]:
    """The training envs' keyword for the time limit: ``max_episode_steps`` if set, else nothing."""
    return {"max_episode_steps": cfg.max_episode_steps} if cfg.max_episode_steps else {}


def horizon(cfg: GRPOConfig) -> int:
    """H: the longest an episode can run in training (the time limit)."""
    H = episode_limit(cfg.env_id, **cfg.env_kwargs, **time_limit(cfg))
    if H is None:
        raise BadInput(f"{cfg.env_id} has no time limit; GRPO needs whole episodes: --set max_episode_steps=N")
    return H


def validate(cfg: GRPOConfig) -> None:
    """Checks that need the env, run before any work starts. A budget smaller than one iteration is not
    among them: the run takes one whole iteration and its summary reports the steps it took."""
    horizon(cfg)  # raises BadInput for an env without a time limit
    if cfg.start_mode == "branch":
        try:
            starts.restore_mode(cfg.env_id, **cfg.env_kwargs)
        except NotRestorable as error:
            raise BadInput(f"start_mode=branch: {error}") from None
    if cfg.advantage == "vine" and not starts.settable(cfg.env_id, **cfg.env_kwargs):
        raise BadInput(f"advantage=vine restores states along trajectories, which needs an env whose state can be "
                       f"set (MuJoCo, classic control, the testbed's tasks); {cfg.env_id}'s cannot")  # fmt: skip


def vine_interval(cfg: GRPOConfig, H: int) -> int:
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

    @property
    def kept_groups(self) -> int:
        return self.batch.mask.shape[1] // self.group_returns.shape[1]


def collect_groups(
    cfg: GRPOConfig, env: Any, trunk_env: Any, mode: str | None, actor: Actor, buffers: SegmentBuffers, iteration: int
) -> Groups:
    """B groups of G trajectories; with dynamic sampling, tied groups are dropped and more collected.
    With advantage=vine, the trajectories' states every m steps are recorded, then branched from."""
    return drive(group_steps(cfg, env, trunk_env, mode, actor, buffers, iteration), actor, cfg.device)


def group_steps(
    cfg: GRPOConfig, env: Any, trunk_env: Any, mode: str | None, actor: Actor, buffers: SegmentBuffers, iteration: int
) -> Generator[np.ndarray, Sample, Groups]:
    """:func:`collect_groups` as a generator of the members' steps (``rollout.episode_steps``): it yields
    the live members' observations and is sent π_θ's samples. ``actor`` itself acts only for the trunks
    (start_mode=branch) and the vine's branches."""
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
        episodes = yield from episode_steps(env, np.asarray(first_obs, dtype=np.float32), buffers,
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
        "grpo/episode_length_mean": float(lengths.mean()), "grpo/episode_length_min": float(lengths.min()),
        "grpo/episode_length_max": float(lengths.max()), "grpo/truncated_fraction": float(truncated.mean()),
        "grpo/idle_step_fraction": idle_steps / stepped,
        "grpo/dropped_groups": float(len(tied) - groups.kept_groups),
        "grpo/restore_time_s": groups.restore_time_s, "grpo/step_time_s": sum(e.step_time_s for e in groups.rounds),
        "grpo/vine_points": groups.vine.points if groups.vine else None,
        "grpo/vine_branch_step_fraction": groups.vine.branch_steps / groups.env_steps if groups.vine else None,
    }  # fmt: skip


def diagnostics(groups: Groups, stats: dict[str, float], lr_scale: float) -> dict[str, float | None]:
    """PPO's loss tags where they mean the same thing, the update's grpo/ tags and the groups' own."""
    clipfrac = stats["clipfrac_low"] + stats["clipfrac_high"] if "clipfrac_low" in stats else None
    return {
        "losses/policy_loss": stats.get("policy_loss"), "losses/entropy": stats.get("entropy"),
        "losses/approx_kl": stats.get("approx_kl"), "losses/clipfrac": clipfrac,
        "grpo/clipfrac_low": stats.get("clipfrac_low"), "grpo/clipfrac_high": stats.get("clipfrac_high"),
        "grpo/kl_ref": stats.get("kl_ref"), "grpo/ratio_mean": stats.get("ratio_mean"),
        "grpo/update_kl": stats.get("update_kl"), "grpo/epochs_run": stats.get("epochs_run"),
        "grpo/lr_scale": lr_scale, **group_statistics(groups),
    }  # fmt: skip
