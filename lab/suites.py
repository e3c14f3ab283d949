"""Named benchmark grids (``testbed bench --suite NAME``): which envs, algos, seeds and budget."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Suite:
    envs: tuple[str, ...]
    algos: tuple[str, ...] = ("ppo", "grpo", "sb3-ppo")
    seeds: int = 3
    total_steps: int | None = None  # None: each algo's preset budget for the env


MUJOCO_V5 = (
    "Ant-v5",
    "HalfCheetah-v5",
    "Hopper-v5",
    "Humanoid-v5",
    "HumanoidStandup-v5",
    "InvertedDoublePendulum-v5",
    "InvertedPendulum-v5",
    "Pusher-v5",
    "Reacher-v5",
    "Swimmer-v5",
    "Walker2d-v5",
)

SUITES: dict[str, Suite] = {
    # A few minutes on 2 cores: the presets' budgets on CartPole.
    "quick": Suite(envs=("CartPole-v1",)),
    # A2C and SB3's A2C beside them: the third algorithm and its reference, on the Zoo's A2C presets.
    "classic": Suite(
        envs=("CartPole-v1", "Acrobot-v1", "LunarLander-v3"), algos=("ppo", "grpo", "a2c", "sb3-ppo", "sb3-a2c")
    ),
    # Every MuJoCo v5 task at 1e6 env steps, 5 seeds of each algo. SB3's PPO runs our PPO's hyperparameters and
    # so checks our implementation; with 3 of its seeds, their luck on Walker2d and Humanoid decided the comparison
    # (benchmarks/results/sb3-ppo-*-matched).
    "mujoco": Suite(envs=MUJOCO_V5, seeds=5, total_steps=1_000_000),
    # The five tasks of the earlier MuJoCo results (benchmarks/results/mujoco).
    "mujoco5": Suite(envs=("CartPole-v1", "LunarLander-v3", "HalfCheetah-v5", "Hopper-v5", "Walker2d-v5")),
}
