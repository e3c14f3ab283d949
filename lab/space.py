"""A tuning study's search space: config keys mapped to a list of choices or a range.

An algo's default space is the one its module declares (``SPACE`` in ``agents/ppo.py``, given to its
``Declaration``; :func:`default_space`); ``testbed tune --space FILE`` gives another, as YAML of the same form.
Each key: a list of choices, or ``{low, high, log?, int?}``. What sets the env steps of an iteration (PPO's
n_steps, n_envs) must be a list: :func:`iteration_sizes` enumerates it, so that a study can give every trial the
same budget.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

from agents import registry
from agents.config import load_yaml
from envs.errors import BadInput

if TYPE_CHECKING:
    import optuna

MAX_SHAPES = 10_000
"""The most combinations of iteration-shaping choices (n_steps × n_envs …) a study enumerates."""
SPREAD = 16
"""A study's budget is a multiple of every iteration size; their least common multiple may exceed the largest
size this many times at most (powers of two: once), or trials would train far past --total-steps."""


@dataclass(frozen=True)
class Param:
    """One config key's range: ``choices`` (categorical), or ``low``..``high`` (float, or int), maybe log."""

    name: str
    choices: tuple[Any, ...] | None = None
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    integer: bool = False

    def suggest(self, trial: optuna.Trial) -> Any:
        if self.choices is not None:
            # Optuna's choices are scalars: a list (hidden_sizes) travels as its YAML text.
            encoded = [_encode(c) for c in self.choices]
            return _decode(trial.suggest_categorical(self.name, encoded))
        if self.integer:
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, log=self.log)

    def contains(self, value: Any) -> bool:
        if self.choices is not None:
            return _encode(value) in [_encode(c) for c in self.choices]
        return isinstance(value, (int, float)) and not isinstance(value, bool) and self.low <= value <= self.high

    def ends(self) -> list[Any]:
        """The values a config must accept for the whole range to be valid: every choice, or both ends."""
        if self.choices is not None:
            return list(self.choices)
        return [int(self.low), int(self.high)] if self.integer else [self.low, self.high]

    def expressing(self, value: Any) -> tuple[bool, Any]:
        """(whether the space can express ``value``, the value it takes): a choice that holds it, or a range,
        into which it is moved (a preset's ent_coef of 0 becomes the range's low end)."""
        if self.choices is not None:
            return self.contains(value), _encode(value)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False, None
        low, high = (int(self.low), int(self.high)) if self.integer else (self.low, self.high)
        return True, min(max(value, low), high)


def _encode(value: Any) -> Any:
    return yaml.safe_dump(value, default_flow_style=True).strip() if isinstance(value, (list, tuple, dict)) else value


def _decode(value: Any) -> Any:
    return yaml.safe_load(value) if isinstance(value, str) and value[:1] in "[{" else value


def as_list(value: Any) -> Any:
    """A config's tuple (hidden_sizes) as the list a space file writes."""
    return list(value) if isinstance(value, tuple) else value


def parse_space(text: str, source: str) -> dict[str, Param]:
    """A space file's text as params. Each key: a list of choices, or ``{low, high, log?, int?}``."""
    raw = load_yaml(text, source) or {}
    if not isinstance(raw, dict) or not raw:
        raise BadInput(
            f"{source} must map config keys to a list of choices or {{low, high, log}}; it is empty or not a mapping"
        )
    space: dict[str, Param] = {}
    for name, entry in raw.items():
        where = f"{source}: {name}"
        if isinstance(entry, list):
            if not entry:
                raise BadInput(f"{where} has no choices; list at least one value")
            space[name] = Param(str(name), choices=tuple(entry))
            continue
        if (
            not isinstance(entry, dict)
            or not {"low", "high"} <= set(entry)
            or set(entry) - {"low", "high", "log", "int"}
        ):
            raise BadInput(
                f"{where} must be a list of choices or a mapping with low and high (and optionally log, int); got "
                f"{entry!r}"
            )
        low, high, log, integer = (
            entry["low"],
            entry["high"],
            bool(entry.get("log", False)),
            bool(entry.get("int", False)),
        )
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (low, high)):
            raise BadInput(f"{where}: low and high must be finite numbers; got {low!r} and {high!r}")
        if not low < high:
            raise BadInput(
                f"{where}: the range is empty, low ({low}) must be below high ({high}); for one value, fix it with "
                f"--set {name}={low} instead"
            )
        if log and low <= 0:
            raise BadInput(f"{where}: a log range needs low > 0; got {low}")
        if integer and not (float(low).is_integer() and float(high).is_integer()):
            raise BadInput(f"{where}: an int range needs whole low and high; got {low} and {high}")
        space[name] = Param(str(name), low=float(low), high=float(high), log=log, integer=integer)
    return space


def with_ranges(text: str, varies: list[str] | tuple[str, ...], source: str) -> str:
    """The space ``text`` with each ``--vary KEY=RANGE`` setting KEY's range (a YAML list or ``{low, high}``).

    Where one env needs a choice the algo's space leaves out (Humanoid's survival bonus is 5, the space
    offsets 0 or 1), a study varies that key and keeps the rest of the shared space.
    """
    if not varies:
        return text
    raw = load_yaml(text, source) or {}
    if not isinstance(raw, dict):
        parse_space(text, source)  # BadInput: not a mapping
    for pair in varies:
        key, sep, value = (part.strip() for part in pair.partition("="))
        if not sep or not key or not value:
            raise BadInput(
                f"--vary {pair!r}: give KEY=RANGE, RANGE a YAML list of choices or {{low: …, high: …}}, e.g. --vary "
                "'reward_offset=[0.0, 5.0]'"
            )
        entry = load_yaml(value, f"--vary {key}")
        parse_space(yaml.safe_dump({key: entry}), "--vary")  # BadInput naming the flag, not the file
        raw[key] = entry
    return yaml.safe_dump(raw, sort_keys=False, default_flow_style=None, width=120, allow_unicode=True)


CONTINUOUS_ONLY = frozenset({"log_std_init"})
"""Config keys that only a Gaussian policy reads (the initial log σ of continuous actions): a categorical
policy over discrete actions has no σ."""


def for_action_space(text: str, space: dict[str, Param], continuous: bool) -> tuple[str, dict[str, Param]]:
    """A space's text and params less the keys that the env's policy never reads: on discrete actions, the σ
    parameters (:data:`CONTINUOUS_ONLY`).

    Searched there, such a key changes nothing, yet TPE spends samples on it, the importance ranking credits it
    with the noise between trials, and the exported preset writes it as tuned."""
    unread = set(space) & CONTINUOUS_ONLY if not continuous else set()
    if not unread:
        return text, space
    raw = yaml.safe_load(text)
    kept = yaml.safe_dump(
        {k: v for k, v in raw.items() if k not in unread},
        sort_keys=False,
        default_flow_style=None,
        width=120,
        allow_unicode=True,
    )
    return kept, {k: p for k, p in space.items() if k not in unread}


SHARED_SPACE: dict[str, Any] = {
    "learning_rate": {"low": 1.0e-5, "high": 3.0e-3, "log": True},
    "gamma": [0.95, 0.98, 0.99, 0.995, 0.999],
    "ent_coef": {"low": 1.0e-8, "high": 0.1, "log": True},
    "max_grad_norm": [0.3, 0.5, 1.0, 5.0],
    "hidden_sizes": [[64, 64], [256, 256]],
    "activation": ["tanh", "relu"],
    "ortho_init": [True, False],
    "log_std_init": {"low": -3.0, "high": 0.5},
}
"""The space of an algo that declares none: settings of :class:`agents.config.RunConfig`, which every agent reads
the same way, over the ranges PPO's space gives them."""


def derived_space(config: type) -> dict[str, Any]:
    """The search space derived from a config class: :data:`SHARED_SPACE`'s keys that are its fields."""
    fields = {f.name for f in dataclasses.fields(config)}
    return {key: entry for key, entry in SHARED_SPACE.items() if key in fields}


def default_space(algo: registry.Algo) -> tuple[str, str]:
    """An algo's default search space, as YAML text, and the name messages give it: the space its module declares
    (a variant's is its base algo's), else that of the algo whose presets it takes (``sb3-ppo``: ``ppo``'s), else
    one derived from its config (:func:`derived_space`)."""
    mirrored = registry.entries().get(algo.preset)
    if algo.space is not None:
        space, source = algo.space, f"{algo.base}'s space"
    elif mirrored is not None and mirrored.name != algo.base and registry.load(mirrored).space is not None:
        space, source = registry.load(mirrored).space, f"{mirrored.name}'s space"
    else:
        space, source = derived_space(algo.config), f"{algo.base}'s space (derived from its config)"
    text = yaml.safe_dump(dict(space), sort_keys=False, default_flow_style=None, width=120, allow_unicode=True)
    return text, source


def admitting(config: Callable[[dict[str, Any]], Any], values: dict[str, Any], space: dict[str, Param]) -> Any:
    """A trial's config with ``values``, alone or with one end of another parameter of the space: a minibatch
    of 256 is refused with a preset's 128-step rollouts, not with the space's 256-step ones. Raises the
    BadInput of ``values`` alone when no such combination is accepted."""
    try:
        return config(values)
    except BadInput as error:
        refusal = error
    for other in space.values():
        for end in other.ends() if other.name not in values else []:
            try:
                return config({**values, other.name: end})
            except BadInput:
                continue
    raise refusal


def iteration_sizes(
    space: dict[str, Param], config: Callable[[dict[str, Any]], Any], source: str
) -> tuple[int, ...] | None:
    """Every number of env steps one iteration of a study's trials can take (``config``: a trial's validated
    config for some of the space's values, ``TunePlan.config``), smallest first; None for an algo
    whose iterations vary in length. A run stops after the iteration that reaches its budget, so a budget
    that is a multiple of all of them is one that every trial trains exactly.

    PPO's iteration is n_steps · n_envs (its config's ``batch_size``) whatever the episodes do, and only the
    parameters that change it count: the sizes are those of every combination of their choices that the
    algo accepts. GRPO's is B · G episodes, which end when they end (and vine branches on top): None."""
    base = config({})
    if not hasattr(base, "batch_size"):
        return None

    def shapes(param: Param) -> bool:
        return any(admitting(config, {param.name: v}, space).batch_size != base.batch_size for v in param.ends())

    shaping = [p for p in space.values() if shapes(p)]
    for param in shaping:
        if param.choices is None:
            raise BadInput(
                f"{source}: {param.name} changes n_steps · n_envs, the env steps of one iteration, and is a range, so "
                f"trials could not train equal budgets; give it as a list of choices, e.g. {param.name}: "
                f"[{int(param.low)}, {int(param.high)}]"
            )
    combinations = math.prod(len(p.choices or ()) for p in shaping)
    if combinations > MAX_SHAPES:
        raise BadInput(
            f"{source}: {' × '.join(p.name for p in shaping)} make {combinations:,} iteration shapes, more than "
            f"{MAX_SHAPES:,}; list fewer choices"
        )
    sizes: set[int] = set()
    for values in itertools.product(*(p.choices or () for p in shaping)):
        try:
            sizes.add(config(dict(zip((p.name for p in shaping), values))).batch_size)
        except BadInput:  # a combination the algo refuses: no trial trains it (new_trial tells it as failed)
            continue
    sizes = sizes or {base.batch_size}
    if math.lcm(*sizes) > SPREAD * max(sizes):
        listed = ", ".join(map(str, sorted(sizes)))
        raise BadInput(
            f"{source}: {' × '.join(p.name for p in shaping)} give iterations of {listed} env steps, so every trial's "
            f"budget would be a multiple of {math.lcm(*sizes):,}; choose values whose n_steps · n_envs divide one "
            "another (powers of two do)"
        )
    return tuple(sorted(sizes))
