"""The tuning ledger: what each algo spent choosing its settings on each env, from the manifest's own files.

A comparison is fair when both algos had the same tuning budget on an env. The budget counts every
``testbed tune`` study in ``benchmarks/manifest.yaml`` (its trials so far, read from the study's committed
``study.db`` or its kept report, of the trials its command plans, times its seeds per trial and env steps
per seed, as its kept tune.yaml records them, else as its command asks) and every try the manifest lists
with ``tries:`` (single runs and hand sweeps on tuning seeds). The unit is a seed-run: one seed trained for
the study's or the try's env steps. A study stopped for good (``stopped:`` in the manifest) plans no more
than it ran.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from agents.config import read_yaml
from envs.errors import BadInput
from lab.document import markdown_table
from lab.manifest import MANIFEST, Entry, Manifest
from lab.parser import build_parser

LEDGER = "tuning-budget.md"  # under docs/results
FINISHED = ("COMPLETE", "PRUNED", "FAIL")  # a failed trial trained until it failed


@dataclass(frozen=True)
class Spend:
    """Seed-runs one study or try spent (``done``) and plans in all (``planned``), each of ``steps`` env steps."""

    algo: str
    env: str
    source: str  # the manifest entry that lists it
    what: str
    done: int
    planned: int
    steps: int
    spent: int | None = None  # env steps a study's report counts: pruned and failed trials at the steps they reached

    @property
    def so_far(self) -> int:
        return self.spent if self.spent is not None else self.done * self.steps

    @property
    def in_all(self) -> int:
        """Env steps planned: what it spent once every planned run has ended, as a stopped study's have."""
        return self.so_far if self.done >= self.planned else max(self.planned * self.steps, self.so_far)


def trials_done(root: Path, report: list[str], study_name: str, storage: str | None) -> int:
    """Trials of a study that trained and ended (complete, pruned or failed, not those whose sample the config
    refused before any training): from its committed sqlite file, else the lines of its kept report."""
    if storage and storage.startswith("sqlite:///") and (root / storage.removeprefix("sqlite:///")).is_file():
        import optuna

        from lab.study import reading_storage
        from lab.trials import refused

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        url = f"sqlite:///{root / storage.removeprefix('sqlite:///')}"
        with reading_storage(url, root) as opened:  # a snapshot: the committed file stays as it is
            try:
                trials = optuna.load_study(study_name=study_name, storage=opened).get_trials(deepcopy=False)
            except KeyError:  # the file holds no study of that name yet
                return 0
        return sum(t.state.name in FINISHED and not refused(t) for t in trials)
    from lab.tune_report import TRIALS  # the wording the report writes, as in steps_spent

    line = re.compile(rf"^- {re.escape(TRIALS)}: \d+ of \S+ \((.*)\)$")  # "(13 complete, 3 fail)"
    counts = next((m.group(1) for m in map(line.match, report) if m), "")
    # A trial still running when the report was written has not ended: only the finished states count.
    return sum(int(n) for n, state in re.findall(r"(\d+) (\w+)", counts) if state.upper() in FINISHED)


def report_lines(root: Path, entry: Entry) -> list[str]:
    """The lines of the study's kept report; none before it has one."""
    report = root / entry.folder / (entry.page or "tune.md")
    return report.read_text().splitlines() if report.is_file() else []


def steps_spent(report: list[str]) -> int | None:
    """Env steps the study's kept report (its lines) says it spent, every trial at the steps it reached; None
    without one."""
    from lab.tune_report import SPENT  # the wording the report writes; imported late, as it brings optuna and plots

    line = re.compile(rf"^- {re.escape(SPENT)}: ([\d,]+)$")
    return next((int(m.group(1).replace(",", "")) for m in map(line.match, report) if m), None)


def kept_steps(root: Path, entry: Entry) -> int | None:
    """Env steps per seed of every trial, as the study's kept tune.yaml records them (PPO rounds the asked
    budget up to whole iterations); None before the study has run."""
    path = root / entry.folder / "tune.yaml"
    saved = read_yaml(path) if path.is_file() else None
    return saved.get("steps_per_seed") if isinstance(saved, dict) else None


def study_args(parser: argparse.ArgumentParser, entry: Entry) -> argparse.Namespace:
    """The options of an entry's ``testbed tune`` command, or BadInput naming the entry and argparse's reason."""
    with contextlib.redirect_stderr(io.StringIO()) as said:
        try:
            return parser.parse_args(shlex.split(entry.command)[1:])
        except SystemExit:  # argparse exits on a bad command line; the ledger is built inside other commands
            reason = (said.getvalue().strip().splitlines() or ["it does not parse"])[-1]
    raise BadInput(
        f"{MANIFEST}: entry {entry.name!r}: its command is not a testbed tune command that runs ({reason}); fix the "
        f"command as `testbed tune --help` describes"
    )


def spends(root: Path, manifest: Manifest) -> list[Spend]:
    """Every study and try of the manifest, in its order."""
    parser = build_parser()
    out = []
    for entry in manifest.entries:
        study = entry.command.startswith("testbed tune ")  # other commands may be prose ("one per row")
        args = study_args(parser, entry) if study else None
        if args is not None:
            name = args.name or f"{args.algo}-{args.env.replace('/', '_')}"
            report = report_lines(root, entry)
            done = min(trials_done(root, report, name, args.storage), args.trials)
            steps = kept_steps(root, entry) or args.total_steps or 0
            runs = (done * args.seeds, (done if entry.stopped else args.trials) * args.seeds)  # so far, planned
            what = f"study, {args.trials} trials × {args.seeds} seeds{f', stopped at {done}' if entry.stopped else ''}"
            out.append(Spend(args.algo, args.env, entry.name, what, *runs, steps, steps_spent(report)))
        for tried in entry.tries:
            algo, env = tried.get("algo", args.algo if args else ""), tried.get("env", args.env if args else "")
            out.append(Spend(algo, env, entry.name, tried["what"], tried["runs"], tried["runs"], tried["steps"]))
    return out


def _millions(steps: int) -> str:
    return f"{steps / 1e6:,.1f}M" if steps >= 100_000 else f"{steps:,}"


def ledger_page(root: Path, manifest: Manifest) -> str:
    """The page: per env and algo, each study and try, and the env steps spent so far and planned."""
    rows: list[list[str]] = []
    totals: dict[str, dict[str, tuple[int, int]]] = {}
    listed = spends(root, manifest)
    for env in sorted({s.env for s in listed}):
        for algo in sorted({s.algo for s in listed if s.env == env}):
            mine = [s for s in listed if s.env == env and s.algo == algo]
            done, planned = sum(s.so_far for s in mine), sum(s.in_all for s in mine)
            totals.setdefault(env, {})[algo] = (done, planned)
            parts = "<br>".join(
                f"[{s.source}]({s.source}.md): {s.what}, {s.done}/{s.planned} runs of {s.steps:,} "
                f"steps" + (f" ({_millions(s.spent)} spent)" if s.spent is not None else "")
                for s in mine
            )
            rows.append([env, algo, parts, _millions(done), _millions(planned)])
    header = ["env", "algo", "studies and tries (runs so far / planned)", "env steps so far", "planned"]
    lines = [
        "# Tuning budgets",
        "",
        __doc__.split("\n\n", 1)[1].replace("\n", " ").strip(),
        "",
        'A study\'s env steps so far are those its kept report counts ("spent": pruned and failed trials at '
        "the steps they reached, the running trial's so far); a study without one counts its ended trials "
        "whole. Runs on the seeds that final results use (0 …) are not tuning and are not counted.",
        "",
        markdown_table(header, rows),
        "",
        "## Equal budgets?",
        "",
    ]
    for env, by_algo in totals.items():
        if len(by_algo) == 1:
            ((algo, (done, planned)),) = by_algo.items()
            lines.append(
                f"- {env}: only {algo} tuned here ({_millions(planned)} planned, {_millions(done)} so far); the other "
                "algos' settings come from their preset files, each entry citing its source."
            )
        elif {"ppo", "grpo"} <= set(by_algo):
            (ppo_done, ppo_planned), (grpo_done, grpo_planned) = by_algo["ppo"], by_algo["grpo"]
            more = "GRPO" if grpo_planned > ppo_planned else "PPO"
            verdict = (
                f"{more} {_millions(abs(grpo_planned - ppo_planned))} more" if grpo_planned != ppo_planned else "equal"
            )
            lines.append(
                f"- {env}: planned {verdict} (PPO {_millions(ppo_planned)}, GRPO {_millions(grpo_planned)}); so far "
                f"PPO {_millions(ppo_done)}, GRPO {_millions(grpo_done)}."
            )
    return "\n".join(lines) + "\n"
