"""The true advantage of the actions a policy took, measured by rollouts from restored states, beside every
advantage estimator of the testbed on the same steps (``testbed audit``).

1. **Trunks.** B start states × G members, as GRPO collects them: same-seed resets, whole episodes, π_θ
   sampling. Every live member's state is recorded (``envs.snapshot``) before every step.
2. **Samples.** N steps (t_n, i_n) drawn uniformly among the trunks' steps (or among those at the time
   steps ``steps`` lists), with the action a_n the trunk took there.
3. **Truth.** From each sample's restored state, K rollouts that follow π (V-branches) and K that take
   a_n first and then follow π (Q-branches), each to the episode's end:

       D_{n,k} = Σ_u γ^u r_u^{(Q,k)} − Σ_u γ^u r_u^{(V,k)}
       A_n = (1/K) Σ_k D_{n,k},      SE_n = std_k(D_{n,k}) / √K        (std with Bessel's correction)

   With ``max_branches``, K more rollouts of each kind (noise of their own) join while the noise share
   η = mean SE² / Var[A] (``audit_scores.noise_share``) exceeds ``noise_target``, up to that many: K is
   then chosen so that the truth is sharp against the spread it measures.

   Common random numbers: branch k of each kind restores the same env state, its random generator
   included, and draws π's actions from the same noise (ξ or u, per step, from the sample's own
   generator), so D_{n,k} measures the action rather than the luck. Because the env's generator is
   restored, noise the env draws later is shared by all 2K branches: A_n is the advantage given that
   noise, which is unbiased for Q − V when the noise does not depend on the actions (the tasks'
   distractors; MuJoCo draws only at reset).
4. **Estimators** on the trunks: GAE(γ, λ) with the run's critic for each λ (PPO), GRPO's outcome, RLOO,
   process, step_baseline, step_alive and step_horizon (``agents.advantages``), and a vine estimate
   Â = r_t + γ V̂(s_{t+1}) − V̂(s_t), with V̂ the mean of ``vine_branches`` further π-rollouts (noise of
   its own). All in the units of the reward the run trained on (the env's reward, less ``reward_offset``,
   delayed as in training); a critic trained on scaled rewards has its values multiplied back by the
   scale σ_R of the run's reward normalizer.

States are set directly where the env allows it (MuJoCo, classic control, the testbed's tasks), else
replayed from the episode's seed and action prefix (deterministic envs such as Box2D's), which costs the
prefix's steps again for every rollout.

Branches run in rounds of ``round_jobs`` rollout jobs of K sub-envs each; the rounds, and each sample's
noise, depend only on the settings, so the numbers do not depend on how many processes share the work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from gymnasium.vector import VectorEnv
from torch import Tensor

from agents import advantages as adv
from agents import distributions as D
from agents.audit_scores import NOISE_TARGET, noise_share
from agents.networks import Actor, ActorCritic, Sample, actor_of
from agents.rollout import Episodes, SegmentBuffers, drive, episode_steps
from agents.run_envs import observation_statistics
from agents.seeding import start_seeds
from agents.vine import PointRecorder
from envs import EnvOptions, episode_limit, freeze_normalizers, load_normalizer_state, make_vector
from envs import start_states as starts
from envs.errors import BadInput
from envs.members import sub_env_actions

LAMBDAS = (0.0, 0.5, 0.9, 0.95, 0.99, 1.0)
"""GAE's λ values the audit scores by default, from the one-step TD error to the Monte-Carlo return."""


@dataclass(frozen=True)
class AuditSettings:
    """How much the audit measures: a checkpoint's numbers depend on these and on nothing else."""

    samples: int = 64  # N
    branches: int = 32  # K rollouts each for Q and for V
    max_branches: int = 0  # 0: K only; else K more at a time, up to this many, while η > noise_target
    noise_target: float = NOISE_TARGET
    groups: int = 4  # B start states of the trunks
    group_size: int = 8  # G members each
    vine_branches: int = 8  # rollouts per vine value
    seed: int = 0
    steps: tuple[int, ...] = ()  # sample only at these time steps; () for every step
    lambdas: tuple[float, ...] = LAMBDAS
    round_jobs: int = 8  # rollout jobs per round of branches


@dataclass
class Job:
    """K rollouts from one recorded state: the first action forced (a Q-branch) or drawn from π."""

    point: starts.BranchPoint
    forced: Tensor | None  # the action taken first, or None
    noise_key: tuple[int, ...]  # the noise generator's seed: equal keys, common random numbers


def noise_generator(key: tuple[int, ...]) -> torch.Generator:
    """A torch generator seeded by the whole key (numpy's SeedSequence mixes it into one 63-bit seed)."""
    return torch.Generator().manual_seed(int(np.random.SeedSequence(list(key)).generate_state(2, np.uint64)[0] >> 1))


MakeEnv = Callable[[int], VectorEnv]
"""M → a sync vector env of M restorable sub-envs as the run trained in, its observation statistics frozen."""


@dataclass
class AuditEnv:
    """How the audit makes a run's env, and what it needs to know about it."""

    make: MakeEnv
    H: int  # the longest an episode can run
    reward_scale: float  # σ_R = √(Var[return] + 10⁻⁸) of the run's reward normalizer; 1 without one
    mode: starts.RestoreMode  # direct: states set; replay: the seed and the action prefix taken again


def env_maker(cfg: Any, normalizers: dict[str, Any]) -> AuditEnv:
    """The audit's env for a run's config and its checkpoint's normalizer statistics."""
    time_limit = {"max_episode_steps": cfg.max_episode_steps} if getattr(cfg, "max_episode_steps", None) else {}
    H = episode_limit(cfg.env_id, **cfg.env_kwargs, **time_limit)
    if H is None:
        raise BadInput(f"{cfg.env_id} has no time limit; the audit's rollouts need episodes that end")
    try:
        mode = starts.restore_mode(cfg.env_id, **cfg.env_kwargs)
    except starts.NotRestorable as error:
        raise BadInput(f"the audit restores states along trajectories: {error}") from None
    options = EnvOptions(
        normalize_obs=cfg.normalize_obs,
        vectorization="sync",
        reward_delay=cfg.reward_delay,
        reward_offset=cfg.reward_offset,
    )
    observation = observation_statistics(normalizers)

    def make_env(M: int) -> VectorEnv:
        env = make_vector(cfg.env_id, M, options, **cfg.env_kwargs, **time_limit)
        load_normalizer_state(env, observation)
        freeze_normalizers(env)
        return env

    scale = (
        float(np.sqrt(np.asarray(normalizers["return_rms"]["var"]).item() + 1e-8))
        if "return_rms" in normalizers
        else 1.0
    )
    return AuditEnv(make_env, H, scale, mode)


def branch_returns(
    env: VectorEnv,
    actor: Actor,
    jobs: list[Job],
    K: int,
    gamma: float,
    buffers: SegmentBuffers,
    mode: starts.RestoreMode,
) -> tuple[Tensor, int]:
    """Σ_u γ^u r_u of every job's K rollouts, (len(jobs), K), and the env steps taken (replays included).

    The env holds len(jobs)·K sub-envs, job j in sub-envs j·K … j·K + K − 1. Rollout k of a job draws π's
    step-u noise from row k of the u-th draw of its key's generator (ξ for a Gaussian, u for a categorical
    policy), so two jobs with one key share their noise."""
    M = len(jobs) * K
    if env.num_envs != M:
        raise ValueError(f"branch_returns: the env has {env.num_envs} sub-envs, {len(jobs)} jobs of {K} need {M}")
    first_obs, replay_steps = starts.branch_groups(env, [job.point for job in jobs], K, mode)
    generators = [noise_generator(job.noise_key) for job in jobs]
    continuous = actor.log_std is not None
    clock = {"t": 0, "alive": np.ones(M, dtype=bool)}

    def before_step(t: int, alive: np.ndarray) -> None:
        clock["t"], clock["alive"] = t, alive.copy()

    def act(obs: Tensor) -> Sample:
        shape = (K, actor.spec.action_dim) if continuous else (K,)
        noise = torch.cat(
            [torch.randn(shape, generator=g) if continuous else torch.rand(shape, generator=g) for g in generators]
        )[torch.from_numpy(clock["alive"])]
        out = actor(obs)
        actions = (
            D.gaussian_from_normal(out, actor.log_std, noise) if continuous else D.categorical_from_uniform(out, noise)
        )
        if clock["t"] == 0:
            for j, job in enumerate(jobs):
                if job.forced is not None:
                    actions[j * K : (j + 1) * K] = job.forced
        return Sample(actions, torch.zeros(len(actions)))

    episodes = drive(episode_steps(env, np.asarray(first_obs, dtype=np.float32), buffers, before_step), act)
    returns = adv.discounted_returns(episodes.rewards, episodes.mask, gamma).view(len(jobs), K)
    return returns, episodes.env_steps + replay_steps


def run_jobs(
    audit_env: AuditEnv,
    actor: Actor,
    jobs: list[Job],
    K: int,
    gamma: float,
    settings: AuditSettings,
    buffers_for: Callable[[int], SegmentBuffers],
) -> tuple[Tensor, int]:
    """:func:`branch_returns` of every job, ``round_jobs`` at a time (the last round may be shorter):
    (len(jobs), K) returns and the env steps taken."""
    parts, steps = [], 0
    for first in range(0, len(jobs), settings.round_jobs):
        chunk = jobs[first : first + settings.round_jobs]
        env = audit_env.make(len(chunk) * K)
        try:
            returns, taken = branch_returns(env, actor, chunk, K, gamma, buffers_for(len(chunk) * K), audit_env.mode)
        finally:
            env.close()
        parts.append(returns)
        steps += taken
    return torch.cat(parts), steps


def segment_buffers(audit_env: AuditEnv, actor: Actor, M: int) -> SegmentBuffers:
    """(H, M) buffers for M sub-envs of the audit's env acting with ``actor``."""
    shape = (actor.spec.action_dim,) if actor.log_std is not None else ()
    return SegmentBuffers(audit_env.H, M, actor.spec.obs_dim, shape, actor.log_std is None)


@dataclass
class Trunks:
    episodes: Episodes  # B·G whole episodes, member (b, g) at b·G + g
    recorded: dict[tuple[int, int], starts.BranchPoint]  # (t, i) → the state before step t of member i
    seeds: list[int]  # each group's reset seed
    passed_actions: np.ndarray  # (T, M, ...) the actions as the sub-envs received them (after clipping)

    def point(self, t: int, i: int) -> starts.BranchPoint:
        """The branch point before step t of member i; for a replay, with its seed and action prefix."""
        point = self.recorded[(t, i)]
        if point.state is not None:
            return point
        G = self.episodes.mask.shape[1] // len(self.seeds)
        return starts.BranchPoint(
            seed=self.seeds[i // G],
            actions=list(self.passed_actions[:t, i]),
            raw_obs=point.raw_obs,
            state=None,
            prefix_return=None,
        )


TRUNK_DRAWS = 2**32
"""Noise keys (seed, TRUNK_DRAWS + draw) seed the trunks of a later draw, apart from every sample's key (seed, n)."""


def collect_trunks(
    env: VectorEnv,
    actor: Actor,
    settings: AuditSettings,
    buffers: SegmentBuffers,
    mode: starts.RestoreMode,
    draw: int = 0,
) -> Trunks:
    """B groups of G episodes from same-seed resets, every state recorded: the ``draw``-th set of start states
    and action noise of the audit's seed (0 for the audit's own trunks; the gradient audit draws more batches)."""
    B, G = settings.groups, settings.group_size
    seeds = start_seeds(settings.seed, draw, B)
    first_obs = starts.reset_groups(env, seeds, G)
    recorder = PointRecorder(env, 1, mode=mode)
    # actor.act draws from torch's global generator; draw 0 keeps the numbers of audits made before draws existed.
    torch.manual_seed(
        settings.seed if draw == 0 else noise_generator((settings.seed, TRUNK_DRAWS + draw)).initial_seed()
    )
    episodes = drive(episode_steps(env, np.asarray(first_obs, dtype=np.float32), buffers, recorder.record), actor.act)
    passed = np.stack([np.asarray(sub_env_actions(env, a)) for a in episodes.actions.numpy()])  # (T, M, ...)
    return Trunks(episodes, {(t, i): point for t, i, point in recorder.points}, seeds, passed)


def pick_samples(trunks: Trunks, settings: AuditSettings) -> list[tuple[int, int]]:
    """N steps (t, i) drawn without replacement among the trunks' steps (at ``steps`` only, if given), sorted."""
    steps = sorted(trunks.recorded)
    if settings.steps:
        steps = [(t, i) for t, i in steps if t in settings.steps]
    if not steps:
        raise ValueError(f"no trunk step at the time steps {list(settings.steps)}: the episodes were shorter")
    rng = np.random.default_rng(settings.seed)
    chosen = rng.choice(len(steps), size=min(settings.samples, len(steps)), replace=False)
    return sorted(steps[c] for c in chosen)


def state_values(
    audit_env: AuditEnv,
    actor: Actor,
    trunks: Trunks,
    points: list[tuple[int, int]],
    keys: list[tuple[int, ...]],
    gamma: float,
    settings: AuditSettings,
) -> tuple[Tensor, int]:
    """The vine's V̂(s) = (1/K_v) Σ_k Σ_u γ^u r_u^{(k)} before step t of member i, for each point (t, i): K_v =
    ``vine_branches`` π-rollouts from the restored state, their noise from the point's key; 0 where t is at or
    past the member's episode end (no reward is left). Returns the values, (len(points),) float64, and the env
    steps taken: about len(points) · K_v · the steps left."""
    recorded = [k for k, point in enumerate(points) if point in trunks.recorded]
    values = torch.zeros(len(points), dtype=torch.float64)  # (len(points),)
    if not recorded:
        return values, 0
    jobs = [Job(trunks.point(*points[k]), None, keys[k]) for k in recorded]
    buffers_for = partial(segment_buffers, audit_env, actor)
    returns, steps = run_jobs(audit_env, actor, jobs, settings.vine_branches, gamma, settings, buffers_for)
    values[recorded] = returns.mean(1).to(torch.float64)
    return values, steps


def group_estimates(episodes: Episodes, B: int, G: int, gamma: float) -> dict[str, Tensor]:
    """GRPO's estimators on the trunks, each (T, M): the trajectory-level ones broadcast to every step."""
    T, M = episodes.mask.shape
    rewards, mask = episodes.rewards * episodes.mask, episodes.mask
    returns = adv.discounted_returns(rewards, mask, gamma).view(B, G)  # (B, G)
    per_step = {
        "process": adv.group_process(rewards.view(T, B, G), mask.view(T, B, G)),
        "step_baseline": adv.group_step_baseline(rewards.view(T, B, G), mask.view(T, B, G), gamma),
        "step_alive": adv.group_step_alive(rewards.view(T, B, G), mask.view(T, B, G), gamma),
        "step_horizon": adv.group_step_horizon(rewards.view(T, B, G), mask.view(T, B, G), gamma),
    }
    estimates = {name: A.reshape(T, M) for name, A in per_step.items()}
    for name, score in (("outcome", adv.group_outcome), ("rloo", adv.group_rloo)):
        estimates[name] = score(returns).reshape(1, M).expand(T, M) * mask
    return estimates


def gae_estimates(
    episodes: Episodes, critic: ActorCritic, value_scale: float, gamma: float, lambdas: tuple[float, ...]
) -> dict[str, Tensor]:
    """GAE(γ, λ) with the run's critic on the trunks, (T, M) per λ: values σ_R·V_φ; a truncated episode
    bootstraps from its final observation, a terminated one from nothing."""
    T, M = episodes.mask.shape
    mask = episodes.mask
    with torch.inference_mode():
        values = value_scale * critic.value(episodes.obs.reshape(T * M, -1)).view(T, M)  # (T, M)
        final_values = value_scale * critic.value(episodes.final_obs)  # (M,)
    lengths = episodes.lengths  # (M,)
    last = torch.arange(T).unsqueeze(1) == (lengths - 1).unsqueeze(0)  # (T, M) the episode's last step
    next_values = torch.cat([values[1:], values.new_zeros(1, M)])
    next_values = torch.where(last, final_values.unsqueeze(0), next_values)
    terminated = last & episodes.terminated.unsqueeze(0)
    rewards = episodes.rewards * mask
    return {
        f"gae({lam:g})": adv.gae(rewards, values, next_values, terminated, last | ~mask, gamma, lam) * mask
        for lam in lambdas
    }


@dataclass
class Audit:
    """One checkpoint's samples: where each was taken, the truth, and every estimator's value there."""

    t: list[int]
    member: list[int]
    steps_left: list[int]  # L_i − t: steps from the sample to its trunk episode's end
    obs: Tensor  # (N, obs_dim) the observation at each sample, as the policy saw it
    actions: Tensor  # (N,) or (N, action_dim) a_n
    truth: Tensor  # (N,) A_n
    truth_se: Tensor  # (N,) SE_n
    estimates: dict[str, Tensor]  # name → (N,)
    env_steps: int  # every env step of the audit: trunks and branches
    branches: int  # the rollouts of each kind behind every truth: K, or more with max_branches

    def rows(self) -> list[dict[str, float | int]]:
        """One row per sample, for audit.csv."""
        return [
            {
                "t": self.t[n],
                "member": self.member[n],
                "steps_left": self.steps_left[n],
                "truth": float(self.truth[n]),
                "truth_se": float(self.truth_se[n]),
                **{name: float(values[n]) for name, values in self.estimates.items()},
            }
            for n in range(len(self.t))
        ]


def audit(audit_env: AuditEnv, model: Actor | ActorCritic, gamma: float, settings: AuditSettings) -> Audit:
    """The truth and every estimator at N sampled steps of the policy's own trajectories, in the run's env
    (:func:`env_maker`)."""
    actor = actor_of(model)
    B, G, K = settings.groups, settings.group_size, settings.branches
    buffers_for = partial(segment_buffers, audit_env, actor)
    env = audit_env.make(B * G)
    try:
        trunks = collect_trunks(env, actor, settings, buffers_for(B * G), audit_env.mode)
    finally:
        env.close()
    episodes = trunks.episodes
    chosen = pick_samples(trunks, settings)
    t_index, members = torch.tensor([t for t, _ in chosen]), torch.tensor([i for _, i in chosen])
    jobs = []
    for n, (t, i) in enumerate(chosen):
        point, key = trunks.point(t, i), (settings.seed, n)
        jobs += [Job(point, episodes.actions[t, i], key), Job(point, None, key)]

    def branch_round(r: int) -> tuple[Tensor, int]:
        """K more Q- and V-rollouts per sample, the noise of round r ≥ 1 its own: (N, K) D_{n,k}, env steps."""
        batch = jobs if r == 0 else [Job(job.point, job.forced, (*job.noise_key, r)) for job in jobs]
        returns, steps = run_jobs(audit_env, actor, batch, K, gamma, settings, buffers_for)
        return returns.view(len(chosen), 2, K).diff(dim=1).squeeze(1).neg(), steps  # Q-branch k minus V-branch k

    def too_noisy(D_nk: Tensor) -> bool:
        share = noise_share(D_nk.mean(1), D_nk.std(1) / D_nk.shape[1] ** 0.5)
        return share is not None and share > settings.noise_target

    with torch.inference_mode():
        D_nk, truth_steps = branch_round(0)  # (N, K), then (N, K · rounds)
        while D_nk.shape[1] + K <= settings.max_branches and too_noisy(D_nk):
            more, steps = branch_round(D_nk.shape[1] // K)
            D_nk, truth_steps = torch.cat([D_nk, more], dim=1), truth_steps + steps
        # The vine's values: V̂(s_t) and V̂(s_{t+1}) from noise of their own.
        points = [(t + u, i) for t, i in chosen for u in (0, 1)]
        keys = [(settings.seed, n, 1, u) for n in range(len(chosen)) for u in (0, 1)]
        values, vine_steps = state_values(audit_env, actor, trunks, points, keys, gamma, settings)
    rewards = episodes.rewards[t_index, members].to(torch.float64)  # (N,)
    vine = (rewards + gamma * values[1::2] - values[0::2]).to(torch.float32)  # (N,) r_t + γ V̂(s_{t+1}) − V̂(s_t)
    estimates = group_estimates(episodes, B, G, gamma)
    if isinstance(model, ActorCritic):
        estimates = {**gae_estimates(episodes, model, audit_env.reward_scale, gamma, settings.lambdas), **estimates}
    sampled = {name: A[t_index, members] for name, A in estimates.items()}
    sampled["vine"] = vine
    lengths = episodes.lengths
    return Audit(
        t=t_index.tolist(),
        member=members.tolist(),
        steps_left=(lengths[members] - t_index).tolist(),
        obs=episodes.obs[t_index, members],
        actions=episodes.actions[t_index, members],
        truth=D_nk.mean(1),
        truth_se=D_nk.std(1) / D_nk.shape[1] ** 0.5,
        estimates=sampled,
        env_steps=episodes.env_steps + truth_steps + vine_steps,
        branches=D_nk.shape[1],
    )
