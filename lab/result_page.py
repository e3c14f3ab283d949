"""One result's page of the site, made from its manifest entry and the files it keeps, in the order a reader
wants it: the scores by task and algo, the kept report's tables and figures, how it was produced, then the
entry's own words about it.

The site reaches the kept files through ``docs/results/files``, a link to ``benchmarks/results``, so a page
shows a report's figures where they are committed instead of a copy of them, and links the kept data files;
``docs/hooks/kept_files.py`` carries into the site only the files a page links to.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from urllib.parse import quote, unquote

import numpy as np

from envs.errors import BadInput
from lab.document import DASH, fmt_ci, fmt_return, markdown_table
from lab.manifest import Entry, Manifest
from lab.results import natural_key
from lab.stats import FEW_SEEDS, bootstrap_ci, few_seeds_note, mark_few

RESULTS = Path("benchmarks/results")
FILES = "files"  # docs/results/files -> ../../benchmarks/results
# A label may hold one level of brackets: an env variant's alt text, "Ant-v5[include_…=False]: …".
LINK = re.compile(r"(!?\[(?:[^\[\]]|\[[^\]]*\])*\])\(([^)\s]+)\)")


def _demote(markdown: str) -> str:
    """Headings one level down (the page's own title is the only ``#``), code blocks left alone."""
    lines, fenced = [], False
    for line in markdown.splitlines():
        fenced ^= line.startswith("```")
        lines.append("#" + line if not fenced and re.match(r"#{1,5} ", line) else line)
    return "\n".join(lines)


def _relink(markdown: str, root: Path, source: Path) -> str:
    """Point relative links of a kept file at the files under ``docs/results/files``. A link that leaves
    ``benchmarks/results`` or names a Markdown file (kept files are not pages) keeps only its text, so the
    site never has a broken link."""
    results = (root / RESULTS).resolve()

    def one(match: re.Match[str]) -> str:
        label, target = match.group(1), match.group(2)
        if re.match(r"[a-z]+:|#|/", target):
            return match.group(0)
        path, _, anchor = target.partition("#")
        resolved = (root / source.parent / unquote(path)).resolve()  # reports percent-encode [ ] = in names
        if not resolved.is_relative_to(results) or resolved.suffix == ".md" or not resolved.exists():
            return label.lstrip("!").strip("[]")
        return f"{label}({FILES}/{quote(resolved.relative_to(results).as_posix())}{'#' + anchor if anchor else ''})"

    return LINK.sub(one, markdown)


def summary_rows(root: Path, entry: Entry) -> list[dict[str, str]]:
    """The rows of an entry's kept summary.csv, one per run; none where it has none."""
    path = root / entry.folder / "summary.csv"
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def completed_runs(root: Path, entry: Entry) -> list[dict[str, str]]:
    """The rows of an entry's kept summary.csv whose run completed."""
    return [r for r in summary_rows(root, entry) if r["status"] == "completed"]


def final_returns(rows: list[dict[str, str]]) -> dict[tuple[str, str], list[float]]:
    """The final evaluation returns of summary rows, one per run, by (env label, algo)."""
    returns: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        returns.setdefault((r["env_id"], r["algo"]), []).append(float(r["final_eval_return_mean"]))
    return returns


def score_table(rows: list[dict[str, str]]) -> str:
    """Final return per env (rows) and algo (columns) over summary rows: the mean over the completed runs and its
    95% bootstrap CI, marked where fewer than 3 seeds make it (with the mark's footnote)."""
    completed = [r for r in rows if r.get("status") == "completed" and r.get("final_eval_return_mean")]
    algos = sorted({r["algo"] for r in completed})
    returns = final_returns(completed)
    table, few = [], []
    for env in sorted({r["env_id"] for r in completed}, key=natural_key):
        cells = [env]
        for algo in algos:
            scores = np.array(returns.get((env, algo), []))
            if not scores.size:
                cells.append(DASH)
                continue
            few += [scores.size] if scores.size < FEW_SEEDS else []
            cells.append(f"{fmt_return(float(scores.mean()))} {mark_few(fmt_ci(*bootstrap_ci(scores)), scores.size)}")
        table.append(cells)
    return markdown_table(["env", *algos], table) + (f"\n\n{few_seeds_note(min(few))}" if few else "")


def _scores(root: Path, entry: Entry) -> list[str]:
    """A result page's opening: :func:`score_table` of its kept summary.csv, if it keeps one with final returns."""
    rows = summary_rows(root, entry) if "summary.csv" in entry.keep else []
    if not any(r.get("status") == "completed" and r.get("final_eval_return_mean") and r.get("env_id") for r in rows):
        return []
    return [
        "## Final return by task and algo",
        "",
        score_table(rows),
        "",
        "The final evaluation return of each completed run (`summary.csv`): mean over seeds [95% bootstrap CI over "
        "seeds]. How each run was scored, and the rest of the report, follow.",
        "",
    ]


def _section(markdown: str, title: str) -> tuple[str, str]:
    """(``markdown`` without its ``### title`` section, that section), so that the section moves elsewhere on the
    page; (``markdown``, "") where there is none."""
    lines = markdown.splitlines()
    start = next((i for i, line in enumerate(lines) if line == f"### {title}"), None)
    if start is None:
        return markdown, ""
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"#{1,3} ", lines[i])), len(lines))
    return "\n".join(lines[:start] + lines[end:]), "\n".join(lines[start:end]).strip()


def _compute(root: Path, entry: Entry, report: str) -> list[list[str]]:
    """What the runs spent, as the report states it (its Compute and Wall-clock lines, lab.cost writes them),
    else the sum of the kept summary.csv's run times; the last invocation's time is only that."""
    rows = []
    if found := re.search(r"^- Compute: ([\d,]+) env steps in ([\d.e+]+) core-hours", report, re.MULTILINE):
        rows.append(["compute", f"{found.group(2)} core-hours for {found.group(1)} env steps, all its runs"])
    if found := re.search(r"^- Wall-clock: ([\d.e+]+) h in (\d+ invocations?) of `testbed bench`", report, re.M):
        rows.append(["wall-clock", f"{found.group(1)} h in {found.group(2)} of `testbed bench`, start to end"])
    summary = summary_rows(root, entry) if "summary.csv" in entry.keep and not rows else []
    if times := [float(r["wall_time_s"]) for r in summary if r.get("wall_time_s")]:
        rows.append(
            [
                "runs' wall time",
                f"{sum(times) / 3600:.3g} h, the sum over its {len(times)} runs (seeds trained side by side in one "
                "process each count the whole process)",
            ]
        )
    p = entry.produced or entry.progress
    if "wall_s" in p:
        reused = "; it reused runs an earlier invocation had finished" if p.get("reused_runs") else ""
        rows.append(["last run's wall time", f"{p['wall_s']:,.0f} s (the whole command, as last run{reused})"])
    return rows


def _kept(root: Path, entry: Entry, source: Path) -> str:
    """The kept files, each a link where the site carries it (a page's links): a Markdown file is shown as text
    (the page is made of it; the site builds no page of its own from it), a folder too (its figures are on
    the page)."""
    names, results = [], (root / RESULTS).resolve()
    for kept in entry.keep:
        path = root / entry.folder / kept
        if path.resolve() == (root / source).resolve():
            names.append(f"`{kept}` (this page)")
        elif path.is_file() and path.suffix != ".md" and path.resolve().is_relative_to(results):
            names.append(f"[{kept}]({FILES}/{quote(path.resolve().relative_to(results).as_posix())})")
        else:
            names.append(f"`{kept}/`" if path.is_dir() else f"`{kept}`")
    return f"Kept files, in `{entry.folder}/`: {', '.join(names)}."


def _notes(root: Path, manifest: Manifest, entry: Entry) -> list[str]:
    """The warnings that qualify every number of the page: from older code, or saved part way."""
    p, lines = entry.produced or entry.progress, []
    if manifest.older(entry):
        rerun = (
            f" That rerun is under way: the runs today's code has finished are kept in its folder (saved "
            f"{entry.progress.get('date')}), in place of the older ones, and the command continues from them."
        )
        lines += [
            f'!!! warning "From older code"\n    Produced at commit {p.get("commit", "not recorded")}, before a '
            "change to what the algorithms compute: the numbers may differ from today's code by more than seed "
            "noise. It is left out of the headline tables until it is rerun with "
            f"`testbed results run {entry.name}`." + (rerun if manifest.rerunning(entry) else ""),
            "",
        ]
    if manifest.in_progress(entry):
        runs = (
            f"the {len(completed_runs(root, entry))} runs finished so far"
            if "summary.csv" in entry.keep
            else "what its command had finished"
        )
        lines += [
            f'!!! note "In progress"\n    Saved part way on {p.get("date")} at commit {p.get("commit")}: {runs}, as '
            f"the command's last invocation reported them. `testbed results run {entry.name}` goes on with the "
            "rest; the numbers here are final for the runs they show.",
            "",
        ]
    return lines


def result_page(root: Path, manifest: Manifest, entry: Entry) -> str:
    """One result's page, in the order a reader wants it: the kept report's numbers and figures, then how they
    were produced (command, seeds, machine, code, what the runs spent, the kept files, the report's own account
    of what was run), then what the result is, in the entry's words."""
    shown, p = entry.page or entry.last_line, entry.produced or entry.progress
    source = Path(entry.folder) / (shown or "")
    body = (root / source).read_text() if shown and (root / source).exists() else ""
    if shown and not (root / source).exists():
        if p:
            raise BadInput(
                f"{entry.name}: {source} does not exist; make it again with `testbed results run {entry.name}`"
            )
        body = f"Not produced yet: `testbed results run {entry.name}` makes it."
    if body.startswith("# "):  # the page has its own title
        body = body.partition("\n")[2]
    rows = [
        ["command", f"`{entry.command}`"],
        ["seeds", entry.seeds],
        ["budget", entry.budget],
        ["machine", p.get("machine", "not recorded")],
        ["code", f"commit {p.get('commit', 'not recorded')}"],
        ["date", str(p.get("date", "not recorded"))],
        *_compute(root, entry, body),
    ]
    results, what_was_run = _section(_demote(_relink(body.strip(), root, source)), "What was run")
    scores = _scores(root, entry)
    lines = [
        f"# {entry.title}",
        "",
        *_notes(root, manifest, entry),
        *scores,
        *(["## The report", ""] if scores and results.strip() else []),
        results.strip(),
        "",
        "## How it was made",
        "",
        markdown_table(["", ""], rows),
        "",
        _kept(root, entry, source),
        "",
        *([what_was_run, ""] if what_was_run else []),
        "## About this result",
        "",
        entry.about,
        "",
    ]
    return "\n".join(lines)
