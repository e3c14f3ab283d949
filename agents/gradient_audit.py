"""How well a policy gradient estimated from one batch agrees with the true one. Imports only torch.

The gradient audit (``agents/true_gradient.py``) sits beside the advantage audit: where that one scores
advantages Â_n against the true A_n, this one scores the policy gradient ĝ that the advantages of an estimator
produce on a batch against the true gradient g of the same surrogate. As Ilyas et al. 2020 ("A Closer Look at
Deep Policy Gradients", arXiv 1811.02553) it reports the cosine similarity and the relative error ‖ĝ − g‖/‖g‖;
as Tucker et al. 2018 ("The Mirage of Action-Dependent Baselines", arXiv 1802.10031) it splits the variance
of the per-sample gradient into the parts that come from the state, the action and the rest of the trajectory.

Gradients are flat vectors (P,) over the policy's parameters. Time index: sample j is a step (s_j, a_j) of an
on-policy episode, at whatever step t it was taken; Â_j is the advantage of a_j at s_j.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def cosine_similarity(estimate: Tensor, truth: Tensor) -> float | None:
    """cos(ĝ, g) = ⟨ĝ, g⟩ / (‖ĝ‖ · ‖g‖)   (Ilyas et al. 2020, §3.1).

    Symbols: ĝ the estimated gradient (``estimate``, (P,)), g the true one (``truth``, (P,)). 1: the same
    direction; 0: orthogonal; −1: opposite. Blind to the scale, so it also judges estimators whose advantages
    are normalized. None when either vector is 0 (no direction to compare).
    """
    _check_pair("cosine_similarity", estimate, truth)
    estimate, truth = estimate.to(torch.float64), truth.to(torch.float64)
    norms = float(estimate.norm() * truth.norm())
    return float(estimate @ truth) / norms if norms > 0 else None


def relative_error(estimate: Tensor, truth: Tensor) -> float | None:
    """‖ĝ − g‖ / ‖g‖   (Ilyas et al. 2020, §3.1): 0 for the true gradient, 1 for ĝ = 0, in ĝ's own units.

    None when g = 0 (no scale to be relative to).
    """
    _check_pair("relative_error", estimate, truth)
    estimate, truth = estimate.to(torch.float64), truth.to(torch.float64)
    scale = float(truth.norm())
    return float((estimate - truth).norm()) / scale if scale > 0 else None


def mean_and_standard_error(terms: Tensor, clusters: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The mean of N per-sample vectors and its standard error per coordinate, clustered:

        ḡ = (1/N) Σ_n g_n
        SE² = C/(C − 1) · Σ_c (S_c − N_c · ḡ)² / N²,     S_c = Σ_{n ∈ c} g_n,   N_c = |c|

    Symbols:
        g_n    sample n's vector (a gradient, or A_n ∇log π(a_n|s_n))     ``terms``     (N, P)
        c      the cluster of sample n: samples in one cluster may be     ``clusters``  (N,) int, or None
               correlated (steps of one episode, episodes of one start state), clusters are independent
        C      the number of clusters (at least 2)

    The cluster-robust (sandwich) variance of a ratio mean. With one sample per cluster (``clusters`` None:
    independent samples, e.g. K independent batch gradients) it is the usual SE² = s²/N, s² with Bessel's
    correction. Returns (ḡ, SE), each (P,).
    """
    if terms.dim() != 2 or terms.shape[0] < 2:
        raise ValueError(f"mean_and_standard_error: terms must be (N, P) with N >= 2, got {tuple(terms.shape)}")
    terms = terms.to(torch.float64)
    N = terms.shape[0]
    if clusters is None:
        clusters = torch.arange(N)
    if clusters.shape != (N,):
        raise ValueError(f"mean_and_standard_error: clusters must be ({N},), got {tuple(clusters.shape)}")
    mean = terms.mean(0)  # (P,)
    _, index = torch.unique(clusters, return_inverse=True)
    C = int(index.max()) + 1
    if C < 2:
        raise ValueError("mean_and_standard_error: the samples must come from at least 2 clusters")
    sums = terms.new_zeros(C, terms.shape[1]).index_add_(0, index, terms)  # (C, P) S_c
    sizes = torch.bincount(index, minlength=C).to(torch.float64)  # (C,) N_c
    residuals = sums - sizes.unsqueeze(1) * mean  # (C, P)
    return mean, (C / (C - 1) * residuals.pow(2).sum(0)).sqrt() / N


def surrogate(log_probs: Tensor, advantages: Tensor, mask: Tensor | None = None) -> Tensor:
    """The policy-gradient surrogate of a batch, the mean over its valid samples:

        L(θ) = (1/|𝒥|) Σ_{j ∈ 𝒥} Â_j · log π_θ(a_j|s_j),      𝒥 = {j : mask_j}

    Symbols: log π_θ(a_j|s_j) ``log_probs`` (any shape, with its graph to θ), Â_j ``advantages`` (same shape,
    held constant), ``mask`` (same shape, bool) the samples that count (all if None).

    Its gradient ∇θ L = (1/|𝒥|) Σ_j Â_j ∇θ log π_θ(a_j|s_j) is the policy-gradient estimator (Williams 1992,
    with advantages in place of returns). At θ = θ_old it is also the gradient of PPO's clipped objective
    mean_j min(ρ_j Â_j, clip(ρ_j, 1 − ε, 1 + ε) Â_j), ρ_j = π_θ/π_θold: there ρ_j = 1 is inside the clip range,
    so min picks ρ_j Â_j for every j (both terms are equal and the unclipped one carries the gradient), and
    ∇θ ρ_j = ρ_j ∇θ log π_θ(a_j|s_j) = ∇θ log π_θ(a_j|s_j).
    """
    if log_probs.shape != advantages.shape or (mask is not None and mask.shape != log_probs.shape):
        raise ValueError(f"surrogate: log_probs {tuple(log_probs.shape)}, advantages and mask must share one shape")
    if mask is None:
        mask = torch.ones_like(log_probs, dtype=torch.bool)
    count = int(mask.sum())
    if count == 0:
        raise ValueError("surrogate: no valid sample in the batch")
    return torch.where(mask, advantages.detach() * log_probs, 0.0).sum() / count


def flat_gradient(objective: Tensor, parameters: Sequence[Tensor], retain_graph: bool = False) -> Tensor:
    """∇θ of a scalar objective, the parameters' gradients flattened and concatenated in order: (P,).

    A parameter the objective does not reach gets zeros; ``retain_graph`` keeps the graph for another one."""
    grads = torch.autograd.grad(objective, list(parameters), retain_graph=retain_graph, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(grads, parameters)])


def variance_split(gradients: Tensor) -> dict[str, float]:
    """Tucker et al.'s split (2018, §3, eq. 3) of the variance of the per-sample gradient estimator
    g = Â(s, a, τ) ∇θ log π(a|s) by the law of total variance, from nested samples:

        Var[g] = Var_s[E_{a,τ}[g|s]]  +  E_s[Var_a[E_τ[g|s,a] | s]]  +  E_{s,a}[Var_τ[g|s,a]]
                 state                   action                          trajectory

    Symbols: s a state from the batch's state distribution, a ~ π(·|s), τ the randomness of the trajectory
    after (s, a) (the future states, actions and rewards that Â may read); ``gradients`` (S, M, R, P) holds
    g for S states, M actions drawn at each, R trajectories sampled after each (s, a). The variance of a
    vector is the trace of its covariance: the sum over the P coordinates.

    Estimated by the method of moments of a balanced nested design (unbiased; a part can come out
    negative by chance when it is small):

        W   = mean_{s,a} s²_τ(g_{s,a,·})                                      trajectory
        act = mean_s s²_a(ḡ_{s,a}) − W / R                                    action
        st  = s²_s(ḡ_s) − mean_s s²_a(ḡ_{s,a}) / M                            state

    with ḡ_{s,a} the mean over τ, ḡ_s the mean over (a, τ), s² the sample variance (Bessel's correction)
    summed over coordinates. An ĝ averaged over n independent samples has the variance Var[g] / n. A part
    whose factor is not sampled (M = 1 or R = 1) is not identified: the split needs M, R ≥ 2 and S ≥ 2.
    Returns the three parts and their sum ``total``.
    """
    if gradients.dim() != 4 or min(gradients.shape[:3]) < 2:
        raise ValueError(
            f"variance_split: gradients must be (S, M, R, P) with S, M, R >= 2, got {tuple(gradients.shape)}"
        )
    g = gradients.to(torch.float64)
    _, M, R, _ = g.shape  # (S, M, R, P)
    per_action = g.mean(2)  # (S, M, P) ḡ_{s,a}
    trajectory = float(g.var(2).sum(-1).mean())  # W
    spread_actions = float(per_action.var(1).sum(-1).mean())  # mean_s s²_a(ḡ_{s,a})
    action = spread_actions - trajectory / R
    state = float(per_action.mean(1).var(0).sum(-1)) - spread_actions / M
    return {"state": state, "action": action, "trajectory": trajectory, "total": state + action + trajectory}


def chain_return(cue_probabilities: Tensor, gamma: float, horizon: int) -> Tensor:
    """The chain task's expected discounted return J(θ) in closed form (``envs/tasks.py``):

        J(θ) = γ^{H−1} · ½ Σ_{x ∈ {0, 1}} (2 π_θ(x | s_0(x)) − 1)

    Symbols: x the cue, drawn uniformly at reset; π_θ(x | s_0(x)) the probability that the first action
    matches it (``cue_probabilities``, (2,), indexed by x, with its graph to θ); γ ``gamma``; H ``horizon``.
    Only a_0 matters: the last step, t = H − 1, pays +1 if a_0 = x and −1 otherwise, and the distractors are
    zero-mean and independent of the actions. So ∇θ J follows by autograd, and the audit's true gradient
    (steps drawn uniformly over episodes of exactly H steps, A^π = 0 after the first) is ∇θ J / H, or ∇θ J
    itself when only the first steps are sampled.
    """
    if cue_probabilities.shape != (2,):
        raise ValueError(
            f"chain_return: cue_probabilities must be (2,), one per cue, got {tuple(cue_probabilities.shape)}"
        )
    return gamma ** (horizon - 1) * (2 * cue_probabilities - 1).mean()


def _check_pair(name: str, estimate: Tensor, truth: Tensor) -> None:
    if estimate.dim() != 1 or estimate.shape != truth.shape:
        raise ValueError(f"{name}: estimate {tuple(estimate.shape)} and truth {tuple(truth.shape)} must be one (P,)")
