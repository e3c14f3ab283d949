"""Evaluation (``agents/tracking.py``, ``rollout.evaluate_policies``): a stack's seeds due at the same step
evaluate together, one batched forward pass per step, and each gets exactly what it gets evaluated alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import envs as envs_pkg
from agents import grpo, ppo, run_envs, tracking
from agents.networks import Actor, ActorCritic, NetworkSpec
from agents.rollout import evaluate_policies, evaluate_policy
from agents.tracking import EvalSchedule, StackEvaluations
from tests import test_grpo as grpo_tests
from tests import toy_envs  # noqa: F401  registers the toy envs
from tests.conftest import ppo_config, progress_values, run_training, stack_dirs

E = 3  # eval episodes: sub-envs per seed
SEEDS = [run_envs.EVAL_SEED_BASE + i for i in range(E)]


def counted_steps(env: Any) -> list[int]:
    """Count the steps of a vector env: the list holds one entry, incremented by each ``env.step``."""
    count, step = [0], env.step

    def counting(actions: Any) -> Any:
        count[0] += 1
        return step(actions)

    env.step = counting
    return count


def tightrope_actor(a: float) -> Actor:
    """A Tightrope policy whose deterministic action is ``a`` in every state: zero head weights, bias a."""
    actor = Actor(NetworkSpec(obs_dim=1, action_dim=1, continuous=True, hidden_sizes=(4,)))
    with torch.no_grad():
        actor.head.weight.zero_()
        actor.head.bias.fill_(a)
    return actor


def test_seeds_evaluated_together_get_their_returns_alone_and_a_finished_seed_stops_stepping() -> None:
    # Tightrope pays 1 + a per step over its 50-step limit and falls at a > 0.5: standing (a = 0) returns 50,
    # stepping at a = 0.5 returns 75, and a = 0.8 falls at the first step with 1.8.
    cfg = ppo_config("tests.toy_envs:testbed-toy/Tightrope-v0", True, eval_episodes=E)
    actors = [tightrope_actor(a) for a in (0.0, 0.5, 0.8)]
    together = [run_envs.make_eval_env(cfg, E) for _ in actors]
    steps = [counted_steps(env) for env in together]
    returns = evaluate_policies(actors, together, SEEDS)
    expected = [50.0, 75.0, 1.0 + float(np.float32(0.8))]
    assert [r.tolist() for r in returns] == [[value] * E for value in expected]
    # The seed that fell took its one step; the others their 50 (the last of which ends their episodes).
    assert [count[0] for count in steps] == [50, 50, 1]
    for actor, ret in zip(actors, returns, strict=True):
        alone = run_envs.make_eval_env(cfg, E)
        np.testing.assert_array_equal(evaluate_policy(actor, alone, SEEDS), ret)
        alone.close()
    for env in together:
        env.close()


@pytest.fixture
def one_thread() -> Any:
    """One torch thread, as every run sets (``seeding.seed_everything``): the setting at which a seed's numbers are
    bit-identical whatever its stack's size; with several threads BLAS may split a batch of seeds otherwise."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_stack_evaluates_each_seed_bit_identically_to_its_own_module_alone(one_thread: None) -> None:
    # Random networks of separate seeds on CartPole, each acting on its own normalized observations: the
    # stacked forward pass gives each seed its own actions, so its episodes end where they end alone.
    cfg = ppo_config("CartPole-v1", eval_episodes=4, normalize_obs=True)
    spec = NetworkSpec(obs_dim=4, action_dim=2, continuous=False)
    models, stats = [], []
    for seed in range(3):
        torch.manual_seed(seed)
        models.append(ActorCritic(spec))
        stats.append({"obs_rms": {"mean": np.full(4, 0.1 * seed), "var": np.full(4, 1.0 + seed), "count": 10.0}})
    seeds = [run_envs.EVAL_SEED_BASE + i for i in range(4)]

    def eval_envs() -> list[Any]:
        made = [run_envs.make_eval_env(cfg, 4) for _ in models]
        for env, state in zip(made, stats, strict=True):
            envs_pkg.load_normalizer_state(env, state)
        return made

    together = tracking.evaluate(models, eval_envs(), stats)
    alone = [evaluate_policy(model, env, seeds) for model, env in zip(models, eval_envs(), strict=True)]
    for mine, own in zip(together, alone, strict=True):
        np.testing.assert_array_equal(mine, own)
    assert len({tuple(r) for r in together}) > 1  # the seeds differ, so the check compares something


def test_the_first_due_seed_evaluates_every_planned_seed_and_the_others_take_their_returns() -> None:
    calls: list[list[int]] = []

    def evaluate_seeds(ks: list[int]) -> list[np.ndarray]:
        calls.append(list(ks))
        return [np.array([float(k)]) for k in ks]

    evaluations = StackEvaluations(evaluate_seeds)
    evaluations.plan([0, 2])
    assert [evaluations.evaluate(k).tolist() for k in (0, 1, 2)] == [[0.0], [1.0], [2.0]]
    assert calls == [[0, 2], [1]]  # seed 1 was not planned: it evaluates alone
    evaluations.plan([1])
    with pytest.raises(KeyError):  # this iteration's plan holds no evaluation of seed 0's
        evaluations.returns[0]


def test_a_joint_evaluation_that_fails_leaves_each_seed_to_evaluate_alone() -> None:
    def evaluate_seeds(ks: list[int]) -> list[np.ndarray]:
        if 1 in ks:  # seed 1's policy breaks its env
            raise RuntimeError("seed 1")
        return [np.array([float(k)]) for k in ks]

    evaluations = StackEvaluations(evaluate_seeds)
    evaluations.plan([0, 1, 2])
    assert evaluations.evaluate(0).tolist() == [0.0]
    with pytest.raises(RuntimeError, match="seed 1"):
        evaluations.evaluate(1)
    assert evaluations.evaluate(2).tolist() == [2.0]


def test_a_schedule_says_when_record_evaluates() -> None:
    schedule = EvalSchedule(100, lambda: np.zeros(1), start_step=0)
    assert not schedule.due(64, final=False) and schedule.due(64, final=True) and schedule.due(128, final=False)
    schedule.maybe_run(128)
    assert not schedule.due(128, final=True) and not schedule.due(192, final=False)
    assert not EvalSchedule(0, lambda: np.zeros(1), start_step=0).due(10**9, final=False)


EVALS = ["global_step", "eval/return_mean", "eval/return_std"]
PPO_SMALL = {"n_envs": 2, "n_steps": 64, "minibatch_size": 64, "n_epochs": 2, "total_steps": 512, "eval_interval": 256}


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_a_stacks_seeds_evaluate_together_and_log_what_each_logs_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algo: str
) -> None:
    evaluated: list[int] = []  # the seeds of each batched evaluation
    original = tracking.evaluate_policies

    def recording(models: list[Any], *args: Any, **kwargs: Any) -> list[np.ndarray]:
        evaluated.append(len(models))
        return original(models, *args, **kwargs)

    monkeypatch.setattr(tracking, "evaluate_policies", recording)
    module: Any = ppo if algo == "ppo" else grpo
    if algo == "ppo":  # evaluations at 256 and at 512, the final one
        cfgs = [ppo_config("CartPole-v1", seed=seed, **PPO_SMALL) for seed in (0, 1, 2)]
    else:
        cfgs = [grpo_tests.small(seed, total_steps=1000) for seed in (0, 1, 2)]
    run_dirs = stack_dirs(tmp_path / "stack", [0, 1, 2])
    module.train_stack(cfgs, list(run_dirs.values()))
    rows = sum(len([r for r in progress_values(run_dir, EVALS) if r[1]]) for run_dir in run_dirs.values())
    # Each evaluation of each seed, once; those due at the same iteration together. PPO's seeds all take the
    # same steps, so each of its evaluations holds the 3 seeds; GRPO's reach a mark at their own iteration.
    assert rows >= 6 and sum(evaluated) == rows and evaluated[-1] == 3
    assert algo == "grpo" or evaluated == [3, 3]
    evaluated.clear()
    for cfg in cfgs:
        alone = run_training(module, cfg, tmp_path / f"alone{cfg.seed}")
        assert progress_values(run_dirs[cfg.seed], EVALS) == progress_values(tmp_path / f"alone{cfg.seed}", EVALS)
        stacked = json.loads((run_dirs[cfg.seed] / "summary.json").read_text())
        assert stacked["final_eval_return_mean"] == alone["final_eval_return_mean"]
    assert evaluated == [1] * rows
