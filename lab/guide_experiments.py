"""The guide's measured experiments that need no whole training run (docs/ppo_and_grpo.md).

Each one measures the testbed's own functions on a small, seeded problem and writes a figure (PNG) and,
where there are numbers to quote, a Markdown table: the clipped objective and one update without its
minimum, the update of a group whose returns tie, the weight each aggregation gives a step, the k1/k2/k3
estimators of a known KL, one group's advantages under every estimator, and the length bias of each
aggregation. ``lab/guide.py`` runs them beside the training runs and names every file.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor

from agents import advantages as adv
from agents import grpo, losses
from agents.config import resolve_config
from agents.groups import Groups, experience, group_advantages
from agents.networks import Actor, ActorCritic, StackedNetworks
from agents.optimizers import SeedOptimizer, adam
from lab.plot import new_figure

ENV = "CartPole-v1"
EPS = 0.2  # ε of the clip in every experiment, as in both presets


def legend(ax: Axes) -> None:
    """A small legend, where something on ``ax`` carries a label."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


def save_png(fig: Figure, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=110)
    return out


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a Markdown table; a ``|`` inside a cell is escaped."""

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    return [line(header), "|" + "---|" * len(header)] + [line(row) for row in rows]


Section = tuple[str, list[str], list[list[str]], str]
"""A further table under the first: its title, header, rows and note."""


def write_table(
    out: Path, title: str, header: list[str], rows: list[list[str]], note: str = "", sections: tuple[Section, ...] = ()
) -> Path:
    """A Markdown table with a title line and an optional note below it, then any further sections."""
    lines = [f"# {title}", "", *markdown_table(header, rows)] + (["", note] if note else [])
    for subtitle, sub_header, sub_rows, sub_note in sections:
        lines += ["", f"## {subtitle}", "", *markdown_table(sub_header, sub_rows), "", sub_note]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    return out


def grpo_groups(actor: Actor, seed: int, **settings: object) -> tuple[grpo.GRPOConfig, Groups, Actor]:
    """One GRPO collection on CartPole with ``actor``'s weights: the config, the groups and π_ref (the
    untrained policy, as at the start of a run)."""
    cfg, _ = resolve_config(grpo.GRPOConfig, "grpo", ENV, False, {"seed": seed, **settings})
    stack = grpo.Learner([cfg])
    try:
        stack.trainees[0].policy.load_state_dict(actor.state_dict())
        groups = stack.collect([0], [True])[0].batch
    finally:
        stack.close()
    return cfg, groups, copy.deepcopy(stack.trainees[0].networks["reference"])


def grpo_update(actor: Actor, reference: Actor, groups: Groups, cfg: grpo.GRPOConfig) -> dict[str, float | None]:
    """GRPO's own update (``grpo.update``, through a stack of one) of ``actor`` on ``groups``, at the config's
    learning rate, with π_ref ``reference``; returns its logged diagnostics."""
    stack = grpo.Learner([cfg])
    try:
        stack.trainees[0].model.load_state_dict(actor.state_dict())
        stack.trainees[0].networks["reference"].load_state_dict(reference.state_dict())
        [metrics] = stack.learn([experience(groups)], [1], [1.0], [cfg.learning_rate], [True])
        actor.load_state_dict(stack.trainees[0].model.state_dict())
    finally:
        stack.close()
    return metrics


# ── 1. the clipped objective, and an update without its minimum ────────────────────────────────────


def ppo_min(ratio: Tensor, A: Tensor) -> Tensor:
    """PPO: −min(ρA, clip(ρ, 1 − ε, 1 + ε)A), ``losses.clipped_surrogate``."""
    return losses.clipped_surrogate(ratio, A, EPS, EPS)


def clip_only(ratio: Tensor, A: Tensor) -> Tensor:
    """The clipped term alone, −clip(ρ, 1 − ε, 1 + ε)A: no gradient wherever ρ is outside the clip."""
    return -torch.clamp(ratio, 1 - EPS, 1 + EPS) * A


def unclipped(ratio: Tensor, A: Tensor) -> Tensor:
    """The importance-weighted policy gradient, −ρA: no trust region at all."""
    return -ratio * A


OBJECTIVES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "min (PPO, GRPO)": ppo_min,
    "clip only": clip_only,
    "no clip": unclipped,
}


def draw_clip_objective(out: Path) -> Path:
    """J(ρ) = −L(ρ) of the three objectives against ρ, for Â = +1 and Â = −1."""
    ratio = torch.linspace(0.0, 2.5, 501)
    fig, axes = new_figure(2, (5.0, 3.6))
    for ax, sign in zip(axes, (1.0, -1.0), strict=True):
        A = torch.full_like(ratio, sign)
        for (name, objective), style in zip(OBJECTIVES.items(), ("-", "--", ":"), strict=True):
            ax.plot(ratio, -objective(ratio, A), style, linewidth=2.2 if style == "-" else 1.4, label=name)
        ax.axvspan(1 - EPS, 1 + EPS, color="grey", alpha=0.15, label="trust region [1 − ε, 1 + ε]")
        ax.set(xlabel="ρ = π_θ(a|s) / π_old(a|s)", ylabel="objective J = −L", title=f"Â = {sign:+.0f}, ε = {EPS}")
        ax.grid(alpha=0.3)
        legend(ax)
    return save_png(fig, out)


def runaway_update(actor: Actor, seed: int, epochs: int, out_png: Path, out_md: Path) -> list[Path]:
    """One update of many epochs on one batch of GRPO groups, under each objective: how far the ratios go.

    A sample is *past the clip the helpful way* when ρ > 1 + ε with Â > 0 (or ρ < 1 − ε with Â < 0), and
    *the harmful way* when ρ moved against its advantage beyond the clip. Only the minimum keeps a gradient
    on the harmful side; the clipped term alone has none there, so other samples' steps carry it away.
    """
    cfg, groups, _ = grpo_groups(actor, seed, group_size=8, num_groups=8, advantage="step_baseline")
    batch = groups.batch
    valid = batch.mask.nonzero(as_tuple=True)
    A = group_advantages(cfg, batch, groups.group_returns, None, batch.mask.shape[0])[valid]  # (K,)
    obs, actions, old_log_probs = batch.obs[valid], batch.actions[valid], batch.log_probs[valid]
    history: dict[str, list[tuple[float, float, float, float]]] = {}
    for name, objective in OBJECTIVES.items():
        torch.manual_seed(seed)
        net = StackedNetworks([copy.deepcopy(actor)])  # a stack of one, as training has it
        optimizer = SeedOptimizer(net.flat, adam(cfg.learning_rate, eps=1e-5))
        stepping = torch.ones(1, dtype=torch.bool)
        history[name] = []
        for _ in range(epochs):
            for part in torch.randperm(len(A)).tensor_split(cfg.num_minibatches):
                log_probs = net.log_prob_entropy(net.policy(obs[part][None]), actions[part][None])[0][0]
                loss = objective((log_probs - old_log_probs[part]).exp(), A[part]).mean()
                optimizer.gradient_step(loss, stepping, cfg.max_grad_norm)
            with torch.no_grad():
                log_ratio = net.log_prob_entropy(net.policy(obs[None]), actions[None])[0][0] - old_log_probs
            ratio = log_ratio.exp()
            helpful = ((A > 0) & (ratio > 1 + EPS)) | ((A < 0) & (ratio < 1 - EPS))
            harmful = ((A > 0) & (ratio < 1 - EPS)) | ((A < 0) & (ratio > 1 + EPS))
            history[name].append(
                (
                    float(helpful.float().mean()),
                    float(harmful.float().mean()),
                    float(log_ratio.abs().max()),
                    float(losses.k3_kl(log_ratio).mean()),
                )
            )
    fig, axes = new_figure(3, (4.6, 3.4))
    titles = ("past the clip, the helpful way", "past the clip, the harmful way", "max |log ρ| over the batch")
    for i, (ax, title) in enumerate(zip(axes, titles, strict=True)):
        for name, rows in history.items():
            ax.plot(range(1, epochs + 1), [row[i] for row in rows], marker=".", label=name)
        ax.set(xlabel=f"epoch ({cfg.num_minibatches} minibatches each)", title=title)
        ax.set_ylabel("fraction of samples" if i < 2 else "|log ρ|")
        ax.grid(alpha=0.3)
        legend(ax)
    rows = [
        [name, str(epochs), f"{h[-1][0]:.3f}", f"{h[-1][1]:.3f}", f"{h[-1][2]:.2f}", f"{h[-1][3]:.4f}"]
        for name, h in history.items()
    ]
    note = (
        f"{len(A)} samples from {cfg.num_groups} groups of {cfg.group_size} CartPole episodes, one update of {epochs} "
        f"epochs × {cfg.num_minibatches} minibatches, Adam at {cfg.learning_rate}, gradient-norm clip "
        f"{cfg.max_grad_norm}, ε = {EPS}, seed {seed}."
    )
    header = [
        "objective",
        "epochs",
        "past the clip, helpful",
        "past the clip, harmful",
        "max |log ρ|",
        "KL(π_old ‖ π_θ) (k3)",
    ]
    table = write_table(out_md, "One update, three objectives: how far the ratios run", header, rows, note)
    return [save_png(fig, out_png), table]


# ── 2. a group whose returns all tie ───────────────────────────────────────────────────────────────


def exact_kl(model: Actor, reference: Actor, obs: Tensor) -> float:
    """Mean over states of the exact KL(π_θ ‖ π_ref) of two categorical policies."""
    log_p, log_q = torch.log_softmax(model(obs), -1), torch.log_softmax(reference(obs), -1)
    return float((log_p.exp() * (log_p - log_q)).sum(-1).mean())


def entropy(model: Actor, obs: Tensor) -> float:
    log_p = torch.log_softmax(model(obs), -1)
    return float(-(log_p.exp() * log_p).sum(-1).mean())


def tied_group_update(actor: Actor, seed: int, out_md: Path) -> Path:
    """GRPO's update on groups whose members all earn the same return: CartPole episodes cut at 6 steps,
    before any policy can drop the pole (8 steps at the fastest), so every member's return is the same.
    The advantages are exactly 0, the clipped surrogate has no gradient, and whatever moves the policy
    comes from the KL penalty (toward π_ref, the untrained policy) and the entropy bonus."""
    cfg, groups, reference = grpo_groups(
        actor,
        seed,
        group_size=8,
        num_groups=4,
        max_episode_steps=6,
        advantage="step_baseline",
        aggregation="trajectory",
    )
    batch, H = groups.batch, groups.batch.mask.shape[0]
    A = group_advantages(cfg, batch, groups.group_returns, None, H)
    if bool((groups.group_returns.amax(1) != groups.group_returns.amin(1)).any()) or bool(A.any()):
        raise RuntimeError("tied_group_update: a group did not tie; the 6-step episodes should all survive")
    obs = batch.obs[batch.mask]
    rows = []
    with torch.no_grad():
        kl_before, entropy_before = exact_kl(actor, reference, obs), entropy(actor, obs)
    for beta, ent_coef in ((0.0, 0.0), (0.04, 0.0), (0.0, 0.01), (0.04, 0.01)):
        model = copy.deepcopy(actor)
        before = torch.cat([p.detach().flatten() for p in model.parameters()]).clone()
        stats = grpo_update(model, reference, groups, replace(cfg, beta=beta, ent_coef=ent_coef))
        after = torch.cat([p.detach().flatten() for p in model.parameters()])
        with torch.no_grad():
            rows.append(
                [
                    f"{beta}",
                    f"{ent_coef}",
                    "0",
                    f"{float((after - before).norm()):.4f}",
                    f"{kl_before:.4f} → {exact_kl(model, reference, obs):.4f}",
                    f"{entropy_before:.4f} → {entropy(model, obs):.4f}",
                    f"{stats['grpo/update_kl']:.2e}",
                ]
            )
    header = [
        "β",
        "c_H (ent_coef)",
        "max |Â|",
        "‖Δθ‖",
        "KL(π_θ ‖ π_ref) before → after",
        "entropy before → after",
        "KL(π_old ‖ π_θ) of the update",
    ]
    note = (
        f"{cfg.num_groups} groups × {cfg.group_size} CartPole members, every return "
        f"{float(groups.group_returns[0, 0]):.4f}; π_θ: a PPO policy after a short run, π_ref: the untrained policy; "
        f"one update of {cfg.n_epochs} epochs × {cfg.num_minibatches} minibatches, Adam at {cfg.learning_rate}, seed "
        f"{seed}. KL and entropy: exact, averaged over the batch's states (nats)."
    )
    return write_table(out_md, "The update a tied group produces", header, rows, note)


# ── 3. the weight each aggregation gives one step ──────────────────────────────────────────────────


def aggregation_weights(lengths: list[int], H: int, out_png: Path, out_md: Path) -> list[Path]:
    """∂(aggregated loss)/∂x_{i,t}: the weight of one step of each trajectory, by autograd on ``losses.aggregate``."""
    T, M = max(lengths), len(lengths)
    mask = torch.arange(T).unsqueeze(1) < torch.tensor(lengths)  # (T, M)
    weights = {}
    for mode in losses.AGGREGATIONS:
        per_step = torch.zeros(T, M, dtype=torch.float64, requires_grad=True)
        losses.aggregate(per_step, mask, mode, H).backward()
        weights[mode] = per_step.grad[0].numpy()  # every valid step of a trajectory has the same weight
    fig, axes = new_figure(2, (5.0, 3.6))
    x, width = np.arange(M), 0.26
    for ax, (what, scale) in zip(axes, (("one step", None), ("the whole trajectory", lengths)), strict=True):
        for k, mode in enumerate(losses.AGGREGATIONS):
            values = weights[mode] * (np.asarray(scale) if scale else 1.0)
            ax.bar(x + (k - 1) * width, values, width, label=mode)
        ax.set_xticks(x, [f"L = {L}" for L in lengths])
        ax.set(ylabel="weight in the loss", title=f"weight of {what}")
        ax.grid(alpha=0.3, axis="y")
        legend(ax)
    rows = [
        [mode] + [f"{weights[mode][i]:.5f} / {weights[mode][i] * L:.3f}" for i, L in enumerate(lengths)]
        for mode in losses.AGGREGATIONS
    ]
    note = f"M = {M} trajectories in the batch, H = {H}. Each cell: the weight of one step / of the whole trajectory."
    table = write_table(
        out_md, "The weight each aggregation gives a step", ["mode"] + [f"L = {L}" for L in lengths], rows, note
    )
    return [save_png(fig, out_png), table]


# ── 4. k1, k2 and k3 on a known pair of distributions ───────────────────────────────────────────────


def gaussian_log_ratio(x: Tensor, mean_q: float, mean_p: float) -> Tensor:
    """log q(x) − log p(x) for q = N(mean_q, 1), p = N(mean_p, 1)."""
    return -0.5 * (x - mean_q) ** 2 + 0.5 * (x - mean_p) ** 2


def kl_estimators(samples: int, seed: int, out_png: Path, out_md: Path) -> list[Path]:
    """Bias and spread of k1, k2, k3 for KL(p ‖ q), p = N(0, 1), q = N(μ, 1), x ~ p (true KL: μ²/2); then
    GRPO's case: k3 of KL(π_θ ‖ π_ref) computed on samples from π_old ≠ π_θ."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, generator=generator, dtype=torch.float64)  # (S,) from N(0, 1)
    estimators = {"k1": losses.k1_kl, "k2": losses.k2_kl, "k3": losses.k3_kl}
    mus = [0.1, 0.25, 0.5, 1.0, 2.0]
    rows, measured = [], {name: [] for name in estimators}
    for mu in mus:
        log_ratio = gaussian_log_ratio(x, mu, 0.0)
        true = mu**2 / 2
        for name, k in estimators.items():
            values = k(log_ratio)
            bias, spread = float(values.mean()) - true, float(values.std())
            measured[name].append((bias / true, spread / true))
            rows.append(
                [
                    f"{mu}",
                    f"{true:.4f}",
                    name,
                    f"{float(values.mean()):.4f}",
                    f"{bias:+.4f}",
                    f"{spread:.4f}",
                    f"{float((values < 0).float().mean()):.2f}",
                ]
            )
    fig, axes = new_figure(2, (5.0, 3.6))
    for name in estimators:
        axes[0].plot(mus, [b for b, _ in measured[name]], marker="o", label=name)
        axes[1].plot(mus, [s for _, s in measured[name]], marker="o", label=name)
    axes[0].set(xlabel="μ (q = N(μ, 1), p = N(0, 1))", ylabel="bias / KL", title="relative bias of the mean")
    axes[1].set(xlabel="μ", ylabel="std / KL", title="relative std of one sample", yscale="log")
    for ax in axes:
        ax.grid(alpha=0.3)
        legend(ax)
    header = ["μ", "KL(p ‖ q)", "estimator", "mean", "bias", "std of one sample", "share of samples < 0"]
    note = f"{samples:,} samples x ~ N(0, 1), seed {seed}."
    # GRPO's case: π_ref = N(0, 1), π_old = N(0.5, 1), π_θ = N(0.5 + Δμ, 1); x ~ π_old; r = π_ref / π_θ.
    off_rows = []
    x_old = x + 0.5
    for delta in (0.0, 0.1, 0.25, 0.5):
        mean_theta = 0.5 + delta
        log_ratio = gaussian_log_ratio(x_old, 0.0, mean_theta)  # log π_ref − log π_θ
        weight = gaussian_log_ratio(x_old, mean_theta, 0.5).exp()  # π_θ / π_old
        k3 = losses.k3_kl(log_ratio)
        means = [f"{float(k(log_ratio).mean()):.4f}" for k in estimators.values()]
        off_rows.append([f"{delta}", f"{mean_theta**2 / 2:.4f}", *means, f"{float((weight * k3).mean()):.4f}"])
    off_header = [
        "Δμ (π_θ − π_old)",
        "KL(π_θ ‖ π_ref)",
        "k1 on x ~ π_old",
        "k2 on x ~ π_old",
        "k3 on x ~ π_old (GRPO's)",
        "k3 · π_θ/π_old on x ~ π_old",
    ]
    off_note = (
        f"π_ref = N(0, 1), π_old = N(0.5, 1), π_θ = N(0.5 + Δμ, 1); the same {samples:,} samples, shifted to π_old."
    )
    section = ("GRPO's penalty: the estimators on samples from π_old", off_header, off_rows, off_note)
    table = write_table(out_md, "k1, k2 and k3 on a known pair of Gaussians", header, rows, note, (section,))
    return [save_png(fig, out_png), table]


# ── 6. one start state, one group, every advantage ─────────────────────────────────────────────────


def group_advantages_picture(
    model: ActorCritic, seed: int, H: int, gamma: float, lams: tuple[float, ...], out_png: Path
) -> Path:
    """G = 8 CartPole trajectories from one start state, sampled with a partly trained PPO policy, and the
    advantage each estimator gives every step: GRPO's group estimators and vine values, and GAE(γ, λ)
    with that run's critic at λ's two ends and between."""
    cfg, groups, _ = grpo_groups(
        model.actor,
        seed,
        group_size=8,
        num_groups=1,
        max_episode_steps=H,
        gamma=gamma,
        advantage="vine",
        vine_points=10,
        vine_branches=4,
        num_minibatches=4,
    )
    batch = groups.batch
    T, M = batch.mask.shape
    panels: dict[str, Tensor] = {}
    for kind in ("outcome", "rloo", "process", "step_baseline", "vine"):
        panels[kind] = group_advantages(
            replace(cfg, advantage=kind), batch, groups.group_returns, groups.vine.values, H
        )
    with torch.no_grad():
        values = model.value(batch.obs.reshape(T * M, -1)).view(T, M) * batch.mask  # (T, M)
    lengths = batch.lengths
    last = torch.arange(T).unsqueeze(1) == (lengths - 1)  # (T, M): each member's last step
    # A truncated member's true final observation is not stored: it bootstraps from V(s_{L−1}), one step short.
    next_values = torch.where(last, values, torch.cat([values[1:], values.new_zeros(1, M)]))
    terminated = last & batch.terminated
    done = last | ~batch.mask
    for lam in lams:
        panels[f"GAE λ = {lam}"] = (
            adv.gae(batch.rewards * batch.mask, values, next_values, terminated, done, gamma, lam) * batch.mask
        )
    fig, axes = new_figure(len(panels), (4.4, 3.0))
    order = torch.argsort(lengths).tolist()
    colors = colormaps["viridis"](np.linspace(0.0, 0.9, M))
    for ax, (name, A) in zip(axes, panels.items(), strict=True):
        for rank, i in enumerate(order):
            L = int(lengths[i])
            ax.plot(range(L), A[:L, i].numpy(), color=colors[rank], linewidth=1.2, label=f"L = {L}")
        ax.axhline(0.0, color="black", linewidth=0.6)
        ax.set(title=name, xlabel="step t")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="x-small", ncol=2)
    fig.suptitle(f"One CartPole start state (seed {seed}), G = {M} members, γ = {gamma}, H = {H}")
    return save_png(fig, out_png)


# ── 7. length bias: the push on a token, by its response's length and the sign of its advantage ───


def token_push(rewards: list[float], lengths: list[int], mode: str, H: int) -> Tensor:
    """−∂L/∂log π_{i,t} = Â_i · w_{i,t}, the push on each token of response i (M,), by autograd for L = aggregate(x),
    x_{i,t} = −Â_i · log π_{i,t}, Â = group_outcome(R): R_i the reward of response i (one group), ``lengths[i]`` its
    tokens; w_{i,t} the weight of token t under ``mode`` (H: the horizon of "constant"). Negative: a penalty."""
    A = adv.group_outcome(torch.tensor([rewards], dtype=torch.float64))[0]  # (M,)
    mask = torch.arange(max(lengths)).unsqueeze(1) < torch.tensor(lengths)  # (T, M)
    log_probs = torch.zeros(mask.shape, dtype=torch.float64, requires_grad=True)  # L is linear in it: any point does
    losses.aggregate(-A * log_probs, mask, mode, H).backward()
    return -log_probs.grad[0]  # every token of a response has the same Â_i and weight


def length_bias(out_png: Path, out_md: Path) -> list[Path]:
    """Dr. GRPO's length bias (arXiv 2503.20783 §3.1) by ``token_push``: G = 4 responses, R = (1, 1, 0, 0); the
    push on a correct and the penalty on a wrong response, per token and in all (× L_i), as lengths change."""
    R, rows, sweep = [1.0, 1.0, 0.0, 0.0], [], np.arange(10, 501)
    for case, (good, bad) in (("correct short, wrong long", (20, 200)), ("correct long, wrong short", (200, 20))):
        for mode in losses.AGGREGATIONS:
            up, down = token_push(R, [good, good, bad, bad], mode, 200)[[0, 2]].tolist()
            rows.append([case, mode, *(f"{v:.4g}" for v in (up, -down, up * good, -down * bad))])
    fig, axes = new_figure(2, (5.0, 3.6))
    for mode in losses.AGGREGATIONS:
        per_token = np.array([-float(token_push(R, [20, 20, int(L), 20], mode, 500)[2]) for L in sweep])
        axes[0].plot(sweep, per_token * sweep, label=mode)
        axes[1].plot(sweep, per_token, label=mode)
    axes[0].set(ylabel="total penalty |Â|·w·L", title="penalty on the whole wrong response")
    axes[1].set(ylabel="penalty per token |Â|·w", title="penalty on each of its tokens", yscale="log")
    fig.supxlabel("length L of one wrong response (the other three: 20 tokens; H = 500)")
    for ax in axes:
        ax.grid(alpha=0.3)
        legend(ax)
    note = (
        f"G = 4 responses, rewards (1, 1, 0, 0), Â = ±{float(adv.group_outcome(torch.tensor([R]))[0, 0]):.4f} "
        "(`group_outcome`, std floor 1e-6) on each token; lengths 20, 200 as named; H = 200; push = Â·w."
    )
    header = [
        "case",
        "aggregation",
        "push per token, correct",
        "penalty per token, wrong",
        "total push, one correct response",
        "total penalty, one wrong response",
    ]
    title = "Length bias: the push each aggregation gives a token, by the sign of its advantage"
    return [save_png(fig, out_png), write_table(out_md, title, header, rows, note)]
