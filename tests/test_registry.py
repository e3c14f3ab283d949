"""agents/registry.py: one declaration per algorithm, in its own module; the names read from the modules' source
(without importing them) agree with the declarations imported; a variant and a reference take their base's presets."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agents import registry
from agents.config import RunConfig
from envs.errors import BadInput
from tests.conftest import REPO


def test_the_names_read_from_the_source_are_the_declared_ones() -> None:
    for module in registry.MODULES:
        declared = registry.declared_in(module)
        static = registry.static_declarations(module)
        assert [d["name"] for d in static] == list(declared)
        for d in static:
            imported = declared[d["name"]]
            assert (d.get("presets"), dict(d.get("variants") or {})) == (imported.presets, dict(imported.variants))
            assert issubclass(imported.config, RunConfig)


def test_every_algo_and_variant_is_named_as_before() -> None:
    assert registry.NAMES == (
        "ppo",
        "grpo",
        "a2c",
        "sb3-ppo",
        "sb3-a2c",
        "ppo-lambda0",
        "ppo-lambda1",
        "grpo-process",
        "grpo-step",
        "grpo-vine",
    )
    vine = registry.check_name("grpo-vine")
    assert (vine.module, vine.base, vine.fixed, vine.preset) == ("agents.grpo", "grpo", {"advantage": "vine"}, "grpo")
    assert registry.preset_of("sb3-ppo") == "ppo" and registry.preset_of("ppo-lambda0") == "ppo"
    assert registry.preset_of("sb3-a2c") == "a2c" and registry.get("sb3-a2c").config is registry.get("a2c").config
    lambda0 = registry.get("ppo-lambda0")
    assert lambda0.fixed == {"gae_lambda": 0.0} and lambda0.config is registry.get("ppo").config
    assert lambda0.train_stack is not None and registry.get("sb3-ppo").train_stack is None
    with pytest.raises(BadInput, match="unknown algo 'trpo'; choose one of ppo, grpo"):
        registry.get("trpo")


def run_probe(code: str) -> str:
    """What ``code`` prints in a fresh interpreter, where nothing is imported yet."""
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_names_are_known_without_importing_an_algorithm() -> None:
    probe = (
        "import sys; from agents import registry; registry.check_name('grpo-vine'); print(registry.NAMES[0], sorted(m "
        "for m in ('torch', 'agents.ppo', 'agents.grpo', 'agents.sb3') if m in sys.modules))"
    )
    assert run_probe(probe) == "ppo []"


def test_get_imports_only_the_module_that_declares_the_algo() -> None:
    probe = (
        "import sys; from agents import registry; registry.get('ppo-lambda1'); print(sorted(m for m in ('agents.ppo', "
        "'agents.grpo', 'agents.sb3') if m in sys.modules))"
    )
    assert run_probe(probe) == "['agents.ppo']"


def write_module(folder: Path, body: str) -> str:
    """A module ``declaring_<n>`` in ``folder`` (on sys.path), holding ``body``; its name."""
    name = f"declaring_{len(list(folder.glob('*.py')))}"
    (folder / f"{name}.py").write_text(textwrap.dedent(body))
    return name


def test_a_declaration_must_write_its_names_as_literals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    computed = write_module(
        tmp_path,
        """
        NAME = "mine"
        ALGORITHMS = (Declaration(NAME, config=None, train=None, load_policy=None),)
    """,
    )
    with pytest.raises(TypeError, match="write name, presets, variants of a Declaration as literals"):
        registry.static_declarations(computed)
    with pytest.raises(TypeError, match="declares no algorithm"):
        registry.static_declarations(write_module(tmp_path, "X = 1\n"))
    one = write_module(
        tmp_path,
        """
        ALGORITHMS = (
            Declaration("mine", presets="ppo", config=C, train=t, load_policy=p, variants={"mine-x": {"gamma": 0.9}}),
        )
    """,
    )
    read = registry.static_declarations(one)
    assert read == [{"name": "mine", "presets": "ppo", "variants": {"mine-x": {"gamma": 0.9}}}]


def test_a_name_declared_twice_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    twice = write_module(
        tmp_path,
        """
        ALGORITHMS = (Declaration("ppo-lambda0", config=C, train=t, load_policy=p),)
    """,
    )
    monkeypatch.setattr(registry, "MODULES", (*registry.MODULES, twice))
    registry.entries.cache_clear()
    try:
        with pytest.raises(TypeError, match="algo names declared twice: ppo-lambda0"):
            registry.entries()
    finally:
        registry.entries.cache_clear()
