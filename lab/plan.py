"""A run's config, resolved once for every command: the algo's preset for the env (or a ``--preset`` file's
entry), the values its variant fixes, then the overrides, checked; and ``testbed train``'s plan: which
runs, and whether each starts, resumes or has nothing left to do.

``testbed train`` looks its algo up once (:func:`plan_train`: the name is checked before torch is imported, then
the algo is loaded) and passes the :class:`agents.registry.Algo` down; :func:`resolve_run` is the one place that
builds a run's config from it.

``testbed train``, a bench's and a credit study's cells and a tuning study's trials all resolve their runs
here, so that a run's settings mean the same whichever command asked for them, and a finished run can be
recognised as the one asked for (:func:`agents.rundir.config_differences`).
"""

from __future__ import annotations

import argparse
import errno
import functools
import os
import re
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from agents import registry, rundir
from agents.config import NO_PRESETS, RunConfig, build_config, parse_overrides, preset_envs, resolve_config
from envs import action_space_of, check_env_id, load_normalizer_state
from envs.errors import BadInput, brief
from envs.factory import check_mujoco_gl
from lab.parser import MAX_SEEDS

if TYPE_CHECKING:
    import torch
    from gymnasium.vector import VectorEnv


@functools.cache
def continuous(env_id: str) -> bool:
    """Whether ``env_id`` has continuous (Box) actions, which picks the presets' default; BadInput for an id
    gymnasium does not know, or whose extra is not installed."""
    return isinstance(action_space_of(env_id), gym.spaces.Box)


def check_fixed(algo: registry.Entry | registry.Algo, keys: Sequence[str]) -> None:
    """BadInput if ``keys`` set a value that the variant ``algo`` fixes (``ppo-lambda0``'s gae_lambda)."""
    clash = sorted(set(keys) & set(algo.fixed))
    if clash:
        fixed = ", ".join(f"{k}={algo.fixed[k]}" for k in clash)
        raise BadInput(f"{algo.name} fixes {fixed}; use --algo {algo.base} to set {', '.join(clash)}")


def resolve_run(
    algo: registry.Algo,
    env_id: str,
    overrides: dict[str, Any] | Sequence[str] = (),
    preset_file: Path | None = None,
    validate: bool = False,
) -> tuple[RunConfig, str]:
    """The config of a run of ``algo`` on ``env_id`` and the name of the preset it started from: the one place a
    run's config is built (its presets, the values its variant fixes, then ``overrides``).

    ``overrides``: config values by key, or ``key=value`` pairs (``--set``). ``validate`` also runs the
    checks that build the env (its keyword arguments, the algo's own). BadInput for an unknown env, a key the
    variant fixes, an unknown key or a value out of range."""
    values = dict(overrides) if isinstance(overrides, dict) else parse_overrides(list(overrides))
    check_fixed(algo, list(values))
    fixed = {**algo.fixed, **values}
    cfg, preset = resolve_config(algo.config, algo.preset, env_id, continuous(env_id), fixed, preset_file)
    if validate:
        algo.validate(cfg)
    return cfg, preset


# ── testbed train: its runs, and what to do with each ───────────────────────────────────────────────


MAX_STACK = MAX_SEEDS
"""The most seeds one process trains side by side (``train --seeds``); a bench spreads more over processes."""


@dataclass
class PlannedRun:
    """One run of ``train``, resolved and checked before anything is written."""

    cfg: RunConfig
    run_dir: Path
    preset: str
    mode: str
    """``new`` (start, or start again: nothing to continue), ``resume`` (from its checkpoint) or ``done``
    (completed at its budget: nothing left to do)."""
    saved: dict[str, Any] = field(default_factory=dict)
    """config.yaml as the run wrote it, for a run that had started."""


@dataclass
class TrainPlan:
    """``testbed train``'s algo, looked up once, and its runs."""

    algo: registry.Algo
    runs: list[PlannedRun]
    seeds: list[int] | None
    """``--seeds``' seeds; None for one run (``--seed``)."""


def plan_train(args: argparse.Namespace) -> TrainPlan:
    """``testbed train``'s algo and runs, every check done before a run directory is created or changed: one run,
    or with ``--seeds`` one per seed (and the seeds)."""
    entry = registry.check_name(args.algo)  # a misspelled algo or env is refused before torch is imported
    check_env_id(args.env)
    check_mujoco_gl(args.env, render=False)  # a MUJOCO_GL whose library is missing stops `import mujoco`
    overrides: dict[str, Any] = parse_overrides(args.set)
    if args.env_kwargs:
        overrides["env_kwargs"] = ",".join(args.env_kwargs)
    if args.reward_delay is not None:
        overrides["reward_delay"] = args.reward_delay
    check_fixed(entry, list(overrides))
    algo = registry.load(entry)  # the one look-up: imports the algorithm (and torch); passed down from here
    if args.total_steps is not None:
        overrides["total_steps"] = args.total_steps
    if args.budget_seconds is not None:
        overrides["budget_seconds"] = args.budget_seconds
    if args.device is not None:
        overrides["device"] = device_of(args.device)
    if args.resume and args.run_dir is None:
        raise BadInput("--resume needs --run-dir DIR: the run to continue")
    if args.resume and args.preset is not None:
        raise BadInput("a resumed run keeps the settings in its config.yaml; drop --preset")
    if args.run_dir is not None:
        check_path(args.run_dir, "--run-dir")
        check_folder(Path(args.run_dir), "--run-dir")
    if args.resume and not Path(args.run_dir).exists():
        raise BadInput(
            f"--run-dir {plain(args.run_dir)} does not exist, so there is no run to resume; check the path (ls runs/), "
            "or drop --resume to start a new run there"
        )
    seeds = parse_seeds(args.seeds, args.seed) if args.seeds is not None else None
    if seeds is not None and algo.train_stack is None:
        stackable = ", ".join(name for name, a in registry.algos().items() if a.train_stack is not None)
        raise BadInput(
            f"--seeds trains seeds side by side, which {args.algo} does not support yet (only {stackable}). Train one "
            f"seed per process with --seed, or use `testbed bench`."
        )

    if seeds is None:
        if args.seed is not None:
            overrides["seed"] = args.seed
        run_dir = Path(args.run_dir) if args.run_dir else None
        runs = [plan_run(args, algo, overrides, run_dir)]
    else:
        parent = Path(args.run_dir) if args.run_dir else default_run_dir(args.algo, args.env, seeds[0], len(seeds))
        template = stack_template(parent, seeds) if args.resume else None
        runs = [plan_run(args, algo, {**overrides, "seed": seed}, parent / f"seed{seed}", template) for seed in seeds]
        algo.check_stack([r.cfg for r in runs])
    return TrainPlan(algo, runs, seeds)


def preset_note(algo: registry.Entry | registry.Algo, env_id: str, preset: str) -> str | None:
    """A note for a run that takes untuned defaults (``preset``): of an algo without a presets file, or on an env
    whose other version has a tuned preset (``Hopper-v4`` trains a million steps with defaults where ``Hopper-v5``
    has its own)."""
    if preset == NO_PRESETS:
        return f"note: {algo.name} has no presets file (agents/presets/{algo.preset}.yaml), so its config's defaults"
    if not preset.startswith("default"):
        return None
    task = re.sub(r"-v\d+$", "", env_id)
    others = [other for other in preset_envs(algo.preset) if re.sub(r"-v\d+$", "", other) == task]
    if not others or env_id in others:
        return None
    newest = max(others, key=lambda other: int(m.group(1)) if (m := re.search(r"-v(\d+)$", other)) else -1)
    return f"note: {env_id}: no {algo.name} preset, so untuned defaults; {newest} has a tuned one (--env {newest})"


def check_path(value: str, option: str) -> None:
    """BadInput for a path option that is empty or holds control characters (a newline, say)."""
    if not value.strip() or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise BadInput(
            f"{option} {brief(value, 80)} is not a usable path: give a non-empty path without control characters "
            "(newlines, tabs)"
        )


def check_folder(path: Path, option: str) -> None:
    """BadInput naming what stands where a folder is wanted, before anything is made: a loop of symbolic links, a
    link to nothing, or a file, at ``path`` or above it. An absent folder is fine: it will be made."""
    for part in (path, *path.parents):  # the path itself first, then each folder above it
        try:
            if stat.S_ISDIR(part.stat().st_mode):
                return  # an existing folder: every folder above it exists too
        except OSError as error:
            linked = part.is_symlink()
            if error.errno == errno.ELOOP and linked:
                raise BadInput(
                    f"{option} {brief(str(path), 80)}: {brief(str(part), 80)} is a loop of symbolic links that never "
                    "reaches a folder; remove the link or choose another folder"
                ) from None
            if error.errno == errno.ENOENT and linked:
                raise BadInput(
                    f"{option} {brief(str(path), 80)}: {brief(str(part), 80)} is a symbolic link to "
                    f"{brief(os.readlink(part), 80)}, which does not exist; make that folder, remove the link or "
                    "choose another folder"
                ) from None
            continue  # absent (or below a link or file found higher up): look above it
        raise BadInput(
            f"{option} {brief(str(path), 80)}: {brief(str(part), 80)} is a file where a folder is wanted; choose "
            "another path, or move the file away"
        )


def plain(value: Any, limit: int = 100) -> str:
    """``value`` as typed where it is a plain name or path (so that a message's fix can be pasted), else quoted
    and cut (:func:`envs.errors.brief`): a value read from a file may hold anything."""
    text = str(value)
    return text if len(text) <= limit and re.fullmatch(r"[\w./:@+-]+", text) else brief(value, limit)


def check_run_folder(run_dir: Path) -> None:
    """BadInput, saying what ``run_dir`` is instead, unless it is one run's folder (one with a config.yaml):
    a path that does not exist, or a bench's or a study's folder, named with a few of the runs inside it."""
    if (run_dir / "config.yaml").exists():
        return
    if not run_dir.exists():
        raise BadInput(
            f"{plain(str(run_dir))} does not exist; give a run folder, such as one listed by ls runs/*/*/ "
            "(runs/ALGO/ENV/seedN-TIME)"
        )
    runs = sorted(
        {str(path.parent) for depth in range(1, 5) for path in run_dir.glob("/".join(["*"] * depth + ["config.yaml"]))}
    )
    if runs:
        few = ", ".join(plain(r, 240) for r in runs[:3])
        raise BadInput(
            f"{plain(str(run_dir))} holds {len(runs)} runs (a bench's or a study's folder), not one run; pick one, "
            f"e.g. {few}"
        )


def stack_template(parent: Path, seeds: list[int]) -> dict[str, Any]:
    """The settings of a resumed stack, for its seeds that never started: the config.yaml of one that did
    (the seeds of a stack share every setting but the seed). BadInput when none did."""
    for seed in seeds:
        if (parent / f"seed{seed}" / "config.yaml").exists():
            return rundir.read_config(parent / f"seed{seed}")
    raise BadInput(
        f"--resume: no seed under {parent} has started (none holds a config.yaml), so there is nothing to continue. "
        "Run the same command without --resume."
    )


def parse_seeds(spec: str, first: int | None) -> list[int]:
    """``--seeds``: a count (seeds FIRST … FIRST+N−1, FIRST from --seed or 0) or a comma-separated list."""
    if "," in spec and first is not None:
        raise BadInput("--seed sets the first seed of a --seeds count; with a --seeds list, drop --seed")
    try:
        if "," not in spec:
            count = int(spec)
            if not 1 <= count <= MAX_STACK:
                raise ValueError
            seeds = list(range(first or 0, (first or 0) + count))
        else:
            seeds = [int(part) for part in spec.split(",")]
    except ValueError:
        raise BadInput(
            f"--seeds takes a count from 1 to {MAX_STACK} (5) or a list (0,1,2), got {brief(spec, 80)}; one seed is "
            "--seed K"
        ) from None
    if len(set(seeds)) != len(seeds) or min(seeds) < 0 or max(seeds) >= 2**32:
        raise BadInput(f"--seeds must be distinct seeds in [0, 2**32 - 1], got {brief(spec, 80)}")
    if len(seeds) > MAX_STACK:
        raise BadInput(
            f"--seeds lists {len(seeds)} seeds; one process trains at most {MAX_STACK}. Spread more over processes "
            "with `testbed bench --seeds N --stack K`."
        )
    return seeds


def plan_run(
    args: argparse.Namespace,
    algo: registry.Algo,
    overrides: dict[str, Any],
    run_dir: Path | None,
    template: dict[str, Any] | None = None,
) -> PlannedRun:
    """One run's resolved and checked config, run directory, preset name and what to do with it.

    With ``--resume``: a run with a checkpoint continues from it, or is ``done`` when it completed its
    budget (a stop in its last iteration leaves it past the budget: the resume then only evaluates it);
    a run stopped before its first checkpoint starts again from its own config.yaml; a seed of a stack
    that never started, from ``template`` (another seed's settings).
    """
    if not args.resume:
        preset_file = Path(args.preset) if args.preset else None
        cfg, preset_name = resolve_run(algo, args.env, overrides, preset_file, validate=True)
        return PlannedRun(cfg, run_dir or default_run_dir(args.algo, args.env, cfg.seed), preset_name, "new")
    assert run_dir is not None
    started = (run_dir / "config.yaml").exists() or template is None
    saved = rundir.read_config(run_dir) if started else {**template, "seed": overrides["seed"]}
    if saved.get("algo") != args.algo or saved.get("env_id") != args.env:
        had_algo, had_env = plain(saved.get("algo")), plain(saved.get("env_id"))
        raise BadInput(
            f"{run_dir} holds a run of another algo or env: {had_algo} on {had_env}, not {args.algo} on {args.env}; "
            f"resume it with --algo {had_algo} --env {had_env}, or give another --run-dir"
        )
    saved = {k: v for k, v in saved.items() if k != "algo"}
    cfg = build_config(algo.config, {**saved, **overrides})
    # Compared as typed values: a bench's rerun repeats `--set learning_rate=3e-4 --set env_kwargs=horizon:10`,
    # which config.yaml holds as 0.0003 and {horizon: 10}.
    resolved = rundir.config_to_dict(cfg)
    changed = sorted(k for k in overrides if k != "total_steps" and resolved[k] != saved.get(k))
    if changed:
        raise BadInput(f"a resumed run keeps its settings; only --total-steps may change, not {', '.join(changed)}")
    algo.validate(cfg)
    if not (run_dir / rundir.CHECKPOINT).exists():
        return PlannedRun(cfg, run_dir, "its config.yaml", "new", saved if started else {})
    # Refuses a checkpoint that config.yaml's network or normalization no longer fits, before anything is written;
    # one holding NaN or inf is recorded as diverged first, so that a bench neither retries nor trains it again.
    from agents import runlog  # torch is imported by now, for the checkpoint

    try:
        ckpt, env, _ = checkpoint_policy(algo, cfg, run_dir, episodes=1)
    except runlog.NonFiniteCheckpoint as error:
        runlog.record_diverged(run_dir, error, {"algo": args.algo, "env_id": cfg.env_id, "seed": cfg.seed})
        raise
    env.close()
    trained = ckpt["global_step"]
    if cfg.total_steps < trained and cfg.total_steps != saved.get("total_steps"):
        raise BadInput(f"{run_dir} has already trained {trained} steps; --total-steps must be at least that")
    status = (rundir.read_summary(run_dir) or {}).get("status")
    timed_out = cfg.budget_seconds is not None and ckpt["wall_time_s"] >= cfg.budget_seconds
    done = status == "completed" and (trained >= cfg.total_steps or timed_out)
    if not done:  # a progress.csv shorter than the checkpoint recorded, or missing, would be padded or restarted
        runlog.check_progress(run_dir, ckpt.get("csv_bytes"))
    return PlannedRun(cfg, run_dir, "resumed", "done" if done else "resume", saved)


def default_run_dir(algo: str, env_id: str, seed: int, seeds: int = 1) -> Path:
    """runs/ALGO/ENV/seedN-TIME for one run; runs/ALGO/ENV/seedsN-M-TIME for a stack (seed<k>/ inside)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = f"seed{seed}" if seeds == 1 else f"seeds{seed}-{seed + seeds - 1}"
    return Path("runs") / algo / env_id.replace("/", "_") / f"{name}-{stamp}"


def device_of(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda: torch sees no CUDA device. Use --device cpu (the default) or auto.")
    return requested


def checkpoint_policy(
    algo: registry.Algo, cfg: RunConfig, run_dir: Path, episodes: int
) -> tuple[dict[str, Any], VectorEnv, torch.nn.Module]:
    """The run's checkpoint, an evaluation env holding its observation statistics, and its policy; a
    checkpoint that does not match config.yaml (network, normalization) is bad input."""
    from agents import runlog  # here, on first use: checkpoints and a run's envs import torch
    from agents.run_envs import make_eval_env, observation_statistics

    ckpt = runlog.load_checkpoint(run_dir, {"algo": algo.name, "env_id": cfg.env_id})
    env = make_eval_env(cfg, episodes)
    try:
        load_normalizer_state(env, observation_statistics(ckpt["normalizers"]))
        return ckpt, env, algo.load_policy(cfg, env, ckpt["model"])
    except BaseException:
        env.close()
        raise
