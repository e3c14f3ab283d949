"""The true policy gradient of a policy at a training point, and the gradient every advantage estimator gives on
one batch, scored against it (the gradient audit, beside ``agents.true_advantage``'s advantage audit).

1. **Truth.** The advantage audit (``true_advantage.audit``) samples N steps (s_n, a_n) uniformly among the steps
   of B·G on-policy trunk episodes and measures A_n = Q^π(s_n, a_n) − V^π(s_n) by rollouts from the restored state.
   The true gradient of the surrogate at θ = θ_old (``gradient_audit.surrogate``; there PPO's clipped objective
   has the same gradient) is the expectation of the batch estimator with true advantages,

       g = E[ (1/|batch|) Σ_j A^π(s_j, a_j) ∇θ log π_θ(a_j|s_j) ]  ≈  (1/N) Σ_n A_n ∇θ log π_θ(a_n|s_n)

   with its standard error clustered by the trunks' start states (the G members of a group share a reset seed,
   so their samples are not independent; groups are). A_n's own Monte-Carlo noise is inside that spread.
2. **Estimators.** K further batches of trunks (start states and action noise of their own, ``draw`` 1 … K),
   each of the size the algorithm trains on; on each, every estimator the advantage audit knows on trunks
   (GAE(γ, λ) with the run's critic, GRPO's outcome, RLOO, process, step_baseline, step_alive) gives its
   advantages at every step, and ĝ = ∇θ of the surrogate with them. Scores per batch: cos(ĝ, g) and
   ‖ĝ − g‖/‖g‖ (``gradient_audit``), then their means over the K batches with standard errors.

Normalized estimators (outcome, process, step_alive) give gradients of another scale: judge them by the cosine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from agents import gradient_audit as GA
from agents import true_advantage as TA
from agents.networks import Actor, ActorCritic
from agents.rollout import SegmentBuffers


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


def true_gradient(
    audit_env: TA.AuditEnv, model: Actor | ActorCritic, gamma: float, settings: TA.AuditSettings
) -> tuple[TrueGradient, TA.Audit]:
    """g and its standard error at the policy's parameters (module docstring, 1), with the advantage audit it
    rests on. Give ``settings.groups`` ≥ 2 (the clusters of the standard error)."""
    actor = model.actor if isinstance(model, ActorCritic) else model
    result = TA.audit(audit_env, model, gamma, settings)
    scores = per_sample_gradients(actor, result.obs, result.actions)  # (N, P)
    groups = torch.tensor(result.member) // settings.group_size  # (N,) the start state each sample came from
    mean, se = GA.mean_and_standard_error(result.truth.to(torch.float64).unsqueeze(1) * scores, groups)
    return TrueGradient(mean, se, len(result.t), result.env_steps), result


def batch_gradients(
    audit_env: TA.AuditEnv, model: Actor | ActorCritic, gamma: float, settings: TA.AuditSettings, draw: int
) -> dict[str, Tensor]:
    """Every estimator's ĝ on the ``draw``-th batch of B·G trunk episodes (B, G from ``settings``): name → (P,)."""
    actor = model.actor if isinstance(model, ActorCritic) else model
    B, G = settings.groups, settings.group_size
    continuous = actor.log_std is not None
    shape = (actor.spec.action_dim,) if continuous else ()
    env = audit_env.make(B * G)
    try:
        buffers = SegmentBuffers(audit_env.H, B * G, actor.spec.obs_dim, shape, not continuous)
        with torch.inference_mode():
            trunks = TA.collect_trunks(env, actor, settings, buffers, audit_env.mode, draw)
    finally:
        env.close()
    episodes = trunks.episodes
    estimates = TA.group_estimates(episodes, B, G, gamma)
    if isinstance(model, ActorCritic):
        estimates = {**TA.gae_estimates(episodes, model, audit_env.reward_scale, gamma, settings.lambdas), **estimates}
    parameters = list(actor.parameters())
    obs, actions, mask = episodes.obs.clone(), episodes.actions.clone(), episodes.mask.clone()  # out of inference mode
    with torch.enable_grad():
        log_pi = log_probs(actor, obs, actions)  # (T, M)
        return {
            name: GA.flat_gradient(GA.surrogate(log_pi, A.clone(), mask), parameters, retain_graph=True).to(
                torch.float64
            )
            for name, A in estimates.items()
        }


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
