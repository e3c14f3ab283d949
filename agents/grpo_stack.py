"""GRPO for S seeds in one process (``testbed train --seeds``): ``grpo.py``'s iteration with a seed axis
beside the group axis.

One iteration, for every seed at once: B groups of G members in each seed's vector env, acting with one
batched forward pass per step (each seed's ``groups.group_steps``, driven in lockstep) → each seed's group
advantages (``grpo.targets``) → epochs × minibatches of trajectories, each one batched gradient step for
all S seeds (``stacked``).

What stays each seed's own, so that seed k trains as its single run would: its envs and observation
normalizer, its start states, its random numbers (a generator per seed), its minibatches, its KL-target
stop and step size, its reference policy and its Adam state. The batch is padded to the horizon H and
minibatches to ⌈B·G / minibatches⌉ trajectories, shapes that the config alone fixes. A minibatch's loss
steps then run through the network in chunks of ROWS rows, as many chunks as the seed with the most
steps needs; a chunk past a seed's own steps adds exact zeros to its sums and its gradient. So seed k's
numbers are bit-identical whatever seeds share its stack, and a stack of one matches a single run to
floating-point rounding.

Two variants act with the policy outside the members' own steps (the trunks of ``start_mode=branch``,
the vine's branches); their seeds take turns instead (``training.in_turn``), as ``train`` picks.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from agents import losses
from agents.groups import Groups, group_steps, horizon, validate
from agents.grpo import TAGS, GRPOConfig, Learner, after_update, build, collected, load, member_envs, save, targets
from agents.networks import Actor, StackedNetworks
from agents.rollout import SegmentBuffers
from agents.seeding import seed_everything
from agents.seeds import (
    LaneAdam,
    SeedAdam,
    SeedGenerators,
    clip_grad_norms_,
    fixed_minibatch_slots,
    masked_mean,
    padded_width,
)
from agents.training import Collected, Lane, Stack, check_stack, in_turn, network_spec, obs_statistics, run_stack

ROWS = 256  # the rows of a chunk of the update: wider chunks pad more, narrower ones make more calls
STATS = ("policy_loss", "entropy", "approx_kl", "kl_ref", "ratio_mean", "clipfrac_low", "clipfrac_high")


@dataclass
class StackedGRPO:
    """What a stack carries from one iteration to the next."""

    learners: list[Learner]  # each seed's envs, actor, reference, buffers and step-size factor
    net: StackedNetworks  # the actors, computed together: (S, P)
    references: StackedNetworks  # the reference policies, computed together: (S, P)
    adam: SeedAdam
    random: SeedGenerators

    @property
    def cfg(self) -> GRPOConfig:
        """The settings every seed shares (all but the seed)."""
        return self.learners[0].cfg


def batched(cfg: GRPOConfig) -> bool:
    """Whether the seeds of this config train batched; the others take turns."""
    return cfg.start_mode == "reset" and cfg.advantage != "vine"


def build_stack(cfgs: list[GRPOConfig]) -> Stack:
    """Each seed's envs, actor and reference, built exactly as ``grpo.build`` builds a single run's after
    seeding, then stacked; each seed's generator continues from the seeded global state."""
    check_stack(cfgs)
    opened, actors, random = [], [], SeedGenerators()
    try:
        for cfg in cfgs:
            seed_everything(cfg.seed)
            opened.append(member_envs(cfg))
            actors.append(Actor(network_spec(opened[-1].train, cfg)).to(cfg.device))
            random.capture(cfg.device)
    except BaseException:
        for envs in opened:
            envs.close()
        raise
    references = [copy.deepcopy(actor).requires_grad_(False) for actor in actors]  # π_ref = π_θ at the start
    net, reference_net = StackedNetworks(actors), StackedNetworks(references)
    adam = SeedAdam(net.flat, cfgs[0].learning_rate)
    H, M = horizon(cfgs[0]), cfgs[0].batch_trajectories
    learners = [
        Learner(cfg, envs, None, None, actor, reference, LaneAdam(adam, k),  # type: ignore[arg-type]
                SegmentBuffers(H, M, envs.obs_dim, envs.action_shape, not envs.continuous), H)  # (H, B·G)
        for k, (cfg, envs, actor, reference) in enumerate(zip(cfgs, opened, actors, references, strict=True))
    ]  # fmt: skip
    stack = StackedGRPO(learners, net, reference_net, adam, random)

    def close() -> None:
        for envs in opened:
            envs.close()

    return Stack(lanes=[lane(stack, k) for k in range(len(cfgs))], collect=partial(collect, stack),
                 update=partial(learn, stack), tags=TAGS, close=close)  # fmt: skip


def lane(stack: StackedGRPO, k: int) -> Lane:
    """Seed k as the lifecycle sees it: what its single run's checkpoint holds, and its generators."""
    learner = stack.learners[k]
    return Lane(
        model=learner.actor, policy=learner.actor, optimizer=learner.optimizer, eval_env=learner.envs.eval,
        obs_stats=partial(obs_statistics, learner.envs.train), save=partial(save, learner),
        load=partial(load, learner), networks={"actor": learner.actor, "reference": learner.reference},
        rng_state=partial(stack.random.state, k), load_rng=partial(stack.random.load, k),
    )  # fmt: skip


# ── the iteration: S seeds' groups in lockstep → group advantages → one batched update ────────────


def collect(stack: StackedGRPO, iterations: list[int], running: list[bool]) -> list[Collected | None]:
    """Every running seed's B groups of G trajectories. At each step, the seeds' live members act through
    one batched forward pass; each seed draws its actions from its own generator."""
    S, M = len(stack.learners), stack.cfg.batch_trajectories
    steps = {k: group_steps(learner.cfg, learner.envs.train, None, None, learner.actor, learner.buffers, iterations[k])
             for k, learner in enumerate(stack.learners) if running[k]}  # fmt: skip
    groups: dict[int, Groups] = {}
    obs = torch.zeros((S, M, stack.learners[0].envs.obs_dim))  # (S, M, obs_dim)  seed k's live members first
    with torch.inference_mode():
        live = {k: next(member_steps) for k, member_steps in steps.items()}  # each (K_k, obs_dim)
        while live:
            for k, live_obs in live.items():
                obs[k, : len(live_obs)] = torch.from_numpy(live_obs)
            out = stack.net.policy(obs.to(stack.cfg.device))  # (S, M, action_dim)  rows past K_k unused
            for k in list(live):
                sample = stack.net.sample_seed(k, out[k, : len(live[k])], stack.random.torch[k])
                try:
                    live[k] = steps[k].send(sample)
                except StopIteration as finished:
                    groups[k] = finished.value
                    del live[k]
    return [collected(groups[k]) if running[k] else None for k in range(S)]


def learn(
    stack: StackedGRPO, batches: list[Collected | None], iterations: list[int], remaining: list[float],
    running: list[bool],
) -> list[dict[str, float | None]]:  # fmt: skip
    """The batched update, then each seed's step-size adaptation, reference refresh and diagnostics."""
    groups = [c.batch if c is not None else None for c in batches]
    for learner in (learner for k, learner in enumerate(stack.learners) if running[k]):
        for group in learner.optimizer.param_groups:  # the lifecycle's schedule, times the KL-target factor
            group["lr"] *= learner.lr_scale
    stack.adam.lr = torch.tensor([learner.optimizer.param_groups[0]["lr"] for learner in stack.learners],
                                 dtype=torch.float64)  # fmt: skip
    stats = update(stack, groups)
    return [after_update(learner, groups[k], stats[k], iterations[k]) if groups[k] is not None else {}
            for k, learner in enumerate(stack.learners)]  # fmt: skip


def trajectories_at(x: Tensor, index: Tensor) -> Tensor:
    """The trajectories ``index`` (S, W) of each seed's batch x (S, T, M, …) → (S, T, W, …)."""
    return torch.take_along_dim(x, index.view(*index.shape[:1], 1, index.shape[1], *[1] * (x.dim() - 3)), dim=2)


def masked_first(mask: Tensor) -> Tensor:
    """Each seed's masked positions first, in their order, cut to whole chunks of ROWS rows: as many chunks
    as the seed with the most masked positions needs, at least one.  mask (S, B) → positions (S, R)."""
    chunks = max(1, -(-int(mask.sum(-1).max()) // ROWS))
    return torch.argsort((~mask).to(torch.uint8), dim=1, stable=True)[:, : ROWS * chunks]


@torch.no_grad()
def log_probs_at(net: StackedNetworks, obs: Tensor, actions: Tensor, mask: Tensor) -> Tensor:
    """log π_k(a|s) at each seed's masked steps, 0 elsewhere.  obs (S, B, obs_dim), mask (S, B) → (S, B).
    Only the masked steps go through the network, picked out and run in chunks of ROWS rows."""
    rows = masked_first(mask)  # (S, R)
    log_probs = torch.zeros(mask.shape, device=mask.device)  # (S, B)
    for part in rows.split(ROWS, dim=1):
        x = torch.take_along_dim(obs, part.unsqueeze(-1), dim=1)  # (S, ROWS, obs_dim)
        a = torch.take_along_dim(actions, part.view(*part.shape, *[1] * (actions.dim() - 2)), dim=1)
        log_probs.scatter_(1, part, net.log_prob_entropy(net.policy(x), a)[0])
    return torch.where(mask, log_probs, 0.0)


def chunked_loss(net: StackedNetworks, cfg: GRPOConfig, picked: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """GRPO's objective (``grpo.minibatch_loss``) for every seed, over its picked steps (S, R, …), R a
    multiple of ROWS; each chunk of ROWS rows goes through the network and the sums on its own:

        L_k = Σ_{i,t} w_{i,t} [ −min(ρ A, clip(ρ, 1 − ε_low, 1 + ε_high) A) + β · k3(π_ref / π_θ) − c_H · H(π_θ) ]

    w: the aggregation's weights (``losses.aggregation_weights``), 0 off seed k's loss steps. Returns L (S,)
    and the detached sums over each seed's steps of (w · surrogate, entropy, approx_kl, kl_ref, ratio,
    clipped low, clipped high), (S, 7). A chunk past a seed's steps adds exact zeros to its sums and gradient.
    """
    loss, sums = 0.0, 0.0
    for start in range(0, picked["mask"].shape[1], ROWS):
        x = {name: value[:, start : start + ROWS] for name, value in picked.items()}  # (S, ROWS, …) each
        log_probs, entropy = net.log_prob_entropy(net.policy(x["obs"]), x["actions"])  # (S, ROWS) each
        log_ratio = log_probs - x["old_log_probs"]
        ratio = log_ratio.exp()
        surrogate = losses.clipped_surrogate(ratio, x["advantages"], cfg.clip_low, cfg.clip_high)
        # k3 at x ~ π_old: a penalty toward π_ref, as grpo.minibatch_loss.
        kl_ref = losses.k3_kl(x["ref_log_probs"] - log_probs)
        per_step = surrogate + cfg.beta * kl_ref - cfg.ent_coef * entropy
        loss = loss + (x["weight"] * torch.where(x["mask"], per_step, 0.0)).sum(-1)  # (S,)
        with torch.no_grad():
            terms = [x["weight"] * surrogate, entropy, losses.k3_kl(log_ratio), kl_ref, ratio,
                     (ratio < 1.0 - cfg.clip_low).float(), (ratio > 1.0 + cfg.clip_high).float()]  # fmt: skip
            sums = sums + torch.stack([torch.where(x["mask"], term, 0.0).sum(-1) for term in terms], dim=1)
    return loss, sums  # type: ignore[return-value]


def update(stack: StackedGRPO, groups: list[Groups | None]) -> list[dict[str, float]]:
    """Epochs × minibatches of trajectories for every seed with an informative group, as ``grpo.update``
    does for one; returns each seed's means over its minibatches and its whole update's KL.

    Seed k's batch is padded to (H, B·G) and masked. Each epoch, its trajectories are shuffled by its own
    generator and split into the minibatches ``grpo.update`` makes, each padded to W = ⌈B·G / minibatches⌉
    trajectories. A minibatch's loss steps are picked out and run in chunks (:func:`chunked_loss`). A seed
    whose approx_kl passes twice ``kl_target`` stops stepping, as its epochs end.
    """
    cfg, net, S, H = stack.cfg, stack.net, len(stack.learners), stack.learners[0].H
    M, n_minibatches, device = cfg.batch_trajectories, cfg.num_minibatches, cfg.device
    envs = stack.learners[0].envs
    W = padded_width(M, n_minibatches)
    obs = torch.zeros((S, H, M, envs.obs_dim))  # (S, H, M, obs_dim)
    actions = torch.zeros((S, H, M, *envs.action_shape), dtype=torch.float32 if envs.continuous else torch.int64)
    old_log_probs, advantages = torch.zeros((S, H, M)), torch.zeros((S, H, M))  # (S, H, M)
    valid, loss_mask = torch.zeros((S, H, M), dtype=torch.bool), torch.zeros((S, H, M), dtype=torch.bool)
    trajectories = torch.zeros(S, dtype=torch.int64)  # (S,)  M_k: B·G, fewer if dynamic sampling ran short
    slots: list[Tensor] = []
    for k, seed_groups in enumerate(groups):
        if seed_groups is not None and seed_groups.kept_groups:
            batch = seed_groups.batch
            T, trajectories[k] = batch.mask.shape[0], batch.mask.shape[1]
            seed_advantages, seed_loss_mask = targets(cfg, seed_groups, H)
            for x, value in ((obs, batch.obs), (actions, batch.actions), (old_log_probs, batch.log_probs),
                             (advantages, seed_advantages), (valid, batch.mask), (loss_mask, seed_loss_mask)):
                x[k, :T, : value.shape[1]] = value  # fmt: skip
        slots.append(fixed_minibatch_slots(int(trajectories[k]), n_minibatches, W))
    obs, actions, old_log_probs, advantages, valid, loss_mask = (
        x.to(device) for x in (obs, actions, old_log_probs, advantages, valid, loss_mask))  # fmt: skip
    flat = partial(torch.flatten, start_dim=1, end_dim=2)  # (S, T, m, …) → (S, T·m, …)
    obs, actions, old_log_probs, valid = flat(obs), flat(actions), flat(old_log_probs), flat(valid)  # (S, H·M, …)
    ref_log_probs = log_probs_at(stack.references, obs, actions, valid)  # fixed this iteration
    batch = {"obs": obs, "actions": actions, "old_log_probs": old_log_probs, "advantages": flat(advantages),
             "ref_log_probs": ref_log_probs}  # fmt: skip
    members = torch.zeros((S, n_minibatches * W), dtype=torch.int64)  # (S, minibatches·W)  padding → member 0
    real = torch.zeros((S, n_minibatches * W), dtype=torch.bool)  # (S, minibatches·W)
    for k, seed_slots in enumerate(slots):
        real[k, seed_slots] = True
    real = real.to(device)
    stepping = (trajectories > 0).to(device)  # (S,)
    epochs = torch.zeros(S, device=device)  # (S,)
    totals, counts = torch.zeros((S, len(STATS)), device=device), torch.zeros(S, device=device)  # (S, 7), (S,)
    for _ in range(cfg.n_epochs):
        epochs += stepping
        for k in range(S):
            if bool(stepping[k]):
                generator = stack.random.torch[k]
                members[k, slots[k]] = torch.randperm(int(trajectories[k]), generator=generator,
                                                      device=generator.device).cpu()  # fmt: skip
        epoch_members = members.to(device)
        for m in range(n_minibatches):
            columns = slice(m * W, (m + 1) * W)
            mb_real, mb_members = real[:, columns], epoch_members[:, columns]  # (S, W) each
            mask = trajectories_at(loss_mask, mb_members) & mb_real.unsqueeze(1)  # (S, H, W)
            weights = losses.aggregation_weights(mask, cfg.aggregation, H, mb_real)  # (S, H, W)
            # Each seed's loss steps first, in the (t, i) order of grpo.minibatch_loss, then in chunks of
            # ROWS rows: a seed's chunks never depend on how many chunks its neighbours need.
            flat_mask = flat(mask)  # (S, H·W)
            count = flat_mask.sum(-1)  # (S,)
            rows = masked_first(flat_mask)  # (S, R)
            at_batch = (rows // W) * M + torch.gather(mb_members, 1, rows % W)  # (S, R) positions in the (H, M) batch
            picked = {name: torch.take_along_dim(x, at_batch.view(S, -1, *[1] * (x.dim() - 2)), dim=1)
                      for name, x in batch.items()}  # fmt: skip
            picked |= {"mask": torch.gather(flat_mask, 1, rows), "weight": torch.gather(flat(weights), 1, rows)}
            loss, sums = chunked_loss(net, cfg, picked)  # (S,), (S, 7)
            approx_kl = sums[:, 2] / count.clamp(min=1)  # (S,)
            step_now = stepping & mb_real.any(-1)  # a seed with fewer trajectories may have an empty minibatch
            if cfg.kl_target is not None:
                stopped = step_now & (approx_kl > 2.0 * cfg.kl_target)
                stepping, step_now = stepping & ~stopped, step_now & ~stopped
            if not bool(stepping.any()):
                break

            net.flat.grad.zero_()
            torch.where(step_now, loss, 0.0).sum().backward()  # each seed's gradient lands in its own row
            clip_grad_norms_(net.flat.grad, cfg.max_grad_norm)
            stack.adam.step(step_now)

            step_stats = torch.cat([sums[:, :1], sums[:, 1:] / count.clamp(min=1).unsqueeze(1)], dim=1)  # (S, 7)
            totals += torch.where(step_now.unsqueeze(1), step_stats, 0.0)
            counts += step_now
        else:
            continue
        break  # no seed steps any more: the epoch loop ends too
    # KL(π_old ‖ π_θ) of each seed's whole update, over every sample of its batch
    log_probs = log_probs_at(net, obs, actions, valid)  # (S, H·M)
    update_kl = masked_mean(losses.k3_kl(log_probs - old_log_probs), valid)  # (S,)
    means = (totals / counts.clamp(min=1).unsqueeze(1)).cpu()
    return [
        ({**(dict(zip(STATS, means[k].tolist(), strict=True)) if counts[k] else {}),
          "update_kl": float(update_kl[k]), "epochs_run": float(epochs[k])} if trajectories[k] else {})
        for k in range(S)
    ]  # fmt: skip


def train(
    cfgs: list[GRPOConfig], run_dirs: list[Path], resume: bool | list[bool] = False, name: str = "grpo"
) -> list[dict[str, Any]]:
    """Train one GRPO run per config in one process into ``run_dirs``: batched where the variant allows
    (:func:`batched`), the seeds taking turns otherwise; returns their summaries."""
    for cfg in cfgs:
        validate(cfg)
    return run_stack(build_stack if batched(cfgs[0]) else in_turn(build), cfgs, run_dirs, resume, name)

