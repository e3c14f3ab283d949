"""PPO for S seeds in one process (``testbed train --seeds``): ``ppo.py``'s iteration with a seed axis.

One iteration, for every seed at once: T steps in each seed's N envs, acting with one batched forward
pass → GAE over the T × (S·N) columns → K epochs of minibatches, each one batched gradient step for all
S seeds (``stacked``). PureJaxRL trains seeds the same way (``vmap`` over seeds).

What stays each seed's own, so that seed k trains as its single run would:
- its envs, with their observation and reward normalizers: a vector env per seed, stepped in turn. One
  vector env for all S·N envs would share its normalizers and (gymnasium's native CartPole) its random
  number generator across seeds;
- its random numbers (a generator per seed): the same draws, in the same order, as a single run's;
- its minibatches, advantage normalization, gradient-norm clip, target-KL stop and Adam state.
A minibatch holds a seed's own valid samples split as ``ppo.update`` splits them, padded to a width the
config fixes; every mean runs over one seed's row. So seed k's numbers are bit-identical whatever seeds
share its stack, and a stack of one matches a single run to floating-point rounding (batched matmuls
round differently from single ones).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents import advantages as adv
from agents import losses
from agents.networks import ActorCritic
from agents.ppo import TAGS, PPOConfig, env_options
from agents.rollout import RolloutState, Segment
from agents.seeding import seed_everything
from agents.stacked import (
    LaneAdam,
    SeedAdam,
    SeedGenerators,
    StackedNetworks,
    clip_grad_norms_,
    fixed_minibatch_slots,
    masked_mean,
    padded_width,
)
from agents.training import (
    Collected,
    Envs,
    Lane,
    Stack,
    check_stack,
    network_spec,
    obs_statistics,
    open_envs,
    restore_envs,
    run_stack,
    save_envs,
)


@dataclass
class StackedLearner:
    """What a stack carries from one iteration to the next."""

    cfgs: list[PPOConfig]
    envs: list[Envs]  # one vector env per seed
    net: StackedNetworks
    adam: SeedAdam
    random: SeedGenerators  # each seed's generators
    rollouts: list[RolloutState]  # each seed's next observations
    lane_adams: list[LaneAdam] = field(default_factory=list)  # each seed's view of ``adam``

    @property
    def cfg(self) -> PPOConfig:
        """The settings every seed shares (all but the seed)."""
        return self.cfgs[0]


def build(cfgs: list[PPOConfig]) -> Stack:
    """Each seed's envs and ActorCritic, built exactly as ``ppo.build`` builds a single run's after seeding,
    then stacked; each seed's generator continues from the seeded global state, as a single run's draws do."""
    check_stack(cfgs)
    envs, models, random = [], [], SeedGenerators()
    try:
        for cfg in cfgs:
            seed_everything(cfg.seed)
            envs.append(open_envs(cfg, cfg.n_envs, env_options(cfg)))
            models.append(ActorCritic(network_spec(envs[-1].train, cfg, cfg.shared_trunk)).to(cfg.device))
            random.capture(cfg.device)
    except BaseException:
        for opened in envs:
            opened.close()
        raise
    rollouts = []
    for cfg, seed_envs in zip(cfgs, envs, strict=True):
        obs, _ = seed_envs.train.reset(seed=cfg.seed)
        rollouts.append(RolloutState(np.asarray(obs, dtype=np.float32), np.zeros(cfg.n_envs, dtype=bool)))
    net = StackedNetworks(models)
    adam = SeedAdam(net.flat, cfgs[0].learning_rate)
    learner = StackedLearner(list(cfgs), envs, net, adam, random, rollouts)
    learner.lane_adams = [LaneAdam(adam, k) for k in range(len(cfgs))]
    lanes = [lane(learner, k, model) for k, model in enumerate(models)]

    def close() -> None:
        for seed_envs in envs:
            seed_envs.close()

    return Stack(lanes=lanes, collect=partial(collect, learner), update=partial(learn, learner), tags=TAGS,
                 close=close)  # fmt: skip


def lane(learner: StackedLearner, k: int, model: ActorCritic) -> Lane:
    """Seed k as the lifecycle sees it: its network, optimizer state, envs and generators."""
    seed_envs = learner.envs[k]

    def load(ckpt: dict[str, Any]) -> None:
        learner.rollouts[k] = restore_envs(seed_envs.train, ckpt, learner.cfgs[k].seed)

    return Lane(
        model=model, policy=model, optimizer=learner.lane_adams[k], eval_env=seed_envs.eval,
        obs_stats=partial(obs_statistics, seed_envs.train),
        save=lambda: save_envs(seed_envs.train, learner.rollouts[k]), load=load,
        networks={"actor_critic": model},
        rng_state=partial(learner.random.state, k), load_rng=partial(learner.random.load, k),
    )  # fmt: skip


# ── the iteration: T steps in S·N envs → GAE → one batched update ─────────────────────────────────


def collect(learner: StackedLearner, iterations: list[int], running: list[bool]) -> list[Collected | None]:
    """T steps in each running seed's N envs; the Segment's columns are seed-major (column k·N + n)."""
    cfg, S = learner.cfg, len(learner.cfgs)
    T, N, device = cfg.n_steps, cfg.n_envs, cfg.device
    obs_dim, action_shape = learner.envs[0].obs_dim, learner.envs[0].action_shape
    discrete = not learner.envs[0].continuous
    obs = np.zeros((T, S, N, obs_dim), dtype=np.float32)  # (T, S, N, obs_dim)
    rewards = np.zeros((T, S, N), dtype=np.float32)  # (T, S, N)
    terminated = np.zeros((T, S, N), dtype=np.bool_)  # (T, S, N)
    truncated = np.zeros((T, S, N), dtype=np.bool_)  # (T, S, N)
    actions = torch.zeros((T, S, N, *action_shape), dtype=torch.int64 if discrete else torch.float32)
    log_probs, values = torch.zeros((T, S, N)), torch.zeros((T, S, N))  # (T, S, N)
    next_obs = np.stack([rollout.next_obs for rollout in learner.rollouts])  # (S, N, obs_dim)
    next_is_autoreset = np.stack([rollout.next_is_autoreset for rollout in learner.rollouts])  # (S, N)
    sample_mask = np.zeros((T, S, N), dtype=np.bool_)  # (T, S, N)
    generators = [g if on else None for g, on in zip(learner.random.torch, running, strict=True)]
    lanes = [k for k in range(S) if running[k]]
    episodes: list[tuple[list[float], list[float]]] = [([], []) for _ in range(S)]
    with torch.inference_mode():
        for t in range(T):
            obs[t], sample_mask[t] = next_obs, ~next_is_autoreset
            out, values_t = learner.net.heads(torch.from_numpy(obs[t]).to(device))
            actions_t, log_probs_t = learner.net.sample(out, generators)
            actions[t], log_probs[t], values[t] = actions_t, log_probs_t, values_t
            actions_np = actions_t.cpu().numpy()
            for k in lanes:
                next_obs[k], rewards[t, k], terminated[t, k], truncated[t, k], info = learner.envs[k].train.step(
                    actions_np[k])
                next_is_autoreset[k] = terminated[t, k] | truncated[t, k]
                if "_episode" in info:
                    finished = info["_episode"]
                    episodes[k][0].extend(info["episode"]["r"][finished].tolist())
                    episodes[k][1].extend(info["episode"]["l"][finished].tolist())
        last_values = learner.net.heads(torch.from_numpy(next_obs).to(device))[1].cpu()  # (S, N)
    for k in lanes:
        learner.rollouts[k].next_obs, learner.rollouts[k].next_is_autoreset = next_obs[k].copy(), next_is_autoreset[k].copy()

    def columns(x: np.ndarray | torch.Tensor) -> torch.Tensor:
        x = torch.as_tensor(x)
        return x.reshape(T, S * N, *x.shape[3:])  # (T, S·N, …)

    values = columns(values)
    segment = Segment(obs=columns(obs), actions=columns(actions), log_probs=columns(log_probs), values=values,
                      next_values=torch.cat([values[1:], last_values.reshape(1, S * N)]), rewards=columns(rewards),
                      terminated=columns(terminated), truncated=columns(truncated),
                      sample_mask=columns(sample_mask))  # fmt: skip
    return [Collected(segment, T * N, *episodes[k]) if running[k] else None for k in range(S)]


def learn(
    learner: StackedLearner, collected: list[Collected | None], iterations: list[int], remaining: list[float],
    running: list[bool],
) -> list[dict[str, float | None]]:  # fmt: skip
    """GAE per column, then the batched update; returns each seed's losses and explained variance."""
    cfg, S, N = learner.cfg, len(learner.cfgs), learner.cfg.n_envs
    segment = next(c.batch for c in collected if c is not None)
    clip = torch.tensor([cfg.clip_range * (r if cfg.anneal_clip_range else 1.0) for r in remaining]).unsqueeze(1)
    advantages = adv.gae(segment.rewards, segment.values, segment.next_values, segment.terminated, segment.done,
                         cfg.gamma, cfg.gae_lambda)  # (T, S·N)  # fmt: skip
    returns = advantages + segment.values  # (T, S·N)
    # The lifecycle's schedule set each seed's rate on its optimizer view.
    learner.adam.lr = torch.tensor([a.param_groups[0]["lr"] for a in learner.lane_adams], dtype=torch.float64)
    stats = update(learner, segment, advantages, returns, clip.to(cfg.device), torch.tensor(running))  # (S, 5)
    metrics: list[dict[str, float | None]] = []
    for k in range(S):
        cols = slice(k * N, (k + 1) * N)
        valid = segment.sample_mask[:, cols]
        policy_loss, value_loss, entropy, approx_kl, clipfrac = stats[k].tolist()
        metrics.append({
            "losses/policy_loss": policy_loss, "losses/value_loss": value_loss, "losses/entropy": entropy,
            "losses/approx_kl": approx_kl, "losses/clipfrac": clipfrac,
            "losses/explained_variance": losses.explained_variance(segment.values[:, cols][valid],
                                                                   returns[:, cols][valid]),
        } if running[k] else {})  # fmt: skip
    return metrics


def update(
    learner: StackedLearner, segment: Segment, advantages: torch.Tensor, returns: torch.Tensor, clip: torch.Tensor,
    running: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """K epochs of minibatches for every running seed, as ``ppo.update`` does for one; returns each seed's
    means over its minibatches of (policy loss, value loss, entropy, approx_kl, clipfrac), (S, 5).

    ``advantages``, ``returns`` (T, S·N); ``clip`` (S, 1), each seed's ε. Seed k's valid samples (autoreset
    steps excluded) are shuffled by its own generator and split into M near-equal minibatches, each padded
    to the width W = ⌈T·N / M⌉ with ``mask`` False on the padding.
    """
    cfg, net, S = learner.cfg, learner.net, len(learner.cfgs)
    M, device = cfg.num_minibatches, cfg.device

    def per_seed(x: torch.Tensor) -> torch.Tensor:  # (T, S·N, …) → (S, T·N, …), each row as ppo.update flattens
        x = x.reshape(x.shape[0], S, cfg.n_envs, *x.shape[2:]).transpose(0, 1)
        return x.reshape(S, cfg.batch_size, *x.shape[3:]).to(device)

    obs, actions = per_seed(segment.obs), per_seed(segment.actions)  # (S, T·N, obs_dim), (S, T·N, …)
    old_log_probs, old_values = per_seed(segment.log_probs), per_seed(segment.values)  # (S, T·N)
    advantages, returns, valid = per_seed(advantages), per_seed(returns), per_seed(segment.sample_mask)
    W = padded_width(cfg.batch_size, M)
    valid_indices = [row.nonzero().squeeze(1).cpu() for row in valid]  # each (≤T·N,)
    slots = [fixed_minibatch_slots(len(indices), M, W) for indices in valid_indices]
    index = torch.zeros((S, M * W), dtype=torch.int64)  # (S, M·W)  padding points at sample 0, masked out
    mask = torch.zeros((S, M * W), dtype=torch.bool)  # (S, M·W)
    for k in range(S):
        mask[k, slots[k]] = True
    mask = mask.to(device)
    counts_per_minibatch = mask.view(S, M, W).sum(-1).clamp(min=1)  # (S, M)
    row_offsets = (torch.arange(S) * cfg.batch_size).unsqueeze(1)  # (S, 1)  row k starts at k·T·N when flattened
    stepping = running.to(device)  # (S,)  seeds still updating; a target-KL stop ends a seed's epochs
    totals = torch.zeros((S, 5), device=device)  # (S, 5)  summed to avoid per-step syncs
    counts = torch.zeros(S, device=device)  # (S,)
    for _ in range(cfg.n_epochs):
        for k in range(S):
            if bool(stepping[k]):
                generator = learner.random.torch[k]
                shuffled = valid_indices[k][torch.randperm(len(valid_indices[k]), generator=generator,
                                                           device=generator.device).cpu()]  # fmt: skip
                index[k, slots[k]] = shuffled
        # Every minibatch of the epoch gathered at once: (S, M·W, …), then minibatch m is columns m·W … (m+1)·W.
        flat_index = (index + row_offsets).view(-1).to(device)
        epoch = [x.flatten(0, 1).index_select(0, flat_index).view(S, M * W, *x.shape[2:])
                 for x in (obs, actions, old_log_probs, old_values, advantages, returns)]  # fmt: skip
        for m in range(M):
            columns = slice(m * W, (m + 1) * W)
            mb_obs, mb_actions, mb_old_log_probs, mb_old_values, mb_advantages, mb_returns = (x[:, columns] for x in epoch)
            # Each seed's mean over its own samples, (S,).
            mean = partial(masked_mean, mask=mask[:, columns], count=counts_per_minibatch[:, m])
            weight = mask[:, columns]  # (S, W)

            new_log_probs, entropy, values = net.evaluate(mb_obs, mb_actions)  # (S, W) each
            log_ratio = new_log_probs - mb_old_log_probs
            ratio = log_ratio.exp()
            approx_kl = mean(losses.k3_kl(log_ratio).detach())  # (S,)
            if cfg.target_kl is not None:
                stepping = stepping & ~(approx_kl > 1.5 * cfg.target_kl)
                if not bool(stepping.any()):
                    break
            if cfg.normalize_advantage:
                mb_advantages = adv.normalize_rows(mb_advantages, weight)
            policy_loss = mean(losses.clipped_surrogate(ratio, mb_advantages, clip, clip))  # (S,)
            value_loss = mean(losses.value_loss(values, mb_old_values, mb_returns, cfg.clip_range_vf))
            entropy_mean = mean(entropy)
            loss = policy_loss + cfg.vf_coef * value_loss  # (S,)
            if cfg.ent_coef:
                loss = loss - cfg.ent_coef * entropy_mean

            net.flat.grad.zero_()
            torch.where(stepping, loss, 0.0).sum().backward()  # each seed's gradient lands in its own row
            clip_grad_norms_(net.flat.grad, cfg.max_grad_norm)
            learner.adam.step(stepping)

            ratio = ratio.detach()
            clipfrac = mean(((ratio < 1.0 - clip) | (ratio > 1.0 + clip)).float())
            step_stats = torch.stack([policy_loss.detach(), value_loss.detach(), entropy_mean.detach(), approx_kl,
                                      clipfrac], dim=1)  # (S, 5)  # fmt: skip
            totals += torch.where(stepping.unsqueeze(1), step_stats, 0.0)
            counts += stepping
        else:
            continue
        break  # no seed steps any more: the epoch loop ends too
    return (totals / counts.clamp(min=1).unsqueeze(1)).cpu()


def train(
    cfgs: list[PPOConfig], run_dirs: list[Path], resume: bool | list[bool] = False, name: str = "ppo"
) -> list[dict[str, Any]]:
    """Train one PPO run per config, side by side, into ``run_dirs``; returns their summaries."""
    return run_stack(build, cfgs, run_dirs, resume, name)
