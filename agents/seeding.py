"""The one place where a run's random number generators are seeded, and where its envs' reset seeds come from.

Every reset seed of a run, and the seeds of its generators (:func:`generator_seeds`), derive from
``numpy.random.SeedSequence(seed)``, through a named branch per purpose (:class:`Stream`), so that no two
sub-envs, no two purposes and no two run seeds share a stream. Sub-env i of run seed s used to be seeded s + i,
so that runs 0 and 1 shared N − 1 of their N env streams (SB3 issue 2268; fixed in EnvPool). The reset seed
for index i of a stream is

    SeedSequence(seed, spawn_key=(stream, *key, i)).generate_state(1)[0] | 2³¹

that is, one 32-bit word of child i of the stream's child of ``SeedSequence(seed)`` (``spawn_key=(stream,)`` is
what ``SeedSequence(seed).spawn(…)[stream]`` gives), with its top bit set. So:

- the seeds for indices 0 … n − 1 do not depend on n: the first k of n are the first k of n + 1;
- distinct seeds, purposes, keys and indices hash to independent words: two reset seeds coincide only by chance,
  with probability 2⁻³¹ per pair;
- every reset seed lies in [2³¹, 2³²): an int every env takes, and never one of evaluation's fixed seeds
  ``run_envs.EVAL_SEED_BASE + i``, which all runs share on purpose (common random numbers: every algorithm and
  seed is scored on the same start states).

docs/seed-streams.md describes the streams.
"""

from __future__ import annotations

import random
from enum import IntEnum

import numpy as np
import torch

RESET_SEED_FLOOR = 2**31
"""Reset seeds of training lie in [RESET_SEED_FLOOR, 2³²), above every evaluation seed (``run_envs.EVAL_SEED_BASE``
+ i, i < ``eval_episodes``)."""


class Stream(IntEnum):
    """What a branch of ``SeedSequence(seed)`` seeds: the first entry of its spawn key."""

    TRAIN_ENVS = 0
    """Training sub-env i at the run's start (key: i)."""
    RESTART = 1
    """Training sub-env i when a run resumes at ``global_step`` without its envs' saved state (key: step, i)."""
    START_STATES = 2
    """GRPO's start state b of its draw d, a reset or a branch's trunk (key: d, b)."""
    GENERATORS = 3
    """Python's, NumPy's and torch's own generators (initialization, actions, minibatch order; key: none)."""


def generator_seeds(seed: int) -> tuple[int, int, int]:
    """The seeds of Python's, NumPy's and torch's generators: three words of the branch
    ``SeedSequence(seed, spawn_key=(GENERATORS,))``, so that the three draw independent streams."""
    words = np.random.SeedSequence(seed, spawn_key=(int(Stream.GENERATORS),)).generate_state(3)
    return int(words[0]), int(words[1]), int(words[2])


def seed_everything(seed: int, torch_threads: int = 1) -> None:
    """Seed Python, NumPy and torch (:func:`generator_seeds`), and fix torch's thread count.

    The envs are seeded separately, by ``reset(seed=...)`` with :func:`env_seeds`. One torch thread makes CPU
    results bit-identical from run to run, and it is also the fastest setting for the small networks of
    control tasks.
    """
    python_seed, numpy_seed, torch_seed = generator_seeds(seed)
    random.seed(python_seed)
    np.random.seed(numpy_seed)
    torch.manual_seed(torch_seed)
    torch.set_num_threads(torch_threads)


def reset_seeds(seed: int, stream: Stream, n: int, *key: int) -> list[int]:
    """n reset seeds of ``stream`` (under ``key``) of run seed ``seed``, index i's from
    ``SeedSequence(seed, spawn_key=(stream, *key, i))``: see the module docstring for what they guarantee."""
    if seed < 0 or n < 0 or any(k < 0 for k in key):
        raise ValueError(f"seed, n and key must be non-negative, got seed={seed}, n={n}, key={key}")
    words = (np.random.SeedSequence(seed, spawn_key=(int(stream), *key, i)).generate_state(1)[0] for i in range(n))
    return [int(word) | RESET_SEED_FLOOR for word in words]


def env_seeds(seed: int, n: int) -> list[int]:
    """The reset seeds of a run's n training sub-envs at its start."""
    return reset_seeds(seed, Stream.TRAIN_ENVS, n)


def restart_seeds(seed: int, global_step: int, n: int) -> list[int]:
    """The reset seeds of a run's n training sub-envs when it resumes at ``global_step`` without their saved
    state: new episodes, from streams its start did not use."""
    return reset_seeds(seed, Stream.RESTART, n, global_step)


def start_seeds(seed: int, draw: int, B: int) -> list[int]:
    """GRPO's B start states of its ``draw``-th draw (iteration × rounds + round): a pure function of
    ``(seed, draw)``, so a resumed run draws the same."""
    return reset_seeds(seed, Stream.START_STATES, B, draw)
