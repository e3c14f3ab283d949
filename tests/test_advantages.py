"""Tier (a) tests of agents/advantages.py: GAE, advantage normalization, vine and GRPO's group advantages
against hand-computed numbers, special cases and Stable-Baselines3's RolloutBuffer.

Index convention (see the module docstring): index t holds the step taken from s_t; ``next_values[t]``
is V of the true next observation of that step.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import Tensor

from agents import advantages as adv
from agents.advantages import gae, normalize, vine


def column(values: list[float]) -> Tensor:
    """A (T,) list as a (T, N=1) float32 tensor."""
    return torch.tensor(values, dtype=torch.float32).unsqueeze(1)


def flags(values: list[bool]) -> Tensor:
    """A (T,) list of flags as a (T, N=1) bool tensor."""
    return torch.tensor(values, dtype=torch.bool).unsqueeze(1)


def assert_column(actual: Tensor, expected: list[float]) -> None:
    assert actual.shape == (len(expected), 1)
    torch.testing.assert_close(actual, column(expected))


# --------------------------------------------------------------------------------------------------
# Hand-computed cases
# --------------------------------------------------------------------------------------------------


def three_ones(lam: float) -> Tensor:
    """γ = 0.5, r = [1, 1, 1], V ≡ 0, the episode terminates at the last step only."""
    return gae(
        rewards=column([1.0, 1.0, 1.0]),
        values=column([0.0, 0.0, 0.0]),
        next_values=column([0.0, 0.0, 0.0]),
        terminated=flags([False, False, True]),
        done=flags([False, False, True]),
        gamma=0.5,
        lam=lam,
    )


def test_gae_lambda_one_is_discounted_return() -> None:
    # V ≡ 0, so every δ_t = r_t = 1.
    # A_2 = δ_2                 = 1
    # A_1 = δ_1 + 0.5·1·A_2     = 1 + 0.5      = 1.5
    # A_0 = δ_0 + 0.5·1·A_1     = 1 + 0.75     = 1.75
    assert_column(three_ones(lam=1.0), [1.75, 1.5, 1.0])


def test_gae_lambda_zero_is_one_step_td() -> None:
    # λ = 0 carries nothing: A_t = δ_t = 1 for every t.
    assert_column(three_ones(lam=0.0), [1.0, 1.0, 1.0])


# Shared data of the two mid-segment tests. γ = 0.5, λ = 1, T = 4:
#   r = [1, 2, 3, 4],  V(s_t) = [1, 1, 1, 1],  the episode ends after step t = 1,
#   the segment ends after t = 3 with V(s_4) = 1 as bootstrap.
REWARDS = [1.0, 2.0, 3.0, 4.0]
VALUES = [1.0, 1.0, 1.0, 1.0]


def test_gae_termination_mid_segment_stops_recursion_and_bootstrap() -> None:
    # next_values[1] = 6 would be V(final obs) — it must be ignored because step 1 terminated.
    # δ_3 = 4 + 0.5·1 − 1 = 3.5     A_3 = 3.5
    # δ_2 = 3 + 0.5·1 − 1 = 2.5     A_2 = 2.5 + 0.5·3.5 = 4.25
    # δ_1 = 2 + 0       − 1 = 1     A_1 = 1            (done: nothing carried from A_2)
    # δ_0 = 1 + 0.5·1 − 1 = 0.5     A_0 = 0.5 + 0.5·1  = 1.0
    # Check against Monte Carlo (λ = 1): G_1 = 2, G_0 = 1 + 0.5·2 = 2 → A_0 = 2 − 1 = 1.
    advantages = gae(
        rewards=column(REWARDS),
        values=column(VALUES),
        next_values=column([1.0, 6.0, 1.0, 1.0]),
        terminated=flags([False, True, False, False]),
        done=flags([False, True, False, False]),
        gamma=0.5,
        lam=1.0,
    )
    assert_column(advantages, [1.0, 1.0, 4.25, 3.5])


def test_gae_truncation_mid_segment_bootstraps_from_final_observation() -> None:
    # Step 1 is truncated (done, not terminated). V(final obs of step 1) = 6 differs from
    # V(s_2) = values[2] = 1, the first observation of the next episode.
    # δ_3 = 3.5, A_3 = 3.5; δ_2 = 2.5, A_2 = 4.25               (as above)
    # δ_1 = 2 + 0.5·6 − 1 = 4       A_1 = 4                    (done: nothing carried from A_2)
    # δ_0 = 1 + 0.5·1 − 1 = 0.5     A_0 = 0.5 + 0.5·4 = 2.5
    # Wrong alternatives: bootstrapping from values[2] gives A_1 = 2 + 0.5 − 1 = 1.5;
    # carrying A_2 across gives A_1 = 4 + 0.5·4.25 = 6.125; treating it as terminal gives A_1 = 1.
    advantages = gae(
        rewards=column(REWARDS),
        values=column(VALUES),
        next_values=column([1.0, 6.0, 1.0, 1.0]),
        terminated=flags([False, False, False, False]),
        done=flags([False, True, False, False]),
        gamma=0.5,
        lam=1.0,
    )
    assert_column(advantages, [2.5, 4.0, 4.25, 3.5])


def test_gae_bootstraps_at_segment_end_when_not_done() -> None:
    # T = 1, γ = 0.5: δ_0 = r + γ·V(s_1) − V(s_0) = 1 + 0.5·4 − 2 = 1, whatever λ is.
    for lam in (0.0, 0.5, 1.0):
        advantages = gae(
            column([1.0]), column([2.0]), column([4.0]), flags([False]), flags([False]), gamma=0.5, lam=lam
        )
        assert_column(advantages, [1.0])


def test_gae_intermediate_lambda() -> None:
    # γ = 0.5, λ = 0.5, r = [1, 1, 1], V ≡ 0, terminal at the end: γλ = 0.25.
    # A_2 = 1;  A_1 = 1 + 0.25·1 = 1.25;  A_0 = 1 + 0.25·1.25 = 1.3125
    assert_column(three_ones(lam=0.5), [1.3125, 1.25, 1.0])


# --------------------------------------------------------------------------------------------------
# Limits λ = 0 and λ = 1 on random data
# --------------------------------------------------------------------------------------------------


def random_segment(seed: int, T: int = 12, N: int = 3) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Random but consistent rewards, values, next_values (T, N) and terminated ⊆ done flags (T, N).

    Consistent: where a step did not end the episode, its next observation is the next step's
    observation, so next_values[t] = values[t + 1]. Where it ended, next_values[t] is V of the final
    observation, which differs from values[t + 1] (the next episode's first observation).
    """
    generator = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, N, generator=generator, dtype=torch.float64)
    values = torch.randn(T, N, generator=generator, dtype=torch.float64)
    final_values = torch.randn(T, N, generator=generator, dtype=torch.float64)  # V(final obs) (T, N)
    done = torch.rand(T, N, generator=generator) < 0.3
    terminated = done & (torch.rand(T, N, generator=generator) < 0.5)
    shifted = torch.cat([values[1:], final_values[-1:]])  # V(s_{t+1}) within an episode (T, N)
    next_values = torch.where(done, final_values, shifted)
    return rewards, values, next_values, terminated, done


def test_gae_lambda_zero_equals_td_errors() -> None:
    rewards, values, next_values, terminated, done = random_segment(seed=1)
    gamma = 0.9
    deltas = rewards + gamma * next_values * (~terminated).double() - values  # (T, N)
    torch.testing.assert_close(gae(rewards, values, next_values, terminated, done, gamma, lam=0.0), deltas)


def test_gae_lambda_one_equals_monte_carlo_return_minus_value() -> None:
    rewards, values, next_values, terminated, done = random_segment(seed=2)
    assert terminated.any() and (done & ~terminated).any() and not done[-1].all()  # all three cases occur
    gamma = 0.9
    T, N = rewards.shape
    # Discounted return G_t written per env as an explicit sum:
    # G_t = Σ_{k=t}^{e} γ^{k−t} r_k + γ^{e−t+1} · (1 − terminated_e) · V'(e),
    # where e is the first k ≥ t with done_k, or T − 1 (bootstrap at the segment end).
    expected = torch.zeros(T, N, dtype=torch.float64)
    for n in range(N):
        for t in range(T):
            ret, k = 0.0, t
            while True:
                ret += gamma ** (k - t) * float(rewards[k, n])
                if bool(done[k, n]) or k == T - 1:
                    if not bool(terminated[k, n]):
                        ret += gamma ** (k - t + 1) * float(next_values[k, n])
                    break
                k += 1
            expected[t, n] = ret - float(values[t, n])
    torch.testing.assert_close(gae(rewards, values, next_values, terminated, done, gamma, lam=1.0), expected)


def test_gae_columns_are_independent() -> None:
    rewards, values, next_values, terminated, done = random_segment(seed=3, N=4)
    together = gae(rewards, values, next_values, terminated, done, gamma=0.97, lam=0.9)
    for n in range(4):
        alone = gae(
            rewards[:, n : n + 1],
            values[:, n : n + 1],
            next_values[:, n : n + 1],
            terminated[:, n : n + 1],
            done[:, n : n + 1],
            gamma=0.97,
            lam=0.9,
        )
        torch.testing.assert_close(together[:, n : n + 1], alone)
    # Changing env 0's rewards leaves envs 1..3 untouched.
    rewards[:, 0] += 100.0
    changed = gae(rewards, values, next_values, terminated, done, gamma=0.97, lam=0.9)
    torch.testing.assert_close(changed[:, 1:], together[:, 1:])
    assert not torch.allclose(changed[:, 0], together[:, 0])


@pytest.mark.parametrize("which", ["rewards", "values", "next_values", "terminated", "done"])
def test_gae_shape_mismatch_raises(which: str) -> None:
    args = dict(zip(["rewards", "values", "next_values", "terminated", "done"], random_segment(seed=4, T=5, N=2)))
    args[which] = args[which][:4]  # (4, 2) instead of (5, 2)
    with pytest.raises(ValueError, match="share one"):
        gae(**args, gamma=0.99, lam=0.95)


# --------------------------------------------------------------------------------------------------
# Agreement with Stable-Baselines3's RolloutBuffer
# --------------------------------------------------------------------------------------------------


def sb3_advantages(
    rewards: np.ndarray,
    values: np.ndarray,
    episode_starts: np.ndarray,
    last_values: np.ndarray,
    dones_last: np.ndarray,
    gamma: float,
    lam: float,
) -> np.ndarray:
    """Advantages (T, N) from SB3's RolloutBuffer.compute_returns_and_advantage."""
    gymnasium = pytest.importorskip("gymnasium")
    buffers = pytest.importorskip("stable_baselines3.common.buffers")
    T, N = rewards.shape
    buffer = buffers.RolloutBuffer(
        T,
        gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32),
        gymnasium.spaces.Box(-1.0, 1.0, (1,), np.float32),
        device="cpu",
        gae_lambda=lam,
        gamma=gamma,
        n_envs=N,
    )
    for t in range(T):
        buffer.add(
            np.zeros((N, 2), np.float32),
            np.zeros((N, 1), np.float32),
            rewards[t],
            episode_starts[t],
            torch.as_tensor(values[t]),
            torch.zeros(N),
        )
    buffer.compute_returns_and_advantage(last_values=torch.as_tensor(last_values), dones=dones_last)
    return buffer.advantages


def sb3_to_ours(
    values: np.ndarray, episode_starts: np.ndarray, last_values: np.ndarray, dones_last: np.ndarray
) -> tuple[Tensor, Tensor]:
    """SB3's flags → our (next_values, done), both (T, N): done[t] = episode_starts[t+1], last = dones."""
    done = np.concatenate([episode_starts[1:], dones_last[None]], axis=0).astype(bool)  # (T, N)
    next_values = np.concatenate([values[1:], last_values[None]], axis=0)  # (T, N)
    return torch.as_tensor(next_values), torch.as_tensor(done)


def test_gae_matches_stable_baselines3_rollout_buffer() -> None:
    rng = np.random.default_rng(0)
    T, N, gamma, lam = 16, 4, 0.99, 0.95
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    values = rng.normal(size=(T, N)).astype(np.float32)
    episode_starts = (rng.random((T, N)) < 0.2).astype(np.float32)
    last_values = rng.normal(size=N).astype(np.float32)
    dones_last = rng.random(N) < 0.5
    assert episode_starts[1:].any() and dones_last.any() and not dones_last.all()  # the data exercises both

    expected = sb3_advantages(rewards, values, episode_starts, last_values, dones_last, gamma, lam)
    next_values, done = sb3_to_ours(values, episode_starts, last_values, dones_last)
    # SB3 treats every done as termination.
    ours = gae(torch.as_tensor(rewards), torch.as_tensor(values), next_values, done, done, gamma, lam)
    assert expected.shape == (T, N)
    np.testing.assert_allclose(ours.numpy(), expected, atol=1e-5)


def test_gae_truncation_equals_sb3_reward_bootstrap_trick() -> None:
    # SB3 bootstraps a truncated step by adding γ·V(final obs) to its reward and then treating the step as
    # terminal. Our GAE takes V(final obs) as next_values with terminated = False: the two must agree.
    rng = np.random.default_rng(1)
    T, N, gamma, lam = 16, 4, 0.99, 0.95
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    values = rng.normal(size=(T, N)).astype(np.float32)
    final_values = rng.normal(size=(T, N)).astype(np.float32)  # V(final obs) where a step ended (T, N)
    episode_starts = (rng.random((T, N)) < 0.25).astype(np.float32)
    last_values = rng.normal(size=N).astype(np.float32)
    dones_last = np.zeros(N, dtype=bool)  # the segment's last step ends no episode
    next_values, done = sb3_to_ours(values, episode_starts, last_values, dones_last)
    truncated = done & torch.as_tensor(rng.random((T, N)) < 0.5)  # (T, N)
    terminated = done & ~truncated
    assert truncated.any() and terminated.any()

    next_values = torch.where(done, torch.as_tensor(final_values), next_values)
    ours = gae(torch.as_tensor(rewards), torch.as_tensor(values), next_values, terminated, done, gamma, lam)

    sb3_rewards = rewards + gamma * final_values * truncated.numpy()
    expected = sb3_advantages(sb3_rewards, values, episode_starts, last_values, dones_last, gamma, lam)
    np.testing.assert_allclose(ours.numpy(), expected, atol=1e-5)


# --------------------------------------------------------------------------------------------------
# normalize
# --------------------------------------------------------------------------------------------------


def test_normalize_hand_values() -> None:
    # A = [1, 2, 3, 4]: mean 2.5, Bessel variance (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3, std ≈ 1.290994.
    # Â = [−1.5, −0.5, 0.5, 1.5] / 1.290994 = [−1.161895, −0.387298, 0.387298, 1.161895]
    out = normalize(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    std = math.sqrt(5.0 / 3.0)
    torch.testing.assert_close(out, torch.tensor([-1.5, -0.5, 0.5, 1.5]) / std)


def test_normalize_gives_mean_zero_and_bessel_std_one() -> None:
    advantages = torch.randn(64, generator=torch.Generator().manual_seed(0)) * 7.0 + 3.0
    out = normalize(advantages)
    assert abs(out.mean().item()) < 1e-6
    assert out.std(correction=1).item() == pytest.approx(1.0, abs=1e-6)
    assert out.std(correction=0).item() < 1.0  # the population std is smaller: Bessel's correction is used


def test_normalize_single_element_gives_zero_not_nan() -> None:
    out = normalize(torch.tensor([5.0]))
    assert out.tolist() == [0.0]


def test_normalize_constant_gives_zeros_not_nan() -> None:
    out = normalize(torch.full((8,), 3.0))
    assert torch.equal(out, torch.zeros(8))


# --------------------------------------------------------------------------------------------------
# vine: advantages from Monte-Carlo values every m steps
# --------------------------------------------------------------------------------------------------


def test_vine_hand_values_with_interval_two() -> None:
    # One trajectory of 5 steps, m = 2, γ = 0.5, r = [1, 2, 3, 4, 5], V̂ at steps 0, 2, 4 = [10, 6, 4].
    # Segment 0 (steps 0, 1): 1 + 0.5·2 + 0.5²·6 − 10 = 2 + 1.5 − 10 = −6.5
    # Segment 1 (steps 2, 3): 3 + 0.5·4 + 0.5²·4 − 6 = 5 + 1 − 6 = 0
    # Segment 2 (step 4, the last): 5 + 0 − 4 = 1 (nothing after the episode's end)
    rewards = torch.tensor([[1.0], [2.0], [3.0], [4.0], [5.0]])
    mask = torch.ones(5, 1, dtype=torch.bool)
    values = torch.tensor([[10.0], [6.0], [4.0]])
    A = vine(rewards, mask, values, interval=2, gamma=0.5)
    torch.testing.assert_close(A.squeeze(1), torch.tensor([-6.5, -6.5, 0.0, 0.0, 1.0]))


def test_vine_with_interval_one_is_vineppo_td_error() -> None:
    # m = 1: A_t = r_t + γ V̂_{t+1} − V̂_t, with V̂ = 0 after the end. γ = 0.9.
    # Member 0 (3 steps): r = [1, 0, 2], V̂ = [2, 1.5, 2]: A = [1 + 1.35 − 2, 0 + 1.8 − 1.5, 2 − 2] = [0.35, 0.3, 0]
    # Member 1 (2 steps, then masked): r = [0, 1], V̂ = [0.9, 1, 0]: A = [0 + 0.9 − 0.9, 1 − 1, 0] = [0, 0, 0]
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 7.0]])
    mask = torch.tensor([[True, True], [True, True], [True, False]])
    values = torch.tensor([[2.0, 0.9], [1.5, 1.0], [2.0, 0.0]])
    A = vine(rewards, mask, values, interval=1, gamma=0.9)
    torch.testing.assert_close(A, torch.tensor([[0.35, 0.0], [0.3, 0.0], [0.0, 0.0]]))


def test_vine_with_exact_values_has_zero_mean_advantage() -> None:
    # With V̂ the exact values of a deterministic reward sequence, every advantage is 0: the rewards
    # from 0 to the end are 1 each, so V(s_t) = T − t with γ = 1.
    T, m = 7, 3
    rewards = torch.ones(T, 1)
    values = torch.tensor([[7.0], [4.0], [1.0]])  # V at steps 0, 3, 6
    A = vine(rewards, torch.ones(T, 1, dtype=torch.bool), values, interval=m, gamma=1.0)
    assert torch.equal(A, torch.zeros(T, 1))


def test_vine_refuses_too_few_values() -> None:
    with pytest.raises(ValueError, match="J·interval ≥ T"):
        vine(torch.zeros(5, 1), torch.ones(5, 1, dtype=torch.bool), torch.zeros(2, 1), interval=2, gamma=1.0)


# --------------------------------------------------------------------------------------------------
# Group advantages (GRPO), by hand
# --------------------------------------------------------------------------------------------------


def test_outcome_advantage_by_hand() -> None:
    # Group [1, 2, 3]: mean 2, Bessel std 1 → [-1, 0, 1]. Group [10, 10, 40]: mean 20,
    # std √((100 + 100 + 400) / 2) = √300 → [-10, -10, 20] / √300.
    returns = torch.tensor([[1.0, 2.0, 3.0], [10.0, 10.0, 40.0]])
    expected = torch.tensor([[-1.0, 0.0, 1.0], [-10 / math.sqrt(300), -10 / math.sqrt(300), 20 / math.sqrt(300)]])
    torch.testing.assert_close(adv.group_outcome(returns, eps=0.0), expected)


def test_tied_groups_give_exactly_zero_never_nan() -> None:
    # 0.1 · 3 = 0.30000000000000004 in floating point, so mean − R is not exactly 0 for the tie
    # [0.1, 0.1, 0.1]; divided by ε that rounding noise would become a large advantage.
    returns = torch.tensor([[0.1, 0.1, 0.1], [5.0, 5.0, 5.0], [1.0, 2.0, 3.0]], dtype=torch.float64)
    for scorer in (adv.group_outcome, adv.group_no_std, adv.group_batch_std, adv.group_rloo):
        scores = scorer(returns)
        assert torch.equal(scores[:2], torch.zeros(2, 3, dtype=torch.float64)), scorer.__name__
        assert torch.isfinite(scores).all()


def test_group_of_two() -> None:
    # G = 2: [0, 4]: mean 2, Bessel std √8 → ∓2/√8 = ∓1/√2; RLOO: R − the other one → [-4, 4].
    returns = torch.tensor([[0.0, 4.0]])
    torch.testing.assert_close(adv.group_outcome(returns, eps=0.0), torch.tensor([[-(0.5**0.5), 0.5**0.5]]))
    torch.testing.assert_close(adv.group_rloo(returns), torch.tensor([[-4.0, 4.0]]))
    torch.testing.assert_close(adv.group_no_std(returns), torch.tensor([[-2.0, 2.0]]))


def test_rloo_by_hand() -> None:
    # [1, 2, 6]: baselines (2+6)/2 = 4, (1+6)/2 = 3.5, (1+2)/2 = 1.5 → [-3, -1.5, 4.5] = 3/2 · (R − 3).
    torch.testing.assert_close(adv.group_rloo(torch.tensor([[1.0, 2.0, 6.0]])), torch.tensor([[-3.0, -1.5, 4.5]]))


def test_batch_std_uses_one_std_for_all_groups() -> None:
    # Returns [0, 2] and [10, 12]: group means 1 and 11; the std of all four, √(224/3 − ...) by hand:
    # mean 6, squared deviations 36, 16, 16, 36 → 104 / 3.
    returns = torch.tensor([[0.0, 2.0], [10.0, 12.0]])
    std = math.sqrt(104 / 3)
    torch.testing.assert_close(adv.group_batch_std(returns, eps=0.0), torch.tensor([[-1.0, 1.0], [-1.0, 1.0]]) / std)


def test_process_supervision_by_hand() -> None:
    # One group of G = 2, T = 3. Member 0 ran 3 steps with rewards [1, 0, 1]; member 1 ran 2 steps with
    # [0, 0] (its third step is after its episode ended: masked). Valid rewards 1, 0, 1, 0, 0: mean 0.4,
    # Bessel std √((0.36·2 + 0.16·3) / 4) = √0.3. r̃ = (r − 0.4)/√0.3: 0.6/√0.3 for a 1, −0.4/√0.3 for a 0.
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 7.0]]).view(3, 1, 2)
    mask = torch.tensor([[True, True], [True, True], [True, False]]).view(3, 1, 2)
    s = math.sqrt(0.3)
    expected = torch.tensor(
        [
            [(0.6 - 0.4 + 0.6) / s, (-0.4 - 0.4) / s],  # reward-to-go from t = 0
            [(-0.4 + 0.6) / s, -0.4 / s],
            [0.6 / s, 0.0],
        ]
    ).view(3, 1, 2)
    torch.testing.assert_close(adv.group_process(rewards, mask, eps=0.0), expected)
    tied = adv.group_process(torch.full((3, 1, 2), 0.1), torch.ones(3, 1, 2, dtype=torch.bool))
    assert torch.equal(tied, torch.zeros(3, 1, 2))


def test_discounted_returns() -> None:
    rewards = torch.tensor([[1.0, 1.0], [1.0, 5.0], [1.0, 0.0]])
    mask = torch.tensor([[True, True], [True, True], [True, False]])
    torch.testing.assert_close(adv.discounted_returns(rewards, mask, 0.5), torch.tensor([1.75, 3.5]))


def test_step_baseline_by_hand_with_unequal_lengths_survival_rewards_and_discount() -> None:
    # One group of G = 3 with CartPole's +1 per step, lengths 3, 1, 2, γ = 0.5. Reward-to-go Q̂:
    # member 0: 1.75, 1.5, 1; member 1: 1, then 0 (ended); member 2: 1.5, 1, then 0.
    # A = Q̂ − mean of the other two: t = 0: 1.75 − 1.25, 1 − 1.625, 1.5 − 1.375; t = 1: 1.5 − 0.5, (ended),
    # 1 − 0.75; t = 2: 1 − 0, (ended), (ended). Rewards on ended steps (7) are ignored.
    mask = torch.tensor([[True, True, True], [True, False, True], [True, False, False]]).view(3, 1, 3)
    rewards = torch.where(mask, 1.0, 7.0)
    expected = torch.tensor([[0.5, -0.625, 0.125], [1.0, 0.0, 0.25], [1.0, 0.0, 0.0]]).view(3, 1, 3)
    torch.testing.assert_close(adv.group_step_baseline(rewards, mask, 0.5), expected)
    # The published process advantage erases the survival reward: identically 0 on the same group.
    assert torch.equal(adv.group_process(rewards, mask), torch.zeros(3, 1, 3))


def test_step_baseline_of_a_member_does_not_depend_on_its_own_trajectory() -> None:
    # Member 0's baseline Q̂ − A is the mean of the others' reward-to-go, whatever member 0 did or how long it ran.
    mask = torch.ones(4, 1, 3, dtype=torch.bool)
    rewards = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [1.0, 1.0, 1.0], [5.0, 0.0, 2.0]]).view(4, 1, 3)
    short = mask.clone()
    short[1:, 0, 0] = False  # member 0 ends after one step instead of four
    baselines = []
    for m in (mask, short):
        A = adv.group_step_baseline(rewards, m, 1.0)
        to_go = (rewards * m).flip(0).cumsum(0).flip(0)
        baselines.append((to_go - A)[:, 0, 0])
    # Others' reward-to-go: member 1 has 5, 4, 1, 0 and member 2 has 4, 4, 3, 2.
    torch.testing.assert_close(baselines[0], torch.tensor([4.5, 4.0, 2.0, 1.0]))
    assert baselines[1][0] == baselines[0][0]  # the step both versions of member 0 took


def test_step_baseline_ties_give_zero_and_discount_one_compares_plain_sums() -> None:
    tied = adv.group_step_baseline(torch.full((3, 2, 4), 0.3), torch.ones(3, 2, 4, dtype=torch.bool), 0.9)
    assert torch.equal(tied, torch.zeros(3, 2, 4))
    # G = 2, one step each: A = r_i − r_j, the RLOO advantage.
    rewards = torch.tensor([[1.0, 4.0]]).view(1, 1, 2)
    torch.testing.assert_close(
        adv.group_step_baseline(rewards, torch.ones(1, 1, 2, dtype=torch.bool), 1.0),
        torch.tensor([[-3.0, 3.0]]).view(1, 1, 2),
    )
    with pytest.raises(ValueError, match="G >= 2"):
        adv.group_step_baseline(torch.zeros(2, 1, 1), torch.ones(2, 1, 1, dtype=torch.bool), 1.0)


def test_step_baseline_ties_are_exact_where_rounding_would_leave_noise() -> None:
    # Eight CartPole members that all survive 6 steps: Q̂ ties at every step, but (8·Q̂ − Q̂)/7 rounds away
    # from Q̂ in float32 (by up to 4.8e-7 here). The tie must give exactly 0, and GRPO's batch-wide scale
    # must keep a wholly tied batch at 0 rather than blow that noise up to order 1.
    rewards, mask = torch.ones(6, 4, 8), torch.ones(6, 4, 8, dtype=torch.bool)
    to_go = adv.group_step_baseline(rewards, mask, 0.99)
    assert torch.equal(to_go, torch.zeros(6, 4, 8))
    # A step where only some members tie keeps its signal: member 0 ends after step 0, the rest run on.
    mask[1:, 0, 0] = False
    partly = adv.group_step_baseline(rewards, mask, 0.99)
    assert partly[0, 0, 0] < 0 and (partly[0, 0, 1:] > 0).all()


# ── group_step_alive: the per-step baseline over the members still alive, normalized per time index ──


def test_group_step_alive_hand_values_with_unequal_lengths() -> None:
    # γ = 0.5, one group of 3. Member 0 lives 2 steps with rewards (1, 4), member 1 one step (3), member 2 two
    # steps (0, 2). Q̂: m0 = (1 + 0.5·4, 4) = (3, 4); m1 = (3, –); m2 = (0 + 0.5·2, 2) = (1, 2).
    # t = 0, all alive: Q̂ = (3, 3, 1), mean 7/3, centred (2/3, 2/3, −4/3), population std √(24/27) = 0.942809;
    #   A = (0.707107, 0.707107, −1.414214).
    # t = 1, alive {0, 2}: Q̂ = (4, 2), mean 3, std 1: A = (1, −1); member 1 has ended: 0.
    rewards = torch.tensor([[[1.0, 3.0, 0.0]], [[4.0, 0.0, 2.0]]])  # (T=2, B=1, G=3)
    mask = torch.tensor([[[True, True, True]], [[True, False, True]]])
    expected = torch.tensor([[[0.707107, 0.707107, -1.414214]], [[1.0, 0.0, -1.0]]])
    torch.testing.assert_close(adv.group_step_alive(rewards, mask, 0.5), expected, atol=1e-5, rtol=0)


def test_group_step_alive_does_not_credit_outliving_the_others_once_the_survival_reward_is_offset() -> None:
    # Hopper's case: 1 per step for staying alive. Lengths 3, 2, 1 (γ = 1).
    mask = torch.tensor([[[True, True, True]], [[True, True, False]], [[True, False, False]]])  # (3, 1, 3)
    alive_bonus = mask.float()
    # The per-step baseline over all members counts the ended one as 0: at t = 1 the survivors get
    # Q̂ − mean of the others = (2 − (1 + 0)/2, 1 − (2 + 0)/2) = (1.5, 0): surviving is what earns.
    torch.testing.assert_close(adv.group_step_baseline(alive_bonus, mask, 1.0)[1, 0, :2], torch.tensor([1.5, 0.0]))
    # Over the alive members, t = 1 compares only members 0 and 1 on what is still to come: (2, 1) → (1, −1);
    # t = 2 has one member alive, no one to compare with: 0.
    alive = adv.group_step_alive(alive_bonus, mask, 1.0)
    torch.testing.assert_close(alive[1, 0, :2], torch.tensor([1.0, -1.0]), atol=1e-5, rtol=0)
    assert alive[2].abs().sum() == 0
    # With the bonus offset away (r − 1 = 0 on every step) nothing is left to credit at all.
    assert adv.group_step_alive(alive_bonus - 1.0, mask, 1.0).abs().sum() == 0
    with pytest.raises(ValueError, match="G >= 2"):
        adv.group_step_alive(torch.zeros(2, 1, 1), torch.ones(2, 1, 1, dtype=torch.bool), 1.0)


# ── group_step_horizon: the per-step baseline of the rewards in excess of the group's rate ──────────


def test_group_step_horizon_hand_values_with_unequal_lengths_and_discount() -> None:
    # γ = 0.5, one group of G = 2. Member 0: rewards (2, 2, 2), length 3; member 1: (1, 3), length 2 (its third
    # reward, 9, is past its end and ignored). r̄ = (2 + 2 + 2 + 1 + 3) / 5 = 2, so r − r̄: m0 (0, 0, 0),
    # m1 (−1, 1). Their reward-to-go f: m0 (0, 0, 0); m1 (−1 + 0.5·1, 1) = (−0.5, 1), then 0 (ended).
    # A = f − the other's f: m0 (0 + 0.5, 0 − 1, 0 − 0) = (0.5, −1, 0); m1 (−0.5 − 0, 1 − 0, ended) = (−0.5, 1, 0).
    # The same by the baseline's other form, member 1 at t = 0: Q̂ = 1 + 0.5·3 = 2.5, h(2) = 1.5, so
    # f = 2.5 − 1.5·2 = −0.5. (group_step_baseline gives (1, 0, 2) and (−1, 0, 0): member 0 is credited for
    # outliving member 1.)
    rewards = torch.tensor([[2.0, 1.0], [2.0, 3.0], [2.0, 9.0]]).view(3, 1, 2)
    mask = torch.tensor([[True, True], [True, True], [True, False]]).view(3, 1, 2)
    expected = torch.tensor([[0.5, -0.5], [-1.0, 1.0], [0.0, 0.0]]).view(3, 1, 2)
    torch.testing.assert_close(adv.group_step_horizon(rewards, mask, 0.5), expected)
    torch.testing.assert_close(
        adv.group_step_baseline(rewards, mask, 0.5), torch.tensor([[1.0, -1.0], [0.0, 0.0], [2.0, 0.0]]).view(3, 1, 2)
    )


def test_group_step_horizon_hand_values_leave_one_out_over_three_members() -> None:
    # γ = 1, G = 3. m0: (1, 1, 1), length 3; m1: (3, 1), length 2; m2: (2), length 1. r̄ = 9 / 6 = 1.5.
    # r − r̄: m0 (−0.5, −0.5, −0.5); m1 (1.5, −0.5); m2 (0.5). f (reward-to-go): m0 (−1.5, −1, −0.5); m1 (1, −0.5, 0);
    # m2 (0.5, 0, 0). A = f − mean of the other two's f:
    # t = 0: −1.5 − (1 + 0.5)/2 = −2.25; 1 − (−1.5 + 0.5)/2 = 1.5; 0.5 − (−1.5 + 1)/2 = 0.75;
    # t = 1: −1 − (−0.5 + 0)/2 = −0.75; −0.5 − (−1 + 0)/2 = 0; m2 ended: 0;
    # t = 2: −0.5 − (0 + 0)/2 = −0.5; m1, m2 ended: 0.
    rewards = torch.tensor([[1.0, 3.0, 2.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]).view(3, 1, 3)
    mask = torch.tensor([[True, True, True], [True, True, False], [True, False, False]]).view(3, 1, 3)
    expected = torch.tensor([[-2.25, 1.5, 0.75], [-0.75, 0.0, 0.0], [-0.5, 0.0, 0.0]]).view(3, 1, 3)
    torch.testing.assert_close(adv.group_step_horizon(rewards, mask, 1.0), expected)


def test_group_step_horizon_absorbs_a_constant_reward_and_a_survival_bonus() -> None:
    # A group paid the same reward every step (CartPole's +1, 0.1 here, whose mean rounds in float32) gives exactly
    # 0, however long each member lived; group_step_baseline credits the longest-lived.
    mask = torch.tensor([[True] * 4, [True, True, True, False], [True, False, True, False]]).view(3, 1, 4)
    constant = torch.where(mask, 0.1, 5.0)
    assert torch.equal(adv.group_step_horizon(constant, mask, 0.99), torch.zeros(3, 1, 4))
    assert adv.group_step_baseline(constant, mask, 0.99).abs().sum() > 0
    # A survival bonus added to every valid step of every member leaves the advantages as they were.
    rewards = torch.tensor([[0.5, -1.0, 2.0, 0.0], [1.0, 0.3, -0.2, 0.0], [-0.4, 0.0, 0.7, 0.0]]).view(3, 1, 4)
    with_bonus = rewards + 5.0 * mask
    torch.testing.assert_close(
        adv.group_step_horizon(with_bonus, mask, 0.99), adv.group_step_horizon(rewards, mask, 0.99), atol=1e-5, rtol=0
    )
    with pytest.raises(ValueError, match="G >= 2"):
        adv.group_step_horizon(torch.zeros(2, 1, 1), torch.ones(2, 1, 1, dtype=torch.bool), 1.0)
