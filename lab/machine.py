"""The machine a result was measured on, in words that name no host and no path."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path


def machine_line() -> str:
    """CPU model, logical cores and the versions that matter for speed and for the numbers."""
    cpu = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    cpu = cpu or platform.processor() or platform.machine() or "unknown CPU"
    versions = []
    for name in ("torch", "gymnasium", "stable-baselines3"):
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} not installed")
    return f"{cpu}, {os.cpu_count()} logical cores; python {platform.python_version()}, " + ", ".join(versions)
