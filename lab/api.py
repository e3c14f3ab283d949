"""The testbed from Python: train, bench, study, tune and evaluate, and read runs, benches and committed results
back as objects with pandas DataFrames::

    from lab import api

    run = api.train("ppo", "CartPole-v1", seed=0, total_steps=20_000, overrides={"learning_rate": 1e-3})
    run.summary["final_eval_return_mean"], run.curves        # summary.json, progress.csv as a DataFrame
    act = run.policy()                                        # observation → deterministic action
    bench = api.bench(algos=["ppo", "grpo"], envs=["CartPole-v1"], seeds=2, total_steps=20_000, name="demo")
    bench.summary                                             # one row per run

One path: each function writes the ``testbed`` command it stands for (:attr:`Run.command`), reads it with the
command line's own parser and plans, checks and runs it with the command line's functions (``lab.cli``,
``lab.plan``, ``lab.launch``). So a bad input raises :class:`envs.errors.BadInput` with the message the command
line prints, before anything is written, and ``api.train`` trains the numbers ``testbed train`` does.

An env is a gymnasium id, a ``module:EnvId`` or ``module:function`` string, or a factory: a callable that returns
a gymnasium env (``envs.custom``). A factory that another process can import is recorded as ``module:function``;
any other (a notebook's function, a lambda) as ``factory/<name>``, which a bench's trainer processes receive by
value (``lab.factories``) and no later process can remake.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

import numpy as np
import pandas as pd
import yaml

from agents import rundir
from agents.runlog import request_stop
from envs import custom
from envs.errors import BadInput
from envs.factory import vector_layers
from lab import bench as bench_module
from lab import cli, committed
from lab.factories import by_value, pickled
from lab.launch import train_planned
from lab.parser import RaisingParser, build_parser
from lab.plan import check_run_folder, continuous
from lab.results import open_progress

if TYPE_CHECKING:
    import gymnasium as gym
    import torch

    from agents.training import Callback

__all__ = [
    "Bench",
    "Evaluation",
    "Policy",
    "Run",
    "Study",
    "bench",
    "credit",
    "env_id",
    "evaluate",
    "load",
    "load_bench",
    "load_result",
    "request_stop",
    "train",
    "tune",
]

Env = str | Callable[..., "gym.Env"]
"""A gymnasium id, a ``module:EnvId`` or ``module:function`` string, or a factory that returns a gymnasium env."""
Evaluation = cli.Evaluation


# ── what comes back ─────────────────────────────────────────────────────────────────────────────────


@dataclass
class Run:
    """One run directory, read back: its ``config.yaml``, its ``summary.json`` and its curves."""

    path: Path
    config: dict[str, Any]
    """config.yaml: the resolved config, with ``algo``."""
    summary: dict[str, Any]
    """summary.json (``status``, ``final_eval_return_mean``, …); empty while the run has not ended."""
    command: str | None = None
    """The ``testbed`` command that trains the same run (meta.json's, for a run read back)."""
    trust_env_module: bool = False
    """Whether its ``module:…`` env id may be imported (``--trust-env-module``): :func:`load`'s choice; a run this
    process trained trusts the env it was given."""

    @property
    def curves(self) -> pd.DataFrame:
        """progress.csv, one row per iteration (``global_step``, ``wall_time_s``, then every tag), or a
        committed run's kept ``progress.csv.gz``; empty before the first row."""
        f = open_progress(self.path / "progress.csv")
        if f is None:
            return pd.DataFrame(columns=["global_step", "wall_time_s"])
        with f:
            return pd.read_csv(f)

    def policy(self) -> Policy:
        """The checkpoint's policy, acting deterministically on observations (:class:`Policy`)."""
        return Policy.load(self.path, self.trust_env_module)

    def evaluate(self, episodes: int = 10, stochastic: bool = False) -> Evaluation:
        """``testbed eval`` of this run: :func:`evaluate`."""
        return evaluate(self.path, episodes=episodes, stochastic=stochastic, trust_env_module=self.trust_env_module)


@dataclass
class Bench:
    """The runs in a folder (a bench, a credit study, a tuning study, a committed result)."""

    path: Path
    runs: list[Run]
    """Sorted by env, algo and seed."""
    summary: pd.DataFrame
    """One row per run: ``algo``, ``env``, ``seed``, ``status``, ``budget``, ``final_return``, ``final_return_std``,
    ``steps``, ``wall_time_s``, ``commit``, ``run`` (``lab.committed.finals``)."""
    curves: pd.DataFrame
    """One row per evaluation of each run: ``algo``, ``env``, ``seed``, ``global_step``, ``wall_time_s``,
    ``eval_return``, ``run`` (``lab.committed.curves``)."""
    reports: dict[str, Path] = field(default_factory=dict)
    """The reports written beside the runs, by name (``report.md``, a study's ``credit.md``, ``tune.md``)."""


@dataclass
class Study(Bench):
    """A tuning study's folder: its trials' runs, and the preset it exports."""

    preset: dict[str, Any] | None = None
    """preset.yaml (the best trial's values, in the presets' form); None before a trial completed."""
    trials: dict[str, int] = field(default_factory=dict)
    """This call's trials by how they ended (``complete``, ``pruned``, …)."""


class Policy:
    """A run's checkpoint as a function from observations to deterministic actions: the policy's mode (SB3's
    ``predict(obs, deterministic=True)``), observations normalized with the run's frozen statistics, continuous
    actions clipped to the action space as the env would."""

    def __init__(self, model: torch.nn.Module, env: gym.vector.VectorEnv) -> None:
        self.model, self.env = model, env
        self.observation_space = env.unwrapped.single_observation_space  # the env's own, before any flattening
        self.action_space = env.unwrapped.single_action_space

    @classmethod
    def load(cls, run_dir: Path, trust_env_module: bool = False) -> Policy:
        """The policy of ``run_dir``'s checkpoint (``lab.plan.checkpoint_policy``, as ``testbed eval`` loads it)."""
        from agents import registry
        from agents.config import build_config
        from envs.factory import check_saved_env_id
        from lab.plan import checkpoint_policy

        check_run_folder(run_dir)
        values = rundir.read_config(run_dir)
        algo = registry.get(values.pop("algo"))
        check_saved_env_id(values.get("env_id"), str(run_dir / "config.yaml"), trust_env_module)
        _, env, model = checkpoint_policy(algo, build_config(algo.config, values), run_dir, episodes=1)
        return cls(model, env)

    def __call__(self, observation: Any) -> Any:
        """The action for one observation, or (for Box observations) a batch of them, (B, *shape) → (B, …)."""
        import torch
        from gymnasium.vector.utils import concatenate, create_empty_array

        space = self.observation_space
        batched = hasattr(space, "shape") and np.ndim(observation) == len(space.shape or ()) + 1
        items = list(observation) if batched else [observation]
        obs = concatenate(space, items, create_empty_array(space, len(items)))
        for layer in reversed(vector_layers(self.env)):  # innermost first: flattening, then normalization
            if hasattr(layer, "observations"):
                obs = layer.observations(obs)
        with torch.inference_mode():
            actions = self.model.deterministic_action(torch.as_tensor(np.asarray(obs, dtype=np.float32)))
        actions = actions.cpu().numpy()
        if hasattr(self.action_space, "low"):
            actions = np.clip(actions, self.action_space.low, self.action_space.high)
        return actions if batched else actions[0]

    def close(self) -> None:
        self.env.close()


# ── training ─────────────────────────────────────────────────────────────────────────────────────────


@overload
def train(algo: str, env: Env, *, seeds: None = None, **options: Any) -> Run: ...
@overload
def train(algo: str, env: Env, *, seeds: int | Sequence[int], **options: Any) -> list[Run]: ...
def train(
    algo: str,
    env: Env,
    *,
    seed: int | None = None,
    seeds: int | Sequence[int] | None = None,
    total_steps: int | None = None,
    budget_seconds: float | None = None,
    overrides: Mapping[str, Any] | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    reward_delay: int | str | None = None,
    preset: str | Path | None = None,
    run_dir: str | Path | None = None,
    resume: bool = False,
    device: str | None = None,
    callback: Callback | None = None,
) -> Run | list[Run]:
    """``testbed train``: one run of ``algo`` on ``env`` in this process, or with ``seeds`` (a count from ``seed``,
    or a list) several side by side; returns the :class:`Run` (a list for ``seeds``) once it has ended.

    ``overrides``: config keys and values (``--set``); ``env_kwargs``: the env's keyword arguments (a factory's
    keyword parameters); ``preset``: a presets file (``--preset``); ``resume``: continue ``run_dir`` from its
    checkpoint. ``callback(step, metrics)`` is called after each iteration with the env steps so far and the
    logged row; returning False stops the run with a checkpoint, as Ctrl-C does (:func:`request_stop` too), and
    ``resume=True`` continues it. BadInput, with the command line's message, before anything is written."""
    argv = ["train", "--algo", algo, "--env", env_id(env), *_value("--seed", seed)]
    if seeds is not None:
        argv += ["--seeds", ",".join(map(str, seeds)) if not isinstance(seeds, int) else str(seeds)]
    argv += _value("--total-steps", total_steps) + _value("--budget-seconds", budget_seconds)
    argv += _sets(overrides)
    if env_kwargs:
        argv += ["--env-kwargs", *(f"{key}:{_yaml(value, key)}" for key, value in env_kwargs.items())]
    argv += _value("--reward-delay", reward_delay) + _value("--preset", preset) + _value("--run-dir", run_dir)
    argv += (["--resume"] if resume else []) + _value("--device", device)
    args = _parse(argv)
    plan = cli.plan_training(args)
    summaries = train_planned(plan, algo, callback=callback, command=["testbed", *argv])
    runs = [
        Run(r.run_dir, rundir.read_config(r.run_dir), summary, _shown(argv), trust_env_module=True)  # its env: ours
        for r, summary in zip(plan.runs, summaries, strict=True)
    ]
    return runs if plan.seeds is not None else runs[0]


def evaluate(
    run: str | Path | Run,
    *,
    episodes: int = 10,
    stochastic: bool = False,
    env_kwargs: Mapping[str, Any] | None = None,
    video: str | Path | None = None,
    trust_env_module: bool = False,
) -> Evaluation:
    """``testbed eval``: the run's checkpoint over ``episodes`` fixed episode seeds (the same for every run), with
    ``env_kwargs`` on top of the run's own, and the first episode's GIF in ``video``."""
    path = run.path if isinstance(run, Run) else Path(run)
    trust_env_module = trust_env_module or (isinstance(run, Run) and run.trust_env_module)
    argv = ["eval", str(path), "--episodes", str(episodes), *(["--stochastic"] if stochastic else [])]
    if env_kwargs:
        argv += ["--env-kwargs", *(f"{key}:{_yaml(value, key)}" for key, value in env_kwargs.items())]
    argv += _value("--video", video) + (["--trust-env-module"] if trust_env_module else [])
    return cli.evaluate_run(_parse(argv))


# ── grids of runs: benches, credit studies, tuning studies ──────────────────────────────────────────


def bench(
    algos: Sequence[str] | None = None,
    envs: Sequence[Env] | None = None,
    *,
    suite: str | None = None,
    seeds: int | None = None,
    first_seed: int = 0,
    total_steps: int | None = None,
    budget_seconds: float | None = None,
    overrides: Mapping[str, Any] | None = None,
    name: str | None = None,
    workers: int | None = None,
    stack: int | None = None,
    backend: str = "local",
    ray_address: str | None = None,
    reuse_from: Sequence[str | Path] = (),
) -> Bench:
    """``testbed bench``: every (algo, env, seed) as a ``testbed train`` process, ``workers`` at a time, into
    runs/bench/NAME; returns the bench read back (:func:`load_bench`). ``overrides``: ``key`` for every algo or
    ``ALGO.key`` for one. Finished cells are skipped, so calling it again continues; KeyboardInterrupt stops every
    cell with a checkpoint."""
    ids = [env_id(env) for env in envs] if envs is not None else None
    for i, (env, given) in enumerate(zip(envs or [], ids or [], strict=True)):
        if not isinstance(env, str) and given in (ids or [])[:i]:
            raise BadInput(
                f"two env factories in envs share the id {given} (their name); give them different names, e.g. "
                "def make_a(): …"
            )
    argv = ["bench", *_values("--algos", algos), *_values("--envs", ids), *_value("--suite", suite)]
    argv += [*_value("--seeds", seeds), "--first-seed", str(first_seed), *_value("--total-steps", total_steps)]
    argv += _value("--budget-seconds", budget_seconds) + _sets(overrides) + _value("--name", name)
    argv += _grid_options(workers, stack, backend, ray_address)
    for folder in reuse_from:
        argv += ["--reuse-from", str(folder)]
    args = _parse(argv)
    grid, count, reused = cli.plan_bench(args)
    _check_sendable(grid.envs, backend)
    bench_dir, _ = bench_module.run_grid(
        grid, count, backend, ray_address, stack=cli.stack_size(args), reuse_from=reused
    )
    return load_bench(bench_dir)


def credit(
    task: str | Env,
    *,
    horizons: Sequence[int | str] | None = None,
    algos: Sequence[str] = ("ppo", "grpo", "grpo-vine"),
    seeds: int = 3,
    first_seed: int = 0,
    total_steps: int | None = None,
    budget_seconds: float | None = None,
    overrides: Mapping[str, Any] | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    name: str | None = None,
    workers: int | None = None,
    stack: int | None = None,
    backend: str = "local",
    ray_address: str | None = None,
) -> Bench:
    """``testbed credit``: ``chain`` or ``keydoor`` over episode lengths, or any env (an id, or a factory: the
    study of ``delayed:ENV``) over reward delays (``horizons``: integers or ``"end"``); returns the study's runs,
    with its ``credit.md`` among the reports."""
    if task not in ("chain", "keydoor") and not (isinstance(task, str) and task.startswith("delayed:")):
        task = f"delayed:{env_id(task)}"
    argv = ["credit", "--task", str(task), *_values("--horizons", horizons), *_values("--algos", algos)]
    argv += ["--seeds", str(seeds), "--first-seed", str(first_seed), *_value("--total-steps", total_steps)]
    argv += _value("--budget-seconds", budget_seconds) + _sets(overrides) + _value("--name", name)
    if env_kwargs:
        argv += ["--env-kwargs", *(f"{key}:{_yaml(value, key)}" for key, value in env_kwargs.items())]
    argv += _grid_options(workers, stack, backend, ray_address)
    from lab import credit as credit_module

    args = _parse(argv)
    grid, study, count = cli.plan_credit(args)
    _check_sendable(grid.envs, backend)
    bench_dir, _ = bench_module.run_grid(
        grid,
        count,
        backend,
        ray_address,
        prepare=lambda folder: credit_module.write_study(folder, study),
        stack=cli.stack_size(args),
    )
    return load_bench(bench_dir)


def tune(
    algo: str,
    env: Env,
    *,
    trials: int = 50,
    total_steps: int | None = None,
    seeds: int = 1,
    first_seed: int = 100,
    space: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    vary: Mapping[str, Any] | None = None,
    name: str | None = None,
    storage: str | None = None,
    pruner: str = "median",
    startup_trials: int = 5,
    sampler_seed: int = 0,
    workers: int = 1,
    stack: int | None = None,
    backend: str = "local",
    ray_address: str | None = None,
) -> Study:
    """``testbed tune``: an Optuna study of ``algo`` on ``env`` (TPE, median pruner) over the algo's space (or
    ``space``, a YAML file; ``vary``: one key's range, a list or ``{"low": …, "high": …}``), each trial's seeds
    from ``first_seed`` on; returns the study's runs, its counts and the preset it exports."""
    from lab import tune as tune_module

    argv = [
        "tune",
        "--algo",
        algo,
        "--env",
        env_id(env),
        "--trials",
        str(trials),
        *_value("--total-steps", total_steps),
    ]
    argv += ["--seeds", str(seeds), "--first-seed", str(first_seed), *_value("--space", space), *_sets(overrides)]
    for key, values in (vary or {}).items():
        argv += ["--vary", f"{key}={yaml.safe_dump(values, default_flow_style=True).strip()}"]
    argv += _value("--name", name) + _value("--storage", storage) + ["--pruner", pruner]
    argv += ["--startup-trials", str(startup_trials), "--sampler-seed", str(sampler_seed)]
    argv += _grid_options(workers, stack, backend, ray_address)
    plan, stacked = cli.plan_tuning(_parse(argv))
    _check_sendable([plan.env_id], backend)
    tune_dir, counts = tune_module.run_study(plan, workers, backend, ray_address, stack=stacked)
    read = load_bench(tune_dir)
    preset = tune_dir / "preset.yaml"
    values = yaml.safe_load(preset.read_text()) if preset.exists() else None
    return Study(read.path, read.runs, read.summary, read.curves, read.reports, values, dict(counts))


# ── loaders ──────────────────────────────────────────────────────────────────────────────────────────


def load(path: str | Path, *, env: Env | None = None, trust_env_module: bool = False) -> Run:
    """The run in ``path`` (a run directory: config.yaml, summary.json, progress.csv, checkpoint.pt). A run folder
    is data: a ``module:…`` env id is imported only with ``trust_env_module`` (``--trust-env-module``). ``env``: the
    factory a ``factory/…`` run was trained from, which no other process can remake, for its :meth:`Run.policy`."""
    run_dir = Path(path)
    check_run_folder(run_dir)
    config = rundir.read_config(run_dir)
    if env is not None and (given := env_id(env)) != config.get("env_id"):
        trained = config.get("env_id")
        raise BadInput(f"{run_dir} was trained on {trained}, not on {given}; pass the env it was trained on")
    return Run(run_dir, config, rundir.read_summary(run_dir) or {}, _recorded_command(run_dir), trust_env_module)


def _recorded_command(run_dir: Path) -> str | None:
    """The ``testbed …`` command meta.json records as the run's first start, if it is readable."""
    import json
    import shlex

    try:
        command = json.loads((run_dir / "meta.json").read_bytes()).get("command")
    except (OSError, ValueError, AttributeError):
        return None
    return shlex.join(map(str, command)) if isinstance(command, list) and command else None


def load_bench(path: str | Path) -> Bench:
    """The runs of a bench's, a study's or any folder of runs (``runs/bench/NAME``), with its summary and curves as
    DataFrames; reading never writes."""
    folder = Path(path)
    if not folder.is_dir():
        raise BadInput(
            f"{folder} is not a folder; give a bench's folder, runs/bench/NAME, or a study's, runs/tune/NAME"
        )
    return _runs_of(folder, folder)


def load_result(name: str, root: str | Path | None = None) -> Bench:
    """A committed result (a name of ``testbed results list``, kept under benchmarks/results/) as a :class:`Bench`:
    its runs' configs, summaries and kept curves (``lab.committed``)."""
    source = committed.locate(name, Path(root) if root is not None else None)
    return _runs_of(source.folder, name, Path(root) if root is not None else None)


def _runs_of(folder: Path, name: str | Path, root: Path | None = None) -> Bench:
    runs = [load(r.run_dir) for r in committed.runs(name, root)]
    reports = {p.name: p for p in sorted(folder.glob("*.md"))}
    return Bench(folder, runs, committed.finals(name, root), committed.curves(name, root), reports)


# ── an API call as its command line ──────────────────────────────────────────────────────────────────


def env_id(env: Env) -> str:
    """The id a run records for ``env``: a string as given; a factory registered in this process
    (``envs.custom.register``: it is called once, and refused in one line if it makes no gymnasium env)."""
    if isinstance(env, str):
        return env
    registered = custom.register(env)
    continuous.cache_clear()  # a notebook's factory redefined under its name may make another action space
    return registered


def _parse(argv: list[str]) -> Any:
    """``argv`` read by the command line's parser, whose errors raise BadInput here."""
    return build_parser(RaisingParser).parse_args(argv)


def _shown(argv: list[str]) -> str:
    import shlex

    return shlex.join(["testbed", *argv])


def _value(option: str, value: Any) -> list[str]:
    return [] if value is None else [option, str(value)]


def _values(option: str, values: Iterable[Any] | None) -> list[str]:
    return [] if values is None else [option, *map(str, values)]


def _grid_options(workers: int | None, stack: int | None, backend: str, ray_address: str | None) -> list[str]:
    options = _value("--workers", workers) + _value("--stack", stack) + ["--backend", backend]
    return options + _value("--ray-address", ray_address)


def _check_sendable(env_ids: Iterable[str], backend: str) -> None:
    """Factories only this process holds reach a local trainer by value; checked before any cell starts."""
    factories = by_value(env_ids)
    if factories and backend != "local":
        raise BadInput(
            f"{', '.join(factories)}: an env factory defined here reaches trainers on this machine only; use "
            "backend='local', or define the factory in a module the Ray workers can import (module:function)"
        )
    if factories:
        pickled(factories)


def _sets(overrides: Mapping[str, Any] | None) -> list[str]:
    """``--set key=value`` for each override, written as the command line reads it back."""
    return [part for key, value in (overrides or {}).items() for part in ("--set", f"{key}={_text(value, key)}")]


def _text(value: Any, key: str) -> str:
    """A config value as ``--set`` reads it (``agents.config``'s coercion): numbers exactly (a float's repr),
    ``true``/``false``, ``none``, lists comma-separated, mappings as ``k:v,k:v``."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "none"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return repr(value)
    if isinstance(value, (list, tuple)):
        items = [_text(item, key) for item in value]
        if any("," in item for item in items):
            raise BadInput(f"overrides: {key}'s items hold commas, which a list setting cannot take; give plain values")
        return ",".join(items)
    if isinstance(value, Mapping):
        return ",".join(f"{k}:{_yaml(v, f'{key}.{k}', commas=False)}" for k, v in value.items())
    return str(value)


def _yaml(value: Any, key: str, commas: bool = True) -> str:
    """A value of an env keyword argument as YAML on one line, which ``KEY:VALUE`` pairs are read as; ``commas``:
    whether the text may hold commas (not inside ``--set env_kwargs=k:v,k:v``, which splits at them)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf).strip()
    text = text.removesuffix("...").strip()
    if "," in text and not commas:
        raise BadInput(
            f"{key}: the value {value!r} would be split at its commas in the command's KEY:VALUE,… pairs; give a "
            "value without commas"
        )
    return text
