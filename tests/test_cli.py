"""The ``testbed`` command: a real run's directory, evaluation, signals and every bad input."""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from agents import rundir
from lab.cli import main
from lab.parser import build_parser
from tests.conftest import REPO, wait_for


def run_testbed(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "lab", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("cli") / "run"
    done = run_testbed(
        "train",
        "--algo",
        "ppo",
        "--env",
        "CartPole-v1",
        "--total-steps",
        "2048",
        "--seed",
        "3",
        "--set",
        "eval_interval=1024",
        "--set",
        "eval_episodes=3",
        "--run-dir",
        str(run_dir),
    )
    assert done.returncode == 0, done.stderr
    assert "tensorboard --logdir" in done.stdout
    return run_dir


def test_train_writes_the_whole_run_directory(cartpole_run: Path) -> None:
    names = {p.name for p in cartpole_run.iterdir()}
    assert {"config.yaml", "meta.json", "progress.csv", "checkpoint.pt", "summary.json"} <= names
    assert any(n.startswith("events.out.tfevents") for n in names)
    config = yaml.safe_load((cartpole_run / "config.yaml").read_text())
    assert config["algo"] == "ppo" and config["seed"] == 3 and config["n_envs"] == 8 and config["eval_episodes"] == 3
    meta = json.loads((cartpole_run / "meta.json").read_text())
    assert meta["preset"] == "CartPole-v1" and meta["packages"]["torch"] and "train" in meta["command"]
    assert meta["command"][0] == "testbed" and meta["code_version"] == rundir.CODE_VERSION  # no machine's folders
    assert meta["cpu"] == rundir.cpu_model() and meta["cpu"]  # the machine's CPU model: numbers repeat on the same one
    summary = json.loads((cartpole_run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["total_steps"] == 2048
    for key in ("algo", "env_id", "seed", "wall_time_s", "sps", "final_eval_return_mean", "final_eval_return_std"):
        assert summary[key] is not None, key
    assert summary["final_eval_episodes"] == 3
    with open(cartpole_run / "progress.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames[:2] == ["global_step", "wall_time_s"]
    assert [int(r["global_step"]) for r in rows] == list(range(256, 2049, 256))
    assert rows[3]["eval/return_mean"] != "" and rows[0]["eval/return_mean"] == ""


def test_tensorboard_has_cleanrl_tags_on_env_steps(cartpole_run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(cartpole_run))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    expected = {
        "charts/episodic_return",
        "charts/episodic_length",
        "charts/SPS",
        "charts/learning_rate",
        "losses/policy_loss",
        "losses/value_loss",
        "losses/entropy",
        "losses/approx_kl",
        "losses/clipfrac",
        "losses/explained_variance",
        "eval/return_mean",
        "eval/return_std",
    }
    assert expected <= tags
    assert [e.step for e in events.Scalars("losses/value_loss")] == list(range(256, 2049, 256))


def test_eval_command(cartpole_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", str(cartpole_run), "--episodes", "3"]) == 0
    assert "deterministic, 3 episodes" in capsys.readouterr().out
    assert main(["eval", str(cartpole_run), "--episodes", "2", "--stochastic", "--video", str(tmp_path / "v")]) == 0
    assert "stochastic" in capsys.readouterr().out
    gifs = list((tmp_path / "v").glob("*.gif"))
    assert len(gifs) == 1 and gifs[0].stat().st_size > 1000


def test_eval_scores_a_policy_under_other_env_kwargs_without_changing_the_run(
    cartpole_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = (cartpole_run / "config.yaml").read_text()
    # Sutton and Barto's reward: 0 a step and -1 when the pole falls. After 2,048 steps of training every
    # episode falls before 500 steps, so each scores exactly -1.
    assert main(["eval", str(cartpole_run), "--episodes", "3", "--env-kwargs", "sutton_barto_reward:true"]) == 0
    assert "return -1.00 ± 0.00" in capsys.readouterr().out
    assert (cartpole_run / "config.yaml").read_text() == config
    assert main(["eval", str(cartpole_run), "--env-kwargs", "no_such_kwarg:1"]) == 2
    assert "does not accept env_kwargs" in capsys.readouterr().err
    assert main(["eval", str(cartpole_run), "--env-kwargs", "sutton_barto_reward"]) == 2
    assert "give KEY:VALUE pairs" in capsys.readouterr().err


def test_evaluation_kwargs_that_change_the_spaces_are_refused() -> None:
    from agents.ppo import PPOConfig
    from agents.run_envs import check_env
    from envs.errors import BadInput

    cfg = PPOConfig(env_id="LunarLander-v3", eval_env_kwargs={"continuous": True})
    with pytest.raises(BadInput, match=r"LunarLander-v3's action space from Discrete\(4\) to Box of shape \(2,\)"):
        check_env(cfg)


def test_sigterm_checkpoints_and_marks_the_run_interrupted(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lab",
            "train",
            "--algo",
            "ppo",
            "--env",
            "CartPole-v1",
            "--total-steps",
            "10000000",
            "--set",
            "checkpoint_interval=0",
            "--run-dir",
            str(run_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    wait_for((run_dir / "progress.csv").exists, timeout_s=60, poll_s=0.2)
    time.sleep(1.0)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode == 130
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and 0 < summary["total_steps"] < 10_000_000
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert checkpoint["global_step"] == summary["total_steps"]
    with open(run_dir / "progress.csv", newline="") as f:
        assert int(list(csv.DictReader(f))[-1]["global_step"]) == summary["total_steps"]


def test_resume_continues_to_a_longer_budget(cartpole_run: Path, tmp_path: Path) -> None:
    import shutil

    run_dir = tmp_path / "copy"
    shutil.copytree(cartpole_run, run_dir)
    argv = ["train", "--algo", "ppo", "--env", "CartPole-v1", "--run-dir", str(run_dir), "--resume"]
    assert main([*argv, "--total-steps", "2560"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["total_steps"] == 2560


# ── bad input: exit code 2, a message that says how to fix it, nothing written ──────────────────────


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--algo", "ppo", "--env", "CartPol-v1"], "Closest registered ids: CartPole-v1"),
        (["--algo", "pp0", "--env", "CartPole-v1"], "choose one of ppo"),
        (["--algo", "ppo", "--env", "CartPole-v1", "--set", "learning_rat=1"], "did you mean 'learning_rate'"),
        (["--algo", "ppo", "--env", "CartPole-v1", "--set", "gamma=1.5"], "gamma must be in [0, 1]"),
        (["--algo", "ppo", "--env", "CartPole-v1", "--set", "n_steps=abc"], "n_steps='abc' is not a valid int"),
        (["--algo", "ppo", "--env", "CartPole-v1", "--set", "activation=gelu"], "one of tanh, relu"),
        (["--algo", "ppo", "--env", "CartPole-v1", "--set", "novalue"], "key=value"),
        (["--algo", "ppo", "--env", "CartPole-v1", "--total-steps", "0"], "total_steps must be positive"),
        (["--algo", "ppo", "--env", "CartPole-v1", "--set", "minibatch_size=512"], "minibatch_size must be in"),
        (["--algo", "ppo", "--env", "CartPole-v1", "--resume"], "--resume needs --run-dir"),
    ],
)
def test_bad_input_is_refused_before_any_work(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_cuda_requested_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["train", "--algo", "ppo", "--env", "CartPole-v1", "--device", "cuda"]) == 2
    assert "--device cpu" in capsys.readouterr().err


def test_existing_run_dir_is_never_overwritten(cartpole_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = (cartpole_run / "summary.json").read_text()
    assert main(["train", "--algo", "ppo", "--env", "CartPole-v1", "--run-dir", str(cartpole_run)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert (cartpole_run / "summary.json").read_text() == before


def test_resume_refuses_changed_settings_and_missing_checkpoints(
    cartpole_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["train", "--algo", "ppo", "--env", "CartPole-v1", "--resume"]
    assert main([*argv, "--run-dir", str(cartpole_run), "--set", "gamma=0.5"]) == 2
    assert "only --total-steps may change" in capsys.readouterr().err
    assert main([*argv, "--run-dir", str(cartpole_run), "--seed", "4"]) == 2
    assert "seed" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([*argv, "--run-dir", str(tmp_path / "empty")]) == 2
    assert "no config.yaml" in capsys.readouterr().err


def test_resume_accepts_the_same_settings_written_another_way(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A bench resumes a cell with the --set values it started with; config.yaml holds them typed.
    run_dir = tmp_path / "chain"
    argv = [
        "train",
        "--algo",
        "grpo-step",
        "--env",
        "testbed/Chain-v0",
        "--run-dir",
        str(run_dir),
        "--set",
        "env_kwargs=horizon:5",
        "--set",
        "learning_rate=1e-3",
        "--set",
        "eval_episodes=2",
    ]
    assert main([*argv, "--total-steps", "1000"]) == 0
    assert main([*argv, "--total-steps", "2000", "--resume"]) == 0
    assert json.loads((run_dir / "summary.json").read_text())["total_steps"] >= 2000
    changed = [a.replace("horizon:5", "horizon:6") for a in argv]
    assert main([*changed, "--total-steps", "3000", "--resume"]) == 2
    assert "not env_kwargs" in capsys.readouterr().err


def test_corrupted_checkpoint_is_refused(
    cartpole_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    run_dir = tmp_path / "broken"
    shutil.copytree(cartpole_run, run_dir)
    data = (run_dir / "checkpoint.pt").read_bytes()
    (run_dir / "checkpoint.pt").write_bytes(data[: len(data) // 2])
    assert main(["train", "--algo", "ppo", "--env", "CartPole-v1", "--run-dir", str(run_dir), "--resume"]) == 2
    assert "corrupted" in capsys.readouterr().err
    assert main(["eval", str(run_dir)]) == 2
    assert "corrupted" in capsys.readouterr().err


def test_missing_extra_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import gymnasium as gym

    import envs.factory

    def missing(*args: object, **kwargs: object) -> None:
        raise gym.error.DependencyNotInstalled("Box2D is not installed")

    monkeypatch.setattr(envs.factory.gym, "make", missing)
    assert main(["train", "--algo", "ppo", "--env", "LunarLander-v3"]) == 2
    assert "pip install 'gymnasium[box2d]'" in capsys.readouterr().err


def test_help_lists_every_option_with_its_default() -> None:
    done = run_testbed("train", "--help")
    for option in ("--algo", "--env", "--seed", "--total-steps", "--set", "--run-dir", "--resume", "--device"):
        assert option in done.stdout
    assert "--episodes" in run_testbed("eval", "--help").stdout
    # Each option of each command, in its own help entry: the value argparse fills in, or a default said in words.
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    silent = []
    for command, parser in commands.items():
        for action in parser._actions:
            if not action.option_strings or action.required or isinstance(action, argparse._HelpAction):
                continue
            formatter = parser._get_formatter()
            formatter.add_argument(action)
            entry = " ".join(formatter.format_help().split())
            if f"(default: {action.default})" not in entry and "default" not in (action.help or "").lower():
                silent.append(f"{command} {action.option_strings[-1]}")
    assert not silent, f"options whose --help does not give their default: {silent}"


STARTUP_PROBE = """
import sys
from lab.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(sorted(m for m in ("torch", "scipy", "matplotlib", "optuna") if m in sys.modules))
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["train", "--help"],
        ["bench", "--help"],
        ["train", "--algo", "ppo2", "--env", "CartPole-v1"],
        ["train", "--algo", "ppo", "--env", "CartPol-v1"],
        ["bench", "--algos", "ppo2", "--envs", "CartPole-v1"],
        ["tune", "--algo", "ppo2", "--env", "CartPole-v1"],
    ],
)
def test_help_and_misspelled_names_are_answered_without_importing_torch(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", STARTUP_PROBE, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stderr
