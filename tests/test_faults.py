"""Run directories under faults: kills, stop signals, second writers, bad input and bad files.

Each test is a fault that a user met or a hostile probe found: what must hold is that the run loses
nothing it wrote, the directory can always be continued or started again, and bad input or a bad file
gets one clear line and exit status 2 before any work, never a traceback.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from agents import rundir, runlog, tracking
from lab.cli import main
from tests.conftest import REPO, alive, hold_lock, progress_values, read_progress, wait_for

# CartPole's preset: 8 envs × 32 steps = 256 env steps an iteration.
SMALL = ["--algo", "ppo", "--env", "CartPole-v1", "--set", "eval_episodes=2"]


def train_argv(run_dir: Path, total_steps: int = 2048, *extra: str) -> list[str]:
    return ["train", *SMALL, "--total-steps", str(total_steps), "--run-dir", str(run_dir), *extra]


def start_trainer(run_dir: Path, total_steps: int, *extra: str) -> subprocess.Popen[bytes]:
    """``testbed train`` in its own process, as a user or a bench starts it."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "lab", *train_argv(run_dir, total_steps, *extra)]
    # A shell starts a background job with SIGINT ignored, and an ignored signal stays ignored across exec
    # (a handler does not): so that the trainer meets Ctrl-C as a user's would, this process handles it
    # while it starts the trainer, wherever the tests run.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    finally:
        signal.signal(signal.SIGINT, previous)


def ended_or_checkpointed(process: subprocess.Popen[bytes], checkpoint: Path, mtime_ns: int) -> bool:
    """The process has ended, or has written a checkpoint since the one of modification time ``mtime_ns``."""
    return process.poll() is not None or (checkpoint.exists() and checkpoint.stat().st_mtime_ns != mtime_ns)


def scalar_steps(run_dir: Path, tag: str) -> list[int]:
    """The steps at which ``tag`` was logged, each as often as it was, in step order. Sorted because the
    loader reads a resumed run's event files in name order, and two sessions started in the same second by
    one test process differ only in a per-process counter, which sorts as text (".10" before ".9")."""
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return sorted(e.step for e in events.Scalars(tag))


def fails_cleanly(argv: list[str], capsys: pytest.CaptureFixture[str], *fragments: str) -> str:
    """``testbed`` exits 2 with one error paragraph naming ``fragments``, and prints no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith(f"testbed {argv[0]}: error: ")
    for fragment in fragments:
        assert fragment in err, err
    return err


# ── kills and resumes ───────────────────────────────────────────────────────────────────────────────


@pytest.mark.slow
def test_sigkills_and_resumes_of_a_stack_end_bit_identical_with_every_row_once(tmp_path: Path) -> None:
    total, settings = 24_576, ["--seeds", "0,1", "--set=checkpoint_interval=512", "--set=eval_interval=8192"]
    straight = tmp_path / "straight"
    assert start_trainer(straight, total, *settings).wait(120) == 0

    run_dir, rng, kills = tmp_path / "killed", random.Random(0), 0
    checkpoint = run_dir / "seed1" / rundir.CHECKPOINT  # the stack's last seed: written after seed 0's
    while kills < 8:
        resume = ["--resume"] if checkpoint.exists() else []
        last = checkpoint.stat().st_mtime_ns if checkpoint.exists() else 0
        process = start_trainer(run_dir, total, *settings, *resume)
        # Past its first new checkpoint (so that every session moves the run on), it dies at a random moment.
        wait_for(partial(ended_or_checkpointed, process, checkpoint, last), timeout_s=60, poll_s=0.005)
        try:
            process.wait(timeout=rng.uniform(0.0, 0.6))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            kills += 1
        else:
            raise AssertionError(f"the run ended after {kills} kills: give it more steps")
    assert start_trainer(run_dir, total, *settings, "--resume").wait(120) == 0

    every_iteration = list(range(256, total + 1, 256))
    columns = ["global_step", "losses/policy_loss", "losses/value_loss", "losses/approx_kl", "eval/return_mean"]
    for seed in ("seed0", "seed1"):
        a = runlog.load_checkpoint(straight / seed, {"algo": "ppo"})
        b = runlog.load_checkpoint(run_dir / seed, {"algo": "ppo"})
        assert a["global_step"] == b["global_step"] == total
        for name, tensor in a["model"].items():
            assert torch.equal(tensor, b["model"][name]), name
        assert progress_values(run_dir / seed, columns) == progress_values(straight / seed, columns)
        assert [int(r["global_step"]) for r in read_progress(run_dir / seed)] == every_iteration
        for tag in ("losses/policy_loss", "charts/learning_rate"):
            assert scalar_steps(run_dir / seed, tag) == every_iteration, tag
        assert scalar_steps(run_dir / seed, "eval/return_mean") == [8192, 16384, 24576]  # the final one once


def test_a_kill_between_the_last_checkpoint_and_the_summary_logs_the_final_evaluation_once(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert main(train_argv(run_dir, 2048, "--set", "eval_interval=1024", "--set", "checkpoint_interval=0")) == 0
    (run_dir / "summary.json").unlink()  # as if killed after the final checkpoint, before the summary
    assert (
        main(train_argv(run_dir, 2048, "--set", "eval_interval=1024", "--set", "checkpoint_interval=0", "--resume"))
        == 0
    )
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert scalar_steps(run_dir, "eval/return_mean") == [1024, 2048]


def test_a_checkpoint_holds_every_row_before_it_and_a_resume_keeps_its_own_step(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert main(train_argv(run_dir, 1024, "--set", "checkpoint_interval=512", "--set", "eval_interval=0")) == 0
    ckpt = runlog.load_checkpoint(run_dir, {"algo": "ppo"})
    assert ckpt["csv_bytes"] == (run_dir / "progress.csv").stat().st_size  # flushed before the last checkpoint
    # Longer budget, resumed at 1024: TensorBoard keeps the point at 1024, which was logged before.
    assert (
        main(train_argv(run_dir, 1536, "--resume", "--set", "checkpoint_interval=512", "--set", "eval_interval=0")) == 0
    )
    assert scalar_steps(run_dir, "losses/policy_loss") == list(range(256, 1537, 256))
    assert [int(r["global_step"]) for r in read_progress(run_dir)] == list(range(256, 1537, 256))


def test_rows_written_after_the_checkpoint_are_dropped_on_resume(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert main(train_argv(run_dir, 1024, "--set", "checkpoint_interval=512", "--set", "eval_interval=0")) == 0
    ckpt = runlog.load_checkpoint(run_dir, {"algo": "ppo"})
    # As if killed mid-row after the checkpoint: a partial line past the checkpoint's size.
    with open(run_dir / "progress.csv", "a") as f:
        f.write("1280,0.5,12")
    log = runlog.MetricLog(run_dir, ["losses/policy_loss"], resume_step=1024, csv_bytes=ckpt["csv_bytes"])
    log.close()
    assert [int(r["global_step"]) for r in read_progress(run_dir)] == [256, 512, 768, 1024]


# ── trainers stop when the driver that started them dies ────────────────────────────────────────────

STARTS_A_TRAINER = """import os, subprocess, sys, time
log = open(sys.argv[2], 'w')
trainer = subprocess.Popen(sys.argv[3:], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                           env={**os.environ, sys.argv[1]: str(os.getpid())})
print(trainer.pid, flush=True)
time.sleep(600)
"""
"""A driver as ``lab.cells`` is one: it starts a trainer in its own session, naming itself its parent."""


def test_a_trainer_checkpoints_within_half_a_second_of_its_drivers_sigkill(tmp_path: Path) -> None:
    # The promise: it notices within 0.1 s (it looks at its parent every 0.1 s), ends its iteration, checkpoints.
    # Measured: from the driver's SIGKILL to the modification time of the trainer's checkpoint, its only one
    # (checkpoint_interval=0), with iterations of 16 env steps (a few ms) so that the iteration adds little.
    # 0.5 s leaves room for a loaded 2-core machine; 0.03-0.11 s was measured at a load of 4.
    run_dir, log = tmp_path / "run", tmp_path / "trainer.log"
    tiny = [
        f"--set={pair}"
        for pair in (
            "n_envs=1",
            "n_steps=16",
            "minibatch_size=16",
            "n_epochs=1",
            "checkpoint_interval=0",
            "eval_interval=0",
        )
    ]
    argv = [sys.executable, "-m", "lab", *train_argv(run_dir, 10_000_000, *tiny)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    driver = subprocess.Popen(
        [sys.executable, "-c", STARTS_A_TRAINER, rundir.PARENT_PID, str(log), *argv],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert driver.stdout is not None
    trainer = int(driver.stdout.readline())
    try:
        wait_for(lambda: "] step " in log.read_text() or not alive(trainer), timeout_s=60, poll_s=0.05)
        assert "] step " in log.read_text(), log.read_text()[-2000:]  # in its training loop
        assert not (run_dir / rundir.CHECKPOINT).exists()
        killed_at = time.time()
        driver.kill()
        driver.wait()
        wait_for(lambda: (run_dir / rundir.CHECKPOINT).exists(), timeout_s=10, poll_s=0.005)
        reaction_s = (run_dir / rundir.CHECKPOINT).stat().st_mtime - killed_at
        wait_for(lambda: not alive(trainer), timeout_s=10, poll_s=0.01)
        assert not alive(trainer), "the trainer kept running after its driver was killed"
    finally:  # nothing outlives the test, whatever failed
        driver.kill()
        driver.wait()
        if alive(trainer):
            os.kill(trainer, signal.SIGKILL)
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    assert reaction_s < 0.5, f"the trainer checkpointed {reaction_s:.3f} s after its driver's SIGKILL"


# ── directories that could be neither rerun nor resumed ─────────────────────────────────────────────


@pytest.mark.parametrize(
    "extra,fragments",
    [
        (["--seed", "-1"], ["seed must be in [0, 2**32 - 1], got -1"]),
        (["--seed", str(2**32)], ["seed must be in [0, 2**32 - 1]"]),
        (["--env-kwargs", "foo:1"], ["CartPole-v1 does not accept env_kwargs {'foo': 1}"]),
        (["--set", "env_id=NoSuch-v0"], ["--set env_id=NoSuch-v0 would replace the env given by --env"]),
        (["--set", "env_id=Pendulum-v1"], ["choose the env with --env"]),
        (["--env-kwargs", "sutton_barto_reward:[1"], ["not valid YAML"]),
    ],
)
def test_bad_input_is_refused_before_the_run_directory_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], fragments: list[str]
) -> None:
    fails_cleanly(train_argv(tmp_path / "run", 2048, *extra), capsys, *fragments)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("how", ["sigint", "sigkill"])
def test_a_run_stopped_before_its_first_checkpoint_starts_again_with_the_same_command(tmp_path: Path, how: str) -> None:
    run_dir = tmp_path / "run"
    process = start_trainer(run_dir, 4096)
    deadline = time.monotonic() + 30
    while not (run_dir / "config.yaml").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGINT if how == "sigint" else signal.SIGKILL)
    process.wait(30)
    assert not (run_dir / rundir.CHECKPOINT).exists()
    assert b"Traceback" not in (process.stderr.read() if process.stderr else b"")
    again = start_trainer(run_dir, 4096)
    assert again.wait(60) == 0, again.stderr.read().decode() if again.stderr else ""
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert [int(r["global_step"]) for r in read_progress(run_dir)] == list(range(256, 4097, 256))


# ── one writer per run directory ────────────────────────────────────────────────────────────────────


def test_a_second_writer_is_refused_with_the_holder_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    holder = hold_lock(run_dir)
    try:
        fails_cleanly(train_argv(run_dir), capsys, f"is being written by pid {holder.pid}")
        assert sorted(p.name for p in run_dir.iterdir()) == [rundir.LOCK]
    finally:
        holder.kill()
        holder.wait()
    assert main(train_argv(run_dir, 512, "--set", "eval_interval=0")) == 0  # the kernel released the lock


# ── bad files and bad disks: one line, exit 2, nothing lost ─────────────────────────────────────────


@pytest.fixture
def finished_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "done"
    assert main(train_argv(run_dir, 512, "--set", "eval_interval=0")) == 0
    return run_dir


@pytest.mark.parametrize(
    "content,fragment",
    [
        (b"algo: ppo\nenv_id: [CartPole-v1\n", "cannot be read"),
        (b"algo: ppo\nenv_id: CartPole-v1\n\xff\xfe seed: 0\n", "cannot be read"),
        (b"- just\n- a list\n", "is not a run's config"),
        (b"algo: ppo\nseed: 0\n", "has no env_id"),
    ],
)
def test_a_tampered_config_is_refused_by_eval_and_resume(
    finished_run: Path, capsys: pytest.CaptureFixture[str], content: bytes, fragment: str
) -> None:
    (finished_run / "config.yaml").write_bytes(content)
    fails_cleanly(["eval", str(finished_run)], capsys, fragment)
    if b"env_id: CartPole-v1" in content or (b"[" not in content and b"list" not in content):
        fails_cleanly(train_argv(finished_run, 1024, "--resume"), capsys)
    assert (finished_run / "config.yaml").read_bytes() == content


def test_a_network_edited_after_training_is_refused(finished_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = finished_run / "config.yaml"
    path.write_text(path.read_text().replace("- 64\n- 64\n", "- 32\n- 32\n"))
    edited = path.read_bytes()
    fails_cleanly(["eval", str(finished_run)], capsys, "Restore config.yaml's network settings")
    fails_cleanly(train_argv(finished_run, 1024, "--resume"), capsys, "hidden_sizes")
    assert path.read_bytes() == edited and read_progress(finished_run)[-1]["global_step"] == "512"


def test_a_corrupt_checkpoint_is_refused_without_touching_the_run(
    finished_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {p.name: p.read_bytes() for p in finished_run.iterdir() if p.is_file()}
    (finished_run / rundir.CHECKPOINT).write_bytes(b"not a checkpoint")
    before[rundir.CHECKPOINT] = b"not a checkpoint"
    fails_cleanly(train_argv(finished_run, 1024, "--resume"), capsys, "is corrupted or not a checkpoint")
    after = {p.name: p.read_bytes() for p in finished_run.iterdir() if p.is_file() and p.name != rundir.LOCK}
    assert after == {k: v for k, v in before.items() if k != rundir.LOCK}  # config.yaml not rewritten


def test_a_refused_checkpoint_does_not_repeat_torchs_advice_to_unpickle_it(tmp_path: Path) -> None:
    torch.save({"format": runlog.CHECKPOINT_FORMAT, "payload": Path("arbitrary object")}, tmp_path / rundir.CHECKPOINT)
    with pytest.raises(runlog.BadInput) as refused:
        runlog.load_checkpoint(tmp_path, {})
    assert "weights_only" not in str(refused.value) and "never unpickles" in str(refused.value)


def test_resume_refuses_a_budget_below_the_steps_already_trained(
    finished_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fails_cleanly(train_argv(finished_run, 256, "--resume"), capsys, "has already trained 512 steps")
    assert rundir.read_config(finished_run)["total_steps"] == 512


def test_a_full_disk_at_a_checkpoint_keeps_the_last_one_and_leaves_no_temporary_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    saves = {"n": 0}
    original = torch.save

    def full_disk_on_the_second(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        saves["n"] += 1
        if saves["n"] == 2:
            f.write(b"partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        original(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk_on_the_second)
    fails_cleanly(
        train_argv(run_dir, 1024, "--set", "checkpoint_interval=256", "--set", "eval_interval=0"),
        capsys,
        "No space left on device",
    )
    assert not [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")]
    assert runlog.load_checkpoint(run_dir, {"algo": "ppo"})["global_step"] == 256
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"
    monkeypatch.setattr(torch, "save", original)
    assert (
        main(train_argv(run_dir, 1024, "--resume", "--set", "checkpoint_interval=256", "--set", "eval_interval=0")) == 0
    )
    assert [int(r["global_step"]) for r in read_progress(run_dir)] == [256, 512, 768, 1024]


def test_a_read_only_disk_is_one_line_and_leaves_no_temporary_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_only(fd: int) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(runlog.os, "fsync", read_only)
    fails_cleanly(train_argv(tmp_path / "run"), capsys, "Read-only file system")
    assert not (tmp_path / "run").exists()  # its first file could not be written: nothing is left, not even a lock


def test_video_into_a_folder_that_cannot_be_made_is_refused_before_evaluating(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a_file").write_text("")
    fails_cleanly(["eval", str(finished_run), "--video", str(tmp_path / "a_file" / "videos")], capsys, "cannot create")


# ── the end of a run ────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("signals,status,code", [(1, "completed", 0), (2, "interrupted", 130)])
def test_a_stop_signal_during_the_final_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signals: int, status: str, code: int
) -> None:
    original = tracking.evaluate_policies

    def signalled(*args: Any, **kwargs: Any) -> Any:
        for _ in range(signals):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)  # the handler runs between bytecodes
        return original(*args, **kwargs)

    monkeypatch.setattr(tracking, "evaluate_policies", signalled)
    run_dir = tmp_path / "run"
    assert main(train_argv(run_dir, 512, "--set", "eval_interval=0")) == code
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == status and summary["total_steps"] == 512
    assert runlog.load_checkpoint(run_dir, {"algo": "ppo"})["global_step"] == 512


def eval_rows(run_dir: Path) -> list[tuple[int, float]]:
    """(global_step, eval/return_mean) of the progress.csv rows that hold an evaluation."""
    return [
        (int(r["global_step"]), float(r["eval/return_mean"])) for r in read_progress(run_dir) if r["eval/return_mean"]
    ]


@pytest.mark.parametrize("eval_interval", [0, 384])
def test_the_final_evaluation_is_the_last_row_of_progress_csv_once(tmp_path: Path, eval_interval: int) -> None:
    run_dir = tmp_path / "run"
    assert main(train_argv(run_dir, 1000, "--set", f"eval_interval={eval_interval}")) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = eval_rows(run_dir)
    assert rows[-1] == (1024, summary["final_eval_return_mean"])
    assert [step for step, _ in rows] == ([512, 768, 1024] if eval_interval else [1024])
    assert [int(r["global_step"]) for r in read_progress(run_dir)] == [256, 512, 768, 1024]
    assert scalar_steps(run_dir, "eval/return_mean") == [step for step, _ in rows]


def test_a_final_evaluation_cut_short_fills_the_last_row_once_the_run_is_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = tracking.evaluate_policies

    def stopped_twice(*args: Any, **kwargs: Any) -> Any:
        for _ in range(2):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)  # the handler runs between bytecodes
        return original(*args, **kwargs)

    run_dir = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(tracking, "evaluate_policies", stopped_twice)
        assert main(train_argv(run_dir, 512, "--set", "eval_interval=0")) == 130
    assert eval_rows(run_dir) == []
    assert main(train_argv(run_dir, 512, "--set", "eval_interval=0", "--resume")) == 0
    final = json.loads((run_dir / "summary.json").read_text())["final_eval_return_mean"]
    assert eval_rows(run_dir) == [(512, final)]
    assert [int(r["global_step"]) for r in read_progress(run_dir)] == [256, 512]
    assert scalar_steps(run_dir, "eval/return_mean") == [512]


def test_a_stop_signal_right_after_the_checkpoint_decision_still_checkpoints_where_the_run_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The signal lands just after the lifecycle decided not to checkpoint this iteration: the run must not
    # then stop there without one (summary.json ahead of checkpoint.pt). It checkpoints there before the next
    # iteration, and runs no more.
    original = tracking.RunTracker.checkpoint_due

    def signalled_after(self: tracking.RunTracker, step: int, stopping: bool) -> bool:
        due = original(self, step, stopping)
        if step == 512:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)  # the handler runs between bytecodes
        return due

    monkeypatch.setattr(tracking.RunTracker, "checkpoint_due", signalled_after)
    run_dir = tmp_path / "run"
    assert main(train_argv(run_dir, 4096, "--set", "checkpoint_interval=0", "--set", "eval_interval=0")) == 130
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["total_steps"] == 512
    assert runlog.load_checkpoint(run_dir, {"algo": "ppo"})["global_step"] == 512
    assert [int(r["global_step"]) for r in read_progress(run_dir)] == [256, 512]


def test_mujoco_warnings_are_not_repeated_for_every_env(tmp_path: Path) -> None:
    code = (
        "from envs import EnvOptions, make_vector\nfor _ in range(3): make_vector('HalfCheetah-v5', 4, "
        "EnvOptions(vectorization='sync')).close()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "settotalmass" not in done.stdout + done.stderr
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()
