"""Where a tuning study lives: its folder, ``runs/tune/NAME/`` (``tune.yaml``, one folder per trial), and its
storage, a journal file in that folder or a database that several drivers share.

A journal survives a write cut short: :func:`check_journal` refuses one damaged anywhere but at its end,
and the driver drops a last record cut short before it writes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agents import rundir
from envs.errors import BadInput, brief
from lab.cells import Cell, reused_elsewhere

TUNE_ROOT = Path("runs") / "tune"
STUDY_FILE = "study.log"
TUNE_FILE = "tune.yaml"


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
        raise BadInput(f"cannot open the study storage {brief(url, 120)} ({type(error).__name__}: "
                       f"{brief(str(error).splitlines()[0], 160) if str(error) else 'no detail'}). Give a database URL Optuna "
                       "accepts, e.g. sqlite:///tune.db or postgresql://user@host/db, or leave --storage out for a "
                       "local file.") from None  # fmt: skip


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
            raise BadInput(f"{path} is damaged at line {number} ({brief(line[:60])}), which is not a journal record. "
                           "Restore the file from a backup, or start the study again under another --name.")  # fmt: skip
    if repair and whole < len(data):
        with open(path, "r+b") as f:
            f.truncate(whole)
            os.fsync(f.fileno())
        print(f"{path}: dropped its last record, cut short by a stop mid-write ({len(data) - whole} bytes); the "
              "trial it concerned resumes from its runs", flush=True)  # fmt: skip


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
    print(f"{bench_dir} held runs trained with other settings than its trial's ({stale[0]}): moved to {aside.name}; "
          "the trial trains afresh", flush=True)  # fmt: skip
