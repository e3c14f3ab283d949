"""The user's own environments: a factory (a callable that returns a gymnasium env) registered with gymnasium under
an id that every part of the testbed takes like any other.

Three ways to name an env, all ending as a gymnasium id:

- a registered id, ``CartPole-v1``;
- ``module:EnvId``: importing ``module`` registers ``EnvId`` (gymnasium's own convention);
- ``module:function``: ``function`` is a factory at the top of an importable ``module``; importing the module
  finds it, and it is registered under the id ``function`` (:func:`resolve_function`). A factory passed as an
  object whose import path another process could import is named this way (:func:`import_path`), so that a run
  records how to remake its env: ``testbed eval`` and a resume import it, as they import a ``module:EnvId``
  (with ``--trust-env-module`` from a run folder).

Any other factory (one defined in a notebook or a script, a lambda, a closure) is registered as
``factory/<name>`` (:data:`NAMESPACE`), for this process alone. A trainer process that a bench starts receives
it by value (``lab.factories``); no other process can remake it, and :func:`check_known` says so in one line.

A factory's env is checked once as it is registered (:func:`register`): it must be a gymnasium ``Env``. One
whose ``reset`` takes no seed gets a wrapper that seeds its generator as ``gymnasium.Env.reset`` does
(:class:`SeedlessReset`), so that PPO and A2C train it; GRPO, which starts the members of a group from one
state by resetting them with one seed, refuses it (``envs.start_states.check_seeded_reset``).
"""

from __future__ import annotations

import inspect
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym

from envs.errors import BadInput, brief

NAMESPACE = "factory"
"""The gymnasium namespace of factories that only this process knows: ``factory/make_env``."""
EnvFactory = Callable[..., gym.Env]
"""A callable that returns a gymnasium env; the run's ``env_kwargs`` are its keyword arguments."""

_registered: dict[str, EnvFactory] = {}
"""The factories registered in this process, by the id they were registered under."""


class SeedlessReset(gym.Wrapper):
    """An env whose ``reset`` takes no ``seed`` (or no ``options``): a seed seeds its generator, ``np_random``, as
    ``gymnasium.Env.reset`` does, and ``reset`` is called with the keywords it takes."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.takes = reset_keywords(env)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if seed is not None and "seed" not in self.takes:
            gym.Env.reset(self.env.unwrapped, seed=seed)
        given = {"seed": seed, "options": options}
        return self.env.reset(**{k: v for k, v in given.items() if k in self.takes and v is not None})


def reset_keywords(env: gym.Env) -> set[str]:
    """Which of ``seed`` and ``options`` the env's own ``reset`` (its unwrapped env's) takes."""
    parameters = inspect.signature(env.unwrapped.reset).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return {"seed", "options"}
    return {p.name for p in parameters if p.name in ("seed", "options")}


def describe(make: EnvFactory) -> str:
    """The factory as a message names it: its qualified name, else its repr, cut."""
    return brief(getattr(make, "__qualname__", None) or make, 80).strip("'")


class FactoryEnv:
    """The entry point a factory is registered with: it calls the factory with the env's keyword arguments, and
    refuses what is not a gymnasium env (:func:`made_env`)."""

    def __init__(self, make: EnvFactory) -> None:
        self.make = make

    def __call__(self, **kwargs: Any) -> gym.Env:
        # gymnasium's make and SB3's ask for a render mode; a factory that takes none draws its own way.
        if "render_mode" in kwargs and not takes_keyword(self.make, "render_mode"):
            del kwargs["render_mode"]
        return made_env(self.make, kwargs)


def takes_keyword(make: EnvFactory, name: str) -> bool:
    """Whether ``make`` takes the keyword argument ``name`` (by name, or through ``**kwargs``)."""
    try:
        parameters = inspect.signature(make).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: let the call say
        return True
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def made_env(make: EnvFactory, kwargs: dict[str, Any]) -> gym.Env:
    """``make(**kwargs)``, checked to be a gymnasium ``Env`` (wrapped in :class:`SeedlessReset` where its reset
    takes no seed); BadInput, in one line, for anything else."""
    name = describe(make)
    try:
        env = make(**kwargs)
    except TypeError as error:
        if kwargs:
            raise BadInput(
                f"the env factory {name} does not take env_kwargs {brief(kwargs)} ({brief(str(error), 120)}); give it "
                "keyword parameters for them, or drop them"
            ) from None
        raise
    if isinstance(env, gym.vector.VectorEnv):
        raise BadInput(f"the env factory {name} returned a vector env; return one env: the testbed vectorizes it")
    if not isinstance(env, gym.Env):
        raise BadInput(
            f"the env factory {name} returned a {type(env).__name__}, not a gymnasium Env; return an env "
            'object, e.g. gym.make("Pendulum-v1") or an instance of your gymnasium.Env subclass'
        )
    for space in ("observation_space", "action_space"):
        if not isinstance(getattr(env, space, None), gym.Space):
            raise BadInput(f"the env factory {name} returned an env without an {space} (a gymnasium Space); set one")
    return env if {"seed", "options"} <= reset_keywords(env) else seedless_adapted(env)


def seedless_adapted(env: gym.Env) -> gym.Env:
    """``env`` with a :class:`SeedlessReset` right around its own env, inside any wrappers of its (a TimeLimit
    passes the seed down to the env it wraps)."""
    if not isinstance(env, gym.Wrapper):
        return SeedlessReset(env)
    layer = env
    while isinstance(layer.env, gym.Wrapper):
        layer = layer.env
    layer.env = SeedlessReset(layer.env)
    return env


def import_path(make: EnvFactory) -> str | None:
    """``module:function`` where another process started from here (same working folder, same environment) can
    import ``make`` by that path: a function or class at the top of a module, not ``__main__``, imported from the
    working folder, from ``PYTHONPATH`` or from an installed package. None otherwise (a notebook's function, a
    lambda, a closure, a module found through a folder this process added to ``sys.path``)."""
    module_name, name = getattr(make, "__module__", None), getattr(make, "__qualname__", None)
    if not module_name or not name or module_name == "__main__" or not name.isidentifier():
        return None
    module = sys.modules.get(module_name)
    if module is None or getattr(module, name, None) is not make:
        return None
    origin = getattr(module, "__file__", None)
    if origin is None:
        return None
    # The folder the module was imported from: its file, less one folder per dotted part of its name.
    root = Path(origin).resolve().parents[module_name.count(".") + (Path(origin).stem == "__init__")]
    visible = [Path.cwd(), *(Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    installed = any(part in ("site-packages", "dist-packages") for part in Path(origin).parts)
    if installed or any(root == folder.resolve() for folder in visible):
        return f"{module_name}:{name}"
    return None


def factory_id(make: EnvFactory) -> str:
    """The env id a factory is registered under: its import path (:func:`import_path`), else
    ``factory/<its name>``, which only this process and the trainers it sends the factory to know."""
    path = import_path(make)
    if path is not None:
        return path
    name = re.sub(r"[^\w.-]+", "_", getattr(make, "__name__", None) or type(make).__name__).strip("_.")
    return f"{NAMESPACE}/{name or 'env'}"


def register(make: EnvFactory, env_id: str | None = None, check: bool = True) -> str:
    """Register the factory with gymnasium for this process; returns the env id a run records (:func:`factory_id`,
    or ``env_id``: a trainer registers a factory it received under the id its driver gave it).

    ``check``: make one env first, so that what is not a gymnasium env is refused in one line before any work.
    A factory registered again under the same id (a notebook's cell run again) replaces the earlier one; two
    different factories that would share an id are refused."""
    if not callable(make):
        raise BadInput(
            f"an env is an id (CartPole-v1), a module:Id string or a factory (a callable that returns a gymnasium "
            f"env); got {brief(make, 80)}"
        )
    env_id = env_id or factory_id(make)
    name = env_id.rpartition(":")[2]
    earlier = _registered.get(name)
    if earlier is not None and earlier is not make and factory_id(earlier) != env_id:
        raise BadInput(
            f"two env factories would share the id {name}: {describe(earlier)} and {describe(make)}; give them "
            "different names"
        )
    if earlier is None and name in gym.registry:
        raise BadInput(f"the env factory {describe(make)} is named {name}, a registered gymnasium id; rename it")
    if check:
        made_env(make, {}).close()
    if name in gym.registry:
        del gym.registry[name]  # gymnasium warns when an id is registered over
    gym.register(name, entry_point=FactoryEnv(make))
    _registered[name] = make
    return env_id


def resolve_function(module: Any, name: str) -> gym.envs.registration.EnvSpec | None:
    """The spec of ``module:name`` where ``name`` is a factory at the top of ``module`` (and no id that importing
    the module registered), registered here under ``name``; None where the module has no such callable."""
    make = getattr(module, name, None)
    if not callable(make) or (isinstance(make, type) and not issubclass(make, gym.Env)):
        return None
    if name in gym.registry and name not in _registered:
        return None  # an id of its own, which importing the module registered
    register(make, f"{module.__name__}:{name}", check=False)
    return gym.spec(name)


def registered(env_id: str) -> EnvFactory | None:
    """The factory registered under ``env_id`` in this process, None for any other id."""
    return _registered.get(env_id.rpartition(":")[2])


def check_known(env_id: str) -> None:
    """BadInput for a ``factory/…`` id that this process was not given the factory of: its run was trained from
    a factory no other process can import, so only Python code that holds that factory can remake it."""
    if env_id.startswith(f"{NAMESPACE}/") and env_id not in gym.registry:
        raise BadInput(
            f"{env_id} was made by an env factory that no other process can import (a notebook's or a script's "
            "function, a lambda); remake it from Python by passing that factory again (lab.api's load(RUN_DIR, "
            "env=FACTORY), or train(ALGO, FACTORY, run_dir=RUN_DIR, resume=True)), or define it in a module and train "
            "with --env module:function"
        )
