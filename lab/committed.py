"""The committed results as data, and a bench set beside one of them (``testbed report BENCH --against NAME``).

A committed result keeps each run that ended at its path under the command's output (``lab.kept``), so its
folder reads as the bench or study that made it. This module reads those runs with ``lab.results`` and
gives them as pandas DataFrames, for a notebook or a script::

    from lab import committed

    finals = committed.finals("mujoco-v5")    # one row per run: algo, env, seed, budget, final_return, …
    curves = committed.curves("mujoco-v5")    # one row per evaluation: algo, env, seed, global_step, …
    finals.groupby(["env", "algo"]).final_return.mean()

A name is an entry of ``benchmarks/manifest.yaml`` (``testbed results list``), or a folder holding runs.
Reading never writes.

``report_against`` builds the bench report (``lab.report``: bootstrap CIs, IQM, probability of improvement,
the same plots) over a user's bench and a committed result together, the result's algos relabelled
``ALGO@NAME``, into ``BENCH/against-NAME/``. It compares only like with like, and refuses before writing
anything where the two share no env, or where, on an env they share, the runs' budgets (``total_steps``,
``budget_seconds``) or their evaluation (``eval_episodes``, ``eval_interval``, ``eval_env_kwargs`` and the
convention ``summary.json`` records) differ: a final score depends on all of them, and steps to threshold
on the evaluation interval.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from agents.rundir import DirLock
from envs.errors import BadInput
from lab import manifest
from lab.document import Para, counted
from lab.kept import run_dirs
from lab.report import DEFAULT_EVAL_CONVENTION, build_report, run_meta
from lab.results import Run, find_runs, natural_key

REPOSITORY = Path(__file__).resolve().parents[1]
"""The clone this package is imported from: where ``benchmarks/manifest.yaml`` is looked for first."""
FINALS_COLUMNS = (
    "result",
    "algo",
    "env",
    "seed",
    "status",
    "budget",
    "final_return",
    "final_return_std",
    "eval_episodes",
    "steps",
    "wall_time_s",
    "commit",
    "run",
)
"""The columns of :func:`finals`, in order."""
CURVES_COLUMNS = ("result", "algo", "env", "seed", "global_step", "wall_time_s", "eval_return", "run")
"""The columns of :func:`curves`, in order."""
EVAL_KEYS = ("eval_episodes", "eval_interval", "eval_env_kwargs")
"""The config keys that define a run's evaluation (``agents.config.RunConfig``)."""
BUDGET_KEYS = ("total_steps", "budget_seconds")
"""The config keys that bound a run's training: env steps, and a wall-clock budget."""


# ── reading a committed result ───────────────────────────────────────────────────────────────────


def _root(root: Path | None) -> Path:
    """Where the manifest is read: ``root``, else this clone, else (an installed package) the working directory."""
    if root is not None:
        return Path(root)
    return REPOSITORY if (REPOSITORY / manifest.MANIFEST).exists() else Path.cwd()


@dataclass(frozen=True)
class Source:
    """Where a result's runs are read from."""

    label: str
    """The result's manifest name, or a folder's own name: what ``ALGO@LABEL`` says."""
    folder: Path
    """The result's folder, where its runs are kept at their paths under the command's output."""
    shown: str
    """The folder as a report names it: relative to the repository for a manifest entry, else as given."""
    skip: tuple[Path, ...] = ()
    """Folders of other results inside ``folder`` (``throughput``'s holds every result's): not its runs."""


def locate(name: str | Path, root: Path | None = None) -> Source:
    """Where the result ``name`` is: a manifest entry's folder, or, for a folder given by path (a ``Path``, or
    a text that no entry is named), that folder. BadInput for anything else."""
    root = _root(root)
    entries = manifest.load(root).entries if (root / manifest.MANIFEST).exists() else ()
    if isinstance(name, str):
        for entry in entries:
            if entry.name == name:
                folder = root / entry.folder
                inside = tuple(root / e.folder for e in entries if e is not entry and _below(root / e.folder, folder))
                return Source(entry.name, folder, entry.folder, inside)
    path = Path(name)
    if path.is_dir():
        return Source(path.resolve().name, path, str(name))
    close = difflib.get_close_matches(str(name), [e.name for e in entries], n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise BadInput(
        f"{str(name)[:200]!r} is neither a committed result nor a folder{hint}: give a name that `testbed results "
        "list` lists, or a folder holding runs"
    )


def _below(path: Path, folder: Path) -> bool:
    """Whether ``path`` lies strictly inside ``folder``."""
    path, folder = path.resolve(), folder.resolve()
    return path != folder and path.is_relative_to(folder)


def _read(name: str | Path, root: Path | None) -> tuple[Source, list[Run]]:
    source = locate(name, root)
    skip = [s.resolve() for s in source.skip]
    found = [d for d in run_dirs(source.folder) if not any(d.resolve().is_relative_to(s) for s in skip)]
    if not found:
        raise BadInput(
            f"{source.label} keeps no runs of its own under {source.shown}: pick a result of a bench or a study "
            "(`testbed results list`), whose folder keeps its runs"
        )
    return source, find_runs(found)


def runs(name: str | Path, root: Path | None = None) -> list[Run]:
    """The runs a result keeps (``lab.results.Run``: config, summary, evaluation curve), sorted by env, algo, seed.

    ``name``: an entry of ``benchmarks/manifest.yaml``, or a folder holding runs. ``root``: the repository
    whose manifest names the result (default: the one this package is imported from)."""
    return _read(name, root)[1]


def _commit(run: Run) -> str | None:
    """The commit the run started at: its first start's ``meta.json`` (``git_commit``; a resume writes its own
    file beside it)."""
    commit = run_meta(run).get("git_commit")
    return str(commit) if commit else None


def _relative(run: Run, folder: Path) -> str:
    return Path(os.path.relpath(run.run_dir, folder)).as_posix()


def finals(name: str | Path, root: Path | None = None) -> pd.DataFrame:
    """One row per run of the result: ``result``, ``algo``, ``env`` (the env label: id plus the kwargs that
    make it another env), ``seed``, ``status``, ``budget`` (config ``total_steps``), ``final_return`` and
    ``final_return_std`` (``summary.json``'s final evaluation; NaN unless the run completed),
    ``eval_episodes``, ``steps`` and ``wall_time_s`` (how far it trained, how long it took), ``commit``
    (``meta.json``'s) and ``run`` (its folder, relative to the result's)."""
    source, found = _read(name, root)
    rows = [
        {
            "result": source.label,
            "algo": r.algo,
            "env": r.env_id,
            "seed": r.seed,
            "status": r.status,
            "budget": int(r.config.get("total_steps", 0)) or None,
            "final_return": r.final_return,
            "final_return_std": r.summary.get("final_eval_return_std"),
            "eval_episodes": r.summary.get("final_eval_episodes") or r.config.get("eval_episodes"),
            "steps": r.last_step,
            "wall_time_s": r.last_wall_time_s,
            "commit": _commit(r),
            "run": _relative(r, source.folder),
        }
        for r in found
    ]
    table = pd.DataFrame(rows, columns=list(FINALS_COLUMNS))
    return table.astype({"budget": "Int64", "final_return": float, "final_return_std": float, "eval_episodes": "Int64"})


def curves(name: str | Path, root: Path | None = None) -> pd.DataFrame:
    """One row per evaluation of each run of the result: ``result``, ``algo``, ``env``, ``seed``,
    ``global_step``, ``wall_time_s`` (since the run started), ``eval_return`` (the mean deterministic
    evaluation return) and ``run`` (its folder, relative to the result's)."""
    source, found = _read(name, root)
    parts = [
        pd.DataFrame(
            {
                "result": source.label,
                "algo": r.algo,
                "env": r.env_id,
                "seed": r.seed,
                "global_step": r.steps,
                "wall_time_s": r.wall_time_s,
                "eval_return": r.eval_return,
                "run": _relative(r, source.folder),
            },
            columns=list(CURVES_COLUMNS),
        )
        for r in found
    ]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=list(CURVES_COLUMNS))


# ── a bench beside a committed result ────────────────────────────────────────────────────────────


def _settings(runs: Sequence[Run], env: str, keys: Sequence[str]) -> dict[str, list[Any]]:
    """Each of ``keys`` (config keys, or ``eval_convention`` from the summary) → the values the env's runs hold."""
    values: dict[str, list[Any]] = {}
    for run in runs:
        if run.env_id != env:
            continue
        for key in keys:
            value = (
                (run.summary.get(key) or DEFAULT_EVAL_CONVENTION) if key == "eval_convention" else run.config.get(key)
            )
            if value not in values.setdefault(key, []):
                values[key].append(value)
    return values


def _differences(
    mine: Sequence[Run], theirs: Sequence[Run], envs: Sequence[str], keys: Sequence[str], names: tuple[str, str]
) -> tuple[list[str], list[str]]:
    """``env: key A in MINE, B in THEIRS`` for each env and key whose values differ between the two sides, and
    the options that would train the bench's runs as the result's were."""
    found: list[str] = []
    fixes: list[str] = []
    for env in envs:
        ours, others = _settings(mine, env, keys), _settings(theirs, env, keys)
        for key in keys:
            if sorted(map(repr, ours[key])) != sorted(map(repr, others[key])):
                said = [", ".join(map(_shown, values)) for values in (ours[key], others[key])]
                found.append(f"{env}: {key} {said[0]} in {names[0]}, {said[1]} in {names[1]}")
                if len(others[key]) == 1 and (fix := _option(key, others[key][0])) not in fixes:
                    fixes.append(fix)
    return found, fixes


def _shown(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _option(key: str, value: Any) -> str:
    """The option of ``testbed bench`` that trains with ``key`` at ``value``."""
    if key == "eval_convention":
        return f"an evaluation by its convention ({value})"
    if key in BUDGET_KEYS:
        flag = "--" + key.replace("_", "-")
        return f"{flag} {value}" if value is not None else f"no {flag}"
    return f"--set {key}={value if value not in ({}, None) else '{}'}"


def comparable_envs(mine: Sequence[Run], theirs: Sequence[Run], names: tuple[str, str]) -> list[str]:
    """The envs both sets of runs hold, where they can be compared; BadInput, in one line that says what to
    change, where they share no env, or where on a shared env their budgets or their evaluation differ.
    ``names``: how the message names the two sides (the bench, the result)."""
    ours, others = ({r.env_id for r in side} for side in (mine, theirs))
    shared = sorted(ours & others, key=natural_key)
    if not shared:
        raise BadInput(
            f"{names[0]} and {names[1]} share no env: {names[0]} has {', '.join(sorted(ours))}; {names[1]} has "
            f"{', '.join(sorted(others))}. Run your bench on one of {names[1]}'s envs"
        )
    for what, keys in (("budgets differ", BUDGET_KEYS), ("evaluation differs", (*EVAL_KEYS, "eval_convention"))):
        found, fixes = _differences(mine, theirs, shared, keys, names)
        if found:
            raise BadInput(
                f"{what} on the envs both hold ({'; '.join(found)}): rerun the bench with {names[1]}'s "
                f"({', '.join(fixes) or 'one value per env'}) to compare like with like"
            )
    return shared


def report_against(bench_dir: Path, name: str | Path, root: Path | None = None) -> dict[str, Path]:
    """The bench report over ``bench_dir``'s runs and the committed result ``name``'s on the envs both hold,
    the result's algos relabelled ``ALGO@NAME``, written into ``bench_dir/against-NAME/``; the paths written,
    as ``lab.report.build_report`` returns them. Everything is checked (:func:`comparable_envs`) before a file
    is written, and nothing is written into the result's folder."""
    bench_dir = Path(bench_dir)
    source, theirs = _read(name, root)
    label = source.label
    mine = find_runs([bench_dir])
    out_dir = bench_dir / f"against-{label}"
    if out_dir.resolve().is_relative_to(source.folder.resolve()):
        raise BadInput(
            f"{bench_dir} lies inside {label}'s folder, and the comparison would be written there; copy the bench "
            "elsewhere first"
        )
    shared = comparable_envs(mine, theirs, (str(bench_dir), label))
    relabelled = [replace(r, algo=f"{r.algo}@{label}") for r in theirs if r.env_id in shared]
    compared = [r for r in mine if r.env_id in shared] + relabelled
    places = {(r.run_dir, r.algo): _relative(r, bench_dir) for r in mine}
    places |= {(r.run_dir, r.algo): (Path(source.shown) / _relative(r, source.folder)).as_posix() for r in relabelled}

    def where(run: Run) -> str:
        return places[(run.run_dir, run.algo)]

    left_out = [
        f"{e} ({side})"
        for side, runs_of in ((str(bench_dir), mine), (label, theirs))
        for e in sorted({r.env_id for r in runs_of} - set(shared), key=natural_key)
    ]
    commits = sorted({c[:7] for c in map(_commit, relabelled) if c})
    preface = [
        Para(
            f"{bench_dir.resolve().name} beside the committed result {label} (`{source.shown}`): the bench report over "
            f"both sets of runs, {label}'s algos relabelled ALGO@{label} "
            f"({', '.join(sorted({r.algo for r in relabelled}))}). On every env compared ({', '.join(shared)}), both "
            "hold the same budget (total_steps, budget_seconds) and the same evaluation (eval_episodes, eval_interval, "
            "eval_env_kwargs, convention). "
            + (f"Left out, as only one side ran them: {', '.join(left_out)}. " if left_out else "")
            + f"Runs: {counted(len(compared) - len(relabelled), 'run')} of the bench, {len(relabelled)} of {label}"
            + (f", trained at commit {', '.join(commits)}. " if commits else ". ")
            + "Wall-clock figures (steps/s, time to threshold, return at equal wall-clock) compare machines as well as "
            "algos where the two trained on different ones (machine and software below)."
        )
    ]
    with DirLock(out_dir):
        return build_report(bench_dir, compared, out_dir, f"{bench_dir.resolve().name} against {label}", where, preface)
