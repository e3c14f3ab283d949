"""lab/audit_gradients.py and ``testbed audit --gradients``: the files, the truth against the chain's closed form,
the run's batch size, reuse, the report, and bad settings refused before any work."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from agents.true_advantage import AuditSettings
from agents.true_gradient import GradientSettings
from lab.audit import Target, done_record, load_policy, run_audits
from lab.audit_gradients import done_gradients
from lab.cli import main
from tests.test_audit import read
from tests.test_gradient_audit import closed_form_gradient

HORIZON, SAMPLES = 6, 96
AUDIT = ["--checkpoints", "final", "--steps", "0", "--samples", str(SAMPLES), "--branches", "8", "--groups"]
AUDIT += [str(SAMPLES // 4), "--group-size", "4", "--vine-branches", "1", "--workers", "1"]
GRADIENTS = ["--gradients", "--gradient-batches", "2", "--gradient-vine", "--split-states", "8", "--split-actions"]
GRADIENTS += ["2", "--split-rollouts", "2"]


def test_a_gradient_audit_of_a_chain_run(tmp_path: Path) -> None:
    run, out = tmp_path / "run", tmp_path / "out"
    # One update of PPO's chain preset (8 envs × 128 steps): a policy that still explores, so g is not 0.
    args = ["--algo", "ppo", "--env", "testbed/Chain-v0", "--env-kwargs", f"horizon:{HORIZON}", "--total-steps", "1024"]
    assert main(["train", *args, "--set", "eval_episodes=2", "--run-dir", str(run)]) == 0
    assert main(["audit", str(run), *AUDIT, *GRADIENTS, "--out", str(out)]) == 0
    folder = out / "run" / "checkpoint"
    assert (folder / "samples.csv").exists()
    record = json.loads((folder / "gradients.json").read_text())
    # PPO's batch on the chain: n_envs 8 × n_steps 128 = 1024 steps of 6-step episodes, ⌈1024 / (4 · 6)⌉ = 43 groups
    # of 4 episodes; with --steps 0 the surrogate averages over the first steps of the 171 episodes begun.
    assert record["batch"] == {"steps": 1024, "groups": None, "group_size": 4, "mean_steps": 171, "mean_episodes": 172}
    assert record["gradients"]["split_actions"] == 2 and record["truth"]["samples"] == SAMPLES
    assert record["truth"]["env_steps"] > 0 and record["batches"]["env_steps"] > 2 * 172 * HORIZON
    # The truth agrees with the chain's closed form ∇J (first steps only) within its standard errors.
    truth = read(folder / "true_gradient.csv")
    g = torch.tensor([float(row["gradient"]) for row in truth], dtype=torch.float64)
    se = torch.tensor([float(row["standard_error"]) for row in truth], dtype=torch.float64)
    loaded = load_policy(run, "checkpoint.pt")
    expected = closed_form_gradient(loaded.audit_env, loaded.model, loaded.cfg.gamma, HORIZON)
    moving = se > 0
    assert moving.sum() >= 10 and ((g - expected)[moving] / se[moving]).abs().max() < 4
    # One row per estimator: the batches' scores, and the variance split where it applies.
    rows = {row["estimator"]: row for row in read(folder / "gradient_scores.csv")}
    assert list(rows)[-4:] == ["return", "vine", "return_state_mean", "return_critic"] and "gae(0.95)" in rows
    assert -1 <= float(rows["vine"]["cosine"]) <= 1 and float(rows["gae(0.95)"]["relative_error_se"]) >= 0
    assert rows["gae(0.95)"]["var_total"] == "" and rows["return_state_mean"]["cosine"] == ""
    assert float(rows["return"]["var_trajectory"]) == 0.0  # the chain's rollouts after (s, a) all earn alike
    report = (out / "audit.md").read_text()
    assert "Policy gradients against the true gradient" in report and "1,024 steps" in report
    assert [row["estimator"] for row in read(out / "gradient_scores.csv")] == list(rows)
    # Done with the same settings: found on disk, nothing measured; other gradient settings are another audit.
    settings = AuditSettings(samples=SAMPLES, branches=8, groups=SAMPLES // 4, group_size=4, vine_branches=1)
    settings = replace(settings, steps=(0,))
    gradients = GradientSettings(batches=2, vine=True, split_states=8, split_actions=2, split_rollouts=2)
    target = Target(run, "checkpoint.pt", folder)
    assert done_gradients(folder, settings, gradients) is not None
    assert done_gradients(folder, settings, replace(gradients, batches=3)) is None
    assert done_record(target, settings) is not None
    done = (folder / "gradients.json").stat().st_mtime_ns
    records, failures = run_audits([target], settings, workers=1, gradients=gradients)
    assert len(records) == 1 and not failures and (folder / "gradients.json").stat().st_mtime_ns == done


def test_an_algo_the_audit_does_not_know_is_refused_with_gradients(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("algo: sb3-ppo\nenv_id: testbed/Chain-v0\n")
    (run / "checkpoint.pt").write_bytes(b"")
    assert main(["audit", str(run), "--out", str(tmp_path / "out"), "--gradients"]) == 2
    assert "the audit scores the testbed's own ppo and grpo agents, not sb3-ppo" in capsys.readouterr().err
