"""The shared on-policy layer (``agents/onpolicy.py``): value targets against hand-computed numbers, the masked
gradient step of a seed stack, its metric rows, and the env options every algorithm shares."""

from __future__ import annotations

import pytest
import torch

from agents.config import RunConfig
from agents.networks import Actor, NetworkSpec
from agents.onpolicy import SeedParts, SeedStack, Segment, env_options, gae_targets, join_segments

SPEC = NetworkSpec(obs_dim=3, action_dim=2, continuous=False, hidden_sizes=(4,))


def segment(rewards: list[float], terminated_at: int | None = None) -> Segment:
    """One env's segment (T, 1) with the given rewards, zero observations and values, nothing truncated."""
    T = len(rewards)
    terminated = torch.zeros((T, 1), dtype=torch.bool)  # (T, 1)
    if terminated_at is not None:
        terminated[terminated_at] = True
    return Segment(
        obs=torch.zeros((T, 1, 3)),
        actions=torch.zeros((T, 1), dtype=torch.int64),
        log_probs=torch.zeros((T, 1)),
        values=torch.zeros((T, 1)),
        next_values=torch.zeros((T, 1)),
        rewards=torch.tensor(rewards).unsqueeze(1),
        terminated=terminated,
        truncated=torch.zeros((T, 1), dtype=torch.bool),
        sample_mask=torch.ones((T, 1), dtype=torch.bool),
        last_obs=torch.zeros((1, 1, 3)),
    )


@pytest.mark.parametrize("lam, expected", [(1.0, [1.75, 1.5, 1.0]), (0.0, [1.0, 1.0, 1.0])])
def test_gae_targets_by_hand(lam: float, expected: list[float]) -> None:
    # γ = 0.5, r = (1, 1, 1), V = 0: λ = 1 sums the discounted rewards to the segment's end (1 + 0.5 + 0.25, …),
    # λ = 0 is the one-step TD error r_t. The value targets are Â + V = Â.
    seg = segment([1.0, 1.0, 1.0])
    advantages, targets = gae_targets(seg, seg.values, seg.next_values, 0.5, lam)
    assert advantages.squeeze(1).tolist() == expected and torch.equal(targets, advantages)


def test_gae_targets_stop_at_a_termination() -> None:
    # Terminated at t = 1: the return from t = 0 is 1 + 0.5 · 1, and from t = 2 on a new episode starts.
    seg = segment([1.0, 1.0, 1.0], terminated_at=1)
    advantages, _ = gae_targets(seg, seg.values, seg.next_values, 0.5, 1.0)
    assert advantages.squeeze(1).tolist() == [1.5, 1.0, 1.0]


def test_join_segments_puts_each_seed_in_its_columns_and_zeros_for_an_ended_one() -> None:
    joined = join_segments([segment([1.0, 2.0]), None, segment([3.0, 4.0])])  # (T, S·N) = (2, 3)
    assert joined.rewards.tolist() == [[1.0, 0.0, 3.0], [2.0, 0.0, 4.0]]
    assert joined.sample_mask[:, 1].tolist() == [False, False] and joined.obs.shape == (2, 3, 3)


def stack_of(seeds: list[int]) -> SeedStack:
    """A stack of small actors, each built as a single run builds it (no env: evaluation is not used)."""
    cfgs = [RunConfig(env_id="CartPole-v1", seed=seed, learning_rate=0.01) for seed in seeds]
    return SeedStack(cfgs, lambda k, cfg: SeedParts(Actor(SPEC), None, dict, {}))  # type: ignore[arg-type]


def seed_loss(stack: SeedStack) -> torch.Tensor:
    """Each seed's own loss, (S,): the mean of its policy's outputs on fixed observations."""
    obs = torch.linspace(-1.0, 1.0, 15).view(1, 5, 3).expand(stack.seeds, 5, 3)  # (S, B, obs_dim)
    return stack.net.policy(obs).mean(dim=(1, 2))


def test_a_masked_step_moves_the_stepping_seeds_alone_as_a_stack_of_one_would() -> None:
    alone, pair = stack_of([0]), stack_of([0, 1])
    before = pair.net.flat.detach().clone()  # (2, P)
    alone.step(seed_loss(alone), torch.tensor([True]), max_grad_norm=0.5)
    # seed 1 holds, with a NaN loss that must stay out of seed 0's gradient
    loss = seed_loss(pair) * torch.tensor([1.0, float("nan")])
    pair.step(loss, torch.tensor([True, False]), max_grad_norm=0.5)
    assert torch.equal(pair.net.flat[0], alone.net.flat[0]) and not torch.equal(pair.net.flat[0], before[0])
    assert torch.equal(pair.net.flat[1], before[1])
    assert pair.trainees[1].optimizer.state_dict()["state"] == {}
    assert pair.trainees[0].optimizer.state_dict()["state"][0]["step"] == 1


def test_learning_rates_are_each_seed_s() -> None:
    stack = stack_of([0, 1])
    stack.set_learning_rates([0.01, 0.0])  # α = 0: seed 1 takes a step that moves nothing
    before = stack.net.flat.detach().clone()
    stack.step(seed_loss(stack), torch.tensor([True, True]), max_grad_norm=0.5)
    assert not torch.equal(stack.net.flat[0], before[0]) and torch.equal(stack.net.flat[1], before[1])
    assert stack.trainees[1].optimizer.state_dict()["param_groups"][0]["lr"] == 0.0


def test_per_seed_metrics_name_each_running_seed_s_row() -> None:
    stats = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # (S, 2)
    assert SeedStack.per_seed_metrics(stats, ("a", "b"), [True, False]) == [{"a": 1.0, "b": 2.0}, {}]


def test_env_options_are_the_shared_settings_then_the_algorithm_s_own() -> None:
    cfg = RunConfig(env_id="CartPole-v1", normalize_obs=True, reward_delay=5, reward_offset=0.5, gamma=0.9)
    options = env_options(cfg, vectorization="sync", normalize_reward=True, gamma=cfg.gamma)
    assert (options.normalize_obs, options.reward_delay, options.reward_offset) == (True, 5, 0.5)
    assert (options.vectorization, options.normalize_reward, options.gamma) == ("sync", True, 0.9)
    assert not env_options(cfg).normalize_reward  # reward normalization is PPO's, asked for by PPO alone
