"""agents/gradient_audit.py against hand-computed numbers; agents/true_gradient.py against the chain's closed form."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import Tensor

from agents import gradient_audit as GA
from agents import true_advantage as TA
from agents import true_gradient as TG
from agents.grpo import GRPOConfig
from agents.losses import clipped_surrogate
from agents.networks import ActorCritic, NetworkSpec
from agents.ppo import PPOConfig
from agents.rollout import Episodes


def test_cosine_and_relative_error_by_hand() -> None:
    assert GA.cosine_similarity(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 1.0])) == pytest.approx(1 / math.sqrt(2))
    assert GA.cosine_similarity(torch.tensor([-2.0, 0.0]), torch.tensor([3.0, 0.0])) == pytest.approx(-1.0)
    assert GA.cosine_similarity(torch.zeros(2), torch.tensor([1.0, 1.0])) is None
    # ‖(1, 0) − (0, 2)‖ / ‖(0, 2)‖ = √5 / 2; the zero estimate is off by exactly 1.
    assert GA.relative_error(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])) == pytest.approx(math.sqrt(5) / 2)
    assert GA.relative_error(torch.zeros(2), torch.tensor([0.0, 2.0])) == pytest.approx(1.0)
    assert GA.relative_error(torch.ones(2), torch.zeros(2)) is None
    with pytest.raises(ValueError, match="one \\(P,\\)"):
        GA.cosine_similarity(torch.ones(2), torch.ones(3))


def test_the_mean_and_its_standard_error_plain_and_clustered() -> None:
    terms = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [6.0, 0.0]])  # (N, P) = (4, 2)
    mean, se = GA.mean_and_standard_error(terms)
    # Independent samples: s² = (4 + 1 + 0 + 9) / 3 = 14/3, SE = √(s²/4) = √(7/6).
    assert mean.tolist() == [3.0, 0.0]
    assert se.tolist() == pytest.approx([math.sqrt(7 / 6), 0.0])
    # Clusters {1, 2}, {3, 6}: S = (3, 9), N_c = 2, residuals S − N_c·3 = (−3, 3); SE² = 2/1 · 18 / 16 = 9/4.
    mean, se = GA.mean_and_standard_error(terms, torch.tensor([0, 0, 5, 5]))
    assert mean.tolist() == [3.0, 0.0]
    assert se.tolist() == pytest.approx([1.5, 0.0])
    # One sample per cluster is the plain standard error.
    _, same = GA.mean_and_standard_error(terms, torch.tensor([3, 1, 2, 0]))
    assert same.tolist() == pytest.approx([math.sqrt(7 / 6), 0.0])
    with pytest.raises(ValueError, match="at least 2 clusters"):
        GA.mean_and_standard_error(terms, torch.zeros(4, dtype=torch.long))


def bernoulli_log_probs(theta: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """log π_θ(a) for π_θ(1) = σ(θ): log σ(θ) for a = 1, log(1 − σ(θ)) for a = 0."""
    return torch.where(actions == 1, torch.nn.functional.logsigmoid(theta), torch.nn.functional.logsigmoid(-theta))


def test_the_policy_gradient_of_a_batch_by_hand_equals_the_clipped_objectives_at_theta_old() -> None:
    # π_θ(1) = σ(θ) at θ = 0: ∇ log π(1) = 1 − σ = ½, ∇ log π(0) = −σ = −½.
    # Batch a = (1, 0, 1), Â = (2, −1, 4), the third masked out: g = (2·½ + (−1)(−½)) / 2 = 0.75.
    theta = torch.zeros((), requires_grad=True)
    actions, advantages = torch.tensor([1, 0, 1]), torch.tensor([2.0, -1.0, 4.0])
    mask = torch.tensor([True, True, False])
    log_pi = bernoulli_log_probs(theta, actions)
    g = GA.flat_gradient(GA.surrogate(log_pi, advantages, mask), [theta], retain_graph=True)
    assert g.tolist() == pytest.approx([0.75])
    # At θ = θ_old the ratio is 1, inside the clip range: PPO's clipped objective has the same gradient.
    ratio = torch.exp(log_pi - log_pi.detach())
    clipped = -torch.where(mask, clipped_surrogate(ratio, advantages, 0.2, 0.2), 0.0).sum() / mask.sum()
    assert GA.flat_gradient(clipped, [theta]).tolist() == pytest.approx([0.75])
    # Away from θ_old the two part: at θ = 2 with θ_old = 0, ρ(a=1) = σ(2)/σ(0) ≈ 1.76 is clipped for Â > 0.
    theta2 = torch.tensor(2.0, requires_grad=True)
    ratio = torch.exp(bernoulli_log_probs(theta2, actions) - log_pi.detach())
    clipped = -torch.where(mask, clipped_surrogate(ratio, advantages, 0.2, 0.2), 0.0).sum() / mask.sum()
    plain = GA.surrogate(bernoulli_log_probs(theta2, actions), advantages, mask)
    assert GA.flat_gradient(clipped, [theta2]) != pytest.approx(GA.flat_gradient(plain, [theta2]))
    with pytest.raises(ValueError, match="one shape"):
        GA.surrogate(log_pi, advantages[:2])


def test_a_parameter_the_objective_does_not_reach_gets_zeros() -> None:
    a, b = torch.ones(2, requires_grad=True), torch.ones(3, requires_grad=True)
    assert GA.flat_gradient((2 * a).sum(), [a, b]).tolist() == [2.0, 2.0, 0.0, 0.0, 0.0]


def test_the_variance_split_by_hand() -> None:
    # S = 2 states × M = 2 actions × R = 2 trajectories, P = 1:
    #   s0: a0 → (1, 3), a1 → (5, 7);   s1: a0 → (0, 0), a1 → (2, 2)
    # ḡ_{s,a} = (2, 6), (0, 2); s²_τ = 2, 2, 0, 0 → W = 1.
    # s²_a(ḡ_{s,a}) = 8, 2 → mean 5; action = 5 − W/2 = 4.5.
    # ḡ_s = 4, 1 → s²_s = 4.5; state = 4.5 − 5/2 = 2.
    g = torch.tensor([[[1.0, 3.0], [5.0, 7.0]], [[0.0, 0.0], [2.0, 2.0]]]).unsqueeze(-1)  # (2, 2, 2, 1)
    split = GA.variance_split(g)
    assert split == pytest.approx({"state": 2.0, "action": 4.5, "trajectory": 1.0, "total": 7.5})
    with pytest.raises(ValueError, match="S, M, R >= 2"):
        GA.variance_split(g[:, :1])


def test_the_variance_split_recovers_known_parts() -> None:
    # g = μ_s + α_{s,a} + ε_{s,a,τ} with standard deviations 1, 2 and ½ in each of P = 3 coordinates:
    # the parts are 3·1, 3·4 and 3·¼.
    generator = torch.Generator().manual_seed(0)
    S, M, R, P = 2000, 4, 4, 3
    mu = torch.randn(S, 1, 1, P, generator=generator)
    alpha = 2 * torch.randn(S, M, 1, P, generator=generator)
    epsilon = 0.5 * torch.randn(S, M, R, P, generator=generator)
    split = GA.variance_split(mu + alpha + epsilon)
    assert split["state"] == pytest.approx(3.0, rel=0.15)
    assert split["action"] == pytest.approx(12.0, rel=0.05)
    assert split["trajectory"] == pytest.approx(0.75, rel=0.05)


def test_the_chains_expected_return_by_hand() -> None:
    # π(x|s_0(x)) = 0.7 for cue 0 and 0.6 for cue 1, γ = 0.9, H = 3: J = 0.81 · ½ · (0.4 + 0.2) = 0.243.
    assert float(GA.chain_return(torch.tensor([0.7, 0.6]), 0.9, 3)) == pytest.approx(0.243)


# ── the true gradient on the chain, against its closed form ──────────────────────────────────────

CHAIN_H, CHAIN_GAMMA = 4, 0.9


def chain_model() -> tuple[TA.AuditEnv, ActorCritic]:
    """The audit's chain env and a small actor-critic at a fixed θ whose policy reads the cue."""
    cfg = PPOConfig(env_id="testbed/Chain-v0", env_kwargs={"horizon": CHAIN_H}, gamma=CHAIN_GAMMA)
    torch.manual_seed(3)
    model = ActorCritic(NetworkSpec(obs_dim=4, action_dim=2, continuous=False, hidden_sizes=(4,), ortho_init=False))
    return TA.env_maker(cfg, {}), model


def first_observations(audit_env: TA.AuditEnv) -> Tensor:
    """s_0(x) for x = 0 and 1 as the policy sees them, (2, 4): resets until both cues have shown."""
    env = audit_env.make(1)
    try:
        seen: dict[int, np.ndarray] = {}
        for seed in range(50):
            obs, _ = env.reset(seed=[seed])
            seen[int(obs[0, 1] > 0)] = obs[0]
    finally:
        env.close()
    return torch.tensor(np.stack([seen[0], seen[1]]))


def closed_form_gradient(
    audit_env: TA.AuditEnv, model: ActorCritic, gamma: float = CHAIN_GAMMA, horizon: int = CHAIN_H
) -> Tensor:
    """∇θ J for the chain (``gradient_audit.chain_return``), flat over the actor's parameters."""
    obs = first_observations(audit_env)
    probabilities = torch.softmax(model.actor(obs), dim=-1)[torch.arange(2), torch.arange(2)]  # π(x|s_0(x))
    J = GA.chain_return(probabilities, gamma, horizon)
    return GA.flat_gradient(J, list(model.actor.parameters())).to(torch.float64)


@pytest.mark.parametrize("steps", [(0,), ()])
def test_the_true_gradient_on_the_chain_matches_the_closed_form_within_its_standard_error(steps: tuple) -> None:
    # Only a_0 matters, so the truth over first steps is ∇J, and over all steps of H-step episodes ∇J / H.
    audit_env, model = chain_model()
    expected = closed_form_gradient(audit_env, model) / (1 if steps else CHAIN_H)
    settings = TA.AuditSettings(samples=160, branches=16, groups=40, group_size=4, vine_branches=1, steps=steps)
    truth, result = TG.true_gradient(audit_env, model, CHAIN_GAMMA, settings)
    assert truth.gradient.shape == expected.shape == (sum(p.numel() for p in model.actor.parameters()),)
    moving = truth.standard_error > 0  # the head's and the trunk's weights the cue reaches
    assert moving.sum() >= 10
    # Every coordinate within 3.5 standard errors (the coordinates move together, driven by the two first
    # states: over audit seeds 0-3 the largest |z| was 0.5-2.2), and the truth resolves the direction.
    z = (truth.gradient - expected)[moving] / truth.standard_error[moving]
    assert z.abs().max() < 3.5, z
    assert GA.cosine_similarity(truth.gradient, expected) > 0.7
    assert truth.samples == 160 and truth.env_steps > 0
    if steps:
        assert result.t == [0] * 160


def test_every_estimators_batch_gradient_is_scored_against_the_truth_and_the_draws_differ() -> None:
    audit_env, model = chain_model()
    settings = TA.AuditSettings(groups=4, group_size=4, lambdas=(0.0, 1.0))
    found = [TG.batch_gradients(audit_env, model, CHAIN_GAMMA, settings, draw) for draw in (1, 2, 3)]
    assert [(b.steps, b.episodes, b.env_steps) for b in found] == [(16 * CHAIN_H, 16, 16 * CHAIN_H)] * 3
    batches = [b.gradients for b in found]
    names = ["gae(0)", "gae(1)", "process", "step_baseline", "step_alive", "step_horizon", "outcome", "rloo", "return"]
    assert list(batches[0]) == names
    P = sum(p.numel() for p in model.actor.parameters())
    assert all(g.shape == (P,) for batch in batches for g in batch.values())
    assert not torch.equal(batches[0]["rloo"], batches[1]["rloo"])  # each draw is a batch of its own
    # The same draw twice gives the same numbers.
    again = TG.batch_gradients(audit_env, model, CHAIN_GAMMA, settings, 2).gradients
    assert all(torch.equal(again[name], batches[1][name]) for name in names)
    truth = closed_form_gradient(audit_env, model) / CHAIN_H
    rows = TG.score_estimators(truth, batches)
    assert [row["estimator"] for row in rows] == names
    for row in rows:
        assert row["batches"] == 3 and -1 <= row["cosine"] <= 1 and row["relative_error"] >= 0
        assert row["cosine_se"] is not None and row["cosine_se"] >= 0
    # Scored against itself, a batch is perfect.
    (perfect,) = TG.score_estimators(batches[0]["rloo"], [{"rloo": batches[0]["rloo"]}])
    assert perfect["cosine"] == pytest.approx(1.0) and perfect["relative_error"] == 0.0
    assert perfect["cosine_se"] is None


# ── the gradient audit's parts: the return-to-go, the run's batch, the vine, the nested samples ─────────


def test_the_return_to_go_by_hand() -> None:
    # γ = 0.5: r = (1, 1, 1) gives (1.75, 1.5, 1); a member that ended after r = (1, 2) gives (2, 2, 0).
    rewards = torch.tensor([[1.0, 1.0], [1.0, 2.0], [1.0, 9.0]])  # (T, M) = (3, 2); the 9 is past the end
    mask = torch.tensor([[True, True], [True, True], [True, False]])
    episodes = Episodes(
        obs=torch.zeros(3, 2, 1),
        actions=torch.zeros(3, 2, dtype=torch.int64),
        log_probs=torch.zeros(3, 2),
        rewards=rewards,
        mask=mask,
        terminated=torch.tensor([True, True]),
        truncated=torch.tensor([False, False]),
        idle_steps=0,
        step_time_s=0.0,
    )
    assert TG.returns_to_go(episodes, 0.5).tolist() == [[1.75, 2.0], [1.5, 2.0], [1.0, 0.0]]


def test_the_first_steps_of_a_batch_by_hand() -> None:
    # Episodes of 3, 2 and 3 steps; the first 4 steps are member 0's 3 and member 1's first.
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 0, 1]], dtype=torch.bool)  # (T, M) = (3, 3)
    assert TG.first_steps(mask, 4).int().tolist() == [[1, 1, 0], [1, 0, 0], [1, 0, 0]]
    assert torch.equal(TG.first_steps(mask, 8), mask)


def test_the_batch_is_one_update_of_the_run() -> None:
    settings = TA.AuditSettings(groups=4, group_size=8)
    ppo = PPOConfig(env_id="CartPole-v1", n_envs=8, n_steps=128)
    assert TG.run_batch(ppo, "ppo", settings) == TG.Batch(steps=1024, groups=None, group_size=8)
    grpo = GRPOConfig(env_id="CartPole-v1", num_groups=3, group_size=4)
    assert TG.run_batch(grpo, "grpo", settings) == TG.Batch(steps=None, groups=3, group_size=4)
    with pytest.raises(ValueError, match="not a2c's"):
        TG.run_batch(ppo, "a2c", settings)


def test_a_ppo_batch_holds_the_first_n_steps_of_whole_episodes() -> None:
    audit_env, model = chain_model()
    settings = TA.AuditSettings(groups=4, group_size=4, lambdas=(0.95,))
    # 30 steps of 4-step episodes: ⌈30 / (4 · 4)⌉ = 2 groups, 8 episodes, the last one cut after 2 steps.
    found = TG.batch_gradients(audit_env, model, CHAIN_GAMMA, settings, 1, TG.Batch(30, None, 4))
    assert (found.steps, found.episodes, found.env_steps) == (30, 8, 32)
    # Where the audit samples the first steps only, so does the batch: 8 of its 30 steps.
    first = TG.batch_gradients(audit_env, model, CHAIN_GAMMA, replace(settings, steps=(0,)), 1, TG.Batch(30, None, 4))
    assert first.steps == 8 and first.env_steps == 32


def test_a_ppo_batch_of_short_episodes_takes_more_rounds() -> None:
    # A near-uniform policy drops CartPole's pole within about 20 of the 500 steps the limit allows: the first
    # round (one group of 2, sized for 500-step episodes) falls short, and the next ones are sized by the lengths.
    audit_env = TA.env_maker(PPOConfig(env_id="CartPole-v1"), {})
    torch.manual_seed(0)
    model = ActorCritic(NetworkSpec(obs_dim=4, action_dim=2, continuous=False, hidden_sizes=(8,)))
    settings = TA.AuditSettings(groups=2, group_size=2, lambdas=(1.0,))
    found = TG.batch_gradients(audit_env, model, 0.99, settings, 1, TG.Batch(200, None, 2))
    assert found.steps == 200 and found.episodes > 2 and 200 <= found.env_steps < 200 + found.episodes * 500
    again = TG.batch_gradients(audit_env, model, 0.99, settings, 1, TG.Batch(200, None, 2))
    assert all(torch.equal(again.gradients[name], g) for name, g in found.gradients.items())


def test_the_vine_in_a_batch_is_zero_after_the_chains_first_step() -> None:
    # A restored state carries the env's generator, and on the chain only a_0 pays: from s_t, t >= 1, every
    # rollout earns the trunk's own rewards, so r_t + γ V̂(s_{t+1}) − V̂(s_t) = 0. At t = 0 it is
    # γ^{H−1} (±1 − mean of the rollouts' ±1): never negative where a_0 matched the cue, never positive where not.
    audit_env, model = chain_model()
    settings = TA.AuditSettings(groups=2, group_size=4, vine_branches=4)
    env = audit_env.make(8)
    try:
        buffers = TA.segment_buffers(audit_env, model.actor, 8)
        trunks = TA.collect_trunks(env, model.actor, settings, buffers, audit_env.mode, 1)
    finally:
        env.close()
    A, steps = TG.vine_estimates(audit_env, model.actor, trunks, trunks.episodes.mask, CHAIN_GAMMA, settings, 1)
    assert A.shape == (CHAIN_H, 8) and A[1:].abs().max() < 1e-5
    matched = trunks.episodes.actions[0] == (trunks.episodes.obs[0, :, 1] > 0).long()  # a_0 = x
    assert (torch.where(matched, A[0], -A[0]) > -1e-5).all() and A[0].abs().max() > 0.1
    # One value per state, 4 rollouts each of the steps left: 8 episodes × 4 × (4 + 3 + 2 + 1).
    assert steps == 8 * 4 * 10
    found = TG.batch_gradients(audit_env, model, CHAIN_GAMMA, settings, 1, vine=True)
    assert list(found.gradients)[-1] == "vine" and found.env_steps == 8 * CHAIN_H + steps


def test_the_nested_samples_on_the_chain_have_no_trajectory_part_and_average_to_the_closed_form() -> None:
    audit_env, model = chain_model()
    settings = TA.AuditSettings(groups=10, group_size=4, steps=(0,))
    split = TG.GradientSettings(split_states=40, split_actions=4, split_rollouts=2)
    nested = TG.nested_gradients(audit_env, model, CHAIN_GAMMA, settings, split)
    P = sum(p.numel() for p in model.actor.parameters())
    assert list(nested.gradients) == ["return", "return_state_mean", "return_critic"]
    assert all(g.shape == (40, 4, 2, P) for g in nested.gradients.values())
    # The trunks' 40 episodes, and 40 × 4 × 2 rollouts of the whole episode.
    assert nested.states == 40 and nested.env_steps == 40 * CHAIN_H + 40 * 4 * 2 * CHAIN_H
    # After (s, a) the chain's rewards do not depend on π's later actions, and the rollouts share the env's
    # later noise: all R returns are equal, and the trajectory part is exactly 0.
    for g in nested.gradients.values():
        parts = GA.variance_split(g)
        assert parts["trajectory"] == 0.0 and parts["total"] > 0
    # E[G ∇log π(a|s)] over the first states is ∇J, whatever the baseline: the samples' means agree with the
    # closed form within their standard errors (clustered by state).
    expected = closed_form_gradient(audit_env, model)
    for name in ("return", "return_state_mean"):
        mean, se = GA.mean_and_standard_error(
            nested.gradients[name].reshape(-1, P), torch.arange(40).repeat_interleave(8)
        )
        moving = se > 0
        assert ((mean - expected)[moving] / se[moving]).abs().max() < 4
        assert GA.cosine_similarity(mean, expected) > 0.7
