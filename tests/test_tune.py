"""`testbed tune`: a real tiny study on CartPole, its rerun, its exported preset, failures and bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents import registry, rundir
from envs.errors import BadInput
from lab import ledger, manifest, trials, tune
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
    return [
        "tune",
        "--algo",
        "ppo",
        "--env",
        "CartPole-v1",
        "--trials",
        "3",
        "--total-steps",
        "20000",
        "--space",
        str(space),
        "--startup-trials",
        "1",
        "--name",
        name,
        *extra,
    ]


@pytest.mark.slow
def test_a_tiny_study_prunes_reports_adds_nothing_when_rerun_and_exports_a_preset_train_accepts(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import optuna

    # The pruner's stop lands up to a poll (1 s) after the evaluation it judged, and CartPole trains some
    # 7,500 steps/s: pruned at 10,000 of 20,000 steps, a run could finish first. Pruned at 16,384 of 48,000
    # (no pruning in the first third), it has some 4 s of training left when the stop comes.
    budget = 48_000
    extra = ("--total-steps", str(budget), "--set", "eval_interval=8192")
    space = in_tmp / "space.yaml"
    space.write_text(SPACE)
    assert main(tune_argv("tiny", space, *extra)) == 0
    tune_dir = in_tmp / "runs" / "tune" / "tiny"
    study = optuna.load_study(study_name="tiny", storage=tune.storage_for(None, tune_dir))
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "COMPLETE", "PRUNED"]
    assert study.trials[0].user_attrs["preset"] == "env" and study.trials[0].params == {"learning_rate": 1e-3}
    assert study.trials[2].params == {"learning_rate": 1e-9}
    # Pruned after the warm-up third of the budget, at an evaluation, below trial 0's return there.
    pruned_at = max(study.trials[2].intermediate_values)
    assert budget // 3 <= pruned_at < budget
    assert study.trials[2].intermediate_values[pruned_at] < study.trials[0].intermediate_values[pruned_at]
    # Every trial is an ordinary run directory; the pruned one stopped early with a checkpoint.
    pruned_run = tune_dir / "trial0002" / "CartPole-v1" / "ppo" / "seed100"
    summary = yaml.safe_load((pruned_run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["total_steps"] < budget
    assert (tune_dir / "trial0000" / "CartPole-v1" / "ppo" / "seed100" / "config.yaml").exists()

    report = (tune_dir / "tune.md").read_text()
    assert "Trial 0: mean final return" in report and "for the env's preset (trial 0)" in report
    assert "| 2 | pruned |" in report
    for name in ("tune.html", "plots/history.png", "plots/slice.png", "plots/parallel.png"):
        assert (tune_dir / name).stat().st_size > 0
    # The tuning ledger reads this report, as it reads a committed study's without its sqlite file.
    kept = manifest.Entry(
        "tiny", "tiny", "a study", "testbed tune", "runs/tune/tiny", ("tune.md",), "100", "", "long", page="tune.md"
    )
    lines = ledger.report_lines(in_tmp, kept)
    assert ledger.trials_done(in_tmp, lines, "tiny", None) == 3  # 2 complete and the pruned one
    assert ledger.steps_spent(lines) == sum(
        int(s["total_steps"])
        for s in map(yaml.safe_load, map(Path.read_text, tune_dir.glob("trial*/*/*/*/summary.json")))
    )

    # The second invocation adds nothing: the study is full.
    summaries = {p: p.stat().st_mtime_ns for p in tune_dir.glob("trial*/*/*/*/summary.json")}
    capsys.readouterr()
    assert main(tune_argv("tiny", space, *extra)) == 0
    assert "nothing new" in capsys.readouterr().out
    assert len(optuna.load_study(study_name="tiny", storage=tune.storage_for(None, tune_dir)).trials) == 3
    assert {p: p.stat().st_mtime_ns for p in tune_dir.glob("trial*/*/*/*/summary.json")} == summaries
    assert len(summaries) == 3

    # The exported preset: the best values under the env's entry, and `testbed train --preset` takes it.
    preset = yaml.safe_load((tune_dir / "preset.yaml").read_text())
    assert preset["envs"]["CartPole-v1"]["learning_rate"] == 1e-3
    assert "```yaml\n# testbed tune tiny: trial 0 of 3" in report
    run_dir = in_tmp / "from-preset"
    assert (
        main(
            [
                "train",
                "--algo",
                "ppo",
                "--env",
                "CartPole-v1",
                "--preset",
                str(tune_dir / "preset.yaml"),
                "--total-steps",
                "512",
                "--run-dir",
                str(run_dir),
            ]
        )
        == 0
    )
    assert rundir.read_config(run_dir)["n_steps"] == preset["envs"]["CartPole-v1"]["n_steps"]


@pytest.mark.slow
def test_a_failed_trial_is_recorded_and_the_study_goes_on(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import optuna

    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[1]))  # the trainers import tests.toy_envs

    space = in_tmp / "space.yaml"
    space.write_text("learning_rate: {low: 1.0e-4, high: 1.0e-3, log: true}\n")
    argv = [
        "tune",
        "--algo",
        "ppo",
        "--env",
        "tests.toy_envs:testbed-toy/Crash-v0",
        "--trials",
        "2",
        "--total-steps",
        "2048",
        "--space",
        str(space),
        "--name",
        "crash",
    ]
    assert main(argv) == 0
    study = optuna.load_study(study_name="crash", storage=tune.storage_for(None, in_tmp / "runs" / "tune" / "crash"))
    assert [t.state.name for t in study.trials] == ["FAIL", "FAIL"]
    assert "crashed on purpose" in study.trials[0].user_attrs["error"]
    assert "2 failed; no trial has completed" in capsys.readouterr().out


def test_a_space_file_is_read_as_choices_and_ranges() -> None:
    space = tune.parse_space(
        "n_steps: [256, 512]\nlr: {low: 1.0e-5, high: 1.0e-3, log: true}\n"
        "hidden_sizes: [[64, 64], [256, 256]]\nn: {low: 1, high: 4, int: true}\n",
        "s.yaml",
    )
    assert space["n_steps"].choices == (256, 512)
    assert (space["lr"].low, space["lr"].high, space["lr"].log) == (1e-5, 1e-3, True)
    assert space["hidden_sizes"].contains([256, 256]) and not space["hidden_sizes"].contains([32])
    assert space["n"].integer and space["n"].ends() == [1, 4]
    assert tune.overrides_of({"hidden_sizes": [64, 64], "lr": 0.001, "anneal_lr": True}) == [
        "hidden_sizes=[64, 64]",
        "lr=0.001",
        "anneal_lr=true",
    ]


def test_the_default_spaces_are_valid_for_their_algos() -> None:
    for algo, env_id in (
        ("ppo", "Hopper-v5"),
        ("ppo", "CartPole-v1"),
        ("grpo", "HalfCheetah-v5"),
        ("grpo-step", "CartPole-v1"),
    ):
        space = tune.plan_tune(algo, env_id, 10, None, 1, None, [], None).space
        assert len(space) >= 10
    assert {
        "group_size",
        "num_groups",
        "max_episode_steps",
        "n_epochs",
        "num_minibatches",
        "learning_rate",
        "log_std_init",
        "beta",
        "clip_low",
        "clip_high",
        "advantage",
        "aggregation",
    } <= set(tune.parse_space(tune.default_space(registry.get("grpo"))[0], "grpo's space"))


def test_a_space_comes_from_the_declaration_else_the_mirrored_algos_else_the_config() -> None:
    import dataclasses

    from lab.space import SHARED_SPACE, default_space

    ppo = registry.get("ppo")
    assert yaml.safe_load(default_space(ppo)[0]) == dict(ppo.space)
    assert default_space(registry.get("sb3-ppo")) == (default_space(ppo)[0], "ppo's space")  # the presets it takes
    assert default_space(registry.get("grpo-vine"))[1] == "grpo's space"  # its base's (less what it fixes, in a plan)
    undeclared = dataclasses.replace(ppo, name="new", base="new", preset="new", space=None)
    text, source = default_space(undeclared)
    assert yaml.safe_load(text) == SHARED_SPACE and source == "new's space (derived from its config)"
    tune.parse_space(text, source)


def test_a_sqlite_storage_gets_its_folder(tmp_path: Path) -> None:
    import optuna

    url = f"sqlite:///{tmp_path}/new/folder/study.db"
    optuna.create_study(study_name="s", storage=tune.storage_for(url, tmp_path / "tune"))
    assert (tmp_path / "new" / "folder" / "study.db").is_file()


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
        ([], "n_steps: {low: 256, high: 1024, int: true}\n", "n_steps changes n_steps · n_envs"),
        ([], "n_steps: [96, 100]\n", "budget would be a multiple of 19,200"),
        (["--algo", "ppo-lambda0"], "gae_lambda: [0.9, 0.95]\n", "ppo-lambda0 fixes gae_lambda"),
        (["--trials", "0"], None, "--trials must be at least 1"),
        (["--vary", "gamma"], None, "--vary 'gamma': give KEY=RANGE"),
        (["--vary", "gamma=[]"], None, "--vary: gamma has no choices"),
        (["--vary", "gamma=[0.99, 1.5]"], None, "gamma includes 1.5, which ppo refuses"),
        (["--vary", "gama=[0.9]"], None, "gama is not a config key of ppo"),
        (["--vary", "gamma=[0.9]", "--set", "gamma=0.9"], None, "--set gamma fixes what the space tunes"),
        (["--space", "missing.yaml"], None, "no such file"),
        (["--storage", "sqlite:////dev/null/study.db"], None, "cannot open the study storage"),
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


def test_a_value_is_refused_only_if_no_other_value_of_the_space_admits_it(in_tmp: Path) -> None:
    # CartPole's preset rolls out 8 envs × 32 steps = 256: a minibatch of 512 needs the space's 64 steps.
    (in_tmp / "space.yaml").write_text("n_steps: [32, 64]\nminibatch_size: [256, 512]\n")
    plan = tune.plan_tune("ppo", "CartPole-v1", 2, 5000, 1, in_tmp / "space.yaml", [], "pairs")
    assert plan.iteration_sizes == (256, 512)
    (in_tmp / "space.yaml").write_text("n_steps: [32, 64]\nminibatch_size: [256, 1024]\n")  # 1024 > 64 × 8
    with pytest.raises(BadInput, match="minibatch_size includes 1024, which ppo refuses"):
        tune.plan_tune("ppo", "CartPole-v1", 2, 5000, 1, in_tmp / "space.yaml", [], "pairs")


def test_vary_sets_one_keys_range_and_keeps_the_rest_of_the_space(in_tmp: Path) -> None:
    shared = tune.plan_tune("grpo", "Hopper-v5", 4, None, 1, None, [], "offset")
    ranges = ("reward_offset=[0.0, 5.0]", "learning_rate={low: 1.0e-4, high: 1.0e-3}")
    varied = tune.plan_tune("grpo", "Hopper-v5", 4, None, 1, None, [], "offset", varies=ranges)
    assert varied.space["reward_offset"].choices == (0.0, 5.0)
    assert (varied.space["learning_rate"].low, varied.space["learning_rate"].log) == (1e-4, False)
    assert {k: v for k, v in varied.space.items() if k not in ("reward_offset", "learning_rate")} == {
        k: v for k, v in shared.space.items() if k not in ("reward_offset", "learning_rate")
    }
    added = tune.plan_tune("ppo", "CartPole-v1", 4, 5000, 1, None, [], "added", varies=("target_kl=[0.01, 0.02]",))
    # ppo.yaml's 17 keys, less log_std_init (CartPole's actions are discrete), plus target_kl.
    assert added.space["target_kl"].choices == (0.01, 0.02) and len(added.space) == 17
    tune.write_tune_yaml(in_tmp / "offset", varied)
    with pytest.raises(BadInput, match="with other space; use another --name"):  # a rerun must vary the same
        tune.check_tune_dir(in_tmp / "offset", shared)


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

    argv = [
        sys.executable,
        "-m",
        "lab",
        *tune_argv("killed", in_tmp / "space.yaml")[:-2],
        "--name",
        "killed",
        "--trials",
        "1",
        "--set",
        "checkpoint_interval=4096",
    ]
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
    other = tune.open_study(
        tune.plan_tune("ppo", "CartPole-v1", 9, 2048, 1, str(in_tmp / "space.yaml"), [], "b"), in_tmp / "b"
    )
    assert tune.new_trial(other, plan, "driver").params["learning_rate"] == drawn[0]


def test_a_discrete_env_does_not_search_the_sigma_its_policy_never_reads() -> None:
    # Was: CartPole studies sampled log_std_init, ranked it among the important parameters by the noise between
    # trials, and exported it into preset.yaml as tuned.
    for algo in ("ppo", "grpo"):
        discrete = tune.plan_tune(algo, "CartPole-v1", 4, 5000, 1, None, [], "discrete")
        assert "log_std_init" not in discrete.space and "log_std_init" not in discrete.space_text
        assert "learning_rate" in discrete.space and "log_std_init" not in tune.starting_points(discrete)["env"]
        continuous = tune.plan_tune(algo, "Pendulum-v1", 4, 5000, 1, None, [], "continuous")
        assert "log_std_init" in continuous.space and "log_std_init" in continuous.space_text
    # A space file of one's own is read the same way.
    Path("space.yaml").write_text("learning_rate: {low: 1.0e-4, high: 1.0e-3}\nlog_std_init: {low: -2.0, high: 0.0}\n")
    assert set(tune.plan_tune("ppo", "CartPole-v1", 4, 5000, 1, "space.yaml", [], "own").space) == {"learning_rate"}


def test_a_study_starts_from_the_env_preset_then_the_action_space_default() -> None:
    points = tune.starting_points(tune.plan_tune("ppo", "Walker2d-v5", 10, None, 1, None, [], "starts"))
    assert list(points) == ["env", "default"]
    # Walker2d's entry (its study's trial 9, annealed) against CleanRL's continuous defaults; an ent_coef of 0
    # sits outside the log range and is moved to its low end.
    assert (points["env"]["n_steps"], points["env"]["n_epochs"], points["env"]["clip_range"]) == (1024, 10, 0.3)
    assert points["env"]["anneal_lr"] is True
    assert (points["default"]["n_steps"], points["default"]["n_epochs"], points["default"]["clip_range"]) == (
        2048,
        10,
        0.2,
    )
    assert points["default"]["ent_coef"] == 1e-8
    # An env without a preset entry has one starting point: its preset is the default.
    assert list(tune.starting_points(tune.plan_tune("ppo", "Pendulum-v1", 10, None, 1, None, [], "p"))) == ["env"]


def test_a_starting_point_some_trial_already_trained_is_not_queued_again() -> None:
    import optuna

    plan = tune.plan_tune("ppo", "Walker2d-v5", 10, None, 1, None, [], "starts")
    fresh = optuna.create_study(direction="maximize")
    tune.enqueue_presets(fresh, plan)
    assert [t.user_attrs["preset"] for t in fresh.get_trials()] == ["env", "default"]
    # A study whose trial 0 trained the default as the env's preset then; since, another trial became the
    # env's preset. The default is not queued again: trial 0 trained its values.
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial(tune.starting_points(plan)["default"], user_attrs={"preset": "env"})
    trial = study.ask()
    for param in plan.space.values():
        param.suggest(trial)  # the queued values
    study.tell(trial, 1.0)
    tune.enqueue_presets(study, plan)
    assert [t.state.name for t in study.get_trials()] == ["COMPLETE"]


@pytest.mark.slow
def test_a_trial_scores_the_mean_final_return_of_its_seeds(in_tmp: Path) -> None:
    import json

    import optuna

    (in_tmp / "space.yaml").write_text(SPACE)
    assert (
        main(
            [
                "tune",
                "--algo",
                "ppo",
                "--env",
                "CartPole-v1",
                "--trials",
                "1",
                "--seeds",
                "2",
                "--total-steps",
                "4096",
                "--space",
                str(in_tmp / "space.yaml"),
                "--pruner",
                "none",
                "--name",
                "two",
                "--set",
                "eval_interval=2048",
            ]
        )
        == 0
    )
    tune_dir = in_tmp / "runs" / "tune" / "two"
    finals = [
        json.loads((tune_dir / "trial0000" / "CartPole-v1" / "ppo" / f"seed{seed}" / "summary.json").read_text())[
            "final_eval_return_mean"
        ]
        for seed in (100, 101)
    ]
    trial = optuna.load_study(study_name="two", storage=tune.storage_for(None, tune_dir)).trials[0]
    assert trial.value == pytest.approx(sum(finals) / 2)
    assert "- 2 seeds per trial: 100, 101 (a trial's score is the mean" in (tune_dir / "tune.md").read_text()
    # What the pruner was told: at each evaluation (at 2,048 and 4,096, multiples of 256), both seeds' mean.
    curve = trials.mean_curve([tune_dir / "trial0000" / "CartPole-v1" / "ppo" / f"seed{seed}" for seed in (100, 101)])
    assert trial.intermediate_values == pytest.approx(curve) and len(curve) >= 2
    # The trial's two seeds trained side by side in one process (`--stack`, default 16).
    assert "--seeds 100,101" in (tune_dir / "trial0000" / "CartPole-v1" / "ppo" / "seed100.log").read_text()
    # Trial 0 trains the env's preset: its seed 101 is `testbed train --seed 101`, bit for bit.
    single = in_tmp / "single"
    assert (
        main(
            [
                "train",
                "--algo",
                "ppo",
                "--env",
                "CartPole-v1",
                "--seed",
                "101",
                "--total-steps",
                "4096",
                "--set",
                "eval_interval=2048",
                "--run-dir",
                str(single),
            ]
        )
        == 0
    )
    trial_run = tune_dir / "trial0000" / "CartPole-v1" / "ppo" / "seed101"
    assert rundir.read_config(trial_run) == rundir.read_config(single)
    columns = ["global_step", "losses/policy_loss", "losses/value_loss", "losses/approx_kl", "eval/return_mean"]
    assert progress_values(trial_run, columns) == progress_values(single, columns)


@pytest.mark.slow
def test_a_study_in_a_database_given_by_storage(in_tmp: Path) -> None:
    import optuna

    (in_tmp / "space.yaml").write_text(SPACE)
    url = f"sqlite:///{in_tmp / 'studies.db'}"
    argv = [
        "tune",
        "--algo",
        "ppo",
        "--env",
        "CartPole-v1",
        "--trials",
        "1",
        "--total-steps",
        "2048",
        "--space",
        str(in_tmp / "space.yaml"),
        "--pruner",
        "none",
        "--name",
        "db",
        "--storage",
        url,
    ]
    assert main(argv) == 0
    assert not (in_tmp / "runs" / "tune" / "db" / "study.log").exists()
    assert [t.state.name for t in optuna.load_study(study_name="db", storage=url).trials] == ["COMPLETE"]
    assert main(["report", str(in_tmp / "runs" / "tune" / "db")]) == 0  # the report finds the study through tune.yaml


# ── what the report and the console say: seeds, budgets, values ─────────────────────────────────────


def test_values_print_to_4_significant_digits_and_seeds_with_their_count() -> None:
    from lab.document import fmt_sig
    from lab.tune_report import pairs_text, seeds_text

    assert fmt_sig(0.000123456789) == "0.0001235"
    assert (fmt_sig(1e-8), fmt_sig(0.95), fmt_sig(2.0), fmt_sig(123456.7)) == ("1e-8", "0.95", "2", "1.235e+5")
    assert pairs_text(["learning_rate=0.000123456789", "hidden_sizes=[64, 64]", "anneal_lr=true", "n_steps=512"]) == (
        "learning_rate=0.0001235 hidden_sizes=[64, 64] anneal_lr=true n_steps=512"
    )
    assert seeds_text([100]) == "1 seed per trial: 100"
    assert seeds_text([100, 101]) == "2 seeds per trial: 100, 101"
    assert seeds_text(list(range(100, 110))) == "10 seeds per trial: 100, 101, …, 109"
    plan = tune.plan_tune("ppo", "CartPole-v1", 4, 2048, 2, None, [], "seeds")
    assert plan.describe().startswith("4 trials; 2 seeds per trial: 100, 101; budget ")


def test_a_study_rounds_its_budget_up_so_that_every_trial_trains_the_same_steps(in_tmp: Path) -> None:
    (in_tmp / "space.yaml").write_text("n_steps: [256, 512, 1024]\nn_envs: [4, 8]\nlearning_rate: [1.0e-3, 3.0e-4]\n")
    # minibatch_size 64: the preset's 256 exceeds n_steps 32 · n_envs 4 (this space's smallest n_envs end).
    plan = tune.plan_tune("ppo", "CartPole-v1", 4, 10000, 1, str(in_tmp / "space.yaml"), ["minibatch_size=64"], "equal")
    # Iterations of n_steps · n_envs = 1,024 … 8,192 env steps (learning_rate does not change them): a run
    # stops at the first multiple of its own that reaches its budget: 10,240 to 16,384 for 10,000. Every trial
    # now trains ⌈10,000 / 8,192⌉ · 8,192 = 16,384, a multiple of all of them.
    assert plan.iteration_sizes == (1024, 2048, 4096, 8192)
    assert plan.steps_per_seed == 16384
    assert {cell.total_steps for cell in plan.cells(["n_steps=256", "n_envs=4"])} == {16384}
    for n_steps, n_envs, iterations in ((256, 4, 16), (1024, 8, 2), (512, 8, 4)):
        cfg = plan.config({"n_steps": n_steps, "n_envs": n_envs})
        assert (cfg.total_steps, cfg.num_iterations, cfg.num_iterations * cfg.batch_size) == (16384, iterations, 16384)
    assert "16,384 env steps per seed in every trial (--total-steps 10,000, rounded up to" in plan.describe()
    # The default space: n_steps 256 … 4,096 × the preset's 8 envs, so multiples of 32,768; one already stays.
    assert tune.plan_tune("ppo", "CartPole-v1", 4, 4096, 1, None, [], "p").steps_per_seed == 32768
    assert tune.plan_tune("ppo", "CartPole-v1", 4, 65536, 1, None, [], "p").steps_per_seed == 65536
    # GRPO's iterations vary in length: its budget stays as asked, and the report lists what each trial trained.
    grpo = tune.plan_tune("grpo", "CartPole-v1", 4, 10000, 1, None, [], "g")
    assert (grpo.iteration_sizes, grpo.steps_per_seed) == (None, 10000)


@pytest.mark.slow
def test_two_trials_of_different_iterations_train_equal_budgets_and_the_report_says_so(
    in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    # Trial 0: the env's preset, n_steps 32 × n_envs 8 = 256 env steps an iteration; trial 1: the algo's
    # discrete default, 128 × 4 = 512. Asked 1,100 steps, they used to train 5 · 256 = 1,280 and 3 · 512 = 1,536.
    (in_tmp / "space.yaml").write_text("n_steps: [32, 128]\nn_envs: [4, 8]\n")
    assert (
        main(
            [
                "tune",
                "--algo",
                "ppo",
                "--env",
                "CartPole-v1",
                "--trials",
                "2",
                "--total-steps",
                "1100",
                "--seeds",
                "1",
                "--first-seed",
                "100",
                "--space",
                str(in_tmp / "space.yaml"),
                "--pruner",
                "none",
                "--name",
                "equal",
                "--set",
                "eval_interval=0",
                "--set",
                "eval_episodes=2",
                "--set",
                "minibatch_size=64",
            ]
        )
        == 0
    )
    assert "2 trials; 1 seed per trial: 100; budget 2,048 env steps per seed in every trial" in capsys.readouterr().out
    tune_dir = in_tmp / "runs" / "tune" / "equal"
    configs, trained = [], []
    for number in (0, 1):
        run_dir = tune_dir / f"trial000{number}" / "CartPole-v1" / "ppo" / "seed100"
        configs.append((rundir.read_config(run_dir)["n_steps"], rundir.read_config(run_dir)["n_envs"]))
        trained.append(json.loads((run_dir / "summary.json").read_text())["total_steps"])
    # Sizes 32·4, 32·8, 128·4, 128·8 = 128 … 1,024: ⌈1,100 / 1,024⌉ · 1,024 = 2,048, 8 · 256 and 4 · 512.
    assert configs == [(32, 8), (128, 4)] and trained == [2048, 2048]
    report = (tune_dir / "tune.md").read_text()
    assert "- 1 seed per trial: 100 (a trial's score" in report
    assert (
        "- Budget: 2,048 env steps per seed in every trial (--total-steps 1,100, rounded up to a multiple of every "
        "iteration size n_steps · n_envs the space allows: 128, 256, 512, 1,024)"
    ) in report
    assert "| 0 | complete |" in report and report.count("| 2,048 | 2,048 |") == 2  # steps per seed, env steps
    # The study keeps each trial's cost: a report rebuilt without the trials' runs counts the same steps.
    for number in (0, 1):
        (tune_dir / f"trial000{number}").rename(in_tmp / f"elsewhere{number}")
    assert main(["report", str(tune_dir)]) == 0
    rebuilt = (tune_dir / "tune.md").read_text()
    assert rebuilt.count("| 2,048 | 2,048 |") == 2 and "pruned and failed trials included: 4,096" in rebuilt


def test_a_report_refuses_finished_trials_whose_runs_are_elsewhere_and_whose_cost_the_study_lacks(
    tmp_path: Path,
) -> None:
    import optuna

    states, x = optuna.trial.TrialState, {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}
    recorded = optuna.trial.create_trial(
        value=1.0, params={"x": 0.5}, distributions=x, user_attrs={trials.COST: [4096, 2048, 12.5]}
    )
    refused = optuna.trial.create_trial(state=states.FAIL, user_attrs={"error": "config refused: n_steps"})
    waiting = optuna.trial.create_trial(state=states.WAITING)
    older = optuna.trial.create_trial(value=2.0, params={"x": 0.1}, distributions=x)  # before costs were recorded
    for number, trial in enumerate([recorded, refused, waiting, older]):
        trial.number = number
    assert trials.trial_cost(recorded, tmp_path) == (4096, 2048, 12.5)
    assert trials.trial_cost(refused, tmp_path) == trials.trial_cost(waiting, tmp_path) == (0, 0, 0.0)
    assert trials.trial_cost(older, tmp_path) is None
    assert trials.known_costs([recorded, refused, waiting], tmp_path) == {
        0: (4096, 2048, 12.5),
        1: (0, 0, 0.0),
        2: (0, 0, 0.0),
    }
    with pytest.raises(BadInput, match=r"lacks the runs of trials 3 .*nothing was run or written"):
        trials.known_costs([recorded, older], tmp_path)


def test_the_pruner_compares_trials_at_the_eval_interval_marks_their_runs_passed() -> None:
    # eval_interval 10,000: iterations of 256 steps evaluate at 10,240 and 20,224, then the final one at 25,600,
    # past the mark 20,000 that 20,224 took; iterations of 4,096 at 12,288, 20,480 and 32,768.
    assert trials.eval_marks([10240, 20224, 25600], 10000) == [10000, 20000, 25600]
    assert trials.eval_marks([12288, 20480, 32768], 10000) == [10000, 20000, 30000]
    assert trials.eval_marks([4096, 8192], 0) == [4096, 8192]  # only final evaluations: their own steps


def contrast(colour: Any, ground: Any) -> float:
    """WCAG's contrast ratio of two colours, (L₁ + 0.05) / (L₂ + 0.05) with L the relative luminance."""
    from matplotlib.colors import to_rgb

    def luminance(rgb: Any) -> float:
        linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in to_rgb(rgb)]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    high, low = sorted((luminance(colour), luminance(ground)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_the_parallel_coordinate_plot_shows_the_score_and_the_most_important_parameters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib
    import matplotlib.collections
    import numpy as np
    import optuna

    from lab import tune_report
    from lab.tune_report import PARALLEL_PARAMS, param_importances, plot_parallel

    drawn: list[Any] = []
    save = tune_report._save
    monkeypatch.setattr(tune_report, "_save", lambda ax, out: drawn.append(ax) or save(ax, out))

    matplotlib.use("Agg")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    rng = np.random.default_rng(0)
    names = [f"param_{i:02d}" for i in range(15)]
    for _ in range(20):
        params = {name: float(rng.uniform()) for name in names}
        study.add_trial(
            optuna.trial.create_trial(
                params=params,
                distributions={n: optuna.distributions.FloatDistribution(0, 1) for n in names},
                value=10 * params["param_03"] + params["param_07"],
            )
        )
    importances, _ = param_importances(study)  # the evaluator there is: fANOVA, or PED-ANOVA without scikit-learn
    path, labels = plot_parallel(study, importances, tmp_path / "parallel.png")
    # The score, then the 6 most important parameters of 15 (Optuna draws them in name order).
    assert PARALLEL_PARAMS == 6 and labels == ["score", *sorted(list(importances)[:6])]
    assert "param_03" in labels and path.stat().st_size > 0
    assert plot_parallel(study, {}, tmp_path / "p.png")[1] == ["score", *names[:6]]  # no importances: name order
    # The title within the figure (it lost its "P"), and no trial's line faded into the ground: both ends of the
    # colour map stand out from it (Optuna's Blues ends near white: a contrast of 1.0 on white).
    ax = drawn[0]
    figure = ax.figure
    figure.canvas.draw()
    title = ax.title if ax.get_title() else ax._left_title
    box = title.get_window_extent()
    assert ax.get_title() == "" and ax.get_title(loc="left").startswith("Parallel coordinates")
    assert box.x0 >= 0 and box.x1 <= figure.bbox.width and box.y1 <= figure.bbox.height
    line_type = matplotlib.collections.LineCollection
    lines = [c for c in ax.collections if isinstance(c, line_type) and c.get_array() is not None]
    assert lines
    for end in (0.0, 1.0):
        assert contrast(lines[0].get_cmap()(end), ax.get_facecolor()) >= 2.0


def test_a_study_heartbeat_says_trials_done_running_rate_and_eta() -> None:
    from lab.trials import study_status

    # 24 trials of 2 seeds × 1,000,000 steps; 3 done (1 by an earlier run of the study, then 1 complete and 1
    # pruned), 2 running whose 4 seeds trained 250,000 steps each at 500 steps/s: left = 21 · 2 · 10⁶ −
    # 4 · 250,000 = 41,000,000 steps at 2,000 steps/s = 20,500 s = 5h41m.
    live = [(250_000, 500.0)] * 4
    assert (
        study_status(130.0, {"complete": 1, "pruned": 1}, 1, 24, 2, live, 2, 1_000_000)
        == "[2m10s] trials 3/24 done, 2 running · 2,000 steps/s · ETA 5h41m"
    )
    assert study_status(5.0, {}, 0, 4, 1, [], 1, None) == "[5s] trials 0/4 done, 1 running · steps/s n/a · ETA n/a"
