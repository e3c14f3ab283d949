"""The machine a result was measured on, in words that name no host and no path."""

from __future__ import annotations

import os
import platform
from importlib import metadata

from agents.rundir import cpu_model


def machine_line() -> str:
    """CPU model, logical cores and the versions that matter for speed and for the numbers."""
    cpu = cpu_model()
    versions = []
    for name in ("torch", "gymnasium", "stable-baselines3"):
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} not installed")
    return f"{cpu}, {os.cpu_count()} logical cores; python {platform.python_version()}, " + ", ".join(versions)
