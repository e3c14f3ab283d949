"""Seed streams (``agents/seeding.py``): the derivation from ``SeedSequence(seed)`` by hand, and the seeds every
sub-env of a real run is reset with, which two run seeds never share."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from agents import grpo, ppo, run_envs, sb3
from agents.seeding import (
    RESET_SEED_FLOOR,
    Stream,
    env_seeds,
    generator_seeds,
    reset_seeds,
    restart_seeds,
    seed_everything,
    start_seeds,
)
from tests.conftest import grpo_config, ppo_config, run_training

# ── the derivation ───────────────────────────────────────────────────────────────────────────────────


def test_env_seeds_are_one_word_of_each_spawned_child_with_the_top_bit_set() -> None:
    # By hand: SeedSequence(seed).spawn gives child j the spawn key (j,), and its own spawn gives (j, i).
    branch = np.random.SeedSequence(0).spawn(3)[Stream.TRAIN_ENVS]
    expected = [int(child.generate_state(1, np.uint32)[0]) | 2**31 for child in branch.spawn(4)]
    assert env_seeds(0, 4) == expected == [4088532484, 3581274545, 3156395769, 4023748921]
    assert env_seeds(1, 4) == [3023998541, 2970908266, 2253905059, 2199221172]


def test_the_same_seed_gives_the_same_list_and_a_longer_list_extends_it() -> None:
    assert env_seeds(7, 8) == env_seeds(7, 8)
    assert env_seeds(7, 9)[:8] == env_seeds(7, 8) and env_seeds(7, 0) == []
    assert start_seeds(7, 3, 64) == start_seeds(7, 3, 64) and start_seeds(7, 3, 65)[:64] == start_seeds(7, 3, 64)


def test_no_two_seeds_purposes_or_draws_share_a_reset_seed() -> None:
    lists = [env_seeds(seed, 16) for seed in range(8)]
    lists += [restart_seeds(seed, step, 16) for seed in range(8) for step in (0, 2048, 4096)]
    lists += [start_seeds(seed, draw, 64) for seed in range(8) for draw in range(4)]
    every = [s for seeds in lists for s in seeds]
    assert len(set(every)) == len(every)
    # ints an env takes, above evaluation's fixed seeds
    assert all(isinstance(s, int) and RESET_SEED_FLOOR <= s < 2**32 for s in every)
    assert run_envs.EVAL_SEED_BASE + 10_000 < RESET_SEED_FLOOR


def test_the_generators_are_seeded_from_their_own_branch() -> None:
    words = np.random.SeedSequence(0).spawn(4)[Stream.GENERATORS].generate_state(3, np.uint32)
    assert generator_seeds(0) == tuple(int(w) for w in words)
    seeds = [s for seed in range(8) for s in generator_seeds(seed)]
    assert len(set(seeds)) == len(seeds)  # no run seed's generator meets another's, nor another generator
    seed_everything(5)
    assert torch.initial_seed() == generator_seeds(5)[2] and np.random.get_state()[1][0] == generator_seeds(5)[1]


def test_negative_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        reset_seeds(-1, Stream.TRAIN_ENVS, 4)
    with pytest.raises(ValueError, match="non-negative"):
        start_seeds(0, -1, 4)


# ── the seeds a run's sub-envs are reset with ────────────────────────────────────────────────────────


def recorded_resets(monkeypatch: pytest.MonkeyPatch, algo: ModuleType, cfg: Any, run_dir: Path) -> list[int]:
    """Train ``cfg`` and return the seed of every seeded reset of a CartPole sub-env, in order."""
    seeds: list[int] = []
    reset = CartPoleEnv.reset

    def recording(self: CartPoleEnv, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if seed is not None:  # an autoreset continues the sub-env's stream
            seeds.append(seed)
        return reset(self, seed=seed, options=options)

    monkeypatch.setattr(CartPoleEnv, "reset", recording)
    summary = run_training(algo, cfg, run_dir)
    monkeypatch.setattr(CartPoleEnv, "reset", reset)
    assert summary["status"] == "completed"
    return seeds


EVAL_EPISODES = 2
EVALUATION = {run_envs.EVAL_SEED_BASE + i for i in range(EVAL_EPISODES)}
RUNS = ["ppo", "sb3-ppo", "grpo", "grpo-branch"]


def short_run(name: str, seed: int) -> tuple[ModuleType, Any]:
    """A short CartPole run of ``name`` at ``seed`` with 8 sub-envs (GRPO: 4 groups of 2), evaluated once."""
    short = {"seed": seed, "eval_interval": 0, "eval_episodes": EVAL_EPISODES}
    if name in ("ppo", "sb3-ppo"):  # sync: each sub-env a CartPoleEnv with its own seed (SB3's always are)
        cfg = ppo_config("CartPole-v1", n_envs=8, n_steps=16, minibatch_size=64, total_steps=256, **short)
        return (ppo, dataclasses.replace(cfg, vectorization="sync")) if name == "ppo" else (sb3, cfg)
    start_mode = "branch" if name == "grpo-branch" else "reset"
    return grpo, grpo_config(
        num_groups=4, group_size=2, num_minibatches=2, total_steps=1000, start_mode=start_mode, **short
    )


@pytest.mark.parametrize("name", RUNS)
def test_run_seeds_0_and_1_share_no_env_stream(name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The other seeded resets are evaluation's fixed common seeds and, for GRPO, the probes of a fresh env with
    # seed 0: that its reset takes a seed (``start_states.check_seeded_reset``) and, for branching, how branch
    # points are restored (``start_states.settable``). No training episode continues them.
    shared = EVALUATION | ({0} if name.startswith("grpo") else set())
    training: dict[int, set[int]] = {}
    for seed in (0, 1):
        seeds = recorded_resets(monkeypatch, *short_run(name, seed), tmp_path / f"seed{seed}")
        training[seed] = {s for s in seeds if s >= RESET_SEED_FLOOR}
        assert set(seeds) - training[seed] == shared
        if name.startswith("grpo"):  # a group's G members share their start state's seed, on purpose
            assert len(training[seed]) > 4 and len(training[seed]) % 4 == 0  # several draws of B = 4
        else:  # each sub-env its own stream
            assert training[seed] == set(env_seeds(seed, 8)) and len(training[seed]) == 8
    assert not training[0] & training[1]


def test_sb3_resets_its_sub_envs_with_our_seeds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ours = recorded_resets(monkeypatch, *short_run("ppo", 3), tmp_path / "ppo")
    sb3s = recorded_resets(monkeypatch, *short_run("sb3-ppo", 3), tmp_path / "sb3-ppo")
    assert ours[:8] == sb3s[:8] == env_seeds(3, 8)
