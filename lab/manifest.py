"""The manifest of committed results, and the command that reruns them (``testbed results``).

``benchmarks/manifest.yaml`` lists every result the project commits: the command that makes it, its
seeds and budget, the files it keeps, and, written by ``testbed results run`` and never by hand, where
and from which code it was last produced. ``lab.pages`` turns it and those files into the site's result
pages and the README's generated blocks.

A rerun is the entry's own command, so it resumes as that command does. An entry with ``keep_runs`` keeps
what a reader needs of each run that ended (``lab.kept``) when its command ends or is stopped, and a rerun
first restores those runs into the output, so that finished runs are reused in any later checkout.
"""

from __future__ import annotations

import datetime
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from envs.errors import BadInput
from lab.executor import stop_signals
from lab.kept import keep_runs, restore_runs
from lab.machine import machine_line

MANIFEST = Path("benchmarks/manifest.yaml")
HEADER = """\
# Every result the project commits. Edit the entries by hand, but not `produced`: `testbed results run`
# writes it when it reruns an entry's command and keeps its files (entries made before that command
# existed keep what their files and the history record). Nor `progress`: `testbed results save` writes it
# when it keeps the files of a result still being made. `testbed results pages`
# rebuilds docs/results/ and the README's generated blocks from this file and the kept files.
# code_version: raise it, with CODE_VERSION in agents/rundir.py, when a change alters what the algorithms
# compute; results produced at a lower version are shown as from older code, with their commit, and stay out
# of the headline tables.
"""
REQUIRED = {"title", "about", "command", "folder", "keep", "seeds", "budget", "cost"}
TRY_KEYS = {"what", "runs", "steps", "algo", "env", "result"}
COSTS = ("cheap", "long")


@dataclass(frozen=True)
class Entry:
    """One committed result: what makes it, what is kept, and where it was last produced. The fields stand in
    the order the manifest writes them (``output`` and ``page`` are keyword-only for that)."""

    name: str
    title: str
    about: str
    command: str  # as a user types it, from the repository root
    output: str | None = field(default=None, kw_only=True)  # where the command writes, when not ``folder``
    folder: str  # where the kept files live, relative to the repository root
    keep: tuple[str, ...]  # files or folders, relative to ``folder``
    page: str | None = field(default=None, kw_only=True)  # the Markdown file (under ``folder``) the page shows
    seeds: str
    budget: str
    cost: str  # "cheap": rerun by ``testbed results run --cheap``
    fresh: bool = False  # start from an empty ``output``, so the recorded wall time is a first run's
    last_line: str | None = None  # keep the last line the command printed (a test run's count) in this file
    keep_runs: bool = False  # keep each ended run of ``output`` at its path under ``folder`` (``lab.kept``)
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


ENTRY_KEYS = tuple(f.name for f in fields(Entry))


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

    def rerunning(self, entry: Entry) -> bool:
        """Whether the entry, produced by older code, is being rerun by today's (its runs so far saved)."""
        return self.older(entry) and entry.progress.get("code_version") == self.code_version

    def in_progress(self, entry: Entry) -> bool:
        """Whether the entry is not produced yet but its files so far were kept (``testbed results save``)."""
        return bool(entry.progress) and not entry.produced


def _entry(raw: Any, where: str) -> Entry:
    if not isinstance(raw, dict) or "name" not in raw:
        raise BadInput(f"{where}: each entry of `results` is a mapping with at least a `name`")

    def refused(problem: str) -> BadInput:
        return BadInput(f"{where}: entry {raw['name']!r} {problem}")

    if unknown := set(raw) - set(ENTRY_KEYS):
        raise refused(f"has unknown keys {sorted(unknown)}; the keys: {sorted(ENTRY_KEYS)}")
    if missing := REQUIRED - set(raw):
        raise refused(f"lacks {sorted(missing)}")
    if raw["cost"] not in COSTS:
        raise refused(f"has cost {raw['cost']!r}; use one of {COSTS}")
    if raw.get("keep_runs", False) not in (True, False):
        raise refused(f"has keep_runs {raw['keep_runs']!r}; give true or false")
    if raw.get("keep_runs") and not (isinstance(raw.get("output"), str) and raw["output"].startswith("runs/")):
        raise refused(
            "keeps runs but names no `output` under runs/ to keep them from; give the folder its command writes, "
            "e.g. runs/bench/NAME"
        )
    if raw.get("keep_runs") and raw.get("fresh"):
        raise refused("is fresh (its output starts empty) and keeps runs (that a rerun reuses); drop one of the two")
    if "stopped" in raw and not (isinstance(raw["stopped"], str) and raw["stopped"].strip()):
        raise refused(
            f"has stopped {raw['stopped']!r}; give the reason it is not to be run on, as a text, or drop the key"
        )
    tries = tuple(_try(t, f"{where}: entry {raw['name']!r}", raw["command"]) for t in raw.get("tries") or [])
    records = {k: dict(raw.get(k) or {}) for k in ("produced", "progress")}
    return Entry(**{**raw, "keep": tuple(raw["keep"]), "tries": tries, **records})


def _try(raw: Any, where: str, command: str) -> dict[str, Any]:
    example = "{what: 'Tianshou settings', runs: 2, steps: 1000000, result: '641.9, 614.3'}"
    if not isinstance(raw, dict) or set(raw) - TRY_KEYS or not {"what", "runs", "steps"} <= set(raw):
        raise BadInput(
            f"{where}: each of `tries` is a mapping with what, runs and steps (and optionally algo, env, result), e.g. "
            f"{example}; got {raw!r}"
        )
    if not all(isinstance(raw[k], int) and not isinstance(raw[k], bool) and raw[k] > 0 for k in ("runs", "steps")):
        raise BadInput(
            f"{where}: a try's runs and steps are positive whole numbers; got {raw['runs']!r} and {raw['steps']!r}"
        )
    if not command.startswith("testbed tune ") and not {"algo", "env"} <= set(raw):
        raise BadInput(
            f"{where}: a try listed beside a result that is not a `testbed tune` study names its algo and env; got "
            f"{raw!r}"
        )
    return dict(raw)


def load(root: Path) -> Manifest:
    """Read and check ``benchmarks/manifest.yaml`` under ``root``."""
    path = root / MANIFEST
    if not path.exists():
        raise BadInput(f"{path} does not exist; run `testbed results` from the repository root")
    try:
        raw = yaml.safe_load(path.read_bytes().decode("utf-8")) or {}
    except UnicodeDecodeError as error:
        raise BadInput(
            f"{path} is not UTF-8 text (byte {error.start}); restore it from git (`git checkout -- {MANIFEST}`) or "
            f"save it as UTF-8"
        ) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise BadInput(
            f"{path} is not valid YAML{where} ({getattr(error, 'problem', None) or 'unreadable'}); quote a text that "
            "holds ': ' or ' #'"
        ) from None
    if not (
        isinstance(raw, dict) and isinstance(raw.get("code_version"), int) and isinstance(raw.get("results"), list)
    ):
        raise BadInput(f"{path}: needs an integer `code_version` and a list `results`")
    entries = tuple(_entry(r, str(path)) for r in raw["results"])
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise BadInput(f"{path}: result names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    return Manifest(raw["code_version"], entries)


def save(root: Path, manifest: Manifest) -> None:
    """Write the manifest back, keys in a fixed order and unset ones left out; written whole to a temporary
    file, then renamed."""
    results = [
        {
            k: list(v) if isinstance(v, tuple) else v
            for k in ENTRY_KEYS
            if (v := getattr(e, k)) not in (None, False, (), {}) or k in REQUIRED
        }
        for e in manifest.entries
    ]
    text = HEADER + yaml.safe_dump(
        {"code_version": manifest.code_version, "results": results},
        sort_keys=False,
        allow_unicode=True,
        width=110,
        default_flow_style=None,
    )
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

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head, dirty = (
            git("rev-parse", "--short", "HEAD"),
            git("status", "--porcelain", "--untracked-files=no", "--", *code),
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{head}+changes" if dirty else head


def select(manifest: Manifest, names: Sequence[str], every: bool, cheap: bool) -> list[Entry]:
    """The entries to rerun, checked before any work starts. --all and --cheap pass over stopped entries; one
    named is refused."""
    if bool(names) + every + cheap != 1:
        raise BadInput(
            "name the results to rerun, or give --all or --cheap (one of the three); `testbed results list` shows the "
            "names"
        )
    if every or cheap:
        return [e for e in manifest.entries if e.stopped is None and (every or e.cost == "cheap")]
    chosen = [manifest.entry(n) for n in names]
    for entry in chosen:
        if entry.stopped is not None:
            reason = entry.stopped.strip().rstrip(".")
            raise BadInput(
                f"{entry.name} is stopped in {MANIFEST} ({reason}). Its command would go on from there, so it is not "
                "run; to run it on all the same, delete its `stopped` key"
            )
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


def _stamp(commit: str, manifest: Manifest, **more: Any) -> dict[str, Any]:
    """Where, when and from which code a result's files were made."""
    today = datetime.date.today().isoformat()
    return {"commit": commit, "date": today, "machine": machine_line(), **more, "code_version": manifest.code_version}


def keep_progress(root: Path, manifest: Manifest, entry: Entry) -> Manifest | None:
    """Keep what a long result's command has written so far (a bench's report as its last invocation left
    it, say) and record where in ``progress``; the manifest as saved, or None when there is nothing to keep.

    A result not produced yet keeps its files so far, and its page shows that part, marked as such. A produced
    one's kept files stay the finished result's until a rerun ends: for a rerun of a result from older code,
    only the record is written (``Manifest.rerunning``; its runs so far are kept by ``keep``)."""
    if entry.output is None or entry.page is None or not (root / entry.output / entry.page).is_file():
        return None
    if entry.produced and not manifest.older(entry):
        return None
    if not entry.produced:
        _copy_kept(
            root / entry.output, root / entry.folder, [k for k in entry.keep if (root / entry.output / k).exists()]
        )
    return _record(root, entry.name, progress=_stamp(git_commit(root), manifest))


def _record(root: Path, name: str, **fields: dict[str, Any]) -> Manifest:
    """Write ``fields`` into one entry of the manifest file as it is now, not as it was when a (perhaps
    hours-long) command started: entries added or produced meanwhile, by hand or by another `results run`,
    are kept. The manifest saved."""
    current = load(root)
    updated = Manifest(
        current.code_version, tuple(Entry(**{**e.__dict__, **fields}) if e.name == name else e for e in current.entries)
    )
    save(root, updated)
    return updated


def reuse_sources(root: Path, entry: Entry) -> list[Path]:
    """The folders the entry's bench adopts finished runs from (each ``--reuse-from``), in its order."""
    argv = argv_of(entry.command)
    return [root / argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "--reuse-from"]


def restore(root: Path, entry: Entry) -> list[Path]:
    """Copy the entry's kept runs back into its output, where this checkout has none of their files, with the
    kept files the output lacks (a bench's ``bench.yaml`` records its invocations, which its report counts);
    the runs restored, relative to the output. Its command then reuses them as finished."""
    if not entry.keep_runs or entry.output is None:
        return []
    folder, output = root / entry.folder, root / entry.output
    _copy_kept(folder, output, [k for k in entry.keep if (folder / k).exists() and not (output / k).exists()])
    return restore_runs(folder, output)


def keep(root: Path, entry: Entry) -> list[Path]:
    """Keep each run of the entry's output that ended (``lab.kept``), but those its bench adopted from another
    result (``--reuse-from``), which that result keeps; the runs kept, relative to the output."""
    if not entry.keep_runs or entry.output is None or not (root / entry.output).is_dir():
        return []
    return keep_runs(root / entry.output, root / entry.folder, reuse_sources(root, entry))


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

    Its kept runs are restored first, and the runs that ended are kept when the command ends, stopped or not."""
    for other in manifest.entries:  # an audit reads its bench's runs, which no checkout keeps: make them first
        needed = other.output not in (None, entry.output) and other.output in shlex.split(entry.command)
        if needed and not (root / other.output).is_dir():
            raise BadInput(
                f"{entry.name} reads {other.output}, which this checkout lacks; make it first: `testbed results "
                f"run {other.name} {entry.name}`"
            )
    if entry.fresh and entry.output is not None:
        shutil.rmtree(root / entry.output, ignore_errors=True)
    if restored := restore(root, entry):
        print(f"{entry.name}: restored {len(restored)} kept runs from {entry.folder}", flush=True)
    output = root / (entry.output or entry.folder)
    # Runs an earlier invocation finished: left in the output, or adopted from another bench's folder.
    left = entry.output is not None and output.is_dir() and any(output.iterdir())
    reused = left or bool(reuse_sources(root, entry))
    commit, started = git_commit(root), time.monotonic()
    # In a session of its own, so that a Ctrl-C on the terminal reaches the command once, through _follow.
    child = subprocess.Popen(
        argv_of(entry.command),
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,
    )
    try:
        code, last = _follow(child)
    finally:
        keep(root, entry)
    wall = time.monotonic() - started
    if code != 0:
        kept = f"; the runs that ended are kept in {entry.folder}" if entry.keep_runs else ""
        raise BadInput(
            f"{entry.name}: `{entry.command}` exited with status {code} after {wall:.0f} s; its report and the "
            f"manifest are unchanged{kept}. Fix the cause and rerun: finished runs are reused"
        )
    if entry.output is not None:  # the kept files, from where the command wrote them (the last line it writes here)
        copied = [k for k in entry.keep if k != entry.last_line]
        if missing := [k for k in copied if not (root / entry.output / k).exists()]:
            raise BadInput(
                f"{entry.name}: the command ended but {root / entry.output} lacks {missing}; nothing was replaced"
            )
        _copy_kept(root / entry.output, root / entry.folder, copied)
    if entry.last_line is not None:
        (root / entry.folder).mkdir(parents=True, exist_ok=True)
        (root / entry.folder / entry.last_line).write_text(last + "\n")
    produced = _stamp(commit, manifest, wall_s=round(wall, 1), reused_runs=reused)
    return _record(root, entry.name, produced=produced, progress={})


def pytest_line(text: str) -> tuple[int, float] | None:
    """``(passed, seconds)`` from pytest's closing line, e.g. ``601 passed, 3 warnings in 336.41s``."""
    found = re.findall(r"(\d+) passed.*? in ([\d.]+)s", text)
    return (int(found[-1][0]), float(found[-1][1])) if found else None
