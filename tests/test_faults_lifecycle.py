"""A run's lifecycle under faults, third round: a trainer killed on its own (as the out-of-memory killer
kills it), a progress.csv shortened or deleted by hand, and a checkpoint holding NaN.

What must hold: a killed trainer's cell continues from its last checkpoint, in the bench's retry and on a
rerun, never from step 0; a resume refuses a file it would damage, in one line, before it writes anything;
a checkpoint that is not finite is refused by `--resume` and `eval` alike, and recorded as diverged.
Cells train CartPole-v1 with PPO (8 envs × 32 steps = 256 env steps an iteration), no periodic evaluation.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from agents import rundir, runlog
from lab import bench
from lab.cells import pack_pending
from lab.cli import main
from lab.results import find_runs
from tests.conftest import REPO, read_progress

SETS = ["eval_interval=0", "eval_episodes=2", "checkpoint_interval=1024"]
SMALL = ["--algo", "ppo", "--env", "CartPole-v1", "--set", "eval_interval=0", "--set", "eval_episodes=2"]


@pytest.fixture(autouse=True)
def _importable_project(monkeypatch: pytest.MonkeyPatch) -> None:
    # The cells' trainers are `python -m lab` processes started from the test's scratch directory.
    monkeypatch.setenv("PYTHONPATH", str(REPO))


def steps_of(run_dir: Path) -> list[int]:
    return [int(row["global_step"]) for row in read_progress(run_dir)]


# ── 1. a trainer killed on its own continues from its checkpoint ─────────────────────────────────────


class TrainerKiller(threading.Thread):
    """Kills the trainer of ``run_dirs`` with SIGKILL, alone (its driver lives on), ``kills`` times: each time
    once the trainer has written a checkpoint of its own. Just before each kill, with the trainer stopped,
    it keeps what every run had on disk up to its checkpoint: ``kept[n][run_dir]`` = (checkpoint step, the
    bytes of progress.csv that the checkpoint recorded)."""

    def __init__(self, run_dirs: list[Path], kills: int) -> None:
        super().__init__(daemon=True)
        self.run_dirs, self.kills = run_dirs, kills
        self.kept: list[dict[Path, tuple[int, bytes]]] = []
        self.done = threading.Event()

    def trainer(self) -> int | None:
        holder = rundir.lock_holder(self.run_dirs[0])  # "pid N on HOST (testbed train …)"
        return int(holder.split()[1]) if holder and holder.startswith("pid ") else None

    def checkpoints(self) -> list[int]:
        return [
            (d / rundir.CHECKPOINT).stat().st_mtime_ns if (d / rundir.CHECKPOINT).exists() else 0 for d in self.run_dirs
        ]

    def run(self) -> None:
        killed: set[int] = set()
        deadline = time.monotonic() + 120
        while len(self.kept) < self.kills and time.monotonic() < deadline:
            pid = self.trainer()
            if pid is None or pid in killed:
                time.sleep(0.005)
                continue
            seen = self.checkpoints()  # a checkpoint newer than these is this trainer's own
            while time.monotonic() < deadline and any(a <= b for a, b in zip(self.checkpoints(), seen)):
                time.sleep(0.005)
            os.kill(pid, signal.SIGSTOP)  # holds its files still while they are read
            kept = {}
            for run_dir in self.run_dirs:
                ckpt = runlog.load_checkpoint(run_dir, {})
                kept[run_dir] = ckpt["global_step"], (run_dir / "progress.csv").read_bytes()[: ckpt["csv_bytes"]]
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
            self.kept.append(kept)
        self.done.set()


def assert_continued(run_dir: Path, kept: list[dict[Path, tuple[int, bytes]]], total_steps: int) -> None:
    """The run completed in its first directory, and its progress.csv continues every kill's checkpoint: it
    begins with the very bytes each checkpoint recorded (wall times included, which a start from scratch would
    write anew), and holds every iteration once."""
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert not list(run_dir.parent.glob(f".{run_dir.name}.failed*")), "the run was set aside and started again"
    data = (run_dir / "progress.csv").read_bytes()
    for kill in kept:
        step, prefix = kill[run_dir]
        assert 0 < step <= total_steps and data.startswith(prefix)
    assert steps_of(run_dir) == list(range(256, total_steps + 1, 256))


def test_a_trainer_killed_alone_resumes_from_its_checkpoint_in_the_benchs_retry(tmp_path: Path) -> None:
    total = 8192
    grid = bench.plan_grid(None, ["ppo"], ["CartPole-v1"], 1, total, SETS, "oom")
    run_dir = grid.cells()[0].run_dir(tmp_path / "oom")
    killer = TrainerKiller([run_dir], kills=1)
    killer.start()
    _, [outcome] = bench.run_grid(grid, 1, "local", None, root=tmp_path, report=False)
    killer.join(5)
    assert len(killer.kept) == 1, "the trainer ended before it could be killed"
    assert (outcome.status, outcome.attempts) == ("completed", 2)
    assert_continued(run_dir, killer.kept, total)


def test_a_stack_killed_in_both_attempts_resumes_on_a_rerun(tmp_path: Path) -> None:
    # Two seeds side by side in one process, killed in the first attempt and again in the retry: each
    # continues from its checkpoint each time, and a rerun of the same bench completes them.
    total = 6144
    grid = bench.plan_grid(None, ["ppo"], ["CartPole-v1"], 2, total, SETS, "stack")
    run_dirs = [cell.run_dir(tmp_path / "stack") for cell in grid.cells()]
    killer = TrainerKiller(run_dirs, kills=2)
    killer.start()
    _, outcomes = bench.run_grid(grid, 1, "local", None, root=tmp_path, report=False, stack=2)
    killer.join(5)
    assert len(killer.kept) == 2, "the trainers ended before they could be killed twice"
    assert [(o.status, o.attempts) for o in outcomes] == [("failed", 2), ("failed", 2)]
    assert not list(run_dirs[0].parent.glob(".seed*.failed*")), "the retry set the runs aside and started again"
    assert all("killed by SIGKILL" in str(o.error) for o in outcomes)
    assert killer.kept[1][run_dirs[0]][0] > killer.kept[0][run_dirs[0]][0]  # the retry went on from the first kill

    _, outcomes = bench.run_grid(grid, 1, "local", None, root=tmp_path, report=False, stack=2)
    assert [(o.status, o.resumed) for o in outcomes] == [("completed", True), ("completed", True)]
    for run_dir in run_dirs:
        assert_continued(run_dir, killer.kept, total)


def test_a_stack_whose_seed_holds_a_nan_checkpoint_keeps_it_diverged_and_resumes_the_other(tmp_path: Path) -> None:
    grid = bench.plan_grid(None, ["ppo"], ["CartPole-v1"], 2, 1024, SETS, "nan")
    run_dirs = [cell.run_dir(tmp_path / "nan") for cell in grid.cells()]
    sets = [arg for pair in SETS for arg in ("--set", pair)]  # the cells' own runs, trained here to save a process
    argv = ["train", "--algo", "ppo", "--env", "CartPole-v1", *sets, "--total-steps", "1024", "--seeds", "0,1"]
    assert main([*argv, "--run-dir", str(run_dirs[0].parent)]) == 0
    for run_dir in run_dirs:  # as if the stack was killed after its last checkpoint, before its summaries
        (run_dir / "summary.json").unlink()
    poison(run_dirs[1])
    rows = (run_dirs[0] / "progress.csv").read_bytes()

    _, outcomes = bench.run_grid(grid, 1, "local", None, root=tmp_path, report=False, stack=2)
    assert (outcomes[0].status, outcomes[0].attempts) == ("completed", 2)
    assert outcomes[1].status == "failed" and outcomes[1].diverged and outcomes[1].attempts == 1
    assert "holds NaN or inf values" in str(outcomes[1].error)
    summary = json.loads((run_dirs[1] / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["diverged"] is True and summary["total_steps"] == 1024
    assert not list(run_dirs[0].parent.glob(".seed*.failed*"))  # neither seed was set aside
    assert (run_dirs[0] / "progress.csv").read_bytes().startswith(rows[: rows.rindex(b"\n1024,")])


# ── 2. a shortened or deleted progress.csv ─────────────────────────────────────────────────────────


def trained_run(run_dir: Path, total_steps: int = 1024) -> None:
    """A run stopped at ``total_steps`` that a longer budget resumes (a checkpoint each 256 steps)."""
    argv = ["train", *SMALL, "--set", "checkpoint_interval=256", "--total-steps", str(total_steps)]
    assert main([*argv, "--run-dir", str(run_dir)]) == 0


def snapshot(run_dir: Path) -> dict[str, tuple[int, bytes]]:
    """Every file of the run directory: its modification time and bytes."""
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(run_dir.iterdir()) if p.is_file()}


@pytest.mark.parametrize("damage", ["rows-deleted", "deleted"])
def test_a_resume_refuses_a_shortened_or_missing_progress_csv_before_writing_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    run_dir = tmp_path / "run"
    trained_run(run_dir)
    path = run_dir / "progress.csv"
    if damage == "deleted":
        path.unlink()
    else:  # two rows deleted by hand, in the middle
        lines = path.read_bytes().splitlines(keepends=True)
        path.write_bytes(b"".join(lines[:1] + lines[3:]))
    before = snapshot(run_dir)
    capsys.readouterr()

    argv = ["train", *SMALL, "--set", "checkpoint_interval=256", "--total-steps", "2048", "--run-dir", str(run_dir)]
    assert main([*argv, "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err
    assert "Restore progress.csv from a backup, or start the run again in a new folder" in err
    assert snapshot(run_dir) == before  # no NUL padding, no fresh header, no event file, no meta

    # The readers that `plot` and `report` use warn about the file, naming it.
    assert find_runs([run_dir])[0].problem
    warning = capsys.readouterr().err
    assert f"warning: {path} " in warning
    assert ("is missing" if damage == "deleted" else "fewer than the") in warning


def test_the_readers_warn_about_a_progress_csv_padded_with_nul_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # What a resume of a shortened file wrote before it was refused: the missing bytes as NULs, then the new
    # rows, the first of them glued to the NULs. The file still ends at the run's last step.
    run_dir = tmp_path / "run"
    trained_run(run_dir, 1024)
    path = run_dir / "progress.csv"
    header, *rows = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(header + rows[0] + b"\x00" * len(rows[1]) + b"".join(rows[2:]))
    capsys.readouterr()
    find_runs([run_dir])
    assert f"warning: {path} holds NUL bytes" in capsys.readouterr().err


# ── 3. a checkpoint that holds NaN ───────────────────────────────────────────────────────────────────


def poison(run_dir: Path) -> None:
    """Put a NaN into one weight of the run's checkpoint, as a run that diverged unnoticed would leave it."""
    ckpt = torch.load(run_dir / rundir.CHECKPOINT, weights_only=True)
    name = next(iter(ckpt["model"]))
    ckpt["model"][name].view(-1)[0] = float("nan")
    torch.save(ckpt, run_dir / rundir.CHECKPOINT)


def test_a_nan_checkpoint_is_refused_by_eval_and_resume_and_recorded_diverged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    trained_run(run_dir, 512)
    poison(run_dir)
    (run_dir / "summary.json").unlink()  # as if killed after its last checkpoint
    checkpoint = run_dir / rundir.CHECKPOINT
    capsys.readouterr()

    assert main(["eval", str(run_dir), "--episodes", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{checkpoint} holds NaN or inf values" in err
    assert not (run_dir / "summary.json").exists()  # eval only reads

    progress = (run_dir / "progress.csv").read_bytes()
    argv = ["train", *SMALL, "--total-steps", "1024", "--run-dir", str(run_dir), "--resume"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{checkpoint} holds NaN or inf values" in err
    assert "Traceback" not in err and "start the run again in a new folder" in err.lower()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["diverged"], summary["total_steps"]) == ("failed", True, 512)
    assert (run_dir / "progress.csv").read_bytes() == progress


def test_a_stack_log_left_by_a_driver_killed_after_its_runs_completed_is_shared_on_the_rerun(tmp_path: Path) -> None:
    # The fault probe's case: a tune driver SIGKILLed after its stack's trainer had written both summaries but
    # before it shared the stack's console log; the rerun finds both cells done and starts no process for them.
    grid = bench.Grid("orphan", ["ppo"], ["CartPole-v1"], [0, 1], 512)
    cells = grid.cells()
    for cell in cells:
        run_dir = cell.run_dir(tmp_path)
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text('{"status": "completed"}')
    folder = cells[0].run_dir(tmp_path).parent
    orphan = folder / ".stack-999999999-seed0.log"
    orphan.write_text("# seed0.log seed1.log\n[ppo CartPole-v1 seed 0] step 512/512\n")
    done, stacks = pack_pending(cells, tmp_path, stack=2)
    assert done == cells and stacks == []
    assert not orphan.exists()
    assert (
        (folder / "seed0.log").read_text()
        == (folder / "seed1.log").read_text()
        == "[ppo CartPole-v1 seed 0] step 512/512\n"
    )
