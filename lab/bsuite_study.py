"""bsuite's experiments as credit studies (``testbed credit --task bsuite:EXPERIMENT``), scored as bsuite scores them.

**Settings.** The study's axis is bsuite's sweep of the experiment (``bsuite.sweep.SETTINGS``): setting i is
``bsuite_id`` ``<experiment>/<i>``, a variant ``setting<i>`` of the bench whose runs take its keyword arguments.

**Budget.** bsuite runs each setting for ``NUM_EPISODES`` episodes (10,000 for the umbrellas and memory_len, 1,000
for discounting_chain) and scores only those. A setting's episodes last a fixed L steps, and a run's budget is
``NUM_EPISODES · (L + 1)`` env steps: PPO and A2C count the autoreset step after each episode as a step (the
factory's NEXT_STEP autoreset), so they need L + 1 per episode, while GRPO and SB3 need L and reach
``NUM_EPISODES`` sooner. Episodes past ``NUM_EPISODES`` change no score. Vine's branch steps count toward the
budget without being episodes, so vine ends with fewer: bsuite scores a run that stopped early over the episodes
it has (its analyses' ``min(episode.max(), NUM_EPISODES)``), and the report says how many each run had.

**Scores** are bsuite's own: each experiment's ``analysis.score(df)`` (``bsuite/experiments/<name>/analysis.py``),
called on a DataFrame in the form bsuite's logging wrapper writes (``bsuite/utils/wrappers.py``, ``Logging``):
per episode, the cumulative ``steps``, ``episode`` and ``total_return``, the env's scoring counters, and the
setting's keyword arguments as columns. The counters are the envs' ``bsuite_info()``, rebuilt from each
episode's last reward, which is where those envs count them: the umbrella adds 2 to ``total_regret`` when its
final reward is −1 (``bsuite/environments/umbrella_chain.py``), the memory chain 1 to ``total_perfect`` when it is
+1 and 2 to ``total_regret`` when it is −1 (``memory_chain.py``); the discounting chain has none. Each run's
episodes come from its ``episodes.csv`` (``agents.runlog.EpisodeLog``).

**What a committed result keeps** of a run's episodes is bsuite's own log of them (:func:`kept_log`): the rows
that wrapper writes, at logarithmically spaced episodes, and the rows the score reads, about 50 in place of
10,000, so a kept run scores as the run did.

A seed's experiment score is ``score`` of its runs over every setting of the study at once, as bsuite scores one
agent; a setting's score is ``score`` of that setting's run alone. Both are averaged over seeds, with 95%
bootstrap CIs.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agents.config import read_yaml
from envs import bsuite
from envs.errors import BadInput
from lab.results import KEPT_BSUITE_LOG

if TYPE_CHECKING:
    import pandas as pd

    from lab.credit import Study
    from lab.results import Run

AXIS = "bsuite_setting"
CITATION = 'Osband et al. 2020, "Behaviour Suite for Reinforcement Learning", ICLR'
MEANS = {
    "umbrella_length": "the fraction of settings (umbrella chain lengths 1 to 100) whose average regret per episode "
    "over the first 10,000 episodes is below 0.5, where a wrong umbrella costs 2 and chance costs 1",
    "umbrella_distract": "the fraction of settings (1 to 100 distracting observation bits, chain length 20) whose "
    "average regret per episode over the first 10,000 episodes is below 0.5, where a wrong umbrella costs 2",
    "discounting_chain": "1 − 10 · (1.1 − the average return per episode over the first 1,000 episodes), clipped to "
    "[0, 1]: 1 for always taking the chain that pays 1.1, 0 for one paying 1",
    "memory_len": "the fraction of settings (memory lengths 1 to 100) whose share of wrong answers over the first "
    "10,000 episodes, relative to chance's one half, is below 0.75",
}
"""What each experiment's score means (its analysis.py's ``score``)."""


def plan_settings(experiment: str, values: Sequence[str] | None) -> list[str]:
    """The setting indices the study runs (all of bsuite's sweep by default); BadInput for one out of the sweep."""
    count = len(bsuite.settings(experiment))
    chosen = list(values or map(str, range(count)))
    bad = [v for v in chosen if not (v.isdigit() and int(v) < count)]
    if bad:
        raise BadInput(
            f"--horizons of bsuite:{experiment} are indices into bsuite's sweep, 0 to {count - 1} "
            f"({experiment}/0 … /{count - 1}); got {' '.join(bad)}"
        )
    if len(set(chosen)) != len(chosen):
        raise BadInput(f"--horizons names a setting twice: {' '.join(chosen)}")
    return chosen


def setting_kwargs(experiment: str, index: str) -> dict[str, Any]:
    return bsuite.settings(experiment)[int(index)]


def budget(experiment: str, index: str) -> int:
    """Env steps for the setting: ``NUM_EPISODES · (L + 1)`` (module docstring)."""
    length = bsuite.episode_length(experiment, **setting_kwargs(experiment, index))
    return bsuite.num_episodes(experiment) * (length + 1)


def variants(experiment: str, indices: Sequence[str]) -> dict[str, list[str]]:
    """Bench variants: ``setting<i>`` → its env keyword arguments and budget, for every algo."""
    out = {}
    for i in indices:
        kwargs = ",".join(f"{k}:{v}" for k, v in setting_kwargs(experiment, i).items())
        out[f"setting{i}"] = [f"env_kwargs={kwargs}", f"total_steps={budget(experiment, i)}"]
    return out


def setting_index(experiment: str, env_kwargs: dict[str, Any] | None) -> str:
    """The index of the setting in bsuite's sweep; '?' for kwargs that are none of its settings."""
    found = [str(i) for i, s in enumerate(bsuite.settings(experiment)) if s == dict(env_kwargs or {})]
    return found[0] if found else "?"


def setting_of(run: Run, experiment: str) -> str:
    return setting_index(experiment, run.config.get("env_kwargs"))


# ── bsuite's scores ──────────────────────────────────────────────────────────────────────────────────────


def analysis(experiment: str) -> Any:
    """bsuite's ``analysis`` module of the experiment (it imports plotnine for its plots)."""
    return importlib.import_module(f"bsuite.experiments.{bsuite.check_experiment(experiment)}.analysis")


def run_log(run_dir: Path, experiment: str, index: str) -> pd.DataFrame:
    """A run's episodes as bsuite logs them: :func:`bsuite_frame` of its ``episodes.csv``, or the log a
    committed result keeps of it (:func:`kept_log`); BadInput naming the run where both are missing."""
    import pandas as pd

    episodes, kept = Path(run_dir) / "episodes.csv", Path(run_dir) / KEPT_BSUITE_LOG
    if episodes.exists():
        return bsuite_frame(pd.read_csv(episodes), experiment, index)
    if kept.exists():
        return pd.read_csv(kept)
    raise BadInput(
        f"{episodes} is missing, and no {KEPT_BSUITE_LOG} kept of it: bsuite's scores read the run's episodes; "
        "run the study again"
    )


def kept_log(run_dir: Path) -> bytes:
    """What a committed result keeps of a bsuite run's ``episodes.csv``, as CSV: the rows of its
    :func:`bsuite_frame` at the episodes bsuite's ``Logging`` wrapper logs (1, 1.2, 1.4, 1.7, 2, 2.5, 3, 4, …, 9
    times each power of ten: ``wrappers._logarithmic_logging``), at ``NUM_EPISODES`` and at the run's last
    episode. The scores read only the row at min(last episode, ``NUM_EPISODES``) (module docstring), so the
    kept log scores as every episode does."""
    import pandas as pd
    from bsuite.utils.wrappers import _logarithmic_logging  # bsuite's own schedule; it has no public name

    config = read_yaml(Path(run_dir) / "config.yaml")
    experiment = bsuite.experiment_of(str(config["env_id"]))
    frame = bsuite_frame(
        pd.read_csv(Path(run_dir) / "episodes.csv"), experiment, setting_index(experiment, config.get("env_kwargs"))
    )
    ends = {bsuite.num_episodes(experiment), int(frame.episode.max()) if len(frame) else 0}
    logged = frame.episode.map(lambda e: e in ends or bool(_logarithmic_logging(e)))
    return frame[logged].to_csv(index=False).encode()


def bsuite_frame(episodes: pd.DataFrame, experiment: str, index: str) -> pd.DataFrame:
    """One run's episodes as bsuite's ``Logging`` wrapper logs them, a row per episode, with the env's
    ``bsuite_info`` counters rebuilt from the last rewards and the setting's keyword arguments as columns."""
    import pandas as pd

    last = episodes["last_reward"].to_numpy(dtype=float)  # (E,)
    frame = pd.DataFrame(
        {
            "steps": episodes["length"].cumsum().to_numpy(),
            "episode": episodes["episode"].to_numpy(),
            "total_return": episodes["return"].cumsum().to_numpy(),
            "episode_len": episodes["length"].to_numpy(),
            "episode_return": episodes["return"].to_numpy(),
        }
    )
    if experiment in ("umbrella_length", "umbrella_distract", "memory_len"):
        frame["total_regret"] = np.cumsum(np.where(last < 0, 2.0, 0.0))  # the env adds 2 for a final −1
    if experiment == "memory_len":
        frame["total_perfect"] = np.cumsum(last > 0)  # … and counts a final +1 as perfect
    for key, value in (setting_kwargs(experiment, index) if index != "?" else {}).items():
        frame[key] = value
    frame["bsuite_id"] = f"{experiment}/{index}"
    return frame


def score(experiment: str, frames: Sequence[pd.DataFrame]) -> float:
    """bsuite's score of the experiment over the runs' frames (one per setting), by its own ``analysis.score``."""
    import pandas as pd

    return float(analysis(experiment).score(pd.concat(list(frames), ignore_index=True)))


# ── the report ───────────────────────────────────────────────────────────────────────────────────────────


@dataclass
class Scored:
    """One (algo, seed, setting): its frame and what it scored."""

    algo: str
    seed: int
    setting: str
    frame: pd.DataFrame
    score: float
    episodes: int  # episodes scored: min(episodes run, NUM_EPISODES)
    mean_return: float  # average return per episode over those


def score_runs(runs: Sequence[Run], experiment: str) -> list[Scored]:
    limit = bsuite.num_episodes(experiment)
    scored = []
    for run in runs:
        if run.status != "completed":
            continue
        index = setting_of(run, experiment)
        if index == "?":
            continue
        frame = run_log(run.run_dir, experiment, index)
        if frame.empty:
            continue
        n = int(min(frame.episode.max(), limit))
        mean_return = float(frame.loc[frame.episode == n, "total_return"].iloc[0] / n)
        scored.append(Scored(run.algo, run.seed, index, frame, score(experiment, [frame]), n, mean_return))
    return scored


def _ci(values: np.ndarray) -> str:
    from lab.document import fmt_ci
    from lab.stats import bootstrap_ci

    return fmt_ci(*bootstrap_ci(values)) if values.size > 1 else "—"


def plot_scores(scored: list[Scored], indices: list[str], algos: list[str], out: Path) -> list[Path]:
    from lab.plot import algo_colors, new_figure, save_figure

    colors = algo_colors(algos)
    fig, (ax,) = new_figure(1, (6.5, 4.0))
    xs = [int(i) for i in indices]
    for algo in algos:
        points = [
            (int(i), float(np.mean([s.score for s in scored if s.algo == algo and s.setting == i])))
            for i in indices
            if any(s.algo == algo and s.setting == i for s in scored)
        ]
        if points:
            ax.plot(*zip(*points), marker="o", color=colors[algo], label=algo)
    ax.set_xticks(xs)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("setting (index into bsuite's sweep)")
    ax.set_ylabel("bsuite score (mean over seeds)")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize="small")
    return save_figure(fig, out)


def build_report(bench_dir: Path, study: Study, runs: Sequence[Run]) -> dict[str, Path]:
    """Write credit.md, credit.html and plots/credit-*.png for a bsuite study."""
    from lab.document import Bullets, Heading, Image, Para, Table, fmt_steps, render_html, render_markdown
    from lab.plot import algo_colors, plot_env_runs

    experiment = bsuite.experiment_of(study.env_id)
    scored = score_runs(runs, experiment)
    algos = sorted({r.algo for r in runs})
    limit = bsuite.num_episodes(experiment)
    written: dict[str, Path] = {"markdown": bench_dir / "credit.md", "html": bench_dir / "credit.html"}
    budgets = sorted({int(r.config["total_steps"]) for r in runs if r.config.get("total_steps")})
    title = f"bsuite study: {bench_dir.resolve().name}"
    blocks: list[Any] = [
        Heading(1, title),
        Heading(2, "What was run"),
        Para(
            f"bsuite's {experiment} experiment ({bsuite.EXPERIMENTS[experiment]}; {CITATION}), through Shimmy's "
            f"{study.env_id}, over the settings of bsuite's sweep below."
        ),
        Bullets(
            [
                f"Settings: {', '.join(f'{experiment}/{i}' for i in study.horizons)}",
                f"Algos: {', '.join(algos)}",
                f"Seeds: {', '.join(map(str, sorted({r.seed for r in runs})))}",
                f"Env steps per run: {', '.join(fmt_steps(b) for b in budgets)}; "
                + (
                    f"bsuite's {limit:,} episodes per setting × (episode length + 1), enough for every algo to reach "
                    "them (PPO and A2C count each episode's autoreset step); vine's branch steps count too, so vine "
                    "runs fewer episodes"
                    if all(
                        r.config.get("total_steps") == budget(experiment, setting_of(r, experiment))
                        for r in runs
                        if setting_of(r, experiment) != "?"
                    )
                    else f"set by --total-steps, not bsuite's {limit:,} episodes per setting: runs with fewer are "
                    "scored over the episodes they ran, as bsuite scores an unfinished run"
                ),
                f"Score: bsuite's own (`bsuite/experiments/{experiment}/analysis.py`, `score`): {MEANS[experiment]}. "
                f"Scored over each run's first {limit:,} training episodes, or all it ran if fewer",
                "Experiment score: bsuite's score of a seed's runs over all the study's settings at once (over the "
                "settings run, where the study runs a subset), averaged over seeds; CIs are 95% percentile "
                "bootstraps over seeds",
                *(f"Command: `{c}`" for c in dict.fromkeys(_commands(bench_dir))),
            ]
        ),
    ]
    rows = []
    for algo in algos:
        seeds = sorted({s.seed for s in scored if s.algo == algo})
        per_seed = np.array(
            [score(experiment, [s.frame for s in scored if s.algo == algo and s.seed == k]) for k in seeds]
        )
        rows.append(
            [
                algo,
                str(len(seeds)),
                f"{per_seed.mean():.3f}" if per_seed.size else "—",
                _ci(per_seed),
                str(len({s.setting for s in scored if s.algo == algo})),
            ]
        )
    blocks += [
        Heading(2, "Experiment score"),
        Table(["algo", "seeds", "bsuite score (mean)", "95% CI", "settings scored"], rows),
    ]
    rows = []
    for index in study.horizons:
        kwargs = ", ".join(f"{k}={v}" for k, v in setting_kwargs(experiment, index).items())
        for algo in algos:
            cell = [s for s in scored if s.algo == algo and s.setting == index]
            planned = [r for r in runs if r.algo == algo and setting_of(r, experiment) == index]
            if not planned:
                continue
            scores = np.array([s.score for s in cell])
            rows.append(
                [
                    f"{experiment}/{index}",
                    kwargs,
                    algo,
                    f"{len(cell)}/{len(planned)}",
                    f"{scores.mean():.3f}" if cell else "—",
                    _ci(scores),
                    f"{min(s.episodes for s in cell):,}" if cell else "—",
                    f"{np.mean([s.mean_return for s in cell]):.3f}" if cell else "—",
                ]
            )
    header = ["bsuite_id", "setting", "algo", "seeds scored", "score (mean)", "95% CI", "episodes scored (min)"]
    blocks += [
        Heading(2, "Scores by setting"),
        Table([*header, "return per episode (mean)"], rows),
        Heading(2, "Plots"),
    ]
    plots = bench_dir / "plots"
    for paths, alt in (
        (plot_scores(scored, study.horizons, algos, plots / "credit-score.png"), "bsuite score by setting"),
        (
            plot_env_runs(runs, "steps", plots / "credit-curves.png", algo_colors(algos)),
            "learning curves per setting: eval return vs env steps, mean and 95% CI over seeds",
        ),
    ):
        for path in paths:
            written[path.relative_to(bench_dir).as_posix()] = path
        blocks.append(Image(paths[0].relative_to(bench_dir).as_posix(), alt))
    written["markdown"].write_text(render_markdown(blocks))
    written["html"].write_text(render_html(blocks, title, bench_dir))
    return written


def _commands(bench_dir: Path) -> list[str]:
    path = bench_dir / "bench.yaml"
    return list(read_yaml(path).get("commands", [])) if path.exists() else []
