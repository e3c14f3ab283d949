"""Where cells run: a pool of ``--workers`` processes on this machine, or Ray tasks on a cluster, with a progress
board (``lab/board.py``) and the driver's stop signals.

Both backends train the same stacks of cells with the same :func:`lab.cells.run_cells`. On ``ray`` every
stack is a Ray task asking for one CPU. The task trains in a scratch folder on whichever node runs it and
sends its own run directories and logs back to the driver as tar archives, so no shared filesystem is
needed; a cell to resume travels to the worker the same way. Nothing else travels: a task can never replace
another cell's files, and a run that completed on the driver is never replaced. A local Ray instance ends
with its driver (``lab/raywatch.py``); its workers kill their trainers without a checkpoint, whose scratch
folder never returns (the instance's watchdog removes it), so those cells start again.
"""

from __future__ import annotations

import io
import os
import signal
import socket
import tarfile
import tempfile
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from agents import rundir
from envs.errors import BadInput, brief
from lab.board import HEARTBEAT_S, Board, Heartbeat
from lab.cells import (
    Cell,
    Outcome,
    Stop,
    live_progress,
    log_path,
    pack_pending,
    read_status,
    run_cells,
    set_aside,
    skipped,
    still_written,
    wait_for_writer,
)
from lab.raywatch import init_local, scratch_folder


def run_local(
    cells: list[Cell], bench_dir: Path, workers: int, retries: int, board: Board, stack: int, stop: Stop
) -> list[Outcome]:
    """The cells on ``workers`` processes at a time, seeds packed into stacks of at most ``stack``; on Ctrl-C,
    ``stop`` stops the running ones with a checkpoint, and KeyboardInterrupt is raised once they have."""
    outcomes: list[Outcome] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending: dict[Future[list[Outcome]], list[Cell]] = {}
        done, queue = pack_pending(cells, bench_dir, stack)
        outcomes += board.resolved(skipped(done))
        try:
            while queue or pending:
                while queue and len(pending) < workers:
                    stacked = queue.pop(0)
                    board.launched(stacked)
                    pending[pool.submit(run_cells, stacked, bench_dir, retries, stop)] = stacked
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    pending.pop(future)
                    outcomes += future.result()
                    board.exited(future.result())
        except KeyboardInterrupt:
            stop.request()  # every running cell checkpoints and exits; wait for them
            queue.clear()
            for future in pending:
                outcomes += future.result()
                board.exited(future.result())
            raise
    return outcomes


@contextmanager
def stop_signals() -> Iterator[None]:
    """While a driver runs: SIGTERM and SIGINT both raise KeyboardInterrupt, on which it stops its runs cleanly.

    A shell starts background jobs (`testbed bench … &`, nohup) with SIGINT ignored, and Python keeps it
    ignored; an explicit SIGINT must still stop the driver. Leaving restores the handlers.
    """

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


def pack_run(run_dir: Path) -> bytes | None:
    """``run_dir`` and its log as a tar.gz, or None when neither exists. Lock files stay behind: they name
    this machine's writer, and the receiving side takes its own."""
    parts = [path for path in (run_dir, log_path(run_dir)) if path.exists()]
    if not parts:
        return None
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in parts:
            tar.add(path, arcname=path.name, filter=lambda info: None if Path(info.name).name == rundir.LOCK else info)
    return buffer.getvalue()


def unpack_run(data: bytes, folder: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(folder, filter="data")


def run_cells_remote(cells: list[Cell], files: list[bytes | None], retries: int) -> list[tuple[Outcome, bytes | None]]:
    """A Ray task: run the cells (one stack) in a scratch bench folder, each from the run directory and log in
    its ``files`` if any; send back those run directories and logs only."""
    with scratch_folder("testbed-cells-") as scratch:  # in the instance's folder: a killed worker's goes with it
        for cell, packed in zip(cells, files, strict=True):
            cell.run_dir(Path(scratch)).parent.mkdir(parents=True, exist_ok=True)
            if packed is not None:
                unpack_run(packed, cell.run_dir(Path(scratch)).parent)
        outcomes = run_cells(cells, Path(scratch), retries)
        return [(outcome, pack_run(cell.run_dir(Path(scratch)))) for cell, outcome in zip(cells, outcomes)]


def receive_cell(outcome: Outcome, files: bytes | None, bench_dir: Path) -> Outcome:
    """Put a Ray task's run directory and log in place of the cell's own on this machine.

    The task made the same choice :func:`~lab.cells.run_cells` makes here: it continued the directory it was sent
    (``outcome.resumed``), which the returned one then replaces, or it started over, in which case the
    local directory is set aside as it would have been locally. A run that completed here meanwhile is
    kept, and the task's files are dropped.
    """
    run_dir = outcome.cell.run_dir(bench_dir)
    if read_status(run_dir) == "completed":
        return Outcome(outcome.cell, "completed", attempts=0)
    if files is None:  # the task failed before its run directory or log existed
        return outcome
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    # Unpacked beside the run directory (same filesystem, so the moves below are renames), hidden from reports.
    with tempfile.TemporaryDirectory(dir=run_dir.parent, prefix=f".{run_dir.name}.incoming") as incoming:
        unpack_run(files, Path(incoming))
        received = Path(incoming) / run_dir.name
        if run_dir.exists():
            if outcome.resumed:
                run_dir.rename(Path(incoming) / "superseded")  # removed with the temporary folder
            else:
                set_aside(run_dir)
        if received.is_dir():
            received.rename(run_dir)
        if (Path(incoming) / log_path(run_dir).name).is_file():
            os.replace(Path(incoming) / log_path(run_dir).name, log_path(run_dir))
    return outcome


def run_ray(cells: list[Cell], bench_dir: Path, retries: int, board: Board, stack: int = 1) -> list[Outcome]:
    """Each stack of cells (seeds packed as on the local backend) is one Ray task asking for one CPU."""
    ray = import_ray()
    remote = ray.remote(num_cpus=1)(run_cells_remote)
    outcomes: list[Outcome] = []
    pending: dict[Any, list[Cell]] = {}
    done, stacks = pack_pending(cells, bench_dir, stack)
    outcomes += board.resolved(skipped(done))
    for stacked in stacks:
        to_send = []
        for cell in stacked:
            holder = wait_for_writer(cell.run_dir(bench_dir))  # a trainer on this machine may still be finishing it
            if holder is None:
                to_send.append(cell)
            else:
                outcomes += board.resolved([still_written(cell, cell.run_dir(bench_dir), holder)])
        if to_send:
            board.launched(to_send)
            files = [pack_run(cell.run_dir(bench_dir)) for cell in to_send]
            pending[remote.remote(to_send, files, retries)] = to_send
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            pending.pop(ready[0])
            received = [receive_cell(outcome, files, bench_dir) for outcome, files in ray.get(ready[0])]
            outcomes += received
            board.exited(received)
    except KeyboardInterrupt:
        # Cancelled cells stop at once on their workers; their partial runs stay there, so they restart
        # from scratch next time. Finished cells are already on this machine.
        for ref in pending:
            ray.cancel(ref)
        raise
    return outcomes


def import_ray() -> Any:
    try:
        import ray  # the optional extra: only the ray backend needs it
    except ImportError:
        raise BadInput("the ray backend needs Ray: pip install -e '.[ray]'") from None
    return ray


def connect_ray(address: str | None, workers: int) -> None:
    """Join a cluster (``auto`` or host:port), or start a local instance; a bad address fails here."""
    ray = import_ray()
    if ray.is_initialized():
        return
    if address and address != "auto":
        # Ray waits minutes on an address where nothing listens; a plain TCP connect answers at once.
        host, _, port = address.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except (OSError, ValueError) as error:
            raise BadInput(
                f"cannot reach a Ray cluster at {brief(address, 100)} ({error}). Start one with `ray start --head`, or "
                "leave --ray-address out for a local instance."
            ) from None
        # A driver without a token is refused by a cluster with token authentication, and ray.init then says only
        # "Failed to connect", after 20 s of retries that each log a line: asked first, in one request.
        token_mode = os.environ.get("RAY_AUTH_MODE", "").strip().lower() == "token"
        if not token_mode and not address.startswith("ray://") and wants_token(host, int(port)):
            raise BadInput(
                f"the Ray cluster at {brief(address, 100)} is up but uses token authentication, and this driver sends "
                f"no token. Fix: set RAY_AUTH_MODE=token and give it {TOKEN_WHERE}"
            )
    refused = getattr(getattr(ray, "exceptions", None), "AuthenticationError", ConnectionError)
    try:
        if address:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
        else:
            init_local(ray, num_cpus=workers, log_to_driver=False, logging_level="ERROR", include_dashboard=False)
    except (ConnectionError, RuntimeError, ValueError, refused) as error:
        if isinstance(error, refused) or (
            address and address != "auto" and not address.startswith("ray://") and wants_token(*address.rsplit(":", 1))
        ):
            raise BadInput(
                f"the Ray cluster at {brief(address, 100)} is up but refused this driver's token "
                f"({brief(str(error), 100)}). Fix: give this driver {TOKEN_WHERE}"
            ) from None
        raise BadInput(
            f"cannot reach a Ray cluster at {brief(address, 100)} ({error}). Start one with `ray start --head`, or "
            "leave --ray-address out for a local instance."
        ) from None


TOKEN_WHERE = (
    "the cluster's token in RAY_AUTH_TOKEN, a file named by RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token (`ray "
    "get-auth-token` on the cluster's head prints it)"
)


def wants_token(host: str, port: int | str) -> bool:
    """Whether the Ray cluster whose GCS listens at ``host:port`` refuses a request that carries no token (Ray's
    token authentication): one unauthenticated gRPC call answers UNAUTHENTICATED at once, where ``ray.init``
    would retry for 20 s and then report only that it failed to connect."""
    try:
        import grpc  # installed with Ray
    except ImportError:
        return False
    try:
        with grpc.insecure_channel(f"{host}:{int(port)}") as channel:
            call = channel.unary_unary(
                "/ray.rpc.NodeInfoGcsService/GetClusterId", request_serializer=bytes, response_deserializer=bytes
            )
            call(b"", timeout=5)
    except grpc.RpcError as error:
        return error.code() == grpc.StatusCode.UNAUTHENTICATED
    except ValueError:  # not a port
        return False
    return False


def execute(
    cells: list[Cell],
    bench_dir: Path,
    workers: int,
    backend: str,
    retries: int = 1,
    stack: int = 1,
    heartbeat_s: float = HEARTBEAT_S,
) -> tuple[list[Outcome], bool]:
    """Run the cells on the backend, ``local`` (``workers`` processes at a time) or ``ray``, seeds packed into
    stacks of at most ``stack``, with SIGTERM and SIGINT stopping them cleanly and a heartbeat on the board every
    ``heartbeat_s`` seconds; (outcomes, interrupted)."""
    stop = Stop()
    local = backend == "local"
    board = Board(cells, workers if local else None, partial(live_progress, stop) if local else None, stack)
    outcomes: list[Outcome] = []
    try:
        with stop_signals(), Heartbeat(lambda _: board.beat(), heartbeat_s):
            if local:
                outcomes = run_local(cells, bench_dir, workers, retries, board, stack, stop)
            else:
                outcomes = run_ray(cells, bench_dir, retries, board, stack)
    except KeyboardInterrupt:
        return outcomes, True
    finally:
        board.close()
    return outcomes, False
