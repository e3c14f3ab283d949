"""Env factories sent by value to the trainer processes a driver starts (a bench's, a credit or tuning study's cells).

A factory that no other process can import (a notebook's function, a lambda: ``envs.custom``'s ``factory/…`` ids)
reaches a cell's ``testbed train`` process in memory, as Stable-Baselines3's ``SubprocVecEnv`` sends its env
functions: pickled by value (cloudpickle) into the child's standard input, which the child reads before it parses
its options (:func:`receive`) and registers under the ids its driver gave. Nothing that runs code is written into a
run directory, nor read from one: a run records only the id, and a later process that lacks the factory says so
(``envs.custom.check_known``).
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Iterable
from typing import IO

from envs import custom
from envs.errors import BadInput

ON_STDIN = "TESTBED_ENV_FACTORIES_ON_STDIN"
"""Set in a trainer's environment when its standard input carries the factories of its cells' envs."""


def by_value(env_ids: Iterable[str]) -> dict[str, custom.EnvFactory]:
    """The factories among ``env_ids`` that only this process holds (``factory/…`` ids), by id."""
    found = {}
    for env_id in env_ids:
        make = custom.registered(env_id) if env_id.startswith(f"{custom.NAMESPACE}/") else None
        if make is not None:
            found[env_id] = make
    return found


def pickled(factories: dict[str, custom.EnvFactory]) -> bytes:
    """The factories by value; BadInput in one line for one that cannot be pickled (a generator, a lock)."""
    import cloudpickle

    try:
        return cloudpickle.dumps(factories)
    except Exception as error:  # noqa: BLE001  pickling fails in many ways, all with the same fix
        names = ", ".join(custom.describe(make) for make in factories.values())
        raise BadInput(
            f"the env factory {names} cannot be sent to a trainer process ({type(error).__name__}: {error}); define "
            "it in a module and pass it from there, or leave out what it holds that cannot be pickled"
        ) from None


def send(stream: IO[bytes], payload: bytes) -> None:
    """Write ``payload`` to a child's standard input and close it; a child that ended first is not an error here
    (its log says why)."""
    try:
        stream.write(payload)
        stream.close()
    except BrokenPipeError:
        pass


def receive(stream: IO[bytes] | None = None) -> list[str]:
    """In a trainer started with :data:`ON_STDIN`: read its factories from standard input and register each under
    its id; returns the ids. Nothing otherwise."""
    if os.environ.pop(ON_STDIN, None) is None:
        return []
    data = (stream or sys.stdin.buffer).read()
    # Code by value, from the driver that started this process: never from a file.
    factories = pickle.loads(data) if data else {}
    return [custom.register(make, env_id, check=False) for env_id, make in factories.items()]
