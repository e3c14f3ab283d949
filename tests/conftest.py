"""Shared fixtures and helpers: every test runs in its own working directory, without a display.

Helpers used by more than one test module live here; import them with ``from tests.conftest import …``.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from agents import rundir
from agents.config import resolve_config
from agents.grpo import GRPOConfig
from agents.onpolicy import segment_steps
from agents.ppo import PPOConfig

REPO = Path(__file__).resolve().parents[1]  # the repository root


@pytest.fixture(autouse=True)
def _isolated_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run each test in its own tmp_path, with SDL's dummy video driver."""
    # MuJoCo appends to MUJOCO_LOG.TXT in the working directory, and default run dirs are relative.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")


# ── configs and runs ─────────────────────────────────────────────────────────────────────────────────


def ppo_config(env_id: str, continuous: bool = False, **overrides: Any) -> PPOConfig:
    """PPO's preset for ``env_id`` with ``overrides`` applied, as the CLI resolves it."""
    cfg, _ = resolve_config(PPOConfig, "ppo", env_id, continuous, overrides)
    return cfg


def grpo_config(env_id: str = "CartPole-v1", continuous: bool = False, **overrides: Any) -> GRPOConfig:
    """GRPO's preset for ``env_id`` with ``overrides`` applied, as the CLI resolves it."""
    cfg, _ = resolve_config(GRPOConfig, "grpo", env_id, continuous, overrides)
    return cfg


def run_training(algo: ModuleType, cfg: Any, run_dir: Path, resume: bool = False) -> dict[str, Any]:
    """Prepare ``run_dir`` as the CLI does (without config.yaml and meta.json), then ``algo.train`` into it."""
    rundir.prepare_run_dir(run_dir, resume)
    return algo.train(cfg, run_dir, resume=resume)


def collect_segment(env: Any, model: Any, state: Any, buffers: Any) -> Any:
    """One PPO segment of ``model`` alone: ``onpolicy.segment_steps`` driven by the model's own ``act``."""
    steps = segment_steps(env, state, buffers)
    with torch.inference_mode():
        obs = next(steps)
        for _ in range(buffers.obs.shape[0]):
            obs = steps.send(model.act(torch.from_numpy(obs)))
        last_values = model.value(torch.from_numpy(obs)).clone()
    try:
        steps.send(last_values)
    except StopIteration as done:
        return done.value
    raise AssertionError("segment_steps yielded past its segment")


def interrupt_after(monkeypatch: pytest.MonkeyPatch, target: object, name: str, calls: int) -> None:
    """Patch ``target.name`` to send this process SIGINT, as Ctrl-C would, at the start of its ``calls``-th call."""
    original = getattr(target, name)
    count = 0

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        """Count this call, interrupt on the chosen one, then run the original."""
        nonlocal count
        count += 1
        if count == calls:
            os.kill(os.getpid(), signal.SIGINT)
        return original(*args, **kwargs)

    monkeypatch.setattr(target, name, wrapper)


# ── other processes ─────────────────────────────────────────────────────────────────────────────────

HOLD_LOCK = """
import sys, time
from pathlib import Path
from agents import rundir

directory, seconds, then_write = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
lock = rundir.DirLock(directory).acquire()
print("held", flush=True)
time.sleep(seconds)
if then_write:  # as a trainer stopping leaves its run directory
    (directory / "summary.json").write_text(then_write)
"""


def hold_lock(directory: Path, seconds: float = 600.0, then_write: str = "") -> subprocess.Popen[str]:
    """Another process holding ``directory``'s lock for ``seconds`` (then writing ``then_write`` to its
    summary.json, if given); returns once the lock is held."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(directory), str(seconds), then_write],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


# ── reading what a run wrote ─────────────────────────────────────────────────────────────────────────


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file with a header, as dicts."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def read_progress(run_dir: Path) -> list[dict[str, str]]:
    """The rows of a run directory's progress.csv."""
    return read_csv(run_dir / "progress.csv")


# ── waiting ──────────────────────────────────────────────────────────────────────────────────────────


def wait_for(condition: Callable[[], bool], timeout_s: float = 2.0, poll_s: float = 0.001) -> None:
    """Poll ``condition`` every ``poll_s`` seconds until it holds or ``timeout_s`` seconds have passed."""
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(poll_s)


def stack_dirs(tmp: Path, seeds: list[int]) -> dict[int, Path]:
    """Run directories tmp/seed<k> for a stack of these seeds, prepared as the CLI prepares them."""
    run_dirs = {seed: tmp / f"seed{seed}" for seed in seeds}
    for run_dir in run_dirs.values():
        rundir.prepare_run_dir(run_dir, False)
    return run_dirs


def progress_values(run_dir: Path, tags: list[str]) -> list[list[str]]:
    """The logged values of ``tags`` in each row of a run's progress.csv."""
    return [[row[tag] for tag in tags] for row in read_progress(run_dir)]


def assert_close_progress(a: Path, b: Path, tags: list[str], rows: int, rtol: float, atol: float) -> None:
    """The first ``rows`` rows of two runs' ``tags`` agree to floating-point tolerance."""
    first, second = progress_values(a, tags)[:rows], progress_values(b, tags)[:rows]
    assert len(first) == rows
    assert torch.allclose(
        torch.tensor([[float(v) for v in r] for r in first]),
        torch.tensor([[float(v) for v in r] for r in second]),
        rtol=rtol,
        atol=atol,
    )


def alive(pid: int) -> bool:
    """Whether process ``pid`` is still running (an exited process that nobody reaped yet is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")
