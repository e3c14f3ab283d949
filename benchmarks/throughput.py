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

import gymnasium as gym
import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agents import groups, grpo, ppo  # noqa: E402
from agents.config import resolve_config  # noqa: E402
from agents.networks import Actor, ActorCritic, flatten_parameters  # noqa: E402
from agents.rollout import RolloutState, SegmentBuffers, collect_episodes, collect_segment  # noqa: E402
from agents.training import memory_report, network_spec, open_envs  # noqa: E402
from envs import EnvOptions, action_space_of  # noqa: E402
from envs import start_states as starts  # noqa: E402


def ppo_rate(env_id: str, continuous: bool, seconds: float) -> tuple[float, dict[str, int]]:
    cfg, _ = resolve_config(ppo.PPOConfig, "ppo", env_id, continuous, {})
    options = EnvOptions(normalize_obs=cfg.normalize_obs, normalize_reward=cfg.normalize_reward, gamma=cfg.gamma,
                         vectorization=cfg.vectorization)  # fmt: skip
    envs = open_envs(cfg, cfg.n_envs, options)
    model = ActorCritic(network_spec(envs.train, cfg, cfg.shared_trunk))
    obs, _ = envs.train.reset(seed=0)
    state = RolloutState(np.asarray(obs, dtype=np.float32), np.zeros(cfg.n_envs, dtype=bool))
    buffers = SegmentBuffers(cfg.n_steps, cfg.n_envs, envs.obs_dim, envs.action_shape, not envs.continuous)
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        collect_segment(envs.train, model, state, buffers)
        steps += cfg.batch_size
    rate = steps / (time.perf_counter() - started)
    optimizer = torch.optim.Adam([flatten_parameters(model)], lr=cfg.learning_rate)
    optimizer.step()  # creates Adam's moment buffers, so the memory report counts them
    envs.close()
    return rate, memory_report(optimizer, actor_critic=model)


def grpo_rate(env_id: str, continuous: bool, seconds: float) -> tuple[float, float, dict[str, int]]:
    cfg, _ = resolve_config(grpo.GRPOConfig, "grpo", env_id, continuous, {})
    H, M = grpo.horizon(cfg), cfg.batch_trajectories
    envs = open_envs(cfg, M, EnvOptions(normalize_obs=cfg.normalize_obs, vectorization=cfg.vectorization),
                     **groups.time_limit(cfg))
    actor = Actor(network_spec(envs.train, cfg))
    reference = Actor(network_spec(envs.train, cfg))
    buffers = SegmentBuffers(H, M, envs.obs_dim, envs.action_shape, not envs.continuous)
    steps, idle, iteration, started = 0, 0, 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        first = starts.reset_groups(envs.train, starts.group_seeds(0, iteration, cfg.num_groups), cfg.group_size)
        episodes = collect_episodes(envs.train, actor, np.asarray(first, dtype=np.float32), buffers)
        steps, idle, iteration = steps + episodes.env_steps, idle + episodes.idle_steps, iteration + 1
    rate = steps / (time.perf_counter() - started)
    optimizer = torch.optim.Adam([flatten_parameters(actor)], lr=cfg.learning_rate)
    optimizer.step()
    envs.close()
    return rate, idle / (steps + idle), memory_report(optimizer, actor=actor, reference=reference)


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
        f"Command: `python benchmarks/throughput.py --envs {' '.join(args.envs)} --seconds {args.seconds:g}`. "
        f"Machine: {platform.machine()}, {torch.get_num_threads()} torch thread, torch {torch.__version__}, "
        f"gymnasium {gym.__version__}. Presets of each agent, untrained policies; GRPO counts the steps that "
        "produce samples, as its budget does.",
        "",
        "| env | PPO rollout steps/s | GRPO sample steps/s | GRPO / PPO | GRPO idle steps (not counted) | "
        "PPO parameters (actor+critic) | GRPO parameters (actor + reference) | PPO bytes (nets + Adam) | "
        "GRPO bytes (actor + reference + Adam) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for env_id in args.envs:
        continuous = isinstance(action_space_of(env_id), gym.spaces.Box)
        ppo_sps, ppo_mem = ppo_rate(env_id, continuous, args.seconds)
        grpo_sps, idle, grpo_mem = grpo_rate(env_id, continuous, args.seconds)
        row = (f"| {env_id} | {ppo_sps:,.0f} | {grpo_sps:,.0f} | {grpo_sps / ppo_sps:.2f} | {idle:.0%} | "
               f"{ppo_mem['parameters_actor_critic']:,} | {grpo_mem['parameters_actor']:,} + "
               f"{grpo_mem['parameters_reference']:,} | {ppo_mem['model_memory_bytes']:,} | "
               f"{grpo_mem['model_memory_bytes']:,} |")  # fmt: skip
        print(row, flush=True)
        lines.append(row)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
