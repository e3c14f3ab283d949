"""Vine: Monte-Carlo values at states along the trunk trajectories, so advantages need no critic.

TRPO's "single path vs vine" (Schulman et al. 2015, arXiv 1502.05477, §5.2) and VinePPO (Kazemnejad et
al. 2024, arXiv 2410.01679): while the trunk trajectories are collected, take a snapshot of every live
member every m steps; afterwards restore each snapshot into K sub-envs and roll the K branches out with
π_θ to the episode's end. The value of the snapshot's state is the mean of their discounted returns,

    V̂(s) = (1/K) Σ_{k=1}^{K} Σ_{u ≥ 0} γ^u r_u^{(k)}

with r_u^{(k)} the u-th reward of branch k from s. ``advantages.vine`` turns the values into advantages.
Restores are exact (``envs.snapshot``), so only envs whose state can be set are supported. A restored
state includes the env's random-number generator: the branches meet the same env randomness as the
trunk (common random numbers), so noise that does not depend on actions, like the tasks' distractor
rewards, cancels out of the advantages, as it does between GRPO's same-seed group members. Every env step
of the branches counts toward the budget, also the steps a sub-env takes after its branch ended, while
the others finish.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
from gymnasium.vector import VectorEnv
from torch import Tensor

from agents import advantages as adv
from agents.rollout import Policy, SegmentBuffers, collect_episodes
from envs import start_states as starts


@dataclass
class PointRecorder:
    """Snapshots of every live member at steps 0, m, 2m, …; pass :meth:`record` as ``before_step``."""

    env: VectorEnv
    interval: int  # m
    points: list[tuple[int, int, starts.BranchPoint]] = field(default_factory=list)  # (j, member i, state)
    snapshot_time_s: float = 0.0
    mode: starts.RestoreMode = "direct"  # replay: observations only (the caller supplies seeds and prefixes)

    def record(self, t: int, alive: np.ndarray) -> None:
        if t % self.interval:
            return
        started = time.perf_counter()
        for i in np.flatnonzero(alive):
            self.points.append((t // self.interval, int(i), starts.member_point(self.env, int(i), self.mode)))
        self.snapshot_time_s += time.perf_counter() - started


@dataclass
class VineValues:
    values: Tensor  # (J, M) V̂ at step j·m of member i; 0 where the member's episode had ended
    branch_steps: int  # env steps of all branches
    points: int  # snapshots branched from
    restore_time_s: float  # snapshots taken and restored


def branch_values(
    env: VectorEnv, act: Policy, recorder: PointRecorder, J: int, K: int, gamma: float, buffers: SegmentBuffers
) -> VineValues:
    """V̂ at every recorded point, from K branches each: M / K points at a time in the M-member env.

    ``buffers`` (T_max, M) must bound a branch's length, which the env's time limit does: a restored
    member keeps its time-limit counter. The last round is padded with copies of its last point, whose
    branches count as steps but not toward any value.
    """
    M = env.num_envs
    P = M // K  # points per round
    values = torch.zeros(J, M)  # (J, M)
    steps, restore_time = 0, recorder.snapshot_time_s
    for first in range(0, len(recorder.points), P):
        chunk = recorder.points[first : first + P]
        padded = [point for _, _, point in chunk] + [chunk[-1][2]] * (P - len(chunk))
        started = time.perf_counter()
        obs, _ = starts.branch_groups(env, padded, K, "direct")
        restore_time += time.perf_counter() - started
        branches = collect_episodes(env, act, np.asarray(obs, dtype=np.float32), buffers)
        steps += branches.env_steps
        V = adv.discounted_returns(branches.rewards, branches.mask, gamma).view(P, K).mean(1)  # (P,)
        for (j, i, _), value in zip(chunk, V.tolist()):
            values[j, i] = value
    return VineValues(values, steps, len(recorder.points), restore_time)
