"""No dead ends: every stopped run, stack, bench cell and tune trial can be finished, a finished run is
reused only for the settings it was trained with, and bad input of any size is one line.

Each test is a case that a fault probe found on earlier code, where it ended in a refusal that no command
could get past, a wrong result recorded silently, or a traceback.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from agents import onpolicy, rundir, runlog
from envs.errors import BadInput
from lab import bench, cells, trials, tune
from lab.cli import main
from tests.conftest import interrupt_after, read_progress
from tests.test_faults import SMALL, fails_cleanly, train_argv

TIMING = ("wall_time_s", "charts/SPS")


def status_of(run_dir: Path) -> str:
    return json.loads((run_dir / "summary.json").read_text())["status"]


def rows_but_times(run_dir: Path) -> list[dict[str, str]]:
    """progress.csv without its timing columns: what an interrupted and resumed run repeats bit for bit."""
    return [
        {k: v for k, v in row.items() if k not in TIMING and not k.endswith("_time_s")}
        for row in read_progress(run_dir)
    ]


def same_weights(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> bool:
    return first.keys() == second.keys() and all(torch.equal(v, second[k]) for k, v in first.items())


def same_model(a: Path, b: Path) -> bool:
    return same_weights(*(runlog.load_checkpoint(d, {})["model"] for d in (a, b)))


def stopped_in_its_last_iteration(run_dir: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> None:
    """A 1,000-step run (whole iterations of 256: it ends at 1,024) stopped by Ctrl-C in its fourth and last
    iteration, as a bench driver's stop or a pruner's can land: interrupted, past its budget."""
    with monkeypatch.context() as patch:
        interrupt_after(patch, onpolicy, "segment_steps", 4)
        assert main(train_argv(run_dir, 1000, "--set", "eval_interval=0", *extra)) == 130
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["total_steps"] == 1024


def space_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> Path:
    """A search-space file in ``tmp_path``, made the working directory (a study writes runs/tune/NAME there)."""
    monkeypatch.chdir(tmp_path)
    space = tmp_path / "space.yaml"
    space.write_text(text)
    return space


# ── 1. a stop in the last iteration ─────────────────────────────────────────────────────────────────


def test_a_run_stopped_past_its_budget_is_finished_by_resume_without_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stopped, straight = tmp_path / "stopped", tmp_path / "straight"
    stopped_in_its_last_iteration(stopped, monkeypatch)
    weights = runlog.load_checkpoint(stopped, {})["model"]
    assert main(train_argv(stopped, 1000, "--set", "eval_interval=0", "--resume")) == 0
    summary = json.loads((stopped / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_eval_episodes"] == 2
    after = runlog.load_checkpoint(stopped, {})
    assert after["global_step"] == 1024 and same_weights(after["model"], weights)  # evaluated, not trained further
    assert main(train_argv(straight, 1000, "--set", "eval_interval=0")) == 0
    assert rows_but_times(stopped) == rows_but_times(straight) and same_model(stopped, straight)
    assert (
        summary["final_eval_return_mean"]
        == json.loads((straight / "summary.json").read_text())["final_eval_return_mean"]
    )

    # A finished run resumed again has nothing left to do, and changes nothing.
    files = {p.name: p.read_bytes() for p in stopped.iterdir() if p.is_file() and p.name != rundir.LOCK}
    capsys.readouterr()
    assert main(train_argv(stopped, 1000, "--set", "eval_interval=0", "--resume")) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in stopped.iterdir() if p.is_file() and p.name != rundir.LOCK} == files


def test_a_bench_cell_stopped_past_its_budget_is_finished_by_the_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    grid = bench.Grid(
        "stuck", ["ppo"], ["CartPole-v1"], [0], 1000, overrides={"ppo": ["eval_episodes=2", "eval_interval=0"]}
    )
    run_dir = grid.cells()[0].run_dir(tmp_path / "stuck")
    stopped_in_its_last_iteration(run_dir, monkeypatch, "--seed", "0")
    _, outcomes = bench.run_grid(grid, workers=1, backend="local", ray_address=None, root=tmp_path, report=False)
    assert [(o.status, o.resumed) for o in outcomes] == [("completed", True)]
    assert status_of(run_dir) == "completed"


def test_a_tune_trial_whose_runs_stopped_past_their_budget_completes_on_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import optuna

    space = space_in(tmp_path, monkeypatch, "learning_rate: [1.0e-3]\n")
    plan = tune.plan_tune(
        "ppo", "CartPole-v1", 1, 1000, 1, str(space), ["eval_episodes=2", "eval_interval=0"], "stuck", startup_trials=0
    )
    # The driver was killed after its trial's run had stopped in its last iteration, before it told the study.
    run_dir = plan.cells([])[0].run_dir(tune.trial_dir(tmp_path / "runs" / "tune" / "stuck", 0))
    with monkeypatch.context() as patch:
        patch.setattr(tune, "settle", lambda *args: ("interrupted", None))
        tune.run_study(plan, 1, "local", None)
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(
        json.dumps({**summary, "status": "interrupted", "final_eval_return_mean": None})
    )
    tune_dir, counts = tune.run_study(plan, 1, "local", None)
    assert counts == {"completed": 1}
    study = optuna.load_study(study_name="stuck", storage=tune.storage_for(None, tune_dir))
    assert [t.state.name for t in study.trials] == ["COMPLETE"]
    assert study.trials[0].value == json.loads((run_dir / "summary.json").read_text())["final_eval_return_mean"]


# ── 2 and 3. stacks: any mix of finished, partial and unstarted seeds ───────────────────────────────


def stack_argv(parent: Path, algo: str, total: int, *extra: str) -> list[str]:
    return [
        "train",
        "--algo",
        algo,
        "--env",
        "CartPole-v1",
        "--seeds",
        "0,1,2",
        "--total-steps",
        str(total),
        "--set",
        "eval_episodes=2",
        "--set",
        "eval_interval=0",
        "--run-dir",
        str(parent),
        *extra,
    ]


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_a_stack_resumes_any_mix_of_finished_partial_and_unstarted_seeds(tmp_path: Path, algo: str) -> None:
    total = 1000 if algo == "ppo" else 1500
    whole, mixed = tmp_path / "whole", tmp_path / "mixed"
    assert main(stack_argv(whole, algo, total)) == 0
    shutil.copytree(whole, mixed)
    # seed 0 finished alone; seed 1 was killed during its final evaluation, at its budget, before its summary;
    # seed 2 was killed after it had started, before its first checkpoint.
    (mixed / "seed1" / "summary.json").unlink()
    for name in ("summary.json", rundir.CHECKPOINT):
        (mixed / "seed2" / name).unlink()
    finished = (mixed / "seed0" / "summary.json").read_bytes()
    assert main(stack_argv(mixed, algo, total, "--resume")) == 0
    assert (mixed / "seed0" / "summary.json").read_bytes() == finished  # nothing to do
    for seed in (0, 1, 2):
        assert status_of(mixed / f"seed{seed}") == "completed"
        assert rows_but_times(mixed / f"seed{seed}") == rows_but_times(whole / f"seed{seed}")
        assert same_model(mixed / f"seed{seed}", whole / f"seed{seed}")


def test_a_resumed_stack_whose_seeds_never_started_says_to_start_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fails_cleanly(
        stack_argv(tmp_path / "none", "ppo", 1000, "--resume"), capsys, "drop --resume to start a new run there"
    )
    assert not (tmp_path / "none").exists()


# ── 4. a finished run is reused only for the settings it was trained with ────────────────────────────


def test_a_bench_refuses_finished_runs_trained_with_other_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grid = bench.Grid("changed", ["ppo"], ["CartPole-v1"], [0], 512, overrides={"ppo": ["eval_episodes=2"]})
    run_dir = grid.cells()[0].run_dir(tmp_path / "changed")
    assert (
        main(
            [
                "train",
                *SMALL,
                "--seed",
                "0",
                "--total-steps",
                "512",
                "--set",
                "learning_rate=0.01",
                "--run-dir",
                str(run_dir),
            ]
        )
        == 0
    )
    with pytest.raises(BadInput, match=r"other settings .*seed0 \(learning_rate\)"):
        bench.run_grid(grid, workers=1, backend="local", ray_address=None, root=tmp_path)
    assert status_of(run_dir) == "completed"


def test_a_study_whose_journal_was_deleted_trains_its_trials_afresh_where_their_folders_differ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import optuna

    space = space_in(tmp_path, monkeypatch, "learning_rate: [2.0e-3, 3.0e-3, 4.0e-3, 5.0e-3, 6.0e-3, 7.0e-3]\n")

    def study(sampler_seed: int) -> Any:
        plan = tune.plan_tune(
            "ppo",
            "CartPole-v1",
            1,
            512,
            1,
            str(space),
            ["eval_episodes=2"],
            "deleted",
            startup_trials=0,
            sampler_seed=sampler_seed,
        )
        tune_dir, _ = tune.run_study(plan, 1, "local", None)
        return optuna.load_study(study_name="deleted", storage=tune.storage_for(None, tune_dir)), tune_dir

    first, tune_dir = study(0)
    first_value = first.trials[0].params["learning_rate"]
    (tune_dir / tune.STUDY_FILE).unlink()
    second, _ = study(3)
    assert second.trials[0].params["learning_rate"] != first_value  # another sampler drew another value
    run_dir = tune.trial_dir(tune_dir, 0) / "CartPole-v1" / "ppo" / "seed100"
    assert rundir.read_config(run_dir)["learning_rate"] == second.trials[0].params["learning_rate"]
    assert second.trials[0].value == json.loads((run_dir / "summary.json").read_text())["final_eval_return_mean"]
    aside = tune_dir / ".trial0000.stale1" / "CartPole-v1" / "ppo" / "seed100"
    assert rundir.read_config(aside)["learning_rate"] == first_value


# ── 5. a damaged journal ────────────────────────────────────────────────────────────────────────────


@pytest.fixture
def full_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[tune.TunePlan, Path]:
    """A study of one completed trial, made without training: its journal and tune.yaml. The trial records its
    cost, as a finished trial does; its runs are not here."""
    import optuna

    space = space_in(tmp_path, monkeypatch, "learning_rate: [1.0e-3, 2.0e-3]\n")
    plan = tune.plan_tune("ppo", "CartPole-v1", 1, 512, 1, str(space), [], "journal", startup_trials=0)
    tune_dir = tmp_path / "runs" / "tune" / "journal"
    tune.write_tune_yaml(tune_dir, plan)
    study = optuna.create_study(study_name="journal", storage=tune.storage_for(None, tune_dir), direction="maximize")
    # A sampled trial: a rerun queues the env's preset, which it has not tried, and so writes to the journal.
    study.add_trial(
        optuna.trial.create_trial(
            params={"learning_rate": 2e-3},
            value=100.0,
            user_attrs={"overrides": ["learning_rate=0.002"], trials.COST: [512, 512, 1.0]},
            distributions={"learning_rate": optuna.distributions.CategoricalDistribution([1e-3, 2e-3])},
        )
    )
    return plan, tune_dir


def test_a_journal_cut_mid_record_is_recovered_in_one_line(
    full_study: tuple[tune.TunePlan, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    import optuna

    plan, tune_dir = full_study
    journal = tune_dir / tune.STUDY_FILE
    whole = journal.read_bytes()
    journal.write_bytes(whole + b'{"op_code":5,"worker_id":"a-b","trial_id":0,"para')  # a driver killed mid-write
    tune.run_study(plan, 1, "local", None)  # full: trains nothing, but queues the presets it has not tried
    out = capsys.readouterr().out
    assert f"{tune.STUDY_FILE}: dropped its last record" in out and out.count("\n") <= 3
    assert journal.read_bytes().startswith(whole) and journal.read_bytes().endswith(b"\n")
    for line in journal.read_bytes().splitlines():
        json.loads(line)
    assert len(optuna.load_study(study_name="journal", storage=tune.storage_for(None, tune_dir)).trials) >= 1


def test_a_journal_with_garbage_is_refused_in_one_line_by_tune_and_report(
    full_study: tuple[tune.TunePlan, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    plan, tune_dir = full_study
    journal = tune_dir / tune.STUDY_FILE
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join([lines[0], b"\x00\xff\xfe garbage\n", *lines[1:]]))
    damaged = journal.read_bytes()
    with pytest.raises(tune.BadInput, match="damaged at line 2"):
        tune.run_study(plan, 1, "local", None)
    fails_cleanly(["report", str(tune_dir)], capsys, "damaged at line 2", str(journal))
    assert journal.read_bytes() == damaged


# ── 6 and 8. input of any size or shape: one line, before anything is written ──────────────────────


BOMB = "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}' if i else 'x'] * 9)}]\n" for i in range(6))


def test_a_yaml_alias_bomb_in_a_preset_is_refused_quickly_and_briefly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    preset = tmp_path / "bomb.yaml"
    preset.write_text(BOMB + "envs:\n  CartPole-v1:\n    env_kwargs: {sutton_barto_reward: *l5}\n")
    start = time.monotonic()
    err = fails_cleanly(train_argv(tmp_path / "run", 512, "--preset", str(preset)), capsys, "alias")
    assert time.monotonic() - start < 10 and len(err) < 1000
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "extra,fragment",
    [
        (["--env-kwargs", "sutton_barto_reward:" + "[" * 5000], "nests"),
        (["--set", "n_envs=100000000"], "size_limits=false"),
        (["--set", "eval_episodes=100000000"], "size_limits=false"),
        (["--set", "hidden_sizes=[100000000]"], "size_limits=false"),
        (["--set", "learning_rate=inf"], "finite"),
        (["--set", "learning_rate=nan"], "finite"),
        (["--set", "checkpoint_interval=1e39"], "64-bit"),
        (["--total-steps", "1" + "0" * 39], "64-bit"),
        (["--seeds", "100000"], "--seeds takes a count from 1 to"),
    ],
)
def test_values_out_of_range_or_size_are_refused_before_the_run_directory_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], fragment: str
) -> None:
    start = time.monotonic()
    err = fails_cleanly(train_argv(tmp_path / "run", 2048, *extra), capsys, fragment)
    assert time.monotonic() - start < 10 and len(err) < 1000
    assert not (tmp_path / "run").exists()


def test_the_size_limits_can_be_lifted(tmp_path: Path) -> None:
    assert (
        main(
            train_argv(
                tmp_path / "run",
                2048,
                "--set",
                "eval_episodes=1001",
                "--set",
                "size_limits=false",
                "--set",
                "eval_interval=0",
            )
        )
        == 0
    )
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["final_eval_episodes"] == 1001


@pytest.mark.parametrize("run_dir", ["", "two\nlines", "tab\there"])
def test_an_unusable_run_dir_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], run_dir: str) -> None:
    fails_cleanly(["train", *SMALL, "--run-dir", run_dir], capsys, "--run-dir")
    assert not list(tmp_path.iterdir())


def test_a_refused_stack_leaves_no_folder_or_lock_behind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parent = tmp_path / "stack"
    (parent / "seed3").mkdir(parents=True)
    runlog.save_checkpoint(parent / "seed3", {"algo": "ppo"})
    fails_cleanly(["train", *SMALL, "--seeds", "5,3", "--run-dir", str(parent)], capsys, "seed3", "--resume")
    assert sorted(p.name for p in parent.iterdir()) == ["seed3"]
    assert sorted(p.name for p in (parent / "seed3").iterdir()) == [rundir.CHECKPOINT]


def test_binary_and_damaged_files_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    space = tmp_path / "space.bin"
    space.write_bytes(bytes(range(256)) * 4)
    fails_cleanly(["tune", "--algo", "ppo", "--env", "CartPole-v1", "--space", str(space)], capsys, "UTF-8")
    fails_cleanly(
        ["tune", "--algo", "ppo", "--env", "CartPole-v1", "--storage", "nosuchdb://x", "--name", "bad"],
        capsys,
        "cannot open the study storage",
    )
    assert not (tmp_path / "runs").exists()  # no folder, no lock


# ── 7. a full disk during a stack's checkpoint ───────────────────────────────────────────────────────


def test_a_full_disk_during_a_stack_checkpoint_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The disk fills at the first checkpoint: torch's own writer reports that as a RuntimeError, and Python's
    file writes as ENOSPC, as on a real full filesystem."""
    save, real_open = torch.save, open

    class FullFile(io.FileIO):
        def write(self, data: Any) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def full_disk_open(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        return (
            FullFile(path, "w") if str(path).endswith(".checkpoint.pt.tmp") else real_open(path, mode, *args, **kwargs)
        )

    def torch_writer(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(f, FullFile):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
        save(obj, f, *args, **kwargs)

    monkeypatch.setattr(runlog, "open", full_disk_open, raising=False)
    monkeypatch.setattr(torch, "save", torch_writer)
    err = fails_cleanly(
        [
            "train",
            *SMALL,
            "--seeds",
            "0,1",
            "--total-steps",
            "512",
            "--run-dir",
            str(tmp_path / "s"),
            "--set",
            "checkpoint_interval=256",
        ],
        capsys,
        "No space left on device",
    )
    assert err.count("\n") == 1
    assert not list(tmp_path.rglob("*.tmp"))


# ── 8 and 10. results read back: damaged and cut-short progress files ────────────────────────────────


@pytest.mark.parametrize("damage", ["bytes", "cut"])
def test_plot_and_report_warn_about_a_damaged_progress_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    grid = bench.Grid("damaged", ["ppo"], ["CartPole-v1"], [0], 512, overrides={"ppo": ["eval_episodes=2"]})
    run_dir = grid.cells()[0].run_dir(tmp_path / "damaged")
    assert main(["train", *SMALL, "--seed", "0", "--total-steps", "512", "--run-dir", str(run_dir)]) == 0
    progress = run_dir / "progress.csv"
    data = progress.read_bytes()
    progress.write_bytes(data[:-40] + b"\xff\xfe\n" if damage == "bytes" else data[: len(data) * 2 // 3])
    capsys.readouterr()
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "curves.png")]) == 0
    err = capsys.readouterr().err
    assert f"warning: {progress}" in err and ("UTF-8" in err if damage == "bytes" else "cut short" in err)
    assert main(["report", str(tmp_path / "damaged")]) == 0
    assert f"warning: {progress}" in capsys.readouterr().err


# ── 10. a bench killed mid-stack ─────────────────────────────────────────────────────────────────────


def test_the_log_of_a_stack_whose_driver_was_killed_reaches_its_seeds_logs(tmp_path: Path) -> None:
    stack = [cells.Cell("ppo", "CartPole-v1", seed, 512, ()) for seed in (0, 1)]
    folder = stack[0].run_dir(tmp_path).parent
    for cell in stack:  # both finished; their shared log was never handed out
        cell.run_dir(tmp_path).mkdir(parents=True)
        (cell.run_dir(tmp_path) / "summary.json").write_text(json.dumps({"status": "completed"}))
    (folder / "seed0.log").write_text("an earlier attempt\n")
    (folder / ".stack-4194304-seed0.log").write_text("# seed0.log seed1.log\n$ -m lab train …\ntrained\n")
    outcomes = cells.run_cells(stack, tmp_path)
    assert [o.status for o in outcomes] == ["completed", "completed"]
    assert (folder / "seed0.log").read_text() == "an earlier attempt\n$ -m lab train …\ntrained\n"
    assert (folder / "seed1.log").read_text() == "$ -m lab train …\ntrained\n"
    assert not list(folder.glob(".stack-*"))


# ── 9. a study's space or --set may not set what the study sets ──────────────────────────────────────


@pytest.mark.parametrize(
    "space,extra,fragment",
    [
        ("seed: [1, 2]\n", [], "tunes seed"),
        ("total_steps: [1000, 2000]\n", [], "tunes total_steps"),
        ("learning_rate: [1.0e-3]\n", ["--set", "seed=2"], "--set fixes seed"),
    ],
)
def test_a_study_refuses_to_tune_or_fix_what_it_sets_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], space: str, extra: list[str], fragment: str
) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(space)
    fails_cleanly(["tune", "--algo", "ppo", "--env", "CartPole-v1", "--space", str(path), *extra], capsys, fragment)
    assert not (tmp_path / "runs").exists()


def test_a_bench_refuses_a_set_seed(capsys: pytest.CaptureFixture[str]) -> None:
    fails_cleanly(["bench", "--envs", "CartPole-v1", "--algos", "ppo", "--set", "seed=4"], capsys, "--first-seed")
