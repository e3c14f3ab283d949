"""The manifest of committed results, and the command that reruns them (``testbed results``).

``benchmarks/manifest.yaml`` lists every result the project commits: the command that makes it, its
seeds and budget, the files it keeps, and, written by ``testbed results run`` and never by hand, where
and from which code it was last produced. ``testbed results pages`` (``lab.pages``) turns the manifest and
those files into the site's result pages and the README's generated blocks.

A rerun is the entry's own command, so it resumes as that command does: a bench or a study reuses its
finished runs, and a stopped ``results run`` started again goes on from the first entry not yet done.
"""

from __future__ import annotations

import datetime
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from envs.errors import BadInput
from lab.machine import machine_line

MANIFEST = Path("benchmarks/manifest.yaml")
HEADER = """\
# Every result the project commits. Edit the entries by hand, but not `produced`: `testbed results run`
# writes it when it reruns an entry's command and keeps its files (entries made before that command
# existed carry what their files and the history record). `testbed results pages`
# rebuilds docs/results/ and the README's generated blocks from this file and the kept files.
# code_version: raise it when a change alters what the algorithms compute; results produced at a lower
# version are shown as from older code, with their commit, and stay out of the headline tables.
"""
ENTRY_KEYS = {"name", "title", "about", "command", "output", "folder", "keep", "page", "seeds", "budget",
              "cost", "fresh", "last_line", "produced"}  # fmt: skip
COSTS = ("cheap", "long")


@dataclass(frozen=True)
class Entry:
    """One committed result: what makes it, what is kept, and where it was last produced."""

    name: str
    title: str
    about: str
    command: str  # as a user types it, from the repository root
    folder: str  # where the kept files live, relative to the repository root
    keep: tuple[str, ...]  # files or folders, relative to ``folder``
    seeds: str
    budget: str
    cost: str  # "cheap": rerun by ``testbed results run --cheap``
    page: str | None = None  # the Markdown file (relative to ``folder``) the result page shows
    output: str | None = None  # where the command writes, when not ``folder``: kept files are copied from it
    fresh: bool = False  # start from an empty ``output``, so the recorded wall time is a first run's
    last_line: str | None = None  # keep the last line the command printed (a test run's count) in this file
    produced: dict[str, Any] = field(default_factory=dict)  # commit, date, machine, wall_s, code_version


@dataclass(frozen=True)
class Manifest:
    code_version: int
    entries: tuple[Entry, ...]

    def entry(self, name: str) -> Entry:
        for e in self.entries:
            if e.name == name:
                return e
        raise BadInput(f"no result named {name!r} in {MANIFEST}; the names: {', '.join(self.names())}")

    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def current(self, entry: Entry) -> bool:
        """Whether the entry was produced by the algorithms as they compute today."""
        return entry.produced.get("code_version") == self.code_version

    def older(self, entry: Entry) -> bool:
        """Whether the entry was produced, but by algorithms that computed otherwise than today's."""
        return bool(entry.produced) and not self.current(entry)


def _entry(raw: Any, where: str) -> Entry:
    if not isinstance(raw, dict) or "name" not in raw:
        raise BadInput(f"{where}: each entry of `results` is a mapping with at least a `name`")
    unknown = set(raw) - ENTRY_KEYS
    if unknown:
        raise BadInput(f"{where}: entry {raw['name']!r} has unknown keys {sorted(unknown)}; the keys: {sorted(ENTRY_KEYS)}")
    missing = {"title", "about", "command", "folder", "keep", "seeds", "budget", "cost"} - set(raw)
    if missing:
        raise BadInput(f"{where}: entry {raw['name']!r} lacks {sorted(missing)}")
    if raw["cost"] not in COSTS:
        raise BadInput(f"{where}: entry {raw['name']!r} has cost {raw['cost']!r}; use one of {COSTS}")
    values = {k: raw[k] for k in ENTRY_KEYS if k in raw}
    values["keep"] = tuple(raw["keep"])
    values["produced"] = dict(raw.get("produced") or {})
    return Entry(**values)


def load(root: Path) -> Manifest:
    """Read and check ``benchmarks/manifest.yaml`` under ``root``."""
    path = root / MANIFEST
    if not path.exists():
        raise BadInput(f"{path} does not exist; run `testbed results` from the repository root")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw.get("code_version"), int) or not isinstance(raw.get("results"), list):
        raise BadInput(f"{path}: needs an integer `code_version` and a list `results`")
    entries = tuple(_entry(r, str(path)) for r in raw["results"])
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise BadInput(f"{path}: result names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    return Manifest(raw["code_version"], entries)


def save(root: Path, manifest: Manifest) -> None:
    """Write the manifest back, keys in a fixed order; written whole to a temporary file, then renamed."""
    order = ["name", "title", "about", "command", "output", "folder", "keep", "page", "seeds", "budget", "cost",
             "fresh", "last_line", "produced"]  # fmt: skip
    results = []
    for e in manifest.entries:
        values = {"name": e.name, "title": e.title, "about": e.about, "command": e.command, "output": e.output,
                  "folder": e.folder, "keep": list(e.keep), "page": e.page, "seeds": e.seeds, "budget": e.budget,
                  "cost": e.cost, "fresh": e.fresh or None, "last_line": e.last_line, "produced": e.produced or None}  # fmt: skip
        results.append({k: values[k] for k in order if values[k] is not None})
    text = HEADER + yaml.safe_dump({"code_version": manifest.code_version, "results": results}, sort_keys=False,
                                   allow_unicode=True, width=110, default_flow_style=None)  # fmt: skip
    path = root / MANIFEST
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def argv_of(command: str) -> list[str]:
    """The command's argv, run by this Python: ``testbed …`` and ``python …`` need nothing on PATH."""
    argv = shlex.split(command)
    if argv[0] == "testbed":
        return [sys.executable, "-m", "lab.cli", *argv[1:]]
    if argv[0] == "python":
        return [sys.executable, *argv[1:]]
    return argv


def git_commit(root: Path) -> str:
    """The checked-out commit, with ``+changes`` when its code differs from it.

    Code is what can change a number: Python files, YAML presets and spaces, setup.cfg. Results and pages
    that other reruns are writing meanwhile (benchmarks/results/, docs/) do not count.
    """
    code = ["*.py", "*.yaml", "setup.cfg", ":(exclude)benchmarks/results", ":(exclude)benchmarks/manifest.yaml"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *code], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{head}+changes" if dirty else head


def select(manifest: Manifest, names: Sequence[str], every: bool, cheap: bool) -> list[Entry]:
    """The entries to rerun, checked before any work starts."""
    if bool(names) + every + cheap != 1:
        raise BadInput("name the results to rerun, or give --all or --cheap (one of the three); "
                       "`testbed results list` shows the names")  # fmt: skip
    if every:
        return list(manifest.entries)
    if cheap:
        return [e for e in manifest.entries if e.cost == "cheap"]
    return [manifest.entry(n) for n in names]


def _keep(root: Path, entry: Entry) -> None:
    """Copy the kept files from where the command wrote them, replacing the committed ones."""
    if entry.output is None:
        return
    source, target = root / entry.output, root / entry.folder
    copied = [k for k in entry.keep if k != entry.last_line]  # that one is written by the rerun itself
    missing = [k for k in copied if not (source / k).exists()]
    if missing:
        raise BadInput(f"{entry.name}: the command ended but {source} lacks {missing}; nothing was replaced")
    target.mkdir(parents=True, exist_ok=True)
    for k in copied:
        src, dst = source / k, target / k
        if src.is_dir():
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)


def rerun(root: Path, manifest: Manifest, entry: Entry) -> Manifest:
    """Run one entry's command, keep its files and record where, when and from which code it ran."""
    if entry.fresh and entry.output is not None:
        shutil.rmtree(root / entry.output, ignore_errors=True)
    output = root / (entry.output or entry.folder)
    reused = entry.output is not None and output.is_dir() and any(output.iterdir())
    commit, started = git_commit(root), time.monotonic()
    child = subprocess.Popen(argv_of(entry.command), cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, bufsize=1)  # fmt: skip
    assert child.stdout is not None
    last = ""
    for line in child.stdout:  # shown as it comes
        sys.stdout.write(line)
        sys.stdout.flush()
        last = line.strip() or last
    code = child.wait()
    wall = time.monotonic() - started
    if code != 0:
        raise BadInput(f"{entry.name}: `{entry.command}` exited with status {code} after {wall:.0f} s; its "
                       "committed files and the manifest are unchanged. Fix the cause and rerun: finished runs "
                       "are reused")  # fmt: skip
    _keep(root, entry)
    if entry.last_line is not None:
        (root / entry.folder).mkdir(parents=True, exist_ok=True)
        (root / entry.folder / entry.last_line).write_text(last + "\n")
    produced = {"commit": commit, "date": datetime.date.today().isoformat(), "machine": machine_line(),
                "wall_s": round(wall, 1), "reused_runs": reused, "code_version": manifest.code_version}  # fmt: skip
    # The file as it is now, not as it was when this (perhaps hours-long) command started: entries added or
    # produced meanwhile, by hand or by another `results run`, are kept.
    current = load(root)
    entries = tuple(Entry(**{**e.__dict__, "produced": produced}) if e.name == entry.name else e
                    for e in current.entries)  # fmt: skip
    updated = Manifest(current.code_version, entries)
    save(root, updated)
    return updated


def pytest_line(text: str) -> tuple[int, float] | None:
    """``(passed, seconds)`` from pytest's closing line, e.g. ``601 passed, 3 warnings in 336.41s``."""
    found = re.findall(r"(\d+) passed.*? in ([\d.]+)s", text)
    return (int(found[-1][0]), float(found[-1][1])) if found else None
