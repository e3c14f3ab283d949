"""The manifest of committed results, and the command that reruns them (``testbed results``).

``benchmarks/manifest.yaml`` lists every result the project commits: the command that makes it, its
seeds and budget, the files it keeps, and, written by ``testbed results run`` and never by hand, where
and from which code it was last produced. ``testbed results pages`` (``lab.pages``) turns the manifest and
those files into the site's result pages and the README's generated blocks.

A rerun is the entry's own command, so it resumes as that command does: a bench or a study reuses its
finished runs, and a stopped ``results run`` started again goes on from the first entry not yet done.

Runs live under ``runs/``, which git ignores, so a new checkout would start a long result over. An entry's
``carry`` names the run folders that travel with the checkout instead: a rerun copies them into
``FOLDER/carried/`` when its command ends or is stopped (``testbed results save`` does it for runs still
going), and copies them back before its command starts, so finished runs are reused and stopped ones resume
from their checkpoints in any later checkout.

An entry that is not to be run on, a study stopped for good short of its trials, says why under
``stopped``; ``results run`` refuses it by name and passes over it with ``--all`` or ``--cheap``.
"""

from __future__ import annotations

import datetime
import filecmp
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from envs.errors import BadInput
from lab.executor import stop_signals
from lab.machine import machine_line

MANIFEST = Path("benchmarks/manifest.yaml")
HEADER = """\
# Every result the project commits. Edit the entries by hand, but not `produced`: `testbed results run`
# writes it when it reruns an entry's command and keeps its files (entries made before that command
# existed carry what their files and the history record). Nor `progress`: `testbed results save` writes it
# when it keeps the files of a result still being made. `testbed results pages`
# rebuilds docs/results/ and the README's generated blocks from this file and the kept files.
# code_version: raise it when a change alters what the algorithms compute; results produced at a lower
# version are shown as from older code, with their commit, and stay out of the headline tables.
"""
ENTRY_KEYS = {"name", "title", "about", "command", "output", "folder", "keep", "page", "seeds", "budget",
              "cost", "fresh", "last_line", "carry", "tries", "stopped", "produced", "progress"}  # fmt: skip
TRY_KEYS = {"what", "runs", "steps", "algo", "env", "result"}
COSTS = ("cheap", "long")
CARRIED = "carried"  # under an entry's folder: its carried runs, at their paths from the repository root


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
    carry: tuple[str, ...] = ()  # glob patterns of run folders under runs/ that travel with the checkout
    # Runs on tuning seeds outside a study that chose settings (a try, a hand sweep): what, runs, steps, and
    # the algo and env where the command is not the study of that algo and env. The tuning ledger counts them.
    tries: tuple[dict[str, Any], ...] = ()
    # Why a result that ran part of its command (a study stopped short of its trials) is not to be run on: a
    # resumed study would go on from trials that no longer match the presets. `results run` refuses it, and the
    # tuning ledger plans no more of it than it ran.
    stopped: str | None = None
    produced: dict[str, Any] = field(default_factory=dict)  # commit, date, machine, wall_s, code_version
    # Of a long result not produced yet: where its files so far were saved (``testbed results save``).
    progress: dict[str, Any] = field(default_factory=dict)  # commit, date, machine, code_version


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

    def in_progress(self, entry: Entry) -> bool:
        """Whether the entry is not produced yet but its files so far were kept (``testbed results save``)."""
        return bool(entry.progress) and not entry.produced


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
    carry = raw.get("carry") or []
    if not isinstance(carry, list) or not all(isinstance(c, str) and c.startswith("runs/") and ".." not in c
                                              for c in carry):  # fmt: skip
        raise BadInput(f"{where}: entry {raw['name']!r} has carry {carry!r}; give a list of folders (glob patterns "
                       "allowed) under runs/, e.g. [runs/bench/NAME]")  # fmt: skip
    if carry and raw.get("fresh"):
        raise BadInput(f"{where}: entry {raw['name']!r} is fresh (its output starts empty) and carries runs (that "
                       "a rerun reuses); drop one of the two")  # fmt: skip
    values["carry"] = tuple(carry)
    if "stopped" in raw and not (isinstance(raw["stopped"], str) and raw["stopped"].strip()):
        raise BadInput(f"{where}: entry {raw['name']!r} has stopped {raw['stopped']!r}; give the reason it is not to "
                       "be run on, as a text, or drop the key")  # fmt: skip
    values["tries"] = tuple(_try(t, f"{where}: entry {raw['name']!r}", raw["command"]) for t in raw.get("tries") or [])
    values["produced"] = dict(raw.get("produced") or {})
    values["progress"] = dict(raw.get("progress") or {})
    return Entry(**values)


def _try(raw: Any, where: str, command: str) -> dict[str, Any]:
    example = "{what: 'Tianshou settings', runs: 2, steps: 1000000, result: '641.9, 614.3'}"
    if not isinstance(raw, dict) or set(raw) - TRY_KEYS or not {"what", "runs", "steps"} <= set(raw):
        raise BadInput(f"{where}: each of `tries` is a mapping with what, runs and steps (and optionally algo, env, "
                       f"result), e.g. {example}; got {raw!r}")  # fmt: skip
    if not all(isinstance(raw[k], int) and not isinstance(raw[k], bool) and raw[k] > 0 for k in ("runs", "steps")):
        raise BadInput(f"{where}: a try's runs and steps are positive whole numbers; got {raw['runs']!r} and "
                       f"{raw['steps']!r}")  # fmt: skip
    if not command.startswith("testbed tune ") and not {"algo", "env"} <= set(raw):
        raise BadInput(f"{where}: a try listed beside a result that is not a `testbed tune` study names its algo and "
                       f"env; got {raw!r}")  # fmt: skip
    return dict(raw)


def load(root: Path) -> Manifest:
    """Read and check ``benchmarks/manifest.yaml`` under ``root``."""
    path = root / MANIFEST
    if not path.exists():
        raise BadInput(f"{path} does not exist; run `testbed results` from the repository root")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise BadInput(f"{path} is not valid YAML{where} ({getattr(error, 'problem', None) or 'unreadable'}); "
                       "quote a text that holds ': ' or ' #'") from None  # fmt: skip
    if not isinstance(raw, dict) or not isinstance(raw.get("code_version"), int) or not isinstance(
        raw.get("results"), list
    ):
        raise BadInput(f"{path}: needs an integer `code_version` and a list `results`")
    entries = tuple(_entry(r, str(path)) for r in raw["results"])
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise BadInput(f"{path}: result names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    return Manifest(raw["code_version"], entries)


def save(root: Path, manifest: Manifest) -> None:
    """Write the manifest back, keys in a fixed order; written whole to a temporary file, then renamed."""
    order = ["name", "title", "about", "command", "output", "folder", "keep", "page", "seeds", "budget", "cost",
             "fresh", "last_line", "carry", "tries", "stopped", "produced", "progress"]  # fmt: skip
    results = []
    for e in manifest.entries:
        values = {"name": e.name, "title": e.title, "about": e.about, "command": e.command, "output": e.output,
                  "folder": e.folder, "keep": list(e.keep), "page": e.page, "seeds": e.seeds, "budget": e.budget,
                  "cost": e.cost, "fresh": e.fresh or None, "last_line": e.last_line, "carry": list(e.carry) or None,
                  "tries": [dict(t) for t in e.tries] or None, "stopped": e.stopped, "produced": e.produced or None,
                  "progress": e.progress or None}  # fmt: skip
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
    """The entries to rerun, checked before any work starts. --all and --cheap pass over stopped entries; one
    named is refused."""
    if bool(names) + every + cheap != 1:
        raise BadInput("name the results to rerun, or give --all or --cheap (one of the three); "
                       "`testbed results list` shows the names")  # fmt: skip
    if every or cheap:
        return [e for e in manifest.entries if e.stopped is None and (every or e.cost == "cheap")]
    chosen = [manifest.entry(n) for n in names]
    for entry in chosen:
        if entry.stopped is not None:
            reason = entry.stopped.strip().rstrip(".")
            raise BadInput(f"{entry.name} is stopped in {MANIFEST} ({reason}). Its command would go on from there, "
                           "so it is not run; to run it on all the same, delete its `stopped` key")  # fmt: skip
    return chosen


def _copy_kept(source: Path, target: Path, kept: list[str]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for k in kept:
        src, dst = source / k, target / k
        if src.is_dir():
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)


def _keep(root: Path, entry: Entry) -> None:
    """Copy the kept files from where the command wrote them, replacing the committed ones."""
    if entry.output is None:
        return
    source = root / entry.output
    copied = [k for k in entry.keep if k != entry.last_line]  # that one is written by the rerun itself
    missing = [k for k in copied if not (source / k).exists()]
    if missing:
        raise BadInput(f"{entry.name}: the command ended but {source} lacks {missing}; nothing was replaced")
    _copy_kept(source, root / entry.folder, copied)


def keep_progress(root: Path, manifest: Manifest, entry: Entry) -> Manifest | None:
    """Keep what a long result's command has written so far (a bench's report as its last invocation left
    it, say) and record where in ``progress``; the manifest as saved, or None when there is nothing to keep.

    Only for a result not produced yet: a produced one's kept files stay the finished result's until a
    rerun ends. Its page then shows the part so far, marked as such (``lab.pages``)."""
    if entry.produced or entry.output is None or entry.page is None or not (root / entry.output / entry.page).is_file():
        return None
    _copy_kept(root / entry.output, root / entry.folder, [k for k in entry.keep if (root / entry.output / k).exists()])
    progress = {"commit": git_commit(root), "date": datetime.date.today().isoformat(), "machine": machine_line(),
                "code_version": manifest.code_version}  # fmt: skip
    return _record(root, entry.name, progress=progress)


def _record(root: Path, name: str, **fields: dict[str, Any]) -> Manifest:
    """Write ``fields`` into one entry of the manifest file as it is now, not as it was when a (perhaps
    hours-long) command started: entries added or produced meanwhile, by hand or by another `results run`,
    are kept. The manifest saved."""
    current = load(root)
    updated = Manifest(current.code_version, tuple(Entry(**{**e.__dict__, **fields}) if e.name == name else e
                                                   for e in current.entries))  # fmt: skip
    save(root, updated)
    return updated


def _copy_run_folder(source: Path, target: Path, adopted_from: Sequence[Path] = ()) -> None:
    """Copy what a run needs to resume or to be reused. Lock files and logs stay behind (hidden: they name
    this machine's writer), and so does what is large and made again from the rest: TensorBoard event files
    (``progress.csv`` holds the same numbers) and reports with their plots (a bench or study rebuilds them).
    So do runs the bench adopted (``--reuse-from``, ``adopted_from``) and still holds as they came: the
    command adopts them again from there. Checkpoints go first: a trainer may still be writing, and a log
    copied after its checkpoint is at least as long as the checkpoint records, which a resume cuts it back to."""
    def carried(path: Path) -> bool:
        parts = path.relative_to(source).parts
        return not (path.name.startswith("events.out.tfevents") or path.suffix == ".html"
                    or path.name == "report.md" or any(p.startswith(".") or p == "plots" for p in parts))  # fmt: skip

    files = [p for p in source.rglob("*") if p.is_file() and carried(p)]
    if adopted_from:
        files = _not_adopted(files, source, adopted_from)
    for file in sorted(files, key=lambda p: (p.suffix != ".pt", str(p))):
        copy = target / file.relative_to(source)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(file, copy)


def _same_file(a: Path, b: Path) -> bool:
    return b.is_file() and filecmp.cmp(a, b, shallow=False)  # files of different sizes are unequal unread


def _not_adopted(files: list[Path], source: Path, adopted_from: Sequence[Path]) -> list[Path]:
    """``files`` (under the bench folder ``source``) less the runs and console logs that are byte for byte
    their counterparts in one of the folders ``adopted_from``. A run counts whole (every file of its folder
    the same), so that a restored checkout never holds half of one."""
    same = {f for f in files if any(_same_file(f, folder / f.relative_to(source)) for folder in adopted_from)}
    run_of = {f: next((d for d in [f.parent, *f.parent.parents]
                       if d.is_relative_to(source) and (d / "config.yaml").is_file()), None) for f in files}  # fmt: skip
    differing_runs = {run_of[f] for f in files if f not in same}
    return [f for f in files if f not in same or (run_of[f] is not None and run_of[f] in differing_runs)]


def reuse_sources(root: Path, entry: Entry) -> list[Path]:
    """The folders the entry's bench adopts finished runs from (each ``--reuse-from``), in its order."""
    argv = argv_of(entry.command)
    return [root / argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "--reuse-from"]


def carry_out(root: Path, entry: Entry) -> list[Path]:
    """Copy the entry's carried run folders into ``FOLDER/carried/``, replacing older copies; the folders copied.

    A folder that no longer exists here keeps its committed copy: a checkout that never ran it loses nothing.
    """
    copied = []
    adopted = [folder for folder in reuse_sources(root, entry) if folder.is_dir()]
    for pattern in entry.carry:
        for source in sorted(root.glob(pattern)):
            if not source.is_dir():
                continue
            target = root / entry.folder / CARRIED / source.relative_to(root)
            staging = target.with_name(target.name + ".partial")
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            _copy_run_folder(source, staging, adopted)
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
            copied.append(source.relative_to(root))
    return copied


def carry_in(root: Path, entry: Entry) -> list[Path]:
    """Copy carried run folders back under ``runs/`` where this checkout has none of their files; those folders.

    A folder that already holds files here is left alone, whatever it holds: its own runs are newer than, or
    the same as, the committed copy, and mixing the two would pair one run's checkpoint with another's log.
    """
    carried = root / entry.folder / CARRIED
    if not carried.is_dir():
        return []
    restored = []
    for folder in sorted(p for p in carried.rglob("*") if p.is_dir()):
        files = [f for f in folder.iterdir() if f.is_file()]
        target = root / folder.relative_to(carried)
        if not files or (target.is_dir() and any(f.is_file() for f in target.iterdir())):
            continue
        target.mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copy2(f, target / f.name)
        restored.append(folder.relative_to(carried))
    return restored


def _follow(child: subprocess.Popen[str]) -> tuple[int, str]:
    """Show the command's output as it comes; its status and last line. A stop (Ctrl-C, SIGTERM) is passed
    on once, as the SIGINT a terminal's Ctrl-C sends to the command's whole process group (a script and the
    bench it started stop together, each its own way), and raised here once the command has ended."""
    assert child.stdout is not None
    last = ""
    try:
        with stop_signals():
            for line in child.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                last = line.strip() or last
            return child.wait(), last
    except KeyboardInterrupt:
        os.killpg(child.pid, signal.SIGINT)
        child.wait()
        raise


def rerun(root: Path, manifest: Manifest, entry: Entry) -> Manifest:
    """Run one entry's command, keep its files and record where, when and from which code it ran.

    Its carried runs are restored first and carried out when the command ends, stopped or not."""
    if entry.fresh and entry.output is not None:
        shutil.rmtree(root / entry.output, ignore_errors=True)
    for folder in carry_in(root, entry):
        print(f"{entry.name}: restored {folder} from {entry.folder}/{CARRIED}", flush=True)
    output = root / (entry.output or entry.folder)
    # Runs an earlier invocation finished: left in the output, or adopted from another bench's folder.
    left = entry.output is not None and output.is_dir() and any(output.iterdir())
    reused = left or bool(reuse_sources(root, entry))
    commit, started = git_commit(root), time.monotonic()
    # In a session of its own, so that a Ctrl-C on the terminal reaches the command once, through _follow.
    child = subprocess.Popen(argv_of(entry.command), cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, bufsize=1, start_new_session=True)  # fmt: skip
    try:
        code, last = _follow(child)
    finally:
        carry_out(root, entry)
    wall = time.monotonic() - started
    if code != 0:
        kept = f"; its runs as they stand are in {entry.folder}/{CARRIED}" if entry.carry else ""
        raise BadInput(f"{entry.name}: `{entry.command}` exited with status {code} after {wall:.0f} s; its "
                       f"report and the manifest are unchanged{kept}. Fix the cause and rerun: finished runs "
                       "are reused")  # fmt: skip
    _keep(root, entry)
    if entry.last_line is not None:
        (root / entry.folder).mkdir(parents=True, exist_ok=True)
        (root / entry.folder / entry.last_line).write_text(last + "\n")
    produced = {"commit": commit, "date": datetime.date.today().isoformat(), "machine": machine_line(),
                "wall_s": round(wall, 1), "reused_runs": reused, "code_version": manifest.code_version}  # fmt: skip
    return _record(root, entry.name, produced=produced, progress={})


def pytest_line(text: str) -> tuple[int, float] | None:
    """``(passed, seconds)`` from pytest's closing line, e.g. ``601 passed, 3 warnings in 336.41s``."""
    found = re.findall(r"(\d+) passed.*? in ([\d.]+)s", text)
    return (int(found[-1][0]), float(found[-1][1])) if found else None
