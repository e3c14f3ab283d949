"""agents/true_advantage.py: the Monte-Carlo truth against the chain task's closed form, and reproducibility."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from agents import audit_scores as S
from agents import true_advantage as A
from agents.networks import ActorCritic, NetworkSpec
from agents.ppo import PPOConfig
from agents.rollout import Episodes

GAMMA = 0.99
H = 10


def chain_policy(p_one: float) -> ActorCritic:
    """A policy that plays action 1 with probability p_one whatever it sees; a critic of zeros."""
    model = ActorCritic(NetworkSpec(obs_dim=4, action_dim=2, continuous=False, hidden_sizes=(8,)))
    with torch.no_grad():
        model.actor.head.weight.zero_()
        model.actor.head.bias.copy_(torch.log(torch.tensor([1 - p_one, p_one])))
        model.critic_head.weight.zero_()
        model.critic_head.bias.zero_()
    return model


def chain_audit(settings: A.AuditSettings, p_one: float = 0.7) -> A.Audit:
    cfg = PPOConfig(env_id="testbed/Chain-v0", env_kwargs={"horizon": H}, gamma=GAMMA)
    audit_env = A.env_maker(cfg, {})
    assert (audit_env.H, audit_env.reward_scale, audit_env.mode) == (H, 1.0, "direct")
    return A.audit(audit_env, chain_policy(p_one), GAMMA, settings)


def test_the_truth_at_the_first_step_matches_the_chains_closed_form() -> None:
    # Only a_0 matters: it pays o = +1 if a_0 equals the cue x, else −1, at the last step, H − 1 steps later.
    # Under π(1) = p: V(s_0) = γ^{H−1}(2·π(x) − 1), Q(s_0, a) = γ^{H−1}·o(a), so A = γ^{H−1}(o(a) − 2π(x) + 1).
    p = 0.7
    result = chain_audit(A.AuditSettings(samples=12, branches=64, groups=3, group_size=4, steps=(0,)), p)
    assert result.t == [0] * 12
    cue = (result.obs[:, 1] > 0).long()  # observation column 1 is 2x − 1
    pi_cue = torch.where(cue == 1, p, 1 - p)
    o = torch.where(result.actions == cue, 1.0, -1.0)
    closed = GAMMA ** (H - 1) * (o - 2 * pi_cue + 1)
    assert (result.truth_se > 0).all()
    assert ((result.truth - closed).abs() <= 4 * result.truth_se).all()
    # The errors, in standard errors, average out near 0 over the 12 samples.
    assert abs(float(((result.truth - closed) / result.truth_se).mean())) < 4 / math.sqrt(12)


def test_later_actions_change_nothing_and_common_random_numbers_make_that_exact() -> None:
    # After a_0 the chain's rewards no longer depend on the actions; the distractors, drawn from the restored
    # generator, are shared by the Q- and V-branches: every D_{n,k} is exactly 0.
    result = chain_audit(A.AuditSettings(samples=10, branches=4, groups=2, group_size=4, steps=(3, 5, 8)))
    assert set(result.t) <= {3, 5, 8}
    assert torch.equal(result.truth, torch.zeros(10)) and torch.equal(result.truth_se, torch.zeros(10))
    assert result.steps_left == [H - t for t in result.t]


def test_max_branches_adds_rollouts_until_the_truth_is_sharp_and_changes_nothing_where_it_is() -> None:
    # The first action's truth from 2 rollouts is noisy against its spread; with --max-branches 64, rounds of
    # 2 more join until the noise share is at most a quarter (or 64 are reached).
    p, settings = 0.7, A.AuditSettings(samples=12, branches=2, groups=3, group_size=4, steps=(0,), max_branches=64)
    plain = chain_audit(replace(settings, max_branches=0), p)
    assert plain.branches == 2 and S.noise_share(plain.truth, plain.truth_se) > settings.noise_target
    grown = chain_audit(settings, p)
    assert grown.branches % 2 == 0 and 2 < grown.branches <= 64
    share = S.noise_share(grown.truth, grown.truth_se)
    assert share <= settings.noise_target or grown.branches == 64
    assert grown.env_steps > plain.env_steps and grown.t == plain.t  # the same samples, more rollouts each
    # Where the truth is already sharp (exactly 0 after the first action), nothing is added.
    later = replace(settings, samples=6, steps=(3, 5))
    assert chain_audit(later).branches == 2
    assert torch.equal(chain_audit(later).truth, chain_audit(replace(later, max_branches=0)).truth)


def test_an_audit_gives_every_estimator_and_the_same_numbers_twice() -> None:
    settings = A.AuditSettings(samples=6, branches=4, groups=2, group_size=4, vine_branches=2, round_jobs=3)
    first, second = chain_audit(settings), chain_audit(settings)
    assert set(first.estimates) == {
        *(f"gae({lam:g})" for lam in A.LAMBDAS),
        "outcome",
        "rloo",
        "process",
        "step_baseline",
        "step_alive",
        "step_horizon",
        "vine",
    }
    assert torch.equal(first.truth, second.truth) and torch.equal(first.truth_se, second.truth_se)
    for name, values in first.estimates.items():
        assert torch.equal(values, second.estimates[name]), name
    # Trunks: 2·4 episodes of H steps; truth: 6 samples × 2 kinds × 4 rollouts; vine: up to 2 values × 2 rollouts.
    steps_left = torch.tensor(first.steps_left)
    truth_steps = int(2 * 4 * steps_left.sum())
    vine_steps = int(2 * (steps_left + (steps_left - 1)).sum())
    assert first.env_steps == 2 * 4 * H + truth_steps + vine_steps


def test_a_replayed_state_gives_the_same_numbers_as_a_state_set_directly() -> None:
    # CartPole is restorable both ways: its state set directly, or its seed and action prefix taken again.
    cfg = PPOConfig(env_id="CartPole-v1", gamma=GAMMA)
    model = ActorCritic(NetworkSpec(obs_dim=4, action_dim=2, continuous=False, hidden_sizes=(8,)))
    settings = A.AuditSettings(samples=5, branches=3, groups=2, group_size=2, vine_branches=2)
    direct = A.env_maker(cfg, {})
    by_state = A.audit(direct, model, GAMMA, settings)
    by_replay = A.audit(replace(direct, mode="replay"), model, GAMMA, settings)
    assert direct.mode == "direct" and (by_state.truth != 0).any()
    assert torch.equal(by_state.truth, by_replay.truth) and torch.equal(by_state.truth_se, by_replay.truth_se)
    assert torch.equal(by_state.estimates["vine"], by_replay.estimates["vine"])
    assert by_replay.env_steps > by_state.env_steps  # the replays' steps count


def test_lunar_lander_is_audited_by_replay() -> None:
    cfg = PPOConfig(env_id="LunarLander-v3", gamma=GAMMA)
    audit_env = A.env_maker(cfg, {})
    assert audit_env.mode == "replay"
    model = ActorCritic(NetworkSpec(obs_dim=8, action_dim=4, continuous=False, hidden_sizes=(8,)))
    result = A.audit(
        audit_env, model, GAMMA, A.AuditSettings(samples=3, branches=2, groups=1, group_size=2, vine_branches=1)
    )
    assert len(result.truth) == 3 and torch.isfinite(result.truth).all() and (result.truth_se >= 0).all()


def test_a_critic_trained_on_normalized_rewards_is_scaled_back_by_the_normalizers_std() -> None:
    # gymnasium's NormalizeReward divides by √(Var[return] + 1e-8); its statistics are saved as arrays.
    normalizers = {"return_rms": {"mean": np.zeros(1), "var": np.array([4.0]), "count": 10.0}}
    audit_env = A.env_maker(PPOConfig(env_id="testbed/Chain-v0", env_kwargs={"horizon": H}), normalizers)
    assert audit_env.reward_scale == pytest.approx(2.0)


def hand_batch() -> Episodes:
    # One group of G = 2, γ = 1. Member 0 earns 1, 1, 1 and is cut by the time limit; member 1 earns 1, 0 and
    # terminates after 2 steps.
    T, M = 3, 2
    return Episodes(
        obs=torch.zeros(T, M, 4),
        actions=torch.zeros(T, M, dtype=torch.int64),
        log_probs=torch.zeros(T, M),
        rewards=torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]]),
        mask=torch.tensor([[True, True], [True, True], [True, False]]),
        terminated=torch.tensor([False, True]),
        truncated=torch.tensor([True, False]),
        idle_steps=0,
        step_time_s=0.0,
        final_obs=torch.zeros(M, 4),
    )


def test_the_group_estimators_on_a_hand_built_batch() -> None:
    estimates = A.group_estimates(hand_batch(), B=1, G=2, gamma=1.0)
    # Returns 3 and 1: outcome ±(1)/√2 (std with Bessel's correction), RLOO ±2, on every valid step.
    s = 1 / math.sqrt(2)
    torch.testing.assert_close(estimates["outcome"], torch.tensor([[s, -s], [s, -s], [s, 0.0]]), atol=1e-5, rtol=0)
    torch.testing.assert_close(estimates["rloo"], torch.tensor([[2.0, -2.0], [2.0, -2.0], [2.0, 0.0]]))
    # Rewards-to-go 3, 2, 1 and 1, 0: against the other member's (0 once it ended), and over the alive ones only.
    torch.testing.assert_close(estimates["step_baseline"], torch.tensor([[2.0, -2.0], [2.0, -2.0], [1.0, 0.0]]))
    torch.testing.assert_close(
        estimates["step_alive"], torch.tensor([[1.0, -1.0], [1.0, -1.0], [0.0, 0.0]]), atol=1e-5, rtol=0
    )
    # Horizon-aware: the group's rate is 4/5 = 0.8 a step, so the excess rewards are 0.2, 0.2, 0.2 and 0.2, −0.8,
    # with rewards-to-go 0.6, 0.4, 0.2 and −0.6, −0.8: each against the other member's, as step_baseline.
    torch.testing.assert_close(
        estimates["step_horizon"], torch.tensor([[1.2, -1.2], [1.2, -1.2], [0.2, 0.0]]), atol=1e-5, rtol=0
    )
    # Process: the 5 valid rewards have mean 0.8 and std √0.2, so 1 → 0.2/√0.2 = √0.2 and 0 → −0.8/√0.2.
    up, down = math.sqrt(0.2), -0.8 / math.sqrt(0.2)
    torch.testing.assert_close(
        estimates["process"], torch.tensor([[3 * up, up + down], [2 * up, down], [up, 0.0]]), atol=1e-5, rtol=0
    )


def test_gae_on_a_hand_built_batch_scales_the_critic_and_bootstraps_only_the_truncation() -> None:
    model = ActorCritic(NetworkSpec(obs_dim=4, action_dim=2, continuous=False, hidden_sizes=(8,)))
    with torch.no_grad():
        model.critic_head.weight.zero_()
        model.critic_head.bias.fill_(0.5)  # V_φ = 0.5 everywhere; σ_R = 2 makes it 1 in reward units
    estimates = A.gae_estimates(hand_batch(), model, value_scale=2.0, gamma=1.0, lambdas=(0.0, 1.0))
    # δ = r + V(next) − V: member 0: 1 + 1 − 1 at every step (its last step bootstraps from its final
    # observation); member 1: 1 + 1 − 1, then 0 + 0 − 1 (terminated). λ = 1 sums the δ to the episode's end.
    torch.testing.assert_close(estimates["gae(0)"], torch.tensor([[1.0, 1.0], [1.0, -1.0], [1.0, 0.0]]))
    torch.testing.assert_close(estimates["gae(1)"], torch.tensor([[3.0, 0.0], [2.0, -1.0], [1.0, 0.0]]))
