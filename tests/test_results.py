"""The results manifest: committed pages match the files, reruns keep files and record where they ran."""

from __future__ import annotations

import csv
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agents import rundir
from envs.errors import BadInput
from lab import ledger, manifest, pages, result_page
from lab.document import DASH

ROOT = Path(__file__).resolve().parent.parent


def test_every_generated_page_and_readme_block_is_what_the_manifest_files_say() -> None:
    rendered = pages.render_all(ROOT)
    stale = [str(p) for p, text in rendered.items() if not (ROOT / p).exists() or (ROOT / p).read_text() != text]
    assert not stale, f"rerun `testbed results pages`: these differ from what the manifest's files say: {stale}"
    names = {e.name for e in manifest.load(ROOT).entries}
    orphans = {p.stem for p in (ROOT / pages.PAGES).glob("*.md")} - names - {"index", Path(ledger.LEDGER).stem}
    assert not orphans, f"pages of results the manifest no longer lists: {orphans}"


def test_every_manifest_entry_keeps_files_that_exist_and_names_its_provenance() -> None:
    found = manifest.load(ROOT)
    for entry in found.entries:
        if not entry.produced:
            continue
        assert {"commit", "date", "machine", "code_version"} <= set(entry.produced), entry.name
        for kept in entry.keep:
            assert (ROOT / entry.folder / kept).exists(), f"{entry.name}: {entry.folder}/{kept} is missing"
    assert found.code_version == rundir.CODE_VERSION, "raise agents/rundir.py's CODE_VERSION with the manifest's"
    headline = found.entry(pages.HEADLINE)
    assert found.current(headline) or found.rerunning(headline), (
        "the README's headline table must come from today's algorithms, or be rerun by them (testbed results save)"
    )


SUMMARY_COLUMNS = (
    "algo",
    "seed",
    "status",
    "final_eval_return_mean",
    "final_eval_return_std",
    "total_steps",
    "wall_time_s",
    "sps",
)


def test_the_kept_runs_give_back_every_row_of_every_committed_summary() -> None:
    """Each run of a result's summary.csv is kept by the result, or by a result it adopted runs from
    (--reuse-from), with the same numbers: a rerun on a fresh checkout reuses it instead of training anew.
    When a source's cell is set aside (a preset changed), the result must keep that cell's runs itself."""
    checked, found = 0, manifest.load(ROOT)
    for entry in found.entries:
        summary = ROOT / entry.folder / "summary.csv"
        if not entry.keep_runs or not entry.produced or not summary.is_file():
            continue
        folders = [ROOT / entry.folder, *manifest.reuse_sources(ROOT, entry)]
        with open(summary, newline="") as f:
            rows = [row for row in csv.DictReader(f) if row["status"] in ("completed", "failed")]
        lost = [
            row["run_dir"]
            for row in rows
            if not any(_same_numbers(row, folder / row["run_dir"]) for folder in folders)
            and not (found.rerunning(entry) and _rerun_today(ROOT / entry.folder / row["run_dir"]))
        ]
        assert not lost, (
            f"{entry.name}: no result keeps these runs; put them back under its output folder (from the commit that "
            f"kept them) and `testbed results save` it: {lost}"
        )
        checked += len(rows)
    assert checked > 700


def _rerun_today(run_dir: Path) -> bool:
    """Whether a result from older code, being rerun, already keeps today's run in place of the older one."""
    return (run_dir / "meta.json").is_file() and json.loads((run_dir / "meta.json").read_text()).get(
        "code_version"
    ) == rundir.CODE_VERSION


def test_every_kept_run_records_its_code_version_and_no_machine_s_folders() -> None:
    """A bench takes a kept run for one of today's only if today's code trained it, and a record names no
    machine's folders (its command starts ``testbed``, whatever script path ran it)."""
    metas = [m for m in (ROOT / "benchmarks/results").rglob("meta*.json") if "carried" not in m.parts]
    bad = [
        str(m.relative_to(ROOT))
        for m in metas
        if not isinstance((record := json.loads(m.read_text())).get("code_version"), int)
        or record.get("command", ["testbed"])[0] != "testbed"
    ]
    assert len(metas) > 700 and not bad, f"kept without a code version or with a machine's path: {bad[:3]}"


def _same_numbers(row: dict[str, str], run_dir: Path) -> bool:
    path = run_dir / "summary.json"
    if not path.is_file():
        return False
    kept = json.loads(path.read_text())
    return all(
        str(kept.get(column)) == row[column] or _close(kept.get(column), row[column]) for column in SUMMARY_COLUMNS
    )


def _close(value: object, text: str) -> bool:
    try:
        return float(value) == float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return value is None and text == ""


def _toy(tmp_path: Path, command: str, **extra: object) -> manifest.Manifest:
    entry = {
        "name": "toy",
        "title": "Toy",
        "about": "a toy result",
        "command": command,
        "output": "out",
        "folder": "benchmarks/results/toy",
        "keep": ["report.md", "plots"],
        "page": "report.md",
        "seeds": "0",
        "budget": "none",
        "cost": "cheap",
        **extra,
    }
    (tmp_path / "benchmarks").mkdir(exist_ok=True)
    (tmp_path / manifest.MANIFEST).write_text(yaml.safe_dump({"code_version": 3, "results": [entry]}))
    return manifest.load(tmp_path)


WRITE = (
    "python -c \"import pathlib; p = pathlib.Path('out/plots'); p.mkdir(parents=True); "
    "(p / 'curve.png').write_bytes(b'png'); pathlib.Path('out/report.md').write_text("
    "'# Report\\n\\n![curve](plots/curve.png) and [the code](../../agents/ppo.py)\\n'); print('7 passed in 1.50s')\""
)


def test_a_rerun_keeps_the_files_records_provenance_and_the_page_shows_them(tmp_path: Path) -> None:
    found = _toy(tmp_path, WRITE, last_line="closing.txt", keep=["report.md", "plots", "closing.txt"])
    updated = manifest.rerun(tmp_path, found, found.entry("toy"))
    kept = tmp_path / "benchmarks/results/toy"
    assert (kept / "plots/curve.png").read_bytes() == b"png"
    assert (kept / "closing.txt").read_text() == "7 passed in 1.50s\n"
    assert manifest.pytest_line((kept / "closing.txt").read_text()) == (7, 1.5)
    produced = manifest.load(tmp_path).entry("toy").produced  # written to the file, not only returned
    assert produced == updated.entry("toy").produced
    assert produced["code_version"] == 3 and produced["wall_s"] >= 0 and produced["machine"]
    assert produced["reused_runs"] is False
    assert updated.current(updated.entry("toy"))
    page = pages.result_page(tmp_path, updated, updated.entry("toy"))
    assert page.startswith("# Toy\n")
    assert "![curve](files/toy/plots/curve.png)" in page  # through docs/results/files -> benchmarks/results
    body = page.split("## How it was made")[0]  # the kept report comes first
    assert "[the code]" not in body and "and the code" in body  # a link out of the results keeps only its text
    assert "From older code" not in page
    # A variant's plot: brackets in the alt text, the file name percent-encoded as reports write it.
    (kept / "plots/Ant-v5[obs=False].png").write_bytes(b"png")
    (kept / "report.md").write_text("# R\n\n![Ant-v5[obs=False]: curve](plots/Ant-v5%5Bobs%3DFalse%5D.png)\n")
    page = pages.result_page(tmp_path, updated, updated.entry("toy"))
    assert "![Ant-v5[obs=False]: curve](files/toy/plots/Ant-v5%5Bobs%3DFalse%5D.png)" in page


def test_a_bench_that_adopts_another_s_runs_is_recorded_as_reusing_runs(tmp_path: Path) -> None:
    # Its wall time is the copy's, not the training's: the page must say so.
    found = _toy(tmp_path, WRITE.removesuffix('"') + '" --reuse-from runs/bench/other')
    produced = manifest.rerun(tmp_path, found, found.entry("toy")).entry("toy").produced
    assert produced["reused_runs"] is True
    page = pages.result_page(tmp_path, manifest.load(tmp_path), manifest.load(tmp_path).entry("toy"))
    assert "it reused runs an earlier invocation had finished" in page


def test_a_rerun_keeps_what_was_added_to_the_manifest_while_its_command_ran(tmp_path: Path) -> None:
    # The command itself adds an entry, as a person editing the file or another `results run` would.
    add = (
        "python -c \"import pathlib, yaml; p = pathlib.Path('benchmarks/manifest.yaml'); m = "
        "yaml.safe_load(p.read_text()); m['results'].append({**m['results'][0], 'name': 'added'}); "
        "p.write_text(yaml.safe_dump(m)); pathlib.Path('out').mkdir(); pathlib.Path('out/report.md').write_text('# "
        "R'); pathlib.Path('out/plots').mkdir()\""
    )
    found = _toy(tmp_path, add)
    manifest.rerun(tmp_path, found, found.entry("toy"))
    after = manifest.load(tmp_path)
    assert after.names() == ["toy", "added"]
    assert after.entry("toy").produced and not after.entry("added").produced


def test_a_failed_rerun_changes_neither_the_kept_files_nor_the_manifest(tmp_path: Path) -> None:
    found = _toy(tmp_path, 'python -c "import sys; sys.exit(3)"')
    before = (tmp_path / manifest.MANIFEST).read_text()
    with pytest.raises(BadInput, match="exited with status 3"):
        manifest.rerun(tmp_path, found, found.entry("toy"))
    assert (tmp_path / manifest.MANIFEST).read_text() == before
    assert not (tmp_path / "benchmarks/results/toy").exists()


def test_a_failed_rerun_still_keeps_the_runs_that_ended_and_says_so(tmp_path: Path) -> None:
    crash = (
        "python -c \"import pathlib, sys; d = pathlib.Path('runs/bench/toy/seed0'); d.mkdir(parents=True); "
        "(d / 'config.yaml').write_text('algo: ppo'); "
        "(d / 'summary.json').write_text('{\\\"status\\\": \\\"completed\\\"}'); "
        'sys.exit(3)"'
    )
    found = _toy(tmp_path, crash, output="runs/bench/toy", keep_runs=True)
    with pytest.raises(BadInput, match="unchanged; the runs that ended are kept in benchmarks/results/toy"):
        manifest.rerun(tmp_path, found, found.entry("toy"))
    assert (tmp_path / "benchmarks/results/toy/seed0/config.yaml").read_text() == "algo: ppo"
    assert not manifest.load(tmp_path).entry("toy").produced


# A bench that writes what a trainer writes for seed0 (ended) and seed1 (cut short), then reports which of
# seed0's files it found when it started.
RUN = (
    "python -c \"import pathlib; b = pathlib.Path('runs/bench/toy'); d = b / 'seed0'; "
    "found = sorted(p.name for p in d.glob('*')) if d.is_dir() else []; "
    "[(s.mkdir(parents=True, exist_ok=True), (s / 'config.yaml').write_text('algo: ppo'), "
    "(s / 'checkpoint.pt').write_text('weights'), (s / 'events.out.tfevents.1').write_text('events'), "
    "(s / '.lock').write_text('me'), (s / 'progress.csv').write_text('global_step,eval/return_mean\\n0,\\n9,5.0\\n')) "
    "for s in (d, b / 'seed1')]; (d / 'summary.json').write_text('{\\\"status\\\": \\\"completed\\\"}'); "
    "(b / 'seed0.log').write_text('console'); (b / 'report.md').write_text(str(found)); "
    "(b / 'plots').mkdir(exist_ok=True)\""
)


def test_kept_runs_travel_with_the_checkout_and_never_replace_local_files(tmp_path: Path) -> None:
    found = _toy(tmp_path, RUN, keep_runs=True, output="runs/bench/toy")
    manifest.rerun(tmp_path, found, found.entry("toy"))
    kept = tmp_path / "benchmarks/results/toy"
    # seed0 ended: its config, summary and curves, no checkpoint, events, lock or log; seed1 was cut short.
    assert sorted(p.name for p in (kept / "seed0").iterdir()) == ["config.yaml", "progress.csv.gz", "summary.json"]
    assert (
        gzip.decompress((kept / "seed0/progress.csv.gz").read_bytes()) == b"global_step,eval/return_mean\n0,\n9,5.0\n"
    )
    assert not (kept / "seed1").exists() and not (kept / "seed0.log").exists()
    shutil.rmtree(tmp_path / "runs")  # a new checkout: `results restore` brings the runs back by hand…
    restore = subprocess.run(
        [sys.executable, "-m", "lab.cli", "results", "restore", "toy"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert restore.returncode == 0 and "toy: 1 kept runs → runs/bench/toy" in restore.stdout, restore.stderr
    assert (tmp_path / "runs/bench/toy/seed0/summary.json").is_file()
    # With the kept files the output lacks: a bench's bench.yaml records the invocations its report counts.
    assert (tmp_path / "runs/bench/toy/report.md").read_text() == (kept / "report.md").read_text()
    shutil.rmtree(tmp_path / "runs")  # …and a rerun before its command starts
    manifest.rerun(tmp_path, found, found.entry("toy"))
    assert (kept / "report.md").read_text() == "['config.yaml', 'progress.csv.gz', 'summary.json']"
    local = tmp_path / "runs/bench/toy/seed0"
    for f in local.iterdir():
        f.unlink()
    (local / "mine.txt").write_text("newer")  # a folder with files of its own is left as it is
    assert manifest.restore(tmp_path, found.entry("toy")) == []
    assert sorted(p.name for p in local.iterdir()) == ["mine.txt"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(BadInput, match="names no `output` under runs/"):
        _toy(elsewhere, RUN, keep_runs=True, output="/etc")


def test_a_run_trained_for_its_checkpoints_is_kept_but_not_restored(tmp_path: Path) -> None:
    # An audit reads the policies of its bench's runs: restored without them, the bench would skip training.
    run = tmp_path / "benchmarks/results/toy/seed0"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("algo: ppo\nkeep_checkpoints: [50000]\n")
    (run / "summary.json").write_text('{"status": "completed"}')
    found = _toy(tmp_path, "python -c pass", keep_runs=True, output="runs/bench/toy")
    assert manifest.restore(tmp_path, found.entry("toy")) == []


STOPPABLE = (
    "python -c \"import pathlib, signal, sys, time; b = pathlib.Path('runs/bench/toy'); [((b / s).mkdir(parents=True), "
    "(b / s / 'config.yaml').write_text('algo: ppo')) for s in ('seed0', 'seed1')]; (b / "
    "'seed0/summary.json').write_text('{\\\"status\\\": \\\"completed\\\"}'); signal.signal(signal.SIGINT, lambda *a: "
    "((b / 'seed1/summary.json').write_text('{\\\"status\\\": \\\"interrupted\\\"}'), sys.exit(1))); print('ready', "
    'flush=True); time.sleep(60)"'
)


def test_runs_adopted_with_reuse_from_are_not_kept_twice(tmp_path: Path) -> None:
    def write(folder: Path, files: dict[str, str]) -> None:
        for name, text in files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)

    ended = '{"status": "completed"}'
    adopted = {"ppo/seed0/config.yaml": "algo: ppo", "ppo/seed0/summary.json": ended}
    write(tmp_path / "benchmarks/results/suite", adopted)
    # The bench adopted PPO's run as it was, and trained GRPO's itself.
    write(
        tmp_path / "runs/bench/toy",
        {**adopted, "grpo/seed0/config.yaml": "algo: grpo", "grpo/seed0/summary.json": ended, "bench.yaml": "grid"},
    )
    found = _toy(
        tmp_path, "python -c pass --reuse-from benchmarks/results/suite", output="runs/bench/toy", keep_runs=True
    )
    assert manifest.keep(tmp_path, found.entry("toy")) == [Path("grpo/seed0")]
    kept = tmp_path / "benchmarks/results/toy"
    assert sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file()) == [
        "grpo/seed0/config.yaml",
        "grpo/seed0/summary.json",
    ]
    shutil.rmtree(tmp_path / "runs/bench/toy")
    assert manifest.restore(tmp_path, found.entry("toy")) == [Path("grpo/seed0")]  # PPO's: the bench adopts it again


def test_a_stopped_rerun_passes_the_stop_on_once_and_keeps_the_runs_that_ended(tmp_path: Path) -> None:
    _toy(tmp_path, STOPPABLE, keep_runs=True, output="runs/bench/toy")
    code = (
        "from pathlib import Path; from lab import manifest; m = manifest.load(Path('.')); manifest.rerun(Path('.'), "
        "m, m.entry('toy'))"
    )
    driver = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert driver.stdout is not None and driver.stdout.readline().strip() == "ready"
    driver.send_signal(signal.SIGTERM)  # as `kill` does; the command is in a session of its own
    assert driver.wait(timeout=30) != 0
    kept = tmp_path / "benchmarks/results/toy"
    assert (kept / "seed0/summary.json").is_file()
    assert (tmp_path / "runs/bench/toy/seed1/summary.json").read_text() == '{"status": "interrupted"}'  # it stopped
    assert not (kept / "seed1").exists()  # an interrupted run starts again, to the same numbers
    assert not manifest.load(tmp_path).entry("toy").produced


def test_an_older_result_is_marked_and_a_missing_one_says_how_to_make_it(tmp_path: Path) -> None:
    found = _toy(tmp_path, WRITE)
    assert "Not produced yet: `testbed results run toy`" in pages.result_page(tmp_path, found, found.entry("toy"))
    assert "## Not produced yet" in pages.index_page(found)
    older = manifest.Manifest(
        found.code_version,
        tuple(
            manifest.Entry(**{**e.__dict__, "produced": {"commit": "abc1234", "code_version": 2}})
            for e in found.entries
        ),
    )
    (tmp_path / "benchmarks/results/toy").mkdir(parents=True)
    (tmp_path / "benchmarks/results/toy/report.md").write_text("# R\n\n## Part\n\n```\n# not a heading\n```\n")
    page = pages.result_page(tmp_path, older, older.entry("toy"))
    assert '!!! warning "From older code"' in page and "commit abc1234" in page
    assert "### Part" in page and "\n# not a heading\n" in page  # headings demoted, code left alone
    assert "## From older code" in pages.index_page(older)


def test_a_long_result_saved_part_way_shows_its_runs_so_far_until_a_rerun_finishes_it(tmp_path: Path) -> None:
    found = _toy(tmp_path, WRITE, keep=["report.md", "summary.csv", "plots"])
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").write_text("# Report\n\ntwo cells so far\n")  # no plots yet: what exists is kept
    (out / "summary.csv").write_text("algo,status\nppo,completed\nppo,completed\ngrpo,failed\n")
    saved = manifest.keep_progress(tmp_path, found, found.entry("toy"))
    assert saved is not None and manifest.load(tmp_path).entry("toy").progress == saved.entry("toy").progress
    progress = saved.entry("toy").progress
    assert {"commit", "date", "machine"} <= set(progress) and progress["code_version"] == 3
    assert not saved.entry("toy").produced
    page = pages.result_page(tmp_path, saved, saved.entry("toy"))
    assert '!!! note "In progress"' in page and "the 2 runs finished so far" in page and "two cells so far" in page
    assert f"commit {progress['commit']}" in page and "Not produced yet" not in page
    index = pages.index_page(saved)
    assert "## In progress" in index and "## Not produced yet" not in index
    updated = manifest.rerun(tmp_path, saved, saved.entry("toy"))  # the command finishes: progress is over
    assert updated.entry("toy").produced and not manifest.load(tmp_path).entry("toy").progress
    assert "In progress" not in pages.result_page(tmp_path, updated, updated.entry("toy"))
    (out / "report.md").write_text("# Report\n\nsomething else\n")
    assert manifest.keep_progress(tmp_path, updated, updated.entry("toy")) is None  # a produced result keeps its files
    assert "something else" not in (tmp_path / "benchmarks/results/toy/report.md").read_text()


def test_a_rerun_of_a_result_from_older_code_is_recorded_without_touching_its_finished_files(tmp_path: Path) -> None:
    found = _toy(tmp_path, WRITE, keep=["report.md"], produced={"commit": "abc1234", "code_version": 2})
    (tmp_path / "benchmarks/results/toy").mkdir(parents=True)
    (tmp_path / "benchmarks/results/toy/report.md").write_text("# Report\n\nthe finished result\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out/report.md").write_text("# Report\n\ntoday's part so far\n")
    assert found.older(found.entry("toy")) and not found.rerunning(found.entry("toy"))
    saved = manifest.keep_progress(tmp_path, found, found.entry("toy"))
    assert (
        saved is not None and saved.rerunning(saved.entry("toy")) and saved.entry("toy").progress["code_version"] == 3
    )
    assert "the finished result" in (tmp_path / "benchmarks/results/toy/report.md").read_text()
    assert not saved.in_progress(saved.entry("toy"))  # it was produced: its page is the finished result's
    page = result_page.result_page(tmp_path, saved, saved.entry("toy"))
    assert "From older code" in page and "That rerun is under way" in page
    updated = manifest.rerun(tmp_path, saved, saved.entry("toy"))  # the rerun ends: current, no progress left
    assert updated.current(updated.entry("toy")) and not updated.rerunning(updated.entry("toy"))


def test_bad_manifests_and_selections_are_refused_before_any_work(tmp_path: Path) -> None:
    found = _toy(tmp_path, WRITE)
    with pytest.raises(BadInput, match="one of the three"):
        manifest.select(found, [], False, False)
    with pytest.raises(BadInput, match=r"no result named 'nope'.*toy"):
        manifest.select(found, ["nope"], False, False)
    assert [e.name for e in manifest.select(found, [], False, True)] == ["toy"]
    (tmp_path / manifest.MANIFEST).write_text(
        yaml.safe_dump({"code_version": 1, "results": [{"name": "x", "cost": "huge"}]})
    )
    with pytest.raises(BadInput, match="lacks"):
        manifest.load(tmp_path)
    (tmp_path / manifest.MANIFEST).write_text("code_version: 1\nresults:\n- name: x\n  about: two parts: one\n")
    with pytest.raises(BadInput, match=r"not valid YAML at line 4, column 19 .*quote a text"):
        manifest.load(tmp_path)
    with pytest.raises(BadInput, match=r"README\.md lacks the block"):
        pages.fill_blocks("no markers here", {"results-table": "x"})
    assert (
        pages.fill_blocks("a\n<!-- BEGIN generated: t -->\nold\n<!-- END generated: t -->\nb", {"t": "new"})
        == "a\n<!-- BEGIN generated: t -->\nnew\n<!-- END generated: t -->\nb"
    )


def test_the_readme_mujoco_sentence_reads_the_suite_report(tmp_path: Path) -> None:
    found = _toy(
        tmp_path,
        WRITE,
        name=pages.SUITE,
        folder="benchmarks/results/suite",
        seeds="0–4",
        produced={"commit": "abc1234", "date": "2026-12-04", "code_version": 3},
    )
    report = tmp_path / "benchmarks/results/suite/report.md"
    report.parent.mkdir(parents=True)
    # As lab.published and lab.normalized write them; a per-env table above has the same first column.
    report.write_text(
        "| algo | seeds completed | final return (mean) |\n|---|---|---|\n| ppo | 5 | 1.0 [0.5, 1.5] | x |\n\n"
        "grpo at or above 1 of 6 figures (below: A-v5 (final), B-v5 (final), B-v5 (best point), C-v5 (final), "
        "D-v5 (final)); ppo at or above 5 of 6 figures (below: B-v5 (final)); sb3-ppo at or above 6 of 6 figures.\n\n"
        "## Normalized scores across envs\n\n| algo | IQM | median |\n|---|---|---|\n"
        "| ppo | 1.128 [1.109, 1.149] | 1.053 [1.053, 1.074] |\n"
        "| sb3-ppo | -0.100 [-0.200, 0.050] | 0.9 [0.8, 1.0] |\n\n"
        "| X | Y | P(X > Y) | 95% CI |\n|---|---|---|---|\n| sb3-ppo | ppo | 0.555 | [0.433, 0.676] |\n"
        "| ppo | sb3-ppo | 0.445 | [0.324, 0.567] |\n"
    )
    # Means by task: A ppo 1 < sb3 2, grpo 0 < ppo 1; B ppo (3 + 1)/2 = 2 > 1; C ppo (1 + 3)/2 = 2 < 2.5.
    (report.parent / "summary.csv").write_text(
        "algo,env_id,seed,status,final_eval_return_mean\n"
        "ppo,A-v5,0,completed,1\nsb3-ppo,A-v5,0,completed,2\ngrpo,A-v5,0,completed,0\n"
        "ppo,B-v5,0,completed,3\nppo,B-v5,1,completed,1\nsb3-ppo,B-v5,0,completed,1\ngrpo,B-v5,0,interrupted,\n"
        "ppo,C-v5[x=1],0,completed,1\nppo,C-v5[x=1],1,completed,3\nsb3-ppo,C-v5[x=1],0,completed,2.5\n"
    )
    assert pages.suite_summary(tmp_path, found) == (
        f"On the MuJoCo v5 suite ([results](docs/results/{pages.SUITE}.md), seeds 0–4, 2026-12-04), the best published "
        "PPO figures met, each by its source's protocol: grpo 1 of 6, ppo 5 of 6 (not B-v5 (final)), sb3-ppo 6 of 6. "
        "IQM normalized score across the envs [95% CI]: ppo 1.128 [1.109, 1.149], sb3-ppo -0.100 [-0.200, 0.050]; "
        "P(ppo > sb3-ppo) = 0.445 [0.324, 0.567]. Mean final return by task: grpo below ppo on 1 of 1; ppo below "
        "sb3-ppo on 2 of 3 (all but B-v5)."
    )
    assert (
        pages.trailing(pages.completed_runs(tmp_path, found.entry(pages.SUITE)), "sb3-ppo", "ppo")
        == "sb3-ppo below ppo on 1 of 3 (B-v5)"
    )
    # Once each check is produced, the sentence adds its IQMs and P, in CHECKS' order.
    (seeds_check, _), (scale_check, _) = pages.CHECKS
    listed = yaml.safe_load((tmp_path / manifest.MANIFEST).read_text())
    checks = [
        {**listed["results"][0], "name": name, "folder": f"benchmarks/results/{name}", "seeds": "0–7"}
        for name in (scale_check, seeds_check)
    ]
    (tmp_path / manifest.MANIFEST).write_text(yaml.safe_dump({**listed, "results": [*listed["results"], *checks]}))
    for name, iqm, p in ((seeds_check, "1.2 [1.1, 1.3]", "0.55"), (scale_check, "1.3 [1.2, 1.4]", "0.60")):
        (tmp_path / "benchmarks/results" / name).mkdir()
        (tmp_path / "benchmarks/results" / name / "report.md").write_text(
            "## Normalized scores across envs\n\n| algo | IQM | median |\n|---|---|---|\n"
            f"| ppo | {iqm} | 1.0 [1.0, 1.0] |\n| sb3-ppo | 1.1 [1.0, 1.2] | 1.0 [1.0, 1.0] |\n\n"
            f"| X | Y | P(X > Y) | 95% CI |\n|---|---|---|---|\n| ppo | sb3-ppo | {p} | [0.45, 0.65] |\n"
        )
    assert pages.suite_summary(tmp_path, manifest.load(tmp_path)).endswith(
        f"sb3-ppo on 2 of 3 (all but B-v5). Both PPOs on seeds 0–7 ([results](docs/results/{seeds_check}.md), "
        "2026-12-04): IQM ppo 1.2 [1.1, 1.3], sb3-ppo 1.1 [1.0, 1.2]; P(ppo > sb3-ppo) = 0.55 [0.45, 0.65]. Ours at "
        f"SB3's reward scale (`ppo.reward_norm_restart=done`, the one hyperparameter in which the pair's runs differ), "
        f"seeds 0–7 ([results](docs/results/{scale_check}.md), 2026-12-04): IQM ppo 1.3 [1.2, 1.4], sb3-ppo 1.1 [1.0, "
        "1.2]; P(ppo > sb3-ppo) = 0.60 [0.45, 0.65]."
    )
    (tmp_path / "benchmarks/results" / scale_check / "report.md").write_text("# A report from before the comparison\n")
    with pytest.raises(BadInput, match=f"rebuild it with `testbed results run {scale_check}`"):
        pages.suite_summary(tmp_path, manifest.load(tmp_path))
    report.write_text("# A report from before the comparison\n")
    with pytest.raises(BadInput, match=f"rebuild it with `testbed results run {pages.SUITE}`"):
        pages.suite_summary(tmp_path, found)


def test_the_training_guide_table_sets_ours_at_both_scales_beside_sb3s(tmp_path: Path) -> None:
    (seeds_check, _), (scale_check, _) = pages.CHECKS
    _toy(
        tmp_path,
        WRITE,
        name=seeds_check,
        folder="benchmarks/results/a",
        seeds="0–1",
        produced={"commit": "abc1234", "date": "2026-12-04", "code_version": 3},
    )
    listed = yaml.safe_load((tmp_path / manifest.MANIFEST).read_text())
    scaled = {
        **listed["results"][0],
        "name": scale_check,
        "folder": "benchmarks/results/b",
        "produced": None,
        "progress": {"commit": "def5678", "date": "2026-12-05", "code_version": 3},
    }
    (tmp_path / manifest.MANIFEST).write_text(yaml.safe_dump({**listed, "results": [*listed["results"], scaled]}))
    # SB3's runs are the same in both; ours as it is makes 1 and 3 on A, ours at SB3's scale 4 and 6.
    for folder, ours, p_a in (("a", (1, 3), "0.250"), ("b", (4, 6), "1.000")):
        (tmp_path / "benchmarks/results" / folder).mkdir(parents=True)
        (tmp_path / "benchmarks/results" / folder / "summary.csv").write_text(
            "algo,env_id,seed,status,final_eval_return_mean\n"
            f"ppo,A-v5[x=1],0,completed,{ours[0]}\nppo,A-v5[x=1],1,completed,{ours[1]}\nppo,A-v5[x=1],2,failed,\n"
            "sb3-ppo,A-v5[x=1],0,completed,2\nsb3-ppo,A-v5[x=1],1,completed,2\n"
            "ppo,B-v5,0,completed,-1.5\nsb3-ppo,B-v5,0,completed,-1\n"
        )
        (tmp_path / "benchmarks/results" / folder / "report.md").write_text(
            "## Normalized scores across envs\n\n| algo | IQM | median |\n|---|---|---|\n"
            f"| ppo | 1.{folder == 'b':d} [0.9, 1.1] | 1.0 [1.0, 1.0] |\n"
            "| sb3-ppo | 1.5 [1.4, 1.6] | 1.0 [1.0, 1.0] |\n\n"
            "| X | Y | P(X > Y) | 95% CI |\n|---|---|---|---|\n| ppo | sb3-ppo | 0.5 | [0.4, 0.6] |\n\n"
            "| env | X | Y | P(X > Y) | 95% CI |\n|---|---|---|---|---|\n"
            f"| A-v5[x=1] | ppo | sb3-ppo | {p_a} | [0.000, 1.000] |\n"
            "| B-v5 | ppo | sb3-ppo | 0.000 | [0.000, 0.000] |\n"
        )
    rows = [
        "| A-v5 | 2.00, P = 0.250 [0.000, 1.000] | 5.00, P = 1.000 [0.000, 1.000] | 2.00 |",
        "| B-v5 | -1.50, P = 0.000 [0.000, 0.000] | -1.50, P = 0.000 [0.000, 0.000] | -1.00 |",
    ]
    links = f"[Ours and SB3's](results/{seeds_check}.md), [ours at SB3's scale](results/{scale_check}.md)"
    head = "| task | ours | ours at SB3's scale | SB3's |\n|---|---|---|---|\n"
    # In progress, the IQMs would span different tasks, so they wait.
    assert pages.scale_table(tmp_path, manifest.load(tmp_path)) == (
        head + "\n".join(rows) + "\n\nMean final return over seeds 0–1 and P(ppo > sb3-ppo) on each task [95% CI]. "
        f"In progress: 2 tasks so far. {links}, 2026-12-05."
    )
    listed = yaml.safe_load((tmp_path / manifest.MANIFEST).read_text())
    listed["results"][1].update(produced={"commit": "def5678", "date": "2026-12-06", "code_version": 3}, progress=None)
    (tmp_path / manifest.MANIFEST).write_text(yaml.safe_dump(listed))
    assert pages.scale_table(tmp_path, manifest.load(tmp_path)) == (
        head
        + "\n".join([*rows, "| IQM normalized score | 1.0 [0.9, 1.1] | 1.1 [0.9, 1.1] | 1.5 [1.4, 1.6] |"])
        + f"\n\nMean final return over seeds 0–1 and P(ppo > sb3-ppo) on each task [95% CI]; IQM across the tasks "
        f"[95% CI]. {links}, 2026-12-06."
    )
    (tmp_path / "benchmarks/results/b/report.md").write_text("# A report from before the comparison\n")
    with pytest.raises(BadInput, match=f"rebuild them with `testbed results run {seeds_check} {scale_check}`"):
        pages.scale_table(tmp_path, manifest.load(tmp_path))


def test_the_guide_blocks_copy_a_figure_s_tables_and_average_a_credit_study(tmp_path: Path) -> None:
    figure = "# Title\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nCaption one.\n\nA note.\n\n## Part\n\n| c |\n|---|\n| 3 |\n"
    assert pages.figure_tables(figure) == ["| a | b |\n|---|---|\n| 1 | 2 |\n\nCaption one.", "| c |\n|---|\n| 3 |"]
    found = _toy(tmp_path, WRITE, folder="benchmarks/results/study", produced={"commit": "abc1234", "code_version": 3})
    (tmp_path / "benchmarks/results/study").mkdir(parents=True)
    header = "algo,env_id,seed,status,final_eval_return_mean\n"
    runs = [
        "ppo,testbed/Chain-v0[horizon=100],0,completed,1.0",
        "ppo,testbed/Chain-v0[horizon=100],1,completed,0.5",
        "ppo,testbed/Chain-v0[horizon=20],0,completed,0.25",
        "ppo,testbed/Chain-v0[horizon=20],1,failed,",
        "grpo,testbed/Chain-v0[horizon=20],0,completed,-1.0",
    ]
    (tmp_path / "benchmarks/results/study/summary.csv").write_text(header + "\n".join(runs) + "\n")
    (tmp_path / "docs/figures").mkdir(parents=True)
    (tmp_path / "docs/figures/f.md").write_text(figure)
    guide = (
        "<!-- BEGIN generated: figures/f.md table 2 -->\n<!-- END generated: figures/f.md table 2 -->\n"
        "<!-- BEGIN generated: credit toy -->\n<!-- END generated: credit toy -->"
    )
    blocks = pages.guide_blocks(tmp_path, found, guide)
    assert blocks["figures/f.md table 2"] == "| c |\n|---|\n| 3 |"
    table = blocks["credit toy"].split("\n\n")[0].splitlines()
    assert table[0] == "| algo | horizon 20 | horizon 100 |"  # variants in numeric order
    assert table[2:] == [f"| grpo | -1.00 (1) | {DASH} |", "| ppo | 0.25 (1) | 0.75 (2) |"]  # a failed run is left out
    assert "commit abc1234" in blocks["credit toy"]
    with pytest.raises(BadInput, match="has 2 tables"):
        pages.guide_blocks(tmp_path, found, "<!-- BEGIN generated: figures/f.md table 3 -->")
    with pytest.raises(BadInput, match="did not write"):
        pages.guide_blocks(tmp_path, found, "<!-- BEGIN generated: figures/none.md -->")
    with pytest.raises(BadInput, match="unknown generated block"):
        pages.guide_blocks(tmp_path, found, "<!-- BEGIN generated: tables -->")


def test_an_audit_block_averages_one_score_over_seeds_by_estimator_and_variant(tmp_path: Path) -> None:
    found = _toy(tmp_path, WRITE, folder="benchmarks/results/audit", produced={"commit": "abc1234", "code_version": 3})
    (tmp_path / "benchmarks/results/audit").mkdir(parents=True)
    header = "env,algo,seed,global_step,checkpoint,estimator,steps_left,rank_correlation\n"
    rows = [
        "testbed/Chain-v0[horizon=100],ppo,0,5000,checkpoint-at-5000.pt,gae(1),all,0.5",
        "testbed/Chain-v0[horizon=100],ppo,1,5000,checkpoint-at-5000.pt,gae(1),all,0.25",
        "testbed/Chain-v0[horizon=100],ppo,1,5000,checkpoint-at-5000.pt,gae(1),1–9,0.9",  # a bin: not counted
        "testbed/Chain-v0[horizon=20],ppo,0,5000,checkpoint-at-5000.pt,gae(1),all,",  # no score: a dash
        "testbed/Chain-v0[horizon=20],grpo,0,5000,checkpoint-at-5000.pt,outcome,all,-0.125",
        "testbed/Chain-v0[horizon=20],grpo,0,9000,checkpoint.pt,outcome,all,1.0",  # another checkpoint
    ]
    (tmp_path / "benchmarks/results/audit/scores.csv").write_text(header + "\n".join(rows) + "\n")
    name = "audit toy rank_correlation checkpoint-at-5000"
    block = pages.guide_blocks(tmp_path, found, f"<!-- BEGIN generated: {name} -->")[name]
    table = block.split("\n\n")[0].splitlines()
    assert table[0] == "| algo | estimator | horizon 20 | horizon 100 |"
    assert table[2:] == [f"| grpo | outcome | -0.12 | {DASH} |", f"| ppo | gae(1) | {DASH} | 0.38 |"]
    assert "Spearman" in block and "commit abc1234" in block
    with pytest.raises(BadInput, match="not one of"):
        pages.guide_blocks(tmp_path, found, "<!-- BEGIN generated: audit toy mse checkpoint -->")
    with pytest.raises(BadInput, match="no audited checkpoint"):
        pages.guide_blocks(tmp_path, found, "<!-- BEGIN generated: audit toy rank_correlation checkpoint-at-1 -->")


def test_the_results_command_answers_bad_input_with_status_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "lab.cli", "results", "run", "no-such-result"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2 and "no result named 'no-such-result'" in done.stderr


def test_the_recorded_commit_says_changes_only_when_code_differs(tmp_path: Path) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "agent.py").write_text("x = 1\n")
    (tmp_path / "page.md").write_text("a page\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = manifest.git_commit(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{7,}", head)
    (tmp_path / "page.md").write_text("rewritten by a rerun\n")  # results and pages being written meanwhile
    assert manifest.git_commit(tmp_path) == head
    (tmp_path / "agent.py").write_text("x = 2\n")
    assert manifest.git_commit(tmp_path) == f"{head}+changes"


CACHES = re.compile(r"(\.pt|\.pth|\.ckpt|\.log|\.lock)$|events\.out\.tfevents")


def _tracked(*folders: str) -> dict[str, int]:
    """Every file git tracks under ``folders``, with its size (a link counts as the link, not its target)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", *folders], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    return {name: os.lstat(ROOT / name).st_size for name in listed if name and (ROOT / name).exists()}


def test_the_repository_keeps_its_size_budget() -> None:
    """git holds code and compact results, never run caches: no file over 2 MB under benchmarks/ or docs/,
    at most 40 MB under benchmarks/, no checkpoint, log or event file (see DESIGN.md, Committed results)."""
    files = _tracked("benchmarks", "docs")
    large = sorted(f"{name} ({size / 2**20:.1f} MB)" for name, size in files.items() if size > 2 * 2**20)
    assert not large, f"files over 2 MB: {large}"
    caches = sorted(name for name in files if CACHES.search(name))
    assert not caches, (
        f"run caches are not committed (a run is bit-identical given config, seed and code): {caches[:5]}"
    )
    total = sum(size for name, size in files.items() if name.startswith("benchmarks/"))
    assert total <= 40 * 2**20, f"benchmarks/ holds {total / 2**20:.1f} MB, over its 40 MB"


def test_a_result_that_reads_another_s_output_asks_for_it_first(tmp_path: Path) -> None:
    found = _toy(tmp_path, "python -c pass runs/bench/toy-runs")
    entries = (
        *found.entries,
        manifest.Entry(**{**found.entries[0].__dict__, "name": "toy-runs", "output": "runs/bench/toy-runs"}),
    )
    both = manifest.Manifest(found.code_version, entries)
    with pytest.raises(
        BadInput,
        match=r"toy reads runs/bench/toy-runs, which this checkout lacks; make it first: "
        r"`testbed results run toy-runs toy`",
    ):
        manifest.rerun(tmp_path, both, both.entry("toy"))


def test_a_manifest_that_is_not_utf8_is_refused_in_one_line(tmp_path: Path) -> None:
    _toy(tmp_path, "python -c pass")
    (tmp_path / manifest.MANIFEST).write_bytes(b"code_version: 3\nresults: []\n# caf\xe9\n")
    with pytest.raises(BadInput, match=r"is not UTF-8 text \(byte 33\); restore it from git"):
        manifest.load(tmp_path)
