"""Advantage estimators, one pure function per equation. Imports only torch.

Time-index convention: index t holds (s_t, a_t, r_t, flags of the step taken from s_t). ``next_values[t]``
is V(s_{t+1}), where s_{t+1} is the *true* next observation of that step: the final observation when the
step ended the episode, never the first observation of the following episode.
"""

from __future__ import annotations

import torch
from torch import Tensor


def gae(
    rewards: Tensor,
    values: Tensor,
    next_values: Tensor,
    terminated: Tensor,
    done: Tensor,
    gamma: float,
    lam: float,
) -> Tensor:
    """Generalized Advantage Estimation (Schulman et al. 2016, arXiv 1506.02438, eq. 16).

        δ_t = r_t + γ · (1 − terminated_t) · V(s_{t+1}) − V(s_t)
        A_t = δ_t + γ · λ · (1 − done_t) · A_{t+1},      A_T = 0

    Symbols:
        r_t            reward of the step taken at t                       ``rewards``      (T, N)
        V(s_t)         critic's value of the observation the step started  ``values``       (T, N)
        V(s_{t+1})     value of the true next observation (the final       ``next_values``  (T, N)
                       observation if the episode ended at t)
        terminated_t   the MDP ended at t: nothing to bootstrap            ``terminated``   (T, N) bool
        done_t         terminated_t or truncated_t: the episode stops,     ``done``         (T, N) bool
                       so A_t takes nothing from the next episode
        γ, λ           discount and GAE mixing factor                      ``gamma``, ``lam``

    A truncated step (done, not terminated) bootstraps from V of its true final observation: the time
    limit is not part of the MDP. λ = 0 gives the one-step TD error; λ = 1 gives the Monte-Carlo
    return minus V(s_t), bootstrapped only at truncation and at the end of the segment.

    Returns the advantages A, shape (T, N). Value targets are A + values.
    """
    if not (rewards.shape == values.shape == next_values.shape == terminated.shape == done.shape):
        raise ValueError(
            "gae: rewards, values, next_values, terminated and done must share one (T, N) shape, got "
            f"{[tuple(x.shape) for x in (rewards, values, next_values, terminated, done)]}"
        )
    deltas = rewards + gamma * next_values * (~terminated) - values  # (T, N)
    carry = gamma * lam * (~done).to(rewards.dtype)  # (T, N)
    # The recursion steps through the T rows one at a time, on NumPy views of the same CPU memory: the same
    # single-rounded float operations as torch's, bit for bit, without torch's microseconds of dispatch per call,
    # which a long segment whose advantages are recomputed every epoch pays thousands of times.
    advantages = torch.zeros(deltas.shape, dtype=deltas.dtype)  # (T, N)
    rows, delta_rows, carry_rows = (x.detach().cpu().numpy() for x in (advantages, deltas, carry))
    running = torch.zeros(deltas.shape[1:], dtype=deltas.dtype).numpy()  # (N,)  A_T = 0
    for t in range(deltas.shape[0] - 1, -1, -1):
        running = delta_rows[t] + carry_rows[t] * running
        rows[t] = running
    return advantages.to(deltas.device)


def normalize(advantages: Tensor, eps: float = 1e-8) -> Tensor:
    """Per-batch standardization: Â = (A − mean A) / (std A + ε), std with Bessel's correction as SB3."""
    if advantages.numel() < 2:
        return advantages - advantages.mean()
    return (advantages - advantages.mean()) / (advantages.std() + eps)


def normalize_rows(advantages: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """:func:`normalize` within each row, over the row's masked entries (one row per seed of a stack)::

        Â_j = (A_j − μ) / (σ + ε),   μ = Σ_j m_j A_j / n,   σ² = Σ_j m_j (A_j − μ)² / (n − 1),   n = Σ_j m_j

    m_j is ``mask`` (True where entry j is a sample). A row with fewer than 2 samples is only centred, as
    :func:`normalize` does.  advantages, mask (S, B) → (S, B); entries outside the mask are meaningless.
    """
    if advantages.shape != mask.shape:
        raise ValueError(f"normalize_rows: advantages {tuple(advantages.shape)} and mask {tuple(mask.shape)} differ")
    n = mask.sum(-1, keepdim=True)  # (S, 1)
    mean = torch.where(mask, advantages, 0.0).sum(-1, keepdim=True) / n.clamp(min=1)
    centred = advantages - mean
    variance = torch.where(mask, centred.pow(2), 0.0).sum(-1, keepdim=True) / (n - 1).clamp(min=1)
    return torch.where(n < 2, centred, centred / (variance.sqrt() + eps))


# ── group-relative advantages (GRPO and its variants) ──────────────────────────────────────────────
# Shapes: B start states (groups) × G members. R (B, G) is each member's return. A group whose
# returns all tie carries no signal: its advantages are exactly 0, never NaN or rounding noise.


def _ties(returns: Tensor) -> Tensor:
    """(B, 1) bool: every member of the group has the same return (compared exactly, not via the mean)."""
    return returns.amax(dim=1, keepdim=True) == returns.amin(dim=1, keepdim=True)


def _step_ties(rewards: Tensor, mask: Tensor) -> Tensor:
    """(1, B, 1) bool: every valid step reward of the group is the same (compared exactly).  (T, B, G) → (1, B, 1)."""
    highest = torch.where(mask, rewards, -torch.inf).amax(dim=(0, 2), keepdim=True)
    lowest = torch.where(mask, rewards, torch.inf).amin(dim=(0, 2), keepdim=True)
    return highest == lowest


def group_outcome(returns: Tensor, eps: float = 1e-6) -> Tensor:
    """DeepSeekMath's outcome-supervised GRPO advantage (Shao et al. 2024, arXiv 2402.03300, §4.1.2).

        A_{b,i} = (R_{b,i} − mean_j R_{b,j}) / (std_j R_{b,j} + ε)

    R (B, G): returns; std over the G members with Bessel's correction (as the reference code);
    ε avoids division by zero. Every step of trajectory i receives A_{b,i}. Returns (B, G).
    """
    if returns.dim() != 2 or returns.shape[1] < 2:
        raise ValueError(f"group_outcome: returns must be (B, G) with G >= 2, got {tuple(returns.shape)}")
    centered = returns - returns.mean(dim=1, keepdim=True)
    advantages = centered / (returns.std(dim=1, keepdim=True) + eps)
    return advantages.masked_fill(_ties(returns), 0.0)


def group_no_std(returns: Tensor) -> Tensor:
    """Dr. GRPO (Liu et al. 2025, arXiv 2503.20783): A_{b,i} = R_{b,i} − mean_j R_{b,j}, no std scaling,
    which otherwise up-weights groups whose returns barely differ. R (B, G) → (B, G)."""
    if returns.dim() != 2 or returns.shape[1] < 2:
        raise ValueError(f"group_no_std: returns must be (B, G) with G >= 2, got {tuple(returns.shape)}")
    return (returns - returns.mean(dim=1, keepdim=True)).masked_fill(_ties(returns), 0.0)


def group_batch_std(returns: Tensor, eps: float = 1e-6) -> Tensor:
    """Group mean as baseline, one std for the whole batch (Hu 2025, REINFORCE++ style):

        A_{b,i} = (R_{b,i} − mean_j R_{b,j}) / (std_{b',j} R_{b',j} + ε)

    R (B, G) → (B, G); std over all B·G returns, with Bessel's correction."""
    centered = group_no_std(returns)
    return centered / (returns.std() + eps)


def group_rloo(returns: Tensor) -> Tensor:
    """REINFORCE leave-one-out (Ahmadian et al. 2024, arXiv 2402.14740): each member's baseline is the
    mean of the other G − 1 members' returns.

        A_{b,i} = R_{b,i} − (Σ_{j≠i} R_{b,j}) / (G − 1)  =  G / (G − 1) · (R_{b,i} − mean_j R_{b,j})

    R (B, G) → (B, G)."""
    G = returns.shape[1]
    if returns.dim() != 2 or G < 2:
        raise ValueError(f"group_rloo: returns must be (B, G) with G >= 2, got {tuple(returns.shape)}")
    others = (returns.sum(dim=1, keepdim=True) - returns) / (G - 1)
    return (returns - others).masked_fill(_ties(returns), 0.0)


def group_process(rewards: Tensor, mask: Tensor, eps: float = 1e-6) -> Tensor:
    """DeepSeekMath's process-supervised advantage (§4.1.3): normalize every step reward over all steps of
    the group, then give each step the sum of the normalized rewards from that step on.

        r̃_{b,i,t} = (r_{b,i,t} − mean(r_b)) / (std(r_b) + ε)      over the valid steps of group b
        A_{b,i,t} = Σ_{t' ≥ t} r̃_{b,i,t'}                          (undiscounted reward-to-go)

    rewards, mask: (T, B, G), mask True on a member's valid steps (before its episode ended).
    Returns (T, B, G), zero on invalid steps and for groups whose step rewards all tie.

    Made for language models, whose episodes have one reward model and similar lengths, it carries three
    flaws into control, kept here as published (``group_step_baseline`` is the estimator without them):
    - it erases constant rewards: CartPole's +1 per step normalizes to 0 everywhere, so surviving
      longer earns nothing;
    - it is biased when lengths differ: the mean subtracted from each step is the group's mean reward
      per step, so a member's advantage grows with the number of steps it has left, whatever their
      rewards, and the mean depends on the member's own length;
    - it ignores γ: the reward-to-go is an undiscounted sum.
    """
    if rewards.shape != mask.shape or rewards.dim() != 3:
        raise ValueError("group_process: rewards and mask must share one (T, B, G) shape")
    weights = mask.to(rewards.dtype)
    count = weights.sum(dim=(0, 2), keepdim=True).clamp(min=1.0)  # (1, B, 1)
    mean = (rewards * weights).sum(dim=(0, 2), keepdim=True) / count
    var = ((rewards - mean) ** 2 * weights).sum(dim=(0, 2), keepdim=True) / (count - 1).clamp(min=1.0)
    normalized = (rewards - mean) / (var.sqrt() + eps) * weights  # (T, B, G)
    # Ties over a group's steps give exactly zero rather than (r − mean) rounding noise divided by ε.
    normalized = normalized.masked_fill(_step_ties(rewards, mask), 0.0)
    return normalized.flip(0).cumsum(0).flip(0) * weights


def group_step_baseline(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Per-step group baseline: each step's discounted reward-to-go against the reward-to-go of the other
    members of its group at the same time step (a leave-one-out baseline, as RLOO, taken per step).

        Q̂_{b,i,t} = Σ_{t'=t}^{L_{b,i} − 1} γ^{t'−t} r_{b,i,t'}           0 once t ≥ L_{b,i}
        A_{b,i,t} = Q̂_{b,i,t} − 1/(G − 1) · Σ_{j≠i} Q̂_{b,j,t}

    Symbols:
        r_{b,i,t}   reward of step t of member i of group b                ``rewards``  (T, B, G)
        L_{b,i}     its episode's length (the valid steps)                 ``mask``     (T, B, G) bool
        γ           discount                                               ``gamma``
        G           members per group, all from one start state

    A member whose episode has ended by step t contributes Q̂ = 0: an ended episode earns no more reward.
    Its ending counts as an outcome, so on CartPole (+1 per step) a member that outlives the others gets
    positive advantages, and one that falls first negative ones. Comparing at the same t compares members
    with the same time left before the time limit, so a truncation is judged against equals.

    Why the estimate does not depend on the member's own future length: the baseline of member i is
    built only from the other members, which were sampled independently of i's actions. It is therefore
    independent of a_{b,i,t}, of what follows, and of how long i's own episode runs, and
    E[∇ log π(a_{b,i,t} | s_{b,i,t}) · baseline] = 0: A is an unbiased estimate of the advantage up to a
    term that does not depend on a_{b,i,t}. A baseline that included i's own reward-to-go (the plain
    group mean) would shrink every advantage by (G − 1)/G; one that normalized over the group's steps
    (``group_process``) would move with i's own length.

    Returns (T, B, G), zero on invalid steps and, exactly, at every step where the group's Q̂ all tie.
    """
    if rewards.shape != mask.shape or rewards.dim() != 3 or rewards.shape[2] < 2:
        raise ValueError("group_step_baseline: rewards and mask must share one (T, B, G) shape with G >= 2")
    G = rewards.shape[2]
    earned = rewards * mask  # (T, B, G)
    to_go = torch.zeros_like(earned)  # Q̂ (T, B, G)
    running = torch.zeros_like(earned[0])  # (B, G)
    for t in range(earned.shape[0] - 1, -1, -1):
        running = earned[t] + gamma * running
        to_go[t] = running
    others = (to_go.sum(dim=2, keepdim=True) - to_go) / (G - 1)  # (T, B, G)
    # Where every member's Q̂ ties, (G·Q̂ − Q̂)/(G − 1) can round away from Q̂: give exactly 0, not rounding noise
    # that a batch-wide scale would blow up when the whole batch ties.
    tied = to_go.amax(dim=2, keepdim=True) == to_go.amin(dim=2, keepdim=True)  # (T, B, 1)
    return (to_go - others).masked_fill(tied, 0.0) * mask


def group_step_horizon(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Horizon-aware per-step group baseline: the critic-free analogue of Tucker et al.'s horizon-aware value
    (2018, "The Mirage of Action-Dependent Baselines", arXiv 1802.10031, §5), V(s, t) = f(s) + h(T − t) · r̄(s):
    a reward rate times the discounted time left, plus what the rate does not explain. Here r̄ is the group's
    reward per step, the time left is each member's own, and f is compared as :func:`group_step_baseline` does.

        r̄_b       = Σ_{j,t} m_{b,j,t} r_{b,j,t} / Σ_{j,t} m_{b,j,t}            the group's reward per step
        h(n)      = Σ_{k=0}^{n−1} γ^k = (1 − γ^n) / (1 − γ)                    (n when γ = 1; 0 for n ≤ 0)
        Q̂_{b,i,t} = Σ_{t'=t}^{L_{b,i} − 1} γ^{t'−t} r_{b,i,t'}                 0 once t ≥ L_{b,i}
        f_{b,i,t} = Q̂_{b,i,t} − h(L_{b,i} − t) · r̄_b                          what the rate does not explain
        A_{b,i,t} = f_{b,i,t} − 1/(G − 1) · Σ_{j≠i} f_{b,j,t}
                  = Q̂_{b,i,t} − [ h(L_{b,i} − t) · r̄_b + 1/(G − 1) · Σ_{j≠i} f_{b,j,t} ]     (the baseline)

    Symbols:
        r_{b,i,t}   reward of step t of member i of group b                ``rewards``  (T, B, G)
        L_{b,i}     its episode's length (the valid steps)                 ``mask``     (T, B, G) bool
        m_{b,i,t}   1 on a valid step (t < L_{b,i}), else 0
        γ           discount                                               ``gamma``
        G           members per group, all from one start state

    Equivalently: ``group_step_baseline`` of the rewards less the group's rate, r − r̄_b on every valid step.
    A constant reward per step is absorbed: a group paid c a step, whatever its members' lengths, gets exactly
    0; a survival bonus c added to every step of every member leaves A as it was (r̄_b grows by c too), as does
    ``reward_offset``. The time left h(L_{b,i} − t) is the member's own: h(T − t) for a member that runs to
    the time limit T, less for one whose episode terminates.

    What it estimates: the advantage of the rewards in excess of the group's rate. Surviving longer earns
    nothing by itself, only what a member earns above the group's rate in its extra steps; ending early costs
    only the above-rate rewards it forgoes (a member that earns below the rate gains by ending sooner: ARS's
    offset, with the offset estimated per group instead of set by hand). The baseline reads the member's own
    length L_{b,i}, and its rewards enter r̄_b, so unlike ``group_step_baseline`` it is not an unbiased
    estimate of the advantage of the env's own reward.

    Returns (T, B, G), zero on invalid steps, in a group whose valid rewards all tie, and at every step where
    the group's f all tie.
    """
    if rewards.shape != mask.shape or rewards.dim() != 3 or rewards.shape[2] < 2:
        raise ValueError("group_step_horizon: rewards and mask must share one (T, B, G) shape with G >= 2")
    weights = mask.to(rewards.dtype)  # (T, B, G)
    count = weights.sum(dim=(0, 2), keepdim=True)  # (1, B, 1)
    rate = (rewards * weights).sum(dim=(0, 2), keepdim=True) / count.clamp(min=1.0)  # r̄_b (1, B, 1)
    # A group whose valid rewards all tie gets exactly r − r̄ = 0, not the rounding of Σ r / n away from r.
    excess = torch.where(_step_ties(rewards, mask), 0.0, rewards - rate)  # r − r̄_b (T, B, G)
    return group_step_baseline(excess, mask, gamma)


def group_step_alive(rewards: Tensor, mask: Tensor, gamma: float, eps: float = 1e-6) -> Tensor:
    """Per-step group advantage over the members still alive, normalized per time index (the group-relative
    treatment of dense-reward control: compare a member only with the members that reached the same step).

        Q̂_{b,i,t} = Σ_{t'=t}^{L_{b,i} − 1} γ^{t'−t} r_{b,i,t'}
        𝒜_{b,t}   = {j : t < L_{b,j}}                                        members alive at step t
        A_{b,i,t} = (Q̂_{b,i,t} − mean_{j∈𝒜} Q̂_{b,j,t}) / (std_{j∈𝒜} Q̂_{b,j,t} + ε)     for i ∈ 𝒜_{b,t}

    Symbols:
        r_{b,i,t}   reward of step t of member i of group b                ``rewards``  (T, B, G)
        L_{b,i}     its episode's length (the valid steps)                 ``mask``     (T, B, G) bool
        γ           discount                                               ``gamma``
        std         population std over the alive members (divisor |𝒜|)
        ε           keeps a near-tied step finite                          ``eps``

    What it estimates, against ``group_step_baseline``: that one counts an ended member as reward-to-go 0,
    so with a reward for staying alive (Hopper's healthy reward) every survivor is credited for outliving
    the others, and a policy that only stands still earns the largest advantages. Here an ended member
    leaves the comparison: at step t a member is scored against those that also reached t, on the
    rewards still to come, so surviving longer than the others earns nothing by itself; what the members
    alive at t did differently from then on does. The cost: the baseline includes the member's own Q̂ and
    depends on which members are alive, which its own earlier actions helped decide, so it is not an
    unbiased advantage estimate; dividing by the std makes every time index weigh the same, late steps
    with few survivors included. A step with fewer than two members alive has no one to compare with and
    gets 0, as does a step where the alive members' Q̂ all tie.

    Returns (T, B, G), zero on invalid steps.
    """
    if rewards.shape != mask.shape or rewards.dim() != 3 or rewards.shape[2] < 2:
        raise ValueError("group_step_alive: rewards and mask must share one (T, B, G) shape with G >= 2")
    alive = mask.to(rewards.dtype)  # (T, B, G)
    earned = rewards * alive
    to_go = torch.zeros_like(earned)  # Q̂ (T, B, G)
    running = torch.zeros_like(earned[0])  # (B, G)
    for t in range(earned.shape[0] - 1, -1, -1):
        running = earned[t] + gamma * running
        to_go[t] = running
    count = alive.sum(dim=2, keepdim=True)  # |𝒜| (T, B, 1)
    mean = (to_go * alive).sum(dim=2, keepdim=True) / count.clamp(min=1)
    centered = (to_go - mean) * alive
    std = (centered.pow(2).sum(dim=2, keepdim=True) / count.clamp(min=1)).sqrt()
    scored = (count >= 2) & (std > 0)  # (T, B, 1)
    return torch.where(scored, centered / (std + eps), 0.0) * alive


def discounted_returns(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """R_i = Σ_t γ^t r_{i,t} over each trajectory's valid steps.  rewards, mask (T, M) → (M,)."""
    if rewards.shape != mask.shape:
        raise ValueError("discounted_returns: rewards and mask must share one (T, M) shape")
    discounts = gamma ** torch.arange(rewards.shape[0], dtype=rewards.dtype).unsqueeze(1)  # (T, 1)
    return (rewards * mask * discounts).sum(0)


def vine(rewards: Tensor, mask: Tensor, values: Tensor, interval: int, gamma: float) -> Tensor:
    """Advantages from Monte-Carlo values at vine points (TRPO's vine, Schulman et al. 2015; VinePPO,
    Kazemnejad et al. 2024, arXiv 2410.01679), one value every ``interval`` steps of each trajectory.

        A_t = Σ_{u=jm}^{jm+m−1} γ^{u−jm} r_u + γ^m · V̂_{j+1} − V̂_j,      j = ⌊t / m⌋

    Every step of segment j gets the segment's advantage: what the segment's steps earned, plus the
    value of where they led, minus the value of where they started. With m = 1 this is VinePPO's
    A_t = r_t + γ V̂(s_{t+1}) − V̂(s_t). For t > jm the baseline V̂_j, less the rewards already earned in
    the segment, is a function of the history before a_t, so the estimate stays unbiased.

    Symbols:
        r_u     reward of step u of a trajectory                          ``rewards``  (T, M)
        V̂_j     mean discounted return of K branches rolled out from the  ``values``   (J, M)
                state at step jm; 0 where jm is at or past the episode's
                end (an ended episode has no future rewards)
        m       steps between vine points                                 ``interval``
        γ       discount                                                  ``gamma``
        mask    True on a trajectory's steps before its episode ended     ``mask``     (T, M)

    Returns (T, M), zero on invalid steps. J must be ⌈T / m⌉ or more.
    """
    T, M = rewards.shape
    J = values.shape[0]
    if mask.shape != (T, M) or values.shape[1] != M or J * interval < T or interval < 1:
        raise ValueError("vine: rewards and mask (T, M), values (J, M) with J·interval ≥ T, interval ≥ 1")
    t = torch.arange(T)
    segment = t // interval  # (T,)
    weights = gamma ** (t - segment * interval).to(rewards.dtype)  # γ^{u−jm}, (T,)
    earned = torch.zeros(J, M, dtype=rewards.dtype).index_add_(0, segment, weights[:, None] * rewards * mask)
    next_values = torch.cat([values[1:], values.new_zeros(1, M)])  # V̂_{j+1}, (J, M)
    segment_advantages = earned + gamma**interval * next_values - values  # (J, M)
    return segment_advantages[segment] * mask
