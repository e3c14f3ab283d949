"""Final returns over seeds: one ``python -m lab train`` per seed, gathered into a CSV and a Markdown table.

    python benchmarks/learning.py --env CartPole-v1 --seeds 0 1 2 3 4 [--total-steps N] [--algo ppo]
        [--workers 1] [--root runs/results] [--out benchmarks/results/ppo_learning.csv]

Each seed trains in ``ROOT/ENV/ALGO/seedS`` (its output also goes to ``ROOT/ENV/ALGO/seedS.log``). The
script is idempotent: a completed run is skipped, a run with a checkpoint but not completed is resumed,
and a failed run is recorded without stopping the others. After each run, its row is upserted into the
CSV (keyed by algo, env_id, seed) and the Markdown file beside it (same stem, ``.md``) is regenerated
from the whole CSV, so results of earlier invocations stay.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the machine line and the command come from speed.py
from speed import ROOT, child_env, machine_line, public_command

FIELDS = [
    "algo",
    "env_id",
    "seed",
    "status",
    "total_steps",
    "final_eval_return_mean",
    "final_eval_return_std",
    "final_eval_episodes",
    "wall_time_s",
    "sps",
]
Key = tuple[str, str, str]  # (algo, env_id, seed), as text the way the CSV holds it


@dataclass(frozen=True)
class Job:
    algo: str
    env_id: str
    seed: int
    run_dir: Path  # absolute: the training process runs in the repository root
    resume: bool
    set_aside: bool = False  # the directory holds a run that ended before its first checkpoint


def run_dir_for(root: Path, env_id: str, algo: str, seed: int) -> Path:
    return root / env_id.replace("/", "_") / algo / f"seed{seed}"


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None


def row_from(algo: str, env_id: str, seed: int, summary: dict[str, Any] | None) -> dict[str, Any]:
    """A CSV row; a run that left no summary (it crashed, or its input was refused) counts as failed."""
    row = {k: (summary or {}).get(k) for k in FIELDS}
    row.update({"algo": algo, "env_id": env_id, "seed": seed})
    if summary is None:
        row["status"] = "failed"
    return row


# ── deciding what to run ───────────────────────────────────────────────────────────────────────────


class Refused(Exception):
    """Input that would mix or overwrite results; the message says how to fix it."""


def plan(args: argparse.Namespace) -> tuple[list[Job], list[dict[str, Any]]]:
    """The runs to start or resume, and the rows of runs already completed (skipped)."""
    jobs, done = [], []
    for env_id in args.env:
        for algo in args.algo:
            for seed in args.seeds:
                run_dir = run_dir_for(Path(args.root).resolve(), env_id, algo, seed)
                summary = read_summary(run_dir)
                if summary is not None and summary.get("status") == "completed":
                    planned = yaml.safe_load((run_dir / "config.yaml").read_text()).get("total_steps")
                    if args.total_steps is not None and planned != args.total_steps:
                        # Skipping would mix budgets in one table; extending would change its schedules.
                        raise Refused(
                            f"{run_dir} holds a completed run of {planned} steps, not --total-steps "
                            f"{args.total_steps}. Choose another --root, or move that run away."
                        )
                    print(f"{env_id} {algo} seed {seed}: completed already, skipped")
                    done.append(row_from(algo, env_id, seed, summary))
                elif (run_dir / "checkpoint.pt").exists():
                    jobs.append(Job(algo, env_id, seed, run_dir, resume=True))
                else:
                    stale = run_dir.exists() and any(run_dir.iterdir())
                    jobs.append(Job(algo, env_id, seed, run_dir, resume=False, set_aside=stale))
    return jobs, done


def set_aside(run_dir: Path) -> None:
    """Rename a run that ended before its first checkpoint, so that a new one can start; nothing is deleted."""
    aside = run_dir.with_name(f"{run_dir.name}.incomplete-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.rename(aside)
    print(
        f"{run_dir.name} of {run_dir.parent.parent.name} {run_dir.parent.name} ended before its first checkpoint; "
        f"moved to {aside.name}, starting again"
    )


def train_command(job: Job, total_steps: int | None) -> list[str]:
    cmd = [sys.executable, "-m", "lab", "train", "--algo", job.algo, "--env", job.env_id, "--seed", str(job.seed)]
    if total_steps is not None:
        cmd += ["--total-steps", str(total_steps)]
    cmd += ["--run-dir", str(job.run_dir)]
    return cmd + (["--resume"] if job.resume else [])


def run_job(job: Job, total_steps: int | None) -> tuple[dict[str, Any], int]:
    """Train one seed in a subprocess (output to ``seedS.log``); its CSV row and exit code."""
    job.run_dir.parent.mkdir(parents=True, exist_ok=True)
    log_path = job.run_dir.with_name(f"{job.run_dir.name}.log")
    cmd = train_command(job, total_steps)
    with open(log_path, "a") as log:
        log.write(f"\n$ {' '.join(cmd[1:])}\n")
        log.flush()
        code = subprocess.run(cmd, cwd=ROOT, env=child_env(), stdout=log, stderr=subprocess.STDOUT).returncode
    row = row_from(job.algo, job.env_id, job.seed, read_summary(job.run_dir))
    if code != 0 and row["status"] == "completed":  # a summary from an earlier attempt must not hide this one
        row["status"] = "failed"
    return row, code


# ── the CSV and the Markdown report ────────────────────────────────────────────────────────────────


def read_rows(path: Path) -> dict[Key, dict[str, str]]:
    if not path.exists():
        return {}
    with open(path, newline="") as f:
        return {(r["algo"], r["env_id"], r["seed"]): r for r in csv.DictReader(f)}


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def upsert(path: Path, row: dict[str, Any]) -> dict[Key, dict[str, str]]:
    """Insert or replace the row of (algo, env_id, seed); rewrite the CSV atomically; all rows."""
    rows = read_rows(path)
    text_row = {k: "" if row.get(k) is None else str(row[k]) for k in FIELDS}
    rows[(text_row["algo"], text_row["env_id"], text_row["seed"])] = text_row
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=FIELDS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(sorted(rows.values(), key=_order))
    atomic_write(path, text.getvalue())
    return rows


def _order(row: dict[str, str]) -> tuple[str, str, int]:
    return row["env_id"], row["algo"], int(row["seed"])


def _number(text: str, digits: int = 1) -> str:
    try:
        return f"{float(text):,.{digits}f}"
    except ValueError:
        return "–"


def group_markdown(env_id: str, algo: str, rows: list[dict[str, str]]) -> list[str]:
    """One env × algo: a row per seed, then the statistics over the completed seeds."""
    lines = [
        f"## {env_id} · {algo}",
        "",
        "| seed | status | env steps | final eval return (± over episodes) | episodes | wall time (s) | steps/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mean, std = r["final_eval_return_mean"], r["final_eval_return_std"]
        ret = f"{_number(mean)} ± {_number(std)}" if mean else "–"
        lines.append(
            f"| {r['seed']} | {r['status']} | {_number(r['total_steps'], 0)} | {ret} | "
            f"{r['final_eval_episodes'] or '–'} | {_number(r['wall_time_s'])} | {_number(r['sps'], 0)} |"
        )
    finals = [
        float(r["final_eval_return_mean"]) for r in rows if r["status"] == "completed" and r["final_eval_return_mean"]
    ]
    lines.append("")
    if finals:
        spread = statistics.pstdev(finals)
        others = len(rows) - len(finals)
        lines.append(
            f"**Over seeds: {statistics.mean(finals):,.1f} ± {spread:,.1f}** (mean ± std over seeds), min "
            f"{min(finals):,.1f}, {len(finals)} seed{'s' if len(finals) > 1 else ''}"
            + (f"; {others} more not completed, left out" if others else "")
            + "."
        )
    else:
        lines.append("No completed seed yet.")
    return [*lines, ""]


def markdown(rows: dict[Key, dict[str, str]], commands: list[str], machine: str) -> str:
    groups: dict[tuple[str, str], list[dict[str, str]]] = defaultdict(list)
    for r in sorted(rows.values(), key=_order):
        groups[(r["env_id"], r["algo"])].append(r)
    lines = [
        "# Final returns over seeds",
        "",
        "Evaluation convention: the final policy of each run, deterministic (the mode of the action "
        "distribution), one episode on each of the fixed seeds 1000000+i (10 episodes unless the table says "
        "otherwise), the raw env return (no reward scaling). In the per-seed rows, ± is the std over those "
        'episodes; in "Over seeds", ± is the population std (ddof=0) over seeds of the per-seed means.',
        "",
        f"Machine: {machine}.",
        "",
        "Each seed is one `python -m lab train --algo ALGO --env ENV --seed S [--total-steps N] --run-dir "
        "ROOT/ENV/ALGO/seedS` process (one torch thread); wall time and steps/s are its training loop's, from "
        "summary.json.",
        "",
    ]
    for (env_id, algo), group in groups.items():
        lines += group_markdown(env_id, algo, group)
    lines += ["## Commands", "", "The invocations of this script that wrote the table:", ""]
    lines += [f"- `{c}`" for c in commands]
    return "\n".join(lines) + "\n"


def previous_commands(md_path: Path) -> list[str]:
    """The commands listed by an earlier version of the Markdown file, so that none is lost."""
    if not md_path.exists():
        return []
    text = md_path.read_text()
    section = text.split("## Commands", 1)[1] if "## Commands" in text else ""
    return [line[3:-1] for line in section.splitlines() if line.startswith("- `") and line.endswith("`")]


# ── main ───────────────────────────────────────────────────────────────────────────────────────────


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--env", nargs="+", required=True, help="gymnasium ids, e.g. CartPole-v1")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4], help="training seeds")
    parser.add_argument("--total-steps", type=int, default=None, help="env steps per run; None: the preset's")
    parser.add_argument("--algo", nargs="+", default=["ppo"], help="algorithms, as `testbed train --algo`")
    parser.add_argument("--workers", type=int, default=1, help="runs at a time, one process each")
    parser.add_argument("--root", default="runs/results", help="run directories: ROOT/ENV/ALGO/seedS")
    parser.add_argument("--out", default="benchmarks/results/ppo_learning.csv", help="the CSV; the .md goes beside it")
    args = parser.parse_args(argv)
    if args.workers < 1 or (args.total_steps is not None and args.total_steps < 1):
        parser.error("--workers and --total-steps must be positive")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds repeats a seed: {args.seeds}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    csv_path = Path(args.out)
    md_path = csv_path.with_suffix(".md")
    command, machine = public_command(sys.argv[0], argv), machine_line()
    commands = [c for c in previous_commands(md_path) if c != command] + [command]
    try:
        jobs, done = plan(args)
    except Refused as error:
        print(f"learning.py: error: {error}", file=sys.stderr)
        return 2

    for job in jobs:  # only once every seed has passed the checks above
        if job.set_aside:
            set_aside(job.run_dir)
    rows = read_rows(csv_path)
    for row in done:  # also restores rows of completed runs to a CSV that lost them
        rows = upsert(csv_path, row)
    if done or jobs:
        atomic_write(md_path, markdown(rows, commands, machine))
    finished: list[str] = []
    recorded: set[Future[tuple[dict[str, Any], int]]] = set()

    def record(job: Job, future: Future[tuple[dict[str, Any], int]]) -> None:
        nonlocal rows
        recorded.add(future)
        row, code = future.result()
        rows = upsert(csv_path, row)  # only the main thread writes the files: no races between workers
        atomic_write(md_path, markdown(rows, commands, machine))
        finished.append(row["status"])
        final = row["final_eval_return_mean"]
        result = f"final eval {final:.1f}" if final is not None else f"exit {code}, see {job.run_dir.name}.log"
        print(
            f"[{len(finished)}/{len(jobs)}] {job.env_id} {job.algo} seed {job.seed}: {row['status']}, {result}",
            flush=True,
        )

    pool = ThreadPoolExecutor(max_workers=args.workers)
    futures = {pool.submit(run_job, job, args.total_steps): job for job in jobs}
    try:
        for future in as_completed(futures):
            record(futures[future], future)
    except KeyboardInterrupt:
        # The running trainings got the signal too: they checkpoint, write an interrupted summary and exit.
        print("Interrupted: recording the running seeds; run the same command again to resume.", file=sys.stderr)
        started = [(job, f) for f, job in futures.items() if not f.cancel() and f not in recorded]
        for job, future in started:
            record(job, future)
        return 130
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    print(f"Results: {csv_path} and {md_path}")
    return 0 if all(status == "completed" for status in finished) else 1


if __name__ == "__main__":
    sys.exit(main())
