"""The result pages of the site and the generated blocks of the README and the guides, made from the manifest
and its files.

Nothing here is typed by hand: ``render_all`` reads ``benchmarks/manifest.yaml``, the files each entry
keeps and the figures ``testbed docs`` wrote, and returns the text of every generated page, of the README
and of the guides. ``testbed results pages`` writes them; a test checks that the committed ones are what
``render_all`` gives, so a page never disagrees with the files it shows.

One result's page is made by ``lab.result_page``; this module gathers them with the index, the README's
blocks and the guides' tables.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from envs.errors import BadInput
from lab.document import DASH, fmt_return, markdown_table
from lab.ledger import LEDGER, ledger_page
from lab.manifest import Entry, Manifest, load, pytest_line
from lab.result_page import completed_runs, final_returns, result_page, score_table, summary_rows
from lab.results import natural_key

PAGES = Path("docs/results")
README = Path("README.md")
GUIDE = Path("docs/ppo_and_grpo.md")
TRAINING = Path("docs/training.md")  # its sb3-ppo section holds the CHECKS' table
FIGURES = Path("docs/figures")
BUSY = "a busy machine is slower"
HEADLINE = "classic"  # the README's table and figure
CLONE = "clone-size"  # the README's clone line
# The README's speed sentence: one run against SB3's (the speed entry), then stacks against SB3's processes
# (entry, case), then what periodic evaluation costs a stack.
SPEED, EVAL_COST = "speed", "stacking-eval-cartpole"
STACKS = (("stacking-lunarlander-halfcheetah", "halfcheetah"), ("stacking-cartpole", "cartpole"))
FIGURE = "plots/LunarLander-v3-steps.png"
SUITE, REFERENCE = "mujoco-v5", ("ppo", "sb3-ppo")  # the README's MuJoCo summary, and the pair it compares
# The same pair on more seeds, then with its one differing setting made equal: each adds a sentence to the summary
# once produced, opening with its label ({seeds} is the entry's).
CHECKS = (
    ("mujoco-v5-ppo-sb3", "Both PPOs on seeds {seeds}"),
    (
        "ppo-sb3-reward-scale-v5",
        "Ours at SB3's reward scale (`ppo.reward_norm_restart=done`, the one hyperparameter in which the pair's runs "
        "differ), seeds {seeds}",
    ),
)
TRAILS = (("grpo", "ppo"), REFERENCE)  # the summary says on which tasks the first of each pair trails the second


def index_page(manifest: Manifest) -> str:
    """Every committed result, today's first, each with its command and where it was produced."""
    lines = [
        "# Results",
        "",
        "Every result the project commits, generated from `benchmarks/manifest.yaml` and the files each entry keeps. "
        "`testbed results run NAME` reruns one (finished runs are reused), `testbed results run --cheap` the cheap "
        "ones, `testbed results pages` rebuilds these pages and the README's tables. Final results use seeds that "
        f"tuning and sweeps never saw; what each algo spent on tuning, per env, is in [the tuning ledger]({LEDGER}).",
        "",
    ]
    groups = (
        ("Produced by today's algorithms", manifest.current),
        ("From older code", manifest.older),
        ("In progress", manifest.in_progress),
        ("Not produced yet", lambda e: not e.produced and not e.progress),
    )
    header = ["result", "command", "seeds", "machine", "commit, date"]
    for heading, belongs in groups:
        rows = []
        for e in filter(belongs, manifest.entries):
            p = e.produced or e.progress
            machine, made = str(p.get("machine", DASH)).split(";")[0], f"{p.get('commit', DASH)}, {p.get('date', DASH)}"
            rows.append([f"[{e.title}]({e.name}.md)", f"`{e.command}`", e.seeds, machine, made])
        lines += [f"## {heading}", "", markdown_table(header, rows), ""] if rows else []
    return "\n".join(lines)


def clone_line(root: Path, manifest: Manifest) -> str:
    """The README's clone line, from ``benchmarks/clone_size.py``'s measure: a full clone and a shallow one on
    disk, ``.git`` and tree together."""
    entry = manifest.entry(CLONE)
    path = root / entry.folder / "clone.json"
    if not path.exists():
        return f"Not measured yet: `testbed results run {CLONE}` measures what a clone weighs."
    sizes = json.loads(path.read_text())
    mb = {k: (sizes[k]["git_bytes"] + sizes[k]["tree_bytes"]) / 1e6 for k in ("full", "shallow")}
    return (
        f"A clone takes {mb['full']:,.0f} MB on disk with its history; `git clone --depth 1` takes the last commit "
        f"alone, {mb['shallow']:,.0f} MB (commit {sizes['commit']}, {entry.produced.get('date', 'not dated')}; [what a "
        f"clone weighs](docs/results/{CLONE}.md))."
    )


def _walls(root: Path, manifest: Manifest, name: str, file: str) -> dict[tuple[str, str], list[float]]:
    """Each completed process's wall time (exit status 0) in a speed result's CSV, by (case, impl); none when it
    was not measured."""
    path = root / manifest.entry(name).folder / file
    walls: dict[tuple[str, str], list[float]] = {}
    if path.exists():
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row["returncode"] == "0":
                    walls.setdefault((row["case"], row["impl"]), []).append(float(row["wall_s"]))
    return walls


def _dated(manifest: Manifest, name: str) -> str:
    """The link to a result's page, with its date, and the older-code caveat where it applies."""
    entry = manifest.entry(name)
    caveat = ", older code" if manifest.older(entry) else ""
    return f"[{entry.produced.get('date', 'not run')}{caveat}](docs/results/{name}.md)"


def speed_line(root: Path, manifest: Manifest) -> str:
    """The README's speed sentence, from the speed and stacking results' CSVs: SB3's median process time over
    ours for one run (``benchmarks/speed.py``), SB3's processes' total time over our stack's
    (``benchmarks/stacking.py``), and a stack's median time with periodic evaluation over without it."""
    speed = _walls(root, manifest, SPEED, "speed.csv")
    ratios = {
        case: float(np.median(speed[case, "sb3"]) / np.median(speed[case, "ours"]))
        for case in ("cartpole", "halfcheetah")
        if (case, "sb3") in speed and (case, "ours") in speed
    }
    if len(ratios) < 2:
        return f"Not measured yet: `testbed results run {SPEED}` times one run of ours against SB3's."
    text = (
        f"One PPO run is {ratios['cartpole']:.2f}× (CartPole) and {ratios['halfcheetah']:.2f}× (HalfCheetah) as fast "
        f"as SB3's with the same settings and gradient steps ({_dated(manifest, SPEED)})"
    )
    stacked = []
    for name, case in STACKS:
        walls = _walls(root, manifest, name, "stacking.csv")
        if (case, "stacked") in walls and (case, "sb3") in walls:
            ratio = sum(walls[case, "sb3"]) / sum(walls[case, "stacked"])
            shown = "HalfCheetah" if case == "halfcheetah" else "CartPole"
            stacked.append(f"{ratio:.2f}× on {shown} ({_dated(manifest, name)})")
    if stacked:
        text += f"; 8 seeds in one process are {' and '.join(stacked)} as fast as 8 SB3 processes"
    walls = _walls(root, manifest, EVAL_COST, "stacking.csv")
    if ("cartpole", "stacked_eval") in walls:
        cost = np.median(walls["cartpole", "stacked_eval"]) / np.median(walls.get(("cartpole", "stacked"), []))
        text += f"; periodic evaluation costs such a stack {cost:.2f}× its time ({_dated(manifest, EVAL_COST)})"
    return text + f". Each is a whole process on one core; {BUSY}."


def headline_table(root: Path, manifest: Manifest) -> str:
    """The README's table: final return per env and algo, mean over seeds and its 95% bootstrap CI."""
    entry = manifest.entry(HEADLINE)
    lines = [score_table(completed_runs(root, entry))]
    p = entry.produced
    caveat = "" if manifest.current(entry) else f" **From older code (commit {p.get('commit')}).**"
    if manifest.rerunning(entry):
        caveat += (
            f" Its rerun with today's algorithms is under way (runs so far kept on {entry.progress.get('date')}; "
            f"`testbed results run {entry.name}` continues it)."
        )
    lines += [
        "",
        f"Final evaluation return, mean over seeds {entry.seeds} [95% bootstrap CI], each algo at its preset's budget; "
        f"`{entry.command}` on {p.get('machine', 'an unrecorded machine')}, {p.get('date', 'undated')}, commit "
        f"{p.get('commit', 'not recorded')}.{caveat} [Every result](docs/results/index.md).",
    ]
    return "\n".join(lines)


def trailing(rows: list[dict[str, str]], x: str, y: str) -> str:
    """``x below y on K of N (…)``: the tasks, of those both ran, where x's mean final return over its completed
    runs is below y's; named where they are the fewer, else the tasks where it is not."""
    returns = final_returns(rows)
    envs = sorted({env for env, _ in returns if (env, x) in returns and (env, y) in returns})
    below = {env for env in envs if np.mean(returns[env, x]) < np.mean(returns[env, y])}
    few = 2 * len(below) <= len(envs)
    named = [env.split("[")[0] for env in envs if (env in below) == few]  # an env's options are left out
    which = f" ({'' if few else 'all but '}{', '.join(named)})" if named else ""
    return f"{x} below {y} on {len(below)} of {len(envs)}{which}"


def read_comparison(report: str) -> tuple[dict[str, str], str | None, dict[str, str]]:
    """From a bench report's normalized scores (lab.normalized writes them), each as "1.1 [1.0, 1.2]": each
    algo's IQM normalized score across the envs with its 95% CI; P(x > y) across the envs for the REFERENCE
    pair; and P(x > y) on each env alone, by env label. Empty, or None, where the report has none."""
    across = report[report.find("Normalized scores across envs") :]
    iqm = dict(re.findall(r"^\| (\S+) \| ([-\d.]+ \[[-\d.]+, [-\d.]+\]) \| [-\d.]+ \[", across, re.M))
    x, y = map(re.escape, REFERENCE)
    # The table across envs is the first whose rows begin with the pair; the one by env has the env first.
    better = re.search(rf"^\| {x} \| {y} \| ([\d.]+) \| (\[[\d.]+, [\d.]+\]) \|$", across, re.M)
    by_env = re.findall(rf"^\| (\S+) \| {x} \| {y} \| ([\d.]+) \| (\[[\d.]+, [\d.]+\]) \|$", report, re.M)
    return iqm, better and f"{better.group(1)} {better.group(2)}", {env: f"{p} {ci}" for env, p, ci in by_env}


def scale_table(root: Path, manifest: Manifest) -> str:
    """The training guide's table: on each task, our PPO as the suite runs it and at SB3's reward scale, each
    with P(ours > SB3's) [95% CI] on that task, beside SB3's PPO: mean final return over the seeds of CHECKS
    (SB3's runs are the same in both), then each one's IQM normalized score across the tasks."""
    x, y = REFERENCE
    entries = [manifest.entry(name) for name, _ in CHECKS]
    returns = [final_returns(completed_runs(root, entry)) for entry in entries]
    iqm, _, better = zip(*(read_comparison((root / entry.folder / "report.md").read_text()) for entry in entries))
    envs = sorted(set(better[0]) & set(better[1]))
    if not envs or not all(x in scores and y in scores for scores in iqm):
        names = " ".join(entry.name for entry in entries)
        raise BadInput(
            f"{entries[0].folder}/report.md and {entries[1].folder}/report.md need the IQM table and P({x} > {y}) by "
            f"env; rebuild them with `testbed results run {names}`"
        )

    def mean(k: int, env: str, algo: str) -> str:
        return fmt_return(float(np.mean(returns[k][env, algo])))

    table = [
        [
            env.split("[")[0],
            f"{mean(0, env, x)}, P = {better[0][env]}",
            f"{mean(1, env, x)}, P = {better[1][env]}",
            mean(1, env, y),
        ]
        for env in envs
    ]
    made, done = entries[1].produced or entries[1].progress, bool(entries[1].produced)
    if done:  # until then the two IQMs span different tasks
        table.append(["IQM normalized score", iqm[0][x], iqm[1][x], iqm[1][y]])
    return (
        markdown_table(["task", "ours", "ours at SB3's scale", "SB3's"], table) + "\n\n"
        f"Mean final return over seeds {entries[1].seeds} and P({x} > {y}) on each task [95% CI]"
        + ("; IQM across the tasks [95% CI]." if done else f". In progress: {len(envs)} tasks so far.")
        + f" [Ours and SB3's](results/{entries[0].name}.md), [ours at SB3's scale](results/{entries[1].name}.md), "
        f"{made.get('date', 'undated')}."
    )


def _compared(root: Path, entry: Entry) -> tuple[str, str]:
    """Each algo's IQM across the envs and P(x > y) for the REFERENCE pair, as the README words them ("ppo 1.1
    [1.0, 1.2], …" and "P(x > y) = p [lo, hi]"), from the entry's kept report."""
    iqm, better, _ = read_comparison((root / entry.folder / "report.md").read_text())
    if not iqm or better is None:
        raise BadInput(
            f"{entry.folder}/report.md lacks the IQM table or P({' > '.join(REFERENCE)}); rebuild it with `testbed "
            f"results run {entry.name}`"
        )
    return ", ".join(f"{algo} {value}" for algo, value in iqm.items()), f"P({' > '.join(REFERENCE)}) = {better}"


def suite_summary(root: Path, manifest: Manifest) -> str:
    """The README's MuJoCo sentence, read from the suite's kept report and summary: how many published figures
    each algo meets, each algo's IQM normalized score across the envs, P(ours > SB3's) on the same presets, and
    on which tasks GRPO trails our PPO and our PPO trails SB3's; then the same IQMs and P from each of CHECKS
    that is produced."""
    entry = manifest.entry(SUITE)
    # lab.published writes "ALGO at or above K of N figures (below: ENV (MEASURE), …)".
    report = (root / entry.folder / "report.md").read_text()
    met = re.findall(r"(\S+) at or above (\d+) of (\d+) figures(?: \(below: (.*?\))\))?", report)
    if not met:
        raise BadInput(
            f"{entry.folder}/report.md lacks the figures met, the IQM table or P({' > '.join(REFERENCE)}); rebuild it "
            f"with `testbed results run {SUITE}`"
        )
    # The figures missed are named where they are few; the report lists them all.
    figures = ", ".join(
        f"{algo} {k} of {n}" + (f" (not {below})" if below and int(n) - int(k) <= 3 else "")
        for algo, k, n, below in met
    )
    scores, better = _compared(root, entry)
    text = (
        f"On the MuJoCo v5 suite ([results](docs/results/{SUITE}.md), seeds {entry.seeds}, "
        f"{entry.produced.get('date', 'undated')}), the best published PPO figures met, each by its source's protocol: "
        f"{figures}. IQM normalized score across the envs [95% CI]: {scores}; {better}. Mean final return by task: "
        f"{'; '.join(trailing(completed_runs(root, entry), *pair) for pair in TRAILS)}."
    )
    produced = {e.name: e for e in manifest.entries if e.produced}
    for name, label in CHECKS:
        if check := produced.get(name):
            scores, better = _compared(root, check)
            text += (
                f" {label.format(seeds=check.seeds)} ([results](docs/results/{name}.md), "
                f"{check.produced.get('date', 'undated')}): IQM {scores}; {better}."
            )
    return text


def readme_blocks(root: Path, manifest: Manifest) -> dict[str, str]:
    """The text of each generated block of the README, by block name."""
    quick, tests, headline = manifest.entry("quick"), manifest.entry("tests"), manifest.entry(HEADLINE)
    runs = len(summary_rows(root, quick))
    qp, tp = quick.produced, tests.produced
    closing = root / tests.folder / (tests.last_line or "")
    counted = pytest_line(closing.read_text()) if tests.last_line and closing.exists() and "wall_s" in tp else None
    tests_text = f"the {counted[0]} tests took {counted[1]:.0f} s, {tp['wall_s']:.0f} s in all" if counted else ""
    return {
        "first-screen-bench": (
            f"The {runs} runs took {qp['wall_s']:.0f} s on {qp['machine']} ({qp['date']}); {BUSY}."
            if "wall_s" in qp
            else f"Not timed yet: `testbed results run quick` times it ({BUSY})."
        ),
        "first-screen-tests": (
            f"With `.ci/run` (a fresh virtual environment, the install, the linter, a dozen kill points of the fault "
            f"probe, then the tests), {tests_text} on {tp['machine']} ({tp['date']}); {BUSY}."
            if counted
            else f"Not timed yet: `testbed results run tests` times it ({BUSY})."
        ),
        "clone": clone_line(root, manifest),
        "speed": speed_line(root, manifest),
        "results-table": headline_table(root, manifest),
        "mujoco-summary": suite_summary(root, manifest),
        "results-figure": f"![LunarLander-v3: evaluation return against env steps]({headline.folder}/{FIGURE})\n\n"
        f"LunarLander-v3, evaluation return against env steps: mean over seeds {headline.seeds}, "
        f"shaded 95% bootstrap CI ([the report](docs/results/{headline.name}.md)).",
    }


def figure_tables(markdown: str) -> list[str]:
    """The tables of a figure's Markdown file, each with the paragraph under it (its caption); headings and
    the title stay behind, since the page that shows a table has its own."""
    parts: list[str] = []
    for block in re.split(r"\n\s*\n", markdown.strip()):
        if block.startswith("|"):
            parts.append(block)
        elif parts and not block.startswith("#") and not parts[-1].count("\n\n"):
            parts[-1] += "\n\n" + block
    return parts


def variant(env_label: str) -> str:
    """``horizon 300`` or ``reward delay 20`` from an env label such as ``testbed/Chain-v0[horizon=300]``."""
    match = re.search(r"\[(\w+)=([^\]]+)\]", env_label)
    return f"{match.group(1).replace('_', ' ')} {match.group(2)}" if match else env_label


def _mean_table(
    header: list[str], cells: list[tuple[tuple[str, ...], str, float | None]], shown: Callable[[list[float]], str]
) -> str:
    """The mean of each row key's values (rows) in each task variant (columns, in numeric order), as ``shown``
    writes a cell's values; a dash where there are none. ``cells``: (row key, variant, value or None)."""
    variants = sorted({v for _, v, _ in cells}, key=natural_key)
    table = []
    for key in sorted({k for k, _, _ in cells}):
        values = {v: [x for k, w, x in cells if (k, w) == (key, v) and x is not None] for v in variants}
        table.append([*key, *(shown(values[v]) if values[v] else DASH for v in variants)])
    return markdown_table([*header, *variants], table)


def _source(manifest: Manifest, entry: Entry) -> str:
    """Where a guide's table comes from: the result's page, command, seeds and commit."""
    caveat = ", **older code**" if manifest.older(entry) else ""
    return (
        f"[{entry.name}](results/{entry.name}.md): `{entry.command}`, seeds {entry.seeds}, commit "
        f"{entry.produced.get('commit', 'not recorded')}{caveat}"
    )


def credit_table(root: Path, manifest: Manifest, names: list[str]) -> str:
    """Final evaluation return by algo (rows) and task variant (columns: horizon, reward delay), the mean over
    the seeds of the studies ``names``, whose commands, seeds and commits the caption gives."""
    entries = [manifest.entry(name) for name in names]
    rows = [(entry.name, r) for entry in entries for r in completed_runs(root, entry)]
    if not rows:
        raise BadInput(f"{', '.join(names)}: no completed run; produce it with `testbed results run {' '.join(names)}`")
    studies_of = {a: {study for study, r in rows if r["algo"] == a} for a in {r["algo"] for _, r in rows}}
    # An algo that two studies ran is two rows: their settings may differ.
    cells = [
        (
            (r["algo"] if len(studies_of[r["algo"]]) == 1 else f"{r['algo']} ({study})",),
            variant(r["env_id"]),
            float(r["final_eval_return_mean"]),
        )
        for study, r in rows
    ]
    table = _mean_table(["algo"], cells, lambda v: f"{fmt_return(sum(v) / len(v))} ({len(v)})")
    return (
        f"{table}\n\nFinal evaluation return, the mean over seeds (their number in brackets). From "
        f"{'; '.join(_source(manifest, entry) for entry in entries)}."
    )


AUDIT_SCORES = {
    "rank_correlation": "Spearman's \\(r_s\\) between estimate and truth",
    "sign_agreement": "the share of clearly signed samples whose estimate has the truth's sign",
    "relative_mse": "MSE / Var[A]",
}


def audit_table(root: Path, manifest: Manifest, name: str, score: str, checkpoint: str) -> str:
    """One score of an audit (``testbed audit``'s scores.csv) by algo and estimator (rows) and env variant
    (columns), over all samples of the checkpoint files named ``checkpoint``, the mean over seeds."""
    entry = manifest.entry(name)
    if score not in AUDIT_SCORES:
        raise BadInput(f"{GUIDE}: audit block: score {score!r} is not one of {', '.join(AUDIT_SCORES)}")
    source = root / entry.folder / "scores.csv"
    if not source.exists():
        raise BadInput(f"{name}: {source.relative_to(root)} is missing; produce it with `testbed results run {name}`")
    with open(source, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["steps_left"] == "all" and r["checkpoint"] == f"{checkpoint}.pt"]
    if not rows:
        raise BadInput(f"{name}: no audited checkpoint {checkpoint}.pt in {source.relative_to(root)}")
    cells = [((r["algo"], r["estimator"]), variant(r["env"]), float(r[score]) if r[score] else None) for r in rows]
    table = _mean_table(["algo", "estimator"], cells, lambda v: f"{sum(v) / len(v):.2f}")
    return (
        f"{table}\n\n{AUDIT_SCORES[score][0].upper()}{AUDIT_SCORES[score][1:]}, at the checkpoints `{checkpoint}.pt`, "
        f"the mean over seeds; {DASH}: no sample had a clear sign, or the truth did not vary. From "
        f"{_source(manifest, entry)}."
    )


def guide_blocks(root: Path, manifest: Manifest, text: str) -> dict[str, str]:
    """The guide's generated blocks, by the name each marker gives:

    - ``figures/NAME.md`` or ``figures/NAME.md table K``: the tables (or the K-th, from 1) of a figure's
      Markdown file that ``testbed docs`` wrote;
    - ``credit NAME …``: :func:`credit_table` of the credit studies named;
    - ``audit NAME SCORE CHECKPOINT``: :func:`audit_table`, one score of an audit at one kind of checkpoint.
    """
    blocks = {}
    for name in re.findall(r"<!-- BEGIN generated: (.+?) -->", text):
        figure = re.fullmatch(r"figures/([\w-]+\.md)(?: table (\d+))?", name)
        if figure:
            source = root / FIGURES / figure.group(1)
            if not source.exists():
                raise BadInput(
                    f"{GUIDE}: the block {name!r} names {source.relative_to(root)}, which `testbed docs` did not "
                    "write; name one of docs/figures/*.md"
                )
            tables = figure_tables(source.read_text())
            k = int(figure.group(2) or 0)
            if k > len(tables):
                raise BadInput(f"{GUIDE}: {name!r}: {figure.group(1)} has {len(tables)} tables")
            blocks[name] = tables[k - 1] if k else "\n\n".join(tables)
        elif name.startswith("credit "):
            blocks[name] = credit_table(root, manifest, name.split()[1:])
        elif name.startswith("audit ") and len(name.split()) == 4:
            blocks[name] = audit_table(root, manifest, *name.split()[1:])
        else:
            raise BadInput(
                f"{GUIDE}: unknown generated block {name!r}; use `figures/NAME.md [table K]`, `credit STUDY …` or "
                "`audit STUDY SCORE CHECKPOINT`"
            )
    return blocks


def fill_blocks(text: str, blocks: dict[str, str], where: Path = README) -> str:
    """Replace what stands between ``<!-- BEGIN generated: NAME -->`` and its END marker."""
    for name, content in blocks.items():
        pattern = re.compile(
            rf"(<!-- BEGIN generated: {re.escape(name)} -->\n).*?(\n<!-- END generated: {re.escape(name)} -->)", re.S
        )
        text, found = pattern.subn(lambda m, content=content: m.group(1) + content + m.group(2), text)
        if not found:
            raise BadInput(
                f"{where} lacks the block `<!-- BEGIN generated: {name} -->` … `<!-- END generated: {name} -->`"
            )
    return text


def render_all(root: Path) -> dict[Path, str]:
    """Every generated file (relative to ``root``) and the text it must hold."""
    manifest = load(root)
    out = {PAGES / "index.md": index_page(manifest), PAGES / LEDGER: ledger_page(root, manifest)}
    for entry in manifest.entries:
        out[PAGES / f"{entry.name}.md"] = result_page(root, manifest, entry)
    out[README] = fill_blocks((root / README).read_text(), readme_blocks(root, manifest))
    training = (root / TRAINING).read_text()
    out[TRAINING] = fill_blocks(training, {"reward-scale": scale_table(root, manifest)}, TRAINING)
    guide = (root / GUIDE).read_text()
    out[GUIDE] = fill_blocks(guide, guide_blocks(root, manifest, guide), GUIDE)
    return out


def write_all(root: Path) -> list[Path]:
    """Write every generated file whose text changed; return those written."""
    written = []
    for path, text in render_all(root).items():
        target = root / path
        if not target.exists() or target.read_text() != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            written.append(path)
    return written
