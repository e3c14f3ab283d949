"""Collection throughput: GRPO sampling groups against PPO's rollout, on the same envs, and the memory each
agent's networks hold.

    python benchmarks/throughput.py [--envs CartPole-v1 LunarLander-v3 HalfCheetah-v5] [--seconds 5]

Both agents use their presets and an untrained policy. PPO's rate counts every env step of its rollout;
GRPO's counts the steps that produce samples, the ones its budget counts: a member whose episode has
ended takes no more steps (sync vector envs), and the steps an async vector env still gives it are
reported apart as idle. Writes benchmarks/results/throughput.md.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agents import grpo, ppo  # noqa: E402
from agents.config import resolve_config  # noqa: E402
from agents.tracking import memory_report  # noqa: E402
from envs import action_space_of  # noqa: E402


def ppo_rate(env_id: str, continuous: bool, seconds: float) -> tuple[float, dict[str, int]]:
    """PPO's collection (``ppo.Learner.collect``, a stack of one) with the untrained policy: steps/s, and memory."""
    cfg, _ = resolve_config(ppo.PPOConfig, "ppo", env_id, continuous, {})
    stack = ppo.Learner([cfg])
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        steps += stack.collect([0], [True])[0].env_steps
    rate = steps / (time.perf_counter() - started)
    return rate, trainee_memory(stack)


def grpo_rate(env_id: str, continuous: bool, seconds: float) -> tuple[float, float, dict[str, int]]:
    """GRPO's collection (``grpo.Learner.collect``, a stack of one) with the untrained policy: the rate of the steps
    that produce samples, the fraction of idle steps, and memory."""
    cfg, _ = resolve_config(grpo.GRPOConfig, "grpo", env_id, continuous, {})
    stack = grpo.Learner([cfg])
    steps, idle, iteration, started = 0, 0, 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        groups = stack.collect([iteration], [True])[0].batch
        steps += sum(e.env_steps for e in groups.rounds)
        idle, iteration = idle + sum(e.idle_steps for e in groups.rounds), iteration + 1
    rate = steps / (time.perf_counter() - started)
    return rate, idle / (steps + idle), trainee_memory(stack)


def trainee_memory(stack: Any) -> dict[str, int]:
    """The memory report of the stack's one trainee, once its optimizer has state (Adam's moments)."""
    trainee = stack.trainees[0]
    stack.optimizer.step(torch.ones(1, dtype=torch.bool))
    report = memory_report(trainee.optimizer, **trainee.networks)
    stack.close()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "LunarLander-v3", "HalfCheetah-v5"])
    parser.add_argument("--seconds", type=float, default=5.0, help="collection time per agent and env")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "throughput.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    lines = [
        "# Collection throughput and memory: GRPO beside PPO",
        "",
        f"Command: `python benchmarks/throughput.py --envs {' '.join(args.envs)} --seconds {args.seconds:g}`. Machine: "
        f"{platform.machine()}, {torch.get_num_threads()} torch thread, torch {torch.__version__}, gymnasium "
        f"{gym.__version__}. Presets of each agent, untrained policies; GRPO counts the steps that produce samples, as "
        "its budget does.",
        "",
        "| env | PPO rollout steps/s | GRPO sample steps/s | GRPO / PPO | GRPO idle steps (not counted) | PPO "
        "parameters (actor+critic) | GRPO parameters (actor + reference) | PPO bytes (nets + Adam) | GRPO bytes (actor "
        "+ reference + Adam) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for env_id in args.envs:
        continuous = isinstance(action_space_of(env_id), gym.spaces.Box)
        ppo_sps, ppo_mem = ppo_rate(env_id, continuous, args.seconds)
        grpo_sps, idle, grpo_mem = grpo_rate(env_id, continuous, args.seconds)
        row = (
            f"| {env_id} | {ppo_sps:,.0f} | {grpo_sps:,.0f} | {grpo_sps / ppo_sps:.2f} | {idle:.0%} | "
            f"{ppo_mem['parameters_actor_critic']:,} | {grpo_mem['parameters_actor']:,} + "
            f"{grpo_mem['parameters_reference']:,} | {ppo_mem['model_memory_bytes']:,} | "
            f"{grpo_mem['model_memory_bytes']:,} |"
        )
        print(row, flush=True)
        lines.append(row)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
