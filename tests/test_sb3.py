"""The Stable-Baselines3 reference run: argument mapping, run directory, normalization, signals, resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
from torch import nn

from agents import ppo, run_envs, runlog, sb3, tracking
from agents.onpolicy import Segment
from agents.ppo import TAGS
from agents.seeding import generator_seeds
from envs import BadInput, normalizer_state
from tests.conftest import interrupt_after, ppo_config, read_progress, run_training

SUMMARY_KEYS = {
    "algo",
    "env_id",
    "seed",
    "status",
    "total_steps",
    "wall_time_s",
    "sps",
    "final_eval_return_mean",
    "final_eval_return_std",
    "final_eval_episodes",
    "eval_convention",
    "error",
}


def steps_of(run_dir: Path) -> list[int]:
    return [int(row["global_step"]) for row in read_progress(run_dir)]


# ── our config as SB3's arguments ───────────────────────────────────────────────────────────────────


def test_cartpole_preset_maps_to_sb3_arguments_with_linear_schedules() -> None:
    args = sb3.sb3_arguments(ppo_config("CartPole-v1"))  # continuous looked up from the env id
    expected = {
        "n_steps": 32,
        "batch_size": 256,
        "n_epochs": 20,
        "gamma": 0.98,
        "gae_lambda": 0.8,
        "clip_range_vf": None,
        "ent_coef": 0.0,
        "vf_coef": 0.5,
        "max_grad_norm": 0.5,
        "target_kl": None,
        "normalize_advantage": True,
        "seed": generator_seeds(0)[2],
        "device": "cpu",
    }
    assert {k: args[k] for k in expected} == expected
    # Annealed: value = progress_remaining · start, as SB3 (and the zoo's lin_ schedules) compute it.
    assert args["learning_rate"](1.0) == pytest.approx(1e-3) and args["learning_rate"](0.5) == pytest.approx(5e-4)
    assert args["clip_range"](1.0) == pytest.approx(0.2) and args["clip_range"](0.5) == pytest.approx(0.1)
    assert args["policy_kwargs"] == {
        "net_arch": {"pi": [64, 64], "vf": [64, 64]},
        "activation_fn": nn.Tanh,
        "ortho_init": True,
        "share_features_extractor": False,
    }


def test_halfcheetah_preset_maps_to_constant_values_and_the_continuous_policy() -> None:
    args = sb3.sb3_arguments(ppo_config("HalfCheetah-v5", continuous=True))
    # n_epochs 1: the preset recomputes advantages, so Learner.learn calls train() once per epoch (20).
    expected = {
        "n_steps": 1024,
        "batch_size": 256,
        "n_epochs": 1,
        "gamma": 0.99,
        "gae_lambda": 0.92,
        "learning_rate": 6.626235648340379e-05,
        "clip_range": 0.2,
        "ent_coef": 2.532299819667241e-08,
        "vf_coef": 0.9008510636587208,
        "max_grad_norm": 0.5,
        "normalize_advantage": False,
    }
    assert {k: args[k] for k in expected} == expected
    assert args["policy_kwargs"] == {
        "net_arch": {"pi": [256, 256], "vf": [256, 256]},
        "activation_fn": nn.ReLU,
        "ortho_init": False,
        "share_features_extractor": False,
        "log_std_init": -0.9666898400402343,
    }


def test_make_sb3_env_normalizes_as_our_factory() -> None:
    cfg = ppo_config("Pendulum-v1", continuous=True, n_envs=2)
    env = sb3.make_sb3_env(cfg)
    assert isinstance(env, VecNormalize) and isinstance(env.venv, DummyVecEnv) and env.num_envs == 2
    assert env.norm_obs and env.norm_reward and env.clip_obs == 10 and env.clip_reward == 10 and env.gamma == 0.99
    env.close()
    plain = sb3.make_sb3_env(ppo_config("CartPole-v1"))
    assert isinstance(plain, DummyVecEnv) and sb3.normalizer_state(plain) == {}
    plain.close()


def test_what_sb3_cannot_run_is_refused_before_any_work() -> None:
    with pytest.raises(BadInput, match="shared_trunk"):
        sb3.sb3_arguments(ppo_config("CartPole-v1", shared_trunk=True), continuous=False)
    with pytest.raises(BadInput, match="shared_trunk"):
        sb3.validate(ppo_config("CartPole-v1", shared_trunk=True))
    # Our eval envs one-hot a Discrete observation, which SB3's policy would one-hot again.
    with pytest.raises(BadInput, match="flat Box observations"):
        sb3.validate(ppo_config("FrozenLake-v1"))
    with pytest.raises(BadInput, match="reward_offset"):
        sb3.validate(ppo_config("CartPole-v1", reward_offset=1.0))
    with pytest.raises(BadInput, match="use value_clip=prediction"):
        sb3.validate(ppo_config("CartPole-v1", clip_range_vf=0.2, value_clip="max"))
    with pytest.raises(BadInput, match="drop target_kl or recompute_advantages"):
        sb3.validate(ppo_config("CartPole-v1", target_kl=0.02, recompute_advantages=True))


def test_recomputed_advantages_are_sb3s_own_under_the_same_critic_and_follow_a_trained_one() -> None:
    cfg = ppo_config(
        "Pendulum-v1",
        continuous=True,
        n_envs=2,
        n_steps=16,
        minibatch_size=8,
        n_epochs=3,
        recompute_advantages=True,
        total_steps=64,
    )
    learner = sb3.Learner([cfg])
    try:
        learner.collect([0], [True])
        buffer = learner.model.rollout_buffer
        advantages, returns, values = buffer.advantages.copy(), buffer.returns.copy(), buffer.values.copy()  # (T, N)
        list(buffer.get(8))  # flattens the buffer to (N·T, ...), as train() does
        sb3.recompute_advantages(learner.model)  # the critic has not changed: SB3's own numbers again
        assert buffer.advantages.shape == (16, 2) and not buffer.generator_ready
        np.testing.assert_allclose(buffer.advantages, advantages, atol=1e-5)
        np.testing.assert_allclose(buffer.returns, returns, atol=1e-5)
        np.testing.assert_array_equal(buffer.values, values)

        learner.learn([None], [0], [1.0], [cfg.learning_rate], [True])
        assert learner.model._n_updates == 3  # one train() of one epoch per epoch
        flat = buffer.swap_and_flatten
        # The last epoch trained on targets of the critic that two epochs had moved; the value clip's old
        # values are still the collection's.
        np.testing.assert_array_equal(buffer.values, flat(values))
        assert not np.allclose(buffer.advantages, flat(advantages), atol=1e-4)
    finally:
        learner.close()


# SB3's parameter names → ours (agents.networks.ActorCritic), for two hidden layers.
SB3_NAMES = {
    "mlp_extractor.policy_net.0": "actor.trunk.0",
    "mlp_extractor.policy_net.2": "actor.trunk.2",
    "action_net": "actor.head",
    "log_std": "actor.log_std",
    "mlp_extractor.value_net.0": "critic_trunk.0",
    "mlp_extractor.value_net.2": "critic_trunk.2",
    "value_net": "critic_head",
}


def as_tensor(x: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(np.array(x), dtype=torch.float32)


def ours_of(sb3_name: str) -> str:
    layer, _, kind = sb3_name.rpartition(".")
    return SB3_NAMES[sb3_name] if sb3_name in SB3_NAMES else f"{SB3_NAMES[layer]}.{kind}"


def sb3_rollout_into(reference: sb3.Learner, ours: Any, cfg: Any) -> tuple[Segment, Any, dict[str, nn.Parameter]]:
    """SB3's rollout of one iteration as our Segment (T, N), and SB3's weights and learning rate in ours: the
    same batch from the same weights, for comparing one update. Returns the segment, SB3's rollout buffer and
    our parameters by name."""
    reference.collect([0], [True])
    buffer = reference.model.rollout_buffer
    T, N = cfg.n_steps, cfg.n_envs
    segment = Segment(
        obs=as_tensor(buffer.observations),
        actions=as_tensor(buffer.actions),
        log_probs=as_tensor(buffer.log_probs),
        values=as_tensor(buffer.values),
        next_values=torch.zeros(T, N),
        rewards=as_tensor(buffer.rewards),
        terminated=torch.zeros(T, N, dtype=torch.bool),
        truncated=torch.zeros(T, N, dtype=torch.bool),
        sample_mask=torch.ones(T, N, dtype=torch.bool),
        last_obs=torch.zeros(1, N, buffer.obs_shape[0]),
    )
    parameters = dict(ours.trainees[0].model.named_parameters())
    with torch.no_grad():
        for name, weight in reference.model.policy.state_dict().items():
            parameters[ours_of(name)].copy_(weight)
    ours.stack.set_learning_rates([cfg.learning_rate])
    return segment, buffer, parameters


@pytest.mark.parametrize(
    "overrides",
    [
        {"ent_coef": 0.01, "clip_range_vf": 0.2},
        {
            "hidden_sizes": (32, 32),
            "activation": "relu",
            "ortho_init": False,
            "log_std_init": -0.9,
            "normalize_advantage": False,
            "vf_coef": 0.437,
            "max_grad_norm": 0.8,
            "learning_rate": 1e-3,
        },
    ],
)
def test_our_update_is_sb3s_train_on_the_same_batch_from_the_same_weights(overrides: dict[str, Any]) -> None:
    """Our PPO's K epochs (``ppo.update``: the losses, per-minibatch advantage normalization, the global
    gradient-norm clip, Adam with ε = 1e-5) move the weights as SB3's ``train()`` does, given SB3's rollout
    and weights. One minibatch an epoch, so that the order of the samples (each library shuffles with its
    own generator) only reorders sums."""
    cfg = ppo_config("Pendulum-v1", continuous=True, n_envs=2, n_steps=64, minibatch_size=128, n_epochs=3, **overrides)
    reference, ours = sb3.Learner([cfg]), ppo.Learner([cfg])
    try:
        segment, buffer, parameters = sb3_rollout_into(reference, ours, cfg)
        ppo.update(
            ours,
            segment,
            as_tensor(buffer.advantages),
            as_tensor(buffer.returns),
            torch.tensor([[cfg.clip_range]]),
            torch.tensor([True]),
        )
        before = {name: weight.clone() for name, weight in reference.model.policy.state_dict().items()}
        reference.model.train()
        for name, weight in reference.model.policy.state_dict().items():
            assert not torch.equal(weight, before[name]), f"{name} should have moved"
            torch.testing.assert_close(parameters[ours_of(name)].detach(), weight, atol=1e-6, rtol=1e-5)
    finally:
        reference.close()
        ours.close()


# ── short real runs ─────────────────────────────────────────────────────────────────────────────────


def test_cartpole_run_writes_our_run_directory(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    cfg = ppo_config("CartPole-v1", total_steps=2048, eval_episodes=2, eval_interval=1024)
    summary = run_training(sb3, cfg, run_dir)

    assert summary["status"] == "completed" and summary["algo"] == "sb3-ppo" and summary["total_steps"] == 2048
    assert set(summary) >= SUMMARY_KEYS and summary["final_eval_episodes"] == 2
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    rows = read_progress(run_dir)
    assert list(rows[0]) == ["global_step", "wall_time_s", *TAGS]
    assert steps_of(run_dir) == list(range(256, 2049, 256))  # one row per rollout of 8 envs × 32 steps
    assert all(rows[0][f"losses/{k}"] != "" for k in ("policy_loss", "value_loss", "entropy", "approx_kl"))
    assert 0 < float(rows[0]["losses/entropy"]) <= np.log(2)  # SB3's entropy loss, sign flipped
    # The row at step S holds the update made on the rollout ending at S: its learning rate is the
    # schedule's value after S steps, lr · (1 − S / total).
    assert float(rows[2]["charts/learning_rate"]) == pytest.approx(1e-3 * (1 - 768 / 2048))
    assert [i for i, r in enumerate(rows) if r["eval/return_mean"]] == [3, 7]  # eval_interval 1024

    events = EventAccumulator(str(run_dir))
    events.Reload()
    assert set(TAGS) <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("losses/value_loss")] == list(range(256, 2049, 256))

    ckpt = runlog.load_checkpoint(run_dir, {"algo": "sb3-ppo", "env_id": "CartPole-v1"})
    assert ckpt["global_step"] == 2048 and ckpt["iteration"] == 8 and ckpt["normalizers"] == {}
    assert {"model", "rng", "wall_time_s"} <= set(ckpt)
    # The checkpoint's policy, rebuilt without PPO (as `testbed eval` would), plays the final evaluation again.
    policy = sb3.load_policy(cfg, ckpt["model"])
    eval_env = run_envs.make_eval_env(cfg, cfg.eval_episodes)
    seeds = [run_envs.EVAL_SEED_BASE + i for i in range(cfg.eval_episodes)]
    returns = tracking.evaluate_policy(policy, eval_env, seeds, deterministic=True)
    assert returns.mean() == pytest.approx(summary["final_eval_return_mean"])
    eval_env.close()


def test_same_seed_gives_identical_losses(tmp_path: Path) -> None:
    cfg = ppo_config("CartPole-v1", total_steps=512, eval_interval=0, eval_episodes=1)
    run_training(sb3, cfg, tmp_path / "a")
    run_training(sb3, cfg, tmp_path / "b")
    keys = ["global_step", "losses/policy_loss", "losses/value_loss", "losses/approx_kl", "charts/episodic_return"]
    a = [[row[k] for k in keys] for row in read_progress(tmp_path / "a")]
    assert a == [[row[k] for k in keys] for row in read_progress(tmp_path / "b")] and len(a) == 2


def test_normalized_pendulum_run_evaluates_with_vecnormalize_statistics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, Any]] = []
    original = tracking.evaluate_policy

    def recording(model: Any, env: Any, *args: Any, **kwargs: Any) -> np.ndarray:
        seen.append(normalizer_state(env))
        return original(model, env, *args, **kwargs)

    monkeypatch.setattr(tracking, "evaluate_policy", recording)
    cfg = ppo_config(
        "Pendulum-v1", continuous=True, total_steps=512, n_steps=256, n_epochs=2, eval_episodes=2, eval_interval=256
    )
    summary = run_training(sb3, cfg, tmp_path / "run")
    assert summary["status"] == "completed" and np.isfinite(summary["final_eval_return_mean"])

    saved = runlog.load_checkpoint(tmp_path / "run", {"algo": "sb3-ppo"})["normalizers"]
    assert set(saved) == {"obs_rms", "return_rms"} and saved["obs_rms"]["count"] > 512
    # Evaluations at 256 and 512 (the final one reuses 512's): the eval env held the training statistics
    # of that moment, observations only, and at the end those saved in the checkpoint (to float32: gymnasium's
    # NormalizeObservation keeps its statistics in the observation space's dtype, SB3 in float64).
    assert len(seen) == 2 and all(set(s) == {"obs_rms"} for s in seen)
    assert seen[0]["obs_rms"]["count"] < seen[1]["obs_rms"]["count"] == saved["obs_rms"]["count"]
    np.testing.assert_allclose(seen[1]["obs_rms"]["mean"], saved["obs_rms"]["mean"], rtol=1e-6)
    np.testing.assert_allclose(seen[1]["obs_rms"]["var"], saved["obs_rms"]["var"], rtol=1e-6)


def test_sigint_checkpoints_and_a_resumed_run_finishes_without_duplicate_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    cfg = ppo_config("CartPole-v1", total_steps=2048, eval_episodes=2, eval_interval=1024, checkpoint_interval=0)
    with monkeypatch.context() as patch:
        interrupt_after(patch, sb3.Learner, "collect", 2)  # as the second rollout starts
        interrupted = run_training(sb3, cfg, run_dir)
    # The second rollout and its update complete and are logged; the run stops before the third.
    assert interrupted["status"] == "interrupted" and interrupted["total_steps"] == 512
    assert interrupted["final_eval_episodes"] == 0
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    saved = runlog.load_checkpoint(run_dir, {"algo": "sb3-ppo"})
    assert saved["global_step"] == 512 and saved["iteration"] == 2
    assert steps_of(run_dir) == [256, 512]

    resumed = run_training(sb3, cfg, run_dir, resume=True)
    assert resumed["status"] == "completed" and resumed["total_steps"] == 2048
    assert steps_of(run_dir) == list(range(256, 2049, 256))
    final = runlog.load_checkpoint(run_dir, {"algo": "sb3-ppo"})
    assert final["global_step"] == 2048 and final["iteration"] == 8
    assert not all(torch.equal(saved["model"][k], v) for k, v in final["model"].items())  # it trained on
    # The learning-rate schedule continued from the checkpoint's step, not from the start.
    rows = read_progress(run_dir)
    assert float(rows[2]["charts/learning_rate"]) == pytest.approx(1e-3 * (1 - 768 / 2048))


@pytest.mark.parametrize("poison", ["from_update_4", "last_minibatch_of_update_4"])
def test_nan_loss_fails_the_run_and_keeps_the_last_good_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, poison: str
) -> None:
    # CartPole's preset has one minibatch per epoch, so update u makes calls (u−1)·K + 1 … u·K of SB3's value
    # loss. From update 4 on, the NaN parameters make torch.distributions raise in the next minibatch; at the
    # last minibatch only, the NaN reaches the logged losses instead. Both must read as a non-finite failure.
    cfg = ppo_config("CartPole-v1", total_steps=2048, checkpoint_interval=256, eval_interval=0, eval_episodes=1)
    calls = {"n": 0}
    first = 3 * cfg.n_epochs + (1 if poison == "from_update_4" else cfg.n_epochs)
    original = torch.nn.functional.mse_loss  # SB3's value loss, looked up at each call as F.mse_loss

    def poisoned(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls["n"] += 1
        out = original(*args, **kwargs)
        return out * float("nan") if calls["n"] >= first else out

    monkeypatch.setattr(torch.nn.functional, "mse_loss", poisoned)
    summary = run_training(sb3, cfg, tmp_path / "run")
    assert summary["status"] == "failed" and "non-finite" in summary["error"]
    saved = runlog.load_checkpoint(tmp_path / "run", {"algo": "sb3-ppo"})
    assert saved["global_step"] == 3 * cfg.batch_size
    assert all(torch.isfinite(t).all() for t in saved["model"].values())
    assert steps_of(tmp_path / "run") == [256, 512, 768]
