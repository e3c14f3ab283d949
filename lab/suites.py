"""Named benchmark grids (``testbed bench --suite NAME``): which envs, algos, seeds and budget."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Suite:
    envs: tuple[str, ...]
    algos: tuple[str, ...] = ("ppo", "grpo", "sb3-ppo")
    seeds: int = 3
    total_steps: int | None = None  # None: each algo's preset budget for the env


SUITES: dict[str, Suite] = {
    # A few minutes on 2 cores: the presets' budgets on CartPole.
    "quick": Suite(envs=("CartPole-v1",)),
    "classic": Suite(envs=("CartPole-v1", "Acrobot-v1", "LunarLander-v3")),
    "mujoco": Suite(envs=("CartPole-v1", "LunarLander-v3", "HalfCheetah-v5", "Hopper-v5", "Walker2d-v5")),
}
