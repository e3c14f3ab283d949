"""GRPO: the tied-group gradient, learning, branching, resume, bad input, the update's options (rounds, a floor on
log σ, the horizon-aware baseline), and seeds side by side (a seed's numbers are bit-identical whatever seeds share
its process, and however many, for every variant). (Its group advantages and aggregation are tested against
hand-computed numbers in test_advantages.py and test_losses.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import agents.grpo as grpo
from agents import advantages as adv
from agents import groups, losses, rundir, runlog, stacked
from agents.grpo import GRPOConfig
from agents.networks import Actor, NetworkSpec, StackedNetworks
from agents.rollout import Episodes
from envs import EnvOptions, make_vector
from envs.errors import BadInput
from lab.cli import main
from tests import toy_envs
from tests.conftest import (
    assert_close_progress,
    grpo_config,
    interrupt_after,
    progress_values,
    read_progress,
    run_training,
    stack_dirs,
)

toy_envs.register()


# ── the objective on a tied group ──────────────────────────────────────────────────────────────────


def tiny_batch(T: int = 5, M: int = 4) -> tuple[Actor, Episodes]:
    torch.manual_seed(0)
    actor = Actor(NetworkSpec(obs_dim=3, action_dim=2, continuous=False))
    obs = torch.randn(T, M, 3)
    with torch.no_grad():
        sample = actor.act(obs.flatten(0, 1))
    batch = Episodes(
        obs=obs,
        actions=sample.actions.view(T, M),
        log_probs=sample.log_probs.view(T, M) - 0.05,
        rewards=torch.ones(T, M),
        mask=torch.ones(T, M, dtype=torch.bool),
        terminated=torch.ones(M, dtype=torch.bool),
        truncated=torch.zeros(M, dtype=torch.bool),
        idle_steps=0,
        step_time_s=0.0,
    )
    return actor, batch


def objective(
    actor: Actor, batch: Episodes, advantages: torch.Tensor, ref_log_probs: torch.Tensor, cfg: grpo.GRPOConfig
) -> tuple[StackedNetworks, torch.Tensor, dict[str, float]]:
    """GRPO's objective (``grpo.minibatch_loss``) of the whole batch as one minibatch, for a stack of one:
    the stacked networks (whose ``flat.grad`` receives the gradient), the loss and its statistics."""
    net = StackedNetworks([actor])
    T, M = batch.mask.shape
    flat = {
        "obs": batch.obs,
        "actions": batch.actions,
        "old_log_probs": batch.log_probs,
        "advantages": advantages,
        "ref_log_probs": ref_log_probs,
    }
    flat = {name: x.reshape(1, T * M, *x.shape[2:]) for name, x in flat.items()}  # (1, T·M, …)
    mask = batch.mask.unsqueeze(0)  # (1, T, M)
    weights = losses.aggregation_weights(mask, cfg.aggregation, 500, torch.ones(1, M, dtype=torch.bool))
    picked, count = stacked.pick_steps(flat, mask, weights, torch.arange(M).unsqueeze(0), M)
    loss, sums = grpo.minibatch_loss(net, cfg, picked)
    stats = [float(sums[0, 0]), *(sums[0, 1:] / count[0]).tolist()]
    return net, loss[0], dict(zip(grpo.STATS, stats, strict=True))


def gradient(net: StackedNetworks, loss: torch.Tensor) -> torch.Tensor:
    net.flat.grad.zero_()
    loss.backward()
    return net.flat.grad.clone()


def test_tied_group_gives_zero_policy_gradient_and_only_the_kl_gradient_with_beta() -> None:
    actor, batch = tiny_batch()
    returns = adv.discounted_returns(batch.rewards, batch.mask, 1.0).view(2, 2)  # every return is 5: ties
    for aggregation in ("trajectory", "step", "constant"):
        cfg = grpo_config(beta=0.0, aggregation=aggregation, advantage="outcome")
        advantages = groups.group_advantages(cfg, batch, returns, None, H=500)
        assert torch.equal(advantages, torch.zeros(5, 4))
        net, loss, _ = objective(actor, batch, advantages, torch.zeros(5, 4), cfg)
        grad = gradient(net, loss)
        assert torch.equal(grad, torch.zeros_like(grad))

        cfg = grpo_config(beta=0.1, aggregation=aggregation, advantage="outcome")
        ref_log_probs = batch.log_probs - 0.3  # a reference policy different from π_θ
        net, loss, _ = objective(actor, batch, advantages, ref_log_probs, cfg)
        grad = gradient(net, loss)
        log_probs, _ = net.log_prob_entropy(net.policy(batch.obs.flatten(0, 1)[None]), batch.actions.flatten()[None])
        kl_only = 0.1 * losses.aggregate(
            losses.k3_kl(ref_log_probs - log_probs.view(5, 4)), batch.mask, aggregation, 500
        )
        torch.testing.assert_close(grad, gradient(net, kl_only))
        assert grad.abs().sum() > 0


def test_first_minibatch_ratio_is_one_at_collection() -> None:
    actor, batch = tiny_batch()
    batch.log_probs += 0.05  # undo the offset: π_old = π_θ
    cfg = grpo_config(beta=0.0)
    _, _, stats = objective(actor, batch, torch.randn(5, 4), batch.log_probs, cfg)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and stats["clipfrac_low"] == 0 == stats["clipfrac_high"]
    assert stats["kl_ref"] == pytest.approx(0.0, abs=1e-6)


# ── whole runs ──────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.slow
def test_cartpole_learns_and_logs_group_diagnostics(tmp_path: Path) -> None:
    summary = run_training(grpo, grpo_config(total_steps=120_000, eval_interval=0), tmp_path / "run")
    assert summary["status"] == "completed" and summary["final_eval_return_mean"] >= 300
    assert summary["parameters_actor"] == summary["parameters_reference"] == 4610
    rows = read_progress(tmp_path / "run")
    for key in (
        "grpo/frac_zero_std_groups",
        "grpo/group_return_std",
        "grpo/clipfrac_low",
        "grpo/clipfrac_high",
        "grpo/kl_ref",
        "grpo/ratio_mean",
        "grpo/episode_length_mean",
        "grpo/episode_length_min",
        "grpo/episode_length_max",
        "grpo/truncated_fraction",
        "grpo/idle_step_fraction",
        "grpo/update_kl",
        "grpo/epochs_run",
        "grpo/lr_scale",
        "grpo/restore_time_s",
        "grpo/step_time_s",
        "losses/clipfrac",
        "charts/episodic_return",
    ):
        assert rows[-1][key] != "", key
    assert all(float(r["grpo/idle_step_fraction"]) == 0.0 for r in rows)  # sync: ended members take no step
    assert float(rows[-1]["grpo/kl_ref"]) > 0  # the policy drifted from the never-refreshed reference
    # The budget counts the members' own steps: B·G members × their mean episode length, per iteration.
    steps = [int(r["global_step"]) for r in rows]
    mean_length = [float(r["grpo/episode_length_mean"]) for r in rows]
    assert steps[0] == pytest.approx(64 * mean_length[0])
    assert all(b - a == pytest.approx(64 * m) for a, b, m in zip(steps, steps[1:], mean_length[1:], strict=False))


def test_dynamic_sampling_drops_tied_groups(tmp_path: Path) -> None:
    # TwoArms episodes last one step and return 0 or 1, so many groups of G = 2 tie.
    cfg = grpo_config(
        "testbed-toy/TwoArms-v0",
        total_steps=2000,
        group_size=2,
        num_groups=8,
        dynamic_sampling=True,
        max_resample_rounds=5,
        num_minibatches=2,
        eval_interval=0,
        eval_episodes=2,
    )
    run_training(grpo, cfg, tmp_path / "run")
    rows = read_progress(tmp_path / "run")
    assert float(rows[0]["grpo/frac_zero_std_groups"]) > 0
    # Each round samples 8 groups, and collection stops once 8 informative ones are kept, or after 1 + 5 rounds: so
    # 8 · rounds − 8 are dropped (a multiple of 8, at most 40), or, the rounds run out, more than 40 of the 48.
    dropped = [float(r["grpo/dropped_groups"]) for r in rows]
    assert all(d.is_integer() and ((d % 8 == 0 and d <= 40) or 40 < d <= 48) for d in dropped), dropped
    assert sum(dropped) > 0


def test_branching_from_mid_episode_states(tmp_path: Path) -> None:
    cfg = grpo_config(total_steps=40_000, start_mode="branch", branch_max_depth=30, eval_interval=0, eval_episodes=2)
    summary = run_training(grpo, cfg, tmp_path / "run")
    assert summary["status"] == "completed"
    rows = read_progress(tmp_path / "run")
    assert all(float(r["grpo/restore_time_s"]) > 0 for r in rows)


# InvertedPendulum-v5: MuJoCo's float64 observations, whose running mean a checkpoint must not round.
@pytest.mark.slow
@pytest.mark.parametrize("env_id,continuous", [("CartPole-v1", False), ("InvertedPendulum-v5", True)])
def test_interrupted_and_resumed_run_ends_with_the_same_parameters(
    env_id: str, continuous: bool, tmp_path: Path
) -> None:
    cfg = grpo_config(
        env_id,
        continuous,
        total_steps=30_000,
        num_groups=4,
        group_size=4,
        normalize_obs=True,
        eval_interval=10_000,
        eval_episodes=2,
        checkpoint_interval=0,
    )
    run_training(grpo, cfg, tmp_path / "straight")

    with pytest.MonkeyPatch.context() as patch:
        interrupt_after(patch, groups, "episode_steps", 3)
        assert run_training(grpo, cfg, tmp_path / "resumed")["status"] == "interrupted"
    assert run_training(grpo, cfg, tmp_path / "resumed", resume=True)["status"] == "completed"
    straight = runlog.load_checkpoint(tmp_path / "straight", {"algo": "grpo"})
    resumed = runlog.load_checkpoint(tmp_path / "resumed", {"algo": "grpo"})
    assert straight["global_step"] == resumed["global_step"]
    for key in ("model", "reference"):
        for name, tensor in straight[key].items():
            assert torch.equal(tensor, resumed[key][name]), (key, name)
    steps = [int(r["global_step"]) for r in read_progress(tmp_path / "resumed")]
    assert steps == [int(r["global_step"]) for r in read_progress(tmp_path / "straight")]


def test_cli_train_and_eval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "train",
        "--algo",
        "grpo",
        "--env",
        "CartPole-v1",
        "--total-steps",
        "40000",
        "--run-dir",
        str(tmp_path / "r"),
        "--set",
        "eval_episodes=2",
        "--set",
        "advantage=rloo",
        "--set",
        "aggregation=step",
        "--set",
        "clip_high=0.28",
    ]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["algo"] == "grpo" and summary["status"] == "completed"
    assert main(["eval", str(tmp_path / "r"), "--episodes", "2"]) == 0
    assert "2 episodes" in capsys.readouterr().out


@pytest.mark.parametrize(
    "sets,message",
    [
        (["group_size=1"], "group_size (G) must be at least 2"),
        (["advantage=grpo++"], "advantage must be one of outcome, no_std, batch_std, rloo, process"),
        (["aggregation=mean"], "aggregation must be one of trajectory, step, constant"),
        (["start_mode=branch", "vectorization=async"], "start_mode=branch needs vectorization=sync"),
        (["update_rounds=0"], "update_rounds must be at least 1, got 0"),
        (["log_std_min=0.5"], "log_std_min (0.5) must not exceed log_std_init (0.0), where log σ starts"),
        (["log_std_min=-1"], "log_std_min floors the Gaussian policy's log σ, and CartPole-v1's actions are discrete"),
    ],
)
def test_bad_input(sets: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "train",
        "--algo",
        "grpo",
        "--env",
        "CartPole-v1",
        "--total-steps",
        "100000",
        "--run-dir",
        str(tmp_path / "r"),
    ]
    assert main([*argv, *[x for s in sets for x in ("--set", s)]]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_branching_an_env_that_cannot_be_restored_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "train",
        "--algo",
        "grpo",
        "--env",
        "testbed-toy/Noisy-v0",
        "--total-steps",
        "100000",
        "--set",
        "start_mode=branch",
        "--run-dir",
        str(tmp_path / "r"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "start_mode=branch" in err and "Noisy" in err
    assert not (tmp_path / "r").exists()
    with pytest.raises(BadInput):
        grpo.validate(grpo_config("testbed-toy/Noisy-v0", start_mode="branch"))


def test_env_without_a_time_limit_needs_max_episode_steps() -> None:
    with pytest.raises(BadInput, match="max_episode_steps"):
        grpo.validate(grpo_config("testbed-toy/Unlimited-v0"))
    grpo.validate(grpo_config("testbed-toy/Unlimited-v0", max_episode_steps=50, total_steps=100_000))
    assert np.isfinite(grpo.horizon(grpo_config("testbed-toy/Unlimited-v0", max_episode_steps=50)))


def test_a_budget_smaller_than_one_iteration_runs_one_and_reports_the_overshoot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "train",
        "--algo",
        "grpo",
        "--env",
        "LunarLander-v3",
        "--total-steps",
        "2000",
        "--set",
        "eval_episodes=2",
        "--run-dir",
        str(tmp_path / "r"),
    ]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    rows = read_progress(tmp_path / "r")
    assert summary["status"] == "completed" and len(rows) == 1
    assert summary["total_steps"] > 2000 == summary["requested_steps"]
    assert f"trained {summary['total_steps']} env steps, {summary['total_steps'] - 2000} past total_steps=2000" in (
        capsys.readouterr().err
    )


def test_kl_target_adapts_the_step_size_and_logs_it(tmp_path: Path) -> None:
    # A tiny target: every update overshoots twice it, so the step size shrinks and the epochs stop early (at 1e-6,
    # an update of KL 1.5e-6 lies within [target / 2, 2 · target] and keeps its step size).
    cfg = grpo_config(total_steps=6_000, kl_target=1e-8, eval_interval=0, eval_episodes=2)
    run_training(grpo, cfg, tmp_path / "small")
    rows = read_progress(tmp_path / "small")
    scales = [float(r["grpo/lr_scale"]) for r in rows]
    assert scales == pytest.approx([1.5**-k for k in range(1, len(rows) + 1)])
    assert all(float(r["grpo/epochs_run"]) == 1 for r in rows)
    # A huge one: the step size grows ×1.5 an iteration, and every epoch runs.
    cfg = grpo_config(total_steps=6_000, kl_target=10.0, eval_interval=0, eval_episodes=2)
    run_training(grpo, cfg, tmp_path / "large")
    rows = read_progress(tmp_path / "large")
    assert [float(r["grpo/lr_scale"]) for r in rows] == pytest.approx([1.5**k for k in range(1, len(rows) + 1)])
    assert all(float(r["grpo/epochs_run"]) == cfg.n_epochs and float(r["grpo/update_kl"]) > 0 for r in rows)


@pytest.mark.slow
def test_continuous_control_improves_inverted_pendulum(tmp_path: Path) -> None:
    # An untrained Gaussian policy holds the pole about 8 steps; per-step group baselines credit the
    # members that stay up longer. 20k steps of 100-step training episodes reach the time limit.
    cfg = grpo_config(
        "InvertedPendulum-v5",
        continuous=True,
        total_steps=20_000,
        max_episode_steps=100,
        group_size=8,
        num_groups=4,
        n_epochs=10,
        num_minibatches=8,
        learning_rate=1e-3,
        log_std_init=-0.5,
        beta=0.0,
        advantage="step_baseline",
        eval_interval=0,
        eval_episodes=5,
    )
    summary = run_training(grpo, cfg, tmp_path / "run")
    rows = read_progress(tmp_path / "run")
    assert float(rows[0]["charts/episodic_return"]) < 20
    assert float(rows[-1]["charts/episodic_return"]) >= 80
    assert summary["final_eval_return_mean"] >= 80  # evaluated on the full 1000-step episodes


@pytest.mark.slow
def test_alive_member_baselines_step_forward_where_the_survivor_credit_stands_still(tmp_path: Path) -> None:
    # Tightrope pays 3 a step for staying up plus the action a as progress, and a > 0.5 falls: standing
    # still earns 150 over 50 steps, the best policy 175. Counting fallen members as reward-to-go 0
    # (step_baseline) credits every survivor for outliving them, and the policy stands (145.5–150.2 over
    # seeds 0–4); comparing members only with those still up at the same step (step_alive) steps forward
    # (160.5–162.5). Same seed, same budget, same settings otherwise.
    finals = {}
    for advantage in ("step_baseline", "step_alive"):
        cfg = grpo_config(
            "testbed-toy/Tightrope-v0",
            continuous=True,
            total_steps=60_000,
            group_size=8,
            num_groups=4,
            n_epochs=10,
            num_minibatches=8,
            learning_rate=1e-3,
            log_std_init=-0.5,
            beta=0.0,
            advantage=advantage,
            env_kwargs={"alive_bonus": 3.0},
            eval_interval=0,
            eval_episodes=2,
        )
        finals[advantage] = run_training(grpo, cfg, tmp_path / advantage)["final_eval_return_mean"]
    assert finals["step_baseline"] < 152 < 157 < finals["step_alive"]


def test_a_reward_offset_trains_on_shifted_rewards_but_logs_the_env_s_own_return(tmp_path: Path) -> None:
    cfg = grpo_config(total_steps=4_000, eval_interval=0, eval_episodes=2, reward_offset=1.0)
    assert run_training(grpo, cfg, tmp_path / "run")["status"] == "completed"
    rows = read_progress(tmp_path / "run")
    returns = [float(r["charts/episodic_return"]) for r in rows if r.get("charts/episodic_return")]
    # CartPole pays 1 a step; with the offset every training reward is 0, but the logged return is the
    # env's: at least the 8 steps the fastest fall takes.
    assert returns and min(returns) >= 8.0


def test_a_floor_on_log_std_holds_through_training_and_in_the_saved_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # MountainCarContinuous from log σ = −0.5 at a large step size: unfloored, log σ falls to about −1.1 in five
    # updates; with log_std_min = −0.6 it stops at the floor instead, after every update and in the checkpoint.
    lowest: list[float] = []
    update = grpo.update

    def recorded(learner: grpo.Learner, batches: list) -> list:
        stats = update(learner, batches)
        lowest.append(float(learner.stack.net.log_std.detach().min()))
        return stats

    monkeypatch.setattr(grpo, "update", recorded)
    settings = {
        "max_episode_steps": 50,
        "group_size": 4,
        "num_groups": 2,
        "n_epochs": 4,
        "num_minibatches": 2,
        "learning_rate": 0.02,
        "log_std_init": -0.5,
        "total_steps": 2000,
        "eval_interval": 0,
        "eval_episodes": 2,
    }
    run_training(grpo, grpo_config("MountainCarContinuous-v0", True, **settings), tmp_path / "free")
    assert min(lowest) < -0.9
    lowest.clear()
    cfg = grpo_config("MountainCarContinuous-v0", True, log_std_min=-0.6, **settings)
    run_training(grpo, cfg, tmp_path / "floored")
    floor = float(torch.tensor(-0.6))  # the floor as a float32 parameter holds it
    assert len(lowest) == 5 and min(lowest) == floor
    checkpoint = runlog.load_checkpoint(tmp_path / "floored", {"algo": "grpo"})
    saved = grpo.load_policy(cfg, make_vector("MountainCarContinuous-v0", 1, EnvOptions()), checkpoint["model"])
    assert float(saved.log_std.detach().min()) >= floor and float(checkpoint["reference"]["log_std"].min()) >= floor


def test_the_horizon_baseline_gives_a_constant_reward_group_no_gradient(tmp_path: Path) -> None:
    # CartPole pays 1 a step: step_horizon absorbs it, so every advantage is 0 whatever the members' lengths, and
    # with β = 0 and no entropy bonus the policy does not move (step_baseline credits the longer-lived members).
    kl = {}
    for advantage in ("step_baseline", "step_horizon"):
        cfg = grpo_config(advantage=advantage, beta=0.0, total_steps=3000, eval_interval=0, eval_episodes=2)
        run_training(grpo, cfg, tmp_path / advantage)
        rows = read_progress(tmp_path / advantage)
        kl[advantage] = max(float(r["grpo/update_kl"]) for r in rows)
        if advantage == "step_horizon":
            assert all(float(r["losses/policy_loss"]) == 0.0 for r in rows) and len(rows) >= 2
    assert kl["step_horizon"] < 1e-9 < 1e-4 < kl["step_baseline"]


def test_update_rounds_run_their_epochs_and_move_the_policy_further(tmp_path: Path) -> None:
    # Two rounds on the same first collection: the first round is the single update's, then the clip is re-centred.
    first_rows = {}
    for rounds in (1, 2):
        cfg = grpo_config(update_rounds=rounds, n_epochs=2, total_steps=1500, eval_interval=0, eval_episodes=2)
        run_training(grpo, cfg, tmp_path / f"rounds{rounds}")
        first_rows[rounds] = read_progress(tmp_path / f"rounds{rounds}")[0]
    assert [float(first_rows[r]["grpo/epochs_run"]) for r in (1, 2)] == [2.0, 4.0]
    assert first_rows[1]["charts/episodic_return"] == first_rows[2]["charts/episodic_return"]  # the same collection
    assert float(first_rows[2]["grpo/update_kl"]) > float(first_rows[1]["grpo/update_kl"])


# ── seeds side by side: a seed's numbers whatever its stack ────────────────────────────────────────

LOSSES = [
    "losses/policy_loss",
    "losses/entropy",
    "losses/approx_kl",
    "grpo/kl_ref",
    "grpo/clipfrac_low",
    "grpo/clipfrac_high",
    "grpo/update_kl",
    "grpo/epochs_run",
    "charts/episodic_return",
]
TIMINGS = ("wall_time_s", "charts/SPS", "grpo/restore_time_s", "grpo/step_time_s")
# 6 trajectories in 4 minibatches: padded minibatches of 2 and of 1. A KL target low enough that seeds stop
# their epochs at different minibatches, and a step size that adapts.
SMALL = {
    "group_size": 3,
    "num_groups": 2,
    "num_minibatches": 4,
    "n_epochs": 3,
    "max_episode_steps": 60,
    "total_steps": 1500,
    "eval_interval": 500,
    "eval_episodes": 2,
    "kl_target": 0.002,
    "vine_branches": 3,
}
# Pendulum: continuous actions, another aggregation and a reference refreshed every iteration.
PENDULUM = {
    "env_id": "Pendulum-v1",
    "max_episode_steps": 40,
    "aggregation": "constant",
    "ref_update": "ema",
    "total_steps": 1000,
    "beta": 0.1,
    "advantage": "outcome",
}
# Pendulum with the options that act in the update: two rounds, a floor on log σ, the horizon-aware baseline.
PENDULUM_OPTIONS = {**PENDULUM, "update_rounds": 2, "log_std_min": -0.5, "advantage": "step_horizon"}


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


@pytest.mark.parametrize(
    "overrides", [{}, PENDULUM, PENDULUM_OPTIONS], ids=["cartpole", "pendulum", "pendulum-rounds-floor-horizon"]
)
def test_a_seeds_numbers_do_not_depend_on_the_other_seeds_in_its_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: dict
) -> None:
    # Chunks of 8 rows: a minibatch of up to 2 × 60 steps takes 1 to 15 chunks, as many as its longest
    # seed needs, so neighbours of different episode lengths change the number of chunks.
    monkeypatch.setattr(stacked, "ROWS", 8)
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


@pytest.mark.parametrize(
    "variant",
    [
        {"start_mode": "branch", "branch_max_depth": 10, "total_steps": 600},
        {"advantage": "vine", "vine_branches": 3, "total_steps": 2100},
    ],
    ids=["branch", "vine"],
)
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
    assert (
        main(
            [
                "train",
                "--algo",
                "grpo",
                "--env",
                "CartPole-v1",
                *settings,
                "--seeds",
                "2",
                "--total-steps",
                "400",
                "--run-dir",
                str(parent),
            ]
        )
        == 0
    )
    assert sorted(p.name for p in parent.iterdir()) == ["seed0", "seed1"]
    assert main(["eval", str(parent / "seed1"), "--episodes", "2"]) == 0
