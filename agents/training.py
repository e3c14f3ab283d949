"""The one run lifecycle every algorithm shares.

:func:`run_stack` owns a run's life, for S seeds side by side (a single run: S = 1): seeding, resume, stop
signals, the learning-rate schedule, checkpoints, evaluation, status and summary. An algorithm supplies only
what differs, a :class:`Trainer`: ``collect`` (one iteration's experience for every seed) and ``learn``
(learning from it), each seed's own state to save and load, and a :class:`Trainee` per seed (its networks,
optimizer and evaluation env). So PPO's iteration (``ppo.py``: collect → GAE → update) and GRPO's
(``grpo.py``: groups → group advantages → update) each read top to bottom in one file, as Stable-Baselines3's
``OnPolicyAlgorithm.learn`` drives each algorithm's ``train()``, without a class hierarchy. A run's envs are
``agents.run_envs``'s, the logs and evaluations around each iteration ``agents.tracking``'s.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from gymnasium.vector import VectorEnv

from agents import rundir, runlog
from agents.config import RunConfig
from agents.networks import load_weights
from agents.tracking import RunTracker, StackEvaluations, evaluate, memory_report
from envs.errors import BadInput

# ── what an algorithm supplies ───────────────────────────────────────────────────────────────────


@dataclass
class Experience:
    """One iteration's experience, as an agent's ``collect`` returns it."""

    batch: Any  # what the agent's update learns from: PPO's Segment, GRPO's Groups
    env_steps: int  # env steps the collection took; they count toward total_steps
    episode_returns: Sequence[float]  # raw returns of the episodes that ended, for the logs
    episode_lengths: Sequence[float]
    episode_last_rewards: Sequence[float] = ()  # raw reward of each episode's last step (bsuite scores by it)


@dataclass
class Trainee:
    """One seed's share of what is trained: what its run directory records and what evaluates it."""

    model: torch.nn.Module
    """Every trained parameter: saved as the checkpoint's ``model`` and checked for NaN after each update."""
    policy: torch.nn.Module
    """What evaluation acts with (``act`` and ``deterministic_action``); usually ``model`` itself."""
    optimizer: torch.optim.Optimizer
    """Its state is saved as the checkpoint's ``optimizer`` (a single run's torch optimizer state dict)."""
    eval_env: VectorEnv
    obs_stats: Callable[[], dict[str, Any]]
    """The training observation statistics, which evaluation uses frozen."""
    networks: dict[str, torch.nn.Module]
    """Networks whose sizes the summary reports, by name."""


class Generators(Protocol):
    """Each seed's random number generators, for its checkpoint (``stacked.SeedGenerators``)."""

    def state(self, k: int) -> dict[str, Any]: ...

    def load(self, k: int, state: dict[str, Any]) -> None: ...


class Trainer(Protocol):
    """What one algorithm supplies to :func:`run_stack`, for S seeds side by side: Stable-Baselines3's split of
    collecting and learning, without inheritance. Seed k's work never depends on the other seeds."""

    tags: list[str]
    """TensorBoard tags, which are also the columns of progress.csv."""
    finite: tuple[str, ...]
    """The tags of its losses that must stay finite: a NaN or inf in one stops the seed's run, with the last good
    checkpoint kept."""
    trainees: list[Trainee]
    """One per seed."""
    random: Generators

    def collect(self, iterations: list[int], running: list[bool]) -> list[Experience | None]:
        """Each running seed's experience for one iteration (None for a seed no longer running)."""
        ...

    def learn(
        self,
        collected: list[Experience | None],
        iterations: list[int],
        progress_remaining: list[float],
        learning_rates: list[float],
        running: list[bool],
    ) -> list[dict[str, float | None]]:
        """Learn from it, each seed at its scheduled learning rate; each seed's metrics to log, by tag."""
        ...

    def save(self, k: int) -> dict[str, Any]:
        """Seed k's own checkpoint entries (env state, reference policy, normalizers)."""
        ...

    def load(self, k: int, checkpoint: dict[str, Any]) -> None:
        """Restore them from a checkpoint."""
        ...

    def close(self) -> None: ...


Callback = Callable[[int, dict[str, float]], "bool | None"]
"""``callback(step, metrics)``, called after each iteration's row is logged, with the env steps so far and the
row's numbers by progress.csv column (``losses/policy_loss``, ``eval/return_mean`` when it evaluated, …);
returning False stops the run as Ctrl-C does (:func:`agents.runlog.request_stop` does too): it checkpoints and
ends ``interrupted``, to be resumed. In a stack, each seed's row calls it, and a stop stops every seed."""


def check_stack(cfgs: Sequence[RunConfig]) -> None:
    """Seeds train as one stack when their configs differ in the seed alone (and the budget, which a resume
    may raise); BadInput otherwise."""
    shared = [{k: v for k, v in rundir.config_to_dict(cfg).items() if k not in ("seed", "total_steps")} for cfg in cfgs]
    differing = sorted(k for k in shared[0] if any(s[k] != shared[0][k] for s in shared[1:]))
    if differing:
        raise BadInput(
            f"seeds in one stack must share every setting but the seed; they differ in {', '.join(differing)}"
        )
    if len({cfg.seed for cfg in cfgs}) != len(cfgs):
        raise BadInput(f"the seeds of a stack must differ, got {[cfg.seed for cfg in cfgs]}")


# ── the lifecycle ────────────────────────────────────────────────────────────────────────────────


@dataclass
class SeedRun:
    """The lifecycle's record of one seed: where it writes, how far it got, and how it ended."""

    cfg: RunConfig
    run_dir: Path
    k: int
    trainer: Trainer
    tracker: RunTracker | None = None
    global_step: int = 0
    iteration: int = 0
    status: str | None = None  # None while it trains; then completed, failed or interrupted
    error: str | None = None
    summary: dict[str, Any] | None = None

    @property
    def trainee(self) -> Trainee:
        return self.trainer.trainees[self.k]

    @property
    def running(self) -> bool:
        return self.status is None

    @property
    def budget_spent(self) -> bool:
        """total_steps trained, or the wall-clock budget (``budget_seconds``) spent."""
        budget = self.cfg.budget_seconds
        timed_out = budget is not None and self.tracker is not None and self.tracker.wall_time() >= budget
        return self.global_step >= self.cfg.total_steps or timed_out

    def resume(self, name: str) -> tuple[float, int | None, int | None]:
        """Weights, optimizer, the seed's own state and its random number generators from the checkpoint;
        returns what the tracker continues from: (wall time so far, progress.csv's size, last evaluation step).

        BadInput, with nothing written, for a checkpoint that cannot be continued; one holding NaN or inf is
        recorded first as diverged (summary.json), so that a bench neither retries nor trains it again."""
        try:
            ckpt = runlog.load_checkpoint(self.run_dir, {"algo": name, "env_id": self.cfg.env_id})
        except runlog.NonFiniteCheckpoint as error:
            run = {"algo": name, "env_id": self.cfg.env_id, "seed": self.cfg.seed}
            runlog.record_diverged(self.run_dir, error, run)
            raise
        load_weights(self.trainee.model, ckpt["model"], str(self.run_dir / rundir.CHECKPOINT))
        self.trainee.optimizer.load_state_dict(ckpt["optimizer"])
        self.trainer.load(self.k, ckpt)
        self.global_step, self.iteration = ckpt["global_step"], ckpt["iteration"]
        self.trainer.random.load(self.k, ckpt["rng"])
        return ckpt["wall_time_s"], ckpt.get("csv_bytes"), ckpt.get("eval_step")

    def evaluation_due(self, stopping: bool) -> bool:
        """Whether this iteration's :meth:`RunTracker.record` is to evaluate the seed, as :func:`train_seeds` calls it
        (``stopping``: a stop signal came, and the final iteration's row goes without its evaluation)."""
        assert self.tracker is not None
        return self.running and self.tracker.evals.due(self.global_step, self.budget_spent and not stopping)

    @property
    def keeps_due(self) -> list[str]:
        """The kept checkpoints (``keep_checkpoints``) whose step has been reached and that are not written yet."""
        names = [rundir.kept_checkpoint(s) for s in self.cfg.keep_checkpoints if s <= self.global_step]
        return [kept for kept in names if not (self.run_dir / kept).exists()]

    def checkpoint(self, name: str) -> None:
        assert self.tracker is not None
        self.tracker.log.flush()
        runlog.save_checkpoint(
            self.run_dir,
            {
                "algo": name,
                "env_id": self.cfg.env_id,
                "global_step": self.global_step,
                "iteration": self.iteration,
                "wall_time_s": self.tracker.wall_time(),
                "csv_bytes": self.tracker.log.csv_bytes(),
                "rng": self.trainer.random.state(self.k),
                "eval_step": self.tracker.evals.logged_step,
                "model": self.trainee.model.state_dict(),
                "optimizer": self.trainee.optimizer.state_dict(),
                **self.trainer.save(self.k),
            },
        )
        for kept in self.keeps_due:
            runlog.keep_checkpoint(self.run_dir, kept)

    def end(self, status: str, error: str | None = None, diverged: bool = False) -> None:
        """Final evaluation (completed runs) and summary.json; the seed trains no more. ``diverged``: it
        failed on non-finite values, which the same config and seed reach again."""
        assert self.tracker is not None
        self.status, self.error = status, error
        memory = memory_report(self.trainee.optimizer, **self.trainee.networks)
        self.summary = self.tracker.finish(status, error, self.global_step, memory, diverged)


def evaluate_seeds(trainer: Trainer, device: str, ks: list[int]) -> list[np.ndarray]:
    """One deterministic evaluation of seeds ``ks``'s policies together, each with its training observation
    statistics; each seed's returns."""
    trainees = [trainer.trainees[k] for k in ks]
    policies, envs = [trainee.policy for trainee in trainees], [trainee.eval_env for trainee in trainees]
    return evaluate(policies, envs, [trainee.obs_stats() for trainee in trainees], device)


def failure(exc: Exception, run_dir: Path, show: bool = True) -> tuple[str, OSError | None]:
    """The error a failed run records, and the disk error to report after it, if that was the cause.
    ``show``: print an unexpected crash's traceback (once per crash, not once per seed)."""
    if isinstance(exc, runlog.NonFiniteError):
        return str(exc), None
    if isinstance(exc, OSError):  # a full or read-only disk: recorded where it still can be, then reported
        return f"cannot write to {run_dir}: {exc.strerror or exc}", exc
    if show:
        traceback.print_exc()  # any other crash is recorded in summary.json, then shown in full
    return f"{type(exc).__name__}: {exc}", None


def run_stack(
    build: Callable[[list[Any]], Trainer],
    cfgs: Sequence[RunConfig],
    run_dirs: Sequence[Path],
    resume: bool | Sequence[bool],
    name: str,
    callback: Callback | None = None,
) -> list[dict[str, Any]]:
    """Train the seeds that ``build(cfgs)`` makes, seed k into ``run_dirs[k]``; returns each seed's summary,
    also written to its ``summary.json``. ``build`` seeds each trainee. ``resume``: whether each seed continues
    from its checkpoint (one bool: all of them); a stack may hold both, and trainees at or past their budget,
    which complete without training. ``callback``: see :data:`Callback`.

    One iteration: ``collect`` → the learning-rate schedule → ``learn`` → per seed: log, evaluate,
    checkpoint. The schedule decays by the fraction of the budget still to go after this iteration's
    steps, as SB3 computes it, so the RL Zoo presets mean the same here. Progress rows and TensorBoard
    events reach the disk before each checkpoint, which records how far progress.csv went: a resume after
    any kill writes each iteration exactly once. A seed that fails (a NaN, a full disk) ends alone; the
    others go on. A failure of the shared iteration itself ends every running trainee.
    """
    resumes = [resume] * len(cfgs) if isinstance(resume, bool) else list(resume)
    trainer = build(list(cfgs))
    runs = [SeedRun(cfg, run_dir, k, trainer) for k, (cfg, run_dir) in enumerate(zip(cfgs, run_dirs, strict=True))]
    evaluations = StackEvaluations(partial(evaluate_seeds, trainer, cfgs[0].device))
    try:
        # Every seed's checkpoint and progress.csv are checked before any seed's logs are opened (and cut back to
        # its checkpoint): a resume refused for one seed of a stack changes no file of the others.
        starts = [
            run.resume(name) if resumed else (0.0, None, None) for run, resumed in zip(runs, resumes, strict=True)
        ]
        for seed_run, resumed, (_, csv_bytes, _) in zip(runs, resumes, starts, strict=True):
            if resumed:
                runlog.check_progress(seed_run.run_dir, csv_bytes)
        for seed_run, resumed, (wall_offset, csv_bytes, eval_step) in zip(runs, resumes, starts, strict=True):
            seed_run.tracker = RunTracker(
                seed_run.run_dir,
                name,
                seed_run.cfg,
                trainer.tags,
                partial(evaluations.evaluate, seed_run.k),
                seed_run.global_step,
                wall_offset,
                resumed,
                csv_bytes,
                eval_step,
            )
    except BaseException:
        trainer.close()
        raise
    disk_errors: list[OSError] = []

    def fail(seed_run: SeedRun, exc: Exception, show: bool = True) -> None:
        error, disk_error = failure(exc, seed_run.run_dir, show)
        disk_errors.extend([disk_error] if disk_error else [])
        seed_run.end("failed", error, diverged=isinstance(exc, runlog.NonFiniteError))

    try:
        with runlog.StopFlag() as stop:
            train_seeds(trainer, runs, stop, fail, name, evaluations, callback)
    finally:
        trainer.close()
    if disk_errors:
        raise disk_errors[0]  # the command line reports it in one line, with exit status 2
    return [seed_run.summary or {} for seed_run in runs]


def entry_points(
    build: Callable[[list[Any]], Trainer], name: str, checks: Callable[[Any], None] | None = None
) -> tuple[Callable[..., dict[str, Any]], Callable[..., list[dict[str, Any]]]]:
    """An algorithm's two ways in, both :func:`run_stack` with its ``build``: ``train(cfg, run_dir, resume=False,
    name=name)``, a stack of one that returns its summary, and ``train_stack(cfgs, run_dirs, resume=False,
    name=name)``, seeds side by side in this process, returning their summaries. ``checks``: the algorithm's
    own, run on every config before anything is built."""

    def train_stack(
        cfgs: list[Any],
        run_dirs: list[Path],
        resume: bool | list[bool] = False,
        name: str = name,
        callback: Callback | None = None,
    ) -> list[dict[str, Any]]:
        for cfg in cfgs if checks is not None else ():
            checks(cfg)
        return run_stack(build, cfgs, run_dirs, resume, name, callback)

    def train(
        cfg: Any, run_dir: Path, resume: bool = False, name: str = name, callback: Callback | None = None
    ) -> dict[str, Any]:
        return train_stack([cfg], [run_dir], resume, name, callback)[0]

    return train, train_stack


def train_seeds(
    trainer: Trainer,
    runs: list[SeedRun],
    stop: runlog.StopFlag,
    fail: Callable[..., None],
    name: str,
    evaluations: StackEvaluations,
    callback: Callback | None = None,
) -> None:
    """The iterations of :func:`run_stack`, until every seed has completed, failed or been interrupted."""
    for seed_run in runs:
        if seed_run.budget_spent:  # resumed at or past its budget
            try:
                seed_run.checkpoint(name)
                seed_run.end("completed")
            except Exception as exc:  # noqa: BLE001
                fail(seed_run, exc)
    iterated = False
    while any(seed_run.running for seed_run in runs):
        if iterated and stop.raised:  # the stop came after the last iteration read it: end there, start no other
            for seed_run in runs:
                if seed_run.running:
                    try:
                        seed_run.checkpoint(name)
                        seed_run.end("interrupted")
                    except Exception as exc:  # noqa: BLE001  recorded in this seed's summary.json
                        fail(seed_run, exc)
            break
        iterated = True
        running = [seed_run.running for seed_run in runs]
        iterations = [seed_run.iteration for seed_run in runs]
        try:
            collected = trainer.collect(iterations, running)
            remaining, lrs = [], []
            for seed_run, batch in zip(runs, collected, strict=True):
                if batch is not None:
                    seed_run.global_step += batch.env_steps
                    seed_run.iteration += 1
                remaining.append(max(1.0 - seed_run.global_step / seed_run.cfg.total_steps, 0.0))
                lrs.append(seed_run.cfg.learning_rate * (remaining[-1] if seed_run.cfg.anneal_lr else 1.0))
            metrics = trainer.learn(collected, [r.iteration for r in runs], remaining, lrs, running)
        except Exception as exc:  # noqa: BLE001  the shared iteration failed: every running seed with it
            for k, seed_run in enumerate(r for r in runs if r.running):
                fail(seed_run, exc, show=k == 0)
            break
        stopping = stop.raised  # read once: a signal landing between two reads would skip a checkpoint
        # The trainees due an evaluation at this iteration run it together, when the first of them logs.
        due = [r.k for r, c in zip(runs, collected, strict=True) if c is not None and r.evaluation_due(stopping)]
        evaluations.plan(due)
        for seed_run, batch, seed_metrics, lr in zip(runs, collected, metrics, lrs, strict=True):
            if batch is None or not seed_run.running:
                continue
            try:
                seed_metrics = {**seed_metrics, "charts/learning_rate": lr}
                runlog.check_finite(
                    {k: v for k, v in seed_metrics.items() if k in trainer.finite and v is not None},
                    seed_run.trainee.model,
                )
                assert seed_run.tracker is not None
                # The last iteration's row carries the final evaluation, unless the run is being stopped.
                spent = seed_run.budget_spent  # read once: the clock moves between two reads
                final = spent and not stopping
                stopping |= not seed_run.tracker.record(
                    seed_run.global_step,
                    seed_metrics,
                    batch.episode_returns,
                    batch.episode_lengths,
                    final,
                    batch.episode_last_rewards,
                )
                # A callback's stop is a stop signal's: the seeds done with this iteration stop at the loop's top.
                if callback is not None and callback(seed_run.global_step, dict(seed_run.tracker.last_row)) is False:
                    stop.request()
                    stopping |= not spent
                if seed_run.tracker.checkpoint_due(seed_run.global_step, stopping) or seed_run.keeps_due:
                    seed_run.checkpoint(name)
                if stopping:
                    seed_run.end("interrupted")
                elif spent:
                    seed_run.checkpoint(name)
                    seed_run.end("completed")
            except Exception as exc:  # noqa: BLE001  recorded in this seed's summary.json
                fail(seed_run, exc)
