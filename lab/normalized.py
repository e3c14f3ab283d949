"""Normalized scores: each env's reference scores (0 = random actions, 1 = a published target), its
gymnasium reward threshold, and the bench report's section that aggregates normalized scores across envs
with rliable's statistics (``lab.stats``): IQM, median, mean, optimality gap, probability of improvement,
performance profiles and sample-efficiency curves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from envs.errors import BadInput
from lab import stats
from lab.document import Block, Bullets, Heading, Para, Table, counted, fmt_steps
from lab.plot import X_LABELS, plot_aggregates, plot_bands
from lab.results import Run, base_env_id, natural_key

REFERENCE_SCORES = Path(__file__).with_name("reference_scores.yaml")


@dataclass(frozen=True)
class Reference:
    """An env's normalization anchors: 0 = ``random``, 1 = ``target``."""

    random: float
    target: float

    def normalize(self, score: float) -> float:
        return (score - self.random) / (self.target - self.random)


def load_reference_scores(path: Path = REFERENCE_SCORES) -> dict[str, Reference]:
    """The table of random and target scores per env id; BadInput naming the entry that is malformed."""
    table = yaml.safe_load(path.read_text()) or {}
    refs: dict[str, Reference] = {}
    for env_id, entry in table.items():
        try:
            ref = Reference(float(entry["random"]), float(entry["target"]))
        except (TypeError, KeyError, ValueError):
            raise BadInput(f"{path.name}: {env_id} needs numeric 'random' and 'target' entries") from None
        if ref.target == ref.random:
            raise BadInput(f"{path.name}: {env_id} has target == random; normalized scores would divide by zero")
        refs[str(env_id)] = ref
    return refs


def reward_threshold(env_id: str) -> float | None:
    """gymnasium's spec ``reward_threshold``; None when the env has none or is not registered here.

    ``env_id`` may be an env label: a reward delay keeps the returns, and so the threshold, of its id."""
    import gymnasium as gym

    try:
        threshold = gym.spec(base_env_id(env_id)).reward_threshold
    except Exception:  # noqa: BLE001  an unknown or unimportable id simply has no threshold to report
        return None
    return None if threshold is None else float(threshold)


OBSERVATION_SWITCH = "_observation"  # gymnasium's MuJoCo flags: include_cfrc_ext_in_observation, …


def scored_env_id(run: Run) -> str | None:
    """The registered id whose published scores apply to the run. A delayed reward keeps its id's (the returns
    are the same), and so do env kwargs that only choose what the agent observes (every key ends in
    ``_observation``, as the Ant presets' ``include_cfrc_ext_in_observation``): the reward does not read the
    observation. Other env kwargs (a healthy reward, a ctrl cost weight) make returns of another scale: None."""
    kwargs = run.config.get("env_kwargs") or {}
    return base_env_id(run.env_id) if all(str(k).endswith(OBSERVATION_SWITCH) for k in kwargs) else None


def reference_for(run: Run, refs: dict[str, Reference]) -> Reference | None:
    """The reference scores of the run's env: its own label's entry, else its :func:`scored_env_id`'s."""
    if run.env_id in refs:
        return refs[run.env_id]
    env_id = scored_env_id(run)
    return None if env_id is None else refs.get(env_id)


def _runs_text(matrices: dict[str, np.ndarray]) -> str:
    """How many runs each algo's statistic pools: ``ppo 6 (3 per env × 2 envs), grpo 6 (…)``, from its
    ``(R, M, …)`` matrix."""
    return ", ".join(
        f"{algo} {m.shape[0] * m.shape[1]} ({m.shape[0]} per env × {m.shape[1]} env{'s' if m.shape[1] != 1 else ''})"
        for algo, m in matrices.items()
    )


def left_out_pairs(
    runs: Sequence[Run], matrices: stats.ScoreMatrices, normalize: Callable[[Run, float], float | None]
) -> list[Block]:
    """Each algo the comparison left out, against each compared algo on the envs both completed.

    An algo that has begun fewer envs than the others (SB3 in a suite under way) is still measured where
    it ran: the same statistics over the pair's shared envs, each algo with its smallest seed count there.
    """
    rows, envs = [], {}
    for out in matrices.left_out:
        for other in matrices.scores:
            pair = stats.score_matrices([r for r in runs if r.algo in (out, other)], normalize)
            if len(pair.scores) < 2:
                continue
            iqm = {a: m["IQM"] for a, m in stats.aggregate_intervals(pair.scores).items()}
            better = stats.improvement_probabilities(pair.scores)[(out, other)]
            envs[(out, other)] = pair.envs
            counts = f"{pair.scores[out].shape[0]}, {pair.scores[other].shape[0]}"
            cells = [f"{v.point:.3f} [{v.low:.3f}, {v.high:.3f}]" for v in (iqm[out], iqm[other], better)]
            rows.append([out, other, str(len(pair.envs)), counts, *cells])
    if not rows:
        return []
    return [
        Para(
            "Left-out algos against each compared algo, on the envs both completed (the same statistics over fewer "
            "envs; each algo's runs per env are its smallest seed count there, lowest seeds first):"
        ),
        Table(["X", "Y", "envs", "runs per env (X, Y)", "IQM of X", "IQM of Y", "P(X > Y)"], rows),
        Bullets([f"{x} and {y}: {', '.join(e)}" for (x, y), e in envs.items()]),
    ]


def across_envs(
    runs: Sequence[Run], refs: dict[str, Reference], plots_dir: Path, colors: dict[str, tuple[float, ...]]
) -> tuple[list[Block], list[tuple[list[Path], str, str]]]:
    """The report's section on normalized scores across envs (``lab.stats``), and its plots, each with its
    alt text and its caption."""

    def normalize(run: Run, score: float) -> float | None:
        ref = reference_for(run, refs)
        return None if ref is None else ref.normalize(score)

    blocks: list[Block] = [
        Heading(2, "Normalized scores across envs"),
        Para(
            "Normalized score = (score − random) / (target − random), per completed run, with the reference scores of "
            "`lab/reference_scores.yaml` (0 = uniformly random actions, 1 = target). Statistics follow rliable "
            f"(Agarwal et al. 2021): 95% stratified bootstrap CIs ({stats.REPS} resamples, runs resampled within each "
            "env, fixed resampling seed) of the IQM over every (env, seed) run, of the median and mean over envs of "
            "each env's mean score, and of the optimality gap, 1 − mean(min(score, 1)): lower is better."
        ),
    ]
    plots: list[tuple[list[Path], str, str]] = []
    matrices = stats.score_matrices(runs, normalize)
    missing = sorted({r.env_id for r in runs if reference_for(r, refs) is None}, key=natural_key)
    if not matrices.scores:
        blocks.append(
            Para("No env where every algo has a completed run with reference scores yet: nothing to aggregate.")
        )
    else:
        runs_per_env = {algo: m.shape[0] for algo, m in matrices.scores.items()}
        blocks.append(
            Para(
                f"Envs: {', '.join(matrices.envs)}. Runs per env: "
                + ", ".join(f"{a} {n}" for a, n in runs_per_env.items())
                + "."
                + "".join(
                    f" {a}: {n} runs beyond the smallest seed count of its envs left out."
                    for a, n in matrices.dropped.items()
                    if n
                )
                + (
                    f" Not compared, as not every algo completed a run there: {', '.join(matrices.unshared)}."
                    if matrices.unshared
                    else ""
                )
                + "".join(
                    f" {a} left out: it completed {counted(n, 'env')} with reference scores, too few to share with the "
                    "others."
                    for a, n in matrices.left_out.items()
                )
            )
        )
        aggregates = stats.aggregate_intervals(matrices.scores)
        blocks.append(
            Table(
                ["algo", *stats.METRIC_NAMES],
                [
                    [
                        algo,
                        *(
                            f"{m[name].point:.3f} [{m[name].low:.3f}, {m[name].high:.3f}]"
                            for name in stats.METRIC_NAMES
                        ),
                    ]
                    for algo, m in aggregates.items()
                ],
            )
        )
        used = {r.env_id: ref for r in runs if r.env_id in matrices.envs and (ref := reference_for(r, refs))}
        blocks.append(
            Bullets([f"{e}: random {ref.random:g}, target {ref.target:g}" for e, ref in sorted(used.items())])
        )
        ci = f"95% stratified bootstrap CI ({stats.REPS} resamples)"
        plots.append(
            (
                plot_aggregates(
                    aggregates,
                    stats.METRIC_NAMES,
                    plots_dir / "normalized-scores.png",
                    colors,
                    title="Aggregate normalized scores",
                ),
                "IQM, median, mean and optimality gap of normalized scores",
                "Aggregate normalized scores: IQM, median, mean and optimality gap (lower is better) of the "
                f"normalized final scores; tick: point estimate, bar: {ci}; runs: {_runs_text(matrices.scores)}.",
            )
        )
        improvements = stats.improvement_probabilities(matrices.scores)
        if improvements:
            blocks.append(
                Para(
                    "Probability of improvement P(X > Y): the chance that a run of X scores above a run of Y on the "
                    "same env (Mann-Whitney, ties count half), averaged over envs; 0.5 is a tie."
                )
            )
            blocks.append(
                Table(
                    ["X", "Y", "P(X > Y)", "95% CI"],
                    [[x, y, f"{v.point:.3f}", f"[{v.low:.3f}, {v.high:.3f}]"] for (x, y), v in improvements.items()],
                )
            )
            if len(matrices.envs) > 1:
                blocks.append(
                    Para(
                        "By env: the same probability on each env alone, its 95% CI from the runs of X and of Y "
                        "resampled within that env; P(X > Y) above is the mean of these."
                    )
                )
                blocks.append(
                    Table(
                        ["env", "X", "Y", "P(X > Y)", "95% CI"],
                        [
                            [env, x, y, f"{v.point:.3f}", f"[{v.low:.3f}, {v.high:.3f}]"]
                            for (x, y), by_env in stats.improvement_by_env(matrices.scores).items()
                            for env, v in zip(matrices.envs, by_env, strict=True)
                        ],
                    )
                )
        blocks += left_out_pairs(runs, matrices, normalize)
        taus = np.linspace(
            min(0.0, min(float(m.min()) for m in matrices.scores.values())),
            max(1.25, max(float(m.max()) for m in matrices.scores.values())),
            61,
        )
        profiles, profile_cis = stats.performance_profiles(matrices.scores, taus)
        plots.append(
            (
                plot_bands(
                    taus,
                    profiles,
                    profile_cis,
                    "normalized score τ",
                    "fraction of runs with score > τ",
                    plots_dir / "performance-profiles.png",
                    colors,
                    title="Performance profiles",
                ),
                "Performance profiles of normalized scores",
                f"Performance profiles: the fraction of runs whose normalized final score exceeds τ, per algo; band: "
                f"{ci}; runs: {_runs_text(matrices.scores)}.",
            )
        )
        compared = [r for r in runs if r.algo in matrices.scores]
        grid, curves = stats.normalized_curves(compared, matrices.envs, normalize)
        if curves and grid.size > 1:
            points, cis = stats.sample_efficiency(curves)
            ends = ", ".join(f"{a} {fmt_steps(float(grid[np.isfinite(v)].max()))}" for a, v in points.items())
            plots.append(
                (
                    plot_bands(
                        grid,
                        points,
                        cis,
                        X_LABELS["steps"],
                        "IQM normalized score",
                        plots_dir / "sample-efficiency.png",
                        colors,
                        title="Sample efficiency",
                    ),
                    "Sample efficiency: IQM normalized evaluation return against env steps",
                    f"Sample efficiency: the IQM over runs and envs of the normalized evaluation return at each env "
                    f"step; band: {ci}. The axis runs to the longest run's last step; each algo's line covers the "
                    f"steps all of its runs reached, ending at {ends} steps; runs: {_runs_text(curves)}.",
                )
            )
    if missing:
        blocks.append(Para(f"Left out (no reference scores in `lab/reference_scores.yaml`): {', '.join(missing)}."))
    return blocks, plots
