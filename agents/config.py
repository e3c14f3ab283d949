"""Resolving an agent's config: preset YAML, then ``--set key=value`` overrides, then validation.

Every value is checked before any work starts; a bad key or value raises :class:`envs.BadInput` with
the valid keys or the valid range in its message.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
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


def load_preset(algo: str, env_id: str, continuous: bool) -> tuple[dict[str, Any], str]:
    """The preset for ``env_id`` from ``presets/<algo>.yaml``, else its discrete/continuous default.

    Returns the values and the name of the preset used.
    """
    path = PRESET_DIR / f"{algo}.yaml"
    presets = yaml.safe_load(path.read_text())
    default_name = "continuous" if continuous else "discrete"
    values = dict(presets["defaults"][default_name])
    if env_id in presets.get("envs", {}):
        values.update(presets["envs"][env_id])
        return values, env_id
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
    return {key.strip(): yaml.safe_load(value.strip()) for key, _, value in split}


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
            return parse_key_values(str(value).strip("{} ").split(","))
        if origin is tuple:
            items = value if isinstance(value, (list, tuple)) else str(value).strip("[]() ").split(",")
            return tuple(_coerce(key, item, args[0]) for item in items if str(item).strip() != "")
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
    return cls(**{k: _coerce(k, v, hints[k]) for k, v in values.items()})


def resolve_config(
    cls: type[C], algo: str, env_id: str, continuous: bool, overrides: dict[str, Any]
) -> tuple[C, str]:
    """Preset, then overrides; returns the validated config and the preset's name."""
    preset, preset_name = load_preset(algo, env_id, continuous)
    return build_config(cls, {**preset, "env_id": env_id, **overrides}), preset_name
