"""Resolving an agent's config: preset YAML, then ``--set key=value`` overrides, then validation.

Every value is checked before any work starts; a bad key or value raises :class:`envs.BadInput` with
the valid keys or the valid range in its message.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from envs.errors import BadInput

PRESET_DIR = Path(__file__).parent / "presets"
C = TypeVar("C")


def check(condition: bool, message: str) -> None:
    """Raise BadInput(message) unless ``condition``; used by the configs' ``__post_init__``."""
    if not condition:
        raise BadInput(message)


SEED_LIMIT = 2**32
"""Seeds lie in [0, 2³²): NumPy's global generator takes no more."""


@dataclass(frozen=True)
class RunConfig:
    """The settings every agent shares: the env, the budget, the optimizer, the networks, evaluation and
    checkpoints. ``PPOConfig`` and ``GRPOConfig`` extend it; ``agents/training.py`` reads only these."""

    env_id: str
    """Any registered gymnasium id."""
    seed: int = 0
    """Seeds torch, numpy and the training envs, in [0, 2³²)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the env (RL Zoo's ``--env-kwargs``), e.g. ``horizon: 300`` for the testbed's
    tasks; the training and the evaluation envs both get them."""
    eval_env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Env keyword arguments that differ at evaluation, on top of ``env_kwargs`` (RL Zoo's
    ``--eval-env-kwargs``), e.g. the tasks' ``distractor_scale: 0``: their distractor rewards are
    zero-mean and blind to actions, so dropping them keeps a policy's expected return and removes noise."""
    reward_delay: int | Literal["end"] | None = None
    """k: release the rewards accumulated every k steps, or ``end``: only at the episode's end
    (``envs/delay.py``); none: as the env gives them. Training only: the return evaluation reports is
    the same sum either way."""
    total_steps: int = 1_000_000
    """Env steps to train for; every sub-env step counts."""
    gamma: float = 0.99
    """γ: discount."""
    n_epochs: int = 10
    """K: passes over each iteration's batch."""
    learning_rate: float = 3e-4
    """Adam's step size (its start value when annealed)."""
    anneal_lr: bool = False
    """Decay the learning rate linearly to 0 over the run."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    normalize_obs: bool = False
    """Running observation normalization, one set of statistics for all sub-envs (clipped to ±10)."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Widths of the hidden layers of each network."""
    activation: Literal["tanh", "relu"] = "tanh"
    """Hidden activation."""
    ortho_init: bool = True
    """Orthogonal initialization; False keeps torch's default."""
    log_std_init: float = 0.0
    """Initial log σ of the Gaussian policy (continuous actions)."""
    eval_interval: int = 50_000
    """Env steps between deterministic evaluations; 0 evaluates only at the end."""
    eval_episodes: int = 10
    """Episodes per evaluation, on separate envs with fixed seeds."""
    checkpoint_interval: int = 100_000
    """Env steps between checkpoints (one is also written at the end and on SIGINT/SIGTERM)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the networks live; the envs always run on the CPU."""

    def __post_init__(self) -> None:
        check(0 <= self.seed < SEED_LIMIT, f"seed must be in [0, 2**32 - 1], got {self.seed}")
        check(self.total_steps > 0, f"total_steps must be positive, got {self.total_steps}")
        check(self.reward_delay in (None, "end") or self.reward_delay >= 1,
              f"reward_delay must be a number of steps >= 1, end or none; got {self.reward_delay}")  # fmt: skip
        check(0.0 <= self.gamma <= 1.0, f"gamma must be in [0, 1], got {self.gamma}")
        check(self.n_epochs >= 1, f"n_epochs must be at least 1, got {self.n_epochs}")
        check(self.learning_rate > 0, f"learning_rate must be positive, got {self.learning_rate}")
        check(self.ent_coef >= 0, f"ent_coef must be non-negative, got {self.ent_coef}")
        check(self.max_grad_norm > 0, f"max_grad_norm must be positive, got {self.max_grad_norm}")
        check(len(self.hidden_sizes) >= 1 and min(self.hidden_sizes) >= 1, "hidden_sizes must be positive widths")
        check(self.eval_interval >= 0, f"eval_interval must be >= 0, got {self.eval_interval}")
        check(self.eval_episodes >= 1, f"eval_episodes must be at least 1, got {self.eval_episodes}")
        check(self.checkpoint_interval >= 0, f"checkpoint_interval must be >= 0, got {self.checkpoint_interval}")


def load_preset(algo: str, env_id: str, continuous: bool, preset_file: Path | None = None) -> tuple[dict[str, Any], str]:
    """The preset for ``env_id`` from ``presets/<algo>.yaml``, else its discrete/continuous default.

    ``preset_file`` (``testbed train --preset``, RL Zoo's ``--conf-file``) is a file of the same form, e.g.
    the block ``testbed tune`` exports: its ``envs`` entry for ``env_id`` replaces the packaged one, and its
    ``defaults``, if any, the packaged defaults. Returns the values and the name of the preset used.
    """
    presets = yaml.safe_load((PRESET_DIR / f"{algo}.yaml").read_text())
    if preset_file is not None:
        try:
            own = yaml.safe_load(preset_file.read_text())
        except (OSError, yaml.YAMLError) as error:
            raise BadInput(f"--preset {preset_file}: cannot be read as YAML ({str(error).splitlines()[0]})") from None
        entry = own.get("envs", {}).get(env_id) if isinstance(own, dict) and isinstance(own.get("envs"), dict) else None
        if not isinstance(entry, dict):
            raise BadInput(f"--preset {preset_file} has no entry for {env_id}: it needs `envs: {{{env_id}: {{key: value, ...}}}}`, "
                           f"the form of agents/presets/{algo}.yaml")  # fmt: skip
        presets = {"defaults": {**presets["defaults"], **(own.get("defaults") or {})}, "envs": {env_id: entry}}
    default_name = "continuous" if continuous else "discrete"
    values = dict(presets["defaults"][default_name])
    if env_id in presets.get("envs", {}):
        values.update(presets["envs"][env_id])
        return values, f"{env_id} from {preset_file}" if preset_file is not None else env_id
    return values, f"default ({default_name})"


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """``["lr=1e-3", "gamma=0.9"]`` → ``{"lr": "1e-3", "gamma": "0.9"}``."""
    overrides: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise BadInput(f"--set expects key=value, got {pair!r}")
        overrides[key.strip()] = value.strip()
    return overrides


def parse_key_values(pairs: list[str]) -> dict[str, Any]:
    """``["horizon:300", "scale:0.1"]`` → ``{"horizon": 300, "scale": 0.1}``, each value read as YAML.

    Raises ValueError for a pair without ``:`` or without a key; blank items are skipped."""
    split = [item.partition(":") for item in pairs if item.strip()]
    if any(not sep or not key.strip() for key, sep, _ in split):
        raise ValueError(f"expected KEY:VALUE pairs, got {pairs!r}")
    try:
        return {key.strip(): yaml.safe_load(value.strip()) for key, _, value in split}
    except yaml.YAMLError as error:
        raise ValueError(f"a value in {pairs!r} is not valid YAML ({str(error).splitlines()[0]})") from None


def _coerce(key: str, value: Any, kind: Any) -> Any:
    """Convert a YAML or command-line value to the field's type, or raise BadInput."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            return None
        arms = [a for a in args if a is not type(None)]
        if len(arms) == 1:
            return _coerce(key, value, arms[0])
        for arm in arms:  # the first arm that takes the value wins: int | Literal["end"] takes 20 and "end"
            try:
                return _coerce(key, value, arm)
            except BadInput:
                pass
        names = [" or ".join(map(repr, typing.get_args(a))) if typing.get_origin(a) is Literal else a.__name__
                 for a in arms]  # fmt: skip
        raise BadInput(f"{key}={value!r} is not valid: give {', or '.join(names)}, or none")
    if origin is Literal:
        if str(value) not in args:
            raise BadInput(f"{key} must be one of {', '.join(map(str, args))}; got {value!r}")
        return str(value)
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).lower()
            if text in ("true", "1", "yes", "on"):
                return True
            if text in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if kind is int:
            number = float(value)
            if not number.is_integer():
                raise ValueError
            return int(number)
        if kind is float:
            return float(value)
        if kind is str:
            return str(value)
        if origin is dict:
            # YAML gives a mapping; the command line gives key:value,key:value (RL Zoo's --env-kwargs).
            if isinstance(value, dict):
                return dict(value)
            try:
                return parse_key_values(str(value).strip("{} ").split(","))
            except ValueError as error:
                raise BadInput(f"{key}: {error}; give KEY:VALUE pairs, e.g. horizon:300") from None
        if origin is tuple:
            items = value if isinstance(value, (list, tuple)) else str(value).strip("[]() ").split(",")
            return tuple(_coerce(key, item, args[0]) for item in items if str(item).strip() != "")
    except BadInput:
        raise
    except (TypeError, ValueError):
        pass
    else:
        raise TypeError(f"unsupported config type {kind} for {key}")
    raise BadInput(f"{key}={value!r} is not a valid {getattr(kind, '__name__', kind)}")


def build_config(cls: type[C], values: dict[str, Any]) -> C:
    """Build a frozen config from raw values, refusing unknown keys and invalid values."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in values if k not in names]
    if unknown:
        close = {k: difflib.get_close_matches(k, names, n=1) for k in unknown}
        hint = "; ".join(f"{k!r} (did you mean {c[0]!r}?)" if c else repr(k) for k, c in close.items())
        raise BadInput(f"unknown config key {hint}. Valid keys: {', '.join(names)}")
    missing = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING and f.name not in values]  # fmt: skip
    if missing:
        raise BadInput(f"the config has no {', '.join(missing)}; every run's config needs it")
    return cls(**{k: _coerce(k, v, hints[k]) for k, v in values.items()})


def resolve_config(
    cls: type[C], algo: str, env_id: str, continuous: bool, overrides: dict[str, Any], preset_file: Path | None = None
) -> tuple[C, str]:
    """Preset, then overrides; returns the validated config and the preset's name."""
    if "env_id" in overrides:
        raise BadInput(f"--set env_id={overrides['env_id']} would replace the env given by --env ({env_id}); "
                       "choose the env with --env (or --envs in a bench) instead")  # fmt: skip
    preset, preset_name = load_preset(algo, env_id, continuous, preset_file)
    return build_config(cls, {**preset, "env_id": env_id, **overrides}), preset_name
