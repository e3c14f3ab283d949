"""The one place where a run's random number generators are seeded."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int, torch_threads: int = 1) -> None:
    """Seed Python, NumPy and torch, and fix torch's thread count.

    The envs are seeded separately, by ``reset(seed=...)``. One torch thread makes CPU results
    bit-identical from run to run, and it is also the fastest setting for the small networks of
    control tasks.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.set_num_threads(torch_threads)
