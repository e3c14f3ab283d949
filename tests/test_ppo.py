"""PPO end to end: rollout invariants on toy envs, determinism, learning, resume, faults."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import agents.ppo as ppo
from agents import onpolicy, runlog
from agents.advantages import gae
from agents.networks import ActorCritic, NetworkSpec
from agents.rollout import RolloutState, SegmentBuffers
from envs import EnvOptions, make_vector
from tests import toy_envs
from tests.conftest import collect_segment, interrupt_after, ppo_config, read_progress, run_training

toy_envs.register()


# ── rollout invariants ──────────────────────────────────────────────────────────────────────────────


def test_truncated_step_bootstraps_from_the_final_observation_and_autoreset_steps_are_masked() -> None:
    # ConstantReward truncates after 20 steps. With T = 25 the segment holds the truncation at t = 19
    # and the autoreset step at t = 20.
    env = make_vector("testbed-toy/ConstantReward-v0", 2, EnvOptions(vectorization="sync"))
    obs, _ = env.reset(seed=0)
    model = ActorCritic(NetworkSpec(obs_dim=1, action_dim=2, continuous=False))
    state = RolloutState(obs.astype(np.float32), np.zeros(2, dtype=bool))
    segment = collect_segment(env, model, state, SegmentBuffers(25, 2, 1, (), True))
    assert segment.truncated[19].all() and not segment.terminated.any()
    assert not segment.sample_mask[20].any() and segment.sample_mask[:20].all() and segment.sample_mask[21:].all()
    assert (segment.rewards[20] == 0).all()
    with torch.no_grad():
        v = float(model.value(torch.zeros(1, 1)))  # every observation is 0, so every value is v
    assert torch.allclose(segment.next_values[19], torch.full((2,), v))
    advantages = gae(segment.rewards, segment.values, segment.next_values, segment.terminated, segment.done, 0.9, 1.0)
    # At the truncated step: A = r + γ·V(final obs) − V(s) = 1 + 0.9 v − v; nothing from the next episode.
    assert torch.allclose(advantages[19], torch.full((2,), 1.0 - 0.1 * v), atol=1e-6)
    assert state.episode_lengths == [20, 20] and state.episode_returns == [20.0, 20.0]


def test_rollout_log_probs_equal_the_updates_so_the_first_ratio_is_one() -> None:
    env = make_vector("CartPole-v1", 4)
    obs, _ = env.reset(seed=0)
    torch.manual_seed(0)
    model = ActorCritic(NetworkSpec(obs_dim=4, action_dim=2, continuous=False))
    segment = collect_segment(
        env, model, RolloutState(obs, np.zeros(4, dtype=bool)), SegmentBuffers(16, 4, 4, (), True)
    )
    log_probs, _, values = model.evaluate(segment.obs.flatten(0, 1), segment.actions.flatten(0, 1))
    ratio = (log_probs - segment.log_probs.flatten()).exp()
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-6)
    assert torch.allclose(values, segment.values.flatten(), atol=1e-6)


def test_recomputed_targets_at_unchanged_parameters_are_the_collection_s(tmp_path: Path) -> None:
    # Two seeds side by side, each with a truncation inside the segment (ConstantReward's limit is 20 steps,
    # T = 25): recomputing V(s_0 … s_T) with the critic that collected gives its advantages and targets back,
    # the truncated step's bootstrap from its final observation included.
    cfgs = [
        ppo_config(
            "testbed-toy/ConstantReward-v0",
            seed=k,
            n_envs=2,
            n_steps=25,
            minibatch_size=25,
            vectorization="sync",
            recompute_advantages=True,
        )
        for k in (0, 1)
    ]
    learner = ppo.Learner(cfgs)
    try:
        collected = learner.collect([0, 0], [True, True])
        segment = onpolicy.join_segments([c.batch for c in collected])  # (T, S·N)
        assert segment.truncated[19].all() and segment.last_obs.shape == (1, 4, 1)
        gamma, lam = cfgs[0].gamma, cfgs[0].gae_lambda
        expected = onpolicy.gae_targets(segment, segment.values, segment.next_values, gamma, lam)
        recomputed = onpolicy.critic_targets(learner.onpolicy, segment, gamma, lam)
        for new, old in zip(recomputed, expected, strict=True):
            assert new.shape == (25, 4) and torch.allclose(new, old, atol=1e-5)
    finally:
        learner.close()


def test_recomputing_advantages_changes_the_epochs_after_the_first_only(tmp_path: Path) -> None:
    base = {
        "total_steps": 512,
        "n_envs": 2,
        "n_steps": 128,
        "minibatch_size": 64,
        "eval_interval": 0,
        "eval_episodes": 1,
    }
    rows = {}
    for epochs in (1, 4):
        for recompute in (False, True):
            run_dir = tmp_path / f"e{epochs}-{recompute}"
            run_training(
                ppo, ppo_config("CartPole-v1", n_epochs=epochs, recompute_advantages=recompute, **base), run_dir
            )
            rows[epochs, recompute] = [
                {k: v for k, v in r.items() if k.startswith("losses/")} for r in read_progress(run_dir)
            ]
    assert rows[1, False] == rows[1, True]  # one epoch: nothing to recompute
    assert rows[4, False][0] != rows[4, True][0]


def test_value_clip_max_takes_the_larger_error_only_where_clipping_bites(tmp_path: Path) -> None:
    base = {
        "total_steps": 512,
        "n_envs": 2,
        "n_steps": 128,
        "minibatch_size": 64,
        "eval_interval": 0,
        "eval_episodes": 1,
    }
    rows = {}
    for clip_range_vf in (1e6, 0.01):  # 1e6: no value moves that far, so both forms are the unclipped error
        for form in ("prediction", "max"):
            run_dir = tmp_path / f"{clip_range_vf}-{form}"
            run_training(ppo, ppo_config("CartPole-v1", clip_range_vf=clip_range_vf, value_clip=form, **base), run_dir)
            rows[clip_range_vf, form] = [float(r["losses/value_loss"]) for r in read_progress(run_dir)]
    # Equal up to rounding: the clipped prediction V_old + (V − V_old) can round otherwise than V.
    assert rows[1e6, "prediction"] == pytest.approx(rows[1e6, "max"], rel=1e-6)
    assert rows[0.01, "max"][0] > rows[0.01, "prediction"][0]  # the clipped error alone hides the larger one


def test_critic_learns_the_infinite_horizon_value_under_truncation(tmp_path: Path) -> None:
    # γ = 0.9: V = 1 / (1 − γ) = 10. Treating the time limit (20 steps) as termination would give
    # values falling from 8.8 at the start to 1 at the end, about 6 on average.
    cfg = ppo_config(
        "testbed-toy/ConstantReward-v0",
        total_steps=30_000,
        n_envs=4,
        n_steps=64,
        minibatch_size=64,
        n_epochs=4,
        gamma=0.9,
        gae_lambda=0.95,
        learning_rate=3e-3,
        anneal_lr=False,
        eval_episodes=1,
        eval_interval=0,
    )
    run_training(ppo, cfg, tmp_path / "run")
    ckpt = runlog.load_checkpoint(tmp_path / "run", {"algo": "ppo"})
    model = ActorCritic(NetworkSpec(obs_dim=1, action_dim=2, continuous=False))
    model.load_state_dict(ckpt["model"])
    with torch.no_grad():
        assert float(model.value(torch.zeros(1, 1))) == pytest.approx(10.0, rel=0.1)


def test_two_armed_bandit_is_solved(tmp_path: Path) -> None:
    cfg = ppo_config(
        "testbed-toy/TwoArms-v0",
        total_steps=4096,
        n_envs=8,
        n_steps=16,
        minibatch_size=64,
        learning_rate=1e-2,
        eval_episodes=4,
        eval_interval=0,
        ent_coef=0.0,
    )
    summary = run_training(ppo, cfg, tmp_path / "run")
    assert summary["final_eval_return_mean"] == 1.0


# ── determinism ─────────────────────────────────────────────────────────────────────────────────────


def test_same_seed_gives_identical_losses(tmp_path: Path) -> None:
    cfg = ppo_config("CartPole-v1", total_steps=2048, eval_interval=0, eval_episodes=2)
    run_training(ppo, cfg, tmp_path / "a")
    run_training(ppo, cfg, tmp_path / "b")
    keys = ["global_step", "losses/policy_loss", "losses/value_loss", "losses/approx_kl", "losses/entropy"]
    a = [[row[k] for k in keys] for row in read_progress(tmp_path / "a")]
    b = [[row[k] for k in keys] for row in read_progress(tmp_path / "b")]
    assert a == b and len(a) == 8


def test_different_seeds_differ(tmp_path: Path) -> None:
    run_training(
        ppo, ppo_config("CartPole-v1", total_steps=512, seed=1, eval_interval=0, eval_episodes=1), tmp_path / "a"
    )
    run_training(
        ppo, ppo_config("CartPole-v1", total_steps=512, seed=2, eval_interval=0, eval_episodes=1), tmp_path / "b"
    )
    assert (
        read_progress(tmp_path / "a")[0]["losses/value_loss"] != read_progress(tmp_path / "b")[0]["losses/value_loss"]
    )


# ── learning ────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.slow
def test_cartpole_learns(tmp_path: Path) -> None:
    # The RL Zoo preset on half its budget; a random policy scores about 22.
    summary = run_training(ppo, ppo_config("CartPole-v1", total_steps=50_000, eval_interval=0), tmp_path / "run")
    assert summary["status"] == "completed"
    assert summary["final_eval_return_mean"] >= 300


@pytest.mark.slow
def test_continuous_control_improves(tmp_path: Path) -> None:
    # InvertedPendulum-v5: an untrained policy balances for a few steps; the continuous default learns
    # to balance for the full 1000 steps within 15k steps (seeds 0-2 all reach 1000).
    cfg = ppo_config(
        "InvertedPendulum-v5", continuous=True, total_steps=15_360, n_steps=1024, eval_interval=1024, eval_episodes=5
    )
    run_training(ppo, cfg, tmp_path / "run")
    evals = [float(r["eval/return_mean"]) for r in read_progress(tmp_path / "run") if r["eval/return_mean"]]
    assert evals[0] < 60
    assert evals[-1] >= 500 and evals[-1] >= 10 * evals[0]


# ── checkpoints, resume, faults ─────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "env_id,continuous,overrides",
    [
        ("CartPole-v1", False, {"total_steps": 4096}),
        ("Pendulum-v1", True, {"total_steps": 2048, "n_envs": 2, "n_steps": 128, "n_epochs": 2}),
    ],
)
def test_interrupted_and_resumed_run_ends_with_the_same_parameters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env_id: str, continuous: bool, overrides: dict[str, Any]
) -> None:
    cfg = ppo_config(env_id, continuous, eval_interval=512, eval_episodes=2, checkpoint_interval=0, **overrides)
    run_training(ppo, cfg, tmp_path / "straight")

    with monkeypatch.context() as patch:
        interrupt_after(patch, onpolicy, "segment_steps", 3)
        interrupted = run_training(ppo, cfg, tmp_path / "resumed")
    assert interrupted["status"] == "interrupted"
    stopped_at = interrupted["total_steps"]
    assert 0 < stopped_at < cfg.total_steps
    assert json.loads((tmp_path / "resumed" / "summary.json").read_text())["status"] == "interrupted"
    resumed = run_training(ppo, cfg, tmp_path / "resumed", resume=True)
    assert resumed["status"] == "completed"

    straight = runlog.load_checkpoint(tmp_path / "straight", {})["model"]
    final = runlog.load_checkpoint(tmp_path / "resumed", {})["model"]
    for name, tensor in straight.items():
        assert torch.equal(tensor, final[name]), name
    assert resumed["final_eval_return_mean"] == pytest.approx(
        json.loads((tmp_path / "straight" / "summary.json").read_text())["final_eval_return_mean"]
    )
    # The CSV has every iteration exactly once, and equals the uninterrupted run's losses.
    steps = [int(r["global_step"]) for r in read_progress(tmp_path / "resumed")]
    assert steps == list(range(cfg.batch_size, cfg.num_iterations * cfg.batch_size + 1, cfg.batch_size))
    losses_of = lambda d: [r["losses/value_loss"] for r in read_progress(d)]  # noqa: E731
    assert losses_of(tmp_path / "resumed") == losses_of(tmp_path / "straight")


def test_resume_of_an_env_without_state_restores_normalizers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # LunarLanderContinuous can't be snapshotted: the run resumes with fresh episodes but the same
    # normalizer statistics, and finishes.
    cfg = ppo_config(
        "LunarLanderContinuous-v3", True, total_steps=1024, n_steps=256, n_epochs=1, eval_interval=0, eval_episodes=1
    )
    with monkeypatch.context() as patch:
        interrupt_after(patch, onpolicy, "segment_steps", 2)
        assert run_training(ppo, cfg, tmp_path / "run")["status"] == "interrupted"
    saved = runlog.load_checkpoint(tmp_path / "run", {})
    assert saved["env_state"] is None and saved["normalizers"]["obs_rms"]["count"] > 256
    assert run_training(ppo, cfg, tmp_path / "run", resume=True)["status"] == "completed"


def test_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = ppo_config("CartPole-v1", total_steps=2560, checkpoint_interval=256, eval_interval=0, eval_episodes=1)
    calls = {"n": 0}
    original = ppo.losses.value_loss

    def poisoned(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls["n"] += 1
        out = original(*args, **kwargs)
        return out * float("nan") if calls["n"] > 5 * cfg.n_epochs else out

    monkeypatch.setattr(ppo.losses, "value_loss", poisoned)
    summary = run_training(ppo, cfg, tmp_path / "run")
    assert summary["status"] == "failed" and "non-finite" in summary["error"]
    saved = runlog.load_checkpoint(tmp_path / "run", {"algo": "ppo"})
    assert saved["global_step"] == 5 * cfg.batch_size
    assert all(torch.isfinite(t).all() for t in saved["model"].values())
