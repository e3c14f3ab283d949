"""Benchmark grids: algorithms × environments × seeds, on this machine or on a Ray cluster.

Each cell is one ``testbed train`` process with one torch thread, writing
``runs/bench/NAME/<env_id>/<algo>/seed<k>/`` (its console output beside it, ``seed<k>.log``). Both
backends run the same :func:`run_cell`:
- ``local`` (default): a pool of ``--workers`` processes on this machine;
- ``ray``: every cell is a Ray task asking for one CPU. The task trains in a scratch folder on whichever
  node runs it and sends the run directory back to the driver as a tar archive, so no shared filesystem
  is needed; a cell to resume travels to the worker the same way.

A bench is idempotent: a finished cell is skipped, an interrupted one resumes from its checkpoint, and a
failed one is recorded with its error, set aside and retried once from scratch, without stopping the
others. Ctrl-C stops every cell at its next iteration, with a checkpoint, so rerunning the same command
continues. The report (``lab.report``) is rebuilt from disk at the end.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import yaml

from envs import action_space_of
from envs.errors import BadInput

BENCH_ROOT = Path("runs") / "bench"


@dataclass(frozen=True)
class Suite:
    envs: tuple[str, ...]
    algos: tuple[str, ...] = ("ppo", "grpo", "sb3-ppo")
    seeds: int = 3
    total_steps: int | None = None  # None: each algo's preset budget for the env


SUITES: dict[str, Suite] = {
    # A few minutes on 2 cores: the presets' budgets on CartPole.
    "quick": Suite(envs=("CartPole-v1",)),
    "classic": Suite(envs=("CartPole-v1", "Acrobot-v1", "LunarLander-v3")),
    "mujoco": Suite(envs=("CartPole-v1", "LunarLander-v3", "HalfCheetah-v5", "Hopper-v5", "Walker2d-v5")),
}


@dataclass(frozen=True)
class Cell:
    algo: str
    env_id: str
    seed: int
    total_steps: int | None
    overrides: tuple[str, ...]  # key=value for this algo (and this variant)
    variant: str = ""  # a study's setting of the env, e.g. horizon300; "" in a plain grid

    @property
    def label(self) -> str:
        return f"{self.env_id}[{self.variant}]" if self.variant else self.env_id

    def run_dir(self, bench_dir: Path) -> Path:
        env_dir = bench_dir / self.env_id.replace("/", "_")
        return (env_dir / self.variant if self.variant else env_dir) / self.algo / f"seed{self.seed}"

    def command(self, run_dir: Path, resume: bool) -> list[str]:
        argv = [sys.executable, "-m", "lab", "train", "--algo", self.algo, "--env", self.env_id, "--seed",
                str(self.seed), "--run-dir", str(run_dir)]  # fmt: skip
        if self.total_steps is not None:
            argv += ["--total-steps", str(self.total_steps)]
        for pair in self.overrides:
            argv += ["--set", pair]
        return argv + (["--resume"] if resume else [])


@dataclass
class Outcome:
    cell: Cell
    status: str  # completed, failed, interrupted
    error: str | None = None
    attempts: int = 1
    resumed: bool = False


@dataclass
class Grid:
    name: str
    algos: list[str]
    envs: list[str]
    seeds: list[int]
    total_steps: int | None
    overrides: dict[str, list[str]] = field(default_factory=dict)  # algo → ["key=value", ...]
    variants: dict[str, list[str]] = field(default_factory=lambda: {"": []})  # label → pairs for every algo

    def cells(self) -> list[Cell]:
        return [Cell(a, e, s, self.total_steps, tuple(self.overrides.get(a, []) + pairs), v)
                for e in self.envs for v, pairs in self.variants.items() for a in self.algos
                for s in self.seeds]  # fmt: skip

    def definition(self) -> dict[str, Any]:
        """What makes two runs of a bench the same grid: a rerun with another definition is refused."""
        plain = {"total_steps": self.total_steps, "overrides": self.overrides}
        return plain if self.variants == {"": []} else {**plain, "variants": self.variants}


# ── planning and validation: everything is checked before the first cell starts ───────────────────


def plan_grid(
    suite: str | None,
    algos: list[str] | None,
    envs: list[str] | None,
    seeds: int | None,
    total_steps: int | None,
    sets: list[str],
    name: str | None,
    known_algos: dict[str, Any],
    variants: dict[str, list[str]] | None = None,
) -> Grid:
    """Resolve a suite and explicit options into a validated grid.

    ``sets`` are ``ALGO.key=value`` (one algo) or ``key=value`` (every algo). ``variants`` (label →
    key=value pairs for every algo) multiply the grid: a study's horizons or reward delays."""
    from agents.config import parse_overrides, resolve_config

    if suite is not None and suite not in SUITES:
        raise BadInput(f"unknown suite {suite!r}; choose one of {', '.join(SUITES)}")
    base = SUITES[suite] if suite else Suite(envs=())
    grid = Grid(
        name=name or suite or "custom",
        algos=list(algos or base.algos),
        envs=list(envs or base.envs),
        seeds=list(range(seeds if seeds is not None else base.seeds)),
        total_steps=total_steps if total_steps is not None else base.total_steps,
        variants=variants or {"": []},
    )
    if not grid.envs:
        raise BadInput("no environments: pass --envs ENV_ID ... or --suite quick|classic|mujoco")
    if not grid.seeds:
        raise BadInput("--seeds must be at least 1")
    if grid.total_steps is not None and grid.total_steps < 1:
        raise BadInput(f"--total-steps must be positive, got {grid.total_steps}")
    unknown = [a for a in grid.algos if a not in known_algos]
    if unknown:
        raise BadInput(f"unknown algo {', '.join(unknown)}; choose from {', '.join(known_algos)}")
    for pair in sets:
        key, _, _ = pair.partition("=")
        if "." not in key:  # key=value: every algo
            for algo in grid.algos:
                grid.overrides.setdefault(algo, []).append(pair)
            continue
        algo, _, rest = pair.partition(".")
        if algo not in known_algos:
            choices = ", ".join(known_algos)
            raise BadInput(f"--set in a bench takes ALGO.key=value (ALGO one of {choices}) or key=value; "
                           f"got {pair!r}")  # fmt: skip
        grid.overrides.setdefault(algo, []).append(rest)
    for env_id in grid.envs:
        continuous = isinstance(action_space_of(env_id), gym.spaces.Box)
        for algo in grid.algos:
            for pairs in grid.variants.values():
                # Builds and validates every cell's config, as `testbed train` would, before any run.
                values: dict[str, Any] = parse_overrides(grid.overrides.get(algo, []) + pairs)
                if grid.total_steps is not None:
                    values["total_steps"] = grid.total_steps
                algo_spec = known_algos[algo]
                cfg, _ = resolve_config(algo_spec.config, algo_spec.preset or algo, env_id, continuous,
                                        {**algo_spec.fixed, **values})  # fmt: skip
                algo_spec.validate(cfg)
    return grid


def check_bench_dir(bench_dir: Path, grid: Grid) -> None:
    """A bench directory belongs to one grid definition; rerunning it with other settings is refused."""
    path = bench_dir / "bench.yaml"
    definition = grid.definition()
    if path.exists():
        saved = yaml.safe_load(path.read_text()) or {}
        if {k: saved.get(k) for k in definition} != definition:
            raise BadInput(
                f"{bench_dir} was run with total_steps={saved.get('total_steps')}, overrides="
                f"{saved.get('overrides')} and variants={saved.get('variants')}; use another --name for different "
                "settings"
            )


def write_bench_yaml(bench_dir: Path, grid: Grid) -> None:
    path = bench_dir / "bench.yaml"
    saved = yaml.safe_load(path.read_text()) if path.exists() else {}
    merged = {
        "name": grid.name,
        **grid.definition(),
        "algos": sorted(set(saved.get("algos", [])) | set(grid.algos)),
        "envs": sorted(set(saved.get("envs", [])) | set(grid.envs)),
        "seeds": sorted(set(saved.get("seeds", [])) | set(grid.seeds)),
        "commands": [*saved.get("commands", []), " ".join(["testbed", *sys.argv[1:]])],
    }
    bench_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(merged, sort_keys=False))


# ── one cell ───────────────────────────────────────────────────────────────────────────────────────


def read_status(run_dir: Path) -> str | None:
    summary = run_dir / "summary.json"
    return json.loads(summary.read_text()).get("status") if summary.exists() else None


def _set_aside(run_dir: Path) -> None:
    """Keep a failed attempt's directory, renamed, so the retry starts clean and nothing is lost.

    The name is hidden (``.seed0.failed1``), so reports and plots read only the current attempt."""
    if not run_dir.exists():  # the attempt failed before creating its directory (its input was refused)
        return
    attempt = 1
    while run_dir.with_name(f".{run_dir.name}.failed{attempt}").exists():
        attempt += 1
    run_dir.rename(run_dir.with_name(f".{run_dir.name}.failed{attempt}"))


class Stop:
    """The driver's stop request, passed on to every running cell exactly once.

    Cells run in their own process sessions, so a Ctrl-C on the terminal reaches only the driver; the
    driver then sends each cell one SIGINT, on which it checkpoints and exits (a second signal would
    stop it without a checkpoint).
    """

    requested = False
    children: set[subprocess.Popen[bytes]] = set()

    @classmethod
    def request(cls) -> None:
        cls.requested = True
        for process in list(cls.children):
            process.send_signal(signal.SIGINT)


def _train(cell: Cell, run_dir: Path, log_path: Path, resume: bool) -> tuple[str, str | None]:
    """One ``testbed train`` process; returns its status and error."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(cell.command(run_dir, resume)[1:])}\n")
        log.flush()
        process = subprocess.Popen(cell.command(run_dir, resume), stdout=log, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)  # fmt: skip
        Stop.children.add(process)
        try:
            returncode = process.wait()
        except KeyboardInterrupt:  # a cancelled Ray task: let the cell checkpoint before leaving
            process.send_signal(signal.SIGINT)
            returncode = process.wait()
        finally:
            Stop.children.discard(process)
    status = read_status(run_dir)
    if status is None:  # the process died before writing a summary, or its input was refused
        tail = log_path.read_text().strip().splitlines()[-3:]
        return "failed", f"exit code {returncode}: {' | '.join(tail)}"
    error = json.loads((run_dir / "summary.json").read_text()).get("error")
    return status, error


def run_cell(cell: Cell, bench_dir: Path, retries: int = 1) -> Outcome:
    """Train one cell to completion: skip it if done, resume it if interrupted, retry it once if it fails."""
    run_dir = cell.run_dir(bench_dir)
    log_path = run_dir.with_name(f"{run_dir.name}.log")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    status = read_status(run_dir)
    if status == "completed":
        return Outcome(cell, "completed", attempts=0)
    resumed = (run_dir / "checkpoint.pt").exists() and status != "failed"
    if run_dir.exists() and not resumed:
        _set_aside(run_dir)
    outcome = Outcome(cell, *_train(cell, run_dir, log_path, resumed), resumed=resumed)
    while outcome.status == "failed" and outcome.attempts <= retries and not Stop.requested:
        _set_aside(run_dir)
        outcome = Outcome(cell, *_train(cell, run_dir, log_path, False), attempts=outcome.attempts + 1)
    return outcome


def _pack(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder, arcname=".")
    return buffer.getvalue()


def _unpack(data: bytes, folder: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(folder, filter="data")


def run_cell_remote(cell: Cell, cell_files: bytes | None, retries: int) -> tuple[Outcome, bytes]:
    """A Ray task: run the cell in a scratch bench folder; send back its run directory and log."""
    with tempfile.TemporaryDirectory() as scratch:
        bench_dir = Path(scratch)
        cell_dir = cell.run_dir(bench_dir).parent
        cell_dir.mkdir(parents=True)
        if cell_files is not None:
            _unpack(cell_files, cell_dir)
        outcome = run_cell(cell, bench_dir, retries)
        return outcome, _pack(cell_dir)


# ── the grid ───────────────────────────────────────────────────────────────────────────────────────


class Board:
    """Overall progress: a bar and a short live table on a terminal, plain lines elsewhere."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.failed, self.running = total, 0, 0, 0
        self.interactive = sys.stderr.isatty()
        self.start = time.monotonic()
        self.recent: list[str] = []
        if self.interactive:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="run", dynamic_ncols=True, desc="bench")

    def started(self, cell: Cell) -> None:
        self.running += 1
        self._show(f"started  {cell.label} {cell.algo} seed {cell.seed}")

    def finished(self, outcome: Outcome) -> None:
        self.running -= 1
        self.done += 1
        self.failed += outcome.status == "failed"
        how = "skipped (done)" if outcome.attempts == 0 else outcome.status + (" (resumed)" if outcome.resumed else "")
        self._show(f"{how:<21} {outcome.cell.label} {outcome.cell.algo} seed {outcome.cell.seed}"
                   + (f": {outcome.error}" if outcome.error and outcome.status == "failed" else ""))  # fmt: skip
        if self.interactive:
            self.bar.update(1)

    def _show(self, line: str) -> None:
        counts = f"[{self.done}/{self.total} done, {self.running} running, {self.failed} failed]"
        if self.interactive:
            self.bar.set_postfix_str(f"running={self.running} failed={self.failed}", refresh=False)
            self.recent = [*self.recent[-4:], line]
            self.bar.write(f"{counts} {line}")
        else:
            print(f"{counts} {line}", flush=True)

    def close(self) -> None:
        if self.interactive:
            self.bar.close()


def run_local(cells: list[Cell], bench_dir: Path, workers: int, retries: int, board: Board) -> list[Outcome]:
    outcomes: list[Outcome] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending: dict[Future[Outcome], Cell] = {}
        queue = list(cells)
        try:
            while queue or pending:
                while queue and len(pending) < workers:
                    cell = queue.pop(0)
                    board.started(cell)
                    pending[pool.submit(run_cell, cell, bench_dir, retries)] = cell
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    pending.pop(future)
                    outcomes.append(future.result())
                    board.finished(outcomes[-1])
        except KeyboardInterrupt:
            Stop.request()  # every running cell checkpoints and exits; wait for them
            queue.clear()
            for future in pending:
                outcomes.append(future.result())
                board.finished(outcomes[-1])
            raise
    return outcomes


def run_ray(cells: list[Cell], bench_dir: Path, retries: int, board: Board) -> list[Outcome]:
    ray = _import_ray()
    remote = ray.remote(num_cpus=1)(run_cell_remote)
    outcomes: list[Outcome] = []
    pending: dict[Any, Cell] = {}
    for cell in cells:
        run_dir = cell.run_dir(bench_dir)
        if read_status(run_dir) == "completed":
            outcomes.append(Outcome(cell, "completed", attempts=0))
            board.finished(outcomes[-1])
            continue
        cell_dir = run_dir.parent
        files = _pack(cell_dir) if cell_dir.exists() else None
        board.started(cell)
        pending[remote.remote(cell, files, retries)] = cell
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            cell = pending.pop(ready[0])
            outcome, files = ray.get(ready[0])
            cell_dir = cell.run_dir(bench_dir).parent
            cell_dir.mkdir(parents=True, exist_ok=True)
            _unpack(files, cell_dir)
            outcomes.append(outcome)
            board.finished(outcome)
    except KeyboardInterrupt:
        # Cancelled cells stop at once on their workers; their partial runs stay there, so they restart
        # from scratch next time. Finished cells are already on this machine.
        for ref in pending:
            ray.cancel(ref)
        raise
    return outcomes


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise BadInput("the ray backend needs Ray: pip install -e '.[ray]'") from None
    return ray


def connect_ray(address: str | None, workers: int) -> None:
    """Join a cluster (``auto`` or host:port), or start a local instance; a bad address fails here."""
    ray = _import_ray()
    if ray.is_initialized():
        return
    if address and address != "auto":
        # Ray waits minutes on an address where nothing listens; a plain TCP connect answers at once.
        host, _, port = address.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except (OSError, ValueError) as error:
            raise BadInput(f"cannot reach a Ray cluster at {address!r} ({error}). Start one with `ray start --head`, "
                           "or leave --ray-address out for a local instance.") from None  # fmt: skip
    try:
        if address:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        else:
            ray.init(num_cpus=workers, log_to_driver=False, logging_level="ERROR", include_dashboard=False)
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise BadInput(f"cannot reach a Ray cluster at {address!r} ({error}). Start one with `ray start --head`, "
                       "or leave --ray-address out for a local instance.") from None  # fmt: skip


def run_grid(
    grid: Grid, workers: int, backend: str, ray_address: str | None, retries: int = 1, root: Path = BENCH_ROOT
) -> tuple[Path, list[Outcome]]:
    """Run every cell; rebuild the report from disk. Returns the bench directory and the outcomes."""
    from lab.report import build_report

    bench_dir = root / grid.name
    check_bench_dir(bench_dir, grid)
    if backend == "ray":
        connect_ray(ray_address, workers)
    elif backend != "local":
        raise BadInput(f"unknown --backend {backend!r}; choose local or ray")
    write_bench_yaml(bench_dir, grid)
    cells = grid.cells()
    board = Board(len(cells))
    interrupted = False
    outcomes: list[Outcome] = []
    Stop.requested = False

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # SIGTERM stops the grid exactly as Ctrl-C does

    previous = signal.signal(signal.SIGTERM, on_term)
    # A shell starts background jobs (`testbed bench … &`, nohup) with SIGINT ignored, and Python keeps it
    # ignored; an explicit SIGINT must still stop the grid cleanly.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if backend == "local":
            outcomes = run_local(cells, bench_dir, workers, retries, board)
        else:
            outcomes = run_ray(cells, bench_dir, retries, board)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
        board.close()
    try:
        build_report(bench_dir)
    except BadInput:
        pass  # nothing finished yet: nothing to report
    if interrupted:
        raise KeyboardInterrupt
    return bench_dir, outcomes

