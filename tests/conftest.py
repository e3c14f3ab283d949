"""Shared fixtures: every test runs in its own working directory, without a display."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _isolated_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # MuJoCo appends to MUJOCO_LOG.TXT in the working directory, and default run dirs are relative.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
