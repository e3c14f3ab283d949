"""Kill ``testbed`` commands at random moments, rerun them, and check that nothing was lost or left behind.

    python benchmarks/fault_probe.py [--kills 100] [--seed 0] [--scenarios train,stack,bench,bench-ray,tune]
                                     [--work DIR] [--out benchmarks/results/fault-probe]

The acceptance test of the README's fault guarantees. Each kill point starts one command in a fresh folder,
stops it after a random delay with SIGKILL (mostly), SIGINT or SIGTERM, sent to the command alone or, for
``bench`` and ``tune``, to its whole process group, or kills one of its trainers alone with SIGKILL, as the
out-of-memory killer would, while the command goes on (its driver retries the cell, from the checkpoint) and
ends. At about one kill point in three the command's folder is then moved elsewhere, once its processes have
ended (as a rerun waits for them), and the rerun runs there. The probe reruns the same command (``train`` with
``--resume`` where a checkpoint exists) and checks that
1. the rerun exits 0;
2. every run, cell and trial completed (``tune``: the study holds its trials, none running, and each
   completed trial's parameters and score are those of its runs);
3. every run is bit-identical to the same command run once without a kill (``progress.csv`` but for its
   timing columns, and the checkpoint's model), where the README promises it: not in ``tune``, whose
   resumed sampler draws other trials, nor for a stack's seed that was resumed alone in between;
4. no process of the command is left, a local Ray instance's included, and nothing wrote to a moved folder's
   old place;
5. no lock is held and no stray ``.stack-<pid>.log`` is left.

Scenarios, on CartPole-v1 with tiny budgets and a checkpoint every 512 steps: ``train`` (PPO, GRPO, and a PPO
iteration that overshoots its budget), ``stack`` (``train --seeds 0,1,2``, PPO and GRPO; before the stack's
rerun, its seed 1 sometimes resumes alone), ``bench`` (local), ``bench-ray`` and ``tune``. Kill points take
the chosen scenarios in turn, and a scenario's commands in turn; each delay is drawn uniformly over the
command's uninterrupted duration, measured once with its reference run.

Writes ``OUT/probe.csv`` (a row per kill point) and ``OUT/probe.md``, rewritten after every kill point.
Exits 1 if any kill point failed.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import importlib.util
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script, sys.path[0] is benchmarks/; our packages live one level up
    sys.path.insert(0, str(ROOT))

from benchmarks import speed  # noqa: E402  (after the sys.path line above, run as a script)

ENV, NAME = "CartPole-v1", "probe"  # every bench and study is runs/bench/probe or runs/tune/probe in its folder
FLAGS = ("--set", "eval_episodes=2", "--set", "checkpoint_interval=512")
MARKER = "TESTBED_FAULT_PROBE"  # in each command's environment, inherited by its trainers and Ray: its folder
TIMING = ("time_s", "/SPS")  # progress.csv's clock columns: wall_time_s, grpo/step_time_s, charts/SPS …
RAY_NAMES = ("raylet", "gcs_server", "dashboard", "runtime_env", "ray::", "log_monitor", "default_worker")
RERUN_TIMEOUT_S, STOP_TIMEOUT_S = 300.0, 120.0  # a whole run; a signalled command's stop
TUNE_TRIALS, TUNE_SEEDS, SOLO_SEED = 3, 2, 1
DRIVEN = ("bench", "bench-ray", "tune")  # the scenarios whose command drives trainers of its own
TARGETS = ("command", "group", "trainer")  # whom a driven command's kill point signals, and how often (below)
TARGET_WEIGHTS, MOVED_SHARE = (3, 3, 4), 1 / 3
WRITER_WAIT_S = 30.0  # a rerun's wait for a killed driver's trainers (lab.cells.WRITER_WAIT_S), before a move
TRAINER = " -m lab train "  # a trainer's command line, as a driver starts it (lab.cells.Cell.command)


@dataclasses.dataclass(frozen=True)
class Variant:
    """One command of a scenario: its ``testbed`` arguments and the run directories it writes, relative to
    its folder (a study's are read from its journal)."""

    scenario: str
    label: str
    argv: tuple[str, ...]
    runs: tuple[str, ...] = ()

    @property
    def grace_s(self) -> float:
        """How long the processes of a command that has ended may take to end too (Ray's take longest)."""
        return 10.0 if self.scenario == "bench-ray" else 5.0


def train_variant(label: str, algo: str, steps: int, *extra: str, seeds: tuple[int, ...] = ()) -> Variant:
    """``testbed train`` into runs/LABEL: one run, or with ``seeds`` a stack (runs/LABEL/seed<k>)."""
    run_dir = f"runs/{label}"
    which = ("--seeds", ",".join(map(str, seeds))) if seeds else ()
    argv = (
        "train",
        "--algo",
        algo,
        "--env",
        ENV,
        *which,
        "--total-steps",
        str(steps),
        *FLAGS,
        *extra,
        "--run-dir",
        run_dir,
    )
    runs = tuple(f"{run_dir}/seed{s}" for s in seeds) or (run_dir,)
    return Variant("stack" if seeds else "train", label, argv, runs)


def bench_variant(label: str, *extra: str) -> Variant:
    """``testbed bench`` of PPO and GRPO, 2 seeds each, on 2 workers."""
    argv = (
        "bench",
        "--algos",
        "ppo",
        "grpo",
        "--envs",
        ENV,
        "--seeds",
        "2",
        "--total-steps",
        "4096",
        *FLAGS,
        "--name",
        NAME,
        "--workers",
        "2",
        *extra,
    )
    return Variant(
        label, label, argv, tuple(f"runs/bench/{NAME}/{ENV}/{a}/seed{s}" for a in ("ppo", "grpo") for s in (0, 1))
    )


TUNE = Variant(
    "tune",
    "tune",
    (
        "tune",
        "--algo",
        "ppo",
        "--env",
        ENV,
        "--trials",
        str(TUNE_TRIALS),
        "--total-steps",
        "4096",
        "--seeds",
        str(TUNE_SEEDS),
        *FLAGS,
        "--name",
        NAME,
        "--workers",
        "1",
    ),
)
VARIANTS = (
    train_variant("train-ppo", "ppo", 4096),
    train_variant("train-grpo", "grpo", 4096),
    # One iteration of 8 × 2048 steps for a budget of 1000: every kill after the start lands in the last iteration.
    train_variant("train-overshoot", "ppo", 1000, "--set", "n_steps=2048", "--set", "n_epochs=20"),
    train_variant("stack-ppo", "ppo", 4096, seeds=(0, 1, 2)),
    train_variant("stack-grpo", "grpo", 4096, seeds=(0, 1, 2)),
    bench_variant("bench"),
    bench_variant("bench-ray", "--backend", "ray"),
    TUNE,
)
SCENARIOS = tuple(dict.fromkeys(v.scenario for v in VARIANTS))


@dataclasses.dataclass(frozen=True)
class KillPoint:
    index: int
    variant: Variant
    signal: signal.Signals
    target: str  # command | group (the command's whole process group) | trainer (one trainer alone, SIGKILL)
    fraction: float  # of the command's uninterrupted duration
    solo: bool  # a stack's seed 1 resumes alone before the stack does
    moved: bool  # the command's folder moves elsewhere between the kill and the rerun


@dataclasses.dataclass
class Row:
    index: int
    scenario: str
    variant: str
    signal: str
    target: str  # command | group | trainer
    moved: bool  # the folder was moved before the rerun
    delay_s: float
    killed: bool  # the command was still running at the delay (trainer: a trainer of it was killed)
    command_rc: int | None  # how the signalled command ended (None: it had to be killed)
    rerun_rc: int | None  # None: it timed out
    completed: bool
    identical: bool | None  # None: not compared (tune)
    leftovers: str
    reason: str  # "" when the kill point passed
    seconds: float


def plan(kills: int, scenarios: list[str], seed: int) -> list[KillPoint]:
    """The kill points, drawn from ``seed`` alone: the same arguments make the same probe. A trainer is killed
    alone only in the commands that start trainers (a stack trains its seeds in the command's own process), and
    always with SIGKILL: the out-of-memory killer's, the one fault a trainer cannot save a checkpoint on."""
    rng, points = random.Random(seed), []
    for i in range(kills):
        scenario = scenarios[i % len(scenarios)]
        variants = [v for v in VARIANTS if v.scenario == scenario]
        sig = rng.choices((signal.SIGKILL, signal.SIGINT, signal.SIGTERM), (3, 1, 1))[0]
        target = rng.choices(TARGETS, TARGET_WEIGHTS)[0] if scenario in DRIVEN else "command"
        fraction, solo = rng.random(), scenario == "stack" and rng.random() < 1 / 3
        points.append(
            KillPoint(
                i,
                variants[(i // len(scenarios)) % len(variants)],
                signal.SIGKILL if target == "trainer" else sig,
                target,
                fraction,
                solo,
                rng.random() < MOVED_SHARE,
            )
        )
    return points


# ── commands and processes ─────────────────────────────────────────────────────────────────────────


def start(argv: tuple[str, ...], folder: Path, log_name: str) -> subprocess.Popen[bytes]:
    """``python -m lab ARGV`` in ``folder``, in a session of its own (so that its group can be signalled), with
    Ctrl-C's default action even where this probe runs as a background job; its output in ``folder/log_name``."""
    env = {**speed.child_env(), MARKER: str(folder)}
    with open(folder / log_name, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "lab", *argv],
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # safe: the probe has one thread
        )


def send(process: subprocess.Popen[bytes], sig: signal.Signals, group: bool) -> None:
    """``sig`` to the process, or to its process group; nothing if they are gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig) if group else process.send_signal(sig)


def finish(process: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    """The exit code, or None (and the process group killed) past ``timeout_s``."""
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        send(process, signal.SIGKILL, group=True)
        process.wait()
        return None
    except BaseException:  # the probe itself is stopped: take the command with it
        send(process, signal.SIGKILL, group=True)
        raise


def run(argv: tuple[str, ...], folder: Path, log_name: str) -> tuple[int | None, str]:
    """Run to the end, at most :data:`RERUN_TIMEOUT_S`: the exit code (None: timed out) and, unless it is 0, why."""
    code = finish(start(argv, folder, log_name), RERUN_TIMEOUT_S)
    if code == 0:
        return code, ""
    lines = [line.strip() for line in (folder / log_name).read_text(errors="replace").splitlines() if line.strip()]
    why = f"timed out after {RERUN_TIMEOUT_S:.0f} s" if code is None else f"exit {code}"
    return code, f"{log_name.removesuffix('.log')} {why}: {lines[-1][:160] if lines else 'no output'}"


def processes() -> list[tuple[int, str, str]]:
    """This user's live processes but this one, as (pid, command line, the folder that MARKER names in its
    environment, or ""); another user's cannot be read, and are skipped."""
    found, prefix = [], f"{MARKER}=".encode()
    for pid in (int(entry) for entry in os.listdir("/proc") if entry.isdigit()):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        marker = next((e[len(prefix) :].decode(errors="replace") for e in environ if e.startswith(prefix)), "")
        if command and pid != os.getpid():  # a zombie has no command line
            found.append((pid, command, marker))
    return found


def started_in(folder: Path) -> list[tuple[int, str, str]]:
    """Live processes that a command run in ``folder``, or in a folder below it, started: every process of
    the command (trainers and Ray's included) inherits its marker, whatever its command line or folder."""
    return [p for p in processes() if f"{p[2]}/".startswith(f"{folder}/")]  # p[2]: the marker's folder


def trainers(folder: Path, command_pid: int) -> list[int]:
    """The live trainers that the command run in ``folder`` started (not the command itself)."""
    return sorted(pid for pid, command, _ in started_in(folder) if pid != command_pid and TRAINER in f"{command} ")


def kill_a_trainer(process: subprocess.Popen[bytes], folder: Path, rng: random.Random) -> int | None:
    """SIGKILL one trainer of the running command, the first moment one is alive; its pid, or None if the
    command ended before one was found (or every one found had ended by the kill)."""
    while process.poll() is None:
        for pid in rng.sample(found := trainers(folder, process.pid), len(found)):
            try:
                os.kill(pid, signal.SIGKILL)
                return pid
            except ProcessLookupError:
                continue
        time.sleep(0.05)
    return None


def wait_for_exit(folder: Path, timeout_s: float) -> list[str]:
    """Wait until no process of the command run in ``folder`` is alive, as a rerun waits for a killed driver's
    trainers to checkpoint and exit; the command lines of those still alive after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (alive := started_in(folder)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [command[:80] for _, command, _ in alive]


def kill(procs: list[tuple[int, str, str]]) -> None:
    for pid, _, _ in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# ── checks ─────────────────────────────────────────────────────────────────────────────────────────


def status(run_dir: Path) -> str:
    try:
        return str(json.loads((run_dir / "summary.json").read_text()).get("status"))
    except FileNotFoundError:
        return "missing"
    except ValueError:
        return "unreadable"


def incomplete(variant: Variant, folder: Path) -> list[str]:
    """Check 2: each run that is not completed, or what is wrong with the study."""
    if variant.scenario != "tune":
        return [f"{run} {state}" for run in variant.runs if (state := status(folder / run)) != "completed"]
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    journal = folder / "runs" / "tune" / NAME / "study.log"
    if not journal.exists():
        return ["no study.log"]
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    trials = optuna.load_study(study_name=NAME, storage=storage).get_trials(deepcopy=False)
    problems = [] if len(trials) == TUNE_TRIALS else [f"{len(trials)} trials, not {TUNE_TRIALS}"]
    return problems + [p for t in trials for p in trial_problems(t, journal.parent / f"trial{t.number:04d}")]


def trial_problems(trial: Any, folder: Path) -> list[str]:
    """A trial is complete, with its runs' config.yaml values as its parameters and the mean of their final
    evaluations as its score; or failed because the algo refused its sample (no run)."""
    import yaml

    where, error = f"trial {trial.number}", str(trial.user_attrs.get("error", ""))
    if trial.state.name == "FAIL" and error.startswith("config refused"):
        return []
    if trial.state.name != "COMPLETE":
        return [f"{where} {trial.state.name}" + (f" ({error[:80]})" if error else "")]
    runs = sorted(p for p in folder.glob("*/*/seed*") if p.is_dir())
    problems = [] if len(runs) == TUNE_SEEDS else [f"{where}: {len(runs)} runs, not {TUNE_SEEDS}"]
    problems += [f"{where} {p.name} {state}" for p in runs if (state := status(p)) != "completed"]
    if problems:
        return problems
    for run_dir in runs:
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        for name, value in trial.params.items():  # a categorical list (hidden_sizes) is stored as its YAML text
            value = yaml.safe_load(value) if isinstance(value, str) and value[:1] in "[{" else value
            if config.get(name) != value:
                problems.append(f"{where} {run_dir.name}: {name}={config.get(name)!r}, the study's {value!r}")
    finals = [json.loads((p / "summary.json").read_text())["final_eval_return_mean"] for p in runs]
    if trial.value is None or not math.isclose(trial.value, sum(finals) / len(finals), rel_tol=1e-9):
        problems.append(f"{where}: score {trial.value}, its runs' mean {sum(finals) / len(finals)}")
    return problems


def progress_rows(run_dir: Path) -> list[dict[str, str]]:
    """progress.csv's rows without their clock columns; [] without the file."""
    try:
        with open(run_dir / "progress.csv", newline="") as f:
            return [{k: v for k, v in row.items() if not k.endswith(TIMING)} for row in csv.DictReader(f)]
    except FileNotFoundError:
        return []


def differences(reference: Path, run_dir: Path) -> list[str]:
    """Check 3: how ``run_dir`` differs from the uninterrupted ``reference`` (progress rows, model tensors)."""
    import torch

    problems = []
    ours, theirs = progress_rows(run_dir), progress_rows(reference)
    if ours != theirs:
        at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        step = (ours[at:] or theirs[at:])[0].get("global_step")
        problems.append(f"progress.csv: {len(ours)} rows against {len(theirs)}, first difference at step {step}")
    if not (run_dir / "checkpoint.pt").exists():
        return [*problems, "no checkpoint.pt"]
    a, b = (
        torch.load(d / "checkpoint.pt", map_location="cpu", weights_only=True)["model"] for d in (run_dir, reference)
    )
    same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return problems + ([] if same else ["model differs"])


def leftovers(folder: Path, grace_s: float) -> list[str]:
    """Checks 4 and 5: processes still alive after ``grace_s`` (then killed, so that the next kill point starts
    clean), held locks and stray stack logs."""
    from agents.rundir import LOCK, lock_holder

    found = leftovers_of(folder, grace_s)
    found += [
        f"lock of {path.parent.relative_to(folder)} held by {holder[:60]}"
        for path in sorted(folder.rglob(LOCK))
        if (holder := lock_holder(path.parent)) is not None
    ]
    return found + [f"stray {path.relative_to(folder)}" for path in sorted(folder.rglob(".stack-*.log"))]


def leftovers_of(folder: Path, grace_s: float = 0.0) -> list[str]:
    """Check 4: the processes of commands run in ``folder`` still alive after ``grace_s``, then killed."""
    deadline = time.monotonic() + grace_s
    while (alive := started_in(folder)) and time.monotonic() < deadline:
        time.sleep(0.5)
    kill(alive)
    return [f"{'Ray ' * any(n in command for n in RAY_NAMES)}process {command[:80]}" for _, command, _ in alive]


# ── a kill point ───────────────────────────────────────────────────────────────────────────────────


def rerun_argv(variant: Variant, folder: Path) -> tuple[str, ...]:
    """The same command; ``train`` with ``--resume`` once any of its runs has a checkpoint (a stack resumes
    whatever mix of finished, partial and unstarted seeds it holds)."""
    checkpoints = any((folder / r / "checkpoint.pt").exists() for r in variant.runs)
    return (*variant.argv, "--resume") if checkpoints and variant.scenario in ("train", "stack") else variant.argv


def solo_argv(variant: Variant, seed: int) -> tuple[str, ...]:
    """A stack's seed resumed alone, as a single run from its own directory."""
    argv = list(variant.argv)
    at = argv.index("--seeds")
    argv[at : at + 2] = ["--seed", str(seed)]
    argv[argv.index("--run-dir") + 1] += f"/seed{seed}"
    return (*argv, "--resume")


def make_reference(variant: Variant, folder: Path) -> tuple[float, str]:
    """The command run once without a kill: its duration, and what went wrong ("" if nothing)."""
    folder.mkdir(parents=True)
    began = time.monotonic()
    _, why = run(variant.argv, folder, "reference.log")
    duration = time.monotonic() - began
    return duration, "; ".join([why] * bool(why) + incomplete(variant, folder) + leftovers(folder, variant.grace_s))


def probe(point: KillPoint, folder: Path, reference: Path, duration: float) -> tuple[Row, Path]:
    """Start the command, signal it (or kill a trainer of it) at the kill point's delay, move its folder if the
    kill point says so, rerun it, and check the outcome; the row, and the folder the command ended in."""
    variant, began, delay = point.variant, time.monotonic(), point.fraction * duration
    folder.mkdir(parents=True)
    process = start(variant.argv, folder, "killed.log")
    problems: list[str] = []
    try:
        code = process.wait(delay)
        killed = False
    except subprocess.TimeoutExpired:
        if point.target == "trainer":  # the command goes on: its driver retries the cell, from the checkpoint
            killed = kill_a_trainer(process, folder, random.Random(point.index)) is not None
            code = finish(process, RERUN_TIMEOUT_S)
            if code is None:
                problems.append(f"still running {RERUN_TIMEOUT_S:.0f} s after a trainer of it was killed")
        else:
            killed = True
            send(process, point.signal, point.target == "group")
            if (code := finish(process, STOP_TIMEOUT_S)) is None:
                problems.append(f"still running {STOP_TIMEOUT_S:.0f} s after {point.signal.name}")
    old = folder
    if point.moved:  # moved, as a user moves a folder, once the killed command's trainers have checkpointed
        if alive := wait_for_exit(folder, WRITER_WAIT_S):
            problems.append(f"still alive {WRITER_WAIT_S:.0f} s after the kill, at the move: {'; '.join(alive)}")
        folder = folder.parent / "moved" / f"{folder.name}-moved"
        folder.parent.mkdir(exist_ok=True)
        shutil.move(old, folder)
    solo = f"{variant.runs[0].rpartition('/')[0]}/seed{SOLO_SEED}" if point.solo else ""  # a stack's seed
    alone = bool(solo) and (folder / solo / "checkpoint.pt").exists() and status(folder / solo) != "completed"
    if alone:
        problems.append(run(solo_argv(variant, SOLO_SEED), folder, f"seed{SOLO_SEED}-alone.log")[1])
    rerun_code, why = run(rerun_argv(variant, folder), folder, "rerun.log")
    missing = incomplete(variant, folder)
    # A seed resumed alone ran as a single run, whose numbers round otherwise than a stack's: no promise there.
    compared = [r for r in variant.runs if not (alone and r == solo)]
    diffs = [f"{r}: {d}" for r in compared for d in differences(reference / r, folder / r)]
    left = leftovers(folder, variant.grace_s)
    if point.moved:  # the killed command's processes carry the old folder in their marker
        left += [f"(old folder) {what}" for what in leftovers_of(old)]
        left += [f"the old folder {old.name} was written again after the move"] * old.exists()
    reason = "; ".join(p for p in [*problems, why, *missing, *diffs, *left] if p)
    return Row(
        point.index,
        variant.scenario,
        variant.label + (f" (seed {SOLO_SEED} alone)" if alone else ""),
        point.signal.name,
        point.target,
        point.moved,
        round(delay, 2),
        killed,
        code,
        rerun_code,
        not missing,
        None if variant.scenario == "tune" else not diffs,
        "; ".join(left),
        reason,
        round(time.monotonic() - began, 1),
    ), folder


# ── output ─────────────────────────────────────────────────────────────────────────────────────────


def markdown(rows: list[Row], durations: dict[str, float], notes: list[str], command: str, machine: str) -> str:
    lines = [
        "# Fault probe: commands killed at random moments, then rerun",
        "",
        f"Command: `{command}`",
        "",
        f"Date: {time.strftime('%Y-%m-%d %H:%M %Z')}",
        "",
        f"Machine: {machine}",
        "",
        "\n\n".join(__doc__.split("\n\n")[2:4]),
        "",  # what a kill point checks, and the scenarios
        *[f"Note: {note}\n" for note in notes],
        "## The uninterrupted runs (the references, whose durations the delays are drawn over)",
        "",
        "| label | command | seconds |",
        "|---|---|---|",
        *[
            f"| {v.label} | `testbed {' '.join(v.argv)}` | {durations[v.label]:.1f} |"
            for v in VARIANTS
            if v.label in durations
        ],
        "",
        "## Kill points by scenario",
        "",
        (
            "| scenario | kill points | killed while running | to the group | a trainer alone | folder moved | passed "
            "| failed |"
        ),
        "|" + "---|" * 8,
    ]
    for scenario in dict.fromkeys(r.scenario for r in rows):
        mine = [r for r in rows if r.scenario == scenario]
        failed = sum(bool(r.reason) for r in mine)
        alone = [r for r in mine if r.target == "trainer"]
        lines.append(
            f"| {scenario} | {len(mine)} | {sum(r.killed for r in mine)} | {sum(r.target == 'group' for r in mine)} | "
            f"{len(alone)} | {sum(r.moved for r in mine)} | {len(mine) - failed} | {failed} |"
        )
    alone = [r for r in rows if r.target == "trainer" and r.killed]
    if alone:
        ended = sum(r.command_rc == 0 for r in alone)
        lines += [
            "",
            (
                f"A trainer was killed alone at {len(alone)} kill points; its command then went on and ended with exit "
                f"0 at {ended} of them (its driver retried the cell from the checkpoint), before the rerun."
            ),
        ]
    failing = [r for r in rows if r.reason]
    lines += ["", f"## Failures: {len(failing)} of {len(rows)}", ""]
    lines += (
        [
            "| # | command | signal | to | moved | delay (s) | killed | its exit | rerun exit | reason |",
            "|" + "---|" * 10,
            *[
                f"| {r.index} | {r.variant} | {r.signal} | {r.target} | {r.moved} | {r.delay_s} | {r.killed} | "
                f"{r.command_rc} | {r.rerun_rc} | {r.reason.replace('|', '/')} |"
                for r in failing
            ],
        ]
        if failing
        else ["None."]
    )
    return "\n".join(lines) + "\n"


def write_outputs(
    out: Path, rows: list[Row], durations: dict[str, float], notes: list[str], command: str, machine: str
) -> None:
    with open(out / "probe.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[field.name for field in dataclasses.fields(Row)])
        writer.writeheader()
        writer.writerows(dataclasses.asdict(r) for r in rows)
    (out / "probe.md").write_text(markdown(rows, durations, notes, command, machine))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=100, help="kill points, spread evenly over the scenarios")
    parser.add_argument("--seed", type=int, default=0, help="draws the signals, their targets and the delays")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}")
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="folder for the runs (default: a temporary one, removed at the end if every kill point passed)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fault-probe")
    args = parser.parse_args(argv)
    scenarios = list(dict.fromkeys(s for s in args.scenarios.split(",") if s))
    if unknown := sorted(set(scenarios) - set(SCENARIOS)):
        parser.error(f"unknown scenario {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    if args.kills < 1:
        parser.error("--kills must be at least 1")
    notes = []
    if "bench-ray" in scenarios and importlib.util.find_spec("ray") is None:
        scenarios.remove("bench-ray")
        notes.append("bench-ray skipped: Ray is not installed (pip install -e '.[ray]').")
        print(notes[-1], flush=True)
    if not scenarios:
        parser.error("no scenario left to probe")
    work = (args.work or Path(tempfile.mkdtemp(prefix="fault-probe-"))).resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    command = speed.public_command("benchmarks/fault_probe.py", sys.argv[1:] if argv is None else argv)
    machine = speed.machine_line()
    references: dict[str, tuple[float, str]] = {}
    rows: list[Row] = []
    points = plan(args.kills, scenarios, args.seed)
    try:
        for point in points:
            variant, folder = point.variant, work / f"{point.index:03d}-{point.variant.label}"
            if variant.label not in references:
                references[variant.label] = make_reference(variant, work / f"reference-{variant.label}")
                seconds, why = references[variant.label]
                print(f"reference {variant.label}: {seconds:.1f} s" + (f", FAILED: {why}" if why else ""), flush=True)
            duration, why = references[variant.label]
            if why:
                row = Row(
                    point.index,
                    variant.scenario,
                    variant.label,
                    point.signal.name,
                    point.target,
                    point.moved,
                    0.0,
                    False,
                    None,
                    None,
                    False,
                    None,
                    "",
                    f"the uninterrupted run failed: {why}",
                    0.0,
                )
            else:
                row, ended_in = probe(point, folder, work / f"reference-{variant.label}", duration)
                if not row.reason:
                    shutil.rmtree(ended_in)
            rows.append(row)
            to = {"command": "", "group": " to its group", "trainer": " to a trainer alone"}[row.target]
            what = f"{row.signal}{to} at {row.delay_s:.1f} s{', folder moved' if row.moved else ''}"
            print(
                f"[{len(rows)}/{len(points)}] {row.variant}, {what}{'' if row.killed else ' (it had ended)'}: "
                f"{'FAIL: ' + row.reason if row.reason else 'pass'} ({row.seconds:.0f} s)",
                flush=True,
            )
            write_outputs(args.out, rows, {k: s for k, (s, _) in references.items()}, notes, command, machine)
    finally:  # what the probe's commands left (say, Ray's processes when the probe is stopped): by process id
        kill(started_in(work))
    failed = sum(bool(r.reason) for r in rows)
    if failed or args.work:
        print(f"runs kept in {work}" + (" (the failed kill points' folders: NNN-COMMAND)" if failed else ""))
    else:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{len(rows) - failed} of {len(rows)} kill points passed; wrote {args.out / 'probe.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
