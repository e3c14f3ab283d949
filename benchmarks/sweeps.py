"""Tables of benches that differ in their settings: the sweeps behind the presets, and the ablations.

    python benchmarks/sweeps.py --benches runs/bench/sweep-ll-* --title "GRPO on LunarLander-v3" \
        [--threshold 200] [--seeds 0 1 2] [--envs LunarLander-v3] [--out benchmarks/results/grpo-sweeps/lunarlander.md]

Each bench (made by ``testbed bench --set …``) is one row per env: its ``--set`` overrides, its seeds, the
final deterministic evaluation (mean ± population std over seeds, and each seed's), the env steps and
wall-clock seconds at which an evaluation first reached ``--threshold``, and the steps and seconds trained.
The commands that made the benches are listed under the tables. Rows keep the order of ``--benches``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the machine line comes from speed.py
from speed import machine_line

from lab.results import Run, find_runs


def first_reach(run: Run, threshold: float) -> tuple[int, float] | None:
    """(env steps, seconds) of the first evaluation at or above ``threshold``; None if none reached it."""
    for step, seconds, value in zip(run.steps, run.wall_time_s, run.eval_return, strict=True):
        if value >= threshold:
            return int(step), float(seconds)
    return None


def row(label: str, overrides: list[str], runs: list[Run], threshold: float | None) -> str:
    """One table row for the completed runs of one bench on one env."""
    finals = [r.final_return for r in runs if r.final_return is not None]
    mean = statistics.fmean(finals) if finals else float("nan")
    spread = statistics.pstdev(finals) if len(finals) > 1 else 0.0
    per_seed = ", ".join(f"{r.final_return:.0f}" for r in runs if r.final_return is not None)
    cells = [
        f"`{label}`",
        "<br>".join(f"`{o}`" for o in overrides) or "(preset)",
        ", ".join(str(r.seed) for r in runs),
        f"**{mean:.1f}** ± {spread:.1f} ({per_seed})",
    ]
    if threshold is not None:
        reached = [first_reach(r, threshold) for r in runs]
        hits = [x for x in reached if x is not None]
        cells.append(
            f"{len(hits)}/{len(runs)}"
            + (
                f": median {statistics.median(s for s, _ in hits):,.0f} steps, "
                f"{statistics.median(t for _, t in hits):.0f} s"
                if hits
                else ""
            )
        )
    cells.append(f"{statistics.fmean(r.last_step for r in runs):,.0f}")
    cells.append(f"{statistics.fmean(r.last_wall_time_s for r in runs):.0f}")
    return "| " + " | ".join(cells) + " |"


def completed_runs(bench: Path, seeds: list[int] | None = None, envs: list[str] | None = None) -> list[Run]:
    """The completed runs of ``bench``, of the ``seeds`` and ``envs`` given (None: all)."""
    return [
        r
        for r in find_runs([bench])
        if r.status == "completed" and (seeds is None or r.seed in seeds) and (envs is None or r.env_id in envs)
    ]


def table_text(
    benches: list[Path],
    title: str,
    threshold: float | None = None,
    seeds: list[int] | None = None,
    envs: list[str] | None = None,
) -> str:
    """The Markdown page: one table per env, a row per bench in the order given, then the benches' commands."""
    by_env: dict[str, list[str]] = {}
    commands: list[str] = []
    for bench in benches:
        spec = yaml.safe_load((bench / "bench.yaml").read_text())
        overrides = [o for values in (spec.get("overrides") or {}).values() for o in values]
        commands += spec.get("commands", [])[:1]
        runs = completed_runs(bench, seeds, envs)
        for env_id in sorted({r.env_id for r in runs}):
            mine = [r for r in runs if r.env_id == env_id]
            by_env.setdefault(env_id, []).append(row(bench.name, overrides, mine, threshold))
    header = ["bench", "settings (`--set`)", "seeds", "final eval"]
    if threshold is not None:
        header.append(f"first eval ≥ {threshold:g}")
    header += ["env steps", "wall s"]
    lines = [
        f"# {title}",
        "",
        f"Machine: {machine_line()}.",
        "",
        "Final eval: the final deterministic policy, 10 episodes on the fixed seeds 1000000…, the raw env return; mean "
        "± population std over seeds, then each seed's. Wall seconds come from runs that shared the machine's cores "
        "with other runs: they order settings, they are not a speed benchmark.",
        "",
    ]
    for env_id, rows in by_env.items():
        lines += [f"## {env_id}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header), *rows, ""]
    lines += ["Commands:", "", "```bash", *commands, "```", ""]
    return "\n".join(lines)


def write_page(text: str, out: Path | None) -> None:
    """Print the page, or write it to ``out``."""
    if out is None:
        print(text)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benches", nargs="+", type=Path, required=True, help="bench folders, one row each")
    parser.add_argument("--title", required=True)
    parser.add_argument("--threshold", type=float, default=None, help="report steps and time to first reach it")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="only these seeds (default: all)")
    parser.add_argument("--envs", nargs="+", default=None, help="only these env labels (default: all)")
    parser.add_argument("--out", type=Path, default=None, help="Markdown file (default: print)")
    args = parser.parse_args()
    write_page(table_text(args.benches, args.title, args.threshold, args.seeds, args.envs), args.out)


if __name__ == "__main__":
    main()
