"""The results manifest: committed pages match the files, reruns keep files and record where they ran."""

from __future__ import annotations

import csv
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

from envs.errors import BadInput
from lab import ledger, manifest, pages
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
    headline = found.entry(pages.HEADLINE)
    assert found.current(headline), "the README's headline table must come from today's algorithms"


def test_every_run_a_result_reused_is_carried_by_it_or_by_a_result_it_reuses() -> None:
    """A result that adopts runs (--reuse-from) carries only those its sources do not; so when a source's cell
    is set aside (a preset changed), the result must carry that cell's runs itself, or a rerun on a fresh
    checkout trains new runs in their place. Each completed run of its summary is found by its final return."""
    for entry in manifest.load(ROOT).entries:
        if not entry.produced or entry.output is None or "--reuse-from" not in entry.command:
            continue
        folders = [ROOT / entry.folder / manifest.CARRIED / entry.output, *manifest.reuse_sources(ROOT, entry)]
        with open(ROOT / entry.folder / "summary.csv", newline="") as f:
            rows = [row for row in csv.DictReader(f) if row["status"] == "completed"]
        lost = [row["run_dir"] for row in rows
                if not any(_final_return(folder / row["run_dir"]) == float(row["final_eval_return_mean"])
                           for folder in folders)]  # fmt: skip
        assert not lost, f"{entry.name}: no carried folder holds these runs; put them back under its output folder (from the commit that carried them) and `testbed results save` it: {lost}"


def _final_return(run_dir: Path) -> float | None:
    path = run_dir / "summary.json"
    return json.loads(path.read_text()).get("final_eval_return_mean") if path.is_file() else None


def _toy(tmp_path: Path, command: str, **extra: object) -> manifest.Manifest:
    entry = {"name": "toy", "title": "Toy", "about": "a toy result", "command": command, "output": "out",
             "folder": "benchmarks/results/toy", "keep": ["report.md", "plots"], "page": "report.md",
             "seeds": "0", "budget": "none", "cost": "cheap", **extra}  # fmt: skip
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / manifest.MANIFEST).write_text(yaml.safe_dump({"code_version": 3, "results": [entry]}))
    return manifest.load(tmp_path)


WRITE = ("python -c \"import pathlib; p = pathlib.Path('out/plots'); p.mkdir(parents=True); "
         "(p / 'curve.png').write_bytes(b'png'); pathlib.Path('out/report.md').write_text("
         "'# Report\\n\\n![curve](plots/curve.png) and [the code](../../agents/ppo.py)\\n'); print('7 passed in 1.50s')\"")


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
    body = page.split("Kept files")[1]
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
    add = ("python -c \"import pathlib, yaml; p = pathlib.Path('benchmarks/manifest.yaml'); m = yaml.safe_load(p.read_text()); "
           "m['results'].append({**m['results'][0], 'name': 'added'}); p.write_text(yaml.safe_dump(m)); "
           "pathlib.Path('out').mkdir(); pathlib.Path('out/report.md').write_text('# R'); pathlib.Path('out/plots').mkdir()\"")
    found = _toy(tmp_path, add)
    manifest.rerun(tmp_path, found, found.entry("toy"))
    after = manifest.load(tmp_path)
    assert after.names() == ["toy", "added"]
    assert after.entry("toy").produced and not after.entry("added").produced


def test_a_failed_rerun_changes_neither_the_kept_files_nor_the_manifest(tmp_path: Path) -> None:
    found = _toy(tmp_path, "python -c \"import sys; sys.exit(3)\"")
    before = (tmp_path / manifest.MANIFEST).read_text()
    with pytest.raises(BadInput, match="exited with status 3"):
        manifest.rerun(tmp_path, found, found.entry("toy"))
    assert (tmp_path / manifest.MANIFEST).read_text() == before
    assert not (tmp_path / "benchmarks/results/toy").exists()


def test_a_failed_rerun_still_carries_out_the_runs_it_trained_and_says_so(tmp_path: Path) -> None:
    crash = ("python -c \"import pathlib, sys; d = pathlib.Path('runs/bench/toy/seed0'); d.mkdir(parents=True); "
             "(d / 'config.yaml').write_text('seed: 0'); sys.exit(3)\"")
    found = _toy(tmp_path, crash, carry=["runs/bench/toy"])
    with pytest.raises(BadInput, match="unchanged; its runs as they stand are in benchmarks/results/toy/carried"):
        manifest.rerun(tmp_path, found, found.entry("toy"))
    assert (tmp_path / "benchmarks/results/toy/carried/runs/bench/toy/seed0/config.yaml").read_text() == "seed: 0"
    assert not manifest.load(tmp_path).entry("toy").produced


# A run that writes what a trainer writes, then reports which of its files it found when it started.
RUN = ("python -c \"import pathlib; d = pathlib.Path('runs/bench/toy/seed0'); found = sorted(p.name for p in d.glob('*')) "
       "if d.is_dir() else []; d.mkdir(parents=True, exist_ok=True); n = len(list(d.glob('ckpt*'))); "
       "[(d / f).write_text(f) for f in ('config.yaml', f'ckpt{n}.pt', 'events.out.tfevents.1', '.lock')]; "
       "(d.parent / 'report.md').write_text('rebuilt by the bench'); "
       "pathlib.Path('out').mkdir(exist_ok=True); pathlib.Path('out/report.md').write_text(str(found)); "
       "pathlib.Path('out/plots').mkdir(exist_ok=True)\"")


def test_carried_runs_travel_with_the_checkout_and_never_replace_local_files(tmp_path: Path) -> None:
    found = _toy(tmp_path, RUN, carry=["runs/bench/toy*"])
    manifest.rerun(tmp_path, found, found.entry("toy"))
    carried = tmp_path / "benchmarks/results/toy/carried/runs/bench/toy/seed0"
    assert sorted(p.name for p in carried.iterdir()) == ["ckpt0.pt", "config.yaml"]  # no events, no lock
    assert not (carried.parent / "report.md").exists()  # nor what the bench makes again from its runs
    shutil.rmtree(tmp_path / "runs")  # a new checkout: `results restore` brings the runs back by hand…
    restore = subprocess.run([sys.executable, "-m", "lab.cli", "results", "restore", "toy"], cwd=tmp_path,
                             capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert restore.returncode == 0 and "→ runs/bench/toy/seed0" in restore.stdout, restore.stderr
    assert (tmp_path / "runs/bench/toy/seed0/ckpt0.pt").read_text() == "ckpt0.pt"
    shutil.rmtree(tmp_path / "runs")  # …and a rerun before its command starts
    manifest.rerun(tmp_path, found, found.entry("toy"))
    assert (tmp_path / "out/report.md").read_text() == "['ckpt0.pt', 'config.yaml']"
    assert sorted(p.name for p in carried.iterdir()) == ["ckpt0.pt", "ckpt1.pt", "config.yaml"]
    local = tmp_path / "runs/bench/toy/seed0"
    for f in local.iterdir():
        f.unlink()
    (local / "mine.txt").write_text("newer")  # a folder with files of its own is left as it is
    assert manifest.carry_in(tmp_path, found.entry("toy")) == []
    assert sorted(p.name for p in local.iterdir()) == ["mine.txt"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(BadInput, match="under runs/"):
        _toy(elsewhere, RUN, carry=["/etc"])


STOPPABLE = ("python -c \"import pathlib, signal, sys, time; d = pathlib.Path('runs/bench/toy/seed0'); "
             "d.mkdir(parents=True); signal.signal(signal.SIGINT, lambda *a: ((d / 'checkpoint.pt').write_text('at stop'), "
             "sys.exit(1))); print('ready', flush=True); time.sleep(60)\"")


def test_runs_adopted_with_reuse_from_are_not_carried_twice(tmp_path: Path) -> None:
    def write(folder: Path, files: dict[str, str]) -> None:
        for name, text in files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)

    adopted = {"ppo/seed0/config.yaml": "ppo", "ppo/seed0/checkpoint.pt": "weights", "ppo/seed0.log": "log",
               "grpo/seed0/config.yaml": "grpo"}  # fmt: skip
    write(tmp_path / "runs/bench/suite", {**adopted, "grpo/seed0/progress.csv": "the suite's run"})
    # The bench adopted PPO's run as it was; its GRPO run shares a config file with the suite's, no more.
    write(tmp_path / "runs/bench/toy", {**adopted, "grpo/seed0/progress.csv": "a longer run", "bench.yaml": "grid"})
    # A second bench it adopted from holds a SAC run the toy bench keeps as it came.
    write(tmp_path / "runs/bench/other", {"sac/seed0/config.yaml": "sac"})
    write(tmp_path / "runs/bench/toy", {"sac/seed0/config.yaml": "sac"})
    found = _toy(tmp_path, "python -c pass --reuse-from runs/bench/suite --reuse-from runs/bench/other",
                 carry=["runs/bench/toy"])  # fmt: skip
    manifest.carry_out(tmp_path, found.entry("toy"))
    carried = tmp_path / "benchmarks/results/toy/carried/runs/bench/toy"
    assert sorted(str(p.relative_to(carried)) for p in carried.rglob("*") if p.is_file()) == [
        "bench.yaml", "grpo/seed0/config.yaml", "grpo/seed0/progress.csv"]  # the GRPO run whole, not half
    shutil.rmtree(tmp_path / "runs/bench/toy")
    manifest.carry_in(tmp_path, found.entry("toy"))  # a new checkout; the bench adopts PPO's run again
    assert (tmp_path / "runs/bench/toy/grpo/seed0/progress.csv").read_text() == "a longer run"


def test_a_stopped_rerun_passes_the_stop_on_once_and_carries_what_the_command_saved(tmp_path: Path) -> None:
    _toy(tmp_path, STOPPABLE, carry=["runs/bench/toy"])
    code = "from pathlib import Path; from lab import manifest; m = manifest.load(Path('.')); manifest.rerun(Path('.'), m, m.entry('toy'))"
    driver = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert driver.stdout is not None and driver.stdout.readline().strip() == "ready"
    driver.send_signal(signal.SIGTERM)  # as `kill` does; the command is in a session of its own
    assert driver.wait(timeout=30) != 0
    carried = tmp_path / "benchmarks/results/toy/carried/runs/bench/toy/seed0/checkpoint.pt"
    assert carried.read_text() == "at stop"
    assert not manifest.load(tmp_path).entry("toy").produced


def test_an_older_result_is_marked_and_a_missing_one_says_how_to_make_it(tmp_path: Path) -> None:
    found = _toy(tmp_path, WRITE)
    assert "Not produced yet: `testbed results run toy`" in pages.result_page(tmp_path, found, found.entry("toy"))
    assert "## Not produced yet" in pages.index_page(found)
    older = manifest.Manifest(found.code_version, tuple(
        manifest.Entry(**{**e.__dict__, "produced": {"commit": "abc1234", "code_version": 2}}) for e in found.entries))  # fmt: skip
    (tmp_path / "benchmarks/results/toy").mkdir(parents=True)
    (tmp_path / "benchmarks/results/toy/report.md").write_text("# R\n\n## Part\n\n```\n# not a heading\n```\n")
    page = pages.result_page(tmp_path, older, older.entry("toy"))
    assert "!!! warning \"From older code\"" in page and "commit abc1234" in page
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
    assert "!!! note \"In progress\"" in page and "the 2 runs finished so far" in page and "two cells so far" in page
    assert f"commit {progress['commit']}" in page and "Not produced yet" not in page
    index = pages.index_page(saved)
    assert "## In progress" in index and "## Not produced yet" not in index
    updated = manifest.rerun(tmp_path, saved, saved.entry("toy"))  # the command finishes: progress is over
    assert updated.entry("toy").produced and not manifest.load(tmp_path).entry("toy").progress
    assert "In progress" not in pages.result_page(tmp_path, updated, updated.entry("toy"))
    (out / "report.md").write_text("# Report\n\nsomething else\n")
    assert manifest.keep_progress(tmp_path, updated, updated.entry("toy")) is None  # a produced result keeps its files
    assert "something else" not in (tmp_path / "benchmarks/results/toy/report.md").read_text()


def test_bad_manifests_and_selections_are_refused_before_any_work(tmp_path: Path) -> None:
    found = _toy(tmp_path, WRITE)
    with pytest.raises(BadInput, match="one of the three"):
        manifest.select(found, [], False, False)
    with pytest.raises(BadInput, match="no result named 'nope'.*toy"):
        manifest.select(found, ["nope"], False, False)
    assert [e.name for e in manifest.select(found, [], False, True)] == ["toy"]
    (tmp_path / manifest.MANIFEST).write_text(yaml.safe_dump({"code_version": 1, "results": [{"name": "x", "cost": "huge"}]}))
    with pytest.raises(BadInput, match="lacks"):
        manifest.load(tmp_path)
    (tmp_path / manifest.MANIFEST).write_text("code_version: 1\nresults:\n- name: x\n  about: two parts: one\n")
    with pytest.raises(BadInput, match="not valid YAML at line 4, column 19 .*quote a text"):
        manifest.load(tmp_path)
    with pytest.raises(BadInput, match="README.md lacks the block"):
        pages.fill_blocks("no markers here", {"results-table": "x"})
    assert pages.fill_blocks("a\n<!-- BEGIN generated: t -->\nold\n<!-- END generated: t -->\nb", {"t": "new"}) == \
        "a\n<!-- BEGIN generated: t -->\nnew\n<!-- END generated: t -->\nb"


def test_the_readme_mujoco_sentence_reads_the_suite_report(tmp_path: Path) -> None:
    found = _toy(tmp_path, WRITE, name=pages.SUITE, folder="benchmarks/results/suite", seeds="0–4",
                 produced={"commit": "abc1234", "date": "2026-12-04", "code_version": 3})  # fmt: skip
    report = tmp_path / "benchmarks/results/suite/report.md"
    report.parent.mkdir(parents=True)
    # As lab.published and lab.normalized write them; a per-env table above has the same first column.
    report.write_text(
        "| algo | seeds completed | final return (mean) |\n|---|---|---|\n| ppo | 5 | 1.0 [0.5, 1.5] | x |\n\n"
        "grpo at or above 1 of 6 figures (below: A-v5 (final), B-v5 (final), B-v5 (best point), C-v5 (final), "
        "D-v5 (final)); ppo at or above 5 of 6 figures (below: B-v5 (final)); sb3-ppo at or above 6 of 6 figures.\n\n"
        "## Normalized scores across envs\n\n| algo | IQM | median |\n|---|---|---|\n"
        "| ppo | 1.128 [1.109, 1.149] | 1.053 [1.053, 1.074] |\n| sb3-ppo | -0.100 [-0.200, 0.050] | 0.9 [0.8, 1.0] |\n\n"
        "| X | Y | P(X > Y) | 95% CI |\n|---|---|---|---|\n| sb3-ppo | ppo | 0.555 | [0.433, 0.676] |\n"
        "| ppo | sb3-ppo | 0.445 | [0.324, 0.567] |\n"
    )  # fmt: skip
    # Means by task: A ppo 1 < sb3 2, grpo 0 < ppo 1; B ppo (3 + 1)/2 = 2 > 1; C ppo (1 + 3)/2 = 2 < 2.5.
    (report.parent / "summary.csv").write_text(
        "algo,env_id,seed,status,final_eval_return_mean\n"
        "ppo,A-v5,0,completed,1\nsb3-ppo,A-v5,0,completed,2\ngrpo,A-v5,0,completed,0\n"
        "ppo,B-v5,0,completed,3\nppo,B-v5,1,completed,1\nsb3-ppo,B-v5,0,completed,1\ngrpo,B-v5,0,interrupted,\n"
        "ppo,C-v5[x=1],0,completed,1\nppo,C-v5[x=1],1,completed,3\nsb3-ppo,C-v5[x=1],0,completed,2.5\n"
    )  # fmt: skip
    assert pages.suite_summary(tmp_path, found) == (
        f"On the MuJoCo v5 suite ([results](docs/results/{pages.SUITE}.md), seeds 0–4, 2026-12-04), the best published "
        "PPO figures met, each by its source's protocol: grpo 1 of 6, ppo 5 of 6 (not B-v5 (final)), sb3-ppo 6 of 6. "
        "IQM normalized score across the envs [95% CI]: ppo 1.128 [1.109, 1.149], sb3-ppo -0.100 [-0.200, 0.050]; "
        "P(ppo > sb3-ppo) = 0.445 [0.324, 0.567]. Mean final return by task: grpo below ppo on 1 of 1; ppo below "
        "sb3-ppo on 2 of 3 (all but B-v5)."
    )
    assert pages.trailing(pages.completed_runs(tmp_path, found.entry(pages.SUITE)), "sb3-ppo", "ppo") == \
        "sb3-ppo below ppo on 1 of 3 (B-v5)"
    # Once each check is produced, the sentence adds its IQMs and P, in CHECKS' order.
    (seeds_check, _), (scale_check, _) = pages.CHECKS
    listed = yaml.safe_load((tmp_path / manifest.MANIFEST).read_text())
    checks = [{**listed["results"][0], "name": name, "folder": f"benchmarks/results/{name}", "seeds": "0–7"}
              for name in (scale_check, seeds_check)]  # fmt: skip
    (tmp_path / manifest.MANIFEST).write_text(yaml.safe_dump({**listed, "results": [*listed["results"], *checks]}))
    for name, iqm, p in ((seeds_check, "1.2 [1.1, 1.3]", "0.55"), (scale_check, "1.3 [1.2, 1.4]", "0.60")):
        (tmp_path / "benchmarks/results" / name).mkdir()
        (tmp_path / "benchmarks/results" / name / "report.md").write_text(
            "## Normalized scores across envs\n\n| algo | IQM | median |\n|---|---|---|\n"
            f"| ppo | {iqm} | 1.0 [1.0, 1.0] |\n| sb3-ppo | 1.1 [1.0, 1.2] | 1.0 [1.0, 1.0] |\n\n"
            f"| X | Y | P(X > Y) | 95% CI |\n|---|---|---|---|\n| ppo | sb3-ppo | {p} | [0.45, 0.65] |\n"
        )  # fmt: skip
    assert pages.suite_summary(tmp_path, manifest.load(tmp_path)).endswith(
        f"sb3-ppo on 2 of 3 (all but B-v5). Both PPOs on seeds 0–7 ([results](docs/results/{seeds_check}.md), "
        "2026-12-04): IQM ppo 1.2 [1.1, 1.3], sb3-ppo 1.1 [1.0, 1.2]; P(ppo > sb3-ppo) = 0.55 [0.45, 0.65]. "
        "Ours at SB3's reward scale (`ppo.reward_norm_restart=done`, the one hyperparameter in which the pair's "
        f"runs differ), seeds 0–7 ([results](docs/results/{scale_check}.md), 2026-12-04): IQM ppo 1.3 [1.2, 1.4], "
        "sb3-ppo 1.1 [1.0, 1.2]; P(ppo > sb3-ppo) = 0.60 [0.45, 0.65]."
    )
    (tmp_path / "benchmarks/results" / scale_check / "report.md").write_text("# A report from before the comparison\n")
    with pytest.raises(BadInput, match=f"rebuild it with `testbed results run {scale_check}`"):
        pages.suite_summary(tmp_path, manifest.load(tmp_path))
    report.write_text("# A report from before the comparison\n")
    with pytest.raises(BadInput, match=f"rebuild it with `testbed results run {pages.SUITE}`"):
        pages.suite_summary(tmp_path, found)


def test_the_training_guide_table_sets_ours_at_both_scales_beside_sb3s(tmp_path: Path) -> None:
    (seeds_check, _), (scale_check, _) = pages.CHECKS
    _toy(tmp_path, WRITE, name=seeds_check, folder="benchmarks/results/a", seeds="0–1",
         produced={"commit": "abc1234", "date": "2026-12-04", "code_version": 3})  # fmt: skip
    listed = yaml.safe_load((tmp_path / manifest.MANIFEST).read_text())
    scaled = {**listed["results"][0], "name": scale_check, "folder": "benchmarks/results/b", "produced": None,
              "progress": {"commit": "def5678", "date": "2026-12-05", "code_version": 3}}  # fmt: skip
    (tmp_path / manifest.MANIFEST).write_text(yaml.safe_dump({**listed, "results": [*listed["results"], scaled]}))
    # SB3's runs are the same in both; ours as it is makes 1 and 3 on A, ours at SB3's scale 4 and 6.
    for folder, ours, p_a in (("a", (1, 3), "0.250"), ("b", (4, 6), "1.000")):
        (tmp_path / "benchmarks/results" / folder).mkdir(parents=True)
        (tmp_path / "benchmarks/results" / folder / "summary.csv").write_text(
            "algo,env_id,seed,status,final_eval_return_mean\n"
            f"ppo,A-v5[x=1],0,completed,{ours[0]}\nppo,A-v5[x=1],1,completed,{ours[1]}\nppo,A-v5[x=1],2,failed,\n"
            "sb3-ppo,A-v5[x=1],0,completed,2\nsb3-ppo,A-v5[x=1],1,completed,2\n"
            "ppo,B-v5,0,completed,-1.5\nsb3-ppo,B-v5,0,completed,-1\n"
        )  # fmt: skip
        (tmp_path / "benchmarks/results" / folder / "report.md").write_text(
            "## Normalized scores across envs\n\n| algo | IQM | median |\n|---|---|---|\n"
            f"| ppo | 1.{folder == 'b':d} [0.9, 1.1] | 1.0 [1.0, 1.0] |\n| sb3-ppo | 1.5 [1.4, 1.6] | 1.0 [1.0, 1.0] |\n\n"
            "| X | Y | P(X > Y) | 95% CI |\n|---|---|---|---|\n| ppo | sb3-ppo | 0.5 | [0.4, 0.6] |\n\n"
            "| env | X | Y | P(X > Y) | 95% CI |\n|---|---|---|---|---|\n"
            f"| A-v5[x=1] | ppo | sb3-ppo | {p_a} | [0.000, 1.000] |\n| B-v5 | ppo | sb3-ppo | 0.000 | [0.000, 0.000] |\n"
        )  # fmt: skip
    rows = ["| A-v5 | 2.00, P = 0.250 [0.000, 1.000] | 5.00, P = 1.000 [0.000, 1.000] | 2.00 |",
            "| B-v5 | -1.50, P = 0.000 [0.000, 0.000] | -1.50, P = 0.000 [0.000, 0.000] | -1.00 |"]  # fmt: skip
    links = (f"[Ours and SB3's](results/{seeds_check}.md), [ours at SB3's scale](results/{scale_check}.md)")
    head = "| task | ours | ours at SB3's scale | SB3's |\n|---|---|---|---|\n"
    # In progress, the IQMs would span different tasks, so they wait.
    assert pages.scale_table(tmp_path, manifest.load(tmp_path)) == (
        head + "\n".join(rows) + "\n\nMean final return over seeds 0–1 and P(ppo > sb3-ppo) on each task [95% CI]. "
        f"In progress: 2 tasks so far. {links}, 2026-12-05.")  # fmt: skip
    listed = yaml.safe_load((tmp_path / manifest.MANIFEST).read_text())
    listed["results"][1].update(produced={"commit": "def5678", "date": "2026-12-06", "code_version": 3}, progress=None)
    (tmp_path / manifest.MANIFEST).write_text(yaml.safe_dump(listed))
    assert pages.scale_table(tmp_path, manifest.load(tmp_path)) == (
        head + "\n".join([*rows, "| IQM normalized score | 1.0 [0.9, 1.1] | 1.1 [0.9, 1.1] | 1.5 [1.4, 1.6] |"])
        + f"\n\nMean final return over seeds 0–1 and P(ppo > sb3-ppo) on each task [95% CI]; IQM across the tasks "
        f"[95% CI]. {links}, 2026-12-06.")  # fmt: skip
    (tmp_path / "benchmarks/results/b/report.md").write_text("# A report from before the comparison\n")
    with pytest.raises(BadInput, match=f"rebuild them with `testbed results run {seeds_check} {scale_check}`"):
        pages.scale_table(tmp_path, manifest.load(tmp_path))


def test_the_guide_blocks_copy_a_figure_s_tables_and_average_a_credit_study(tmp_path: Path) -> None:
    figure = "# Title\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nCaption one.\n\nA note.\n\n## Part\n\n| c |\n|---|\n| 3 |\n"
    assert pages.figure_tables(figure) == ["| a | b |\n|---|---|\n| 1 | 2 |\n\nCaption one.", "| c |\n|---|\n| 3 |"]
    found = _toy(tmp_path, WRITE, folder="benchmarks/results/study", produced={"commit": "abc1234", "code_version": 3})
    (tmp_path / "benchmarks/results/study").mkdir(parents=True)
    header = "algo,env_id,seed,status,final_eval_return_mean\n"
    runs = ["ppo,testbed/Chain-v0[horizon=100],0,completed,1.0", "ppo,testbed/Chain-v0[horizon=100],1,completed,0.5",
            "ppo,testbed/Chain-v0[horizon=20],0,completed,0.25", "ppo,testbed/Chain-v0[horizon=20],1,failed,",
            "grpo,testbed/Chain-v0[horizon=20],0,completed,-1.0"]  # fmt: skip
    (tmp_path / "benchmarks/results/study/summary.csv").write_text(header + "\n".join(runs) + "\n")
    (tmp_path / "docs/figures").mkdir(parents=True)
    (tmp_path / "docs/figures/f.md").write_text(figure)
    guide = ("<!-- BEGIN generated: figures/f.md table 2 -->\n<!-- END generated: figures/f.md table 2 -->\n"
             "<!-- BEGIN generated: credit toy -->\n<!-- END generated: credit toy -->")  # fmt: skip
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
    rows = ["testbed/Chain-v0[horizon=100],ppo,0,5000,checkpoint-at-5000.pt,gae(1),all,0.5",
            "testbed/Chain-v0[horizon=100],ppo,1,5000,checkpoint-at-5000.pt,gae(1),all,0.25",
            "testbed/Chain-v0[horizon=100],ppo,1,5000,checkpoint-at-5000.pt,gae(1),1–9,0.9",  # a bin: not counted
            "testbed/Chain-v0[horizon=20],ppo,0,5000,checkpoint-at-5000.pt,gae(1),all,",  # no score: a dash
            "testbed/Chain-v0[horizon=20],grpo,0,5000,checkpoint-at-5000.pt,outcome,all,-0.125",
            "testbed/Chain-v0[horizon=20],grpo,0,9000,checkpoint.pt,outcome,all,1.0"]  # another checkpoint  # fmt: skip
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
    done = subprocess.run([sys.executable, "-m", "lab.cli", "results", "run", "no-such-result"], cwd=ROOT,
                          capture_output=True, text=True)  # fmt: skip
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
