"""`testbed tune`: a real tiny study on CartPole, its rerun, its exported preset, failures and bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agents import rundir
from envs.errors import BadInput
from lab import trials, tune
from lab.cli import main
from tests.conftest import progress_values

# The preset's learning rate, and one at which nothing is learned: trial 2 draws it and is pruned.
SPACE = "learning_rate: [1.0e-3, 1.0e-9]\n"


@pytest.fixture
def in_tmp(tmp_path: Path) -> Path:
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(cwd)


def tune_argv(name: str, space: Path, *extra: str) -> list[str]:
    return ["tune", "--algo", "ppo", "--env", "CartPole-v1", "--trials", "3", "--total-steps", "20000", "--space",
            str(space), "--startup-trials", "1", "--name", name, *extra]  # fmt: skip


@pytest.mark.slow
def test_a_tiny_study_prunes_reports_adds_nothing_when_rerun_and_exports_a_preset_train_accepts(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import optuna

    space = in_tmp / "space.yaml"
    space.write_text(SPACE)
    assert main(tune_argv("tiny", space)) == 0
    tune_dir = in_tmp / "runs" / "tune" / "tiny"
    study = optuna.load_study(study_name="tiny", storage=tune.storage_for(None, tune_dir))
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "COMPLETE", "PRUNED"]
    assert study.trials[0].user_attrs["preset"] == "env" and study.trials[0].params == {"learning_rate": 1e-3}
    assert study.trials[2].params == {"learning_rate": 1e-9}
    # Pruned after the warm-up third of the budget, at an evaluation, below trial 0's return there.
    pruned_at = max(study.trials[2].intermediate_values)
    assert 20000 // 3 <= pruned_at < 20000
    assert study.trials[2].intermediate_values[pruned_at] < study.trials[0].intermediate_values[pruned_at]
    # Every trial is an ordinary run directory; the pruned one stopped early with a checkpoint.
    pruned_run = tune_dir / "trial0002" / "CartPole-v1" / "ppo" / "seed100"
    summary = yaml.safe_load((pruned_run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["total_steps"] < 20000
    assert (tune_dir / "trial0000" / "CartPole-v1" / "ppo" / "seed100" / "config.yaml").exists()

    report = (tune_dir / "tune.md").read_text()
    assert "Trial 0: mean final return" in report and "for the env's preset (trial 0)" in report
    assert "| 2 | pruned |" in report
    for name in ("tune.html", "plots/history.png", "plots/slice.png", "plots/parallel.png"):
        assert (tune_dir / name).stat().st_size > 0

    # The second invocation adds nothing: the study is full.
    summaries = {p: p.stat().st_mtime_ns for p in tune_dir.glob("trial*/*/*/*/summary.json")}
    capsys.readouterr()
    assert main(tune_argv("tiny", space)) == 0
    assert "nothing new" in capsys.readouterr().out
    assert len(optuna.load_study(study_name="tiny", storage=tune.storage_for(None, tune_dir)).trials) == 3
    assert {p: p.stat().st_mtime_ns for p in tune_dir.glob("trial*/*/*/*/summary.json")} == summaries
    assert len(summaries) == 3

    # The exported preset: the best values under the env's entry, and `testbed train --preset` takes it.
    preset = yaml.safe_load((tune_dir / "preset.yaml").read_text())
    assert preset["envs"]["CartPole-v1"]["learning_rate"] == 1e-3
    assert "```yaml\n# testbed tune tiny: trial 0 of 3" in report
    run_dir = in_tmp / "from-preset"
    assert main(["train", "--algo", "ppo", "--env", "CartPole-v1", "--preset", str(tune_dir / "preset.yaml"),
                 "--total-steps", "512", "--run-dir", str(run_dir)]) == 0  # fmt: skip
    assert rundir.read_config(run_dir)["n_steps"] == preset["envs"]["CartPole-v1"]["n_steps"]


@pytest.mark.slow
def test_a_failed_trial_is_recorded_and_the_study_goes_on(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import optuna

    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[1]))  # the trainers import tests.toy_envs

    space = in_tmp / "space.yaml"
    space.write_text("learning_rate: {low: 1.0e-4, high: 1.0e-3, log: true}\n")
    argv = ["tune", "--algo", "ppo", "--env", "tests.toy_envs:testbed-toy/Crash-v0", "--trials", "2", "--total-steps",
            "2048", "--space", str(space), "--name", "crash"]  # fmt: skip
    assert main(argv) == 0
    study = optuna.load_study(study_name="crash", storage=tune.storage_for(None, in_tmp / "runs" / "tune" / "crash"))
    assert [t.state.name for t in study.trials] == ["FAIL", "FAIL"]
    assert "crashed on purpose" in study.trials[0].user_attrs["error"]
    assert "2 failed; no trial has completed" in capsys.readouterr().out


def test_a_space_file_is_read_as_choices_and_ranges() -> None:
    space = tune.parse_space("n_steps: [256, 512]\nlr: {low: 1.0e-5, high: 1.0e-3, log: true}\n"
                             "hidden_sizes: [[64, 64], [256, 256]]\nn: {low: 1, high: 4, int: true}\n", "s.yaml")  # fmt: skip
    assert space["n_steps"].choices == (256, 512)
    assert (space["lr"].low, space["lr"].high, space["lr"].log) == (1e-5, 1e-3, True)
    assert space["hidden_sizes"].contains([256, 256]) and not space["hidden_sizes"].contains([32])
    assert space["n"].integer and space["n"].ends() == [1, 4]
    assert tune.overrides_of({"hidden_sizes": [64, 64], "lr": 0.001, "anneal_lr": True}) == [
        "hidden_sizes=[64, 64]", "lr=0.001", "anneal_lr=true"]  # fmt: skip


def test_the_default_spaces_are_valid_for_their_algos() -> None:
    for algo, env_id in (("ppo", "Hopper-v5"), ("ppo", "CartPole-v1"), ("grpo", "HalfCheetah-v5"), ("grpo-step", "CartPole-v1")):
        space = tune.plan_tune(algo, env_id, 10, None, 1, None, [], None).space
        assert len(space) >= 10
    assert {"group_size", "num_groups", "max_episode_steps", "n_epochs", "num_minibatches", "learning_rate",
            "log_std_init", "beta", "clip_low", "clip_high", "advantage", "aggregation"} <= set(
        tune.parse_space(tune.default_space_file("grpo").read_text(), "grpo.yaml"))  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "space", "message"),
    [
        (["--algo", "nope"], None, "unknown algo 'nope'"),
        (["--env", "NoSuchEnv-v0"], None, "NoSuchEnv-v0"),
        ([], "learning_rte: [0.001]\n", "learning_rte is not a config key of ppo"),
        ([], "learning_rate: {low: 0.01, high: 0.001}\n", "the range is empty"),
        ([], "learning_rate: {low: 0.0, high: 0.001, log: true}\n", "a log range needs low > 0"),
        ([], "gamma: [0.99, 1.5]\n", "gamma includes 1.5, which ppo refuses"),
        ([], "gamma: []\n", "has no choices"),
        ([], "- 1\n- 2\n", "must map config keys"),
        (["--set", "gamma=0.9"], "gamma: [0.99, 0.9]\n", "--set gamma fixes what the space tunes"),
        (["--algo", "ppo-lambda0"], "gae_lambda: [0.9, 0.95]\n", "ppo-lambda0 fixes gae_lambda"),
        (["--trials", "0"], None, "--trials must be at least 1"),
        (["--space", "missing.yaml"], None, "no such file"),
        (["--storage", "sqlite:////no/such/folder/study.db"], None, "cannot open the study storage"),
        (["--storage", "nosuchdb://user@host/db"], None, "cannot open the study storage"),
    ],
)
def test_bad_input_is_refused_before_any_trial(
    argv: list[str], space: str | None, message: str, in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    defaults = {"--algo": "ppo", "--env": "CartPole-v1", "--name": "bad"}
    if space is not None:
        (in_tmp / "space.yaml").write_text(space)
        defaults["--space"] = str(in_tmp / "space.yaml")
    for flag, value in defaults.items():
        if flag not in argv:
            argv = [*argv, flag, value]
    assert main(["tune", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not list((in_tmp / "runs" / "tune").glob("bad/trial*"))


def test_a_study_keeps_its_settings_and_has_one_driver(in_tmp: Path) -> None:
    plan = tune.plan_tune("ppo", "CartPole-v1", 2, 5000, 1, None, [], "kept")
    tune.write_tune_yaml(in_tmp / "kept", plan)
    other = tune.plan_tune("ppo", "CartPole-v1", 2, 6000, 1, None, [], "kept")
    with pytest.raises(BadInput, match="other total_steps; use another --name"):
        tune.check_tune_dir(in_tmp / "kept", other)
    tune.check_tune_dir(in_tmp / "kept", tune.plan_tune("ppo", "CartPole-v1", 9, 5000, 1, None, [], "kept"))
    with rundir.DirLock(in_tmp / "kept"), pytest.raises(BadInput, match="is being written by pid"):
        tune.run_study(plan, 1, "local", None, root=in_tmp)


@pytest.mark.slow
def test_a_trial_left_running_by_a_killed_driver_resumes_from_its_checkpoint(in_tmp: Path) -> None:
    import optuna

    from tests.conftest import wait_for

    argv = [sys.executable, "-m", "lab", *tune_argv("killed", in_tmp / "space.yaml")[:-2], "--name", "killed",
            "--trials", "1", "--set", "checkpoint_interval=4096"]  # fmt: skip
    (in_tmp / "space.yaml").write_text(SPACE)
    run_dir = in_tmp / "runs" / "tune" / "killed" / "trial0000" / "CartPole-v1" / "ppo" / "seed100"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    driver = subprocess.Popen(argv, cwd=in_tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (run_dir / "checkpoint.pt").exists(), timeout_s=60, poll_s=0.05)
    driver.kill()
    driver.communicate()
    storage = tune.storage_for(None, in_tmp / "runs" / "tune" / "killed")
    assert optuna.load_study(study_name="killed", storage=storage).trials[0].state.name == "RUNNING"

    rerun = subprocess.run(argv, cwd=in_tmp, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert rerun.returncode == 0, rerun.stderr
    trials = optuna.load_study(study_name="killed", storage=storage).trials
    assert [t.state.name for t in trials] == ["COMPLETE"]  # the same trial, continued: no new one
    assert "--resume" in run_dir.with_name("seed100.log").read_text()


@pytest.mark.slow
def test_the_same_study_on_a_local_ray_instance(in_tmp: Path) -> None:
    import optuna

    ray = pytest.importorskip("ray")
    (in_tmp / "space.yaml").write_text(SPACE)
    plan = tune.plan_tune("ppo", "CartPole-v1", 3, 20000, 1, str(in_tmp / "space.yaml"), [], "ray", startup_trials=1)
    try:
        tune_dir, counts = tune.run_study(plan, 1, "ray", None, root=in_tmp)
    finally:
        ray.shutdown()
    assert counts == {"completed": 2, "pruned": 1}  # as on the local pool: the trials' reports reached the pruner
    study = optuna.load_study(study_name="ray", storage=tune.storage_for(None, tune_dir))
    assert study.trials[2].intermediate_values and study.trials[0].value > 100
    assert (tune_dir / "trial0002" / "CartPole-v1" / "ppo" / "seed100" / "checkpoint.pt").exists()


def test_train_refuses_a_preset_file_without_the_env_or_with_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    preset = tmp_path / "preset.yaml"
    preset.write_text("envs:\n  Acrobot-v1:\n    n_envs: 2\n")
    argv = ["train", "--algo", "ppo", "--env", "CartPole-v1", "--preset", str(preset), "--run-dir", str(tmp_path / "r")]
    assert main(argv) == 2
    assert "has no entry for CartPole-v1" in capsys.readouterr().err
    preset.write_text("envs: [unclosed\n")
    assert main(argv) == 2
    assert "cannot be read as YAML" in capsys.readouterr().err
    assert main([*argv, "--resume"]) == 2
    assert "drop --preset" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_resumed_study_does_not_draw_its_random_trials_again(in_tmp: Path) -> None:
    (in_tmp / "space.yaml").write_text("learning_rate: {low: 1.0e-5, high: 1.0e-2, log: true}\n")
    plan = tune.plan_tune("ppo", "CartPole-v1", 9, 2048, 1, str(in_tmp / "space.yaml"), [], "again")
    study = tune.open_study(plan, in_tmp / "again")
    drawn = [tune.new_trial(study, plan, "driver").params["learning_rate"] for _ in range(2)]
    reopened = tune.open_study(plan, in_tmp / "again")  # a driver started again on the same study
    assert tune.new_trial(reopened, plan, "driver").params["learning_rate"] not in drawn
    # A study run in one go is reproducible: the same seed draws the same values.
    other = tune.open_study(tune.plan_tune("ppo", "CartPole-v1", 9, 2048, 1, str(in_tmp / "space.yaml"), [], "b"),
                            in_tmp / "b")  # fmt: skip
    assert tune.new_trial(other, plan, "driver").params["learning_rate"] == drawn[0]


def test_a_study_starts_from_the_env_preset_then_the_action_space_default() -> None:
    points = tune.starting_points(tune.plan_tune("ppo", "Walker2d-v5", 10, None, 1, None, [], "starts"))
    assert list(points) == ["env", "default"]
    # Walker2d's entry (the RL Zoo's v3 values) against CleanRL's continuous defaults; an ent_coef of 0 sits
    # outside the log range and is moved to its low end.
    assert (points["env"]["n_steps"], points["env"]["n_epochs"], points["env"]["clip_range"]) == (512, 20, 0.1)
    assert (points["default"]["n_steps"], points["default"]["n_epochs"], points["default"]["clip_range"]) == (2048, 10, 0.2)
    assert points["default"]["ent_coef"] == 1e-8
    # An env without a preset entry has one starting point: its preset is the default.
    assert list(tune.starting_points(tune.plan_tune("ppo", "Pendulum-v1", 10, None, 1, None, [], "p"))) == ["env"]


@pytest.mark.slow
def test_a_trial_scores_the_mean_final_return_of_its_seeds(in_tmp: Path) -> None:
    import json

    import optuna

    (in_tmp / "space.yaml").write_text(SPACE)
    assert main(["tune", "--algo", "ppo", "--env", "CartPole-v1", "--trials", "1", "--seeds", "2", "--total-steps", "4096",
                 "--space", str(in_tmp / "space.yaml"), "--pruner", "none", "--name", "two", "--set", "eval_interval=2048"]) == 0  # fmt: skip
    tune_dir = in_tmp / "runs" / "tune" / "two"
    finals = [json.loads((tune_dir / "trial0000" / "CartPole-v1" / "ppo" / f"seed{seed}" / "summary.json").read_text())
              ["final_eval_return_mean"] for seed in (100, 101)]  # fmt: skip
    trial = optuna.load_study(study_name="two", storage=tune.storage_for(None, tune_dir)).trials[0]
    assert trial.value == pytest.approx(sum(finals) / 2)
    # What the pruner was told: at each evaluation step, the mean of both seeds' evaluations there.
    curve = trials.mean_curve([tune_dir / "trial0000" / "CartPole-v1" / "ppo" / f"seed{seed}" for seed in (100, 101)])
    assert trial.intermediate_values == pytest.approx(curve) and len(curve) >= 2
    # The trial's two seeds trained side by side in one process (`--stack`, default 16).
    assert "--seeds 100,101" in (tune_dir / "trial0000" / "CartPole-v1" / "ppo" / "seed100.log").read_text()
    # Trial 0 trains the env's preset: its seed 101 is `testbed train --seed 101`, bit for bit.
    single = in_tmp / "single"
    assert main(["train", "--algo", "ppo", "--env", "CartPole-v1", "--seed", "101", "--total-steps", "4096",
                 "--set", "eval_interval=2048", "--run-dir", str(single)]) == 0  # fmt: skip
    trial_run = tune_dir / "trial0000" / "CartPole-v1" / "ppo" / "seed101"
    assert rundir.read_config(trial_run) == rundir.read_config(single)
    columns = ["global_step", "losses/policy_loss", "losses/value_loss", "losses/approx_kl", "eval/return_mean"]
    assert progress_values(trial_run, columns) == progress_values(single, columns)


@pytest.mark.slow
def test_a_study_in_a_database_given_by_storage(in_tmp: Path) -> None:
    import optuna

    (in_tmp / "space.yaml").write_text(SPACE)
    url = f"sqlite:///{in_tmp / 'studies.db'}"
    argv = ["tune", "--algo", "ppo", "--env", "CartPole-v1", "--trials", "1", "--total-steps", "2048", "--space",
            str(in_tmp / "space.yaml"), "--pruner", "none", "--name", "db", "--storage", url]  # fmt: skip
    assert main(argv) == 0
    assert not (in_tmp / "runs" / "tune" / "db" / "study.log").exists()
    assert [t.state.name for t in optuna.load_study(study_name="db", storage=url).trials] == ["COMPLETE"]
    assert main(["report", str(in_tmp / "runs" / "tune" / "db")]) == 0  # the report finds the study through tune.yaml
