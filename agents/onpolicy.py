"""The shared on-policy layer: S seeds of any on-policy algorithm side by side, written once.

Two parts, which an algorithm holds (composition, not a base class):

- :class:`SeedStack`: each seed's networks, built as a single run builds them (seeded, then its generators
  captured) and computed together (``networks.StackedNetworks``); the per-seed optimizer, its learning
  rates and the masked gradient step; each seed's :class:`~agents.training.Trainee`; each seed's metrics out
  of a stacked (S, k) tensor. Every on-policy algorithm uses it (PPO, GRPO).
- :class:`OnPolicy`: the collector of actor-critic algorithms (PPO, A2C): each seed's training envs (one
  vector env for all seeds where that is exact, ``run_envs.open_shared_envs``), its evaluation env, an
  :class:`~agents.networks.ActorCritic` per seed in a :class:`SeedStack`, and ``collect``: T steps of every
  seed's N envs (:func:`segment_steps`), every step's actions from one batched forward pass; with the
  envs' part of ``save``, ``load`` and ``close``. GRPO collects groups of its own (``agents.groups``).

An algorithm supplies its config, its ``learn`` (losses and update) and what it adds to collection; the
lifecycle around an iteration is ``training.run_stack``'s. The value targets an actor-critic algorithm
learns from (:func:`gae_targets`, :func:`critic_targets`) are here too, so that none copies them.

Seed k's numbers are bit-identical whatever seeds share its process: every reduction runs within its row,
and every shape is fixed by the config alone (``seeds``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from gymnasium.vector import VectorEnv
from torch import Tensor, nn

from agents import advantages as adv
from agents import losses, optimizers
from agents.config import RunConfig
from agents.networks import Act, ActorCritic, StackedNetworks, load_weights
from agents.rollout import RolloutState, SegmentBuffers
from agents.run_envs import (
    SharedEnv,
    envs_with_shapes,
    make_eval_env,
    network_spec,
    open_shared_envs,
    restore_envs,
    save_envs,
    seed_env,
    seed_obs_statistics,
)
from agents.seeding import seed_everything
from agents.stacked import SeedGenerators, by_seed
from agents.training import Experience, Trainee
from envs import EnvOptions


def env_options(cfg: RunConfig, **own: Any) -> EnvOptions:
    """How an algorithm's training envs are wrapped: what every config sets (observation normalization, a
    delayed reward, a reward offset), then the algorithm's ``own`` options (vectorization, PPO's reward
    normalization and its γ)."""
    return EnvOptions(
        normalize_obs=cfg.normalize_obs, reward_delay=cfg.reward_delay, reward_offset=cfg.reward_offset, **own
    )


# ── every seed's networks, optimizer and trainees ─────────────────────────────────────────────────────


@dataclass
class SeedParts:
    """What an algorithm builds for one seed: its trained network and what evaluates it."""

    model: nn.Module
    """Every trained parameter of the seed; also the policy that evaluation acts with."""
    eval_env: VectorEnv
    obs_stats: Callable[[], dict[str, Any]]
    """The seed's training observation statistics, which evaluation uses frozen."""
    networks: dict[str, nn.Module]
    """Networks whose sizes the summary reports, by name."""


class SeedStack:
    """S seeds' networks as one (S, P) stack, their optimizer and generators, and one trainee per seed.

    ``build(k, cfg)`` makes seed k's parts right after the global generators are seeded with its seed, as a
    single run makes them; each seed's own generators then continue from there (``stacked.SeedGenerators``).
    """

    def __init__(
        self,
        cfgs: Sequence[RunConfig],
        build: Callable[[int, Any], SeedParts],
        rule: optimizers.OptimizerFactory | None = None,
    ) -> None:
        """``rule``: each seed's optimizer (``optimizers``); None: Adam with ε = 1e-5 at the configs' learning rate."""
        self.cfgs, self.random = list(cfgs), SeedGenerators()
        parts: list[SeedParts] = []
        for k, cfg in enumerate(self.cfgs):
            seed_everything(cfg.seed)
            parts.append(build(k, cfg))
            self.random.capture(cfg.device)
        self.net = StackedNetworks([part.model for part in parts])  # (S, P)
        rule = rule or optimizers.adam(self.cfgs[0].learning_rate, eps=1e-5)
        self.optimizer = optimizers.SeedOptimizer(self.net.flat, rule)
        self.trainees = [
            Trainee(part.model, part.model, self.optimizer.for_seed(k), part.eval_env, part.obs_stats, part.networks)
            for k, part in enumerate(parts)
        ]

    @property
    def seeds(self) -> int:
        """S."""
        return len(self.cfgs)

    def set_learning_rates(self, learning_rates: Sequence[float]) -> None:
        """Each seed's step size α_k for the next gradient steps (the schedule's, times any factor of its own)."""
        self.optimizer.set_learning_rates(learning_rates)

    def step(self, loss: Tensor, stepping: Tensor, max_grad_norm: float) -> None:
        """One gradient step of every seed in ``stepping`` (S,) bool on its own loss, ``loss`` (S,):

            ∇_θ Σ_k m_k L_k,   m_k = 1 for a stepping seed, else 0

        Seed k's parameters are row k of the stack, so the gradient of the masked sum puts each seed's own
        gradient in its row; each row's norm is clipped to ``max_grad_norm``, then the optimizer steps the
        stepping rows only. ``torch.where`` (not a product) keeps a NaN of a held seed out of the sum."""
        self.optimizer.gradient_step(torch.where(stepping, loss, 0.0).sum(), stepping, max_grad_norm)

    @staticmethod
    def per_seed_metrics(stats: Tensor, names: Sequence[str], running: Sequence[bool]) -> list[dict[str, float | None]]:
        """Each seed's row of ``stats`` (S, len(names)) by name; {} for a seed not running (nothing to log)."""
        rows = stats.cpu().tolist()
        return [dict(zip(names, row, strict=True)) if on else {} for row, on in zip(rows, running, strict=True)]


def actor_critic(cfg: Any, env: VectorEnv) -> ActorCritic:
    """One seed's actor-critic for the env's spaces and the config's network fields (``shared_trunk`` among them):
    what PPO and A2C train, and what their checkpoints are loaded into."""
    return ActorCritic(network_spec(env, cfg, cfg.shared_trunk))


def load_network(
    network: Callable[[Any, VectorEnv], nn.Module], cfg: RunConfig, env: VectorEnv, weights: dict[str, Any]
) -> nn.Module:
    """A checkpoint's network, for ``testbed eval`` and the audit: ``network(cfg, env)``, the factory the
    algorithm trains with (``OnPolicy``'s ``network``), loaded with ``weights`` (a registry ``load_policy``
    once the factory is bound)."""
    return load_weights(network(cfg, env), weights, "the checkpoint")


# ── one segment: T steps of N envs ─────────────────────────────────────────────────────────────────
# With NEXT_STEP autoreset (``rollout``): ``sample_mask[t]`` is False exactly at autoreset steps, which are never
# training samples; ``next_values[t] = values[t + 1]`` is V of the true next observation for every real step,
# a truncated one included, whose final observation is stored at t + 1. No separate final-observation pass.


@dataclass
class Segment:
    """T steps of N envs, the input of one PPO iteration."""

    obs: Tensor  # (T, N, obs_dim) float32
    actions: Tensor  # (T, N) int64 or (T, N, act_dim) float32
    log_probs: Tensor  # (T, N)
    values: Tensor  # (T, N)
    next_values: Tensor  # (T, N)  V of the true next observation
    rewards: Tensor  # (T, N)
    terminated: Tensor  # (T, N) bool
    truncated: Tensor  # (T, N) bool
    sample_mask: Tensor  # (T, N) bool  False at autoreset steps
    last_obs: Tensor  # (1, N, obs_dim)  s_T, the observation after the last step, whose value bootstraps it

    @property
    def done(self) -> Tensor:
        return self.terminated | self.truncated

    def columns(self, cols: slice) -> Segment:
        """The segment of the envs ``cols`` alone (one seed's, of a vector env that seeds share)."""
        return Segment(**{name: getattr(self, name)[:, cols] for name in self.__dataclass_fields__})


def segment_steps(env: VectorEnv, state: RolloutState, buffers: SegmentBuffers) -> Generator[np.ndarray, Any, Segment]:
    """T steps in N envs with the current policy, from ``state``, which it updates. A generator: it yields
    each step's observations (N, obs_dim) and is sent π_θ's :class:`~agents.networks.Act` for them; after
    the T-th step it yields the next observations once more and is sent their values V(s_T) (N,), with which
    the segment's last bootstrap values are filled. So one batched call can drive many seeds' segments
    (:meth:`OnPolicy.collect`).

    Finished episodes' raw returns, lengths and last rewards (from ``info["episode"]``) are appended to
    ``state.episode_returns`` / ``episode_lengths`` / ``episode_last_rewards`` for logging.
    """
    T = buffers.obs.shape[0]
    next_obs, next_is_autoreset = state.next_obs, state.next_is_autoreset
    for t in range(T):
        buffers.obs[t] = next_obs
        buffers.sample_mask[t] = ~next_is_autoreset
        act = yield buffers.obs[t]
        buffers.actions[t] = act.actions
        buffers.log_probs[t] = act.log_probs
        buffers.values[t] = act.values
        next_obs, reward, terminated, truncated, info = env.step(act.actions.numpy())
        buffers.rewards[t] = reward
        buffers.terminated[t] = terminated
        buffers.truncated[t] = truncated
        next_is_autoreset = terminated | truncated
        if "_episode" in info:
            finished = info["_episode"]
            state.episode_returns.extend(info["episode"]["r"][finished].tolist())
            state.episode_lengths.extend(info["episode"]["l"][finished].tolist())
            state.episode_last_rewards.extend(info["episode"]["last"][finished].tolist())
            state.episode_envs.extend(np.flatnonzero(finished).tolist())
    state.next_obs, state.next_is_autoreset = np.asarray(next_obs, dtype=np.float32), next_is_autoreset
    last_values = yield state.next_obs
    values = buffers.values.clone()
    return Segment(
        obs=torch.from_numpy(buffers.obs.copy()),
        actions=buffers.actions.clone(),
        log_probs=buffers.log_probs.clone(),
        values=values,
        next_values=torch.cat([values[1:], torch.as_tensor(last_values).reshape(1, -1).clone()]),
        rewards=torch.from_numpy(buffers.rewards.copy()),
        terminated=torch.from_numpy(buffers.terminated.copy()),
        truncated=torch.from_numpy(buffers.truncated.copy()),
        sample_mask=torch.from_numpy(buffers.sample_mask.copy()),
        last_obs=torch.from_numpy(state.next_obs.copy()).unsqueeze(0),
    )


def finish(steps: Generator[np.ndarray, Any, Segment], last_values: Tensor) -> Segment:
    """The segment a :func:`segment_steps` returns, once sent its last bootstrap values."""
    try:
        steps.send(last_values)
    except StopIteration as done:
        return done.value
    raise RuntimeError("segment_steps yielded past its segment")


def join_segments(segments: list[Segment | None]) -> Segment:
    """S seeds' (T, N) segments side by side as one (T, S·N) segment, seed k's envs in columns k·N … (k+1)·N;
    a seed without one (not running) gets zeros there, and no sample."""
    template = next(s for s in segments if s is not None)
    fields = {}
    for name in Segment.__dataclass_fields__:
        zeros = torch.zeros_like(getattr(template, name))
        fields[name] = torch.cat([getattr(s, name) if s is not None else zeros for s in segments], dim=1)
    return Segment(**fields)


# ── the actor-critic collector: T steps of every seed's N envs ─────────────────────────────────────


class OnPolicy:
    """S seeds' envs, rollout state and actor-critics, and their collection (``collect``), for an actor-critic
    algorithm whose config has ``n_envs`` and ``n_steps``. ``network(cfg, env)`` builds one seed's
    actor-critic for the training env's spaces, reported as ``name``; ``options`` wrap the training envs; ``rule``
    is each seed's optimizer (:class:`SeedStack`)."""

    def __init__(
        self,
        cfgs: Sequence[Any],
        network: Callable[[Any, VectorEnv], nn.Module],
        options: EnvOptions,
        name: str = "actor_critic",
        rule: optimizers.OptimizerFactory | None = None,
    ) -> None:
        self.cfgs = list(cfgs)
        self.shared: list[SharedEnv] = []  # the training envs: one for all seeds where that is exact
        self.evals: list[VectorEnv] = []  # each seed's evaluation env
        n_envs, n_steps = self.cfgs[0].n_envs, self.cfgs[0].n_steps  # N and T, which every seed shares

        def build(k: int, cfg: Any) -> SeedParts:
            self.evals.append(make_eval_env(cfg, cfg.eval_episodes))
            model = network(cfg, self.shared[0].env).to(cfg.device)  # its parameters become views of row k
            return SeedParts(
                model, self.evals[k], partial(seed_obs_statistics, *seed_env(self.shared, k)), {name: model}
            )

        try:
            self.shared = open_shared_envs(self.cfgs, n_envs, options)
            self.stack = SeedStack(self.cfgs, build, rule)
        except BaseException:
            self.close()
            raise
        self.envs = envs_with_shapes(self.shared[0].env, self.evals[0])  # the spaces' shapes
        self.buffers = [
            SegmentBuffers(
                n_steps, shared.env.num_envs, self.envs.obs_dim, self.envs.action_shape, not self.envs.continuous
            )
            for shared in self.shared
        ]

    def collect(self, iterations: list[int], running: list[bool]) -> list[Experience | None]:
        """T steps in every training env (:func:`segment_steps`), every step's actions from one batched
        forward pass, each seed's drawn from its own generator. A seed no longer running has ended: its envs
        (where seeds share them) step with zero actions, and nothing of it is kept."""
        cfg, net, S, N = self.cfgs[0], self.stack.net, len(self.cfgs), self.cfgs[0].n_envs
        steps = [segment_steps(s.env, s.rollout, buffers) for s, buffers in zip(self.shared, self.buffers)]
        obs = torch.zeros((S, N, self.envs.obs_dim))  # (S, N, obs_dim)  idle seeds act on zeros
        generators = [g if on else None for g, on in zip(self.stack.random.torch, running, strict=True)]
        with torch.inference_mode():
            current = [next(step) for step in steps]  # each (S_b·N, obs_dim)
            for _ in range(cfg.n_steps):
                for shared, shared_obs in zip(self.shared, current):
                    obs[shared.stack] = torch.from_numpy(shared_obs).view(shared.seeds, N, -1)
                out, values = net.heads(obs.to(cfg.device))
                actions, log_probs = net.sample(out, generators)
                actions, log_probs, values = actions.cpu(), log_probs.cpu(), values.cpu()
                if not all(running):  # an ended seed's envs, where it shares them, step with zero actions
                    actions[~torch.tensor(running)] = 0
                current = [
                    step.send(Act(*(x[shared.stack].flatten(0, 1) for x in (actions, log_probs, values))))
                    for step, shared in zip(steps, self.shared)
                ]
            for shared, shared_obs in zip(self.shared, current):  # the next observations: the last bootstrap values
                obs[shared.stack] = torch.from_numpy(shared_obs).view(shared.seeds, N, -1)
            last_values = net.values(obs.to(cfg.device)).cpu()  # (S, N)
        collected: list[Experience | None] = []  # in the stack's order, as the shared envs are
        for step, shared in zip(steps, self.shared):
            segment = finish(step, last_values[shared.stack].flatten())  # (T, S_b·N)
            for j in range(shared.seeds):
                episodes = shared.rollout.take_episodes(shared.rows(j))  # taken from an ended seed too, and dropped
                kept = Experience(segment.columns(shared.rows(j)), cfg.n_steps * N, *episodes)
                collected.append(kept if running[shared.first + j] else None)
        return collected

    def save(self, k: int) -> dict[str, Any]:
        """Seed k's envs, for its checkpoint."""
        return save_envs(*seed_env(self.shared, k))

    def load(self, k: int, checkpoint: dict[str, Any]) -> None:
        """Seed k's envs as the checkpoint left them, where possible."""
        restore_envs(*seed_env(self.shared, k), checkpoint, self.cfgs[k].seed)

    def close(self) -> None:
        for env in [shared.env for shared in self.shared] + self.evals:
            env.close()


# ── the value targets of an actor-critic ───────────────────────────────────────────────────────────


def gae_targets(
    segment: Segment, values: Tensor, next_values: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """GAE(γ, λ) advantages Â_t and value targets Â_t + V(s_t), (T, S·N) each, from values V(s_t) and
    V(s_{t+1}) (``advantages.gae``; λ = 1: the n-step return to the segment's end minus V)."""
    advantages = adv.gae(segment.rewards, values, next_values, segment.terminated, segment.done, gamma, lam)
    return advantages, advantages + values


def critic_targets(onpolicy: OnPolicy, segment: Segment, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """:func:`gae_targets` from the current critic's values of the segment's states s_0 … s_T. With NEXT_STEP
    autoreset the row after a truncated step holds its true final observation, so its bootstrap is kept."""
    S, T, cfg = len(onpolicy.cfgs), segment.obs.shape[0], onpolicy.cfgs[0]
    states = torch.cat([segment.obs, segment.last_obs])  # (T+1, S·N, obs_dim)
    with torch.no_grad():
        values = onpolicy.stack.net.values(by_seed(states, S).to(cfg.device)).cpu()  # (S, (T+1)·N)
    values = values.reshape(S, T + 1, -1).transpose(0, 1).reshape(T + 1, -1)  # (T+1, S·N)
    return gae_targets(segment, values[:-1], values[1:], gamma, lam)


def add_explained_variances(
    metrics: list[dict[str, float | None]], segment: Segment, returns: Tensor, seeds: int
) -> None:
    """Each running seed's ``losses/explained_variance`` (``losses.explained_variance``) of the values V(s_t) it
    collected against its value targets ``returns`` (T, S·N), over its valid samples; added to ``metrics`` (a
    seed not running, ``{}``, gets none)."""
    values, targets, valid = (by_seed(x, seeds) for x in (segment.values, returns, segment.sample_mask))  # (S, T·N)
    for k, seed_metrics in enumerate(metrics):
        if seed_metrics:
            variance = losses.explained_variance(values[k][valid[k]], targets[k][valid[k]])
            seed_metrics["losses/explained_variance"] = variance
