"""Input faults, third round: no code runs from data, sizes are bounded at their documented edges, a boolean is
never a number, and a refused command leaves nothing behind and names what is wrong."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.config import build_config
from agents.grpo import GRPOConfig
from agents.ppo import PPOConfig
from envs.errors import BadInput
from lab.cli import main
from tests.conftest import REPO

TINY = ["--total-steps", "256", "--set", "n_steps=32", "--set", "eval_interval=0", "--set", "eval_episodes=1"]
"""A PPO run on CartPole of one iteration, in about a second."""


@pytest.fixture
def shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package ``shipped`` beside the run folders, whose module ``shipped.payload`` writes the file it returns
    when it is imported: the code a shared run folder could bring with it. The working folder is on the import
    path, as ``python -m lab`` puts it there."""
    package = tmp_path / "shipped"
    package.mkdir()
    (package / "__init__.py").write_text("")
    marker = tmp_path / "payload-ran"
    (package / "payload.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield marker
    for name in ("shipped.payload", "shipped"):  # the next import runs the module again
        sys.modules.pop(name, None)


def forget_payload() -> None:
    """Unimport the shipped module, so that importing it again runs it again."""
    for name in ("shipped.payload", "shipped"):
        sys.modules.pop(name, None)


def run_lab(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m lab ARGS`` in ``cwd``: the way that puts the working folder on the import path."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "lab", *args], check=False, capture_output=True, text=True, timeout=120, env=env, cwd=cwd
    )


# ── 1. no code from data ───────────────────────────────────────────────────────────────────────────────


def test_eval_of_a_run_folder_naming_a_module_runs_nothing_without_trust(tmp_path: Path, shipped: Path) -> None:
    # The user trains on their own module, typed on the command line: imported, as asked.
    assert main(["train", "--algo", "ppo", "--env", "shipped.payload:CartPole-v1", *TINY, "--run-dir", "run"]) == 0
    assert shipped.exists()
    shipped.unlink()
    forget_payload()

    # Someone else evaluates the shared folder: the module beside it is not run.
    refused = run_lab("eval", "run", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert "--trust-env-module" in refused.stderr and "shipped.payload" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert not shipped.exists()

    # Saying so evaluates it, importing the module.
    trusted = run_lab("eval", "run", "--trust-env-module", "--episodes", "2", cwd=tmp_path)
    assert trusted.returncode == 0, trusted.stderr
    assert "2 episodes" in trusted.stdout and shipped.exists()


def test_audit_of_a_run_folder_naming_a_module_runs_nothing_without_trust(
    tmp_path: Path, shipped: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("algo: ppo\nenv_id: shipped.payload:CartPole-v1\n")
    (run / "checkpoint.pt").write_bytes(b"")
    assert main(["audit", str(run), "--out", str(tmp_path / "out")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]  # warnings aside
    assert len(errors) == 1 and "--trust-env-module" in errors[0], errors
    assert not shipped.exists() and not (tmp_path / "out").exists()

    # Trusted, the module is imported and the audit goes on to the checkpoint (an empty file here).
    assert main(["audit", str(run), "--out", str(tmp_path / "out"), "--trust-env-module", "--workers", "1"]) != 0
    assert shipped.exists() and "--trust-env-module" not in capsys.readouterr().err


def test_a_resume_imports_only_the_env_typed_on_the_command_line(
    tmp_path: Path, shipped: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Held already before this round: --env is required and must equal the run's, so the saved id is never made.
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("algo: ppo\nenv_id: shipped.payload:CartPole-v1\n")
    assert main(["train", "--algo", "ppo", "--env", "CartPole-v1", "--resume", "--run-dir", str(run)]) == 2
    assert "another algo or env" in capsys.readouterr().err and not shipped.exists()


@pytest.mark.parametrize("command", ["eval", "audit"])
def test_the_trust_flag_is_in_the_help_of_the_commands_that_read_run_folders(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert "--trust-env-module" in capsys.readouterr().out


@pytest.mark.parametrize("env_id", ["shipped.payload:CartPole-v1", "os:CartPole-v1"])
def test_an_env_id_from_a_file_is_refused_before_any_import(env_id: str, shipped: Path) -> None:
    from envs.factory import check_saved_env_id

    forget_payload()
    with pytest.raises(BadInput, match="add --trust-env-module"):
        check_saved_env_id(env_id, "run/config.yaml")
    assert "shipped.payload" not in sys.modules and not shipped.exists()
    with pytest.raises(BadInput, match="Unknown environment id 'CartPol-v1'"):
        check_saved_env_id("CartPol-v1", "run/config.yaml")
    assert check_saved_env_id("CartPole-v1", "run/config.yaml") == "CartPole-v1"


# ── 2. sizes, at their documented edges ────────────────────────────────────────────────────────────────

BAD_KEY = ["--set", "no_such_key=1"]
"""Refused after the sizes are checked: a size within its bound reaches this refusal instead of its own."""
BENCH = ["bench", "--envs", "CartPole-v1", "--algos", "ppo", "--total-steps", "64"]
TUNE = ["tune", "--algo", "ppo", "--env", "CartPole-v1", "--space", "no-such-space.yaml"]


@pytest.mark.parametrize(
    ("argv", "within", "beyond", "message"),
    [
        (["train", "--algo", "ppo", "--env", "CartPole-v1", *BAD_KEY, "--seeds"], "256", "257", "from 1 to 256"),
        ([*BENCH, *BAD_KEY, "--seeds"], "256", "257", "--seeds takes at most 256"),
        (
            ["credit", "--task", "chain", "--horizons", "10", *BAD_KEY, "--seeds"],
            "256",
            "257",
            "--seeds takes at most 256",
        ),
        ([*TUNE, "--seeds"], "256", "257", "--seeds takes at most 256"),
        ([*BENCH, *BAD_KEY, "--name"], "b" * 100, "b" * 101, "give at most 100"),
        ([*TUNE, "--name"], "t" * 100, "t" * 101, "give at most 100"),
        (["eval", "no-run", "--episodes"], "1000", "1001", "--episodes must be from 1 to 1,000"),
    ],
)
def test_sizes_are_bounded_at_their_edge_before_any_planning(
    argv: list[str], within: str, beyond: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, within]) == 2
    assert message not in capsys.readouterr().err  # refused later, for the other reason
    assert main([*argv, beyond]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not Path("runs").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([*BENCH, "--seeds", "1000000000"], "--seeds takes at most 256 seeds, got 1,000,000,000"),
        ([*TUNE, "--seeds", "1000000000"], "--seeds takes at most 256 seeds, got 1,000,000,000"),
        ([*TUNE, "--seeds", "5000000"], "--seeds takes at most 256 seeds, got 5,000,000"),
        (["eval", "no-run", "--episodes", "100000000"], "--episodes must be from 1 to 1,000, got 100,000,000"),
    ],
)
def test_absurd_sizes_are_refused_at_once(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


# ── 3. a boolean is not a number ───────────────────────────────────────────────────────────────────────


def numeric_fields(cls: type) -> list[tuple[str, object]]:
    """Each field of ``cls`` that takes a number, with the boolean YAML would give it (``[true]`` for a tuple)."""
    found = []
    for f in dataclasses.fields(cls):
        kind = typing.get_type_hints(cls)[f.name]
        arms = typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, types.UnionType) else (kind,)
        if any(arm in (int, float) for arm in arms):
            found.append((f.name, True))
        elif any(typing.get_origin(arm) is tuple and typing.get_args(arm)[0] in (int, float) for arm in arms):
            found.append((f.name, [True]))
    return found


@pytest.mark.parametrize("cls", [PPOConfig, GRPOConfig])
def test_every_numeric_field_refuses_a_boolean(cls: type) -> None:
    fields = numeric_fields(cls)
    assert {"learning_rate", "gamma", "total_steps", "hidden_sizes", "budget_seconds"} <= {name for name, _ in fields}
    for name, value in fields:
        with pytest.raises(BadInput, match=rf"^{name}=true is a boolean, not a number|^{name}=True is not valid"):
            build_config(cls, {"env_id": "CartPole-v1", name: value})


def test_a_preset_or_run_file_with_a_boolean_for_a_number_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "preset.yaml").write_text("envs:\n  CartPole-v1:\n    learning_rate: true\n")
    assert (
        main(
            ["train", "--algo", "ppo", "--env", "CartPole-v1", "--preset", "preset.yaml", *TINY[:2], "--run-dir", "run"]
        )
        == 2
    )
    assert "learning_rate=true is a boolean, not a number" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    run = tmp_path / "shared"
    run.mkdir()
    (run / "config.yaml").write_text("algo: ppo\nenv_id: CartPole-v1\ngamma: yes\n")
    assert main(["eval", str(run)]) == 2
    assert "gamma=true is a boolean, not a number" in capsys.readouterr().err


# ── 4. refusals that leave nothing and say what is wrong ───────────────────────────────────────────────


@pytest.mark.parametrize("command", [[*BENCH, "--seeds", "1"], ["tune", "--algo", "ppo", "--env", "CartPole-v1"]])
def test_a_300_character_name_leaves_no_folder(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*command, "--name", "n" * 300]) == 2
    assert "give at most 100" in capsys.readouterr().err
    assert not Path("runs").exists()


@pytest.mark.parametrize(
    ("make", "given", "message"),
    [
        (lambda: os.symlink("loop", "loop"), "loop", "'loop' is a loop of symbolic links"),
        (lambda: os.symlink("loop", "loop"), "loop/run", "'loop' is a loop of symbolic links"),
        (
            lambda: os.symlink("nowhere", "dangling"),
            "dangling",
            "'dangling' is a symbolic link to 'nowhere', which does not exist",
        ),
        (lambda: os.symlink("nowhere", "dangling"), "dangling/run", "'dangling' is a symbolic link to 'nowhere'"),
        (lambda: Path("file").write_text(""), "file", "'file' is a file where a folder is wanted"),
        (lambda: Path("file").write_text(""), "file/run", "'file' is a file where a folder is wanted"),
    ],
)
@pytest.mark.parametrize("stack", [[], ["--seeds", "2"]])
def test_a_run_dir_that_cannot_be_a_folder_is_named_for_what_it_is(
    make: typing.Callable[[], object], given: str, message: str, stack: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    make()
    assert main(["train", "--algo", "ppo", "--env", "CartPole-v1", *TINY[:2], *stack, "--run-dir", given]) == 2
    err = capsys.readouterr().err
    assert message in err and "Free space" not in err and len(err.strip().splitlines()) == 1, err
    assert not Path("runs").exists() and not Path("nowhere").exists()
