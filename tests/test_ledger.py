"""The tuning ledger counts each algo's studies and tries per env, from the manifest's committed files."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from envs.errors import BadInput
from lab import ledger, manifest

STUDY = "testbed tune --algo {algo} --env Hopper-v5 --trials {trials} --total-steps 1000 --seeds 2 --name {name}"


def _entry(name: str, command: str, **extra: object) -> dict[str, object]:
    return {
        "name": name,
        "title": name,
        "about": "a study",
        "command": command,
        "folder": f"benchmarks/results/{name}",
        "keep": ["tune.md"],
        "page": "tune.md",
        "seeds": "100–101",
        "budget": "1,000 steps",
        "cost": "long",
        **extra,
    }


def _write(root: Path, entries: list[dict[str, object]]) -> manifest.Manifest:
    (root / "benchmarks").mkdir(exist_ok=True)
    (root / manifest.MANIFEST).write_text(yaml.safe_dump({"code_version": 1, "results": entries}))
    return manifest.load(root)


def test_studies_count_their_finished_trials_and_tries_their_runs(tmp_path: Path) -> None:
    # PPO: a study in a committed sqlite file, 2 complete + 1 pruned + 1 running of 5 planned, and a try.
    storage = "sqlite:///benchmarks/results/ppo-s/study.db"
    (tmp_path / "benchmarks/results/ppo-s").mkdir(parents=True)
    study = optuna.create_study(study_name="ppo-s", storage=f"sqlite:///{tmp_path}/benchmarks/results/ppo-s/study.db")
    for state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED):
        study.add_trial(optuna.trial.create_trial(state=state, value=1.0 if state.name == "COMPLETE" else None))
    study.ask()  # a trial still running is not counted
    assert ledger.trials_done(tmp_path, [], "other", storage) == 0  # the file holds no study of that name
    ppo = _entry(
        "ppo-s",
        STUDY.format(algo="ppo", trials=5, name="ppo-s") + f" --storage {storage}",
        tries=[{"what": "CleanRL's defaults", "runs": 2, "steps": 1000, "result": "9, 8"}],
    )
    # GRPO: a finished study known only by its kept report, and a hand sweep listed beside another result.
    grpo = _entry("grpo-s", STUDY.format(algo="grpo", trials=6, name="grpo-s"))
    (tmp_path / "benchmarks/results/grpo-s").mkdir(parents=True)
    (tmp_path / "benchmarks/results/grpo-s/tune.md").write_text("# Tuning report\n\n- Trials: 6 of 6 (6 complete)\n")
    (tmp_path / "benchmarks/results/grpo-s/tune.yaml").write_text("steps_per_seed: 1024\n")  # what each trial trained
    sweep = _entry(
        "sweep",
        "python benchmarks/sweeps.py --benches … (one per row)",
        tries=[{"what": "hand sweep", "algo": "grpo", "env": "Hopper-v5", "runs": 3, "steps": 1000}],
    )
    found = _write(tmp_path, [ppo, grpo, sweep])
    assert "- Hopper-v5: only ppo tuned here (12,000 planned, 8,000 so far)" in ledger.ledger_page(
        tmp_path, _write(tmp_path, [ppo])
    )
    found = _write(tmp_path, [ppo, grpo, sweep])
    spent = [(s.algo, s.source, s.done, s.planned, s.steps) for s in ledger.spends(tmp_path, found)]
    assert spent == [
        ("ppo", "ppo-s", 6, 10, 1000),
        ("ppo", "ppo-s", 2, 2, 1000),
        ("grpo", "grpo-s", 12, 12, 1024),
        ("grpo", "sweep", 3, 3, 1000),
    ]
    page = ledger.ledger_page(tmp_path, found)
    # PPO: (6 + 2) runs so far, (10 + 2) planned, of 1,000 steps; GRPO: 12 runs of 1,024 and 3 of 1,000.
    assert "| Hopper-v5 | ppo | [ppo-s](ppo-s.md): study, 5 trials × 2 seeds, 6/10 runs of 1,000 steps<br>" in page
    assert "- Hopper-v5: planned GRPO 3,288 more (PPO 12,000, GRPO 15,288); so far PPO 8,000, GRPO 15,288." in page
    ppo_study = STUDY.format(algo="ppo", trials=5, name="ppo-s") + f" --storage {storage}"
    found = _write(
        tmp_path,
        [
            _entry("ppo-s", ppo_study, tries=[{"what": "x", "runs": 5, "steps": 1_000_000}]),
            _entry(
                "grpo-s",
                STUDY.format(algo="grpo", trials=6, name="grpo-s"),
                tries=[{"what": "y", "runs": 3, "steps": 1_000_000}],
            ),
        ],
    )
    # PPO 6 × 1,000 + 5e6 = 5.006M so far; GRPO 12 × 1,024 + 3e6 = 3.012M.
    assert (
        "- Hopper-v5: planned PPO 2.0M more (PPO 5.0M, GRPO 3.0M); so far PPO 5.0M, GRPO 3.0M."
        in ledger.ledger_page(tmp_path, found)
    )


@pytest.mark.parametrize(
    ("tried", "command", "message"),
    [
        ({"what": "x", "runs": 2}, STUDY, "a mapping with what, runs and steps"),
        ({"what": "x", "runs": 2, "steps": 10, "seed": 3}, STUDY, "a mapping with what, runs and steps"),
        ({"what": "x", "runs": 0, "steps": 10}, STUDY, "positive whole numbers"),
        ({"what": "x", "runs": 2, "steps": "1e6"}, STUDY, "positive whole numbers"),
        ({"what": "x", "runs": 2, "steps": 10}, "python benchmarks/sweeps.py", "names its algo and env"),
    ],
)
def test_a_malformed_try_is_refused_with_how_to_write_it(
    tried: dict[str, object], command: str, message: str, tmp_path: Path
) -> None:
    with pytest.raises(BadInput, match=message):
        _write(tmp_path, [_entry("s", command.format(algo="ppo", trials=2, name="s"), tries=[tried])])


def test_tries_survive_the_manifest_being_written_back(tmp_path: Path) -> None:
    tried = {"what": "Tianshou's settings", "runs": 2, "steps": 1_000_000, "result": "641.9, 614.3"}
    found = _write(tmp_path, [_entry("s", STUDY.format(algo="ppo", trials=2, name="s"), tries=[tried])])
    manifest.save(tmp_path, found)
    assert manifest.load(tmp_path).entry("s").tries == (tried,)


def test_a_study_command_that_does_not_parse_is_named_in_the_error(tmp_path: Path) -> None:
    broken = _write(tmp_path, [_entry("s", STUDY.format(algo="ppo", trials=2, name="s") + " --trails 3")])
    with pytest.raises(BadInput, match=r"entry 's'.*unrecognized arguments: --trails 3"):
        ledger.spends(tmp_path, broken)


def test_failed_trials_count_refused_ones_do_not_and_a_stopped_study_plans_what_it_ran(tmp_path: Path) -> None:
    storage = "sqlite:///benchmarks/results/s/study.db"
    (tmp_path / "benchmarks/results/s").mkdir(parents=True)
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path}/benchmarks/results/s/study.db")
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, value=1.0))
    study.add_trial(  # it trained until then
        optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs={"error": "the run diverged"})
    )
    study.add_trial(  # it never trained
        optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs={"error": "config refused: n_steps"})
    )
    command = STUDY.format(algo="ppo", trials=6, name="s") + f" --storage {storage}"
    found = _write(tmp_path, [_entry("s", command)])
    assert [(s.done, s.planned, s.so_far) for s in ledger.spends(tmp_path, found)] == [(4, 12, 4000)]  # 2 trials
    # The kept report counts the failed trial at the steps it reached: 2 × 1,000 + 2 × 300.
    (tmp_path / "benchmarks/results/s/tune.md").write_text(
        "- Trials: 3 of 6 (1 complete, 2 fail)\n- Env steps spent by the whole study, pruned and failed trials "
        "included: 2,600\n"
    )
    assert [(s.so_far, s.in_all) for s in ledger.spends(tmp_path, found)] == [(2600, 12000)]
    assert "study, 6 trials × 2 seeds, 4/12 runs of 1,000 steps (2,600 spent) | 2,600 | 12,000 |" in ledger.ledger_page(
        tmp_path, found
    )
    stopped = _write(tmp_path, [_entry("s", command, stopped="its trials observed what the presets no longer do.")])
    assert [(s.done, s.planned, s.what, s.in_all) for s in ledger.spends(tmp_path, stopped)] == [
        (4, 4, "study, 6 trials × 2 seeds, stopped at 2", 2600)  # it plans what it spent
    ]
    (tmp_path / "benchmarks/results/s/tune.md").unlink()
    assert "- Hopper-v5: only ppo tuned here (4,000 planned, 4,000 so far)" in ledger.ledger_page(tmp_path, stopped)
    # Running it on would resume trials that no longer match: refused by name, passed over by --all and --cheap.
    refusal = r"s is stopped in .* \(.*its trials observed what the presets no longer do\). Its command would go on"
    with pytest.raises(BadInput, match=refusal + " from there.*delete its `stopped` key"):
        manifest.select(stopped, ["s"], False, False)
    assert manifest.select(stopped, [], True, False) == [] == manifest.select(stopped, [], False, True)
    manifest.save(tmp_path, stopped)
    assert manifest.load(tmp_path).entry("s").stopped == "its trials observed what the presets no longer do."
    with pytest.raises(BadInput, match="has stopped True; give the reason"):
        _write(tmp_path, [_entry("s", command, stopped=True)])


def test_a_study_known_by_its_report_counts_the_trials_that_ended_not_one_still_running(tmp_path: Path) -> None:
    entry = manifest.Entry("r", "r", "r", "testbed tune …", "benchmarks/results/r", (), "", "", "long")
    (tmp_path / "benchmarks/results/r").mkdir(parents=True)
    report = tmp_path / "benchmarks/results/r/tune.md"
    report.write_text("- Trials: 5 of 8 (2 complete, 1 pruned, 1 fail, 1 running)\n")
    assert ledger.trials_done(tmp_path, ledger.report_lines(tmp_path, entry), "r", None) == 4
    report.unlink()
    assert ledger.trials_done(tmp_path, ledger.report_lines(tmp_path, entry), "r", None) == 0  # no report yet
