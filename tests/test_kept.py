"""What a committed result keeps of a run (lab.kept): thinned curves, byte for byte, and nothing else."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd

from agents import rundir
from lab import bsuite_study, kept
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
    # Thinning to a divisor of the spans gives what thinning the whole file to it gives.
    uneven = _progress(range(0, 1003, 7), evaluated={497})
    assert kept.thin_progress(kept.thin_progress(uneven, spans=100), spans=20) == kept.thin_progress(uneven, spans=20)


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


def test_keeping_again_sweeps_what_a_stopped_keep_left_and_keeps_the_copy_whole(tmp_path: Path) -> None:
    _run(tmp_path / "runs/b/CartPole-v1/seed3")
    out = tmp_path / "result"
    kept.keep_runs(tmp_path / "runs/b", out)
    whole = sorted(p.name for p in (out / "CartPole-v1/seed3").iterdir())
    # A keep stopped after staging, before the rename, of a run this output no longer holds as ended:
    left = out / "CartPole-v1/.seed9.keeping"
    left.mkdir()
    (left / "config.yaml").write_text("algo: ppo\n")
    assert kept.keep_runs(tmp_path / "runs/b", out) == [Path("CartPole-v1/seed3")]
    assert not left.exists() and sorted(p.name for p in (out / "CartPole-v1/seed3").iterdir()) == whole
    assert sorted(p.name for p in out.rglob("*") if p.name.startswith(".")) == []


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


def test_a_kept_bsuite_run_keeps_bsuite_s_own_log_and_scores_as_every_episode_did(tmp_path: Path) -> None:
    run = _run(tmp_path / "runs/bench/b/bsuite_umbrella_length-v0/setting2/ppo/seed0")
    (run / "config.yaml").write_text(
        "algo: ppo\nenv_id: bsuite/umbrella_length-v0\nenv_kwargs: {chain_length: 3, n_distractor: 20}\nseed: 0\n"
    )
    rng = np.random.default_rng(0)
    last = np.where(rng.random(12_345) < np.linspace(0.6, 0.1, 12_345), -1.0, 1.0)  # past NUM_EPISODES
    returns = last + rng.integers(-2, 3, last.size)  # the distractors' rewards
    rows = "global_step,episode,return,length,last_reward\n" + "".join(
        f"{4 * (e + 1)},{e + 1},{r},3,{x}\n" for e, (r, x) in enumerate(zip(returns, last, strict=True))
    )
    (run / "episodes.csv").write_text(rows)
    out = tmp_path / "result"
    kept.keep_runs(tmp_path / "runs/bench/b", out)
    copy = out / "bsuite_umbrella_length-v0/setting2/ppo/seed0"
    log = pd.read_csv(copy / "bsuite_log.csv.gz")
    # bsuite's schedule (1, 1.2, 1.4, 1.7, 2, 2.5, 3, 4, …, 10 per decade), NUM_EPISODES and the last episode.
    assert log.episode.tolist()[:16] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 17, 20, 25, 30]
    assert log.episode.tolist()[-4:] == [9_000, 10_000, 12_000, 12_345] and len(log) == 10 + 3 * 13 + 2
    assert not (copy / "episodes.csv").exists()
    # The curves' training rows a fifth of other runs': 20 spans, the two evaluations and the last row.
    progress = gzip.decompress((copy / kept.KEPT_PROGRESS).read_bytes()).decode()
    assert _steps(progress)[:3] == [0, 1000, 2000] and len(_steps(progress)) == 21
    kept.keep_run(copy, tmp_path / "again")  # keeping a kept run keeps its log as it is
    assert (tmp_path / "again/bsuite_log.csv.gz").read_bytes() == (copy / "bsuite_log.csv.gz").read_bytes()
    # The kept log scores as every episode: the regret and return at episode 10,000, by bsuite's own score.
    [original], [committed] = (bsuite_study.score_runs(find_runs([d]), "umbrella_length") for d in (run, copy))
    assert committed.score == original.score and committed.episodes == original.episodes == 10_000
    assert committed.mean_return == original.mean_return == returns[:10_000].sum() / 10_000
    regret = 2 * (last[:10_000] < 0).sum()
    assert log.loc[log.episode == 10_000, "total_regret"].item() == regret
    assert committed.score == float(regret / 10_000 < 0.5)
