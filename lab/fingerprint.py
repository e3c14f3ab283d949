"""Whether a bench's report is up to date: a fingerprint of everything the report is built from.

Rebuilding a report reads every run, bootstraps every table and draws every plot: half a minute for a handful
of runs, far more for a suite. A rerun of a finished bench trains nothing, so its report would come out the
same; :func:`up_to_date` tells so in a fraction of a second. The fingerprint covers what ``lab.report`` and
``lab.credit`` read: each run's config, meta files, progress and summary, the bench's own settings, and the
code that makes a report (the modules of ``lab/`` those two import, found by reading their imports, so that no
list goes stale, and the data files of ``lab/``). It is written beside the report, with the files the report
wrote, which must all still exist.

The invocations that ``bench.yaml`` records are left out of it: a rerun that trained nothing adds one, which
would otherwise force a rebuild whose only news is a few seconds of wall-clock.
"""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path

from agents.config import read_yaml
from agents.rundir import atomic_write_text

FINGERPRINT = ".report-inputs.json"
"""Beside report.md: the fingerprint the report was built from and the files it wrote (hidden: not a result)."""
RUN_FILES = ("config.yaml", "summary.json", "progress.csv", "progress.csv.gz")
BENCH_FILES = ("credit.yaml",)  # read as bytes; bench.yaml is read without its invocations
CODE = Path(__file__).resolve().parent
REPORTS = ("report", "credit")
"""The modules that build reports: with every ``lab`` module they import, directly or not, the report's code."""


def report_code() -> list[Path]:
    """The source files of :data:`REPORTS` and of every module of ``lab`` they import, and ``lab``'s data files."""
    seen: set[str] = set()
    todo = list(REPORTS)
    while todo:
        name = todo.pop()
        if name in seen or not (CODE / f"{name}.py").is_file():
            continue
        seen.add(name)
        for node in ast.walk(ast.parse((CODE / f"{name}.py").read_bytes())):
            if isinstance(node, ast.ImportFrom) and node.module == "lab":
                todo += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lab."):
                todo.append(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                todo += [alias.name.split(".")[1] for alias in node.names if alias.name.startswith("lab.")]
    return [CODE / f"{name}.py" for name in seen] + [p for p in CODE.iterdir() if p.suffix == ".yaml"]


def _bench_settings(bench_dir: Path) -> bytes:
    """bench.yaml without what each invocation adds (its start and end, its command again): the grid, and the
    distinct commands (a credit report lists them)."""
    path = bench_dir / "bench.yaml"
    saved = (read_yaml(path) or {}) if path.exists() else {}
    settings = {k: v for k, v in saved.items() if k not in ("invocations", "commands")}
    settings["commands"] = list(dict.fromkeys(saved.get("commands") or []))
    return json.dumps(settings, sort_keys=True, default=str).encode()


def fingerprint(bench_dir: Path) -> str:
    """A hash of the report's inputs: the runs' files under ``bench_dir`` (not in hidden folders, which hold
    runs being copied in), the bench's settings, and the report's code (:func:`report_code`)."""
    digest = hashlib.sha256(_bench_settings(bench_dir))
    files = [
        p for p in bench_dir.rglob("*") if p.name in RUN_FILES or (p.name.startswith("meta") and p.suffix == ".json")
    ]
    files += [bench_dir / name for name in BENCH_FILES if (bench_dir / name).exists()]
    files += report_code()
    for path in sorted(files):
        relative = path.relative_to(CODE if path.is_relative_to(CODE) else bench_dir)
        if any(part.startswith(".") for part in relative.parts) or not path.is_file():
            continue
        digest.update(f"\0{relative.as_posix()}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def up_to_date(bench_dir: Path, inputs: str) -> dict[str, Path] | None:
    """The files the last report wrote, by the keys ``lab.bench.build_reports`` returns, when it was built from
    the same ``inputs`` (:func:`fingerprint`) and every one of them exists; None when it must be built again."""
    try:
        saved = json.loads((bench_dir / FINGERPRINT).read_text())
        written = {str(key): bench_dir / str(path) for key, path in saved["written"].items()}
        same = saved["fingerprint"] == inputs
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return written if same and all(path.exists() for path in written.values()) else None


def record(bench_dir: Path, inputs: str, written: dict[str, Path]) -> None:
    """Write beside the report the fingerprint of the inputs it was built from (taken before it was built, so a
    run that changed meanwhile makes the next one build again) and the files it wrote. Nothing is written when
    one of them lies outside ``bench_dir``: that report is simply built again next time."""
    root = bench_dir.resolve()
    if not all(path.resolve().is_relative_to(root) for path in written.values()):
        return
    relative = {key: path.resolve().relative_to(root).as_posix() for key, path in written.items()}
    atomic_write_text(bench_dir / FINGERPRINT, json.dumps({"fingerprint": inputs, "written": relative}))
