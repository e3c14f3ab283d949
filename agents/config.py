"""Resolving an agent's config: preset YAML, then ``--set key=value`` overrides, then validation.

Every value is checked before any work starts; a bad key or value raises :class:`envs.BadInput` with
the valid keys or the valid range in its message.
"""

from __future__ import annotations

import dataclasses
import decimal
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from envs.errors import BadInput, brief

PRESET_DIR = Path(__file__).parent / "presets"
C = TypeVar("C")


def check(condition: bool, message: str) -> None:
    """Raise BadInput(message) unless ``condition``; used by the configs' ``__post_init__``."""
    if not condition:
        raise BadInput(message)


SEED_LIMIT = 2**32
"""Seeds lie in [0, 2³²): NumPy's global generator takes no more."""
INT_LIMIT = 2**63
"""Every integer setting fits a signed 64-bit integer, as torch and NumPy count."""

# Sizes one machine sensibly runs; ``--set size_limits=false`` lifts them. Beyond them a typo
# (n_envs=100000000) would exhaust memory or hang instead of being refused.
MAX_ENVS = 1024
"""Parallel envs of one run (PPO's n_envs; GRPO's group members, G · B)."""
MAX_BATCH = 2**20
"""Env steps collected per iteration (PPO's n_steps · n_envs)."""
MAX_EVAL_EPISODES = 1000
"""Episodes of one evaluation, each on an env of its own."""
MAX_WIDTH = 8192
"""Units of one hidden layer."""


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
    reward_offset: float = 0.0
    """c: subtracted from every training reward, r − c (ARS's alive-bonus offset, Mania et al. 2018 §4.1:
    with Hopper's healthy reward of 1 per step, c = 1 stops a policy from earning by standing still).
    Training only: evaluation and the logged episode returns use the env's own reward."""
    total_steps: int = 1_000_000
    """Env steps to train for; every sub-env step counts."""
    budget_seconds: float | None = None
    """A wall-clock budget: the run ends after the iteration in which its wall time reaches it, or at
    total_steps, whichever comes first. Wall time is counted alike for every algo: the run's whole
    training loop, evaluations and checkpoints included, earlier sessions of a resumed run too; in a stack,
    each seed counts the stack's time. The learning-rate schedule still runs over total_steps."""
    gamma: float = 0.99
    """γ: discount."""
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
    keep_checkpoints: tuple[int, ...] = ()
    """Env steps s at which to keep the policy for later study (``testbed audit``): the first checkpoint at or
    past s (one is written there if none is due) is also kept as ``checkpoint-at-<s>.pt``."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where the networks live; the envs always run on the CPU."""
    size_limits: bool = True
    """Refuse sizes beyond what one machine sensibly runs (``MAX_ENVS``, ``MAX_BATCH``,
    ``MAX_EVAL_EPISODES``, ``MAX_WIDTH``); false lifts these limits."""

    def __post_init__(self) -> None:
        check(0 <= self.seed < SEED_LIMIT, f"seed must be in [0, 2**32 - 1], got {self.seed}")
        check(self.total_steps > 0, f"total_steps must be positive, got {self.total_steps}")
        check(
            self.budget_seconds is None or self.budget_seconds > 0,
            f"budget_seconds must be positive (or none), got {self.budget_seconds}",
        )
        check(
            self.reward_delay in (None, "end") or self.reward_delay >= 1,
            f"reward_delay must be a number of steps >= 1, end or none; got {self.reward_delay}",
        )
        check(0.0 <= self.gamma <= 1.0, f"gamma must be in [0, 1], got {self.gamma}")
        check(self.learning_rate > 0, f"learning_rate must be positive, got {self.learning_rate}")
        check(self.ent_coef >= 0, f"ent_coef must be non-negative, got {self.ent_coef}")
        check(self.max_grad_norm > 0, f"max_grad_norm must be positive, got {self.max_grad_norm}")
        check(len(self.hidden_sizes) >= 1 and min(self.hidden_sizes) >= 1, "hidden_sizes must be positive widths")
        check(self.eval_interval >= 0, f"eval_interval must be >= 0, got {self.eval_interval}")
        check(self.eval_episodes >= 1, f"eval_episodes must be at least 1, got {self.eval_episodes}")
        check(self.checkpoint_interval >= 0, f"checkpoint_interval must be >= 0, got {self.checkpoint_interval}")
        check(
            all(s > 0 for s in self.keep_checkpoints),
            f"keep_checkpoints must be positive env steps, got {list(self.keep_checkpoints)}",
        )
        self.check_size(self.eval_episodes, MAX_EVAL_EPISODES, "eval_episodes")
        self.check_size(max(self.hidden_sizes), MAX_WIDTH, "the widest hidden layer")

    def check_size(self, value: int, limit: int, what: str) -> None:
        """BadInput if ``value`` exceeds ``limit`` while ``size_limits`` holds, saying how to lift the limit."""
        check(
            not self.size_limits or value <= limit,
            f"{what} is {value:,}, above the limit of {limit:,}; lower "
            "it, or add --set size_limits=false to lift the testbed's size limits",
        )


YAML_MAX_CHARS = 1_000_000
YAML_MAX_NODES = 100_000
YAML_MAX_DEPTH = 50


def load_yaml(text: str | bytes, source: str) -> Any:
    """A YAML document read with the safe loader and within bounds; BadInput naming ``source`` otherwise.

    Every file and value a user gives goes through here (presets, search spaces, env kwargs, run and
    study files). Bounds, checked before anything is built: at most ``YAML_MAX_CHARS`` characters, and a
    document of at most ``YAML_MAX_NODES`` nodes nested at most ``YAML_MAX_DEPTH`` deep, aliases counted
    as often as they expand, so that a few lines of nested aliases (a "billion laughs") are refused
    rather than expanded by whatever prints or walks them.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise BadInput(f"{source} is not UTF-8 text; give a YAML file") from None
    if len(text) > YAML_MAX_CHARS:
        raise BadInput(f"{source} holds {len(text):,} characters, more than the {YAML_MAX_CHARS:,} a YAML input may")
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_yaml_size(node, source)
        return loader.construct_document(node)
    except yaml.YAMLError as error:
        raise BadInput(f"{source} is not valid YAML ({brief(str(error).splitlines()[0], 160)})") from None
    except RecursionError:
        raise BadInput(f"{source} nests deeper than YAML input may ({YAML_MAX_DEPTH} levels)") from None
    finally:
        loader.dispose()


def read_yaml(path: Path) -> Any:
    """A YAML file of the testbed's (bench.yaml, tune.yaml, a study's), read as :func:`load_yaml` reads."""
    return load_yaml(path.read_bytes(), str(path))


def _check_yaml_size(root: yaml.Node, source: str) -> None:
    """BadInput if the node graph, expanded as it would be built, exceeds the nodes or depth YAML may have."""
    count, pending = 0, [(root, 1)]
    while pending:
        node, depth = pending.pop()
        count += 1
        if count > YAML_MAX_NODES or depth > YAML_MAX_DEPTH:
            what = (
                f"expands to more than {YAML_MAX_NODES:,} values"
                if count > YAML_MAX_NODES
                else f"nests more than {YAML_MAX_DEPTH} levels deep"
            )
            raise BadInput(f"{source} {what} (counting every alias where it expands); YAML input may not")
        if isinstance(node, yaml.SequenceNode):
            pending += [(child, depth + 1) for child in node.value]
        elif isinstance(node, yaml.MappingNode):
            pending += [(part, depth + 1) for pair in node.value for part in pair]


NO_PRESETS = "none (the config's defaults)"
"""The preset name of a run whose algo has no presets file: its config's defaults serve."""


def read_presets(name: str) -> dict[str, Any] | None:
    """``agents/presets/<name>.yaml``, read (``{"defaults": …, "envs": …}``); None where there is no such file,
    which is no error: an algo without presets trains with its config's defaults."""
    try:
        text = (PRESET_DIR / f"{name}.yaml").read_bytes()
    except FileNotFoundError:
        return None
    presets = load_yaml(text, f"agents/presets/{name}.yaml") or {}
    if not isinstance(presets, dict):
        raise BadInput(f"agents/presets/{name}.yaml must map defaults and envs to values; it is not a mapping")
    return presets


def read_preset_file(preset_file: Path) -> Any:
    """A ``--preset FILE``, read: BadInput in one line naming the file and the cause where it cannot be read."""
    try:
        text = preset_file.read_bytes()
    except OSError as error:
        cause = error.strerror or str(error)
        fix = "give a presets file, such as the preset.yaml that `testbed tune` writes"
        raise BadInput(f"--preset {preset_file}: cannot be read ({cause}); {fix}") from None
    try:
        return load_yaml(text, "the file")
    except BadInput as error:
        raise BadInput(f"--preset {preset_file}: cannot be read as YAML ({error})") from None


def load_preset(
    algo: str, env_id: str, continuous: bool, preset_file: Path | None = None
) -> tuple[dict[str, Any], str]:
    """The preset for ``env_id`` from ``presets/<algo>.yaml``, else its discrete/continuous default; without a
    presets file, no values (the config's defaults, named :data:`NO_PRESETS`).

    ``preset_file`` (``testbed train --preset``, RL Zoo's ``--conf-file``) is a file of the same form, e.g.
    the block ``testbed tune`` exports: its ``envs`` entry for ``env_id`` replaces the packaged one, and its
    ``defaults``, if any, the packaged defaults. Returns the values and the name of the preset used.
    """
    packaged = read_presets(algo)
    presets = packaged if packaged is not None else {}
    if preset_file is not None:
        own = read_preset_file(preset_file)
        entry = own.get("envs", {}).get(env_id) if isinstance(own, dict) and isinstance(own.get("envs"), dict) else None
        if not isinstance(entry, dict):
            raise BadInput(
                f"--preset {preset_file} has no entry for {env_id}: it needs "
                f"`envs: {{{env_id}: {{key: value, ...}}}}`, the form of agents/presets/{algo}.yaml"
            )
        defaults = {**(presets.get("defaults") or {}), **(own.get("defaults") or {})}
        presets = {"defaults": defaults, "envs": {env_id: entry}}
    elif packaged is None:
        return {}, NO_PRESETS
    default_name = "continuous" if continuous else "discrete"
    values = dict((presets.get("defaults") or {}).get(default_name) or {})
    if env_id in (presets.get("envs") or {}):
        values.update(presets["envs"][env_id])
        return values, f"{env_id} from {preset_file}" if preset_file is not None else env_id
    return values, f"default ({default_name})"


def preset_envs(algo: str) -> list[str]:
    """The env ids that ``presets/<algo>.yaml`` tunes: what a run on another version of a task is pointed to."""
    return list((read_presets(algo) or {}).get("envs") or {})


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """``["lr=1e-3", "gamma=0.9"]`` → ``{"lr": "1e-3", "gamma": "0.9"}``."""
    overrides: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise BadInput(f"--set expects key=value, got {brief(pair)}")
        overrides[key.strip()] = value.strip()
    return overrides


def parse_key_values(pairs: list[str]) -> dict[str, Any]:
    """``["horizon:300", "scale:0.1"]`` → ``{"horizon": 300, "scale": 0.1}``, each value read as YAML.

    Raises ValueError for a pair without ``:`` or without a key; blank items are skipped."""
    split = [item.partition(":") for item in pairs if item.strip()]
    if any(not sep or not key.strip() for key, sep, _ in split):
        raise ValueError(f"expected KEY:VALUE pairs, got {brief(pairs)}")
    try:
        return {
            key.strip(): load_yaml(value.strip(), f"the value of {brief(key.strip(), 60)}") for key, _, value in split
        }
    except BadInput as error:
        raise ValueError(str(error)) from None


def whole_number(text: str) -> int:
    """``text`` as an int, also in the exponent notation step counts are written in (``1e5``, ``2.5e6``,
    ``2048.0``) where it is exactly a whole number; otherwise ValueError saying why (its fix is the caller's).

    Read as a decimal, not a float, so that a large count stays exact and ``1.5e-3`` is refused, not rounded."""
    text = text.strip()
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    try:
        number = decimal.Decimal(text)
    except decimal.InvalidOperation:
        raise ValueError("not a number") from None
    if not number.is_finite() or number != number.to_integral_value():
        raise ValueError("not a whole number")
    if abs(number) >= INT_LIMIT:
        raise ValueError("too large for a 64-bit integer")
    return int(number)


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
        names = [
            " or ".join(map(repr, typing.get_args(a))) if typing.get_origin(a) is Literal else a.__name__ for a in arms
        ]
        raise BadInput(f"{key}={brief(value)} is not valid: give {', or '.join(names)}, or none")
    if origin is Literal:
        if str(value) not in args:
            raise BadInput(f"{key} must be one of {', '.join(map(str, args))}; got {brief(value)}")
        return str(value)
    if kind in (int, float) and isinstance(value, bool):
        # YAML reads true, yes and on as booleans, which Python would take as the number 1.
        raise BadInput(f"{key}={str(value).lower()} is a boolean, not a number; give a number")
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
            # Whole numbers exactly (2**62 + 1 stays itself), also written 1e5 or 2048.0 (YAML reads 1e5 as a string).
            if isinstance(value, int):
                if not -INT_LIMIT <= value < INT_LIMIT:
                    raise BadInput(f"{key}={brief(value, 40)} does not fit a 64-bit integer; give a smaller number")
                return value
            try:
                return whole_number(repr(value) if isinstance(value, float) else str(value))
            except ValueError as error:
                raise BadInput(
                    f"{key}={brief(value, 40)} is not a valid int ({error}); give a whole number such as 100000 or 1e5"
                ) from None
        if kind is float:
            number = float(value)
            if not math.isfinite(number):
                raise BadInput(f"{key} must be a finite number, got {brief(value, 40)}")
            return number
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
    raise BadInput(f"{key}={brief(value)} is not a valid {getattr(kind, '__name__', kind)}")


def build_config(cls: type[C], values: dict[str, Any]) -> C:
    """Build a frozen config from raw values, refusing unknown keys and invalid values."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in values if k not in names]
    if unknown:
        close = {k: difflib.get_close_matches(k, names, n=1) for k in unknown}
        hint = "; ".join(f"{k!r} (did you mean {c[0]!r}?)" if c else repr(k) for k, c in close.items())
        raise BadInput(f"unknown config key {hint}. Valid keys: {', '.join(names)}")
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in values
    ]
    if missing:
        raise BadInput(f"the config has no {', '.join(missing)}; every run's config needs it")
    return cls(**{k: _coerce(k, v, hints[k]) for k, v in values.items()})


def resolve_config(
    cls: type[C], algo: str, env_id: str, continuous: bool, overrides: dict[str, Any], preset_file: Path | None = None
) -> tuple[C, str]:
    """Preset, then overrides; returns the validated config and the preset's name."""
    if "env_id" in overrides:
        raise BadInput(
            f"--set env_id={overrides['env_id']} would replace the env given by --env ({env_id}); "
            "choose the env with --env (or --envs in a bench) instead"
        )
    preset, preset_name = load_preset(algo, env_id, continuous, preset_file)
    return build_config(cls, {**preset, "env_id": env_id, **overrides}), preset_name
