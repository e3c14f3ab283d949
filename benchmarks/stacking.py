"""Seeds side by side in one process (``train --seeds``) against one process per seed, ours and SB3's.

    python benchmarks/stacking.py --case cartpole [--algo ppo|grpo] [--seeds 8] [--steps N] [--core 1] [--out DIR]

Per case, every process pinned to one core and run one after another:
- one stacked process of ours training S seeds (``python -m lab train --seeds S``);
- S processes of ours, one per seed (``python -m lab train --seed k``);
- S processes of Stable-Baselines3's PPO at identical hyperparameters (``benchmarks/speed.py``'s script), doing
  the same work as ours: the same env steps and gradient steps per seed (SB3 trains as ``--algo sb3-ppo``
  trains it, its ``train()`` once per epoch where the preset recomputes advantages every epoch);
- where the stacked process's time goes: one more stacked process with timers around collecting (acting
  and env stepping) and updating.
Each time is a whole process, wall clock from spawn to exit, interpreter start and imports included.
Ours runs without periodic evaluations or intermediate checkpoints (its final evaluation and checkpoint
stay in the time); SB3 evaluates and saves nothing. Each process's gradient steps, summed over its seeds (ours:
from each seed's final checkpoint; SB3's: its optimizer's steps, counted), go beside its time, so that a
table of unequal work says so. ``--sizes 1,2,4,8,16`` instead times one stacked process per stack size, for
the bench's default ``--stack``. ``--eval-cost N`` instead times N pairs of stacked processes, one without
periodic evaluation and one with the preset's (every seed's episodes in one batched forward pass, ``agents/
tracking.py``), taking turns: what evaluating costs a stack.

``--algo grpo`` times our GRPO preset the same way; SB3 has no GRPO.

Writes ``OUT/stacking.csv`` (a row per process) and ``OUT/stacking.md``, rewritten after every process.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import speed  # noqa: E402  (after the sys.path line above, run as a script)

CASES = {
    "cartpole": speed.Case("cartpole", "CartPole-v1", 100_000),
    "lunarlander": speed.Case("lunarlander", "LunarLander-v3", 32_768),
    "halfcheetah": speed.Case("halfcheetah", "HalfCheetah-v5", 10_240),
    # The MuJoCo suite's two costliest PPO cells, at their presets: what stacking its 5 seeds saves.
    "ant": speed.Case("ant", "Ant-v5", 16_384),
    "humanoid": speed.Case("humanoid", "Humanoid-v5", 8_192),
}

PROFILE_SCRIPT = """
import json, sys, time
from pathlib import Path
from agents import grpo, ppo, rundir
from agents.config import build_config

module, config = (grpo, grpo.GRPOConfig) if sys.argv[3] == "grpo" else (ppo, ppo.PPOConfig)
timers = {"collect": 0.0, "update": 0.0}
def timed(name, function):
    def wrapper(*args):
        start = time.perf_counter()
        try:
            return function(*args)
        finally:
            timers[name] += time.perf_counter() - start
    return wrapper
learner = module.Learner
learner.collect, learner.learn = timed("collect", learner.collect), timed("update", learner.learn)
cfgs = [build_config(config, c) for c in json.loads(sys.argv[1])]
dirs = [Path(sys.argv[2]) / f"seed{c.seed}" for c in cfgs]
for d in dirs:
    rundir.prepare_run_dir(d, False)
start = time.perf_counter()
module.train_stack(cfgs, dirs)
print(json.dumps({**timers, "train_s": time.perf_counter() - start}))
"""


@dataclasses.dataclass
class Row:
    case: str
    impl: str  # stacked | ours | sb3 | turns (older results) | stacked_profiled | size | stacked_eval
    seeds: int  # seeds this process trained
    seed: str  # which
    wall_s: float
    returncode: int
    collect_s: float | None = None
    update_s: float | None = None
    gradient_steps: int | None = None  # summed over the seeds this process trained


def type_of(field_name: str) -> Any:
    """The type of a Row field, to read it back from the CSV."""
    if field_name in ("seeds", "returncode", "gradient_steps"):
        return int
    return float if field_name in ("wall_s", "collect_s", "update_s") else str


def pinned(core: int | None) -> Any:
    return (lambda: os.sched_setaffinity(0, {core})) if core is not None else None


def timed(cmd: list[str], core: int | None) -> tuple[float, Any]:
    import subprocess

    start = time.perf_counter()
    proc = subprocess.run(
        cmd, check=False, cwd=ROOT, env=speed.child_env(), capture_output=True, text=True, preexec_fn=pinned(core)
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        print(f"process failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-2000:]}", file=sys.stderr)
    return wall, proc


def ours_argv(
    case: speed.Case, steps: int, run_dir: Path, seeds: list[int], algo: str = "ppo", flags: tuple[str, ...] = ()
) -> list[str]:
    """Our process training ``seeds``: without periodic evaluation or intermediate checkpoints unless ``flags``
    (its ``--set`` arguments then) say otherwise."""
    which = ["--seed", str(seeds[0])] if len(seeds) == 1 else ["--seeds", ",".join(map(str, seeds))]
    return [
        sys.executable,
        "-m",
        "lab",
        "train",
        "--algo",
        algo,
        "--env",
        case.env_id,
        *which,
        "--total-steps",
        str(steps),
        *(flags or speed.OURS_FLAGS),
        "--run-dir",
        str(run_dir),
    ]


def total_gradient_steps(rows: list[Row]) -> int | None:
    """The gradient steps of these processes together; None if one was not counted (or there are none)."""
    counts = [r.gradient_steps for r in rows]
    return sum(c for c in counts if c is not None) if counts and None not in counts else None


def ours_gradient_steps(run_dir: Path, seeds: list[int]) -> int | None:
    """The gradient steps a process of ours took, summed over its seeds' final checkpoints (None if one lacks one).
    ``lab train --seeds`` writes seed k into ``RUN_DIR/seed<k>``; ``--seed`` into ``RUN_DIR`` itself."""
    dirs = [run_dir] if len(seeds) == 1 else [run_dir / f"seed{seed}" for seed in seeds]
    counts = [speed.checkpoint_gradient_steps(d) for d in dirs]
    return None if None in counts else sum(c for c in counts if c is not None)


def profile_argv(cfg: Any, seeds: list[int], run_dir: Path, algo: str) -> list[str]:
    """A stacked process of PROFILE_SCRIPT: the seeds batched, with timers around collecting and updating."""
    from agents.rundir import config_to_dict

    cfgs = [
        config_to_dict(dataclasses.replace(cfg, seed=seed, eval_interval=0, checkpoint_interval=0)) for seed in seeds
    ]
    return [sys.executable, "-c", PROFILE_SCRIPT, json.dumps(cfgs), str(run_dir), algo]


def markdown(
    rows: list[Row], command: str, machine: str, cases: dict[str, speed.Case], steps: dict[str, int], algo: str = "ppo"
) -> str:
    lines = [
        "# Seeds side by side in one process, against one process per seed",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine}",
        "",
        (
            "Each time is a whole process pinned to one core, wall clock from spawn to exit, imports included; "
            "processes ran one after another. Ours: no periodic evaluation or intermediate checkpoint, its final "
            "evaluation and checkpoint included; SB3: its collect and train() phases only, nothing evaluated or saved, "
            "with the same gradient steps as ours (its train() once per epoch where the preset recomputes advantages "
            "every epoch). Gradient steps: each process's optimizer steps, summed over its seeds."
        ),
        "",
    ]
    for name in dict.fromkeys(r.case for r in rows):
        case_rows = [r for r in rows if r.case == name]
        by = {
            impl: [r for r in case_rows if r.impl == impl and r.returncode == 0]
            for impl in ("stacked", "ours", "sb3", "turns", "stacked_profiled", "size", "stacked_eval")
        }
        lines += [f"## {name}: {algo.upper()}, {cases[name].env_id}, {steps[name]:,} steps per seed", ""]
        if by["size"]:
            lines += ["| seeds in the process | wall (s) | s per seed |", "|---|---|---|"]
            lines += [f"| {r.seeds} | {r.wall_s:.1f} | {r.wall_s / r.seeds:.2f} |" for r in by["size"]]
            lines.append("")
            continue
        if by["stacked_eval"]:
            lines += eval_cost_lines(by["stacked"], by["stacked_eval"], cases[name].env_id)
            continue
        total = {impl: sum(r.wall_s for r in by[impl]) for impl in ("stacked", "ours", "sb3", "turns")}
        work = {impl: total_gradient_steps(by[impl]) for impl in ("stacked", "ours", "sb3", "turns")}
        lines += [
            "| how | processes | seeds | total wall (s) | s per seed | gradient steps |",
            "|---|---|---|---|---|---|",
        ]
        for impl, label in (
            ("stacked", "ours, stacked (`train --seeds`)"),
            ("ours", "ours, one process per seed"),
            ("sb3", "Stable-Baselines3, one process per seed"),
            ("turns", "ours, one process, seeds taking turns unbatched"),
        ):
            seeds = sum(r.seeds for r in by[impl])
            if seeds:
                counted = "–" if work[impl] is None else f"{work[impl]:,}"
                wall = f"{total[impl]:.1f} | {total[impl] / seeds:.2f}"
                lines.append(f"| {label} | {len(by[impl])} | {seeds} | {wall} | {counted} |")
        # A ratio of unequal work means nothing: say so beside it.
        if len({work[impl] for impl in ("stacked", "ours", "sb3") if by[impl] and work[impl] is not None}) > 1:
            lines.append(
                "\n**Unequal work**: these processes took different numbers of gradient steps in all, so the "
                "ratios below do not compare the same training."
            )
        if total["stacked"]:
            for impl, label in (("sb3", "SB3"), ("ours", "our single runs")):
                if total[impl]:
                    lines.append(f"\n{label} / stacked, total wall time: **{total[impl] / total['stacked']:.2f}×**")
        if total["turns"] and by["stacked_profiled"]:
            # Both started the same way (PROFILE_SCRIPT, no command line): batched against unbatched alone.
            batched = by["stacked_profiled"][0].wall_s
            lines.append(
                f"\nseeds taking turns / batched, both started by the same script ({total['turns']:.1f} s against "
                f"{batched:.1f} s): **{total['turns'] / batched:.2f}×**"
            )
        if by["stacked_profiled"]:
            r = by["stacked_profiled"][0]
            assert r.collect_s is not None and r.update_s is not None
            rest = r.wall_s - r.collect_s - r.update_s
            lines += [
                "",
                "Where the stacked process's time goes (one more process, with timers):",
                "",
                "| part | s | % |",
                "|---|---|---|",
                (
                    f"| collect: acting (one batched forward pass) and stepping each seed's envs | {r.collect_s:.1f} | "
                    f"{100 * r.collect_s / r.wall_s:.0f} |"
                ),
                (
                    f"| update: {'group advantages' if algo == 'grpo' else 'GAE'} and the batched gradient steps | "
                    f"{r.update_s:.1f} | {100 * r.update_s / r.wall_s:.0f} |"
                ),
                (
                    f"| rest: start, imports, envs, logging, evaluation, checkpoints | {rest:.1f} | "
                    f"{100 * rest / r.wall_s:.0f} |"
                ),
            ]
        lines.append("")
    return "\n".join(lines)


def eval_cost_lines(without: list[Row], evaluated: list[Row], env_id: str) -> list[str]:
    """The table of ``--eval-cost``: each pair's wall times, and the ratio of the medians."""
    import statistics

    lines = [
        f"Periodic evaluation at the preset's interval and episodes ({env_id}), against none, the same stack of "
        f"{without[0].seeds} seeds, processes taking turns:",
        "",
        "| pair | no periodic evaluation (s) | the preset's evaluation (s) |",
        "|---|---|---|",
    ]
    lines += [f"| {i + 1} | {a.wall_s:.1f} | {b.wall_s:.1f} |" for i, (a, b) in enumerate(zip(without, evaluated))]
    plain, costly = statistics.median(r.wall_s for r in without), statistics.median(r.wall_s for r in evaluated)
    ratio = f"**{costly / plain:.2f}×**"
    lines += ["", f"With evaluation / without, medians ({costly:.1f} s against {plain:.1f} s): {ratio}"]
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES), required=True)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=None, help="steps per seed (default: the case's)")
    parser.add_argument("--core", type=int, default=None, help="pin every process to this core")
    parser.add_argument("--sizes", default=None, help="time one stacked process per stack size, e.g. 1,2,4,8,16")
    parser.add_argument("--eval-cost", type=int, metavar="N", help="time N pairs: no evaluation, the preset's")
    parser.add_argument("--no-sb3", action="store_true")
    parser.add_argument("--algo", choices=["ppo", "grpo"], default="ppo")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "stacking")
    parser.add_argument("--render", action="store_true", help="rewrite OUT/stacking.md from OUT/stacking.csv only")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    command = speed.public_command("benchmarks/stacking.py", sys.argv[1:] if argv is None else argv)
    machine = speed.machine_line()
    rows: list[Row] = []
    steps = {name: args.steps or CASES[name].total_steps for name in args.case}
    if args.render:  # the markdown of a finished run, from its CSV and the command recorded in it
        with open(args.out / "stacking.csv", newline="") as f:
            rows = [Row(**{k: (None if v == "" else type_of(k)(v)) for k, v in r.items()}) for r in csv.DictReader(f)]
        recorded = (args.out / "stacking.md").read_text().split("Command: `")[1].split("`")[0]
        machine = (args.out / "stacking.md").read_text().split("Machine: ")[1].splitlines()[0]
        (args.out / "stacking.md").write_text(markdown(rows, recorded, machine, CASES, steps, args.algo))
        return 0

    def record(row: Row) -> None:
        rows.append(row)
        print(f"{row.case} {row.impl} seeds={row.seed}: {row.wall_s:.1f} s", flush=True)
        with open(args.out / "stacking.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=[field.name for field in dataclasses.fields(Row)])
            writer.writeheader()
            writer.writerows(dataclasses.asdict(r) for r in rows)
        (args.out / "stacking.md").write_text(markdown(rows, command, machine, CASES, steps, args.algo))

    seeds = list(range(args.seeds))
    for name in args.case:
        case = dataclasses.replace(CASES[name], total_steps=steps[name])
        with tempfile.TemporaryDirectory(prefix="stacking-") as tmp:
            if args.sizes:
                for size in [int(s) for s in args.sizes.split(",")]:
                    wall, proc = timed(
                        ours_argv(case, case.total_steps, Path(tmp) / f"size{size}", list(range(size)), args.algo),
                        args.core,
                    )
                    record(Row(name, "size", size, f"0-{size - 1}", wall, proc.returncode))
                continue
            if args.eval_cost:
                evaluated = ("--set", "checkpoint_interval=0")  # the preset's eval_interval and eval_episodes
                for pair in range(args.eval_cost):
                    for impl, flags in (("stacked", ()), ("stacked_eval", evaluated)):
                        run_dir = Path(tmp) / f"{impl}{pair}"
                        argv = ours_argv(case, case.total_steps, run_dir, seeds, args.algo, flags)
                        wall, proc = timed(argv, args.core)
                        record(Row(name, impl, len(seeds), f"0-{seeds[-1]}", wall, proc.returncode))
                continue
            stacked_dir = Path(tmp) / "stacked"
            wall, proc = timed(ours_argv(case, case.total_steps, stacked_dir, seeds, args.algo), args.core)
            work = ours_gradient_steps(stacked_dir, seeds)
            record(Row(name, "stacked", len(seeds), f"0-{seeds[-1]}", wall, proc.returncode, gradient_steps=work))
            for seed in seeds:
                run_dir = Path(tmp) / f"ours{seed}"
                wall, proc = timed(ours_argv(case, case.total_steps, run_dir, [seed], args.algo), args.core)
                work = ours_gradient_steps(run_dir, [seed])
                record(Row(name, "ours", 1, str(seed), wall, proc.returncode, gradient_steps=work))
            cfg, _ = speed.resolve(case, args.algo)
            if args.algo == "ppo" and not args.no_sb3:
                for seed in seeds:
                    wall, proc = timed(speed.sb3_argv(dataclasses.replace(cfg, seed=seed)), args.core)
                    result = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {}
                    work = result.get("gradient_steps")
                    record(Row(name, "sb3", 1, str(seed), wall, proc.returncode, gradient_steps=work))
            wall, proc = timed(profile_argv(cfg, seeds, Path(tmp) / "profiled", args.algo), args.core)
            timers = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {}
            record(
                Row(
                    name,
                    "stacked_profiled",
                    len(seeds),
                    f"0-{seeds[-1]}",
                    wall,
                    proc.returncode,
                    timers.get("collect"),
                    timers.get("update"),
                )
            )
    print(f"wrote {args.out / 'stacking.md'}")
    return 0 if all(r.returncode == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
