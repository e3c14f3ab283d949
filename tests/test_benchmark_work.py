"""benchmarks/speed.py and benchmarks/stacking.py compare equal work: on each config a benchmark times, our PPO and
Stable-Baselines3's take the same gradient steps.

Each side runs as its benchmark runs it, in this process: ours through ``lab train`` with the benchmark's
arguments, SB3's through the benchmark's own script (``speed.SB3_SCRIPT``). The budget is one step past one
iteration, which both sides round up to two, as they round the benchmarks' own (50,000 steps in iterations of
1,024 are 49 iterations): the number of iterations is part of the work. Gradient steps
are counted where they happen, at the optimizer: ``SeedOptimizer.step`` for ours (one seed, so one step a call),
``torch.optim.Adam.step`` for SB3's. The counts the benchmarks report beside their times (ours from the final
checkpoint, SB3's from its script) must say the same.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from agents.optimizers import SeedOptimizer
from benchmarks import speed, stacking
from lab import cli

# Every config either benchmark times: the preset of each env, resolved as the benchmark resolves it (its own
# budget aside). The two benchmarks share CartPole's and HalfCheetah's.
CASES = {case.env_id: case for case in [*speed.CASES.values(), *stacking.CASES.values()]}
# Stacking's other configs, whose two iterations on both sides take 10-35 s on a busy 2-core machine (LunarLander's
# are 32,768 env steps and 2,048 gradient steps a side); speed.py's two, HalfCheetah's 20 epochs among them, 3-13 s.
SLOW = {"LunarLander-v3", "Ant-v5", "Humanoid-v5"}


def counted(monkeypatch: pytest.MonkeyPatch, owner: type, name: str, steps: Callable[..., int]) -> list[int]:
    """Wrap ``owner.name`` so that each call adds ``steps(*args)`` to the one-element count returned."""
    count = [0]
    method = getattr(owner, name)

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        count[0] += steps(*args, **kwargs)
        return method(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)
    return count


def ours(case: speed.Case, cfg: Any, run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int | None]:
    """Our gradient steps over ``cfg.total_steps`` as the benchmarks run ours (``lab train``, one seed): counted
    at the optimizer, and as the benchmark reads them from the final checkpoint."""
    count = counted(monkeypatch, SeedOptimizer, "step", lambda stepping: int(stepping.sum()))
    argv = speed.train_argv(dataclasses.replace(case, total_steps=cfg.total_steps), run_dir)
    assert argv == stacking.ours_argv(case, cfg.total_steps, run_dir, [speed.SEED])[3:]  # the same command in both
    assert cli.main(argv) == 0
    return count[0], speed.checkpoint_gradient_steps(run_dir)


def sb3(cfg: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[int, int]:
    """SB3's gradient steps over ``cfg.total_steps``, the benchmarks' SB3 process run here: counted at the
    optimizer, and as the script reports them."""
    count = counted(monkeypatch, torch.optim.Adam, "step", lambda *args, **kwargs: 1)
    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)  # the script's; this process keeps its own
    _, flag, script, *args = speed.sb3_argv(cfg)
    assert flag == "-c"
    monkeypatch.setattr(sys, "argv", [flag, *args])
    capsys.readouterr()
    exec(compile(script, "<speed.SB3_SCRIPT>", "exec"), {"__name__": "__main__"})  # our own script
    reported = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert reported["total_steps"] == 2 * cfg.batch_size  # two iterations
    return count[0], reported["gradient_steps"]


@pytest.mark.parametrize(
    "env_id", [pytest.param(e, marks=[pytest.mark.slow] if e in SLOW else []) for e in CASES], ids=str
)
def test_both_sides_take_the_same_gradient_steps(
    env_id: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    case = CASES[env_id]
    cfg, _ = speed.resolve(case)
    cfg = dataclasses.replace(cfg, total_steps=cfg.batch_size + 1)
    ours_counted, ours_reported = ours(case, cfg, tmp_path / "ours", monkeypatch)
    sb3_counted, sb3_reported = sb3(cfg, monkeypatch, capsys)
    # Two iterations of n_epochs passes over n_steps · n_envs samples in minibatches of minibatch_size.
    expected = 2 * cfg.n_epochs * cfg.num_minibatches
    assert (ours_counted, ours_reported) == (expected, expected), "ours"
    assert (sb3_counted, sb3_reported) == (expected, expected), (
        f"SB3 took {sb3_counted} gradient steps where ours took {ours_counted}: the benchmark times unequal work"
    )


def test_the_reports_show_the_gradient_steps_and_flag_unequal_work() -> None:
    case = speed.CASES["halfcheetah"]
    ours_steps = 3920  # 49 iterations of 20 epochs of 4 minibatches
    for sb3_steps, unequal in ((ours_steps, False), (196, True)):  # 196: one epoch an iteration
        timed = [
            speed.Timed(case.name, case.env_id, impl, 1, 30.0, 50_176, 1672.5, 25.0, 0, steps)
            for impl, steps in (("ours", ours_steps), ("sb3", sb3_steps))
        ]
        md = speed.case_markdown(speed.CaseResult(case, "n_steps=1024", 10, timed))
        assert f"| {sb3_steps:,} |" in md and ("**Unequal work**" in md) == unequal
        rows = [stacking.Row("halfcheetah", "stacked", 2, "0-1", 20.0, 0, gradient_steps=2 * ours_steps)]
        for impl, steps in (("ours", ours_steps), ("sb3", sb3_steps)):
            rows += [stacking.Row("halfcheetah", impl, 1, str(k), 15.0, 0, gradient_steps=steps) for k in range(2)]
        md = stacking.markdown(rows, "python benchmarks/stacking.py", "a machine", stacking.CASES, {"halfcheetah": 1})
        assert f"| {2 * sb3_steps:,} |" in md and ("**Unequal work**" in md) == unequal


def test_the_evaluation_cost_compares_the_same_stack_with_and_without_the_preset_s_evaluation() -> None:
    case, run_dir = stacking.CASES["cartpole"], Path("stack")
    plain = stacking.ours_argv(case, 1000, run_dir, [0, 1])
    evaluated = stacking.ours_argv(case, 1000, run_dir, [0, 1], flags=("--set", "checkpoint_interval=0"))
    assert "eval_interval=0" in plain and "eval_interval=0" not in evaluated
    at = plain.index("eval_interval=0")
    assert evaluated == plain[: at - 1] + plain[at + 1 :]  # the same process, with the preset's evaluation
    rows = [
        stacking.Row("cartpole", impl, 8, "0-7", wall, 0)
        for without, with_eval in ((60.0, 70.0), (66.0, 69.0), (70.0, 80.0))
        for impl, wall in (("stacked", without), ("stacked_eval", with_eval))
    ]
    md = stacking.markdown(
        rows, "python benchmarks/stacking.py --eval-cost 3", "a machine", stacking.CASES, {"cartpole": 1}
    )
    assert "| 2 | 66.0 | 69.0 |" in md
    assert "medians (70.0 s against 66.0 s): **1.06×**" in md  # 70 / 66
