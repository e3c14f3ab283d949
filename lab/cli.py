"""The ``testbed`` command line: ``train``, ``eval``, ``bench``, ``credit``, ``tune``, ``docs``, ``plot`` and ``report``.

Bad input exits with status 2 and a one-paragraph message, before any work starts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from agents import registry, runlog
from agents.config import RunConfig, build_config, parse_overrides, resolve_config
from agents.registry import ALGOS
from envs import action_space_of
from envs.errors import BadInput, brief
from lab.results import read_summary

if TYPE_CHECKING:
    import torch
    from gymnasium.vector import VectorEnv

EXIT_CODES = {"completed": 0, "failed": 1, "interrupted": 130}
# Seeds per process in bench, credit and tune: the fastest stack size measured for PPO on CartPole
# (benchmarks/stacking.py; the README's table).
DEFAULT_STACK = 16
MAX_STACK = 256
"""The most seeds one process trains side by side (``train --seeds``); a bench spreads more over processes."""


def _device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda: torch sees no CUDA device. Use --device cpu (the default) or auto.")
    return requested


def default_run_dir(algo: str, env_id: str, seed: int, seeds: int = 1) -> Path:
    """runs/ALGO/ENV/seedN-TIME for one run; runs/ALGO/ENV/seedsN-M-TIME for a stack (seed<k>/ inside)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = f"seed{seed}" if seeds == 1 else f"seeds{seed}-{seed + seeds - 1}"
    return Path("runs") / algo / env_id.replace("/", "_") / f"{name}-{stamp}"


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


def cmd_train(args: argparse.Namespace) -> int:
    algo = registry.get(args.algo)
    overrides: dict[str, Any] = parse_overrides(args.set)
    if args.env_kwargs:
        overrides["env_kwargs"] = ",".join(args.env_kwargs)
    if args.reward_delay is not None:
        overrides["reward_delay"] = args.reward_delay
    clash = sorted(set(overrides) & set(algo.fixed))
    if clash:
        raise BadInput(f"{args.algo} fixes {', '.join(f'{k}={algo.fixed[k]}' for k in clash)}; "
                       f"use --algo {args.algo.split('-')[0]} to set {', '.join(clash)}")  # fmt: skip
    overrides = {**algo.fixed, **overrides}
    if args.total_steps is not None:
        overrides["total_steps"] = args.total_steps
    if args.device is not None:
        overrides["device"] = _device(args.device)
    if args.resume and args.run_dir is None:
        raise BadInput("--resume needs --run-dir DIR: the run to continue")
    if args.resume and args.preset is not None:
        raise BadInput("a resumed run keeps the settings in its config.yaml; drop --preset")
    if args.run_dir is not None:
        check_path(args.run_dir, "--run-dir")
    seeds = parse_seeds(args.seeds, args.seed) if args.seeds is not None else None
    if seeds is not None and algo.train_stack is None:
        stackable = ", ".join(name for name, a in ALGOS.items() if a.train_stack is not None)
        raise BadInput(f"--seeds trains seeds side by side, which {args.algo} does not support yet (only {stackable}). "
                       f"Train one seed per process with --seed, or use `testbed bench`.")  # fmt: skip

    # Every check runs before a run directory is created or changed.
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
    with contextlib.ExitStack() as locks:
        for r in runs:
            locks.enter_context(runlog.prepare_run_dir(r.run_dir, r.mode != "new"))
        for r in runs:
            if r.mode == "new" or (r.mode == "resume" and r.cfg.total_steps != r.saved.get("total_steps")):
                runlog.write_config(r.run_dir, args.algo, r.cfg)
            if r.mode != "done":
                runlog.write_meta(r.run_dir, {"preset": r.preset, "resumed": r.mode == "resume"})
        first = runs[0]
        if seeds is None:
            print(f"{args.algo} on {first.cfg.env_id}, seed {first.cfg.seed}, {first.cfg.total_steps} steps, preset {first.preset}")
        else:
            print(f"{args.algo} on {first.cfg.env_id}, seeds {', '.join(map(str, seeds))} side by side, "
                  f"{first.cfg.total_steps} steps each, preset {first.preset}")  # fmt: skip
        for r in runs:
            if r.mode == "done":
                print(f"{r.run_dir} completed its {r.cfg.total_steps} steps already: nothing to do")
            elif r.mode == "new" and r.saved:
                print(f"{r.run_dir} stopped before its first checkpoint: it starts again from its config.yaml")
        print(f"run directory: {first.run_dir}" if seeds is None else f"run directories: {first.run_dir.parent}/seed<k>")
        active = [r for r in runs if r.mode != "done"]
        trained: list[dict[str, Any]] = []
        if active and seeds is None:
            trained = [algo.train(first.cfg, first.run_dir, first.mode == "resume", args.algo)]
        elif active:
            assert algo.train_stack is not None
            trained = algo.train_stack([r.cfg for r in active], [r.run_dir for r in active],
                                       [r.mode == "resume" for r in active], args.algo)  # fmt: skip
        by_dir = {r.run_dir: summary for r, summary in zip(active, trained, strict=True)}
        summaries = [by_dir[r.run_dir] if r.run_dir in by_dir else read_summary(r.run_dir) or {} for r in runs]

    print(json.dumps(summaries[0] if seeds is None else summaries, indent=2))
    for summary in summaries:
        if summary["status"] == "failed":
            print(f"error (seed {summary['seed']}): {summary['error']}", file=sys.stderr)
    where = first.run_dir if seeds is None else first.run_dir.parent
    print(f"Logs, checkpoints and summaries are in {where}. Open TensorBoard with: tensorboard --logdir {where}")
    statuses = {summary["status"] for summary in summaries}
    return EXIT_CODES[next(s for s in ("failed", "interrupted", "completed") if s in statuses)]


def check_path(value: str, option: str) -> None:
    """BadInput for a path option that is empty or holds control characters (a newline, say)."""
    if not value.strip() or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise BadInput(f"{option} {brief(value, 80)} is not a usable path: give a non-empty path without control "
                       "characters (newlines, tabs)")  # fmt: skip


def stack_template(parent: Path, seeds: list[int]) -> dict[str, Any]:
    """The settings of a resumed stack, for its seeds that never started: the config.yaml of one that did
    (the seeds of a stack share every setting but the seed). BadInput when none did."""
    for seed in seeds:
        if (parent / f"seed{seed}" / "config.yaml").exists():
            return runlog.read_config(parent / f"seed{seed}")
    raise BadInput(f"--resume: no seed under {parent} has started (none holds a config.yaml), so there is nothing "
                   "to continue. Run the same command without --resume.")  # fmt: skip


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
        raise BadInput(f"--seeds takes a count from 1 to {MAX_STACK} (5) or a list (0,1,2), got {brief(spec, 80)}; "
                       "one seed is --seed K") from None  # fmt: skip
    if len(set(seeds)) != len(seeds) or min(seeds) < 0 or max(seeds) >= 2**32:
        raise BadInput(f"--seeds must be distinct seeds in [0, 2**32 - 1], got {brief(spec, 80)}")
    if len(seeds) > MAX_STACK:
        raise BadInput(f"--seeds lists {len(seeds)} seeds; one process trains at most {MAX_STACK}. Spread more over "
                       "processes with `testbed bench --seeds N --stack K`.")  # fmt: skip
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
        action_space = action_space_of(args.env)
        continuous = isinstance(action_space, gym.spaces.Box)
        preset_file = Path(args.preset) if args.preset else None
        cfg, preset_name = resolve_config(algo.config, algo.preset or args.algo, args.env, continuous, overrides,
                                          preset_file)  # fmt: skip
        algo.validate(cfg)
        return PlannedRun(cfg, run_dir or default_run_dir(args.algo, args.env, cfg.seed), preset_name, "new")
    assert run_dir is not None
    started = (run_dir / "config.yaml").exists() or template is None
    saved = runlog.read_config(run_dir) if started else {**template, "seed": overrides["seed"]}
    if saved.get("algo") != args.algo or saved.get("env_id") != args.env:
        raise BadInput(f"{run_dir} is a {saved.get('env_id')} run of another algo or env; check --algo and --env")
    saved = {k: v for k, v in saved.items() if k != "algo"}
    cfg = build_config(algo.config, {**saved, **overrides})
    # Compared as typed values: a bench's rerun repeats `--set learning_rate=3e-4 --set env_kwargs=horizon:10`,
    # which config.yaml holds as 0.0003 and {horizon: 10}.
    resolved = runlog.config_to_dict(cfg)
    changed = sorted(k for k in overrides if k != "total_steps" and resolved[k] != saved.get(k))
    if changed:
        raise BadInput(f"a resumed run keeps its settings; only --total-steps may change, not {', '.join(changed)}")
    algo.validate(cfg)
    if not (run_dir / runlog.CHECKPOINT).exists():
        return PlannedRun(cfg, run_dir, "its config.yaml", "new", saved if started else {})
    # Refuses a checkpoint that config.yaml's network or normalization no longer fits, before anything is written.
    ckpt, env, _ = _checkpoint_policy(args.algo, cfg, run_dir, episodes=1)
    env.close()
    trained = ckpt["global_step"]
    if cfg.total_steps < trained and cfg.total_steps != saved.get("total_steps"):
        raise BadInput(f"{run_dir} has already trained {trained} steps; --total-steps must be at least that")
    status = (read_summary(run_dir) or {}).get("status")
    done = status == "completed" and trained >= cfg.total_steps
    return PlannedRun(cfg, run_dir, "resumed", "done" if done else "resume", saved)


def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from agents.training import EVAL_SEED_BASE, evaluate_policy

    torch.set_num_threads(1)
    run_dir = Path(args.run_dir)
    values = runlog.read_config(run_dir)
    algo_name = values.pop("algo")
    if algo_name not in ALGOS:
        raise BadInput(f"{run_dir} was written by algo {algo_name!r}, which this command cannot evaluate")
    if args.episodes < 1:
        raise BadInput(f"--episodes must be at least 1, got {args.episodes}")
    video_dir = _writable_dir(Path(args.video)) if args.video else None
    cfg = build_config(ALGOS[algo_name].config, values)
    ckpt, env, model = _checkpoint_policy(algo_name, cfg, run_dir, args.episodes)
    try:
        seeds = [EVAL_SEED_BASE + i for i in range(args.episodes)]
        returns = evaluate_policy(model, env, seeds, deterministic=not args.stochastic)
    finally:
        env.close()
    mode = "stochastic" if args.stochastic else "deterministic"
    print(f"{cfg.env_id} after {ckpt['global_step']} steps, {mode}, {args.episodes} episodes (seeds {seeds[0]}…): "
          f"return {returns.mean():.2f} ± {returns.std():.2f} (std over episodes)")  # fmt: skip
    if video_dir is not None:
        from lab.video import record_episode

        path = record_episode(model, cfg.env_id, ckpt["normalizers"], video_dir, seeds[0], not args.stochastic)
        print(f"video of the first episode: {path}")
    return 0


def _checkpoint_policy(
    algo_name: str, cfg: RunConfig, run_dir: Path, episodes: int
) -> tuple[dict[str, Any], VectorEnv, torch.nn.Module]:
    """The run's checkpoint, an evaluation env holding its observation statistics, and its policy; a
    checkpoint that does not match config.yaml (network, normalization) is bad input."""
    from agents.training import make_eval_env, observation_statistics
    from envs import load_normalizer_state

    ckpt = runlog.load_checkpoint(run_dir, {"algo": algo_name, "env_id": cfg.env_id})
    env = make_eval_env(cfg, episodes)
    try:
        load_normalizer_state(env, observation_statistics(ckpt["normalizers"]))
        return ckpt, env, ALGOS[algo_name].load_policy(cfg, env, ckpt["model"])
    except BaseException:
        env.close()
        raise


def _writable_dir(path: Path) -> Path:
    """``path`` as a folder this process can write into (created if absent), or BadInput saying why not."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise BadInput(f"cannot create {path} ({error.strerror}); choose a folder you can write to") from None
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        raise BadInput(f"{path} is not a folder you can write to; choose another")
    return path


def _workers(args: argparse.Namespace) -> int:
    if args.workers is not None and args.workers < 1:
        raise BadInput(f"--workers must be at least 1, got {args.workers}")
    return args.workers or os.cpu_count() or 1


def _stack(args: argparse.Namespace) -> int:
    if args.stack < 1:
        raise BadInput(f"--stack must be at least 1 (1 trains each seed in its own process), got {args.stack}")
    return args.stack


def _run_grid(
    grid: Any, workers: int, args: argparse.Namespace, reports: str, prepare: Callable[[Path], None] | None = None
) -> int:
    """Run a planned grid, then say what completed, where the reports are, and what failed."""
    from lab import bench

    try:
        bench_dir, outcomes = bench.run_grid(grid, workers, args.backend, args.ray_address, prepare=prepare,
                                             stack=_stack(args))  # fmt: skip
    except KeyboardInterrupt:
        print("interrupted: running cells saved checkpoints; rerun the same command to continue", file=sys.stderr)
        return 130
    failed = [o for o in outcomes if o.status != "completed"]
    print(f"{len(outcomes) - len(failed)} of {len(grid.cells())} runs completed; {reports.format(bench_dir)}; "
          f"TensorBoard: tensorboard --logdir {bench_dir}")  # fmt: skip
    for outcome in failed:
        print(f"  {outcome.status}: {outcome.cell.label} {outcome.cell.algo} seed {outcome.cell.seed}: {outcome.error}")
    return 1 if failed else 0


def cmd_bench(args: argparse.Namespace) -> int:
    from lab import bench

    workers = _workers(args)
    grid = bench.plan_grid(args.suite, args.algos, args.envs, args.seeds, args.total_steps, args.set, args.name,
                           first_seed=args.first_seed)  # fmt: skip
    cells = len(grid.cells())
    print(f"bench {grid.name}: {len(grid.algos)} algos × {len(grid.envs)} envs × {len(grid.seeds)} seeds = {cells} runs, "
          f"{args.backend} backend, {workers} workers → {bench.BENCH_ROOT / grid.name}")  # fmt: skip
    return _run_grid(grid, workers, args, "report: {0}/report.md")


def cmd_credit(args: argparse.Namespace) -> int:
    from lab import bench, credit

    workers = _workers(args)
    study = credit.plan_study(args.task, args.horizons, args.env_kwargs)
    name = args.name or "credit-" + args.task.replace(":", "-").replace("/", "_")
    grid = bench.plan_grid(None, args.algos, [study.env_id], args.seeds, args.total_steps, args.set, name,
                           variants=study.variants(), first_seed=args.first_seed)  # fmt: skip
    bench_dir = bench.BENCH_ROOT / grid.name
    print(f"credit study {grid.name}: {study.env_id}, {study.axis} {' '.join(study.horizons)} × {len(grid.algos)} algos "
          f"× {len(grid.seeds)} seeds = {len(grid.cells())} runs, {args.backend} backend, {workers} workers → {bench_dir}")  # fmt: skip
    return _run_grid(grid, workers, args, "study report: {0}/credit.md; bench report: {0}/report.md",
                     prepare=lambda folder: credit.write_study(folder, study))


def cmd_tune(args: argparse.Namespace) -> int:
    from lab import tune

    stack = _stack(args)
    plan = tune.plan_tune(args.algo, args.env, args.trials, args.total_steps, args.seeds, args.space, args.set,
                          args.name, args.storage, args.first_seed, args.pruner, args.startup_trials,
                          args.sampler_seed)  # fmt: skip
    print(f"tune {plan.name}: {args.algo} on {args.env}, {plan.trials} trials × seeds {', '.join(map(str, plan.seeds))}, "
          f"{len(plan.space)} parameters, {args.backend} backend, {args.workers} trials at a time → "
          f"{tune.TUNE_ROOT / plan.name}")  # fmt: skip
    try:
        tune_dir, counts = tune.run_study(plan, args.workers, args.backend, args.ray_address, stack=stack)
    except KeyboardInterrupt:
        print("interrupted: running trials saved checkpoints; rerun the same command to continue", file=sys.stderr)
        return 130
    done = ", ".join(f"{n} {state}" for state, n in counts.items()) or "nothing new: the study is full"
    reports = (f"report: {tune_dir}/tune.md; preset: {tune_dir}/preset.yaml" if (tune_dir / "tune.md").exists()
               else "no trial has completed, so there is no report yet")  # fmt: skip
    print(f"this run: {done}; {reports}")
    return 0


def cmd_docs(args: argparse.Namespace) -> int:
    from lab import guide

    written = guide.main(args.out, args.runs, args.quick, args.workers)
    print(f"wrote {len(written)} files into {written[0].parent}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from lab.plot import plot_runs

    paths = plot_runs([Path(p) for p in args.paths], x=args.x, out=Path(args.out) if args.out else None)
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from lab.bench import build_reports

    bench_dir = Path(args.bench_dir)
    if not bench_dir.is_dir():
        raise BadInput(f"{bench_dir} is not a folder; give a bench directory, runs/bench/NAME, or a study's, runs/tune/NAME")
    from lab.tune import TUNE_FILE

    if (bench_dir / TUNE_FILE).exists():
        from lab.tune_report import build_tune_report

        written = build_tune_report(bench_dir)  # read-only on the study: a running driver may keep adding trials
        print(f"wrote {written['markdown']}, {written['html']} and {written['preset']}")
        return 0
    with runlog.DirLock(bench_dir):  # a running bench's driver holds it, and rebuilds the report when it ends
        written = build_reports(bench_dir)
    print(f"wrote {written['markdown']} and {written['html']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="testbed", description="Compare PPO and GRPO-style agents on control tasks.")
    sub = parser.add_subparsers(dest="command", required=True)
    fmt = argparse.ArgumentDefaultsHelpFormatter

    train = sub.add_parser("train", help="train one agent on one env", formatter_class=fmt)
    train.add_argument("--algo", required=True, help=f"one of: {', '.join(ALGOS)}")
    train.add_argument("--env", required=True, help="any registered gymnasium id, e.g. CartPole-v1")
    train.add_argument("--seed", type=int, default=None, help="run seed (default: the preset's, 0)")
    train.add_argument("--total-steps", type=int, default=None, help="env steps (default: the preset's)")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key; repeatable. Keys: the fields of the algo's config")  # fmt: skip
    train.add_argument("--env-kwargs", nargs="+", default=[], metavar="KEY:VALUE",
                       help="keyword arguments of the env, e.g. horizon:300 (config key env_kwargs)")  # fmt: skip
    train.add_argument("--reward-delay", default=None, metavar="K|end",
                       help="release rewards every K steps or at the episode's end (config key reward_delay)")  # fmt: skip
    train.add_argument("--preset", default=None, metavar="FILE",
                       help="a presets file whose entry for --env replaces the packaged one (e.g. a tune's preset.yaml)")  # fmt: skip
    train.add_argument("--seeds", default=None, metavar="N|S1,S2,…",
                       help="train several seeds side by side in one process (PPO): a count, from --seed on, or a "
                            "list; each seed writes an ordinary run directory, RUN_DIR/seed<k>")
    train.add_argument("--run-dir", default=None, help="output directory (default: runs/ALGO/ENV/seedN-TIME); "
                       "with --seeds, the folder holding seed<k>/ (default: runs/ALGO/ENV/seedsN-M-TIME)")
    train.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its checkpoint")
    train.add_argument("--device", choices=["cpu", "cuda", "auto"], default=None, help="network device (default cpu)")
    train.set_defaults(func=cmd_train)

    evaluate = sub.add_parser("eval", help="evaluate a run's checkpoint", formatter_class=fmt)
    evaluate.add_argument("run_dir", help="a run directory holding config.yaml and checkpoint.pt")
    evaluate.add_argument("--episodes", type=int, default=10, help="episodes, one per fixed seed")
    evaluate.add_argument("--stochastic", action="store_true", help="sample actions instead of the policy's mode")
    evaluate.add_argument("--video", default=None, metavar="DIR", help="also record the first episode as a GIF in DIR")
    evaluate.set_defaults(func=cmd_eval)

    from lab.bench import SUITES

    grid = sub.add_parser("bench", help="run a grid of algos × envs × seeds and report it", formatter_class=fmt)
    grid.add_argument("--suite", choices=None, default=None, help=f"a named grid: {', '.join(SUITES)}")
    grid.add_argument("--algos", nargs="+", default=None, help="algos (default: the suite's, else ppo grpo sb3-ppo)")
    grid.add_argument("--envs", nargs="+", default=None, help="gymnasium ids (default: the suite's)")
    grid.add_argument("--seeds", type=int, default=None, help="number of seeds (default: the suite's, 3)")
    grid.add_argument("--first-seed", type=int, default=0, help="seeds run FIRST … FIRST+N−1; sweeps use seeds that "
                      "final results never do")  # fmt: skip
    grid.add_argument("--total-steps", type=int, default=None, help="env steps per run (default: each preset's)")
    grid.add_argument("--set", action="append", default=[], metavar="[ALGO.]KEY=VALUE",
                      help="override a config key of one algo (ALGO.KEY=VALUE) or of all (KEY=VALUE); repeatable")  # fmt: skip
    grid.add_argument("--workers", type=int, default=None, help="runs at a time (default: the number of cores)")
    grid.add_argument("--stack", type=int, default=DEFAULT_STACK, metavar="N",
                       help="the most seeds of one (algo, env) trained side by side in one process, for PPO (default: %(default)s, "
                            "the fastest measured; 1: one process per seed, as the committed results were made)")
    grid.add_argument("--backend", choices=["local", "ray"], default="local", help="where the runs execute")
    grid.add_argument("--ray-address", default=None, help="join this Ray cluster (auto or host:port); "
                      "default: start a local instance")  # fmt: skip
    grid.add_argument("--name", default=None, help="bench name: runs/bench/NAME (default: the suite's name)")
    grid.set_defaults(func=cmd_bench)

    study = sub.add_parser("credit", help="a credit-assignment study: sweep the horizon or reward delay",
                           formatter_class=fmt)  # fmt: skip
    study.add_argument("--task", required=True, metavar="chain|keydoor|delayed:ENV_ID",
                       help="the testbed's chain or key-to-door task, or any env with delayed rewards")  # fmt: skip
    study.add_argument("--horizons", nargs="+", default=None, metavar="H",
                       help="episode lengths of chain/keydoor (default 10 30 100 300 1000); reward delays k of "
                       "delayed:ENV_ID, integers or end (default 1 20 100 end)")  # fmt: skip
    study.add_argument("--algos", nargs="+", default=["ppo", "grpo", "grpo-vine"], help=f"of: {', '.join(ALGOS)}")
    study.add_argument("--seeds", type=int, default=3, help="number of seeds")
    study.add_argument("--first-seed", type=int, default=0, help="seeds run FIRST … FIRST+N−1")
    study.add_argument("--total-steps", type=int, default=None, help="env steps per run (default: each preset's)")
    study.add_argument("--env-kwargs", nargs="+", default=[], metavar="KEY:VALUE", help="more env keyword arguments")
    study.add_argument("--set", action="append", default=[], metavar="[ALGO.]KEY=VALUE",
                       help="override a config key of one algo or of all; repeatable")  # fmt: skip
    study.add_argument("--workers", type=int, default=None, help="runs at a time (default: the number of cores)")
    study.add_argument("--stack", type=int, default=DEFAULT_STACK, metavar="N",
                       help="the most seeds of one (algo, env) trained side by side in one process, for PPO (default: %(default)s, "
                            "the fastest measured; 1: one process per seed, as the committed results were made)")
    study.add_argument("--backend", choices=["local", "ray"], default="local", help="where the runs execute")
    study.add_argument("--ray-address", default=None, help="join this Ray cluster (auto or host:port)")
    study.add_argument("--name", default=None, help="runs/bench/NAME (default: credit-TASK)")
    study.set_defaults(func=cmd_credit)

    tuner = sub.add_parser("tune", help="tune an algo's hyperparameters on one env (Optuna: TPE + median pruner)",
                           formatter_class=fmt)  # fmt: skip
    tuner.add_argument("--algo", required=True, help=f"one of: {', '.join(ALGOS)}")
    tuner.add_argument("--env", required=True, help="any registered gymnasium id")
    tuner.add_argument("--trials", type=int, default=50, help="trials in the study, all runs of it together")
    tuner.add_argument("--total-steps", type=int, default=None, help="env steps per seed of a trial (default: the preset's)")
    tuner.add_argument("--seeds", type=int, default=1, help="seeds per trial; its score is their mean final return")
    tuner.add_argument("--first-seed", type=int, default=100, help="seeds FIRST … FIRST+K−1; bench's 0 … stay unseen")
    tuner.add_argument("--space", default=None, metavar="FILE", help="search space YAML (default: lab/spaces/ALGO.yaml)")
    tuner.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="fix a config key in every trial")
    tuner.add_argument("--workers", type=int, default=1, help="trials at a time, each running its seeds side by side")
    tuner.add_argument("--stack", type=int, default=DEFAULT_STACK, metavar="N",
                       help="the most seeds of one (algo, env) trained side by side in one process, for PPO (default: %(default)s, "
                            "the fastest measured; 1: one process per seed, as the committed results were made)")
    tuner.add_argument("--backend", choices=["local", "ray"], default="local", help="where the trials execute")
    tuner.add_argument("--ray-address", default=None, help="join this Ray cluster (auto or host:port)")
    tuner.add_argument("--name", default=None, help="runs/tune/NAME and the study's name (default: ALGO-ENV)")
    tuner.add_argument("--storage", default=None, metavar="URL",
                       help="an Optuna database URL shared by several drivers (default: runs/tune/NAME/study.log)")  # fmt: skip
    tuner.add_argument("--pruner", choices=["median", "none"], default="median",
                       help="stop trials below the median of earlier ones; none where merely surviving scores well "
                       "early (Hopper)")  # fmt: skip
    tuner.add_argument("--startup-trials", type=int, default=5, help="trials before the pruner and TPE start")
    tuner.add_argument("--sampler-seed", type=int, default=0, help="the TPE sampler's seed")
    tuner.set_defaults(func=cmd_tune)

    docs = sub.add_parser("docs", help="make every figure and table of docs/ppo_and_grpo.md from the testbed's own runs",
                          formatter_class=fmt)  # fmt: skip
    docs.add_argument("--quick", action="store_true", help="tiny budgets and one seed: every file in seconds, not the results")
    docs.add_argument("--out", default=None, help="folder for the figures (default: docs/figures; quick: "
                      "runs/docs-quick/figures)")  # fmt: skip
    docs.add_argument("--runs", default=None, help="folder for the training runs, resumable (default: runs/docs; quick: "
                      "runs/docs-quick)")  # fmt: skip
    docs.add_argument("--workers", type=int, default=2, help="training runs at a time")
    docs.set_defaults(func=cmd_docs)

    plot = sub.add_parser("plot", help="learning curves of runs or benches", formatter_class=fmt)
    plot.add_argument("paths", nargs="+", help="run directories or folders holding them (benches)")
    plot.add_argument("--x", choices=["steps", "time"], default="steps", help="x-axis: env steps or wall-clock")
    plot.add_argument("--out", default=None, help="image file (PNG; an SVG is written beside it)")
    plot.set_defaults(func=cmd_plot)

    report = sub.add_parser("report", help="rebuild a bench's or a study's report from disk", formatter_class=fmt)
    report.add_argument("bench_dir", help="runs/bench/NAME or runs/tune/NAME")
    report.set_defaults(func=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BadInput as error:
        message = str(error)  # a value quoted whole (a huge --name, say) is cut, keeping the advice at the end
        if len(message) > 1500:
            message = f"{message[:1000]} … {message[-400:]}"
        print(f"testbed {args.command}: error: {message}", file=sys.stderr)
        return 2
    except OSError as error:  # a read-only or full disk, a folder that vanished: no traceback, nothing half-written
        where = f" {error.filename}" if error.filename else ""
        print(f"testbed {args.command}: error: cannot write{where}: {error.strerror or error}. Free space or "
              "choose a writable folder, then rerun.", file=sys.stderr)  # fmt: skip
        return 2
    except KeyboardInterrupt:  # before a run's own signal handling starts (or after it ends)
        print(f"testbed {args.command}: interrupted. A run directory without a checkpoint can be started again "
              "with the same command.", file=sys.stderr)  # fmt: skip
        return 130


if __name__ == "__main__":
    sys.exit(main())
