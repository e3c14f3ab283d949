"""The faults of tuning studies, each caused for real: a trial left running by a driver killed before its study
folder moved, a report that wrote into the storage it read, tune.yaml files that ended in tracebacks, and the
scratch folders of a killed Ray driver's tasks.

Trials train CartPole-v1 with PPO for a few thousand steps, without periodic evaluation.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from agents import rundir
from lab import raywatch, study, tune
from lab.cli import main
from tests.conftest import REPO, hold_lock, wait_for

SPACE = "learning_rate: [1.0e-3, 1.0e-9]\n"
RUN = Path("runs") / "tune" / "t" / "trial0000" / "CartPole-v1" / "ppo" / "seed100"


def tune_command(space: Path, *extra: str) -> list[str]:
    """A study of one trial, the env's preset, of 4,096 steps that checkpoints every 4 iterations of 256."""
    return [
        sys.executable,
        "-m",
        "lab",
        "tune",
        "--algo",
        "ppo",
        "--env",
        "CartPole-v1",
        "--trials",
        "1",
        "--total-steps",
        "4096",
        "--space",
        str(space),
        "--pruner",
        "none",
        "--name",
        "t",
        "--set",
        "checkpoint_interval=1024",
        "--set",
        "eval_interval=0",
        "--set",
        "eval_episodes=2",
        *extra,
    ]


@functools.cache
def tiny_plan(storage: str | None = None) -> tune.TunePlan:
    """A study named t of one trial on CartPole-v1, planned once per module (planning checks the whole space)."""
    return dataclasses.replace(tune.plan_tune("ppo", "CartPole-v1", 1, 2048, 1, None, [], "t"), storage=storage)


def trial_states(home: Path, storage: str | None) -> list[str]:
    """The states of study t's trials, in its journal in ``home/runs/tune/t`` or its SQLite file ``home/t.db``."""
    import optuna

    opened = study.storage_for(storage and f"sqlite:///{home / 't.db'}", home / "runs" / "tune" / "t")
    return [t.state.name for t in optuna.load_study(study_name="t", storage=opened).trials]


def files_of(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder``: its bytes and modification time, by path."""
    return {
        p.relative_to(folder).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# ── 1. a trial left running is continued wherever its study folder is now ───────────────────────────


@pytest.mark.parametrize("storage", [None, "sqlite:///t.db"], ids=["journal", "sqlite"])
def test_a_trial_left_by_a_killed_driver_is_continued_after_its_folder_moved(
    tmp_path: Path, storage: str | None
) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    command = tune_command(space, *(["--storage", storage] if storage else []))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    home = tmp_path / "home"
    home.mkdir()
    driver = subprocess.Popen(command, cwd=home, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (home / RUN / rundir.CHECKPOINT).exists(), timeout_s=60, poll_s=0.05)
    finally:
        driver.kill()
        driver.wait()
    wait_for(lambda: rundir.lock_holder(home / RUN) is None, timeout_s=30, poll_s=0.05)  # its trainer stops
    assert trial_states(home, storage) == ["RUNNING"]

    moved = tmp_path / "elsewhere"  # the same study, from another folder (a renamed one, another mount)
    home.rename(moved)
    rerun = subprocess.run(command, cwd=moved, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert rerun.returncode == 0, rerun.stderr
    assert "trial 0: left running by a driver that stopped" in rerun.stdout
    assert trial_states(moved, storage) == ["COMPLETE"]  # the same trial, continued: no new one
    assert "--resume" in (moved / RUN).with_name("seed100.log").read_text()


def test_a_folder_continues_only_its_own_trials_in_a_shared_storage() -> None:
    import optuna

    running = optuna.trial.TrialState.RUNNING
    mine = optuna.trial.create_trial(state=running, user_attrs={study.STUDY_ID: "a1", "driver": "old-host:/old"})
    theirs = optuna.trial.create_trial(state=running, user_attrs={study.STUDY_ID: "b2", "driver": "here:/x"})
    older = optuna.trial.create_trial(state=running, user_attrs={"driver": "here:/x"})  # before folders had an id
    done = optuna.trial.create_trial(value=1.0, user_attrs={study.STUDY_ID: "a1"})
    trials = [mine, theirs, older, done]
    # Whatever host or path its driver had, a trial of this folder's is continued; another folder's is not.
    assert study.left_running(trials, "a1", shared=True, legacy_driver="here:/x") == [mine, older]
    assert study.left_running(trials, "a1", shared=True, legacy_driver="elsewhere:/y") == [mine]
    # The folder's own journal holds only its trials.
    assert study.left_running(trials, "a1", shared=False, legacy_driver="") == [mine, theirs, older]


def test_a_study_folder_keeps_its_identity_through_reruns(tmp_path: Path) -> None:
    plan = tiny_plan()
    made = tune.write_tune_yaml(tmp_path / "kept", plan)
    (tmp_path / "kept").rename(tmp_path / "renamed")
    assert tune.write_tune_yaml(tmp_path / "renamed", plan) == made
    assert yaml.safe_load((tmp_path / "renamed" / "tune.yaml").read_text())[study.STUDY_ID] == made
    assert tune.write_tune_yaml(tmp_path / "other", plan) != made


# ── 2. reading a study never writes ─────────────────────────────────────────────────────────────────


def a_finished_study(home: Path, storage: str | None) -> Path:
    """A study folder under ``home`` whose one trial completed (no run trained: its cost is recorded)."""
    import optuna

    from lab import trials

    plan = tiny_plan(storage)
    tune_dir = home / "runs" / "tune" / "t"
    tune.write_tune_yaml(tune_dir, plan)
    cwd = os.getcwd()
    os.chdir(home)  # a relative SQLite path is the folder's that `tune` ran in
    try:
        made = optuna.create_study(study_name="t", storage=study.storage_for(storage, tune_dir), direction="maximize")
        made.add_trial(
            optuna.trial.create_trial(
                value=100.0,
                params={"learning_rate": 1e-3},
                distributions={"learning_rate": optuna.distributions.CategoricalDistribution([1e-3, 1e-9])},
                user_attrs={"overrides": ["learning_rate=0.001"], trials.COST: [2048, 2048, 1.0]},
            )
        )
    finally:
        os.chdir(cwd)
    return tune_dir


REPORTED = ("tune.md", "tune.html", "preset.yaml", "plots/")


@pytest.mark.parametrize("storage", [None, "sqlite:///t.db"], ids=["journal", "sqlite"])
def test_a_report_from_another_folder_leaves_the_storage_and_the_tree_as_they_were(
    tmp_path: Path, storage: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    tune_dir = a_finished_study(tmp_path / "home", storage)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    before = files_of(tmp_path)
    os.chdir(elsewhere)
    assert main(["report", str(tune_dir)]) == 0, capsys.readouterr().err
    after = {
        path: kept
        for path, kept in files_of(tmp_path).items()
        if not path.removeprefix("home/runs/tune/t/").startswith(REPORTED)
    }
    assert after == before  # same files, bytes and times: no t.db here, no lock file, no table added
    assert "Trial 0: mean final return 100" in (tune_dir / "tune.md").read_text()


def test_a_report_refuses_a_storage_that_is_missing_or_holds_no_study_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tune_dir = a_finished_study(tmp_path, None)
    (tune_dir / "study.log").unlink()
    plan = tiny_plan("sqlite:///none/t.db")
    other = tune_dir.with_name("u")
    tune.write_tune_yaml(other, plan)
    foreign = tmp_path / "foreign.db"  # an SQLite file of someone else's: Optuna's tables must not be added to it
    with sqlite3.connect(foreign) as connection:
        connection.execute("create table notes (text)")
    connection.close()
    before = files_of(tmp_path)
    for folder, said in [(tune_dir, "holds no study.log"), (other, "sqlite:///none/t.db")]:
        assert main(["report", str(folder)]) == 2
        err = capsys.readouterr().err
        assert said in err and "nothing was written" in err and len(err.strip().splitlines()) == 1
    assert files_of(tmp_path) == before and not (tmp_path / "none").exists()
    (other / "tune.yaml").write_text(
        (other / "tune.yaml").read_text().replace("sqlite:///none/t.db", f"sqlite:///{foreign}")
    )
    before = files_of(tmp_path)
    assert main(["report", str(other)]) == 2
    assert "holds no study Optuna can read" in capsys.readouterr().err
    assert files_of(tmp_path) == before
    with sqlite3.connect(foreign) as connection:
        assert [row[0] for row in connection.execute("select name from sqlite_master")] == ["notes"]
    connection.close()


# ── 3. a malformed tune.yaml is refused in one line ────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("- name: t\n- algo: ppo\n", "holds list where a study's settings belong"),
        (
            "algo: ppo\nenv_id: CartPole-v1\nseeds: [100]\n",
            "lacks `name`, which a study's tune.yaml holds; add `name: t`",
        ),
        ("name: [t]\nalgo: ppo\nenv_id: CartPole-v1\nseeds: [100]\n", "`name` is ['t'], not a text"),
    ],
)
def test_a_report_refuses_a_malformed_tune_yaml_in_one_line(
    tmp_path: Path, text: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tune_dir = a_finished_study(tmp_path, None)
    (tune_dir / "tune.yaml").write_text(text)
    before = files_of(tmp_path)
    assert main(["report", str(tune_dir)]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1
    assert files_of(tmp_path) == before


def test_a_study_refuses_a_tune_yaml_that_is_not_a_mapping_before_any_work(tmp_path: Path) -> None:
    from envs.errors import BadInput

    plan = tiny_plan()
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "tune.yaml").write_text("[1, 2]\n")
    with pytest.raises(BadInput, match="holds list where a study's settings belong"):
        tune.run_study(plan, 1, "local", None, root=tmp_path)
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["tune.yaml"]


# ── 4. a killed Ray driver's tasks leave no scratch folder ──────────────────────────────────────────


def scratch_folders(tmp: Path) -> list[Path]:
    """The Ray tasks' scratch folders under ``tmp``: at its top (before the fix) or in an instance's folder."""
    return [*tmp.glob("testbed-cells-*"), *tmp.glob("testbed-ray-*/testbed-cells-*")]


def test_a_killed_ray_drivers_scratch_folders_go_with_it(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    tmp = Path(tempfile.mkdtemp())  # short: Ray's sockets live under TMPDIR too
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp)}
    command = [
        sys.executable,
        "-m",
        "lab",
        "bench",
        "--algos",
        "ppo",
        "--envs",
        "CartPole-v1",
        "--seeds",
        "1",
        "--total-steps",
        "1000000",
        "--backend",
        "ray",
        "--workers",
        "1",
        "--name",
        "r",
        "--set",
        "eval_interval=0",
    ]
    driver = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        wait_for(
            lambda: any((f / "ppo").is_dir() for f in tmp.glob("**/testbed-cells-*/CartPole-v1")),
            timeout_s=60,
            poll_s=0.1,
        )
        assert scratch_folders(tmp)
        driver.kill()
        driver.wait()
        wait_for(lambda: not scratch_folders(tmp), timeout_s=20, poll_s=0.1)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        left = scratch_folders(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    assert not left
    assert not list(tmp.glob("testbed-ray-*"))


def test_a_scratch_folder_whose_watchdog_is_gone_is_swept_and_a_watched_one_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    orphan, watched = tmp_path / "testbed-ray-orphan", tmp_path / "testbed-ray-watched"
    assert raywatch.LOCK == rundir.LOCK  # so another process holds it as it holds a run directory's
    for folder in (orphan, watched):
        (folder / "testbed-cells-x").mkdir(parents=True)
        (folder / raywatch.LOCK).touch()
    holder = hold_lock(watched)  # the watchdog of a live instance
    try:
        raywatch._sweep()
    finally:
        holder.kill()
        holder.wait()
    assert not orphan.exists() and (watched / "testbed-cells-x").is_dir()
