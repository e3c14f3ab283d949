"""The first hour's messages: each mistake a new user makes ends in one line on stderr, exit code 2, with the fix,
before any work starts; a run on an old env version is pointed to the tuned one.

Each test names the mistake it replays. The rendering cases fake the machine (its GL libraries, its display)
through the environment and ``ctypes.util.find_library``, so they hold on any machine; one test renders for
real in a child process, where MuJoCo is imported afresh.
"""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest

from envs.errors import BadInput
from envs.factory import mujoco_gl_problem
from lab import executor
from lab.cli import main
from lab.parser import build_parser
from lab.plan import preset_note
from tests.conftest import REPO


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The whole of stderr, checked to be one line: the error with its fix, no traceback, usage or warnings."""
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("testbed ") and ": error: " in lines[0]
    return lines[0]


def no_osmesa(name: str) -> str | None:
    """A machine with EGL and without OSMesa (a GPU server, a container with Mesa's EGL only)."""
    return {"EGL": "libEGL.so.1"}.get(name)


def no_gl(name: str) -> str | None:
    return None


# ── MUJOCO_GL ────────────────────────────────────────────────────────────────────────────────────────


def test_osmesa_without_its_library_says_training_needs_no_gl() -> None:
    message = mujoco_gl_problem(False, {"MUJOCO_GL": "osmesa"}, no_osmesa)
    assert message is not None and "OSMesa library is not installed" in message
    assert "unset MUJOCO_GL to train" in message and "MUJOCO_GL=egl" in message
    # To record a video: the back-end installed here, or how to install the one asked for.
    message = mujoco_gl_problem(True, {"MUJOCO_GL": "osmesa"}, no_osmesa)
    assert message is not None and "apt install libosmesa6" in message and "MUJOCO_GL=egl" in message
    # Neither library: how to install one.
    message = mujoco_gl_problem(True, {"MUJOCO_GL": "osmesa"}, no_gl)
    assert message is not None and "apt install libegl1" in message


def test_gl_settings_that_work_are_left_alone() -> None:
    assert mujoco_gl_problem(False, {}, no_gl) is None  # GLFW imports without a display
    assert mujoco_gl_problem(False, {"MUJOCO_GL": "egl"}, no_osmesa) is None
    assert mujoco_gl_problem(True, {"MUJOCO_GL": "egl"}, no_osmesa) is None
    assert mujoco_gl_problem(True, {"DISPLAY": ":0"}, no_gl) is None  # a desktop draws in a window
    assert mujoco_gl_problem(False, {"MUJOCO_GL": "disable"}, no_gl) is None


def test_drawing_without_a_display_or_with_a_bad_value_names_the_fix() -> None:
    message = mujoco_gl_problem(True, {}, no_osmesa)
    assert message is not None and "no display" in message and "MUJOCO_GL=egl" in message
    message = mujoco_gl_problem(False, {"MUJOCO_GL": "opengl"}, no_osmesa)  # import mujoco raises RuntimeError
    assert message is not None and "not a MuJoCo GL back-end" in message
    message = mujoco_gl_problem(True, {"MUJOCO_GL": "disable"}, no_osmesa)
    assert message is not None and "off" in message


def test_train_with_osmesa_missing_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Was: a 41-line traceback from PyOpenGL, as `import mujoco` loads the back-end MUJOCO_GL names.
    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    monkeypatch.setattr(ctypes.util, "find_library", no_osmesa)
    assert main(["train", "--algo", "ppo", "--env", "Hopper-v5", "--total-steps", "2048", "--run-dir", "run"]) == 2
    line = one_error_line(capsys)
    assert "MUJOCO_GL=osmesa" in line and "unset MUJOCO_GL to train" in line
    assert not Path("run").exists()


def fake_run(folder: Path, env_id: str = "Hopper-v5", algo: str = "ppo") -> Path:
    """A run folder with a config.yaml only: every check below comes before its checkpoint is read."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(f"algo: {algo}\nenv_id: {env_id}\n")
    return folder


def test_eval_video_without_a_display_is_one_line_before_evaluating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Was: the evaluation, then four GLFW warning lines, then the error (and with MUJOCO_GL=osmesa, a traceback).
    run = fake_run(tmp_path / "run")  # no checkpoint: the refusal must come before the evaluation reads one
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr(ctypes.util, "find_library", no_osmesa)
    assert main(["eval", str(run), "--video", str(tmp_path / "video")]) == 2
    assert "MUJOCO_GL=egl" in one_error_line(capsys)
    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    assert main(["eval", str(run), "--video", str(tmp_path / "video")]) == 2
    assert "OSMesa library is not installed" in one_error_line(capsys)


def test_a_failed_frame_is_one_line_without_glfw_warnings(tmp_path: Path) -> None:
    """For real, in a fresh process: a display that names no server passes the known cases, then GLFW fails to
    open it, warning twice before mujoco's error; only the error's line is printed."""
    run = fake_run(tmp_path / "run")
    env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "WAYLAND_DISPLAY")}
    env |= {"DISPLAY": ":97", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "lab.cli", "eval", str(run), "--video", str(tmp_path / "v")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot render here" in lines[0] and "MUJOCO_GL=" in lines[0], done.stderr
    assert "GLFWError" not in done.stderr


# ── counts written 1e5 ─────────────────────────────────────────────────────────────────────────────────


def test_counts_take_exponent_notation_when_whole(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    args = parser.parse_args(["train", "--algo", "ppo", "--env", "CartPole-v1", "--total-steps", "1e5"])
    assert args.total_steps == 100_000 and isinstance(args.total_steps, int)
    assert (
        parser.parse_args(["train", "--algo", "ppo", "--env", "X", "--total-steps", "2.5e6"]).total_steps == 2_500_000
    )
    assert parser.parse_args(["tune", "--algo", "ppo", "--env", "X", "--total-steps", "5e4"]).total_steps == 50_000
    assert parser.parse_args(["bench", "--total-steps", "1E4"]).total_steps == 10_000
    # Was: seven lines of usage, then "invalid int value: '1.5e-3'".
    for value in ("1.5e-3", "12.5", "nan", "lots"):
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(["train", "--algo", "ppo", "--env", "CartPole-v1", "--total-steps", value])
        assert exit_.value.code == 2
        line = one_error_line(capsys)
        assert "--total-steps" in line and "1e5" in line and "--help" in line


def test_set_takes_the_same_counts(capsys: pytest.CaptureFixture[str]) -> None:
    from agents.config import build_config
    from agents.ppo import PPOConfig

    assert build_config(PPOConfig, {"env_id": "CartPole-v1", "total_steps": "1e5"}).total_steps == 100_000
    assert main(["train", "--algo", "ppo", "--env", "CartPole-v1", "--set", "total_steps=1.5e-3"]) == 2
    assert "total_steps='1.5e-3' is not a valid int (not a whole number)" in one_error_line(capsys)


# ── run folders ──────────────────────────────────────────────────────────────────────────────────────


def test_a_missing_run_folder_says_it_does_not_exist(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "runs/does-not-exist"]) == 2
    line = one_error_line(capsys)
    assert "runs/does-not-exist does not exist" in line and "config.yaml" not in line
    assert main(["train", "--algo", "ppo", "--env", "CartPole-v1", "--run-dir", "runs/nope", "--resume"]) == 2
    line = one_error_line(capsys)
    assert "runs/nope does not exist" in line and "drop --resume" in line and not Path("runs").exists()


def test_eval_on_a_bench_folder_lists_runs_to_pick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = tmp_path / "runs" / "bench" / "quick"
    for seed in range(5):
        fake_run(bench / "CartPole-v1" / "ppo" / f"seed{seed}", "CartPole-v1")
    assert main(["eval", str(bench)]) == 2
    line = one_error_line(capsys)
    assert "holds 5 runs" in line and "pick one" in line
    assert f"{bench}/CartPole-v1/ppo/seed0, {bench}/CartPole-v1/ppo/seed1, {bench}/CartPole-v1/ppo/seed2" in line


def test_resume_with_another_algo_names_the_runs_own(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = fake_run(tmp_path / "run", "CartPole-v1", "ppo")
    assert main(["train", "--algo", "grpo", "--env", "CartPole-v1", "--run-dir", str(run), "--resume"]) == 2
    assert "resume it with --algo ppo --env CartPole-v1" in one_error_line(capsys)


# ── an old env version ───────────────────────────────────────────────────────────────────────────────


def test_an_old_version_without_a_preset_points_to_the_tuned_one() -> None:
    from agents.registry import check_name

    assert preset_note(check_name("ppo"), "Hopper-v4", "default (continuous)") == (
        "note: Hopper-v4: no ppo preset, so untuned defaults; Hopper-v5 has a tuned one (--env Hopper-v5)"
    )
    assert preset_note(check_name("ppo-lambda0"), "Hopper-v4", "default (continuous)") is not None  # its base's
    assert preset_note(check_name("ppo"), "Hopper-v5", "Hopper-v5") is None
    assert preset_note(check_name("ppo"), "Pendulum-v1", "default (continuous)") is None  # no version of it is tuned


def test_train_on_an_old_version_notes_the_tuned_one_once_before_training(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Was: a million steps with untuned defaults, no word of Hopper-v5's preset, and gymnasium's deprecation
    # warning twice. The training itself is stood in for: what matters is what is said before it.
    import dataclasses

    from agents import registry

    said_before: list[str] = []

    def train(cfg: Any, run_dir: Path, resume: bool, name: str) -> dict[str, Any]:
        said_before.append(capsys.readouterr().err)
        return {"status": "completed", "seed": cfg.seed, "final_eval_return_mean": 1.0, "total_steps": 1}

    ppo = registry.get("ppo")
    monkeypatch.setattr(registry, "load", lambda entry: dataclasses.replace(ppo, train=train))
    assert main(["train", "--algo", "ppo", "--env", "Hopper-v4", "--total-steps", "2048", "--run-dir", "run"]) == 0
    err = said_before[0]
    assert err.count("Hopper-v4: no ppo preset") == 1 and "Hopper-v5 has a tuned one (--env Hopper-v5)" in err
    assert err.count("is out of date") <= 1


# ── presets: a missing presets file, an unreadable --preset ─────────────────────────────────────────


def stand_in_training(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> list[tuple[Any, str]]:
    """``testbed train``'s training stood in for (PPO's algo, its train replaced): the configs it was given, each
    with what stderr said before it."""
    import dataclasses

    from agents import registry

    trained: list[tuple[Any, str]] = []

    def train(cfg: Any, run_dir: Path, resume: bool, name: str) -> dict[str, Any]:
        trained.append((cfg, capsys.readouterr().err))
        return {"status": "completed", "seed": cfg.seed, "final_eval_return_mean": 1.0, "total_steps": 1}

    ppo = registry.get("ppo")
    monkeypatch.setattr(registry, "load", lambda entry: dataclasses.replace(ppo, train=train))
    return trained


def test_an_algo_without_a_presets_file_trains_with_its_config_defaults_and_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Was: "cannot write agents/presets/….yaml: No such file or directory. Free space or choose a writable
    # folder": the packaged file was read unguarded, and every OSError was taken for a full disk.
    import json

    from agents import config
    from agents.ppo import PPOConfig

    monkeypatch.setattr(config, "PRESET_DIR", tmp_path / "no-presets")
    trained = stand_in_training(monkeypatch, capsys)
    assert main(["train", "--algo", "ppo", "--env", "CartPole-v1", "--total-steps", "2048", "--run-dir", "run"]) == 0
    cfg, err = trained[0]
    assert err.count("note: ppo has no presets file (agents/presets/ppo.yaml), so its config's defaults") == 1, err
    defaults = PPOConfig(env_id="CartPole-v1")
    assert (cfg.n_envs, cfg.n_steps, cfg.learning_rate) == (defaults.n_envs, defaults.n_steps, defaults.learning_rate)
    assert json.loads(Path("run/meta.json").read_text())["preset"] == config.NO_PRESETS
    # A --preset file still applies on top of the config's defaults.
    Path("preset.yaml").write_text("envs:\n  CartPole-v1:\n    n_envs: 2\n")
    argv = ["train", "--algo", "ppo", "--env", "CartPole-v1", "--total-steps", "2048", "--preset", "preset.yaml"]
    assert main([*argv, "--run-dir", "run2"]) == 0
    assert trained[1][0].n_envs == 2 and "Free space" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("make", "cause"),
    [
        (lambda: None, "No such file or directory"),
        (lambda: Path("preset.yaml").mkdir(), "Is a directory"),
        (lambda: Path("preset.yaml").write_bytes(b"\xff\xfe"), "not UTF-8 text"),
    ],
)
def test_a_preset_file_that_cannot_be_read_is_one_line_naming_it_and_the_cause(
    make: Any, cause: str, capsys: pytest.CaptureFixture[str]
) -> None:
    make()
    assert main(["train", "--algo", "ppo", "--env", "CartPole-v1", "--preset", "preset.yaml", "--run-dir", "r"]) == 2
    line = one_error_line(capsys)
    assert "--preset preset.yaml: cannot be read" in line and cause in line and "Free space" not in line, line
    assert not Path("r").exists()


def test_an_os_error_is_a_full_disk_only_where_writing_met_it() -> None:
    import errno

    from lab.cli import os_error_message

    missing = os_error_message(FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), "agents/presets/x.yaml"))
    assert missing.startswith("cannot use agents/presets/x.yaml: No such file or directory") and "Free" not in missing
    full = os_error_message(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "run/checkpoint.pt"))
    assert full == "cannot write run/checkpoint.pt: No space left on device. Free space, then rerun."
    assert "writable folder" in os_error_message(OSError(errno.EROFS, os.strerror(errno.EROFS)))


# ── Ray's token authentication ───────────────────────────────────────────────────────────────────────


class GcsStandIn:
    """A gRPC server at a free local port answering every call as a Ray GCS does: with ``status``
    (UNAUTHENTICATED where token authentication refuses a request without the cluster's token)."""

    def __init__(self, status: Any) -> None:
        import grpc

        def refuse(request: bytes, context: Any) -> bytes:
            context.abort(status, "InvalidAuthToken: Authentication token is missing or incorrect")

        class Handler(grpc.GenericRpcHandler):
            def service(self, details: Any) -> Any:
                return grpc.unary_unary_rpc_method_handler(
                    refuse, request_deserializer=bytes, response_serializer=bytes
                )

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
        self.server.add_generic_rpc_handlers((Handler(),))
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()


class FakeRay:
    """The parts of ``ray`` that connect_ray calls; ``init`` fails as Ray's does on a refused token."""

    class exceptions:  # as Ray names it
        class AuthenticationError(Exception):
            pass

    def __init__(self) -> None:
        self.inits = 0

    def is_initialized(self) -> bool:
        return False

    def init(self, **kwargs: Any) -> None:
        self.inits += 1
        raise ConnectionError(f"Failed to connect to Ray cluster at {kwargs['address']}")


@pytest.fixture
def token_cluster(monkeypatch: pytest.MonkeyPatch) -> Any:
    grpc = pytest.importorskip("grpc")
    cluster = GcsStandIn(grpc.StatusCode.UNAUTHENTICATED)
    yield cluster
    cluster.server.stop(None)


def test_a_cluster_that_wants_a_token_is_not_called_unreachable(
    token_cluster: GcsStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    ray = FakeRay()
    monkeypatch.setattr(executor, "import_ray", lambda: ray)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    # Was: "cannot reach a Ray cluster", after ray.init's 20 s of retries, though the cluster was up.
    with pytest.raises(BadInput, match=r"is up but uses token authentication.*set RAY_AUTH_MODE=token") as refused:
        executor.connect_ray(token_cluster.address, 1)
    assert "cannot reach" not in str(refused.value) and ray.inits == 0  # asked at once, before ray.init
    # A driver in token mode whose token the cluster refuses.
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    with pytest.raises(BadInput, match="is up but refused this driver's token"):
        executor.connect_ray(token_cluster.address, 1)
    assert ray.inits == 1


def test_an_address_without_token_authentication_is_told_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    grpc = pytest.importorskip("grpc")
    open_cluster = GcsStandIn(grpc.StatusCode.UNIMPLEMENTED)  # answers, and asks no token
    try:
        assert executor.wants_token(*open_cluster.address.split(":")) is False
        monkeypatch.setattr(executor, "import_ray", FakeRay)
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
        with pytest.raises(BadInput, match="cannot reach a Ray cluster"):
            executor.connect_ray(open_cluster.address, 1)
    finally:
        open_cluster.server.stop(None)
