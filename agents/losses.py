"""Policy-gradient losses, one pure function per equation. Imports only torch.

Every function returns per-sample terms; the caller chooses how to average them (PPO takes the mean
over the minibatch, GRPO's aggregation modes weight steps differently).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def clipped_surrogate(ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float) -> Tensor:
    """PPO's clipped surrogate loss per sample (Schulman et al. 2017, arXiv 1707.06347, eq. 7), negated.

        L_t = −min( ρ_t · Â_t ,  clip(ρ_t, 1 − ε_low, 1 + ε_high) · Â_t )

    Symbols:
        ρ_t = π_θ(a_t|s_t) / π_θold(a_t|s_t)   probability ratio            ``ratio``       (B,)
        Â_t                                     advantage estimate           ``advantages``  (B,)
        ε_low, ε_high                           clip range below and above   ``clip_low``, ``clip_high``
                                                1 (equal in PPO; DAPO's clip-higher makes ε_high larger)

    Why the minimum: the clipped term alone would stop the gradient whenever ρ leaves the trust
    region, also when the policy moved the wrong way. Taking the minimum of the clipped and unclipped
    objectives makes a pessimistic bound: a change that improves the objective gets no extra credit
    beyond the clip, while a change that makes it worse is always counted, so the gradient still pulls
    ρ back. Minimizing L therefore maximizes that lower bound.
    """
    if ratio.shape != advantages.shape:
        shapes = f"ratio {tuple(ratio.shape)} and advantages {tuple(advantages.shape)}"
        raise ValueError(f"clipped_surrogate: {shapes} differ")
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    return -torch.min(unclipped, clipped)


def decoupled_advantages(advantages: Tensor, proximal_log_probs: Tensor, behaviour_log_probs: Tensor) -> Tensor:
    """The advantages that make :func:`clipped_surrogate` the decoupled objective of Hilton et al. 2021
    ("Batch size-invariance for policy optimization", arXiv 2110.00641, §3), whose clip is centred on a
    proximal policy π_prox instead of the policy that collected the samples, π_behav:

        L_t = −w_t · min( ρ_t · Â_t ,  clip(ρ_t, 1 − ε_low, 1 + ε_high) · Â_t ),
        ρ_t = π_θ(a_t|s_t) / π_prox(a_t|s_t),     w_t = π_prox(a_t|s_t) / π_behav(a_t|s_t)

    w_t > 0, so w_t · min(ρ_t Â_t, clip(ρ_t) Â_t) = min(ρ_t · w_t Â_t, clip(ρ_t) · w_t Â_t): the clipped
    surrogate of the advantages Ã_t = w_t · Â_t, which this returns. w_t, the importance weight, keeps the
    objective an estimate for samples that an older policy collected; π_prox = π_behav gives w_t = 1.

    Symbols:
        Â_t                    advantage estimate                          ``advantages``           (B,)
        log π_prox(a_t|s_t)    the proximal policy's, where the clip sits  ``proximal_log_probs``   (B,)
        log π_behav(a_t|s_t)   the collecting policy's                     ``behaviour_log_probs``  (B,)
    """
    if not (advantages.shape == proximal_log_probs.shape == behaviour_log_probs.shape):
        raise ValueError("decoupled_advantages: advantages and both log-probabilities must share one shape")
    return torch.exp(proximal_log_probs - behaviour_log_probs) * advantages


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, clip_range_vf: float | None, take_max: bool = False
) -> Tensor:
    """Squared error of the critic per sample, optionally clipped: SB3's form (the clipped prediction's
    error) or, with ``take_max``, CleanRL's and OpenAI ppo2's (the larger of the two errors).

        unclipped:  (V_θ(s_t) − R_t)²
        clipped:    (V_old(s_t) + clip(V_θ(s_t) − V_old(s_t), −ε_v, ε_v) − R_t)²
        take_max:   max(unclipped, clipped)

    Symbols: V_θ the current critic ``values`` (B,); V_old the critic at collection ``old_values`` (B,);
    R_t = Â_t + V_old(s_t) the GAE value target ``returns`` (B,); ε_v ``clip_range_vf`` (None: no clip).
    CleanRL also halves the error; here ``vf_coef`` carries that factor (its 0.5 is our 0.25).
    """
    if not (values.shape == old_values.shape == returns.shape):
        raise ValueError("value_loss: values, old_values and returns must share one shape")
    if clip_range_vf is None:
        return (values - returns).pow(2)
    clipped = (old_values + torch.clamp(values - old_values, -clip_range_vf, clip_range_vf) - returns).pow(2)
    return torch.maximum(clipped, (values - returns).pow(2)) if take_max else clipped


def k1_kl(log_ratio: Tensor) -> Tensor:
    """Schulman's k1 estimator of KL(p ‖ q) from a sample x ~ p, per sample: unbiased, high variance, and
    negative for every sample where q(x) > p(x).

        k1 = −log r,     r = q(x) / p(x),     ``log_ratio`` = log q(x) − log p(x)

    E_{x~p}[k1] = E_p[log p − log q] = KL(p ‖ q) exactly.

    As a penalty *in the loss* (p = π_θ, q = π_ref, x ~ π_old) its gradient is E_{x~π_old}[∇ log π_θ(x)]:
    zero at π_θ = π_old, and π_ref does not enter it, so it exerts no pull toward the reference. An unbiased
    value is not an unbiased gradient; k1 does its work in the reward, as in RLHF PPO (Tang & Munos 2025,
    arXiv 2506.09477).
    """
    return -log_ratio


def k2_kl(log_ratio: Tensor) -> Tensor:
    """Schulman's k2 estimator of KL(p ‖ q) from a sample x ~ p, per sample: non-negative, low variance,
    biased.

        k2 = ½ (log r)²,     r = q(x) / p(x),     ``log_ratio`` = log q(x) − log p(x)

    E_{x~p}[k2] is an f-divergence that agrees with KL(p ‖ q) to second order as q → p and departs from it
    further away: for p = N(0, 1), q = N(μ, 1), E[k2] = μ²/2 + μ⁴/8 against KL = μ²/2.

    As a penalty in the loss (p = π_θ, q = π_ref, x ~ π_θ) its gradient E[(log π_θ − log π_ref) ∇ log π_θ] is
    exactly ∇ KL(π_θ ‖ π_ref): biased as a value, exact as an on-policy gradient.
    """
    return 0.5 * log_ratio.pow(2)


K3_LOG_RATIO_LIMIT = 20.0


def k3_kl(log_ratio: Tensor) -> Tensor:
    """Schulman's k3 estimator of KL(p ‖ q) from a sample x ~ p, per sample: unbiased and non-negative.

        k3 = (r − 1) − log r,     r = q(x) / p(x),     ``log_ratio`` = log q(x) − log p(x)

    PPO's approx_kl: x ~ π_old, q = π_θ, an estimate of KL(π_old ‖ π_θ).

    GRPO's penalty (DeepSeekMath eq. 4, as TRL computes it): r = π_ref(x) / π_θ(x), but x comes from
    π_old, the policy that collected the batch, not from π_θ. What that estimates:
    - its value, averaged over the batch, is an unbiased estimate of KL(π_θ ‖ π_ref) only while
      π_θ = π_old (the first minibatch of an iteration); afterwards it is E_{x~π_old}[k3], with no
      importance weight for π_θ / π_old;
    - its gradient is E_{x~π_old}[(1 − π_ref/π_θ) ∇ log π_θ(x)]. At π_θ = π_old this equals
      −Σ_x π_ref(x) ∇ log π_θ(x) = ∇ KL(π_ref ‖ π_θ): the gradient of the *reverse* direction of the
      KL the value estimates. Both pull π_θ toward π_ref and agree to first order when π_θ ≈ π_ref.
    So β · k3 is a penalty that keeps π_θ near π_ref, not the exact gradient of β · KL(π_θ ‖ π_ref).

    log r is clamped to [−20, 20] first (as verl's low-variance KL does): r = e^20 ≈ 5·10⁸ is far past any
    meaningful estimate, and float32's exp overflows at 88, where a policy whose σ has collapsed sends
    samples of π_old (an inf loss, then NaN parameters). Beyond the clamp a sample adds no gradient.
    """
    log_ratio = log_ratio.clamp(-K3_LOG_RATIO_LIMIT, K3_LOG_RATIO_LIMIT)
    return torch.expm1(log_ratio) - log_ratio


def clip_fraction(
    ratio: Tensor, clip_low: float | Tensor, clip_high: float | Tensor, mean: Callable[[Tensor], Tensor] = torch.mean
) -> tuple[Tensor, Tensor]:
    """Fractions of samples whose ratio lies below 1 − ε_low and above 1 + ε_high (diagnostics). ``mean``
    averages them: over every sample by default, or each seed's own (a stack's masked mean)."""
    return mean((ratio < 1.0 - clip_low).float()), mean((ratio > 1.0 + clip_high).float())


def explained_variance(predictions: Tensor, targets: Tensor) -> float:
    """1 − Var[y − ŷ] / Var[y]: 1 is a perfect critic, 0 no better than a constant; NaN when Var[y] = 0."""
    variance = targets.var()
    if variance == 0:
        return float("nan")
    return float(1.0 - (targets - predictions).var() / variance)


AGGREGATIONS = ("trajectory", "step", "constant")


def aggregate(per_step: Tensor, mask: Tensor, mode: str, horizon: int | None = None) -> Tensor:
    """Average a per-step loss over M trajectories of different lengths L_i. The modes weight steps
    differently, which decides how much a long episode counts against a short one:

        trajectory  (GRPO):      (1/M) Σ_i (1/L_i) Σ_t x_{i,t}    each trajectory weighs the same;
                                                                  a step of a short one weighs more
        step        (DAPO):      Σ_{i,t} x_{i,t} / Σ_i L_i        each step weighs the same
        constant    (Dr. GRPO):  Σ_{i,t} x_{i,t} / (M · H)        a fixed horizon H: no length bias

    per_step, mask: (T, M); mask True on valid steps. ``horizon`` H is needed for ``constant``.
    """
    if per_step.shape != mask.shape:
        raise ValueError(f"aggregate: per_step {tuple(per_step.shape)} and mask {tuple(mask.shape)} differ")
    weights = mask.to(per_step.dtype)
    total = (per_step * weights).sum(0)  # (M,)
    if mode == "trajectory":
        lengths = weights.sum(0)  # (M,)
        counted = lengths > 0  # a fully masked trajectory (say, a masked truncation) is left out
        return (total[counted] / lengths[counted]).sum() / counted.sum().clamp(min=1)
    if mode == "step":
        return total.sum() / weights.sum().clamp(min=1.0)
    if mode == "constant":
        if horizon is None or horizon < 1:
            raise ValueError("aggregate: mode 'constant' needs a positive horizon")
        return total.sum() / (per_step.shape[1] * horizon)
    raise ValueError(f"aggregate: unknown mode {mode!r}; choose one of {', '.join(AGGREGATIONS)}")


def aggregation_weights(
    mask: Tensor, mode: str, horizon: int | None = None, trajectories: Tensor | None = None
) -> Tensor:
    """The weight w_{i,t} that :func:`aggregate` gives each step, so that aggregate(x) = Σ_{i,t} w_{i,t} x_{i,t},
    for many minibatches at once (any leading axes, one aggregate each):

        trajectory:  w_{i,t} = m_{i,t} / (L_i · M')    M' = |{i : L_i > 0}|, trajectories with a valid step
        step:        w_{i,t} = m_{i,t} / Σ_j L_j
        constant:    w_{i,t} = m_{i,t} / (M · H)

    m_{i,t} ∈ {0, 1} is ``mask`` (…, T, M) and L_i = Σ_t m_{i,t}. M counts the columns where
    ``trajectories`` (…, M) is True (every column if None), so that padding columns do not count. The
    weighted sum equals :func:`aggregate` up to floating-point rounding.
    """
    weights = mask.to(torch.float32)  # (…, T, M)
    lengths = weights.sum(-2, keepdim=True)  # (…, 1, M)
    if mode == "trajectory":
        counted = (lengths > 0).sum(-1, keepdim=True).clamp(min=1)  # (…, 1, 1)  M'
        return weights / (lengths.clamp(min=1.0) * counted)
    if mode == "step":
        return weights / lengths.sum(-1, keepdim=True).clamp(min=1.0)
    if mode == "constant":
        if horizon is None or horizon < 1:
            raise ValueError("aggregation_weights: mode 'constant' needs a positive horizon")
        M = mask.shape[-1] if trajectories is None else trajectories.sum(-1)[..., None, None].clamp(min=1)
        return weights / (M * horizon)
    raise ValueError(f"aggregation_weights: unknown mode {mode!r}; choose one of {', '.join(AGGREGATIONS)}")
