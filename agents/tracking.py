"""What the lifecycle does around each iteration of a run: the TensorBoard and CSV rows, periodic and final
evaluation, the progress line, the checkpoint schedule, the wall clock, and the summary at the end."""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

import envs as envs_pkg
from agents import rundir, runlog
from agents.config import RunConfig
from agents.networks import Actor, ActorCritic
from agents.rollout import evaluate_policies, evaluate_policy
from agents.run_envs import EVAL_SEED_BASE
from envs.bsuite import is_bsuite


def evaluate(
    policies: Sequence[torch.nn.Module],
    eval_envs: Sequence[Any],
    obs_stats: Sequence[dict[str, Any]],
    device: str = "cpu",
) -> list[np.ndarray]:
    """One deterministic episode per eval sub-env of each seed's policy, each with its own training observation
    statistics, frozen; returns each seed's returns. Our networks act together, one batched forward pass per
    step for every seed (:func:`~agents.rollout.evaluate_policies`); another policy (SB3's) acts alone."""
    for eval_env, stats in zip(eval_envs, obs_stats, strict=True):
        envs_pkg.load_normalizer_state(eval_env, stats)
    seeds = [EVAL_SEED_BASE + i for i in range(eval_envs[0].num_envs)]
    if all(isinstance(policy, (Actor, ActorCritic)) for policy in policies):
        return evaluate_policies(list(policies), list(eval_envs), seeds, device)
    return [evaluate_policy(policy, env, seeds, True, device) for policy, env in zip(policies, eval_envs, strict=True)]


class StackEvaluations:
    """The evaluations of a stack's seeds, those due at the same step run together (:func:`evaluate`).

    Before each iteration's per-seed logging the lifecycle names the seeds whose evaluation is due
    (:meth:`plan`); the first of them to evaluate (:meth:`evaluate`, its :class:`EvalSchedule`'s) evaluates
    all of them at once and the others take their returns from it. A seed evaluating unplanned (the final
    evaluation of a run resumed at its budget, a clock that ran out between the plan and the logging) or
    after a joint evaluation failed evaluates alone, with the same numbers. ``evaluate_seeds(ks)`` evaluates
    seeds ``ks`` together.
    """

    def __init__(self, evaluate_seeds: Callable[[list[int]], list[np.ndarray]]) -> None:
        self.evaluate_seeds = evaluate_seeds
        self.planned: list[int] = []  # seeds due this iteration and not evaluated yet
        self.returns: dict[int, np.ndarray] = {}  # this iteration's evaluations, by seed, until taken

    def plan(self, seeds: list[int]) -> None:
        self.planned, self.returns = list(seeds), {}

    def evaluate(self, k: int) -> np.ndarray:
        """Seed k's returns: from this iteration's evaluation of every planned seed, which the first of them runs."""
        if k not in self.returns:
            together = self.planned if k in self.planned else [k]
            # Cleared first: a second stop signal that cuts this evaluation short leaves every other seed to
            # evaluate alone, as each did before seeds were evaluated together.
            self.planned = [j for j in self.planned if j not in together]
            try:
                self.returns.update(zip(together, self.evaluate_seeds(together), strict=True))
            except Exception:
                if together == [k]:
                    raise
                # One seed's policy broke the env (a diverged one's NaN actions, say): each evaluates alone,
                # so that the error is its own seed's.
                self.returns[k] = self.evaluate_seeds([k])[0]
        return self.returns.pop(k)


class EvalSchedule:
    """Deterministic evaluation every ``interval`` env steps (0: only at the end), by ``evaluate()``."""

    def __init__(
        self, interval: int, evaluate: Callable[[], np.ndarray], start_step: int, logged_step: int | None = None
    ) -> None:
        self.interval, self.evaluate = interval, evaluate
        self.next_step = (start_step // interval + 1) * interval if interval else math.inf
        self.last: tuple[int, np.ndarray] | None = None
        self.logged_step = logged_step  # the last evaluation's step, this session's or a resumed checkpoint's

    def logged_at(self, step: int) -> bool:
        """An evaluation at ``step`` is in the logs already, in this session or before its checkpoint."""
        return self.logged_step == step  # run() sets it with every evaluation

    def maybe_run(self, step: int) -> dict[str, float]:
        if step < self.next_step:
            return {}
        while self.next_step <= step:
            self.next_step += self.interval
        return self.run(step)

    def due(self, step: int, final: bool) -> bool:
        """Whether :meth:`RunTracker.record` at ``step`` (the run's ``final`` iteration or not) evaluates."""
        return (final or step >= self.next_step) and not self.ran_at(step)

    def ran_at(self, step: int) -> bool:
        return self.last is not None and self.last[0] == step

    def run(self, step: int) -> dict[str, float]:
        if not self.ran_at(step):
            self.last = (step, self.evaluate())
            self.logged_step = step
        returns = self.last[1]
        return {"eval/return_mean": float(returns.mean()), "eval/return_std": float(returns.std())}


class RunTracker:
    """What the lifecycle does around each iteration: the TensorBoard and CSV rows, periodic evaluation,
    the progress line, the checkpoint schedule, the wall clock, and the end of the run."""

    def __init__(
        self,
        run_dir: Path,
        algo: str,
        cfg: RunConfig,
        tags: list[str],
        evaluate: Callable[[], np.ndarray],
        global_step: int,
        wall_offset: float,
        resume: bool,
        csv_bytes: int | None = None,
        eval_step: int | None = None,
    ) -> None:
        self.run_dir, self.algo, self.cfg = run_dir, algo, cfg
        self.log = runlog.MetricLog(
            run_dir,
            tags,
            resume_step=global_step if resume else None,
            csv_bytes=csv_bytes,
            episodes=is_bsuite(cfg.env_id),  # bsuite scores a run by its episodes
        )
        self.evals = EvalSchedule(cfg.eval_interval, evaluate, global_step, eval_step)
        self.progress = runlog.Progress(cfg.total_steps, global_step, f"{algo} {cfg.env_id} seed {cfg.seed}")
        self.recent_returns: deque[float] = deque(maxlen=20)
        self.last_row: dict[str, float] = {}
        """The numbers of the last progress.csv row, by column (its empty cells left out): what a callback is given."""
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
        episode_returns: Sequence[float],
        episode_lengths: Sequence[float],
        final: bool = False,
        episode_last_rewards: Sequence[float] = (),
    ) -> bool:
        """One iteration: every finished episode and the metrics to TensorBoard (and to episodes.csv, for a
        bsuite env), a CSV row with the episodes' means, an evaluation when one is due or when this is the
        ``final`` iteration (its row then holds the run's final evaluation), and the progress line.

        Returns False when a second stop signal cut the final evaluation short: the row is written without
        it, and the run is to stop there (a resume evaluates it, :meth:`finish`)."""
        for ret, length in zip(episode_returns, episode_lengths, strict=True):
            self.log.scalars(step, {"charts/episodic_return": ret, "charts/episodic_length": length})
        if self.log.episodes is not None:
            self.log.episodes.write(step, list(episode_returns), list(episode_lengths), list(episode_last_rewards))
        self.recent_returns.extend(episode_returns)
        sps = self.sps(step)
        evaluation, evaluated = self.evals.maybe_run(step), True
        if final:
            try:
                evaluation = self.evals.run(step)
            except KeyboardInterrupt:
                evaluated = False
        metrics = {**metrics, "charts/SPS": sps, **evaluation}
        self.log.scalars(step, metrics)
        row = {
            **metrics,
            "charts/episodic_return": float(np.mean(episode_returns)) if len(episode_returns) else None,
            "charts/episodic_length": float(np.mean(episode_lengths)) if len(episode_lengths) else None,
        }
        self.log.row(step, self.wall_time(), row)
        self.last_row = {tag: float(value) for tag, value in row.items() if value is not None}
        self.progress.update(step, sps, float(np.mean(self.recent_returns)) if self.recent_returns else None)
        return evaluated

    def checkpoint_due(self, step: int, stopping: bool) -> bool:
        """Every ``checkpoint_interval`` env steps, and when the run is being stopped."""
        interval = self.cfg.checkpoint_interval
        if stopping or (interval and step - self.last_checkpoint_step >= interval):
            self.last_checkpoint_step = step
            return True
        return False

    def finish(
        self, status: str, error: str | None, step: int, memory: dict[str, int], diverged: bool = False
    ) -> dict[str, Any]:
        """Final evaluation (completed runs only), summary.json, hyperparameters, flushed logs. ``memory``:
        the run's :func:`memory_report`, for the summary. ``diverged``: a failure on non-finite values, which
        on the CPU the same config and seed reach again, so the lab does not retry it.

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
                final = self.evals.run(step)
                if not logged:
                    self.log.scalars(step, final)
                    self.log.fill_last_row(step, final)
            except KeyboardInterrupt:
                status, final = "interrupted", {}
        if step > self.cfg.total_steps:
            # Iterations are whole: a budget smaller than one is a run of one iteration, not an error.
            print(
                f"trained {step} env steps, {step - self.cfg.total_steps} past total_steps={self.cfg.total_steps}: "
                "the last iteration ran whole",
                file=sys.stderr,
            )
        summary = {
            "algo": self.algo,
            "env_id": self.cfg.env_id,
            "seed": self.cfg.seed,
            "status": status,
            "total_steps": step,
            "requested_steps": self.cfg.total_steps,
            "budget_seconds": self.cfg.budget_seconds,
            "wall_time_s": round(wall_time_s, 3),
            "sps": round(sps, 1),
            "final_eval_return_mean": final.get("eval/return_mean"),
            "final_eval_return_std": final.get("eval/return_std"),
            "final_eval_episodes": self.cfg.eval_episodes if final else 0,
            "eval_convention": "deterministic policy, one episode per fixed seed 1000000+i, raw env return",
            "error": error,
            "diverged": diverged,
            **memory,
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
