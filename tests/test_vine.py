"""Vine values: Monte-Carlo estimates on a task with known values, the branch steps counted, learning,
and the checks run before any work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import agents.grpo as grpo
from agents import rundir, vine
from agents.networks import Actor, NetworkSpec
from agents.rollout import SegmentBuffers, collect_episodes
from envs import EnvOptions, make_vector
from envs import start_states as starts
from envs.errors import BadInput
from lab.cli import main
from tests.conftest import grpo_config


def uniform_actor() -> Actor:
    """π(a | s) = 1/2 for both actions: the last layer's weights and bias are zero."""
    actor = Actor(
        NetworkSpec(
            obs_dim=4,
            action_dim=2,
            continuous=False,
            hidden_sizes=(8,),
            activation="tanh",
            shared_trunk=False,
            ortho_init=True,
            log_std_init=0.0,
        )
    )
    with torch.no_grad():
        for parameter in list(actor.parameters())[-2:]:
            parameter.zero_()
    return actor


def test_branch_values_converge_to_the_known_values_and_count_every_branch_step() -> None:
    # Chain, horizon 10, distractors ±0.5, uniform policy. A restored state carries the env's RNG, and the
    # distractors do not depend on actions, so every branch from a point meets the trunk's own distractor
    # sequence d_5 … d_8 after it (common random numbers). Known values, given that sequence:
    #   V(s_0) = Σ_{u<9} d_u + ½·(+1) + ½·(−1) = Σ_{u<9} d_u   (the first action is right half of the time);
    #   V(s_5) = Σ_{5≤u<9} d_u ± 1, + if the trunk's first action was right: exactly its reward-to-go.
    # K = 64 branches from s_0: the outcome's standard error is 1/8.
    M, H, m = 64, 10, 5
    env = make_vector("testbed/Chain-v0", M, EnvOptions(vectorization="sync"), horizon=H, distractor_scale=0.5)
    torch.manual_seed(0)
    actor = uniform_actor()
    buffers = SegmentBuffers(H, M, 4, (), True)
    recorder = vine.PointRecorder(env, m)
    first_obs, _ = env.reset(seed=list(range(M)))
    trunks = collect_episodes(
        env, actor.act, np.asarray(first_obs, dtype=np.float32), buffers, before_step=recorder.record
    )
    assert len(recorder.points) == 2 * M  # every member is alive at steps 0 and 5
    rewards = trunks.rewards[:, 0]  # trunk 0: distractors at steps 0 … 8, the outcome ±1 at step 9
    recorder.points = [p for p in recorder.points if p[1] == 0]  # trunk 0's points: (0, 0, s_0), (1, 0, s_5)

    values = vine.branch_values(env, actor.act, recorder, J=2, K=M, gamma=1.0, buffers=buffers)
    assert values.points == 2
    assert values.values[0, 0].item() == pytest.approx(rewards[:9].sum().item(), abs=0.5)  # 4 standard errors
    assert values.values[1, 0].item() == pytest.approx(rewards[5:].sum().item(), abs=1e-5)  # exact
    # One point per round (K = M): every sub-env runs until the last branch ends. From s_0 that is 10
    # steps, from s_5 5 steps: (10 + 5) · 64 env steps, all counted.
    assert values.branch_steps == (10 + 5) * M
    env.close()


def test_branches_restore_the_trunk_state_exactly() -> None:
    # With no distractors a branch from s_5 returns exactly the trunk's outcome, whatever it does.
    M, H = 4, 10
    env = make_vector("testbed/Chain-v0", M, EnvOptions(vectorization="sync"), horizon=H, distractor_scale=0.0)
    actor = uniform_actor()
    buffers = SegmentBuffers(H, M, 4, (), True)
    recorder = vine.PointRecorder(env, 5)
    first_obs, _ = env.reset(seed=[1, 2, 3, 4])
    trunks = collect_episodes(
        env, actor.act, np.asarray(first_obs, dtype=np.float32), buffers, before_step=recorder.record
    )
    values = vine.branch_values(env, actor.act, recorder, J=2, K=2, gamma=1.0, buffers=buffers)
    torch.testing.assert_close(values.values[1], trunks.rewards[H - 1])
    env.close()


def test_member_point_needs_a_sync_env() -> None:
    env = make_vector("testbed/Chain-v0", 2, EnvOptions(), horizon=5)  # native
    env.reset(seed=0)
    with pytest.raises(BadInput, match="vectorization=sync"):
        starts.member_point(env, 0)
    env.close()


def config(env_id: str = "testbed/Chain-v0", **overrides: Any) -> grpo.GRPOConfig:
    return grpo_config(env_id, **{"advantage": "vine", **overrides})


def test_grpo_vine_solves_a_short_chain_and_reports_its_branch_steps(tmp_path: Path) -> None:
    cfg = config(env_kwargs={"horizon": 10}, total_steps=15_000, eval_interval=5_000, eval_episodes=10)
    run_dir = tmp_path / "run"
    rundir.prepare_run_dir(run_dir, False)
    summary = grpo.train(cfg, run_dir, name="grpo-vine")
    assert summary["status"] == "completed" and summary["algo"] == "grpo-vine"
    assert summary["final_eval_return_mean"] == 1.0  # every evaluation episode's first action is right
    with open(run_dir / "progress.csv") as f:
        header, *rows = [line.rstrip("\n").split(",") for line in f]
    fraction = [float(r[header.index("grpo/vine_branch_step_fraction")]) for r in rows]
    # 2 points × 2 branches of ≤ 10 and ≤ 5 steps (plus padding) next to 16 trunks of 10 steps.
    assert all(0.5 < f < 0.9 for f in fraction)


def test_vine_is_refused_where_it_cannot_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(BadInput, match="LunarLander-v3's cannot"):
        grpo.validate(config("LunarLander-v3", total_steps=10_000_000))  # Box2D: no settable state
    with pytest.raises(BadInput, match="vine_branches \\(K\\) must divide B·G = 16"):
        config(vine_branches=3)
    argv = [
        "train",
        "--algo",
        "grpo-vine",
        "--env",
        "testbed/Chain-v0",
        "--set",
        "advantage=outcome",
        "--run-dir",
        str(tmp_path / "r"),
    ]
    assert main(argv) == 2
    assert "grpo-vine fixes advantage=vine" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_algo_variants_fix_their_setting_and_keep_their_name(tmp_path: Path) -> None:
    argv = [
        "train",
        "--algo",
        "ppo-lambda0",
        "--env",
        "testbed/Chain-v0",
        "--env-kwargs",
        "horizon:5",
        "--total-steps",
        "2048",
        "--set",
        "eval_episodes=2",
        "--run-dir",
        str(tmp_path / "r"),
    ]
    assert main(argv) == 0
    config_text = (tmp_path / "r" / "config.yaml").read_text()
    assert "algo: ppo-lambda0" in config_text and "gae_lambda: 0.0" in config_text and "horizon: 5" in config_text
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["algo"] == "ppo-lambda0"
    assert main(["eval", str(tmp_path / "r"), "--episodes", "2"]) == 0
