"""The algorithms the testbed can train, by the name a user gives ``--algo``.

Each entry names the config class, the presets file, the training function and how to rebuild a
checkpoint's policy. A variant (``ppo-lambda0``, ``grpo-vine``, …) is another algo with some config values
fixed; its name is carried into the run's files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gymnasium.vector import VectorEnv

from agents import grpo, grpo_stack, ppo, ppo_stack, sb3
from agents.config import RunConfig
from agents.networks import Actor, ActorCritic, load_weights
from agents.training import check_env, check_stack, network_spec
from envs.errors import BadInput


@dataclass(frozen=True)
class Algo:
    config: type[RunConfig]
    train: Callable[[Any, Path, bool, str], dict[str, Any]]
    """``train(cfg, run_dir, resume, name)``: trains into ``run_dir``; returns the summary."""
    load_policy: Callable[[Any, VectorEnv, dict[str, Any]], Any]
    """``load_policy(cfg, eval_env, weights)``: rebuilds the checkpoint's policy for ``testbed eval``."""
    checks: Callable[[Any], None] = lambda cfg: None
    """The algo's own checks that need the env."""
    preset: str | None = None
    """The presets file, ``agents/presets/<preset>.yaml``; None: the algo's own name."""
    fixed: dict[str, Any] = field(default_factory=dict)
    """Config values that make this algo a variant of another (PPO with λ = 0, say); not overridable."""
    train_stack: Callable[[list[Any], list[Path], list[bool], str], list[dict[str, Any]]] | None = None
    """``train_stack(cfgs, run_dirs, resumes, name)``: seeds side by side in one process, each resumed from its
    checkpoint or started; None: not supported."""

    def check_stack(self, cfgs: list[RunConfig]) -> None:
        """The configs can train as one stack (they differ in the seed only)."""
        check_stack(cfgs)

    def validate(self, cfg: RunConfig) -> None:
        """Every check that needs the env, run before anything is written: the env builds with the
        config's keyword arguments, and the algo's own checks pass."""
        check_env(cfg)
        self.checks(cfg)


def _load_actor_critic(cfg: ppo.PPOConfig, env: VectorEnv, weights: dict[str, Any]) -> ActorCritic:
    return load_weights(ActorCritic(network_spec(env, cfg, cfg.shared_trunk)), weights, "the checkpoint")


def _load_actor(cfg: grpo.GRPOConfig, env: VectorEnv, weights: dict[str, Any]) -> Actor:
    return load_weights(Actor(network_spec(env, cfg)), weights, "the checkpoint")


def _load_sb3_policy(cfg: ppo.PPOConfig, env: VectorEnv, weights: dict[str, Any]) -> sb3.SB3Policy:
    return sb3.load_policy(cfg, weights)


_PPO = {"config": ppo.PPOConfig, "train": ppo.train, "load_policy": _load_actor_critic, "preset": "ppo",
        "train_stack": ppo_stack.train}  # fmt: skip
_GRPO = {"config": grpo.GRPOConfig, "train": grpo.train, "load_policy": _load_actor, "checks": grpo.validate,
         "preset": "grpo", "train_stack": grpo_stack.train}  # fmt: skip
ALGOS: dict[str, Algo] = {
    "ppo": Algo(**_PPO),
    "grpo": Algo(**_GRPO),
    "sb3-ppo": Algo(config=ppo.PPOConfig, train=sb3.train, load_policy=_load_sb3_policy, checks=sb3.validate,
                    preset="ppo"),
    # The credit-assignment study's methods: GAE's λ at its ends (one-step TD, Monte Carlo), GRPO's
    # per-step reward-to-go, its per-step group baselines, and Monte-Carlo values from branches
    # (agents/vine.py).
    "ppo-lambda0": Algo(**_PPO, fixed={"gae_lambda": 0.0}),
    "ppo-lambda1": Algo(**_PPO, fixed={"gae_lambda": 1.0}),
    "grpo-process": Algo(**_GRPO, fixed={"advantage": "process"}),
    "grpo-step": Algo(**_GRPO, fixed={"advantage": "step_baseline"}),
    "grpo-vine": Algo(**_GRPO, fixed={"advantage": "vine"}),
}


def get(name: str) -> Algo:
    """The algo called ``name``, or BadInput listing the known ones."""
    if name not in ALGOS:
        raise BadInput(f"unknown algo {name!r}; choose one of {', '.join(ALGOS)}")
    return ALGOS[name]
