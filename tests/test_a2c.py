"""A2C (``agents/a2c.py``): its loss against hand-computed numbers, its one update against SB3's A2C ``train()``,
and a short learning run. Alone equals stacked, resume, eval and bad input: ``tests/test_algorithms.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from agents import a2c, sb3
from agents.a2c import A2CConfig, a2c_loss
from agents.config import resolve_config
from tests.conftest import read_progress, run_training
from tests.test_sb3 import as_tensor, ours_of, sb3_rollout_into


def a2c_config(env_id: str = "CartPole-v1", continuous: bool = False, **overrides: Any) -> A2CConfig:
    """A2C's preset for ``env_id`` with ``overrides`` applied, as the CLI resolves it."""
    cfg, _ = resolve_config(A2CConfig, "a2c", env_id, continuous, overrides)
    return cfg


# ── the loss, by hand ───────────────────────────────────────────────────────────────────────────────


def test_a2c_loss_by_hand_over_each_seeds_valid_samples() -> None:
    # Two seeds of three samples; seed 0's third and seed 1's last two are autoreset steps (masked), one of them
    # NaN, which must stay out of the means.
    log_probs = torch.tensor([[-0.5, -1.0, float("nan")], [-0.1, -0.2, 0.0]], requires_grad=True)
    advantages = torch.tensor([[1.0, -2.0, 3.0], [0.5, 4.0, 0.0]])
    values = torch.tensor([[1.0, 2.0, 9.0], [0.0, 0.0, 0.0]])
    returns = torch.tensor([[2.0, 0.0, 0.0], [3.0, 0.0, 0.0]])
    entropy = torch.tensor([[0.6, 0.4, 100.0], [0.7, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    terms = a2c_loss(log_probs, entropy, values, advantages, returns, mask, vf_coef=0.5, ent_coef=0.1)
    # Seed 0: −mean(1·−0.5, −2·−1) = −0.75; mean((2−1)², (0−2)²) = 2.5; mean(0.6, 0.4) = 0.5.
    # Seed 1: −(0.5·−0.1) = 0.05; (3−0)² = 9; 0.7.
    assert torch.allclose(terms.policy_loss, torch.tensor([-0.75, 0.05]))
    assert torch.allclose(terms.value_loss, torch.tensor([2.5, 9.0]))
    assert torch.allclose(terms.entropy, torch.tensor([0.5, 0.7]))
    # L = policy + 0.5 · value − 0.1 · entropy: −0.75 + 1.25 − 0.05 and 0.05 + 4.5 − 0.07.
    assert torch.allclose(terms.loss, torch.tensor([0.45, 4.48]))
    # ∂L_k/∂log π_j = −Â_j / n_k on seed k's valid samples, 0 elsewhere.
    terms.loss.sum().backward()
    assert log_probs.grad is not None
    assert torch.allclose(log_probs.grad, torch.tensor([[-0.5, 1.0, 0.0], [-0.5, 0.0, 0.0]]))


def test_a2c_loss_refuses_mismatched_shapes() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="share one shape"):
        a2c_loss(x, x, x, x, torch.zeros(2, 4), x.bool(), 0.5, 0.0)


# ── sb3-a2c: our config as SB3's A2C arguments ──────────────────────────────────────────────────────────


def test_the_lunarlander_preset_maps_to_sb3s_a2c_arguments_with_a_linear_schedule() -> None:
    args = sb3.sb3_arguments(a2c_config("LunarLander-v3"), continuous=False)
    assert (args["n_steps"], args["gamma"], args["gae_lambda"], args["ent_coef"]) == (5, 0.995, 1.0, 1e-5)
    assert isinstance(args["learning_rate"], sb3.LinearSchedule) and args["learning_rate"](0.5) == 0.5 * 8.3e-4
    assert args["use_rms_prop"] and args["rms_prop_eps"] == 1e-5 and not args["normalize_advantage"]
    assert "batch_size" not in args and "n_epochs" not in args and "log_std_init" not in args["policy_kwargs"]
    with pytest.raises(Exception, match=r"sb3-a2c: SB3 2\.x has no shared actor-critic trunk"):
        sb3.sb3_arguments(a2c_config("CartPole-v1", shared_trunk=True), continuous=False)


# ── one update is SB3's A2C train() ─────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {
            "normalize_advantage": True,
            "ent_coef": 0.01,
            "vf_coef": 0.4,
            "max_grad_norm": 0.3,
            "learning_rate": 1e-3,
            "hidden_sizes": (32, 32),
            "activation": "relu",
            "ortho_init": False,
            "log_std_init": -0.5,
        },
    ],
    ids=["defaults", "changed"],
)
def test_our_update_is_sb3s_a2c_train_on_the_same_batch_from_the_same_weights(overrides: dict[str, Any]) -> None:
    """Our A2C's one gradient step (``a2c.update``: the loss, optional advantage normalization, the gradient-norm
    clip, RMSprop with α = 0.99, ε = 1e-5) moves the weights as SB3's ``A2C.train()`` does, given SB3's rollout,
    advantages and weights."""
    cfg = a2c_config("Pendulum-v1", continuous=True, n_envs=2, n_steps=8, normalize_obs=False, **overrides)
    reference, ours = sb3.Learner([cfg]), a2c.Learner([cfg])
    try:
        segment, buffer, parameters = sb3_rollout_into(reference, ours, cfg)
        stats = a2c.update(ours, segment, as_tensor(buffer.advantages), as_tensor(buffer.returns), torch.tensor([True]))
        before = {name: weight.clone() for name, weight in reference.model.policy.state_dict().items()}
        reference.model.train()
        for name, weight in reference.model.policy.state_dict().items():
            assert not torch.equal(weight, before[name]), f"{name} should have moved"
            torch.testing.assert_close(parameters[ours_of(name)].detach(), weight, atol=1e-6, rtol=1e-5)
        logged = reference.model.logger.name_to_value
        expected = [logged["train/policy_loss"], logged["train/value_loss"], -logged["train/entropy_loss"]]
        torch.testing.assert_close(stats[0], torch.tensor(expected), atol=1e-5, rtol=1e-5)
    finally:
        reference.close()
        ours.close()


# ── learning ────────────────────────────────────────────────────────────────────────────────────────


def test_cartpole_learns_at_its_preset(tmp_path: Path) -> None:
    # The RL Zoo's preset (8 envs × 5 steps, RMSprop at 7e-4) on 4e4 of its 5e5 steps, seed 0: about 10 s
    # on a busy 2-core machine. A random policy scores about 22.
    cfg = a2c_config("CartPole-v1", total_steps=40_000, eval_interval=0)
    summary = run_training(a2c, cfg, tmp_path / "run")
    assert summary["status"] == "completed" and summary["final_eval_return_mean"] >= 200  # 491.1 measured
    rows = read_progress(tmp_path / "run")
    assert len(rows) == 40_000 // 40 and float(rows[-1]["losses/explained_variance"]) > 0
