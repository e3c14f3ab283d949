"""The true policy gradient of a policy at a training point, the gradient every advantage estimator gives on
one batch of the run's own size, scored against it, and where the per-sample gradient's variance comes from
(the gradient audit, ``testbed audit --gradients``, beside ``agents.true_advantage``'s advantage audit).

1. **Truth.** The advantage audit (``true_advantage.audit``) samples N steps (s_n, a_n) uniformly among the steps
   of B·G on-policy trunk episodes and measures A_n = Q^π(s_n, a_n) − V^π(s_n) by rollouts from the restored state.
   The true gradient of the surrogate at θ = θ_old (``gradient_audit.surrogate``; there PPO's clipped objective
   has the same gradient) is the expectation of the batch estimator with true advantages,

       g = E[ (1/|batch|) Σ_j A^π(s_j, a_j) ∇θ log π_θ(a_j|s_j) ]  ≈  (1/N) Σ_n A_n ∇θ log π_θ(a_n|s_n)

   with its standard error clustered by the trunks' start states (the G members of a group share a reset seed,
   so their samples are not independent; groups are). A_n's own Monte-Carlo noise is inside that spread.
2. **Estimators.** K further batches of trunks (start states and action noise of their own, ``draw`` 1 … K), each of
   the size one update of the run trains on (:func:`run_batch`): PPO's n_envs · n_steps env steps, the first that
   many steps of whole episodes taken one after another (the trunks' rounds sized from the episode lengths seen so
   far), or GRPO's num_groups × group_size episodes. On each, every estimator the advantage audit knows on trunks
   (GAE(γ, λ) with the run's critic, GRPO's outcome, RLOO, process, step_baseline, step_alive, step_horizon), the
   plain return-to-go ``return`` (REINFORCE, no baseline) and, with ``GradientSettings.vine``, the vine estimate
   r_t + γ V̂(s_{t+1}) − V̂(s_t) at every step of the batch, gives its advantages, and ĝ = ∇θ of the surrogate with
   them. Estimators that read whole episodes (GAE, the group ones) see the whole episode even where PPO's batch cuts
   it. Where the audit samples only some time steps (``AuditSettings.steps``), the batch's surrogate averages over
   those steps too, so that ĝ and g estimate the same thing. Scores per batch: cos(ĝ, g) and ‖ĝ − g‖/‖g‖
   (``gradient_audit``), then their means over the K batches with standard errors.
3. **Variance split** (Tucker et al. 2018): S states sampled among the audit's own trunk steps, M actions drawn
   from π(·|s) at each, R rollouts from the restored state after each (s, a), and g = Â ∇θ log π(a|s) with Â the
   Monte-Carlo return-to-go G(s, a, τ) less a baseline; ``gradient_audit.variance_split`` splits Var[g] into
   state, action and trajectory parts (:func:`nested_gradients` says which baselines, and why). A baseline
   b(s) leaves E_a[b(s) ∇θ log π(a|s)] = 0, so it moves the action part only: the state part, and (for a
   baseline blind to τ) the trajectory part, are what no state-dependent baseline can reduce (Tucker et al.'s
   point, against action-dependent baselines).

Costs in env steps: the truth is the advantage audit's; a batch its trunks' steps (a PPO batch overshoots n_envs
· n_steps by the rest of the episodes of its last round), and with the vine about (batch steps + episodes) · K_v
· the mean steps left (one V̂ per state, K_v = ``vine_branches`` rollouts each); the split S · M · R rollouts to
the episode's end. Normalized estimators (outcome, process, step_alive) give gradients of another scale:
judge them by the cosine.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
from torch import Tensor

from agents import advantages as adv
from agents import distributions as D
from agents import gradient_audit as GA
from agents import true_advantage as TA
from agents.networks import Actor, ActorCritic, actor_of
from agents.rollout import Episodes

DRAW_STRIDE = 2**20
"""A PPO batch that needs more than one round of trunks: batch k's round r is draw k + r · DRAW_STRIDE."""
SPLIT_KEY = 2**33
"""Noise keys (seed, SPLIT_KEY, …) draw the split's actions and rollouts, apart from every other key."""
SCORE_COLUMNS = ("cosine", "cosine_se", "relative_error", "relative_error_se")
"""gradient_scores.csv's scores of an estimator's K batch gradients (:func:`score_estimators`)."""
SPLIT_PARTS = ("state", "action", "trajectory", "total")
"""The parts of ``gradient_audit.variance_split``, gradient_scores.csv's var_* columns."""


@dataclass(frozen=True)
class GradientSettings:
    """What the gradient audit measures beyond the advantage audit it rests on: its numbers depend on these, the
    advantage audit's settings and the run's batch size, and nothing else."""

    batches: int = 4  # K independent batches per estimator (at least 2, for the scores' standard errors)
    vine: bool = False  # the vine estimator in every batch: V̂ at every state of the batch, by rollouts
    split_states: int = 8  # S states of the variance split
    split_actions: int = 4  # M actions at each
    split_rollouts: int = 4  # R rollouts after each (s, a)


@dataclass(frozen=True)
class Batch:
    """The batch one update of the run trains on: whole trunk episodes, B start states × G members per round."""

    steps: int | None  # PPO: the first n_envs · n_steps steps of the episodes; None: every step of one round
    groups: int | None  # B: GRPO's num_groups; None: as many as the steps need (PPO)
    group_size: int  # G


def run_batch(cfg: Any, base: str, settings: TA.AuditSettings) -> Batch:
    """The batch of a run's resolved config: PPO's n_envs · n_steps env steps, with the audit's G for the group
    estimators; GRPO's num_groups × group_size episodes."""
    if base == "ppo":
        return Batch(cfg.n_envs * cfg.n_steps, None, settings.group_size)
    if base == "grpo":
        return Batch(None, cfg.num_groups, cfg.group_size)
    raise ValueError(f"run_batch: the gradient audit knows ppo's and grpo's batches, not {base}'s")


@dataclass
class TrueGradient:
    gradient: Tensor  # (P,) g
    standard_error: Tensor  # (P,) SE of each coordinate
    samples: int  # N
    env_steps: int  # the advantage audit's cost: trunks and branches


def log_probs(actor: Actor, obs: Tensor, actions: Tensor) -> Tensor:
    """log π_θ(a|s) with its graph to θ, for observations (..., obs_dim) and actions (...) or (..., act_dim)."""
    lead = obs.shape[:-1]
    flat_actions = actions.reshape(lead.numel(), *actions.shape[len(lead) :])
    return actor.log_prob_entropy(actor(obs.reshape(lead.numel(), -1)), flat_actions)[0].view(lead)


def per_sample_gradients(actor: Actor, obs: Tensor, actions: Tensor) -> Tensor:
    """∇θ log π_θ(a_n|s_n) of every sample, flat over the actor's parameters: (N, P)."""
    parameters = list(actor.parameters())
    with torch.enable_grad():
        return torch.stack(
            [
                GA.flat_gradient(log_probs(actor, obs[n : n + 1], actions[n : n + 1]).sum(), parameters)
                for n in range(len(obs))
            ]
        )


def gradient_of_audit(actor: Actor, result: TA.Audit, group_size: int) -> TrueGradient:
    """g and its standard error from an advantage audit's samples (module docstring, 1); the audit's
    ``groups`` must be 2 or more (the clusters of the standard error)."""
    scores = per_sample_gradients(actor, result.obs.clone(), result.actions.clone())  # (N, P)
    groups = torch.tensor(result.member) // group_size  # (N,) the start state each sample came from
    mean, se = GA.mean_and_standard_error(result.truth.to(torch.float64).unsqueeze(1) * scores, groups)
    return TrueGradient(mean, se, len(result.t), result.env_steps)


def true_gradient(
    audit_env: TA.AuditEnv, model: Actor | ActorCritic, gamma: float, settings: TA.AuditSettings
) -> tuple[TrueGradient, TA.Audit]:
    """g and its standard error at the policy's parameters (module docstring, 1), with the advantage audit it
    rests on. Give ``settings.groups`` ≥ 2 (the clusters of the standard error)."""
    result = TA.audit(audit_env, model, gamma, settings)
    return gradient_of_audit(actor_of(model), result, settings.group_size), result


def returns_to_go(episodes: Episodes, gamma: float) -> Tensor:
    """G_t = Σ_{u ≥ t} γ^{u−t} r_u over each episode's steps, (T, M): GAE with λ = 1 and V = 0."""
    rewards = episodes.rewards * episodes.mask  # (T, M)
    zeros, never = torch.zeros_like(rewards), torch.zeros_like(episodes.mask)
    return adv.gae(rewards, zeros, zeros, never, never, gamma, 1.0) * episodes.mask


@dataclass
class BatchGradients:
    gradients: dict[str, Tensor]  # estimator → ĝ (P,) float64
    steps: int  # the samples its surrogate averages over
    episodes: int  # trunk episodes collected
    env_steps: int  # trunk steps, and the vine's rollouts


def batch_gradients(
    audit_env: TA.AuditEnv,
    model: Actor | ActorCritic,
    gamma: float,
    settings: TA.AuditSettings,
    draw: int,
    batch: Batch | None = None,
    vine: bool = False,
) -> BatchGradients:
    """Every estimator's ĝ on the ``draw``-th batch (module docstring, 2): ``batch`` (default B·G whole
    episodes of the audit's settings) in rounds of trunks, each estimator's advantages at the batch's steps."""
    actor = actor_of(model)
    batch = batch or Batch(None, settings.groups, settings.group_size)
    if (batch.steps is None) == (batch.groups is None):
        raise ValueError(f"batch_gradients: give a batch either steps or groups, got {batch}")
    G = batch.group_size
    obs_parts: list[Tensor] = []  # each round's (n_r, obs_dim)
    action_parts: list[Tensor] = []  # (n_r,) or (n_r, act_dim)
    estimates: dict[str, list[Tensor]] = {}  # name → each round's (n_r,)
    taken = episodes_seen = trunk_steps = branch_steps = r = 0
    while r == 0 or (batch.steps is not None and taken < batch.steps):
        if batch.groups is not None:
            groups = batch.groups
        else:  # enough groups for the steps still wanted, at the mean episode length seen so far (H at first)
            mean_length = trunk_steps / episodes_seen if episodes_seen else audit_env.H
            groups = max(1, math.ceil((batch.steps - taken) / (G * mean_length)))
        round_draw = draw + r * DRAW_STRIDE
        trunks, round_settings = collect_round(audit_env, actor, settings, groups, G, round_draw)
        episodes = trunks.episodes
        keep = episodes.mask if batch.steps is None else first_steps(episodes.mask, batch.steps - taken)  # (T, M)
        taken += int(keep.sum())
        episodes_seen, trunk_steps = episodes_seen + keep.shape[1], trunk_steps + episodes.env_steps
        if settings.steps:
            keep = keep & torch.isin(torch.arange(keep.shape[0]), torch.tensor(settings.steps)).unsqueeze(1)
        found = round_estimates(model, episodes, groups, G, gamma, audit_env.reward_scale, settings.lambdas)
        if vine:
            found["vine"], steps = vine_estimates(audit_env, actor, trunks, keep, gamma, round_settings, round_draw)
            branch_steps += steps
        obs_parts.append(episodes.obs[keep].clone())  # clones: out of inference mode, for autograd
        action_parts.append(episodes.actions[keep].clone())
        for name, A in found.items():
            estimates.setdefault(name, []).append(A[keep].clone())
        r += 1
    obs, actions = torch.cat(obs_parts), torch.cat(action_parts)  # (n, obs_dim), (n,) or (n, act_dim)
    if len(obs) == 0:
        raise ValueError(f"batch_gradients: no batch step at the time steps {list(settings.steps)}")
    parameters = list(actor.parameters())
    with torch.enable_grad():
        log_pi = log_probs(actor, obs, actions)  # (n,)
        gradients = {
            name: GA.flat_gradient(GA.surrogate(log_pi, torch.cat(parts)), parameters, retain_graph=True)
            for name, parts in estimates.items()
        }
    return BatchGradients(
        {name: g.to(torch.float64) for name, g in gradients.items()},
        len(obs),
        episodes_seen,
        trunk_steps + branch_steps,
    )


def collect_round(
    audit_env: TA.AuditEnv, actor: Actor, settings: TA.AuditSettings, groups: int, G: int, draw: int
) -> tuple[TA.Trunks, TA.AuditSettings]:
    """The ``draw``-th trunks of the audit's seed, ``groups`` start states × G members, every state recorded, and
    the settings they were collected with."""
    settings = replace(settings, groups=groups, group_size=G)
    env = audit_env.make(groups * G)
    try:
        buffers = TA.segment_buffers(audit_env, actor, groups * G)
        return TA.collect_trunks(env, actor, settings, buffers, audit_env.mode, draw), settings
    finally:
        env.close()


def first_steps(mask: Tensor, n: int) -> Tensor:
    """The first n steps of the episodes of ``mask`` (T, M), taken member after member: (T, M) bool."""
    lengths = mask.sum(0)  # (M,)
    quota = (n - (lengths.cumsum(0) - lengths)).clamp(min=0)  # (M,) the steps left for member i
    return mask & (torch.arange(mask.shape[0]).unsqueeze(1) < quota.unsqueeze(0))


def round_estimates(
    model: Actor | ActorCritic,
    episodes: Episodes,
    B: int,
    G: int,
    gamma: float,
    value_scale: float,
    lambdas: tuple[float, ...],
) -> dict[str, Tensor]:
    """Every trunk estimator's advantages on one round of B × G episodes, (T, M) each."""
    estimates = {**TA.group_estimates(episodes, B, G, gamma), "return": returns_to_go(episodes, gamma)}
    if isinstance(model, ActorCritic):
        estimates = {**TA.gae_estimates(episodes, model, value_scale, gamma, lambdas), **estimates}
    return estimates


def vine_estimates(
    audit_env: TA.AuditEnv,
    actor: Actor,
    trunks: TA.Trunks,
    keep: Tensor,
    gamma: float,
    settings: TA.AuditSettings,
    draw: int,
) -> tuple[Tensor, int]:
    """The vine's r_t + γ V̂(s_{t+1}) − V̂(s_t) at the steps ``keep`` (T, M) marks, (T, M), 0 elsewhere; V̂ once
    per state (``true_advantage.state_values``, the noise keyed by the draw and the state), and the env steps."""
    T, M = keep.shape
    points = sorted({(t + u, i) for t, i in keep.nonzero().tolist() for u in (0, 1)})
    if not points:
        return torch.zeros(T, M), 0
    keys = [(settings.seed, TA.TRUNK_DRAWS + draw, t, i) for t, i in points]
    values, steps = TA.state_values(audit_env, actor, trunks, points, keys, gamma, settings)
    V = torch.zeros(T + 1, M, dtype=torch.float64)  # (T + 1, M) V̂(s_t), 0 past the end
    V[tuple(torch.tensor(points).T)] = values
    rewards = trunks.episodes.rewards.to(torch.float64)  # (T, M)
    return torch.where(keep, rewards + gamma * V[1:] - V[:-1], 0.0).to(torch.float32), steps


@dataclass
class NestedGradients:
    gradients: dict[str, Tensor]  # baseline name → (S, M, R, P) g = Â ∇θ log π(a|s)
    states: int  # S: fewer than asked where the trunks had fewer steps to sample
    env_steps: int  # the trunks and the S · M · R rollouts


def nested_gradients(
    audit_env: TA.AuditEnv,
    model: Actor | ActorCritic,
    gamma: float,
    settings: TA.AuditSettings,
    split: GradientSettings,
) -> NestedGradients:
    """The per-sample gradients of a nested design for ``gradient_audit.variance_split`` (module docstring, 3):
    S states drawn among the audit's own trunk steps (at ``settings.steps`` only, if given), M actions from
    π(·|s) at each, R rollouts to the episode's end from the restored state after each (s, a), each its own
    noise (no common random numbers: the split needs the trajectories independent). G(s, a, τ) is the
    rollout's discounted return from s, in the units of the reward the run trained on; Â is G less:

    - ``return``: nothing (REINFORCE; the batch estimator of the same name);
    - ``return_state_mean``: the mean of the other M·R − 1 returns at s (``advantages.group_rloo`` over the
      M·R samples of a state), a state baseline as good as the samples allow (close to V^π(s)), which leaves out
      the sample's own return so that it stays independent of the action taken: what a near-perfect critic
      would give;
    - ``return_critic``: σ_R · V_φ(s), the run's critic where it has one (PPO): the baseline it trains with.

    Restoring a state restores the env's random generator too (``true_advantage``'s common random numbers), so
    the R rollouts after (s, a) meet the same later env noise: the trajectory part holds what π's later actions
    change, and noise the env draws after s (the tasks' distractor rewards) counts in the state part. MuJoCo
    draws only at reset, so there the parts are Tucker et al.'s; on the chain, whose rewards after a_0 depend on
    no action, the trajectory part is 0.
    """
    actor = actor_of(model)
    S, M, R = split.split_states, split.split_actions, split.split_rollouts
    trunks, _ = collect_round(audit_env, actor, settings, settings.groups, settings.group_size, 0)
    chosen = TA.pick_samples(trunks, replace(settings, samples=S))
    S = len(chosen)
    if S < 2:
        raise ValueError(f"nested_gradients: the trunks hold {S} step at the time steps {list(settings.steps)}")
    t_index, members = torch.tensor([t for t, _ in chosen]), torch.tensor([i for _, i in chosen])
    obs = trunks.episodes.obs[t_index, members].repeat_interleave(M, 0)  # (S·M, obs_dim)
    generator = TA.noise_generator((settings.seed, SPLIT_KEY))
    with torch.inference_mode():
        out = actor(obs)  # (S·M, action_dim) logits or means
        if actor.log_std is None:
            actions = D.categorical_from_uniform(out, torch.rand(S * M, generator=generator))  # (S·M,)
        else:
            actions = D.gaussian_from_normal(out, actor.log_std, torch.randn(out.shape, generator=generator))
        jobs = [
            TA.Job(trunks.point(t, i), actions[s * M + m], (settings.seed, SPLIT_KEY, s, m))
            for s, (t, i) in enumerate(chosen)
            for m in range(M)
        ]
        buffers_for = partial(TA.segment_buffers, audit_env, actor)
        returns, steps = TA.run_jobs(audit_env, actor, jobs, R, gamma, settings, buffers_for)
    returns = returns.to(torch.float64).view(S, M, R)  # (S, M, R) G(s, a, τ)
    advantages = {"return": returns, "return_state_mean": adv.group_rloo(returns.view(S, M * R)).view(S, M, R)}
    if isinstance(model, ActorCritic):
        with torch.inference_mode():
            values = audit_env.reward_scale * model.value(obs[::M]).to(torch.float64)  # (S,)
        advantages["return_critic"] = returns - values.view(S, 1, 1)
    scores = per_sample_gradients(actor, obs.clone(), actions.clone()).view(S, M, 1, -1)  # (S, M, 1, P)
    return NestedGradients(
        {name: A.unsqueeze(-1) * scores for name, A in advantages.items()}, S, trunks.episodes.env_steps + steps
    )


@dataclass
class GradientAudit:
    """One checkpoint's gradient audit: the truth, the K batches' gradients, the variance split and the costs."""

    truth: TrueGradient
    batches: list[BatchGradients]
    split: dict[str, dict[str, float]]  # baseline name → state, action, trajectory, total
    split_states: int  # S
    split_env_steps: int
    seconds: dict[str, float]  # truth (the gradient from the audit's samples), batches, split

    def rows(self) -> list[dict[str, Any]]:
        """One row per estimator, for gradient_scores.csv: the batch scores (empty for an estimator the batches do
        not have) and the variance split (empty where it does not apply)."""
        scores = {
            row["estimator"]: row for row in score_estimators(self.truth.gradient, [b.gradients for b in self.batches])
        }
        steps = sum(b.steps for b in self.batches) / len(self.batches)
        rows = []
        for name in [*scores, *(name for name in self.split if name not in scores)]:
            row = scores.get(name, {"estimator": name, "batches": 0})
            split = self.split.get(name, {})
            rows.append(
                {
                    "estimator": name,
                    "batches": row["batches"],
                    "batch_steps": steps if name in scores else None,
                    **{score: row.get(score) for score in SCORE_COLUMNS},
                    **{f"var_{part}": split.get(part) for part in SPLIT_PARTS},
                }
            )
        return rows

    def truth_rows(self) -> list[dict[str, float | int]]:
        """One row per coordinate of θ, for true_gradient.csv: g and its standard error."""
        return [
            {"coordinate": p, "gradient": float(g), "standard_error": float(se)}
            for p, (g, se) in enumerate(zip(self.truth.gradient, self.truth.standard_error))
        ]


def gradient_audit(
    audit_env: TA.AuditEnv,
    model: Actor | ActorCritic,
    gamma: float,
    settings: TA.AuditSettings,
    gradients: GradientSettings,
    batch: Batch,
    result: TA.Audit,
) -> GradientAudit:
    """The gradient audit of a policy whose advantage audit ``result`` is done (``true_advantage.audit`` with
    ``settings``): g from its samples, K batches of ``batch`` (draws 1 … K), and the variance split."""
    clock = time.perf_counter()
    truth = gradient_of_audit(actor_of(model), result, settings.group_size)
    seconds = {"truth": time.perf_counter() - clock}
    clock = time.perf_counter()
    batches = [
        batch_gradients(audit_env, model, gamma, settings, k, batch, gradients.vine)
        for k in range(1, gradients.batches + 1)
    ]
    seconds["batches"], clock = time.perf_counter() - clock, time.perf_counter()
    nested = nested_gradients(audit_env, model, gamma, settings, gradients)
    split = {name: GA.variance_split(g) for name, g in nested.gradients.items()}
    seconds["split"] = time.perf_counter() - clock
    return GradientAudit(truth, batches, split, nested.states, nested.env_steps, seconds)


def score_estimators(truth: Tensor, batches: list[dict[str, Tensor]]) -> list[dict[str, float | int | None]]:
    """Per estimator, cos(ĝ, g) and ‖ĝ − g‖/‖g‖ averaged over the K batches, with their standard errors s/√K."""
    rows = []
    for name in batches[0]:
        row: dict[str, float | int | None] = {"estimator": name, "batches": len(batches)}
        for score, fn in (("cosine", GA.cosine_similarity), ("relative_error", GA.relative_error)):
            values = [v for v in (fn(batch[name], truth) for batch in batches) if v is not None]
            row[score] = sum(values) / len(values) if values else None
            row[f"{score}_se"] = float(torch.tensor(values).std()) / len(values) ** 0.5 if len(values) > 1 else None
        rows.append(row)
    return rows
