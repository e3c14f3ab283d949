"""The algorithms the testbed can train, by the name a user gives ``--algo``.

**One registration.** Each algorithm module declares itself once, at its end: ``ALGORITHMS``, a tuple of
:class:`Declaration` (the algo's name, its config class, its training and policy-loading functions, the presets
file it takes, its variants and, optionally, its tuning space). A variant (``ppo-lambda0``, ``grpo-vine``, …) is
the algo with some config values fixed, declared by the module of the algo it varies; its name is carried into
the run's files. The registry itself lists only the modules that declare algorithms (:data:`MODULES`, one line
each): adding an algorithm is its module and that line, and optionally its ``agents/presets/<name>.yaml``.

**Names before torch.** The command line checks and lists algo names before torch is imported (torch takes
seconds; ``--help`` and a misspelled name are answered without it), and the algorithm modules import torch. So
the declarations are read twice, from one text: :func:`entries` parses each module's source (``ast``, no import)
and reads the literal arguments ``name``, ``presets`` and ``variants`` of its ``Declaration(...)`` calls, which
names every algo and variant; :func:`get` imports the one module that declares the algo asked for and takes the
rest (functions, config class, space) from the objects. ``tests/test_registry.py`` checks the two readings agree.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.config import RunConfig
from envs.errors import BadInput

if TYPE_CHECKING:
    from gymnasium.vector import VectorEnv

MODULES = ("agents.ppo", "agents.grpo", "agents.a2c", "agents.sb3")
"""The modules that declare algorithms (each an ``ALGORITHMS`` tuple at its end), in the order ``--help`` lists
their algos: the one table a new algorithm is added to."""
STATIC = ("name", "presets", "variants")
"""The arguments of a :class:`Declaration` read from its module's source, so written as literals there."""


def no_checks(cfg: Any) -> None:
    """An algo with no checks of its own beyond the env's."""


@dataclass(frozen=True)
class Declaration:
    """What an algorithm module says about itself, once (``ALGORITHMS = (Declaration(...),)`` at its end).

    ``name``, ``presets`` and ``variants`` are literals in the source: the registry reads them without importing
    the module (see the module docstring)."""

    name: str
    """What ``--algo`` calls it."""
    config: type[RunConfig]
    """Its frozen config dataclass."""
    train: Callable[..., dict[str, Any]]
    """``train(cfg, run_dir, resume, name, callback=None)``: trains into ``run_dir``, calling ``callback`` after
    each iteration (``training.Callback``); returns the summary."""
    load_policy: Callable[[Any, VectorEnv, dict[str, Any]], Any]
    """``load_policy(cfg, eval_env, weights)``: rebuilds the checkpoint's policy for ``testbed eval`` and audits."""
    train_stack: Callable[..., list[dict[str, Any]]] | None = None
    """``train_stack(cfgs, run_dirs, resumes, name, callback=None)``: seeds side by side in one process; None: not
    supported."""
    checks: Callable[[Any], None] = no_checks
    """The algo's own checks that need the env."""
    presets: str | None = None
    """Its presets file, ``agents/presets/<presets>.yaml``; None: its own name. A reference implementation takes
    the presets of the algo it mirrors (``sb3-ppo``: ``ppo``). A missing file: the config's defaults."""
    variants: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Each variant's name → the config values it fixes (not overridable)."""
    space: Mapping[str, Any] | None = None
    """Its search space for ``testbed tune`` (config key → a list of choices or ``{low, high, log?, int?}``, the
    form of ``lab/space.py``); None: the space of the algo whose presets it takes, else one derived from the
    config (:func:`lab.space.derived_space`)."""


@dataclass(frozen=True)
class Entry:
    """One algo name as the source declares it, known without importing its module."""

    name: str
    module: str
    """The module that declares it."""
    base: str
    """The declared algo it is, or varies."""
    fixed: dict[str, Any]
    """The config values its variant fixes; empty for a declared algo."""
    preset: str
    """Its presets file, ``agents/presets/<preset>.yaml`` (a variant's is its base algo's)."""


def static_declarations(module: str) -> list[dict[str, Any]]:
    """The literal arguments (:data:`STATIC`) of each ``Declaration(...)`` in ``ALGORITHMS`` of ``module``'s source,
    read without importing it. TypeError, for the author of the module, where one is not written as a literal."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"agents/registry.py lists {module}, which does not exist")
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"), spec.origin)
    found: list[dict[str, Any]] = []
    for statement in tree.body:
        targets = statement.targets if isinstance(statement, ast.Assign) else [getattr(statement, "target", None)]
        if not any(isinstance(t, ast.Name) and t.id == "ALGORITHMS" for t in targets):
            continue
        for node in ast.walk(statement):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Declaration":
                given = {k.arg: k.value for k in node.keywords if k.arg in STATIC}
                if node.args:  # Declaration("ppo", ...): the name, positionally
                    given["name"] = node.args[0]
                try:
                    found.append({key: ast.literal_eval(value) for key, value in given.items()})
                except ValueError:
                    where = f"{spec.origin}:{node.lineno}"
                    raise TypeError(f"{where}: write {', '.join(STATIC)} of a Declaration as literals") from None
    if not found:
        raise TypeError(f"{spec.origin} declares no algorithm: end it with ALGORITHMS = (Declaration(...),)")
    return found


@functools.cache
def entries() -> dict[str, Entry]:
    """Every algo name, declared algos first then their variants, each in :data:`MODULES`' order; imports no
    algorithm."""
    declared = [(module, d) for module in MODULES for d in static_declarations(module)]
    bases = {
        d["name"]: Entry(d["name"], module, d["name"], {}, d.get("presets") or d["name"]) for module, d in declared
    }
    variants = {
        name: Entry(name, module, d["name"], dict(fixed), bases[d["name"]].preset)
        for module, d in declared
        for name, fixed in (d.get("variants") or {}).items()
    }
    names = [d["name"] for _, d in declared] + [name for _, d in declared for name in d.get("variants") or {}]
    if len(set(names)) != len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise TypeError(f"algo names declared twice: {', '.join(twice)}; give each algo and variant its own name")
    return {**bases, **variants}


def check_name(name: str) -> Entry:
    """The declared ``name``, or BadInput listing the known algos; imports no algorithm."""
    found = entries().get(name)
    if found is None:
        raise BadInput(f"unknown algo {name!r}; choose one of {', '.join(entries())}")
    return found


def preset_of(name: str) -> str:
    """The presets file of the algo ``name`` (a variant's is its base algo's); imports no algorithm."""
    return check_name(name).preset


def __getattr__(attribute: str) -> Any:
    """``NAMES``: every algo name, read from the declarations when first asked for."""
    if attribute == "NAMES":
        return tuple(entries())
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


@dataclass(frozen=True)
class Algo:
    """One algo name, resolved: its declaration's parts, with the values its variant fixes."""

    name: str
    config: type[RunConfig]
    train: Callable[..., dict[str, Any]]
    """``train(cfg, run_dir, resume, name, callback=None)``: trains into ``run_dir``, calling ``callback`` after
    each iteration (``training.Callback``); returns the summary."""
    load_policy: Callable[[Any, VectorEnv, dict[str, Any]], Any]
    """``load_policy(cfg, eval_env, weights)``: rebuilds the checkpoint's policy for ``testbed eval``."""
    checks: Callable[[Any], None] = no_checks
    """The algo's own checks that need the env."""
    preset: str = ""
    """The presets file, ``agents/presets/<preset>.yaml``."""
    fixed: dict[str, Any] = field(default_factory=dict)
    """Config values that make this algo a variant of another (PPO with λ = 0, say); not overridable."""
    base: str = ""
    """The declared algo it is, or varies (``ppo`` for ``ppo-lambda0``)."""
    train_stack: Callable[..., list[dict[str, Any]]] | None = None
    """``train_stack(cfgs, run_dirs, resumes, name, callback=None)``: seeds side by side in one process, each
    resumed from its checkpoint or started; None: not supported."""
    space: Mapping[str, Any] | None = None
    """Its declared search space (its base's, for a variant), before what the variant fixes is taken out."""

    def check_stack(self, cfgs: list[RunConfig]) -> None:
        """The configs can train as one stack (they differ in the seed only)."""
        from agents.training import check_stack  # here, on first use: the lifecycle imports torch

        check_stack(cfgs)

    def validate(self, cfg: RunConfig) -> None:
        """Every check that needs the env, run before anything is written: the env builds with the
        config's keyword arguments, and the algo's own checks pass."""
        from agents.run_envs import check_env  # here, on first use: it imports torch

        check_env(cfg)
        self.checks(cfg)


def declared_in(module: str) -> dict[str, Declaration]:
    """The declarations of ``module``, imported, by name."""
    declarations = getattr(importlib.import_module(module), "ALGORITHMS", ())
    return {d.name: d for d in declarations}


_resolved: dict[str, Algo] = {}
"""The algos resolved so far, by name (a benchmark may replace one, to time its training)."""


def load(entry: Entry) -> Algo:
    """The algo ``entry`` names (from :func:`check_name`), resolved; imports the module that declares it (the first
    time: the algorithms import torch), and only that one."""
    if entry.name not in _resolved:
        declaration = declared_in(entry.module)[entry.base]
        _resolved[entry.name] = Algo(
            name=entry.name,
            config=declaration.config,
            train=declaration.train,
            load_policy=declaration.load_policy,
            checks=declaration.checks,
            preset=entry.preset,
            fixed=dict(entry.fixed),
            base=entry.base,
            train_stack=declaration.train_stack,
            space=declaration.space,
        )
    return _resolved[entry.name]


def get(name: str) -> Algo:
    """The algo called ``name``, or BadInput listing the known ones (:func:`check_name`, then :func:`load`)."""
    return load(check_name(name))


def algos() -> dict[str, Algo]:
    """Every algo by name; imports every algorithm module."""
    for name in entries():
        get(name)
    return _resolved
