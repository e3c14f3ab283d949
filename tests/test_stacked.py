"""Seeds trained side by side (``agents/stacked.py``, ``agents/ppo.py``, ``train --seeds``, ``--stack``): a seed's
numbers are bit-identical whatever seeds share its process, and however many."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from agents import advantages as adv
from agents import grpo, ppo, rundir, runlog
from agents.stacked import clip_grad_norms_, fixed_minibatch_slots, masked_mean
from agents.training import check_stack
from lab import bench, cells
from lab.cli import main
from tests import test_grpo as grpo_tests
from tests.conftest import (
    assert_close_progress,
    interrupt_after,
    ppo_config,
    progress_values,
    read_progress,
    run_training,
    stack_dirs,
)

LOSSES = ["losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl", "losses/clipfrac"]
# Four minibatches of a 128-sample segment, so each seed's minibatches are padded; a target KL low enough
# that seeds stop their epochs at different minibatches.
SMALL = {
    "n_envs": 2,
    "n_steps": 64,
    "minibatch_size": 32,
    "n_epochs": 3,
    "eval_interval": 256,
    "eval_episodes": 2,
    "target_kl": 0.004,
    "total_steps": 512,
}


def small(seed: int, env_id: str = "CartPole-v1", **overrides: Any) -> ppo.PPOConfig:
    return ppo_config(env_id, env_id != "CartPole-v1", **{**SMALL, "seed": seed, **overrides})


def train_stack(tmp: Path, seeds: list[int], **overrides: Any) -> dict[int, Path]:
    """A stack of these seeds into tmp/seed<k>; returns each seed's run directory."""
    run_dirs = stack_dirs(tmp, seeds)
    ppo.train_stack([small(seed, **overrides) for seed in seeds], list(run_dirs.values()))
    return run_dirs


def losses_of(run_dir: Path) -> list[list[str]]:
    return progress_values(run_dir, LOSSES)


def parameters(run_dir: Path, algo: str = "ppo") -> dict[str, torch.Tensor]:
    return runlog.load_checkpoint(run_dir, {"algo": algo})["model"]


def assert_close_losses(a: Path, b: Path, rows: int) -> None:
    assert_close_progress(a, b, LOSSES, rows, rtol=1e-4, atol=1e-6)


# ── the math, against hand-computed numbers ─────────────────────────────────────────────────────────


def test_normalize_rows_standardizes_each_row_over_its_mask() -> None:
    advantages = torch.tensor([[1.0, 2.0, 3.0, 100.0], [5.0, -7.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True, False], [True, False, False, False]])
    out = adv.normalize_rows(advantages, mask)
    # Row 0: mean 2, Bessel std 1. Row 1: one sample, only centred.
    assert torch.allclose(out[0, :3], torch.tensor([-1.0, 0.0, 1.0]), atol=1e-6)
    assert out[1, 0] == 0.0
    assert torch.allclose(adv.normalize_rows(advantages[:1, :3], mask[:1, :3]), adv.normalize(advantages[0, :3]))


def test_masked_mean_keeps_a_nan_outside_the_mask_out() -> None:
    x = torch.tensor([[1.0, 2.0, float("nan")], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert masked_mean(x, mask).tolist() == [1.5, 4.0]


@pytest.mark.parametrize("count,minibatches", [(6, 3), (5, 2), (4, 3), (127, 4), (3, 4)])
def test_fixed_minibatch_slots_split_as_tensor_split_does(count: int, minibatches: int) -> None:
    width = -(-count // minibatches) + 2  # padded wider than the longest part
    slots = fixed_minibatch_slots(count, minibatches, width)
    padded = torch.full((minibatches * width,), -1)
    padded[slots] = torch.arange(count)
    for m, part in enumerate(torch.arange(count).tensor_split(minibatches)):
        row = padded[m * width : (m + 1) * width]
        assert row[: len(part)].tolist() == part.tolist() and (row[len(part) :] == -1).all()


def test_clip_grad_norms_clips_each_seed_by_its_own_norm() -> None:
    grad = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    norms = clip_grad_norms_(grad, 1.0)
    assert torch.allclose(norms, torch.tensor([5.0, 0.5]))
    assert torch.allclose(grad, torch.tensor([[0.6, 0.8], [0.3, 0.4]]), atol=1e-6)  # row 1 is under the limit


# ── a seed's numbers do not depend on its neighbours ───────────────────────────────────────────────


@pytest.mark.parametrize(
    "overrides",
    [{}, {"env_id": "Pendulum-v1"}, {"recompute_advantages": True}],
    ids=["CartPole-v1", "Pendulum-v1", "recompute"],
)
def test_a_seeds_numbers_do_not_depend_on_the_other_seeds_in_its_stack(tmp_path: Path, overrides: dict) -> None:
    first = train_stack(tmp_path / "a", [0, 1, 2], **overrides)
    other = train_stack(tmp_path / "b", [0, 7, 2], **overrides)
    for seed in (0, 2):  # bit-identical: the neighbour's seed changed, not the stack's shapes
        assert losses_of(first[seed]) == losses_of(other[seed])
        assert all(torch.equal(v, parameters(other[seed])[k]) for k, v in parameters(first[seed]).items())
    assert losses_of(first[1]) != losses_of(other[7])
    # Without the neighbour, a smaller stack; alone, a stack of one, as a single run is: bit-identical too.
    alone = train_stack(tmp_path / "c", [0, 2], **overrides)
    single = tmp_path / "single"
    run_training(ppo, small(2, **overrides), single)
    for a, b in ((first[0], alone[0]), (first[2], alone[2]), (first[2], single)):
        assert losses_of(a) == losses_of(b) and same_parameters(a, b)
    # A seed's checkpoint holds its own weights, not its stack's: the size of a single run's.
    sizes = {(run / "checkpoint.pt").stat().st_size for run in (first[2], alone[2], single)}
    assert max(sizes) < 1.05 * min(sizes), sizes
    summary = json.loads((single / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["seed"] == 2 and summary["total_steps"] == 512


def same_parameters(a: Path, b: Path) -> bool:
    first, second = parameters(a), parameters(b)
    return first.keys() == second.keys() and all(torch.equal(v, second[k]) for k, v in first.items())


@dataclasses.dataclass(frozen=True)
class BatchedStack:
    """One algorithm's batched stack and the helpers its tests train and compare it with."""

    module: ModuleType  # ppo or grpo
    small: Callable[..., Any]  # seed → a small config
    train_stack: Callable[..., dict[int, Path]]
    losses_of: Callable[[Path], list[list[str]]]
    same_parameters: Callable[[Path, Path], bool]
    train_seeds: Callable[..., Any]  # (cfgs, run_dirs, resume): the algorithm's own stacked training


def batched_stack(algo: str) -> BatchedStack:
    if algo == "ppo":  # CartPole's native vector env: each seed has its own
        return BatchedStack(ppo, small, train_stack, losses_of, same_parameters, ppo.train_stack)
    if algo == "ppo-shared":  # Pendulum's sync vector env: the seeds share one (run_envs.open_shared_envs)
        return BatchedStack(
            ppo,
            partial(small, env_id="Pendulum-v1"),
            partial(train_stack, env_id="Pendulum-v1"),
            losses_of,
            same_parameters,
            ppo.train_stack,
        )
    return BatchedStack(
        grpo,
        grpo_tests.small,
        grpo_tests.train_stack,
        grpo_tests.losses_of,
        grpo_tests.same_parameters,
        grpo.train_stack,
    )


@pytest.mark.parametrize("algo", ["ppo", "ppo-shared", "grpo"])
def test_stacked_resume_is_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algo: str) -> None:
    case = batched_stack(algo)
    whole = case.train_stack(tmp_path / "whole", [0, 1])
    with monkeypatch.context() as patch:
        interrupt_after(patch, case.module.Learner, "collect", 3)  # Ctrl-C during the third iteration
        parts = case.train_stack(tmp_path / "parts", [0, 1])
    assert all(json.loads((d / "summary.json").read_text())["status"] == "interrupted" for d in parts.values())
    case.train_seeds([case.small(0), case.small(1)], [parts[0], parts[1]], resume=True)
    for seed in (0, 1):
        assert json.loads((parts[seed] / "summary.json").read_text())["status"] == "completed"
        assert case.losses_of(whole[seed]) == case.losses_of(parts[seed])
        assert case.same_parameters(whole[seed], parts[seed])


@pytest.mark.parametrize("algo", ["ppo", "ppo-shared", "grpo"])
def test_a_nan_in_one_seed_fails_that_seed_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algo: str) -> None:
    case = batched_stack(algo)
    clean = case.train_stack(tmp_path / "clean", [0, 1, 2])
    original, calls = case.module.update, 0

    def poisoned(learner: Any, *args: Any) -> Any:
        nonlocal calls
        calls += 1
        stats = original(learner, *args)
        if calls == 2:
            learner.stack.net.flat.data[1, 0] = float("nan")  # seed 1's first weight
        return stats

    monkeypatch.setattr(case.module, "update", poisoned)
    hit = case.train_stack(tmp_path / "hit", [0, 1, 2])
    failed = json.loads((hit[1] / "summary.json").read_text())
    assert failed["status"] == "failed" and "non-finite" in failed["error"]
    completed = json.loads((hit[0] / "summary.json").read_text())
    assert 0 < failed["total_steps"] < completed["total_steps"]  # it stopped at its second update
    for seed in (0, 2):
        assert json.loads((hit[seed] / "summary.json").read_text())["status"] == "completed"
        assert case.losses_of(hit[seed]) == case.losses_of(clean[seed])


def test_seeds_in_a_stack_must_share_their_settings() -> None:
    with pytest.raises(Exception, match="differ in learning_rate"):
        check_stack([small(0), dataclasses.replace(small(1), learning_rate=1e-2)])


# ── the command line and the bench ─────────────────────────────────────────────────────────────────


def cli_small() -> list[str]:
    return [arg for key, value in SMALL.items() if key != "total_steps" for arg in ("--set", f"{key}={value}")]


def test_train_seeds_writes_ordinary_run_directories_that_eval_and_resume_read(tmp_path: Path) -> None:
    parent = tmp_path / "stack"
    base = ["train", "--algo", "ppo", "--env", "CartPole-v1", *cli_small(), "--run-dir", str(parent)]
    assert main([*base, "--seeds", "2", "--seed", "5", "--total-steps", "256"]) == 0
    assert sorted(p.name for p in parent.iterdir()) == ["seed5", "seed6"]
    for seed in (5, 6):
        run_dir = parent / f"seed{seed}"
        assert {"config.yaml", "meta.json", "progress.csv", "checkpoint.pt", "summary.json"} <= {
            p.name for p in run_dir.iterdir()
        }
        assert rundir.read_config(run_dir)["seed"] == seed
    assert main(["eval", str(parent / "seed6"), "--episodes", "2"]) == 0
    assert main(["plot", str(parent), "--out", str(tmp_path / "curves.png")]) == 0  # both seeds' curves
    assert main([*base, "--seeds", "5,6", "--total-steps", "512", "--resume"]) == 0  # the stack, resumed
    one = ["train", "--algo", "ppo", "--env", "CartPole-v1", "--run-dir", str(parent / "seed5")]
    assert main([*one, "--total-steps", "640", "--resume"]) == 0  # one seed of it, resumed alone
    assert [int(r["global_step"]) for r in read_progress(parent / "seed5")] == [128, 256, 384, 512, 640]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--seeds", "0,x"], "--seeds takes a count"),
        (["--seeds", "0,0"], "distinct"),
        (["--seeds", "0,1", "--seed", "3"], "drop --seed"),
        (["--seeds", "2", "--algo", "sb3-ppo"], "does not support"),
    ],
)
def test_bad_seeds_are_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    algo = argv[argv.index("--algo") + 1] if "--algo" in argv else "ppo"
    argv = [a for i, a in enumerate(argv) if a != "--algo" and (i == 0 or argv[i - 1] != "--algo")]
    assert main(["train", "--algo", algo, "--env", "CartPole-v1", "--run-dir", str(tmp_path / "x"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_pack_stacks_groups_the_seeds_of_a_cell() -> None:
    grid = bench.Grid("g", ["ppo", "grpo", "sb3-ppo"], ["CartPole-v1"], list(range(5)), 512)
    stacks = cells.pack_stacks(grid.cells(), 3)
    for algo in ("ppo", "grpo"):
        seeds = [[c.seed for c in s] for s in stacks if s[0].algo == algo]
        assert seeds == [[0, 2, 4], [1, 3]]  # at most 3, near-equal
    assert all(len(s) == 1 for s in stacks if s[0].algo == "sb3-ppo")  # the reference: one seed per process
    singles = [[c.seed for c in s] for s in cells.pack_stacks(grid.cells(), 1) if s[0].algo == "ppo"]
    assert singles == [[k] for k in range(5)]


def test_a_rerun_packs_only_the_seeds_left_to_train(tmp_path: Path) -> None:
    grid = bench.Grid("g", ["ppo"], ["CartPole-v1"], list(range(8)), 512)
    assert cells.pack_pending(grid.cells(), tmp_path, 5) == ([], cells.pack_stacks(grid.cells(), 5))  # nothing ran yet
    for cell in grid.cells()[:5]:  # seeds 0-4 completed, as a rerun or --reuse-from finds them
        cell.run_dir(tmp_path).mkdir(parents=True)
        (cell.run_dir(tmp_path) / "summary.json").write_text(json.dumps({"status": "completed"}))
    done, stacks = cells.pack_pending(grid.cells(), tmp_path, 5)
    assert [c.seed for c in done] == [0, 1, 2, 3, 4]
    assert [[c.seed for c in s] for s in stacks] == [[5, 6, 7]]  # one process, not [6] and [5, 7]


def test_the_longest_stacks_start_first(tmp_path: Path) -> None:
    grid = bench.Grid("g", ["sb3-ppo", "ppo"], ["CartPole-v1"], [0, 1, 2], 512)
    _, stacks = cells.pack_pending(grid.cells(), tmp_path, 3)
    # PPO's three seeds in one process (3 × 512 steps) before SB3's one seed per process, in seed order.
    assert [(s[0].algo, [c.seed for c in s]) for s in stacks] == [
        ("ppo", [0, 1, 2]),
        ("sb3-ppo", [0]),
        ("sb3-ppo", [1]),
        ("sb3-ppo", [2]),
    ]
    longer = bench.Grid("g", ["ppo"], ["CartPole-v1"], [0], 1024)
    assert cells.longest_first([grid.cells()[:1], longer.cells()]) == [longer.cells(), grid.cells()[:1]]


def test_a_bench_trains_a_cells_seeds_in_one_process_and_reports_them(tmp_path: Path) -> None:
    overrides = [f"{key}={value}" for key, value in SMALL.items() if key != "total_steps"]
    grid = bench.Grid("stacked", ["ppo"], ["CartPole-v1"], [0, 1], 256, overrides={"ppo": overrides})
    bench_dir, outcomes = bench.run_grid(grid, 1, "local", None, root=tmp_path, stack=2)
    assert [o.status for o in outcomes] == ["completed", "completed"]
    for seed in (0, 1):
        log = (bench_dir / "CartPole-v1" / "ppo" / f"seed{seed}.log").read_text()
        assert "--seeds 0,1" in log  # one process for both
    assert (bench_dir / "report.md").exists() and "CartPole-v1" in (bench_dir / "report.md").read_text()
    # A rerun skips the finished cells.
    _, again = bench.run_grid(grid, 1, "local", None, root=tmp_path, stack=2)
    assert [o.attempts for o in again] == [0, 0]
    # Seed 1 of the bench's stack is seed 1 of `testbed train --seed 1`, bit for bit.
    single = tmp_path / "single"
    assert (
        main(
            [
                "train",
                "--algo",
                "ppo",
                "--env",
                "CartPole-v1",
                *cli_small(),
                "--seed",
                "1",
                "--total-steps",
                "256",
                "--run-dir",
                str(single),
            ]
        )
        == 0
    )
    stacked = bench_dir / "CartPole-v1" / "ppo" / "seed1"
    assert rundir.read_config(stacked) == rundir.read_config(single)
    assert losses_of(stacked) == losses_of(single) and len(losses_of(single)) == 2
    assert same_parameters(stacked, single)
