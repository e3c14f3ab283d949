"""Where a tuning study lives: its folder, ``runs/tune/NAME/`` (``tune.yaml``, one folder per trial), and its
storage, a journal file in that folder or a database that several drivers share.

A journal survives a write cut short: :func:`check_journal` refuses one damaged anywhere but at its end,
and the driver drops a last record cut short before it writes.

A study folder has an identity of its own, ``study_id`` in its tune.yaml, written when the study is made and
stamped on each trial its driver starts. A trial left running is the folder's to continue wherever the folder
now is (:func:`left_running`): a host name or a path names where a driver ran, not whether it still runs, and
the folder's lock, which its driver holds, answers that.

Reading a study never writes: :func:`reading_storage` opens a snapshot of its journal or SQLite file.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agents import rundir
from agents.config import read_yaml
from envs.errors import BadInput, brief
from lab.cells import Cell, reused_elsewhere

TUNE_ROOT = Path("runs") / "tune"
STUDY_FILE = "study.log"
TUNE_FILE = "tune.yaml"
STUDY_ID = "study_id"
"""The key of a study folder's identity, in its tune.yaml and in the user attributes of the trials it started."""


def storage_for(url: str | None, tune_dir: Path) -> Any:
    """The study's storage: the journal file in ``tune_dir``, or the database at ``url``; BadInput if unreachable."""
    import optuna  # here, on first use: the command line imports this module, and Optuna takes a second

    if url is None:
        tune_dir.mkdir(parents=True, exist_ok=True)
        check_journal(tune_dir / STUDY_FILE)
        backend = optuna.storages.journal.JournalFileBackend(str((tune_dir / STUDY_FILE).resolve()))
        return optuna.storages.JournalStorage(backend)
    try:
        if url.startswith("sqlite:///") and url != "sqlite:///:memory:":  # SQLite makes the file, not its folder
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})
    except Exception as error:  # noqa: BLE001  SQLAlchemy and drivers raise many kinds; all mean "unreachable"
        raise BadInput(
            f"cannot open the study storage {brief(url, 120)} ({type(error).__name__}: "
            f"{brief(str(error).splitlines()[0], 160) if str(error) else 'no detail'}). Give a database URL Optuna "
            "accepts, e.g. sqlite:///tune.db or postgresql://user@host/db, or leave --storage out for a local file."
        ) from None


def read_tune_yaml(tune_dir: Path, needed: tuple[str, ...] = ()) -> dict[str, Any]:
    """The study's settings in ``tune_dir/tune.yaml``, a mapping holding at least the keys ``needed``; BadInput
    saying how to mend a file that is not YAML, not a mapping, or lacks one of them."""
    path = tune_dir / TUNE_FILE
    saved = read_yaml(path)
    if not isinstance(saved, dict):
        raise BadInput(
            f"{path} holds {type(saved).__name__ if saved is not None else 'nothing'} where a study's settings belong "
            "(a mapping of name, algo, env_id, seeds, ... as `testbed tune` writes it). Restore the file from a copy "
            "of the study folder or the result it came from"
        )
    kinds = {"name": str, "algo": str, "env_id": str, "seeds": list, "storage": (str, type(None)), STUDY_ID: str}
    for key in needed:
        if key not in saved:
            hint = (
                f"`name: {tune_dir.name}` if the study's --name was the folder's name"
                if key == "name"
                else "it as `testbed tune` wrote it, from a copy of the study folder"
            )
            raise BadInput(f"{path} lacks `{key}`, which a study's tune.yaml holds; add {hint}")
    for key, kind in kinds.items():
        if key in saved and not isinstance(saved[key], kind):
            raise BadInput(
                f"{path}: `{key}` is {brief(saved[key], 60)}, not a {'text' if kind is str else 'list'} as `testbed "
                f"tune` writes it; restore it from a copy of the study folder"
            )
    return saved


def study_id_of(saved: dict[str, Any]) -> str:
    """The folder's identity from its tune.yaml's contents ``saved``; a new one for a study made now, or for one
    made before folders had one."""
    return str(saved.get(STUDY_ID) or secrets.token_hex(8))


def left_running(trials: list[Any], study_id: str, shared: bool, legacy_driver: str) -> list[Any]:
    """The trials of this study folder that a driver left running, for its driver now to continue.

    The caller holds the folder's lock, which every driver of the folder holds while it runs and the kernel
    releases when it dies: so any running trial of the folder's is a dead driver's, whatever the host or
    path it ran on. In the folder's own journal (not ``shared``), every trial is the folder's. In a storage
    that several folders share, a trial is the folder's when it bears its ``study_id``; one started before
    folders had an identity, when its driver (``host:folder``, as drivers named themselves then) is
    ``legacy_driver``. Another folder's trials are left to it: its lock is not ours to test."""

    def ours(trial: Any) -> bool:
        if not shared:
            return True
        if STUDY_ID in trial.user_attrs:
            return trial.user_attrs[STUDY_ID] == study_id
        return trial.user_attrs.get("driver") == legacy_driver

    return [t for t in trials if t.state.name == "RUNNING" and ours(t)]


def sqlite_file(url: str, tune_dir: Path) -> Path:
    """The file a ``sqlite:///`` URL names. A relative path is relative to the folder ``testbed tune`` ran in:
    the current one, else the one holding ``runs/tune/NAME`` when ``tune_dir`` sits there. BadInput where
    no such file exists: reading creates nothing."""
    database = Path(url.removeprefix("sqlite:///").partition("?")[0])
    places = [database]
    parents = tune_dir.resolve().parents
    if not database.is_absolute() and len(parents) > 2 and (parents[1].name, parents[0].name) == TUNE_ROOT.parts:
        places.append(parents[2] / database)
    found = next((place for place in places if place.is_file()), None)
    if found is None:
        raise BadInput(
            f"the study's storage {brief(url, 120)} (in {tune_dir / TUNE_FILE}) is not a file here: run this from the "
            "folder `testbed tune` ran in, or set `storage` in tune.yaml to the database's path "
            "(sqlite:////absolute/path.db); nothing was written"
        )
    return found


@contextmanager
def reading_storage(url: str | None, tune_dir: Path) -> Iterator[Any]:
    """The study's storage for reading only, as ``report`` and the tuning ledger open it: a snapshot of the
    journal or SQLite file in a temporary folder, taken through a read-only connection, so that nothing is
    created, repaired or migrated, no lock file made and no time stamp moved, even while a driver writes. A
    server database is opened without creating tables. BadInput for a storage that is not there."""
    import optuna

    with tempfile.TemporaryDirectory(prefix="testbed-study-") as scratch:
        copy = Path(scratch) / "study"
        if url is None:
            journal = tune_dir / STUDY_FILE
            if not journal.is_file():
                raise BadInput(
                    f"{tune_dir} holds no {STUDY_FILE}, the journal of its study: give the study folder `testbed tune` "
                    "wrote, or restore its study.log; nothing was written"
                )
            check_journal(journal)
            shutil.copyfile(journal, copy)
            yield optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(copy)))
            return
        if not url.startswith("sqlite:///") or url == "sqlite:///:memory:":
            with _refused_storage(url):
                storage = optuna.storages.RDBStorage(url, skip_table_creation=True)
            yield storage
            return
        database = sqlite_file(url, tune_dir)
        try:
            source = sqlite3.connect(f"{database.resolve().as_uri()}?mode=ro", uri=True)
            try:
                with sqlite3.connect(copy) as target:
                    source.backup(target)
            finally:
                source.close()
        except sqlite3.Error as error:
            raise BadInput(
                f"{database} cannot be read as an SQLite database ({error}); check `storage` in "
                f"{tune_dir / TUNE_FILE}; nothing was written"
            ) from None
        with _refused_storage(url):
            storage = optuna.storages.RDBStorage(f"sqlite:///{copy}", skip_table_creation=True)
        yield storage


@contextmanager
def _refused_storage(url: str) -> Iterator[None]:
    """Opening a storage to read: a database without Optuna's tables, or one Optuna cannot read, is BadInput."""
    try:
        yield
    except Exception as error:  # noqa: BLE001  SQLAlchemy and drivers raise many kinds; all mean "not a study"
        detail = brief(str(error).splitlines()[0], 160) if str(error) else "no detail"
        raise BadInput(
            f"the study storage {brief(url, 120)} holds no study Optuna can read ({type(error).__name__}: {detail}); "
            f"check `storage` in the study's tune.yaml; nothing was written"
        ) from None


def check_journal(path: Path, repair: bool = False) -> None:
    """Refuse a study journal that holds anything but whole records (one JSON object a line), with one line
    naming the file. A last record cut short, by a driver killed mid-write or a full disk, is not damage:
    Optuna skips it when reading, and ``repair`` (the driver, holding the study's lock, before it writes)
    drops it, so that the next record does not land on the end of its partial line."""
    if not path.exists():
        return
    data = path.read_bytes()
    whole = data.rfind(b"\n") + 1
    for number, line in enumerate(data[:whole].splitlines(), start=1):
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            record = None
        if not isinstance(record, dict):
            raise BadInput(
                f"{path} is damaged at line {number} ({brief(line[:60])}), which is not a journal record. Restore the "
                "file from a backup, or start the study again under another --name."
            )
    if repair and whole < len(data):
        with open(path, "r+b") as f:
            f.truncate(whole)
            os.fsync(f.fileno())
        print(
            f"{path}: dropped its last record, cut short by a stop mid-write ({len(data) - whole} bytes); the trial it "
            "concerned resumes from its runs",
            flush=True,
        )


def trial_dir(tune_dir: Path, number: int) -> Path:
    return tune_dir / f"trial{number:04d}"


def set_aside_stale(bench_dir: Path, cells: list[Cell]) -> None:
    """Move a trial's folder aside (``.trialNNNN.staleK``) when it holds runs trained with other settings than
    the trial's, as a study whose journal was deleted finds them when it numbers its trials from 0 again:
    the trial then trains afresh, and nothing is lost. A folder that a process still writes is left to
    :func:`run_cells`, which waits for it."""
    stale = [why for cell in cells if (why := reused_elsewhere(cell, bench_dir))]
    if not stale or any(rundir.lock_holder(cell.run_dir(bench_dir)) for cell in cells):
        return
    attempt = 1
    while (aside := bench_dir.with_name(f".{bench_dir.name}.stale{attempt}")).exists():
        attempt += 1
    bench_dir.rename(aside)
    print(
        f"{bench_dir} held runs trained with other settings than its trial's ({stale[0]}): moved to {aside.name}; the "
        "trial trains afresh",
        flush=True,
    )
