"""How fast our PPO trains, beside Stable-Baselines3's PPO at identical hyperparameters and the raw env rate.

    python benchmarks/speed.py [--cases cartpole halfcheetah] [--repeats 3] [--out benchmarks/results/speed]

Per case, in one invocation:
- whole processes are timed (wall clock, interpreter start and imports included): ours is
  ``python -m lab train`` with periodic evaluations and intermediate checkpoints off, so its final
  deterministic evaluation and final checkpoint stay in the measured time; SB3's is a small script run with
  ``python -c`` that only builds and trains. Ours and SB3 alternate (A B A B …) to spread machine noise;
- both sides do the same work: the same env steps, and the same gradient steps. SB3's PPO trains as
  ``--algo sb3-ppo`` trains it (``agents.sb3.Learner``: SB3's ``collect_rollouts``, then its ``train()``,
  once per epoch when the preset recomputes advantages every epoch, which a plain ``model.learn()`` would
  run as one epoch). Each process's optimizer steps are counted (ours: its checkpoint's Adam step count;
  SB3's: calls of its optimizer's ``step``) and reported beside its time;
- the ceiling: random actions, pre-sampled, in one plain gymnasium env and in the vector env our preset
  trains on;
- where our time goes: one more process of ours with timers wrapped around rollout, update and evaluation.

Writes ``OUT/speed.csv`` (one row per timed process) and ``OUT/speed.md``, rewritten after every process so
that a crash loses nothing already measured. Both describe this invocation only.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script, sys.path[0] is benchmarks/; our packages live one level up
    sys.path.insert(0, str(ROOT))

from lab.machine import machine_line  # noqa: E402  (after the path: the script runs from benchmarks/)

SEED = 0
# Single-threaded on both sides: one run is one process with one thread (DESIGN.md, Execution).
THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
OURS_FLAGS = ["--set", "eval_interval=0", "--set", "checkpoint_interval=0"]


@dataclass(frozen=True)
class Case:
    name: str
    env_id: str
    total_steps: int


CASES = {
    "cartpole": Case("cartpole", "CartPole-v1", 100_000),
    "halfcheetah": Case("halfcheetah", "HalfCheetah-v5", 50_000),
}

# The Stable-Baselines3 side: SB3's env and PPO built from our config (JSON in argv[1]) by agents.sb3.Learner, and
# driven through the two phases that OnPolicyAlgorithm.learn alternates, as the lifecycle drives them for
# ``--algo sb3-ppo``: so ``recompute_advantages`` runs its n_epochs train() calls, where model.learn() would run one
# epoch. Nothing is evaluated or saved; the learner's evaluation env is built (a tenth of a second for HalfCheetah's
# ten), never stepped. Counts the optimizer's steps; prints one JSON line at the end.
SB3_SCRIPT = """
import json, sys, time
import torch
torch.set_num_threads(1)
from agents import sb3
from agents.config import build_config
from agents.ppo import PPOConfig

cfg = build_config(PPOConfig, json.loads(sys.argv[1]))
learner = sb3.Learner([cfg])
model, optimizer_steps = learner.model, [0]
step = model.policy.optimizer.step
def counted_step(*args, **kwargs):
    optimizer_steps[0] += 1
    return step(*args, **kwargs)
model.policy.optimizer.step = counted_step
start, iteration = time.perf_counter(), 0
while model.num_timesteps < cfg.total_steps:  # as model.learn() and our lifecycle count iterations
    iteration += 1
    collected = learner.collect([iteration], [True])
    remaining = max(1.0 - model.num_timesteps / cfg.total_steps, 0.0)  # SB3 schedules itself; as run_stack passes it
    rate = cfg.learning_rate * (remaining if cfg.anneal_lr else 1.0)
    learner.learn(collected, [iteration], [remaining], [rate], [True])
loop_s = time.perf_counter() - start
learner.close()
print(json.dumps({"total_steps": int(model.num_timesteps), "loop_s": loop_s, "gradient_steps": optimizer_steps[0]}))
"""


@dataclass
class Timed:
    """One timed process: a row of speed.csv."""

    case: str
    env_id: str
    impl: str  # ours | sb3 | ours_profiled
    repeat: int
    wall_s: float
    total_steps: int | None
    sps: float | None  # total_steps / wall_s: the whole process
    loop_s: float | None  # ours: the training loop (final evaluation excluded); SB3: its collect/train loop
    returncode: int
    gradient_steps: int | None = None  # optimizer steps the process took: equal on both sides


@dataclass
class CaseResult:
    case: Case
    hyperparameters: str
    eval_episodes: int
    timed: list[Timed] = field(default_factory=list)
    ceiling: dict[str, float] = field(default_factory=dict)
    ceiling_vector: str = ""
    profile: dict[str, float] = field(default_factory=dict)
    gradient_steps: int = 0
    fixed: dict[str, float] = field(default_factory=dict)


# ── the machine and the command, without host names or absolute paths ──────────────────────────────


def _public_path(value: str) -> str:
    if not os.path.isabs(value):
        return value
    try:
        return str(Path(value).relative_to(Path.cwd()))
    except ValueError:
        return f"…/{Path(value).name}"  # outside the working directory: keep only the name


def public_command(script: str, argv: list[str]) -> str:
    """``python SCRIPT ARGS`` as typed, with absolute paths made relative (or cut to their name)."""
    script_path = Path(script).resolve()
    if script_path.is_relative_to(ROOT):  # as run from the repository root, wherever it was run from
        script = str(script_path.relative_to(ROOT))
    args = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        args.append(f"{key}={_public_path(value)}" if sep and key.startswith("--") else _public_path(arg))
    parts = ["python", script if not os.path.isabs(script) else _public_path(script), *args]
    return " ".join(a if re.fullmatch(r"[\w@%+=:,./…-]+", a) else shlex.quote(a) for a in parts)


def child_env() -> dict[str, str]:
    """The environment of every timed process: one thread, and our packages importable."""
    env = {**os.environ, **THREAD_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


# ── the hyperparameters, ours and their SB3 equivalents ───────────────────────────────────────────


def resolve(case: Case, algo: str = "ppo") -> tuple[Any, bool]:
    """Our preset's config for the case (PPOConfig, or GRPOConfig for ``grpo``) and whether its actions are
    continuous."""
    import gymnasium as gym

    from agents.config import resolve_config
    from agents.grpo import GRPOConfig
    from agents.ppo import PPOConfig
    from envs import action_space_of

    continuous = isinstance(action_space_of(case.env_id), gym.spaces.Box)
    config = GRPOConfig if algo == "grpo" else PPOConfig
    cfg, _ = resolve_config(config, algo, case.env_id, continuous, {"total_steps": case.total_steps})
    return cfg, continuous


def describe(cfg: Any, continuous: bool) -> str:
    """One line of the SB3 arguments (``agents.sb3.sb3_arguments``) and env, for the report."""
    from agents.sb3 import LinearSchedule, sb3_arguments

    arguments = sb3_arguments(cfg, continuous)
    parts = [f"n_envs={cfg.n_envs}"]
    for key, value in arguments.items():
        if key in ("policy_kwargs", "seed", "device", "verbose"):
            continue
        if key == "n_epochs" and cfg.recompute_advantages:  # the learner's epochs, not SB3's argument
            parts.append(f"n_epochs={cfg.n_epochs} (train() of one epoch each, advantages recomputed between)")
            continue
        parts.append(f"{key}=linear from {value.start}" if isinstance(value, LinearSchedule) else f"{key}={value}")
    for key, value in arguments["policy_kwargs"].items():
        parts.append(f"{key}={value.__name__ if isinstance(value, type) else value}")
    normalize = cfg.normalize_obs or cfg.normalize_reward
    parts.append(
        f"VecNormalize(norm_obs={cfg.normalize_obs}, norm_reward={cfg.normalize_reward}, clip 10, gamma={cfg.gamma})"
        if normalize
        else "no VecNormalize"
    )
    return ", ".join(parts)


# ── timed processes ────────────────────────────────────────────────────────────────────────────────


def time_process(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Wall-clock seconds of one whole process, from spawn to exit."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-2000:]
        print(f"process failed (exit {proc.returncode}): {shlex.join(cmd[:4])} …\n{tail}", file=sys.stderr)
    return wall, proc


def train_argv(case: Case, run_dir: Path) -> list[str]:
    """Our ``lab train`` arguments for a case."""
    return [
        "train",
        "--algo",
        "ppo",
        "--env",
        case.env_id,
        "--seed",
        str(SEED),
        "--total-steps",
        str(case.total_steps),
        *OURS_FLAGS,
        "--run-dir",
        str(run_dir),
    ]


def checkpoint_gradient_steps(run_dir: Path) -> int | None:
    """The Adam step count in a run's final checkpoint: the gradient steps the run took (None without one)."""
    import torch

    path = run_dir / "checkpoint.pt"
    if not path.exists():
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)["optimizer"]["state"]
    return int(state[0]["step"]) if state else 0


def run_ours(case: Case, repeat: int) -> Timed:
    with tempfile.TemporaryDirectory(prefix="speed-ours-") as tmp:
        run_dir = Path(tmp) / "run"
        wall, proc = time_process([sys.executable, "-m", "lab", *train_argv(case, run_dir)])
        summary_path = run_dir / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        ok = proc.returncode == 0 and summary.get("status") == "completed"
        optimizer_steps = checkpoint_gradient_steps(run_dir) if ok else None
    steps = summary.get("total_steps") if ok else None
    return Timed(
        case.name,
        case.env_id,
        "ours",
        repeat,
        wall,
        steps,
        steps / wall if steps else None,
        summary.get("wall_time_s") if ok else None,
        proc.returncode,
        optimizer_steps,
    )


def sb3_argv(cfg: Any) -> list[str]:
    """The command of one SB3 process (SB3_SCRIPT) training ``cfg``."""
    from agents.rundir import config_to_dict

    return [sys.executable, "-c", SB3_SCRIPT, json.dumps(config_to_dict(cfg))]


def run_sb3(case: Case, cfg: Any, repeat: int) -> Timed:
    wall, proc = time_process(sb3_argv(cfg))
    result: dict[str, Any] = {}
    if proc.returncode == 0 and proc.stdout.strip():
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    steps = result.get("total_steps")
    return Timed(
        case.name,
        case.env_id,
        "sb3",
        repeat,
        wall,
        steps,
        steps / wall if steps else None,
        result.get("loop_s"),
        proc.returncode,
        result.get("gradient_steps"),
    )


# ── the ceiling: raw env step rate ─────────────────────────────────────────────────────────────────


def _rate(step_block: Callable[[], int], seconds: float) -> float:
    """Steps per second of repeated ``step_block`` calls over about ``seconds`` (after one warm-up block)."""
    step_block()
    steps, start = 0, time.perf_counter()
    while True:
        steps += step_block()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return steps / elapsed


def ceiling(cfg: Any, seconds: float) -> tuple[dict[str, float], str]:
    """Random-action step rates of one plain env and of our preset's training vector env."""
    import gymnasium as gym

    import envs

    block = 1000  # pre-sampled actions, so sampling is not timed
    single = gym.make(cfg.env_id)
    single.action_space.seed(SEED)
    single_actions = [single.action_space.sample() for _ in range(block)]
    single.reset(seed=SEED)

    def single_block() -> int:
        for action in single_actions:
            _, _, terminated, truncated, _ = single.step(action)
            if terminated or truncated:
                single.reset()
        return block

    options = envs.EnvOptions(
        normalize_obs=cfg.normalize_obs,
        normalize_reward=cfg.normalize_reward,
        gamma=cfg.gamma,
        vectorization=cfg.vectorization,
    )
    vector = envs.make_vector(cfg.env_id, cfg.n_envs, options)  # as agents.run_envs.open_envs builds it
    vector.action_space.seed(SEED)
    vector_actions = [vector.action_space.sample() for _ in range(max(1, block // cfg.n_envs))]  # (N, ...) each
    vector.reset(seed=SEED)

    def vector_block() -> int:
        for actions in vector_actions:
            vector.step(actions)  # NEXT_STEP autoreset: no manual resets
        return len(vector_actions) * cfg.n_envs

    try:
        rates = {"single": _rate(single_block, seconds), "vector": _rate(vector_block, seconds)}
    finally:
        single.close()
        vector.close()
    layers, layer = [], vector
    while layer is not None:  # name the wrapper chain, outermost first
        layers.append(type(layer).__name__)
        layer = getattr(layer, "env", None)
    return rates, f"{cfg.n_envs} env{'s' if cfg.n_envs > 1 else ''}: {' ∘ '.join(layers)}"


# ── where the time goes ────────────────────────────────────────────────────────────────────────────


def profile_child(report: str, argv: list[str]) -> int:
    """Inside the profiled process: wrap the phases with timers, run ``lab train``, write the totals."""
    import agents.ppo as ppo_module
    import agents.training as training
    from agents import registry
    from lab import cli

    totals = {"rollout": 0.0, "update": 0.0, "evaluation": 0.0, "train": 0.0}

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[name] += time.perf_counter() - start

        return wrapper

    # The lifecycle calls these through the Learner class and training's module namespace at each call, so
    # wrapping those attributes works.
    ppo_module.Learner.collect = timed("rollout", ppo_module.Learner.collect)  # type: ignore[method-assign]
    ppo_module.Learner.learn = timed("update", ppo_module.Learner.learn)  # type: ignore[method-assign]
    training.evaluate = timed("evaluation", training.evaluate)
    algo = registry.get("ppo")  # holds ppo.train itself, bound when the registry is first built
    registry.algos()["ppo"] = replace(algo, train=timed("train", algo.train))
    code = cli.main(argv)
    Path(report).write_text(json.dumps(totals))
    return code


def profile_ours(case: Case) -> tuple[Timed, dict[str, float]]:
    """One more process of ours, with phase timers; the phases in seconds, and the whole process."""
    with tempfile.TemporaryDirectory(prefix="speed-profile-") as tmp:
        report = Path(tmp) / "profile.json"
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--profile-child",
            str(report),
            *train_argv(case, Path(tmp) / "run"),
        ]
        wall, proc = time_process(cmd)
        totals = json.loads(report.read_text()) if report.exists() else {}
    timed = Timed(case.name, case.env_id, "ours_profiled", 1, wall, None, None, None, proc.returncode)
    if not totals:
        return timed, {}
    phases = {k: totals[k] for k in ("rollout", "update", "evaluation")}
    phases["rest inside train()"] = totals["train"] - sum(phases.values())
    phases["rest outside train()"] = wall - totals["train"]
    phases["whole process"] = wall
    return timed, phases


# What a torch PPO process pays before its first env step, ours and SB3's alike: importing torch, and building the
# first torch optimizer, whose constructor imports torch's compiler stack (once per process; ours builds one per
# seed, agents/optimizers.py).
FIXED_SCRIPT = """
import json, time
start = time.perf_counter()
import torch
imported = time.perf_counter()
torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])
print(json.dumps({"import torch": imported - start, "first torch optimizer": time.perf_counter() - imported}))
"""


def fixed_costs(repeats: int = 3) -> dict[str, float]:
    """Seconds of the costs above, medians over fresh processes; empty if a process failed."""
    runs = []
    for _ in range(repeats):
        _, proc = time_process([sys.executable, "-c", FIXED_SCRIPT])
        if proc.returncode != 0:
            return {}
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def gradient_steps(cfg: Any) -> int:
    """Gradient steps of one run: iterations × epochs × minibatches (no target-KL stop in the presets)."""
    return cfg.num_iterations * cfg.n_epochs * cfg.num_minibatches


# ── reports ────────────────────────────────────────────────────────────────────────────────────────


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def median_wall(result: CaseResult, impl: str) -> float | None:
    """Median whole-process seconds of one implementation's successful processes."""
    return _median([t.wall_s for t in result.timed if t.impl == impl and t.returncode == 0])


def ratio(result: CaseResult) -> float | None:
    """Median SB3 process time over median ours: above 1, ours is faster."""
    ours, sb3 = median_wall(result, "ours"), median_wall(result, "sb3")
    return sb3 / ours if ours and sb3 else None


def case_markdown(result: CaseResult) -> str:
    """The section of speed.md for one case."""
    case = result.case
    steps = next((t.total_steps for t in result.timed if t.total_steps), case.total_steps)
    lines = [
        f"## {case.name}: {case.env_id}, {steps:,} steps, seed {SEED}",
        "",
        f"Hyperparameters (our preset, as SB3 arguments): {result.hyperparameters}. Ours also runs its final "
        f"evaluation, {result.eval_episodes} episodes, inside the measured time.",
        "",
        (
            "| implementation | process times (s) | median (s) | steps/s, whole process | steps/s, training loop | "
            "gradient steps |"
        ),
        "|---|---|---|---|---|---|",
    ]
    medians: dict[str, float | None] = {}  # steps/s of the whole process
    loops: dict[str, float | None] = {}  # steps/s of the training loop
    work: dict[str, set[int | None]] = {}  # the gradient steps each implementation's processes took
    for impl, label in (("ours", "ours (`python -m lab train`)"), ("sb3", "Stable-Baselines3")):
        rows = [t for t in result.timed if t.impl == impl]
        good = [t for t in rows if t.returncode == 0 and t.total_steps]
        times = ", ".join(_fmt(t.wall_s) + ("" if t.returncode == 0 else f" (exit {t.returncode})") for t in rows)
        medians[impl] = _median([t.total_steps / t.wall_s for t in good])  # type: ignore[operator]
        loops[impl] = _median([t.total_steps / t.loop_s for t in good if t.loop_s])  # type: ignore[operator]
        work[impl] = {t.gradient_steps for t in good}
        counts = ", ".join("–" if n is None else f"{n:,}" for n in sorted(work[impl], key=lambda n: n or 0))
        lines.append(
            f"| {label} | {times or '–'} | {_fmt(_median([t.wall_s for t in good]))} | {_fmt(medians[impl], 0)} | "
            f"{_fmt(loops[impl], 0)} | {counts or '–'} |"
        )
    r = ratio(result)
    verdict = "–" if r is None else (f"ours is ×{r:.2f} faster" if r >= 1 else f"ours is ×{1 / r:.2f} slower")
    lines += ["", f"SB3 / ours, median process times: {_fmt(r)} ({verdict}).", ""]
    if len(work["ours"] | work["sb3"]) > 1:  # a ratio of unequal work means nothing: say so beside it
        unequal = "**Unequal work**: the two sides took different numbers of gradient steps, so the ratio above "
        lines += [unequal + "does not compare the same training.", ""]
    if result.ceiling:
        vector = result.ceiling["vector"]
        fraction, loop_fraction = (f"{100 * v / vector:.1f}%" if v else "–" for v in (medians["ours"], loops["ours"]))
        lines += [
            "Ceiling: random actions, pre-sampled, no policy.",
            "",
            "| env | steps/s |",
            "|---|---|",
            f"| one plain `gym.make` env | {_fmt(result.ceiling['single'], 0)} |",
            f"| our preset's vector env ({result.ceiling_vector}) | {_fmt(vector, 0)} |",
            "",
            f"Our training runs at {fraction} of the vector env's ceiling counting the whole process, {loop_fraction} "
            f"counting its training loop only (medians).",
            "",
        ]
    if result.profile:
        whole = result.profile["whole process"]
        lines += [
            "Where our time goes (one extra process of ours, with timers around the phases):",
            "",
            "| part | s | % of the process |",
            "|---|---|---|",
        ]
        labels = {
            "rollout": "rollout (`ppo.Learner.collect`)",
            "update": "update (`ppo.Learner.learn`: GAE and the epochs)",
            "evaluation": "final evaluation (`tracking.evaluate`)",
            "rest inside train()": "rest inside `train()`: env and model construction, GAE, logging, checkpoint",
            "rest outside train()": "rest outside `train()`: interpreter start, imports, config, run directory",
            "whole process": "whole process",
        }
        for key, label in labels.items():
            lines.append(f"| {label} | {_fmt(result.profile[key])} | {100 * result.profile[key] / whole:.1f} |")
        lines.append("")
    if result.profile and result.fixed and result.gradient_steps and result.ceiling:
        sb3 = median_wall(result, "sb3")
        env_s = steps / result.ceiling["vector"]
        imports = result.fixed["import torch"] + result.fixed["first torch optimizer"]
        floor = imports + result.profile["update"] + env_s
        per_step = 1000 * result.profile["update"] / result.gradient_steps
        lines += [
            f"A bound on the ratio. Three costs no faster code around the update removes: (1) what every torch process "
            f"pays, ours and SB3's alike (fresh processes, medians of 3): `import torch`, "
            f"{_fmt(result.fixed['import torch'])} s, and its first torch optimizer, which imports torch's compiler "
            f"stack, {_fmt(result.fixed['first torch optimizer'])} s; (2) the update: "
            f"{result.gradient_steps:,} gradient steps at {per_step:.2f} ms each, {_fmt(result.profile['update'])} s; "
            f"(3) {steps:,} steps of the preset's vector env at its ceiling rate, {_fmt(env_s)} s. With acting, "
            f"logging, evaluation and everything else free, our process would take {_fmt(floor)} s: SB3 / that = "
            f"{_fmt(sb3 / floor if sb3 else None)}, the most this update allows.",
            "",
        ]
    return "\n".join(lines)


def markdown(results: list[CaseResult], command: str, machine: str) -> str:
    head = [
        "# Training speed: our PPO beside Stable-Baselines3's PPO",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine}. Date: {time.strftime('%Y-%m-%d')}.",
        "",
        "Conventions: each time is a whole process, wall clock from spawn to exit, interpreter start and imports "
        "included; both sides single-threaded (OMP_NUM_THREADS=1, MKL_NUM_THREADS=1, torch.set_num_threads(1)); "
        "identical hyperparameters, resolved from our preset; ours and SB3 alternate. "
        "Ours runs with periodic evaluations and intermediate checkpoints off (`--set eval_interval=0 --set "
        "checkpoint_interval=0`); its final deterministic evaluation, its final checkpoint and its "
        "TensorBoard/CSV logging stay in the measured time. SB3 runs no evaluation and saves nothing. "
        "Both sides take the same env steps and the same gradient steps: SB3's PPO trains as `--algo sb3-ppo` "
        "trains it (`agents.sb3.Learner`: `collect_rollouts`, then `train()`, once per epoch where the preset "
        "recomputes advantages every epoch); the gradient steps column counts each process's optimizer steps. "
        '"Training loop" steps/s: ours excludes its final evaluation; SB3\'s is its collect/train loop. '
        "Envs: ours through `envs.make_vector` (gymnasium's native vector env where it exists); SB3 through "
        "`make_vec_env` (a DummyVecEnv of Monitor-wrapped envs).",
        "",
    ]
    return "\n".join(head + [case_markdown(r) for r in results])


def write_outputs(out: Path, results: list[CaseResult], command: str, machine: str) -> None:
    """Rewrite speed.csv and speed.md from everything measured so far (temporary file, then rename)."""
    out.mkdir(parents=True, exist_ok=True)
    names = [f.name for f in fields(Timed)]
    tmp = out / ".speed.csv.tmp"
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=names)
        writer.writeheader()
        for result in results:
            for t in result.timed:
                row = asdict(t)
                row.update({k: round(v, 4) for k, v in row.items() if isinstance(v, float)})
                writer.writerow(row)
    os.replace(tmp, out / "speed.csv")
    tmp = out / ".speed.md.tmp"
    tmp.write_text(markdown(results, command, machine))
    os.replace(tmp, out / "speed.md")


# ── main ───────────────────────────────────────────────────────────────────────────────────────────


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES), help="cases to time")
    parser.add_argument("--repeats", type=int, default=3, help="timed processes per implementation and case")
    parser.add_argument("--out", default="benchmarks/results/speed", help="folder for speed.csv and speed.md")
    parser.add_argument("--cartpole-steps", type=int, default=CASES["cartpole"].total_steps, help="steps (testing)")
    parser.add_argument(
        "--halfcheetah-steps", type=int, default=CASES["halfcheetah"].total_steps, help="steps (testing)"
    )
    parser.add_argument("--ceiling-seconds", type=float, default=2.0, help="measurement time of each env rate")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.cartpole_steps < 1 or args.halfcheetah_steps < 1 or args.ceiling_seconds <= 0:
        parser.error("--repeats, the step counts and --ceiling-seconds must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--profile-child"]:
        return profile_child(argv[1], argv[2:])
    args = parse_args(argv)
    os.environ.update(THREAD_ENV)  # also this process, which measures the ceiling; set before numpy loads
    command, machine, out = public_command(sys.argv[0], argv), machine_line(), Path(args.out)
    steps = {"cartpole": args.cartpole_steps, "halfcheetah": args.halfcheetah_steps}
    print(f"Machine: {machine}\nWriting {out / 'speed.csv'} and {out / 'speed.md'} (rewritten as results come)")
    results: list[CaseResult] = []
    for name in args.cases:
        case = Case(name, CASES[name].env_id, steps[name])
        cfg, continuous = resolve(case)
        result = CaseResult(case, describe(cfg, continuous), cfg.eval_episodes, gradient_steps=gradient_steps(cfg))
        results.append(result)
        result.ceiling, result.ceiling_vector = ceiling(cfg, args.ceiling_seconds)
        write_outputs(out, results, command, machine)
        for repeat in range(1, args.repeats + 1):
            for impl in ("ours", "sb3"):  # alternating, so slow spells of the machine hit both
                timed = run_ours(case, repeat) if impl == "ours" else run_sb3(case, cfg, repeat)
                result.timed.append(timed)
                print(f"  {name} {timed.impl} #{repeat}: {timed.wall_s:.2f} s", flush=True)
                write_outputs(out, results, command, machine)
        timed, result.profile = profile_ours(case)
        result.timed.append(timed)
        result.fixed = fixed_costs()
        write_outputs(out, results, command, machine)
        print("\n" + case_markdown(result), flush=True)
    failed = [t for r in results for t in r.timed if t.returncode != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
