"""The published PPO figures that the MuJoCo presets cite (``lab/published.yaml``), and the bench report's
section that scores every algo of a bench the way each figure's source scored its runs.

Sources score a run in two ways, and a comparison is only fair under the same one:
- ``final``: the return at the end of training; ours is the mean over seeds of each run's final
  evaluation, with its 95% bootstrap CI;
- ``best_point``: the highest point of the mean-over-seeds evaluation curve (Tianshou's tables); ours is
  the highest point of the mean over seeds of our evaluations, on the steps every run reached.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from envs.errors import BadInput
from lab.document import DASH, Block, Heading, Para, Table, fmt_ci, fmt_return, fmt_steps
from lab.normalized import scored_env_id
from lab.plot import mean_curve
from lab.results import Run, natural_key
from lab.stats import bootstrap_ci

PUBLISHED = Path(__file__).with_name("published.yaml")
MEASURES = {
    "final": "final return, mean over seeds",
    "best_point": "best point of the mean curve",
}


@dataclass(frozen=True)
class Published:
    """One env's published PPO figure: ``score`` ± ``spread`` by ``measure``, as ``source`` printed it; ``score``
    is None where no figure exists, and ``source`` then says what does."""

    score: float | None
    spread: float | None
    measure: str | None
    source: str


def load_published(path: Path = PUBLISHED) -> dict[str, tuple[Published, ...]]:
    """The published figures per env id, the one its preset names first; BadInput naming a malformed entry."""
    figures: dict[str, tuple[Published, ...]] = {}
    for env_id, entries in (yaml.safe_load(path.read_text()) or {}).items():
        if not isinstance(entries, list) or not entries:
            raise BadInput(f"{path.name}: {env_id} needs a list of figures, each a mapping with a 'score'")
        figures[str(env_id)] = tuple(_figure(path, env_id, entry) for entry in entries)
    return figures


def _figure(path: Path, env_id: str, entry: object) -> Published:
    entry = entry if isinstance(entry, dict) else {}
    if entry.get("score") is None:
        if not entry.get("note"):
            raise BadInput(f"{path.name}: {env_id} has a figure without 'score'; give one, or a 'note' saying why")
        return Published(None, None, None, str(entry["note"]))
    try:
        spread = entry.get("spread")
        figure = Published(
            float(entry["score"]),
            None if spread is None else float(spread),
            str(entry["measure"]),
            str(entry["source"]),
        )
    except (KeyError, TypeError, ValueError):
        raise BadInput(f"{path.name}: {env_id} needs a numeric 'score', a 'measure' and a 'source'") from None
    if figure.measure not in MEASURES:
        raise BadInput(f"{path.name}: {env_id} has measure {figure.measure!r}; choose one of {', '.join(MEASURES)}")
    return figure


def best_point(runs: Sequence[Run]) -> tuple[float, float] | None:
    """(Ḡ*, t*): the highest point of the mean evaluation curve over the R runs and the env steps it lies at,

        Ḡ* = max_t (1/R) Σ_r G_r(t),   t ∈ [max_r t_r^first, min_r t_r^last],

    where G_r(t) is run r's evaluation return at step t (interpolated between its evaluations where the runs
    evaluate at different steps) and the range keeps the steps every run reached. None without evaluations."""
    evaluated = [r for r in runs if r.steps.size]
    curve = mean_curve(evaluated, "steps")
    if curve is None:
        return None
    first = max(float(r.steps.min()) for r in evaluated)
    last = min(float(r.steps.max()) for r in evaluated)
    shared = (curve.x >= first) & (curve.x <= last) & np.isfinite(curve.mean)
    if not shared.any():
        return None
    p = int(np.argmax(np.where(shared, curve.mean, -np.inf)))
    return float(curve.mean[p]), float(curve.x[p])


def scored(runs: Sequence[Run], measure: str) -> tuple[float, str] | None:
    """The completed ``runs``' score by ``measure`` and how the report prints it; None if none completed."""
    done = [r for r in runs if r.status == "completed" and r.final_return is not None]
    if not done:
        return None
    if measure == "final":
        finals = np.array([r.final_return for r in done], dtype=np.float64)
        return float(finals.mean()), f"{fmt_return(float(finals.mean()))} {fmt_ci(*bootstrap_ci(finals))}"
    point = best_point(done)
    return None if point is None else (point[0], f"{fmt_return(point[0])} at {fmt_steps(point[1])} steps")


def published_section(runs: Sequence[Run], figures: dict[str, tuple[Published, ...]]) -> list[Block]:
    """The report's comparison of each algo with every published PPO figure of the bench's envs, one row per
    figure; empty when no env of the bench is in ``figures``."""
    by_env: dict[str, list[Run]] = {}
    for run in runs:
        env_id = scored_env_id(run)
        if env_id in figures:
            by_env.setdefault(env_id, []).append(run)
    if not by_env:
        return []
    algos = sorted({r.algo for env_runs in by_env.values() for r in env_runs})
    rows: list[list[str]] = []
    below: dict[str, list[str]] = {algo: [] for algo in algos}
    compared: dict[str, int] = dict.fromkeys(algos, 0)
    for env_id in sorted(by_env, key=natural_key):
        for figure in figures[env_id]:
            if figure.score is None or figure.measure is None:
                rows.append([env_id, DASH, figure.source, *(DASH for _ in algos)])
                continue
            cells = []
            for algo in algos:
                mine = [r for r in by_env[env_id] if r.algo == algo]
                ours = scored(mine, figure.measure)
                if ours is None:
                    cells.append(DASH)
                    continue
                completed = sum(r.status == "completed" for r in mine)
                verdict = "at or above" if ours[0] >= figure.score else f"below by {figure.score - ours[0]:.2f}"
                seeds = "" if completed == len(mine) else f" ({completed} of {len(mine)} seeds)"
                cells.append(f"{ours[1]}: {verdict}{seeds}")
                compared[algo] += 1
                if ours[0] < figure.score:
                    below[algo].append(f"{env_id} ({figure.measure.replace('_', ' ')})")
            spread = "" if figure.spread is None else f" ± {figure.spread:g}"
            rows.append([env_id, f"{figure.score:g}{spread}", f"{MEASURES[figure.measure]}; {figure.source}", *cells])
    summary = "; ".join(
        f"{algo} at or above {compared[algo] - len(below[algo])} of {compared[algo]} figures"
        + (f" (below: {', '.join(below[algo])})" if below[algo] else "")
        for algo in algos
        if compared[algo]
    )
    return [
        Heading(2, "Against the published PPO figures"),
        Para(
            "The best published PPO figures at ≤ 1e6 env steps for each env, by each way of scoring a run "
            "(`lab/published.yaml`, cited by the presets), and every algo of this bench scored the way each figure's "
            "source scored its runs: by the final return (the mean over seeds of each run's final evaluation, 95% "
            "bootstrap CI) or by the best point of the mean-over-seeds evaluation curve, on the steps every run "
            "reached. Only completed runs count. The figures are for older env versions than v5, with their own seeds "
            "and evaluation: a guide, not a controlled comparison; with fewer seeds than a source's, a best point is "
            "more optimistic still."
        ),
        Table(["env", "published", "measure; source", *algos], rows),
        Para(f"{summary}." if summary else "No algo has a completed run on these envs yet."),
    ]
