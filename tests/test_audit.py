"""lab/audit.py and ``testbed audit``: kept checkpoints, the report, bad input, and workers that change nothing."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from lab.cli import main


def train_chain(run_dir: Path, algo: str, seed: int = 0) -> None:
    assert (
        main(
            [
                "train",
                "--algo",
                algo,
                "--env",
                "testbed/Chain-v0",
                "--env-kwargs",
                "horizon:6",
                "--seed",
                str(seed),
                "--total-steps",
                "3000",
                "--set",
                "keep_checkpoints=1000",
                "--set",
                "eval_episodes=2",
                "--run-dir",
                str(run_dir),
            ]
        )
        == 0
    )


def audit(paths: list[Path], out: Path, *extra: str) -> int:
    return main(
        [
            "audit",
            *map(str, paths),
            "--samples",
            "6",
            "--branches",
            "4",
            "--groups",
            "2",
            "--group-size",
            "3",
            "--vine-branches",
            "2",
            "--out",
            str(out),
            *extra,
        ]
    )


def read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_an_audit_of_kept_and_final_checkpoints_writes_samples_scores_and_a_report(tmp_path: Path) -> None:
    train_chain(tmp_path / "runs" / "ppo", "ppo")
    train_chain(tmp_path / "runs" / "grpo", "grpo")
    assert sorted(p.name for p in (tmp_path / "runs" / "ppo").glob("checkpoint*.pt")) == [
        "checkpoint-at-1000.pt",
        "checkpoint.pt",
    ]
    assert audit([tmp_path / "runs"], tmp_path / "one", "--workers", "1") == 0
    folders = sorted(p.parent.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("audit.json"))
    assert [str(f) for f in folders] == [
        "runs/grpo/checkpoint",
        "runs/grpo/checkpoint-at-1000",
        "runs/ppo/checkpoint",
        "runs/ppo/checkpoint-at-1000",
    ]
    samples = read(tmp_path / "one" / "runs" / "ppo" / "checkpoint" / "samples.csv")
    assert len(samples) == 6 and "gae(0.95)" in samples[0] and "vine" in samples[0]
    assert "gae(0.95)" not in read(tmp_path / "one" / "runs" / "grpo" / "checkpoint" / "samples.csv")[0]
    scores = read(tmp_path / "one" / "scores.csv")
    assert {row["estimator"] for row in scores if row["algo"] == "grpo"} == {
        "outcome",
        "rloo",
        "process",
        "step_baseline",
        "step_alive",
        "step_horizon",
        "vine",
    }
    report = (tmp_path / "one" / "audit.md").read_text()
    assert "testbed/Chain-v0[horizon=6]" in report and (tmp_path / "one" / "plots" / "audit-scores.png").exists()
    # Two workers audit the same checkpoints to the same numbers.
    assert audit([tmp_path / "runs"], tmp_path / "two", "--workers", "2") == 0
    for folder in folders:
        assert read(tmp_path / "one" / folder / "samples.csv") == read(tmp_path / "two" / folder / "samples.csv")


def test_an_audit_done_is_not_redone(tmp_path: Path) -> None:
    train_chain(tmp_path / "run", "grpo")
    assert audit([tmp_path / "run"], tmp_path / "out", "--checkpoints", "final") == 0
    samples = tmp_path / "out" / "run" / "checkpoint" / "samples.csv"
    before = samples.stat().st_mtime_ns
    assert audit([tmp_path / "run"], tmp_path / "out", "--checkpoints", "final") == 0
    assert samples.stat().st_mtime_ns == before
    # An audit written before --max-branches existed ran without it: still done.
    record_path = samples.with_name("audit.json")
    record = json.loads(record_path.read_text())
    assert record["branches"] == 4
    del record["settings"]["max_branches"], record["settings"]["noise_target"]
    record_path.write_text(json.dumps(record))
    assert audit([tmp_path / "run"], tmp_path / "out", "--checkpoints", "final") == 0
    assert samples.stat().st_mtime_ns == before
    # Other settings are another audit, and the report says how far the rollouts grew.
    assert audit([tmp_path / "run"], tmp_path / "out", "--checkpoints", "final", "--max-branches", "16") == 0
    assert samples.stat().st_mtime_ns != before
    branches = json.loads(record_path.read_text())["branches"]
    assert branches in (4, 8, 12, 16)
    assert f"up to 16 (reached: {branches})" in (tmp_path / "out" / "audit.md").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--samples", "0"], "--samples must be at least 1"),
        (["--group-size", "1"], "--group-size must be at least 2"),
        (["--checkpoints", "kept"], "keep_checkpoints"),
        (["--branches", "4", "--max-branches", "6"], "--max-branches must be 0 (off) or at least twice --branches"),
        (["--gradients", "--split-actions", "1"], "--split-actions must be at least 2 for the split to identify"),
        (["--gradients", "--gradient-batches", "1"], "--gradient-batches must be at least 2"),
        (["--gradients", "--groups", "1"], "--gradients needs --groups of at least 2"),
        (["--split-states", "4", "--gradient-vine"], "--split-states, --gradient-vine apply to the gradient audit"),
    ],
)
def test_bad_audits_are_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("algo: ppo\nenv_id: testbed/Chain-v0\n")
    assert main(["audit", str(run), "--out", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_an_env_that_cannot_be_restored_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("algo: ppo\nenv_id: tests.toy_envs:testbed-toy/Noisy-v0\n")
    (run / "checkpoint.pt").write_bytes(b"")
    assert main(["audit", str(run), "--out", str(tmp_path / "out"), "--trust-env-module"]) == 2
    assert "restores states mid-episode" in capsys.readouterr().err


def test_ray_tasks_audit_to_the_same_numbers_as_local_workers(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    train_chain(tmp_path / "run", "ppo")
    assert audit([tmp_path / "run"], tmp_path / "local", "--checkpoints", "final") == 0
    try:
        assert (
            audit([tmp_path / "run"], tmp_path / "ray", "--checkpoints", "final", "--backend", "ray", "--workers", "1")
            == 0
        )
    finally:
        ray.shutdown()
    folder = Path("run") / "checkpoint"
    assert read(tmp_path / "local" / folder / "samples.csv") == read(tmp_path / "ray" / folder / "samples.csv")


def test_a_checkpoint_that_fails_is_reported_and_the_others_are_audited(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train_chain(tmp_path / "run", "grpo")
    (tmp_path / "run" / "checkpoint-at-1000.pt").write_bytes(b"not a checkpoint")
    assert audit([tmp_path / "run"], tmp_path / "out", "--workers", "1") == 1
    err = capsys.readouterr().err
    assert "checkpoint-at-1000.pt" in err and "1 of 2 checkpoints failed" in err
    assert (tmp_path / "out" / "run" / "checkpoint" / "samples.csv").exists()
    assert not (tmp_path / "out" / "run" / "checkpoint-at-1000").exists()
    assert (tmp_path / "out" / "audit.md").exists()


def test_the_heartbeat_says_how_many_audits_are_done_and_when_the_rest_will_be() -> None:
    from lab.audit import heartbeat_line

    # Audits of 60 s and 30 s done: 9 left at 45 s each, over 2 workers, is 202.5 s.
    assert heartbeat_line(70.0, 3, 12, 2, [60.0, 30.0]) == "[1m10s] audits 3/12 done · ETA 3m22s"
    assert heartbeat_line(5.0, 0, 4, 2, []) == "[5s] audits 0/4 done · ETA n/a"


def test_a_running_audit_beats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lab import audit as lab_audit

    train_chain(tmp_path / "run", "grpo")
    targets = lab_audit.plan([tmp_path / "run"], "final", tmp_path / "out")
    settings = lab_audit.AuditSettings(samples=4, branches=2, groups=2, group_size=2, vine_branches=1)
    records, failures = lab_audit.run_audits(targets, settings, workers=1, heartbeat_s=0.2)
    assert len(records) == 1 and not failures
    assert "audits 0/1 done · ETA n/a" in capsys.readouterr().out
