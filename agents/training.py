"""The one run lifecycle every agent shares, and the plumbing around it.

:func:`run` owns a run's life: seeding, resume, stop signals, the learning-rate schedule, checkpoints,
evaluation, status and summary. An agent supplies only what differs (:class:`Agent`): its networks and
optimizer, ``collect`` (one iteration's experience) and ``update`` (learning from it), and the state
of its own to save and load. So PPO's iteration (``ppo.py``: collect → GAE → update) and GRPO's
(``grpo.py``: groups → group advantages → update) each read top to bottom in one file, as Stable-
Baselines3's ``OnPolicyAlgorithm.learn`` drives each algorithm's ``train()``, without a class hierarchy.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import VectorEnv

import envs as envs_pkg
from agents import rundir, runlog
from agents.config import RunConfig
from agents.networks import NetworkSpec, load_weights
from agents.rollout import RolloutState, evaluate_policy
from agents.seeding import seed_everything
from envs.errors import BadInput

# Evaluation episodes use seeds EVAL_SEED_BASE, EVAL_SEED_BASE + 1, …: the same start states for every
# run, algorithm and training seed, and never a training seed.
EVAL_SEED_BASE = 1_000_000


@dataclass
class Envs:
    """The training vector env, the evaluation vector env (one sub-env per episode) and their shapes."""

    train: VectorEnv
    eval: VectorEnv
    continuous: bool
    obs_dim: int
    action_dim: int
    action_shape: tuple[int, ...]

    def close(self) -> None:
        self.train.close()
        self.eval.close()


def open_envs(cfg: RunConfig, n_envs: int, options: envs_pkg.EnvOptions, **train_kwargs: Any) -> Envs:
    """Build the training and evaluation envs; refuse action spaces the agents cannot handle.

    ``cfg.env_kwargs`` define the env (a task's ``horizon``, say) and go to both envs. ``options`` and
    ``train_kwargs`` (e.g. ``max_episode_steps``) shape training only: evaluation uses the env as the
    kwargs define it (``eval_env_kwargs`` on top), with its own time limit, so scores stay comparable
    across agents. A delayed reward does not change an episode's return, which is what evaluation reports.
    """
    train = envs_pkg.make_vector(cfg.env_id, n_envs, options, **cfg.env_kwargs, **train_kwargs)
    action_space = train.single_action_space
    if not isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box)) or (
        isinstance(action_space, gym.spaces.Box) and len(action_space.shape) != 1
    ):
        train.close()
        raise BadInput(f"{cfg.env_id} has action space {action_space}; the agents support Discrete and 1-D Box actions")
    evaluation = make_eval_env(cfg, cfg.eval_episodes)
    obs_dim, action_dim, continuous = space_dims(train)
    action_shape = tuple(action_space.shape) if continuous else ()
    return Envs(train, evaluation, continuous, obs_dim, action_dim, action_shape)


def make_eval_env(cfg: RunConfig, episodes: int) -> VectorEnv:
    """One sub-env per evaluation episode: sync so each takes its own seed; raw rewards; statistics frozen."""
    options = envs_pkg.EnvOptions(normalize_obs=cfg.normalize_obs, vectorization="sync")
    evaluation = envs_pkg.make_vector(cfg.env_id, episodes, options, **{**cfg.env_kwargs, **cfg.eval_env_kwargs})
    envs_pkg.freeze_normalizers(evaluation)
    return evaluation


def check_env(cfg: RunConfig) -> None:
    """Build the env once with the config's keyword arguments, so that a wrong one is refused before any
    run directory exists rather than crashing the run."""
    envs_pkg.check_env_installed(cfg.env_id)
    for kwargs in [cfg.env_kwargs] + ([{**cfg.env_kwargs, **cfg.eval_env_kwargs}] if cfg.eval_env_kwargs else []):
        try:
            gym.make(cfg.env_id, **kwargs).close()
        except (TypeError, ValueError) as error:
            raise BadInput(f"{cfg.env_id} does not accept env_kwargs {kwargs} ({error}). Check the keyword names "
                           "and values the env's constructor takes.") from None  # fmt: skip


def space_dims(env: VectorEnv) -> tuple[int, int, bool]:
    """(obs_dim, action_dim, continuous) of one sub-env: action_dim counts actions or action dimensions."""
    action_space = env.single_action_space
    continuous = isinstance(action_space, gym.spaces.Box)
    action_dim = int(action_space.shape[0]) if continuous else int(action_space.n)
    return int(np.prod(env.single_observation_space.shape)), action_dim, continuous


def network_spec(env: VectorEnv, cfg: RunConfig, shared_trunk: bool = False) -> NetworkSpec:
    """The networks' shape for this env's spaces and the config's network fields (PPO, GRPO, sb3-ppo)."""
    obs_dim, action_dim, continuous = space_dims(env)
    return NetworkSpec(
        obs_dim=obs_dim, action_dim=action_dim, continuous=continuous, hidden_sizes=cfg.hidden_sizes,
        activation=cfg.activation, shared_trunk=shared_trunk, ortho_init=cfg.ortho_init,
        log_std_init=cfg.log_std_init,
    )  # fmt: skip


def observation_statistics(normalizers: dict[str, Any]) -> dict[str, Any]:
    """The part of a training env's normalizer statistics that evaluation uses: observations, not rewards."""
    return {name: stats for name, stats in normalizers.items() if name != "return_rms"}


def obs_statistics(env: VectorEnv) -> dict[str, Any]:
    """The observation statistics of a training env, as evaluation uses them (no reward scaling)."""
    return observation_statistics(envs_pkg.normalizer_state(env))


def evaluate(agent: Lane, deterministic: bool = True, device: str = "cpu") -> np.ndarray:
    """One episode per eval sub-env of the agent's policy, with the training observation statistics, frozen."""
    envs_pkg.load_normalizer_state(agent.eval_env, agent.obs_stats())
    seeds = [EVAL_SEED_BASE + i for i in range(agent.eval_env.num_envs)]
    return evaluate_policy(agent.policy, agent.eval_env, seeds, deterministic, device)


class EvalSchedule:
    """Deterministic evaluation every ``interval`` env steps (0: only at the end)."""

    def __init__(self, interval: int, device: str, start_step: int, logged_step: int | None = None) -> None:
        self.interval, self.device = interval, device
        self.next_step = (start_step // interval + 1) * interval if interval else math.inf
        self.last: tuple[int, np.ndarray] | None = None
        self.logged_step = logged_step  # the last evaluation's step, this session's or a resumed checkpoint's

    def logged_at(self, step: int) -> bool:
        """An evaluation at ``step`` is in the logs already, in this session or before its checkpoint."""
        return self.logged_step == step  # run() sets it with every evaluation

    def maybe_run(self, agent: Lane, step: int) -> dict[str, float]:
        if step < self.next_step:
            return {}
        while self.next_step <= step:
            self.next_step += self.interval
        return self.run(agent, step)

    def ran_at(self, step: int) -> bool:
        return self.last is not None and self.last[0] == step

    def run(self, agent: Lane, step: int) -> dict[str, float]:
        if not self.ran_at(step):
            self.last = (step, evaluate(agent, True, self.device))
            self.logged_step = step
        returns = self.last[1]
        return {"eval/return_mean": float(returns.mean()), "eval/return_std": float(returns.std())}


def save_envs(env: VectorEnv, state: RolloutState) -> dict[str, Any]:
    """The env part of a checkpoint: the full env state where supported, always the normalizers."""
    return {
        "env_state": envs_pkg.vector_env_state(env),
        "normalizers": envs_pkg.normalizer_state(env),
        "rollout": {"next_obs": state.next_obs, "next_is_autoreset": state.next_is_autoreset},
    }


def restore_envs(env: VectorEnv, ckpt: dict[str, Any], seed: int) -> RolloutState:
    """Put the training env back as the checkpoint left it.

    Exact where the checkpoint holds the full env state; otherwise the normalizer statistics are
    restored and every sub-env starts a new episode from a seed derived from the step count.
    """
    if ckpt["env_state"] is not None:
        env.reset(seed=seed)
        envs_pkg.load_vector_env_state(env, ckpt["env_state"])
        rollout = ckpt["rollout"]
        return RolloutState(np.asarray(rollout["next_obs"], dtype=np.float32), np.asarray(rollout["next_is_autoreset"]))
    envs_pkg.load_normalizer_state(env, ckpt["normalizers"])
    obs, _ = env.reset(seed=seed + ckpt["global_step"])
    return RolloutState(np.asarray(obs, dtype=np.float32), np.zeros(env.num_envs, dtype=bool))


# ── what an agent supplies ───────────────────────────────────────────────────────────────────────


@dataclass
class Collected:
    """One iteration's experience, as an agent's ``collect`` returns it."""

    batch: Any  # what the agent's update learns from: PPO's Segment, GRPO's Groups
    env_steps: int  # env steps the collection took; they count toward total_steps
    episode_returns: Sequence[float]  # raw returns of the episodes that ended, for the logs
    episode_lengths: Sequence[float]


@dataclass(kw_only=True)
class Lane:
    """One seed's share of what is trained: what its run directory records and what evaluates it.

    An :class:`Agent` is a lane. A batched stack of seeds (``ppo_stack.py``, ``grpo_stack.py``) has one per
    seed, whose networks are views of that seed's row of the stacked parameters.
    """

    model: torch.nn.Module
    """Every trained parameter: saved as the checkpoint's ``model`` and checked for NaN after each update."""
    policy: torch.nn.Module
    """What evaluation acts with (``act`` and ``deterministic_action``); usually ``model`` itself."""
    optimizer: Any
    """Its learning rate follows the schedule; its state is saved (a torch optimizer, or a stack's view)."""
    eval_env: VectorEnv
    obs_stats: Callable[[], dict[str, Any]]
    """The training observation statistics, which evaluation uses frozen."""
    save: Callable[[], dict[str, Any]]
    """The lane's own checkpoint entries (env state, reference policy, normalizers)."""
    load: Callable[[dict[str, Any]], None]
    """Restore them from a checkpoint."""
    networks: dict[str, torch.nn.Module]
    """Networks whose sizes the summary reports, by name."""
    rng_state: Callable[[], dict[str, Any]] = runlog.rng_state
    """The random number generators it draws from, for checkpoints: by default the process's global ones."""
    load_rng: Callable[[dict[str, Any]], None] = runlog.load_rng_state


@dataclass(kw_only=True)
class Agent(Lane):
    """What one algorithm supplies to :func:`run`: its lane, and how it collects and learns; everything
    around it is the lifecycle's."""

    collect: Callable[[int], Collected]
    """``collect(iteration)``: one iteration's experience."""
    update: Callable[[Collected, int, float], dict[str, float | None]]
    """``update(collected, iteration, progress_remaining)``: learn; returns the metrics to log by tag."""
    tags: list[str]
    """TensorBoard tags, which are also the columns of progress.csv."""
    close: Callable[[], None]


@dataclass
class Stack:
    """S agents trained side by side in one process, one lane per seed; a single run is a stack of one.

    ``collect(iterations, running)`` returns each lane's experience (None for a lane no longer running);
    ``update(collected, iterations, progress_remaining, learning_rates, running)`` learns from it, each lane
    at its scheduled learning rate, and returns each lane's metrics. A lane's work never depends on the
    other lanes.
    """

    lanes: list[Lane]
    collect: Callable[[list[int], list[bool]], list[Collected | None]]
    update: Callable[[list[Collected | None], list[int], list[float], list[float], list[bool]],
                     list[dict[str, float | None]]]  # fmt: skip
    tags: list[str]
    close: Callable[[], None]


def in_turn(build: Callable[[Any], Agent]) -> Callable[[list[RunConfig]], Stack]:
    """Seeds that share one process and take turns: each seed's agent is built, collects and learns exactly
    as its single run would, with the process's random number generators swapped to the seed's own for
    each of its turns. What the stack saves is the fixed cost of a process per seed (interpreter, imports,
    the optimizer's first step); the arithmetic is not batched. A single run is such a stack of one."""

    def build_stack(cfgs: list[RunConfig]) -> Stack:
        agents: list[Agent] = []
        states: list[dict[str, Any]] = []
        try:
            for cfg in cfgs:
                seed_everything(cfg.seed)
                agents.append(build(cfg))
                states.append(runlog.rng_state())
        except BaseException:
            for agent in agents:
                agent.close()
            raise

        def turn(k: int, work: Callable[[], Any]) -> Any:
            runlog.load_rng_state(states[k])
            try:
                return work()
            finally:
                states[k] = runlog.rng_state()

        def load_rng(k: int, state: dict[str, Any]) -> None:
            states[k] = state

        lanes = [dataclasses.replace(agent, rng_state=partial(states.__getitem__, k), load_rng=partial(load_rng, k))
                 for k, agent in enumerate(agents)]  # fmt: skip

        def collect(iterations: list[int], running: list[bool]) -> list[Collected | None]:
            return [turn(k, partial(agent.collect, iterations[k])) if running[k] else None
                    for k, agent in enumerate(agents)]  # fmt: skip

        def update(collected: list[Collected | None], iterations: list[int], remaining: list[float],
                   learning_rates: list[float], running: list[bool]) -> list[dict[str, float | None]]:  # fmt: skip
            for agent, lr in zip(agents, learning_rates, strict=True):
                for group in agent.optimizer.param_groups:  # an agent's own optimizer follows the schedule
                    group["lr"] = lr
            return [turn(k, partial(agent.update, collected[k], iterations[k], remaining[k])) if running[k] else {}
                    for k, agent in enumerate(agents)]  # fmt: skip

        def close() -> None:
            for agent in agents:
                agent.close()

        return Stack(lanes=lanes, collect=collect, update=update, tags=agents[0].tags, close=close)

    return build_stack


def check_stack(cfgs: Sequence[RunConfig]) -> None:
    """Seeds train as one stack when their configs differ in the seed alone (and the budget, which a resume
    may raise); BadInput otherwise."""
    shared = [{k: v for k, v in rundir.config_to_dict(cfg).items() if k not in ("seed", "total_steps")} for cfg in cfgs]
    differing = sorted(k for k in shared[0] if any(s[k] != shared[0][k] for s in shared[1:]))
    if differing:
        raise BadInput(f"seeds in one stack must share every setting but the seed; they differ in {', '.join(differing)}")
    if len({cfg.seed for cfg in cfgs}) != len(cfgs):
        raise BadInput(f"the seeds of a stack must differ, got {[cfg.seed for cfg in cfgs]}")


# Losses that must stay finite; a NaN in one stops the run with the last good checkpoint kept.
LOSS_TAGS = ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl", "losses/clipfrac")


# ── the lifecycle ────────────────────────────────────────────────────────────────────────────────


def run(build: Callable[[Any], Agent], cfg: RunConfig, run_dir: Path, resume: bool, name: str) -> dict[str, Any]:
    """Train the agent that ``build(cfg)`` makes into ``run_dir``; returns the summary also written to
    ``summary.json``. One seed: a stack of one (:func:`run_stack`)."""
    return run_stack(in_turn(build), [cfg], [run_dir], resume, name)[0]


@dataclass
class LaneRun:
    """The lifecycle's record of one lane: where it writes, how far it got, and how it ended."""

    cfg: RunConfig
    run_dir: Path
    lane: Lane
    tracker: RunTracker | None = None
    global_step: int = 0
    iteration: int = 0
    status: str | None = None  # None while it trains; then completed, failed or interrupted
    error: str | None = None
    summary: dict[str, Any] | None = None

    @property
    def running(self) -> bool:
        return self.status is None

    def resume(self, name: str) -> tuple[float, int | None, int | None]:
        """Weights, optimizer, the lane's own state and its random number generators from the checkpoint;
        returns what the tracker continues from: (wall time so far, progress.csv's size, last evaluation step)."""
        ckpt = runlog.load_checkpoint(self.run_dir, {"algo": name, "env_id": self.cfg.env_id})
        load_weights(self.lane.model, ckpt["model"], str(self.run_dir / rundir.CHECKPOINT))
        self.lane.optimizer.load_state_dict(ckpt["optimizer"])
        self.lane.load(ckpt)
        self.global_step, self.iteration = ckpt["global_step"], ckpt["iteration"]
        self.lane.load_rng(ckpt["rng"])
        return ckpt["wall_time_s"], ckpt.get("csv_bytes"), ckpt.get("eval_step")

    def checkpoint(self, name: str) -> None:
        assert self.tracker is not None
        self.tracker.log.flush()
        runlog.save_checkpoint(self.run_dir, {
            "algo": name, "env_id": self.cfg.env_id, "global_step": self.global_step, "iteration": self.iteration,
            "wall_time_s": self.tracker.wall_time(), "csv_bytes": self.tracker.log.csv_bytes(),
            "rng": self.lane.rng_state(), "eval_step": self.tracker.evals.logged_step,
            "model": self.lane.model.state_dict(), "optimizer": self.lane.optimizer.state_dict(), **self.lane.save(),
        })  # fmt: skip

    def end(self, status: str, error: str | None = None) -> None:
        """Final evaluation (completed runs) and summary.json; the lane trains no more."""
        assert self.tracker is not None
        self.status, self.error = status, error
        self.summary = self.tracker.finish(self.lane, status, error, self.global_step)


def failure(exc: Exception, run_dir: Path, show: bool = True) -> tuple[str, OSError | None]:
    """The error a failed run records, and the disk error to report after it, if that was the cause.
    ``show``: print an unexpected crash's traceback (once per crash, not once per lane)."""
    if isinstance(exc, runlog.NonFiniteError):
        return str(exc), None
    if isinstance(exc, OSError):  # a full or read-only disk: recorded where it still can be, then reported
        return f"cannot write to {run_dir}: {exc.strerror or exc}", exc
    if show:
        traceback.print_exc()  # any other crash is recorded in summary.json, then shown in full
    return f"{type(exc).__name__}: {exc}", None


def run_stack(
    build: Callable[[list[Any]], Stack],
    cfgs: Sequence[RunConfig],
    run_dirs: Sequence[Path],
    resume: bool | Sequence[bool],
    name: str,
) -> list[dict[str, Any]]:
    """Train the stack that ``build(cfgs)`` makes, lane k into ``run_dirs[k]``; returns each lane's summary,
    also written to its ``summary.json``. ``build`` seeds each lane. ``resume``: whether each lane continues
    from its checkpoint (one bool: all of them); a stack may hold both, and lanes at or past their budget,
    which complete without training.

    One iteration: ``collect`` → the learning-rate schedule → ``update`` → per lane: log, evaluate,
    checkpoint. The schedule decays by the fraction of the budget still to go after this iteration's
    steps, as SB3 computes it, so the RL Zoo presets mean the same here. Progress rows and TensorBoard
    events reach the disk before each checkpoint, which records how far progress.csv went: a resume after
    any kill writes each iteration exactly once. A lane that fails (a NaN, a full disk) ends alone; the
    others go on. A failure of the shared iteration itself ends every running lane.
    """
    resumes = [resume] * len(cfgs) if isinstance(resume, bool) else list(resume)
    stack = build(list(cfgs))
    runs = [LaneRun(cfg, run_dir, lane) for cfg, run_dir, lane in zip(cfgs, run_dirs, stack.lanes, strict=True)]
    try:
        for lane_run, resumed in zip(runs, resumes, strict=True):
            wall_offset, csv_bytes, eval_step = lane_run.resume(name) if resumed else (0.0, None, None)
            lane_run.tracker = RunTracker(lane_run.run_dir, name, lane_run.cfg, stack.tags, lane_run.global_step,
                                          wall_offset, resumed, csv_bytes, eval_step)  # fmt: skip
    except BaseException:
        stack.close()
        raise
    disk_errors: list[OSError] = []

    def fail(lane_run: LaneRun, exc: Exception, show: bool = True) -> None:
        error, disk_error = failure(exc, lane_run.run_dir, show)
        disk_errors.extend([disk_error] if disk_error else [])
        lane_run.end("failed", error)

    try:
        with runlog.StopFlag() as stop:
            train_lanes(stack, runs, stop, fail, name)
    finally:
        stack.close()
    if disk_errors:
        raise disk_errors[0]  # the command line reports it in one line, with exit status 2
    return [lane_run.summary or {} for lane_run in runs]


def train_lanes(
    stack: Stack, runs: list[LaneRun], stop: runlog.StopFlag, fail: Callable[..., None], name: str
) -> None:
    """The iterations of :func:`run_stack`, until every lane has completed, failed or been interrupted."""
    for lane_run in runs:
        if lane_run.global_step >= lane_run.cfg.total_steps:  # resumed at or past its budget
            try:
                lane_run.checkpoint(name)
                lane_run.end("completed")
            except Exception as exc:  # noqa: BLE001
                fail(lane_run, exc)
    iterated = False
    while any(lane_run.running for lane_run in runs):
        if iterated and stop.raised:  # the stop came after the last iteration read it: end there, start no other
            for lane_run in runs:
                if lane_run.running:
                    try:
                        lane_run.checkpoint(name)
                        lane_run.end("interrupted")
                    except Exception as exc:  # noqa: BLE001  recorded in this lane's summary.json
                        fail(lane_run, exc)
            break
        iterated = True
        running = [lane_run.running for lane_run in runs]
        iterations = [lane_run.iteration for lane_run in runs]
        try:
            collected = stack.collect(iterations, running)
            remaining, lrs = [], []
            for lane_run, batch in zip(runs, collected, strict=True):
                if batch is not None:
                    lane_run.global_step += batch.env_steps
                    lane_run.iteration += 1
                remaining.append(max(1.0 - lane_run.global_step / lane_run.cfg.total_steps, 0.0))
                lrs.append(lane_run.cfg.learning_rate * (remaining[-1] if lane_run.cfg.anneal_lr else 1.0))
            metrics = stack.update(collected, [r.iteration for r in runs], remaining, lrs, running)
        except Exception as exc:  # noqa: BLE001  the shared iteration failed: every running lane with it
            for k, lane_run in enumerate(r for r in runs if r.running):
                fail(lane_run, exc, show=k == 0)
            break
        stopping = stop.raised  # read once: a signal landing between two reads would skip a checkpoint
        for lane_run, batch, lane_metrics, lr in zip(runs, collected, metrics, lrs, strict=True):
            if batch is None or not lane_run.running:
                continue
            try:
                lane_metrics = {**lane_metrics, "charts/learning_rate": lr}
                runlog.check_finite({k: v for k, v in lane_metrics.items() if k in LOSS_TAGS and v is not None},
                                    lane_run.lane.model)  # fmt: skip
                assert lane_run.tracker is not None
                # The last iteration's row carries the final evaluation, unless the run is being stopped.
                final = lane_run.global_step >= lane_run.cfg.total_steps and not stopping
                stopping |= not lane_run.tracker.record(lane_run.global_step, lane_metrics, lane_run.lane,
                                                        batch.episode_returns, batch.episode_lengths, final)  # fmt: skip
                if lane_run.tracker.checkpoint_due(lane_run.global_step, stopping):
                    lane_run.checkpoint(name)
                if stopping:
                    lane_run.end("interrupted")
                elif lane_run.global_step >= lane_run.cfg.total_steps:
                    lane_run.checkpoint(name)
                    lane_run.end("completed")
            except Exception as exc:  # noqa: BLE001  recorded in this lane's summary.json
                fail(lane_run, exc)


class RunTracker:
    """What the lifecycle does around each iteration: the TensorBoard and CSV rows, periodic evaluation,
    the progress line, the checkpoint schedule, the wall clock, and the end of the run."""

    def __init__(
        self,
        run_dir: Path,
        algo: str,
        cfg: RunConfig,
        tags: list[str],
        global_step: int,
        wall_offset: float,
        resume: bool,
        csv_bytes: int | None = None,
        eval_step: int | None = None,
    ) -> None:
        self.run_dir, self.algo, self.cfg = run_dir, algo, cfg
        self.log = runlog.MetricLog(run_dir, tags, resume_step=global_step if resume else None, csv_bytes=csv_bytes)
        self.evals = EvalSchedule(cfg.eval_interval, cfg.device, global_step, eval_step)
        self.progress = runlog.Progress(cfg.total_steps, global_step, f"{algo} {cfg.env_id} seed {cfg.seed}")
        self.recent_returns: deque[float] = deque(maxlen=20)
        self.start_step = self.last_checkpoint_step = global_step
        self.wall_offset = wall_offset
        self.start_time = time.perf_counter()

    def wall_time(self) -> float:
        """Training time of the whole run, earlier sessions of a resumed run included."""
        return self.wall_offset + time.perf_counter() - self.start_time

    def sps(self, step: int) -> float:
        """Env steps per second in this session."""
        return (step - self.start_step) / max(time.perf_counter() - self.start_time, 1e-9)

    def record(
        self,
        step: int,
        metrics: dict[str, float | None],
        agent: Lane,
        episode_returns: Sequence[float],
        episode_lengths: Sequence[float],
        final: bool = False,
    ) -> bool:
        """One iteration: every finished episode and the metrics to TensorBoard, a CSV row with the
        episodes' means, an evaluation when one is due or when this is the ``final`` iteration (its row
        then holds the run's final evaluation), and the progress line.

        Returns False when a second stop signal cut the final evaluation short: the row is written without
        it, and the run is to stop there (a resume evaluates it, :meth:`finish`)."""
        for ret, length in zip(episode_returns, episode_lengths, strict=True):
            self.log.scalars(step, {"charts/episodic_return": ret, "charts/episodic_length": length})
        self.recent_returns.extend(episode_returns)
        sps = self.sps(step)
        evaluation, evaluated = self.evals.maybe_run(agent, step), True
        if final:
            try:
                evaluation = self.evals.run(agent, step)
            except KeyboardInterrupt:
                evaluated = False
        metrics = {**metrics, "charts/SPS": sps, **evaluation}
        self.log.scalars(step, metrics)
        self.log.row(step, self.wall_time(), {
            **metrics,
            "charts/episodic_return": float(np.mean(episode_returns)) if len(episode_returns) else None,
            "charts/episodic_length": float(np.mean(episode_lengths)) if len(episode_lengths) else None,
        })  # fmt: skip
        self.progress.update(step, sps, float(np.mean(self.recent_returns)) if self.recent_returns else None)
        return evaluated

    def checkpoint_due(self, step: int, stopping: bool) -> bool:
        """Every ``checkpoint_interval`` env steps, and when the run is being stopped."""
        interval = self.cfg.checkpoint_interval
        if stopping or (interval and step - self.last_checkpoint_step >= interval):
            self.last_checkpoint_step = step
            return True
        return False

    def finish(self, agent: Lane, status: str, error: str | None, step: int) -> dict[str, Any]:
        """Final evaluation (completed runs only), summary.json, hyperparameters, flushed logs.

        A second stop signal during the final evaluation ends it: the run is then ``interrupted`` at its
        last checkpoint, and a resume evaluates it again.
        """
        self.progress.close()
        wall_time_s, sps = self.wall_time(), self.sps(step)
        final: dict[str, float] = {}
        if status == "completed":
            try:
                # Usually the last iteration's row holds it already, as does a run killed between its last
                # checkpoint and its summary. A run stopped before it could evaluate gets it now, in that row.
                logged = self.evals.logged_at(step)
                final = self.evals.run(agent, step)
                if not logged:
                    self.log.scalars(step, final)
                    self.log.fill_last_row(step, final)
            except KeyboardInterrupt:
                status, final = "interrupted", {}
        if step > self.cfg.total_steps:
            # Iterations are whole: a budget smaller than one is a run of one iteration, not an error.
            print(f"trained {step} env steps, {step - self.cfg.total_steps} past total_steps={self.cfg.total_steps}: "
                  "the last iteration ran whole", file=sys.stderr)  # fmt: skip
        summary = {
            "algo": self.algo,
            "env_id": self.cfg.env_id,
            "seed": self.cfg.seed,
            "status": status,
            "total_steps": step,
            "requested_steps": self.cfg.total_steps,
            "wall_time_s": round(wall_time_s, 3),
            "sps": round(sps, 1),
            "final_eval_return_mean": final.get("eval/return_mean"),
            "final_eval_return_std": final.get("eval/return_std"),
            "final_eval_episodes": self.cfg.eval_episodes if final else 0,
            "eval_convention": "deterministic policy, one episode per fixed seed 1000000+i, raw env return",
            "error": error,
            **memory_report(agent.optimizer, **agent.networks),
        }
        if final:
            self.log.hparams(rundir.config_to_dict(self.cfg), {"final_eval_return_mean": final["eval/return_mean"]})
        self.log.close()
        rundir.write_summary(self.run_dir, summary)
        return summary


def memory_report(optimizer: torch.optim.Optimizer, **modules: torch.nn.Module) -> dict[str, int]:
    """Parameter counts of each network and the bytes that networks and optimizer state hold."""
    report = {f"parameters_{name}": sum(p.numel() for p in m.parameters()) for name, m in modules.items()}
    tensors = [p for m in modules.values() for p in m.parameters()]
    tensors += [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
    report["model_memory_bytes"] = sum(t.numel() * t.element_size() for t in tensors)
    return report
