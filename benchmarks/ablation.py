"""An ablation in one command: one bench per row, each row the preset with its own changes, then the table.

    python benchmarks/ablation.py --algo grpo --env Hopper-v5 --seeds 3 --title "GRPO ablation on Hopper-v5" \
        --row abl-hop-preset --row abl-hop-offset reward_offset=1 --row abl-hop-alive advantage=step_alive \
        [--first-seed 100] [--workers 1] [--out benchmarks/results/grpo-ablation/hopper.md]

Each row ``NAME [KEY=VALUE …]`` is ``testbed bench --algos ALGO --envs ENV --seeds N [--first-seed F] --workers W
--name NAME --set KEY=VALUE …``, run from the current folder into its ``runs/bench/NAME``; a row without settings is the
preset. Every row's config is resolved and checked before the first bench starts, so a misspelled key fails
at once and not hours in. The benches run one after another and resume: a rerun trains only what is missing, and an
interrupted ablation continues where it stopped. The page (``sweeps.table_text``) keeps the rows' order; it
is written after every row, with the rows finished so far, and with ``--out`` a figure beside it
(``plots/STEM-seeds.png``): one panel per row, one evaluation curve per seed. Below the table, each row against
the first: the difference of their mean final returns with its 95% bootstrap interval (``lab.stats.difference_ci``),
so an ablation says which change moves the task and by how much it is sure.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweeps import completed_runs, table_text, write_page

from agents import registry
from envs.errors import BadInput
from lab.plan import resolve_run
from lab.plot import X_LABELS, Y_LABELS, new_figure, save_figure
from lab.results import find_runs
from lab.stats import difference_ci


def bench_command(
    algo: str, env_id: str, seeds: int, workers: int, name: str, settings: list[str], first_seed: int = 0
) -> list[str]:
    """The ``testbed bench`` argv of one row, as the page lists it."""
    return [
        "testbed",
        "bench",
        "--algos",
        algo,
        "--envs",
        env_id,
        "--seeds",
        str(seeds),
        *(["--first-seed", str(first_seed)] if first_seed else []),
        "--workers",
        str(workers),
        "--name",
        name,
        *(part for s in settings for part in ("--set", s)),
    ]


def check_rows(algo: str, env_id: str, rows: list[list[str]]) -> None:
    """BadInput, before anything runs, for a repeated name, a setting that is not KEY=VALUE, or a config
    that does not resolve (an unknown key, a value out of range, a key the variant fixes)."""
    names = [row[0] for row in rows]
    if len(set(names)) != len(names):
        raise BadInput(f"--row names must differ, got {', '.join(names)}")
    spec = registry.get(algo)
    for name, *settings in rows:
        bad = [s for s in settings if "=" not in s]
        if bad:
            raise BadInput(f"--row {name}: settings are KEY=VALUE, got {', '.join(bad)}")
        try:
            resolve_run(spec, env_id, settings, validate=True)
        except BadInput as error:
            raise BadInput(f"--row {name}: {error}") from None


def run_row(argv: list[str]) -> int:
    """The row's bench, to its end. A Ctrl-C reaches the bench too (one process group): it stops its runs
    with their checkpoints, and this waits for that before it stops, where ``subprocess.call`` would kill
    the bench at once and leave its runs to finish unseen."""
    bench = subprocess.Popen(argv)
    try:
        return bench.wait()
    except KeyboardInterrupt:
        bench.wait()
        raise


def finals(bench: Path, env_id: str, seeds: list[int]) -> list[float]:
    """The final returns of ``bench``'s completed runs on ``env_id`` with the ``seeds`` given."""
    return [r.final_return for r in completed_runs(bench, seeds, [env_id]) if r.final_return is not None]


def against_first(benches: list[Path], env_id: str, seeds: list[int]) -> str:
    """Each row after the first against it: Δ, the difference of the rows' mean final returns over seeds, and
    its 95% percentile bootstrap interval, each row's seeds resampled on their own."""
    lines = [
        f"## Each row against `{benches[0].name}`",
        "",
        "Δ: the row's mean final return over its seeds less the first row's; 95% CI: a percentile bootstrap of Δ, "
        "resampling each row's seeds on their own (2,000 resamples, `lab.stats.difference_ci`). An interval that "
        "holds 0 does not tell the change from the seeds' spread.",
        "",
        "| bench | seeds | Δ final eval | 95% CI |",
        "|---|---|---|---|",
    ]
    first = finals(benches[0], env_id, seeds)
    for bench in benches[1:]:
        mine = finals(bench, env_id, seeds)
        if not first or not mine:
            continue
        delta, low, high = difference_ci(np.array(first), np.array(mine))
        lines.append(f"| `{bench.name}` | {len(mine)} | {delta:+.1f} | [{low:+.1f}, {high:+.1f}] |")
    return "\n".join(lines) + "\n"


def seed_curves(benches: list[Path], env_id: str, seeds: list[int], out: Path) -> Path:
    """One panel per row, one line per seed: each seed's evaluations against env steps, every panel on the
    same scales, so that a row's spread over seeds shows beside its mean in the table. Returns the PNG."""
    fig, axes = new_figure(len(benches), panel_size=(4.2, 3.0))
    for ax, bench in zip(axes, benches):
        runs = [r for r in find_runs([bench]) if r.env_id == env_id and r.seed in seeds]
        for run in sorted(runs, key=lambda r: r.seed):
            ax.plot(run.steps, run.eval_return, label=f"seed {run.seed}", linewidth=1.4, marker=".", markersize=3)
        ax.set_title(bench.name, fontsize="medium")
        ax.set_xlabel(X_LABELS["steps"])
        ax.set_ylabel(Y_LABELS["eval"])
        ax.grid(alpha=0.3)
        if runs:
            ax.legend(fontsize="small", loc="best")
    xs, ys = [ax.get_xlim() for ax in axes], [ax.get_ylim() for ax in axes]
    for ax in axes:  # every panel on the span of them all, so that none cuts a curve
        ax.set_xlim(min(low for low, _ in xs), max(high for _, high in xs))
        ax.set_ylim(min(low for low, _ in ys), max(high for _, high in ys))
    return save_figure(fig, out)[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", required=True)
    parser.add_argument("--env", required=True, help="gymnasium id")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per row (default: 3)")
    parser.add_argument(
        "--first-seed", type=int, default=0, help="seeds FIRST … FIRST+N−1; an ablation on tuning seeds (default: 0)"
    )
    parser.add_argument("--workers", type=int, default=1, help="processes at a time within a row (default: 1)")
    parser.add_argument(
        "--row",
        nargs="+",
        action="append",
        required=True,
        metavar="ITEM",
        help="NAME, then its KEY=VALUE settings (none: the preset); repeatable, in the table's order",
    )
    parser.add_argument("--title", required=True)
    parser.add_argument("--out", type=Path, default=None, help="Markdown file (default: print)")
    args = parser.parse_args(argv)
    try:
        check_rows(args.algo, args.env, args.row)
    except BadInput as error:
        print(f"ablation: error: {error}", file=sys.stderr)
        return 2
    benches = [Path("runs") / "bench" / row[0] for row in args.row]
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    for done, (name, *settings) in enumerate(args.row, start=1):
        argv_row = bench_command(args.algo, args.env, args.seeds, args.workers, name, settings, args.first_seed)
        print(f"── row {name}: {' '.join(argv_row)}", flush=True)
        code = run_row([sys.executable, "-m", "lab.cli", *argv_row[1:]])
        if code != 0:
            print(
                f"ablation: row {name} exited with status {code}; rerun the same command to continue", file=sys.stderr
            )
            return code
        # The page after every row, so that a stop keeps the rows already finished.
        title = args.title if done == len(args.row) else f"{args.title} ({done} of {len(args.row)} rows so far)"
        page = table_text(benches[:done], title, seeds=seeds, envs=[args.env])
        if done > 1:
            page += "\n" + against_first(benches[:done], args.env, seeds)
        if args.out is not None:
            stem = args.out.parent / "plots" / f"{args.out.stem}-seeds"
            figure = seed_curves(benches[:done], args.env, seeds, stem).relative_to(args.out.parent)
            page += f"\n![Each row's seeds, evaluation return against env steps]({figure})\n"
        write_page(page, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
