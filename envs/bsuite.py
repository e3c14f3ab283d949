"""bsuite's credit-assignment and memory experiments (Osband et al. 2020, "Behaviour Suite for Reinforcement
Learning", ICLR), as gymnasium envs through Shimmy: ``bsuite/<experiment>-v0`` with a sweep setting's keyword
arguments (``bsuite/umbrella_length-v0`` with ``chain_length=20, n_distractor=20``).

- **Experiments.** :data:`EXPERIMENTS`: ``umbrella_length`` (the umbrella's pay-off comes ``chain_length`` steps
  after the choice, with ±1 random rewards in between), ``umbrella_distract`` (20 steps, more distracting
  observation bits), ``discounting_chain`` (five chains paying 1 after 1, 3, 10, 30 or 100 steps, one of them
  1.1) and ``memory_len`` (a bit shown at the first step must be repeated ``memory_length`` steps later). Each
  has bsuite's fixed sweep of settings (``bsuite.sweep.SETTINGS``, e.g. ``umbrella_length/0`` … ``/22``) and
  a fixed number of episodes (``NUM_EPISODES`` of its ``sweep`` module), over which bsuite scores it.
- **Registration.** Shimmy registers every bsuite env when it is imported; :func:`register` imports it on the
  first use of a ``bsuite/`` id (:func:`envs.factory.check_env_id`), so that nothing else pays its import.
- **Episodes.** Each setting's episodes last a fixed number of steps whatever the actions
  (:func:`episode_length`, measured), so a budget of bsuite's episodes is one of env steps.
- **Observations** are (1, n) arrays; the factory's vector envs flatten every observation that is not a
  vector (``FlattenObservation``), so the networks see (n,).
- **Seeds and states.** Shimmy's ``reset(seed=s)`` re-seeds the env's ``RandomState``, so members reset with
  the same seed start alike (GRPO's groups). Their whole state is plain attributes and that ``RandomState``,
  which :mod:`envs.snapshot` takes and sets (:func:`state`, :func:`set_state`): vine branches work.
"""

from __future__ import annotations

import copy
import functools
import importlib
from typing import Any

import gymnasium as gym
import numpy as np

from envs.errors import BadInput

NAMESPACE = "bsuite/"
EXPERIMENTS = {
    "umbrella_length": "credit assignment",
    "umbrella_distract": "credit assignment",
    "discounting_chain": "credit assignment",
    "memory_len": "memory",
}
"""The experiments the testbed studies, with bsuite's tag for what each measures."""
INSTALL = "pip install 'shimmy[bsuite]'"


def is_bsuite(env_id: str) -> bool:
    """Whether ``env_id`` names a bsuite env (``bsuite/<experiment>-v0``)."""
    return env_id.rpartition(":")[2].startswith(NAMESPACE)


def env_id(experiment: str) -> str:
    return f"{NAMESPACE}{experiment}-v0"


def experiment_of(env_id: str) -> str:
    """``bsuite/umbrella_length-v0`` → ``umbrella_length``."""
    return env_id.rpartition(":")[2].removeprefix(NAMESPACE).rpartition("-v")[0]


def register() -> None:
    """Register bsuite's envs with gymnasium (Shimmy does it as it is imported); BadInput if not installed.

    Shimmy's ids take a setting's keyword arguments and have no defaults, so ``gym.make("bsuite/memory_len-v0")``
    would fail; each id of :data:`EXPERIMENTS` gets its sweep's first setting (``bsuite_id`` ``<experiment>/0``) as
    defaults, which given keyword arguments override, as a registered id's own kwargs are."""
    try:
        importlib.import_module("shimmy")
        sweep = importlib.import_module("bsuite.sweep")
    except ImportError as error:
        raise BadInput(f"bsuite envs need Shimmy and bsuite ({error}). Fix: {INSTALL}") from None
    for experiment in EXPERIMENTS:
        spec = gym.registry.get(env_id(experiment))
        if spec is not None and not spec.kwargs:
            spec.kwargs = dict(sweep.SETTINGS[f"{experiment}/0"])


def check_experiment(experiment: str) -> str:
    if experiment not in EXPERIMENTS:
        raise BadInput(f"unknown bsuite experiment {experiment!r}; choose one of {', '.join(EXPERIMENTS)}")
    return experiment


def sweep_module(experiment: str) -> Any:
    """bsuite's ``sweep`` module of the experiment: its ``SETTINGS`` and ``NUM_EPISODES``."""
    register()
    return importlib.import_module(f"bsuite.experiments.{check_experiment(experiment)}.sweep")


def settings(experiment: str) -> list[dict[str, Any]]:
    """bsuite's sweep of the experiment: setting i is ``bsuite_id`` ``<experiment>/<i>``'s keyword arguments."""
    return [dict(setting) for setting in sweep_module(experiment).SETTINGS]


def num_episodes(experiment: str) -> int:
    """The episodes bsuite runs, and scores, each setting of the experiment for."""
    return int(sweep_module(experiment).NUM_EPISODES)


@functools.cache
def _length(experiment: str, frozen: tuple[tuple[str, Any], ...]) -> int:
    register()
    env = gym.make(env_id(experiment), **dict(frozen))
    try:
        env.reset(seed=0)
        for steps in range(1, 100_000):
            _, _, terminated, truncated, _ = env.step(0)
            if terminated or truncated:
                return steps
        raise RuntimeError(f"{env_id(experiment)} ran 100,000 steps without ending")
    finally:
        env.close()


def episode_length(experiment: str, **kwargs: Any) -> int:
    """Steps in every episode of the setting ``kwargs``: measured on one episode (the four experiments'
    episodes last the same whatever the actions: ``chain_length``, 20, 100 and ``memory_length`` + 1)."""
    return _length(check_experiment(experiment), tuple(sorted(kwargs.items())))


# ── the env's state, for envs.snapshot ───────────────────────────────────────────────────────────────────


def raw_env(base: gym.Env) -> Any | None:
    """The bsuite env inside Shimmy's wrapper, or None for any other env."""
    inner = base.__dict__.get("_env")
    module = type(inner).__module__ if inner is not None else ""
    return inner if module.startswith("bsuite.") else None


PLAIN = (int, float, bool, str, np.generic, np.ndarray, type(None))


def _plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return isinstance(value, PLAIN)


def is_settable(base: gym.Env) -> bool:
    """A bsuite env whose whole state is plain data and one ``RandomState`` (all four experiments')."""
    env = raw_env(base)
    return (
        env is not None
        and all(name == "_rng" or _plain(value) for name, value in vars(env).items())
        and isinstance(vars(env).get("_rng"), np.random.RandomState)
    )


def state(base: gym.Env) -> dict[str, Any]:
    """Every attribute of the bsuite env (its step count, cue, chosen action, counters …), and its RNG's state."""
    env = raw_env(base)
    attributes = {name: copy.deepcopy(value) for name, value in vars(env).items() if name != "_rng"}
    return {"attributes": attributes, "rng": list(env._rng.get_state())}


def set_state(base: gym.Env, saved: dict[str, Any]) -> None:
    env = raw_env(base)
    for name, value in saved["attributes"].items():
        setattr(env, name, copy.deepcopy(value))
    env._rng.set_state(tuple(saved["rng"]))
