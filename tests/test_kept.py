"""What a committed result keeps of a run (lab.kept): thinned curves, byte for byte, and nothing else."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from agents import rundir
from lab import kept
from lab.bsuite_study import read_episodes
from lab.results import find_runs

HEADER = "global_step,wall_time_s,eval/return_mean\n"


def _progress(steps: range, evaluated: set[int]) -> str:
    rows = [f"{s},{s / 100:.2f},{'7.50' if s in evaluated else ''}\n" for s in steps]
    return HEADER + "".join(rows)


def _steps(text: str) -> list[int]:
    return [int(line.split(",")[0]) for line in text.splitlines()[1:]]


def test_thinning_keeps_evaluations_the_last_row_and_the_first_row_of_each_span() -> None:
    # Steps 0, 10, …, 1000 in 4 spans of [0, 1000]: spans start at 0, 250, 500, 750; 1000 falls in the last.
    text = _progress(range(0, 1001, 10), evaluated={500, 1000, 620})
    thinned = kept.thin_progress(text, spans=4)
    assert _steps(thinned) == [0, 250, 500, 620, 750, 1000]
    assert thinned.splitlines(keepends=True)[4] == "620,6.20,7.50\n"  # byte for byte, "7.50" not "7.5"
    assert kept.thin_progress(thinned, spans=4) == thinned  # thinning again changes nothing


def test_thinning_drops_unparsable_rows_and_keeps_a_short_file_whole() -> None:
    text = HEADER + "0,0.00,\nnot a row\n5,0.05,1.00\n"
    assert kept.thin_progress(text, spans=100) == HEADER + "0,0.00,\n5,0.05,1.00\n"
    assert kept.thin_progress(HEADER) == HEADER
    assert kept.thin_progress("") == ""


def _run(folder: Path, status: str = "completed") -> Path:
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("algo: ppo\nenv_id: CartPole-v1\nseed: 3\n")
    (folder / "meta.json").write_text('{"git_commit": "abc1234"}')
    (folder / "meta.resume1700000000.json").write_text('{"git_commit": "abc1234"}')
    (folder / "summary.json").write_text(json.dumps({"status": status, "final_eval_return_mean": 7.5}))
    (folder / "progress.csv").write_text(_progress(range(0, 20001, 10), evaluated={10000, 20000}))
    for cache in ("checkpoint.pt", "checkpoint-at-10000.pt", "events.out.tfevents.1", ".lock"):
        (folder / cache).write_text("cache")
    return folder


def test_a_kept_run_holds_its_record_and_no_cache_and_reads_back_as_the_run(tmp_path: Path) -> None:
    run = _run(tmp_path / "runs/bench/b/CartPole-v1/ppo/seed3")
    _run(tmp_path / "runs/bench/b/CartPole-v1/ppo/seed4", status="interrupted")  # not ended: starts again
    out = tmp_path / "result"
    assert kept.keep_runs(tmp_path / "runs/bench/b", out) == [Path("CartPole-v1/ppo/seed3")]
    copy = out / "CartPole-v1/ppo/seed3"
    assert sorted(p.name for p in copy.iterdir()) == [
        "config.yaml",
        "meta.json",
        "meta.resume1700000000.json",
        "progress.csv.gz",
        "summary.json",
    ]
    data = (copy / kept.KEPT_PROGRESS).read_bytes()
    assert _steps(gzip.decompress(data).decode())[:3] == [0, 200, 400] and len(data) < 2000
    kept.keep_run(run, copy)
    assert (copy / kept.KEPT_PROGRESS).read_bytes() == data  # no name or time in the gzip header
    kept.keep_run(copy, tmp_path / "again")  # keeping a kept run gives the same bytes
    assert (tmp_path / "again" / kept.KEPT_PROGRESS).read_bytes() == data
    original, committed = find_runs([run]), find_runs([out])
    assert committed[0].steps.tolist() == original[0].steps.tolist() == [10000, 20000]
    assert committed[0].final_return == 7.5 and committed[0].last_step == original[0].last_step == 20000


def test_restoring_fills_only_folders_without_files_of_their_own(tmp_path: Path) -> None:
    _run(tmp_path / "runs/b/seed3")
    kept.keep_runs(tmp_path / "runs/b", tmp_path / "result")
    assert kept.restore_runs(tmp_path / "result", tmp_path / "fresh") == [Path("seed3")]
    assert (tmp_path / "fresh/seed3/summary.json").is_file() and not (tmp_path / "fresh/seed3/checkpoint.pt").exists()
    assert kept.restore_runs(tmp_path / "result", tmp_path / "runs/b") == []  # the local run stays as it is
    assert (tmp_path / "runs/b/seed3/checkpoint.pt").is_file()


def test_a_kept_run_names_no_machine_s_folders_and_older_code_s_runs_are_not_restored(tmp_path: Path) -> None:
    run = _run(tmp_path / "runs/b/seed3")
    (run / "meta.json").write_text(json.dumps({"command": ["/home/me/lab/__main__.py", "train"], "code_version": 2}))
    kept.keep_runs(tmp_path / "runs/b", tmp_path / "result")
    meta = json.loads((tmp_path / "result/seed3/meta.json").read_text())
    assert meta == {"command": ["testbed", "train"], "code_version": 2}
    # Trained by code version 2, which today's computes otherwise: kept as a record, trained again on a rerun.
    assert rundir.other_code_version(tmp_path / "result/seed3") == 2 != rundir.CODE_VERSION
    assert kept.restore_runs(tmp_path / "result", tmp_path / "fresh") == []
    (tmp_path / "result/seed3/meta.json").write_text(json.dumps({"code_version": rundir.CODE_VERSION}))
    assert kept.restore_runs(tmp_path / "result", tmp_path / "fresh") == [Path("seed3")]


def test_a_kept_bsuite_run_keeps_every_episode_and_its_scores_read_them_back(tmp_path: Path) -> None:
    run = _run(tmp_path / "runs/bench/b/bsuite_discounting_chain-v0/setting0/ppo/seed0")
    rows = "global_step,episode,return,length,last_reward\n" + "".join(
        f"{101 * (e + 1)},{e + 1},{e % 2 * 1.1},100,{e % 2 * 1.1}\n" for e in range(1000)
    )
    (run / "episodes.csv").write_text(rows)
    out = tmp_path / "result"
    kept.keep_runs(tmp_path / "runs/bench/b", out)
    copy = out / "bsuite_discounting_chain-v0/setting0/ppo/seed0"
    assert gzip.decompress((copy / "episodes.csv.gz").read_bytes()).decode() == rows  # every row, not thinned
    assert not (copy / "episodes.csv").exists()
    kept.keep_run(copy, tmp_path / "again")  # keeping a kept run keeps its episodes as they are
    assert (tmp_path / "again" / "episodes.csv.gz").read_bytes() == (copy / "episodes.csv.gz").read_bytes()
    original, committed = read_episodes(run), read_episodes(copy)
    assert committed.equals(original) and len(committed) == 1000
