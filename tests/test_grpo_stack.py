"""GRPO seeds side by side (``agents/grpo.py``, written once for any number of seeds): a seed's numbers are
bit-identical whatever seeds share its process, and however many, for every variant."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from agents import grpo, rundir, runlog, seeds
from agents.grpo import GRPOConfig
from lab.cli import main
from tests.conftest import (
    assert_close_progress,
    grpo_config,
    progress_values,
    read_progress,
    run_training,
    stack_dirs,
)

LOSSES = ["losses/policy_loss", "losses/entropy", "losses/approx_kl", "grpo/kl_ref", "grpo/clipfrac_low",
          "grpo/clipfrac_high", "grpo/update_kl", "grpo/epochs_run", "charts/episodic_return"]  # fmt: skip
TIMINGS = ("wall_time_s", "charts/SPS", "grpo/restore_time_s", "grpo/step_time_s")
# 6 trajectories in 4 minibatches: padded minibatches of 2 and of 1. A KL target low enough that seeds stop
# their epochs at different minibatches, and a step size that adapts.
SMALL = {"group_size": 3, "num_groups": 2, "num_minibatches": 4, "n_epochs": 3, "max_episode_steps": 60,
         "total_steps": 1500, "eval_interval": 500, "eval_episodes": 2, "kl_target": 0.002, "vine_branches": 3}  # fmt: skip
# Pendulum: continuous actions, another aggregation and a reference refreshed every iteration.
PENDULUM = {"env_id": "Pendulum-v1", "max_episode_steps": 40, "aggregation": "constant", "ref_update": "ema",
            "total_steps": 1000, "beta": 0.1, "advantage": "outcome"}  # fmt: skip


def small(seed: int, **overrides: Any) -> GRPOConfig:
    settings = {**SMALL, **overrides}
    env_id = settings.pop("env_id", "CartPole-v1")
    return grpo_config(env_id, env_id != "CartPole-v1", seed=seed, **settings)


def train_stack(tmp: Path, seeds: list[int], **overrides: Any) -> dict[int, Path]:
    """A stack of these seeds into tmp/seed<k>; returns each seed's run directory."""
    run_dirs = stack_dirs(tmp, seeds)
    grpo.train_stack([small(seed, **overrides) for seed in seeds], list(run_dirs.values()))
    return run_dirs


def losses_of(run_dir: Path) -> list[list[str]]:
    return progress_values(run_dir, LOSSES)


def parameters(run_dir: Path) -> dict[str, torch.Tensor]:
    checkpoint = runlog.load_checkpoint(run_dir, {"algo": "grpo"})
    return {**checkpoint["model"], **{f"reference.{k}": v for k, v in checkpoint["reference"].items()}}


def same_parameters(a: Path, b: Path) -> bool:
    first, second = parameters(a), parameters(b)
    return first.keys() == second.keys() and all(torch.equal(v, second[k]) for k, v in first.items())


def assert_close_losses(a: Path, b: Path, rows: int) -> None:
    assert_close_progress(a, b, LOSSES, rows, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("overrides", [{}, PENDULUM], ids=["cartpole", "pendulum"])
def test_a_seeds_numbers_do_not_depend_on_the_other_seeds_in_its_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: dict
) -> None:
    # Chunks of 8 rows: a minibatch of up to 2 × 60 steps takes 1 to 15 chunks, as many as its longest
    # seed needs, so neighbours of different episode lengths change the number of chunks.
    monkeypatch.setattr(seeds, "ROWS", 8)
    monkeypatch.setattr(grpo, "ROWS", 8)  # grpo.minibatch_loss's own name for it: its chunks must be of 8 too
    first = train_stack(tmp_path / "a", [0, 1, 2], **overrides)
    other = train_stack(tmp_path / "b", [0, 7, 2], **overrides)
    for seed in (0, 2):  # bit-identical: the neighbour's seed changed, and with it its episodes' lengths
        assert losses_of(first[seed]) == losses_of(other[seed]) and len(losses_of(first[seed])) >= 3
        assert same_parameters(first[seed], other[seed])
    assert losses_of(first[1]) != losses_of(other[7])
    epochs = {row[7] for seed in (0, 1, 2) for row in losses_of(first[seed])}
    assert len(epochs) > 1 or overrides  # CartPole's target KL stops epochs at different points
    # Without the neighbour, a smaller stack; alone, a stack of one, as a single run is: bit-identical too.
    alone = train_stack(tmp_path / "c", [0, 2], **overrides)
    single = tmp_path / "single"
    run_training(grpo, small(2, **overrides), single)
    for a, b in ((first[0], alone[0]), (first[2], alone[2]), (first[2], single)):
        assert losses_of(a) == losses_of(b) and same_parameters(a, b)
    assert json.loads((single / "summary.json").read_text())["status"] == "completed"


def rows_but_timings(run_dir: Path) -> list[dict[str, str]]:
    return [{k: v for k, v in row.items() if k not in TIMINGS} for row in read_progress(run_dir)]


@pytest.mark.parametrize("variant", [{"start_mode": "branch", "branch_max_depth": 10, "total_steps": 600},
                                     {"advantage": "vine", "vine_branches": 3, "total_steps": 2100}],
                         ids=["branch", "vine"])  # fmt: skip
def test_variants_that_act_outside_the_members_steps_are_bit_identical_alone_and_stacked(
    tmp_path: Path, variant: dict
) -> None:
    # The trunks and the vine's branches act with the seed's own network and generator, beside the batch.
    cfgs = [small(seed, **variant) for seed in (0, 5)]
    run_dirs = [tmp_path / "stack" / f"seed{cfg.seed}" for cfg in cfgs]
    for run_dir in run_dirs:
        rundir.prepare_run_dir(run_dir, False)
    grpo.train_stack(cfgs, run_dirs)
    single = tmp_path / "single"
    run_training(grpo, cfgs[1], single)
    assert rows_but_timings(run_dirs[1]) == rows_but_timings(single) and len(rows_but_timings(single)) >= 2
    assert same_parameters(run_dirs[1], single)


def test_train_seeds_for_grpo_writes_run_directories_that_eval_reads(tmp_path: Path) -> None:
    settings = [arg for key, value in SMALL.items() if key != "total_steps" for arg in ("--set", f"{key}={value}")]
    parent = tmp_path / "stack"
    assert main(["train", "--algo", "grpo", "--env", "CartPole-v1", *settings, "--seeds", "2", "--total-steps", "400",
                 "--run-dir", str(parent)]) == 0  # fmt: skip
    assert sorted(p.name for p in parent.iterdir()) == ["seed0", "seed1"]
    assert main(["eval", str(parent / "seed1"), "--episodes", "2"]) == 0
