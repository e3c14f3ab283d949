"""The algorithms the testbed can train, by the name a user gives ``--algo``.

Each entry names the config class, the presets file, the training function and how to rebuild a
checkpoint's policy. A variant (``ppo-lambda0``, ``grpo-vine``, …) is another algo with some config values
fixed; its name is carried into the run's files.

The names are known without importing any algorithm (:data:`NAMES`), so that the command line checks and
lists them before torch is imported; :func:`get` imports the algorithms the first time it is asked.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.config import RunConfig
from envs.errors import BadInput

if TYPE_CHECKING:
    from gymnasium.vector import VectorEnv

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "ppo": ("ppo", {}),
    "grpo": ("grpo", {}),
    "sb3-ppo": ("sb3-ppo", {}),
    # The credit-assignment study's methods: GAE's λ at its ends (one-step TD, Monte Carlo), GRPO's
    # per-step reward-to-go, its per-step group baselines, and Monte-Carlo values from branches
    # (agents/vine.py).
    "ppo-lambda0": ("ppo", {"gae_lambda": 0.0}),
    "ppo-lambda1": ("ppo", {"gae_lambda": 1.0}),
    "grpo-process": ("grpo", {"advantage": "process"}),
    "grpo-step": ("grpo", {"advantage": "step_baseline"}),
    "grpo-vine": ("grpo", {"advantage": "vine"}),
}
"""Each algo's name → (the algo it varies, the config values it fixes)."""
NAMES = tuple(VARIANTS)
PRESETS = {"ppo": "ppo", "grpo": "grpo", "sb3-ppo": "ppo"}
"""Each base algo's presets file, ``agents/presets/<name>.yaml``: SB3's PPO takes ours."""


def preset_of(name: str) -> str:
    """The presets file of the algo ``name`` (a variant's is its base algo's)."""
    return PRESETS[VARIANTS[name][0]]


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
        from agents.training import check_stack  # here, on first use: the lifecycle imports torch

        check_stack(cfgs)

    def validate(self, cfg: RunConfig) -> None:
        """Every check that needs the env, run before anything is written: the env builds with the
        config's keyword arguments, and the algo's own checks pass."""
        from agents.plumbing import check_env  # here, on first use: it imports torch

        check_env(cfg)
        self.checks(cfg)


@functools.cache
def algos() -> dict[str, Algo]:
    """Every algo by name. Imported here, on first use: the algorithms import torch, which takes seconds."""
    from agents import grpo, ppo, sb3
    from agents.networks import Actor, ActorCritic, load_weights
    from agents.plumbing import network_spec

    def load_actor_critic(cfg: ppo.PPOConfig, env: VectorEnv, weights: dict[str, Any]) -> ActorCritic:
        return load_weights(ActorCritic(network_spec(env, cfg, cfg.shared_trunk)), weights, "the checkpoint")

    def load_actor(cfg: grpo.GRPOConfig, env: VectorEnv, weights: dict[str, Any]) -> Actor:
        return load_weights(Actor(network_spec(env, cfg)), weights, "the checkpoint")

    def load_sb3_policy(cfg: ppo.PPOConfig, env: VectorEnv, weights: dict[str, Any]) -> sb3.SB3Policy:
        return sb3.load_policy(cfg, weights)

    bases = {
        "ppo": {"config": ppo.PPOConfig, "train": ppo.train, "load_policy": load_actor_critic,
                "train_stack": ppo.train_stack},
        "grpo": {"config": grpo.GRPOConfig, "train": grpo.train, "load_policy": load_actor, "checks": grpo.validate,
                 "train_stack": grpo.train_stack},
        "sb3-ppo": {"config": ppo.PPOConfig, "train": sb3.train, "load_policy": load_sb3_policy,
                    "checks": sb3.validate},
    }  # fmt: skip
    return {name: Algo(**bases[base], preset=PRESETS[base], fixed=fixed) for name, (base, fixed) in VARIANTS.items()}


def check_name(name: str) -> None:
    """BadInput listing the known algos, unless ``name`` is one; imports no algorithm."""
    if name not in NAMES:
        raise BadInput(f"unknown algo {name!r}; choose one of {', '.join(NAMES)}")


def get(name: str) -> Algo:
    """The algo called ``name``, or BadInput listing the known ones."""
    check_name(name)
    return algos()[name]
