"""A study's report, rebuilt from its storage and trial folders: tune.md, tune.html, preset.yaml, plots/.

It holds the best trial and its values, the whole trial history (with the env steps each trial trained
per seed and spent in all, so trials and two studies' budgets can be compared), Optuna's parameter
importances, the optimization history, slice plots, a parallel-coordinate plot of the most important
parameters, and a preset block ready to paste under ``envs:`` in ``agents/presets/<algo>.yaml``.
``preset.yaml`` holds the same block with its values in full: ``testbed train --preset`` takes it. The
report prints tuned values to 4 significant digits (``fmt_sig``).
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from agents import registry
from agents.config import parse_overrides, read_presets
from envs.errors import BadInput, brief
from lab.document import (
    Block,
    Bullets,
    Code,
    Heading,
    Image,
    Para,
    Table,
    fmt_return,
    fmt_sig,
    fmt_steps,
    render_html,
    render_markdown,
)
from lab.plot import new_figure, save_figure
from lab.study import TUNE_FILE, read_tune_yaml, reading_storage
from lab.trials import known_costs

SPENT = "Env steps spent by the whole study, pruned and failed trials included"
"""How the report's line of the study's whole spend begins; the tuning ledger reads the figure after it."""
TRIALS = "Trials"
"""How the report's line of the study's trials begins, ``Trials: N of M (2 complete, 1 fail)``; the tuning ledger
reads the counts by state after it."""

SEEDS_LISTED = 6
"""A trial's seeds are listed in full up to this many; beyond, by their first two and last."""
PARALLEL_PARAMS = 6
"""The parallel-coordinate plot's parameters: the most important ones, beside the score."""


def seeds_text(seeds: Sequence[int]) -> str:
    """How many seeds a trial trains, and which: ``1 seed per trial: 100``, ``2 seeds per trial: 100, 101``."""
    listed = ", ".join(map(str, seeds)) if len(seeds) <= SEEDS_LISTED else f"{seeds[0]}, {seeds[1]}, …, {seeds[-1]}"
    return f"{len(seeds)} seed{'' if len(seeds) == 1 else 's'} per trial: {listed}"


def budget_text(requested: int | None, steps: int, sizes: Sequence[int] | None) -> str:
    """What every trial trains per seed, and why that many (``lab.space.iteration_sizes``): ``sizes``, the env steps
    an iteration of a trial can take, or None where they vary (GRPO's groups end with their episodes)."""
    asked = f"--total-steps {requested:,}" if requested is not None else "the preset's budget"
    if sizes is None:
        return (
            f"{steps:,} env steps per seed ({asked}); a run stops after the iteration that reaches it, and this algo's "
            "iterations vary in length, so a trial may train up to one iteration more: the trial history gives each "
            "trial's steps per seed"
        )
    listed = ", ".join(f"{n:,}" for n in sizes) if len(sizes) <= SEEDS_LISTED else f"{sizes[0]:,} … {sizes[-1]:,}"
    why = f"{asked}, rounded up to" if steps != requested else f"{asked}:"
    return (
        f"{steps:,} env steps per seed in every trial ({why} a multiple of every iteration size n_steps · n_envs the "
        f"space allows: {listed})"
    )


def fmt_param(value: Any) -> str:
    """A config value as the report prints it: a float to 4 significant digits, anything else as YAML writes it."""
    if isinstance(value, float):
        return fmt_sig(value)
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def pairs_text(overrides: Sequence[str]) -> str:
    """A trial's ``key=value`` pairs (full precision, as ``train --set`` takes them) as the report prints them."""
    return " ".join(f"{k}={fmt_param(yaml.safe_load(v))}" for k, _, v in (pair.partition("=") for pair in overrides))


@contextmanager
def reading_study(tune_dir: Path) -> Iterator[tuple[Any, dict[str, Any]]]:
    """The study of ``tune_dir``, from its tune.yaml's storage opened for reading only (:func:`reading_storage`),
    and tune.yaml's contents; BadInput, before anything is written, for a tune.yaml or storage that is not a
    study's."""
    import optuna

    if not (tune_dir / TUNE_FILE).is_file():
        raise BadInput(f"{tune_dir} holds no {TUNE_FILE}: give a study folder, runs/tune/NAME")
    saved = read_tune_yaml(tune_dir, needed=("name", "algo", "env_id", "seeds"))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with reading_storage(saved.get("storage"), tune_dir) as storage:
        try:
            study = optuna.load_study(study_name=saved["name"], storage=storage)
        except KeyError:
            raise BadInput(
                f"the study's storage holds no study named {brief(saved['name'], 80)}: check `name` and `storage` in "
                f"{tune_dir / TUNE_FILE}; nothing was written"
            ) from None
        yield study, saved


def _params_text(trial: Any) -> str:
    return pairs_text(trial.user_attrs.get("overrides", [])) or "—"


def preset_block(study: Any, saved: dict[str, Any], best: Any, spent: int, digits: int | None = None) -> str:
    """The env's preset entry with the best trial's values: YAML for ``agents/presets/<algo>.yaml``. ``digits``:
    floats rounded to that many significant digits (the report's copy), else in full (``preset.yaml``)."""

    algo, env_id = saved["algo"], saved["env_id"]
    preset_name = registry.preset_of(algo)
    packaged = ((read_presets(preset_name) or {}).get("envs") or {}).get(env_id) or {}
    fixed = {k: yaml.safe_load(v) for k, v in parse_overrides(saved.get("sets") or []).items()}
    tuned = {k: yaml.safe_load(v) for k, v in parse_overrides(best.user_attrs.get("overrides", [])).items()}
    entry = {**packaged, **fixed, **tuned}
    trained = saved.get("steps_per_seed") or saved.get("total_steps")  # an older study's tune.yaml lacks the first
    if saved.get("total_steps") is not None and "total_steps" not in entry:
        entry["total_steps"] = trained
    lines = [
        (
            f"# testbed tune {saved['name']}: trial {best.number} of {len(study.trials)}, mean final return "
            f"{fmt_return(best.value)}, {seeds_text(saved['seeds'])}; the study spent {spent:,} env steps."
        ),
        f"# Paste the entry under `envs:` in agents/presets/{preset_name}.yaml, or train with --preset on this file.",
        "envs:",
        f"  {env_id}:",
    ]
    for key, value in entry.items():
        # Rounded through float(), so YAML still reads a number (it reads "1e-8" as a string, "1.0e-08" not).
        shown = float(fmt_sig(value, digits)) if digits and isinstance(value, float) and math.isfinite(value) else value
        text = yaml.safe_dump(shown, default_flow_style=True).strip().removesuffix("...").strip()
        source = (
            "tuned" + ("; the preset's value" if packaged.get(key) == value else "")
            if key in tuned
            else "--set in the study"
            if key in fixed
            else "kept from the preset"
        )
        if key == "total_steps" and trained not in (None, value):
            source += f"; the study trained {trained:,} per seed"
        lines.append(f"    {key}: {text}  # {source}")
    return "\n".join(lines) + "\n"


def _save(ax: Any, out: Path) -> Path:
    """Save the figure of an Optuna matplotlib plot (an Axes, or an array of them) and close it."""
    import matplotlib.pyplot as plt  # pyplot, which Optuna's plots draw with, only after the Agg backend is set

    figure = np.ravel(ax)[0].figure
    figure.set_size_inches(max(figure.get_size_inches()[0], 8), max(figure.get_size_inches()[1], 4.5))
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out


def plot_slices(complete: list[Any], out: Path) -> Path:
    """Score against each parameter's value, one panel per parameter, four to a row; darker is later."""
    names = sorted({name for t in complete for name in t.params})
    fig, axes = new_figure(len(names), panel_size=(3.4, 2.6))
    for ax, name in zip(axes, names, strict=True):
        trials = [t for t in complete if name in t.params]
        values = [t.params[name] for t in trials]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        labels = sorted({str(v) for v in values}, key=lambda v: (len(v), v))
        x = values if numeric else [labels.index(str(v)) for v in values]
        ax.scatter(
            x,
            [t.value for t in trials],
            c=[t.number for t in trials],
            cmap="Blues",
            vmin=-2,
            edgecolors="black",
            linewidths=0.5,
        )
        distribution = trials[0].distributions[name]
        if getattr(distribution, "log", False):
            ax.set_xscale("log")
        if not numeric:
            ax.set_xticks(range(len(labels)), labels, rotation=30, fontsize=7)
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("score")
    return save_figure(fig, out)[0]


def param_importances(study: Any) -> tuple[dict[str, float], str]:
    """Optuna's parameter importances, most important first, and the evaluator's name: fANOVA, Optuna's default,
    where scikit-learn is installed (it fits a random forest), else PED-ANOVA, which needs nothing more."""
    import optuna

    if importlib.util.find_spec("sklearn") is None:
        evaluator, name = optuna.importance.PedAnovaImportanceEvaluator(), "PED-ANOVA evaluator"
    else:
        evaluator, name = optuna.importance.FanovaImportanceEvaluator(seed=0), "fANOVA evaluator (its default)"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. "importances will be equal" when trials tie; PED-ANOVA is experimental
        importances = optuna.importance.get_param_importances(study, evaluator=evaluator)
    return {k: v for k, v in importances.items() if math.isfinite(v)}, name


def plot_parallel(study: Any, importances: dict[str, float], out: Path) -> tuple[Path, list[str]]:
    """Optuna's parallel-coordinate plot of the score and the ``PARALLEL_PARAMS`` most important parameters
    (all of them would be a dozen overlapping axes); without importances, the first in name order.
    (the file, the axes' labels from left to right: the score, then the parameters in name order)."""
    import matplotlib
    import matplotlib.collections
    import matplotlib.colors
    from optuna.visualization import matplotlib as optuna_plots

    names = sorted({name for t in study.get_trials(deepcopy=False) for name in t.params})
    shown = [name for name in importances if name in names][:PARALLEL_PARAMS] or names[:PARALLEL_PARAMS]
    with warnings.catch_warnings(), matplotlib.rc_context():  # as in build_tune_report
        warnings.simplefilter("ignore")
        ax = optuna_plots.plot_parallel_coordinate(study, params=shown, target_name="score")
        # Optuna's "Blues" fades the lowest scores to white, on its style's grey: they vanished. A white ground and
        # viridis cut short of its pale end keep both ends in sight (best dark, as Optuna has it).
        ax.set_facecolor("white")
        cmap = matplotlib.colors.ListedColormap(matplotlib.colormaps["viridis_r"](np.linspace(0.25, 1.0, 256)))
        for lines in ax.collections:  # the trials' lines; the colour bar follows them
            if isinstance(lines, matplotlib.collections.LineCollection) and lines.get_array() is not None:
                lines.set_cmap(cmap)
        # From the axes' left edge, not centred on them: centred, it ran past the figure's left edge ("arallel").
        ax.set_title("")  # Optuna's own, centred
        ax.set_title(
            f"Parallel coordinates: the score and the {len(shown)} most important parameters",
            y=1.03,
            loc="left",
            fontsize=11,
        )
        ax.tick_params(axis="x", labelrotation=20, labelsize=9)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
        return _save(ax, out), [label.get_text() for label in ax.get_xticklabels()]


def build_tune_report(tune_dir: Path) -> dict[str, Path]:
    """Write tune.md, tune.html, preset.yaml and plots/ for the study in ``tune_dir``; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    with reading_study(tune_dir) as (study, saved):
        return _write_report(study, saved, tune_dir)


def _write_report(study: Any, saved: dict[str, Any], tune_dir: Path) -> dict[str, Path]:
    """The report of ``study``, whose tune.yaml holds ``saved``, written into ``tune_dir``."""
    import matplotlib
    import optuna
    from optuna.visualization import matplotlib as optuna_plots

    trials = study.get_trials(deepcopy=False)
    states = optuna.trial.TrialState
    complete = [t for t in trials if t.state == states.COMPLETE]
    if not complete:
        raise BadInput(f"{tune_dir}: no trial has completed yet; nothing to report")
    best = study.best_trial
    costs = known_costs(trials, tune_dir)
    spent = sum(steps for steps, _, _ in costs.values())
    written = {"markdown": tune_dir / "tune.md", "html": tune_dir / "tune.html", "preset": tune_dir / "preset.yaml"}

    by_state = {s.name.lower(): sum(t.state == s for t in trials) for s in states if any(t.state == s for t in trials)}
    steps = saved.get("steps_per_seed")  # None: a study from before budgets were made equal
    asked = f"{fmt_steps(saved['total_steps'])} env steps" if saved.get("total_steps") else "the preset's budget"
    budget = (
        budget_text(saved.get("total_steps"), steps, saved.get("iteration_sizes"))
        if steps
        else f"{asked} per seed asked; each trial trained whole iterations past it, see the trial history"
    )
    facts = [
        f"Algo: {saved['algo']}; env: {saved['env_id']}",
        f"{TRIALS}: {len(trials)} of {saved.get('trials')} ({', '.join(f'{n} {s}' for s, n in by_state.items())})",
        f"Budget: {budget}",
        f"{seeds_text(saved['seeds'])} (a trial's score is the mean of their final evaluations)",
        f"{SPENT}: {spent:,}",
        (
            f"Sampler: TPE (seed {saved.get('sampler_seed')}); pruner: {saved.get('pruner')} (after "
            f"{saved.get('startup_trials')} trials, from a third of the budget on)"
        ),
        f"Fixed with --set: {', '.join(saved.get('sets') or []) or 'nothing'}",
        (
            "The study starts from the shipped presets: trial 0 holds the env's preset (the values its space can "
            "express); the next, when the space can express them, the algo's default values for this action space."
        ),
    ]
    starts = {
        ("env" if t.user_attrs["preset"] is True else t.user_attrs["preset"]): t
        for t in trials
        if t.user_attrs.get("preset")
    }
    names = {"env": "the env's preset", "default": "the algo's default for this action space"}
    against = [
        f"{fmt_return(t.value)} for {names.get(label, label)} (trial {t.number})"
        if t.state == states.COMPLETE
        else f"{names.get(label, label)} (trial {t.number}) {t.state.name.lower()}"
        for label, t in starts.items()
        if t.state != states.RUNNING
    ]
    pairs = (pair.partition("=") for pair in best.user_attrs.get("overrides", []))
    best_rows = [[key, fmt_param(yaml.safe_load(value))] for key, _, value in pairs]
    best_steps = costs[best.number][1]
    trained = f"; it trained {best_steps:,} env steps per seed" if steps is None or best_steps != steps else ""
    blocks: list[Block] = [
        Heading(1, f"Tuning report: {saved['name']}"),
        Heading(2, "What was run"),
        Bullets(facts),
        Heading(2, "Best trial"),
        Para(
            f"Trial {best.number}: mean final return {fmt_return(best.value)}{trained}"
            + (f", against {' and '.join(against)}." if against else ".")
        ),
        Table(["parameter", "value"], best_rows),
        Heading(2, "Preset block"),
        Para(
            f"Also in `preset.yaml`, with the values in full (here to 4 significant digits): `testbed train --algo "
            f"{saved['algo']} --env {saved['env_id']} --preset {tune_dir.as_posix()}/preset.yaml` trains with it. "
            f"Validate it on seeds the study never used (`testbed bench` runs seeds 0 …) before you commit it."
        ),
        Code(preset_block(study, saved, best, spent, digits=4), "yaml"),
    ]
    written["preset"].write_text(preset_block(study, saved, best, spent))

    blocks.append(Heading(2, "Parameter importances"))
    try:
        importances, evaluator = param_importances(study)
        blocks.append(
            Para(
                f"Optuna's {evaluator} over the completed trials: the share of the score's variation that each "
                "parameter explains."
            )
        )
        blocks.append(Table(["parameter", "importance"], [[k, fmt_sig(v, 3)] for k, v in importances.items()]))
    except (RuntimeError, ValueError) as error:
        importances = {}
        blocks.append(Para(f"Not computed: {error}"))

    rows = []
    for t in trials:
        spent_t, per_seed, seconds = costs[t.number]
        last = max(t.intermediate_values, default=None)
        pruned = t.state == states.PRUNED and last is not None
        rows.append(
            [
                str(t.number),
                t.state.name.lower(),
                fmt_return(t.value) if t.state == states.COMPLETE else "—",
                f"{last:,} (return {fmt_return(t.intermediate_values[last])})" if pruned else "—",
                f"{per_seed:,}",
                f"{spent_t:,}",
                f"{seconds:.0f} s",
                _params_text(t),
                t.user_attrs.get("error", ""),
            ]
        )
    blocks.append(Heading(2, "Trial history"))
    blocks.append(
        Para(
            "Score: the mean final return over the trial's seeds. A pruned trial stopped at the step shown, where its "
            "mean evaluation fell below the median of earlier trials at that step (an evaluation counts at the "
            "multiple of eval_interval its run had just passed, so that trials whose iterations differ are compared at "
            "the same steps). Steps per seed: what one seed of the trial trained; env steps: all the trial spent, over "
            "its seeds and failed attempts."
        )
    )
    blocks.append(
        Table(
            [
                "trial",
                "state",
                "score",
                "pruned at step",
                "steps per seed",
                "env steps",
                "wall-clock",
                "values",
                "error",
            ],
            rows,
        )
    )

    plots = tune_dir / "plots"
    images = []
    # Optuna's plots switch pyplot to its own style for good: rc_context puts the settings back afterwards.
    with warnings.catch_warnings(), matplotlib.rc_context():
        warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
        images.append(("history", _save(optuna_plots.plot_optimization_history(study), plots / "history.png")))
        if study.best_trial.params and len(complete) >= 2:
            images.append(("parallel coordinates", plot_parallel(study, importances, plots / "parallel.png")[0]))
    if study.best_trial.params and len(complete) >= 2:
        images.insert(1, ("slice", plot_slices(complete, plots / "slice.png")))
    blocks.append(Heading(2, "Plots"))
    for title, path in images:
        written[path.relative_to(tune_dir).as_posix()] = path
        blocks.append(Image(path.relative_to(tune_dir).as_posix(), f"{title} of the completed trials"))
    written["markdown"].write_text(render_markdown(blocks))
    written["html"].write_text(render_html(blocks, f"Tuning report: {saved['name']}", tune_dir))
    return written
