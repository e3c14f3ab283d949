"""A study's report, rebuilt from its storage and trial folders: tune.md, tune.html, preset.yaml, plots/.

It holds the best trial and its values, the whole trial history (with the env steps each trial spent,
so two studies' budgets can be compared), Optuna's parameter importances, the optimization history,
slice and parallel-coordinate plots, and a preset block ready to paste under ``envs:`` in
``agents/presets/<algo>.yaml``. ``preset.yaml`` holds the same block: ``testbed train --preset`` takes it.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from agents import registry, rundir
from agents.config import PRESET_DIR, parse_overrides, read_yaml
from envs.errors import BadInput
from lab.document import Block, Bullets, Code, Heading, Image, Para, Table, fmt_steps, render_html, render_markdown
from lab.plot import new_figure, save_figure
from lab.results import read_progress
from lab.study import TUNE_FILE, storage_for, trial_dir


def load_study(tune_dir: Path) -> tuple[Any, dict[str, Any]]:
    """The study of ``tune_dir`` (from its tune.yaml's storage) and tune.yaml's contents."""
    import optuna

    path = tune_dir / TUNE_FILE
    if not path.is_file():
        raise BadInput(f"{tune_dir} holds no {TUNE_FILE}: give a study folder, runs/tune/NAME")
    saved = read_yaml(path) or {}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=saved["name"], storage=storage_for(saved.get("storage"), tune_dir)), saved


def trial_cost(tune_dir: Path, number: int) -> tuple[int, float]:
    """(env steps, wall-clock s) a trial spent: steps summed over its seeds; time of its slowest seed."""
    steps, seconds = 0, 0.0
    folder = trial_dir(tune_dir, number)
    for progress in sorted(folder.rglob("progress.csv")) if folder.exists() else []:
        _, _, _, last_step, last_time = read_progress(progress)
        if any(part.startswith(".") for part in progress.relative_to(folder).parts):
            steps += last_step  # a failed attempt, set aside: its steps count, its time is not the trial's
            continue
        summary = rundir.read_summary(progress.parent) or {}
        steps += int(summary.get("total_steps") or last_step)
        seconds = max(seconds, float(summary.get("wall_time_s") or last_time))
    return steps, seconds


def _params_text(trial: Any) -> str:
    return " ".join(trial.user_attrs.get("overrides", [])) or "—"


def preset_block(study: Any, saved: dict[str, Any], best: Any, spent: int) -> str:
    """The env's preset entry with the best trial's values: YAML for ``agents/presets/<algo>.yaml``."""

    algo, env_id = saved["algo"], saved["env_id"]
    preset_name = registry.preset_of(algo)
    packaged = (yaml.safe_load((PRESET_DIR / f"{preset_name}.yaml").read_text()).get("envs") or {}).get(env_id) or {}
    fixed = {k: yaml.safe_load(v) for k, v in parse_overrides(saved.get("sets") or []).items()}
    tuned = {k: yaml.safe_load(v) for k, v in parse_overrides(best.user_attrs.get("overrides", [])).items()}
    entry = {**packaged, **fixed, **tuned}
    if saved.get("total_steps") is not None and "total_steps" not in entry:
        entry["total_steps"] = saved["total_steps"]
    seeds = ", ".join(map(str, saved["seeds"]))
    lines = [
        (f"# testbed tune {saved['name']}: trial {best.number} of {len(study.trials)}, mean final return "
         f"{best.value:.2f} over seeds {seeds}; the study spent {spent:,} env steps."),
        f"# Paste the entry under `envs:` in agents/presets/{preset_name}.yaml, or train with --preset on this file.",
        "envs:",
        f"  {env_id}:",
    ]
    for key, value in entry.items():
        text = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
        source = ("tuned" + ("; the preset's value" if packaged.get(key) == value else "") if key in tuned
                  else "--set in the study" if key in fixed else "kept from the preset")  # fmt: skip
        if key == "total_steps" and saved.get("total_steps") not in (None, value):
            source += f"; the study trained {saved['total_steps']:,} per seed"
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
        ax.scatter(x, [t.value for t in trials], c=[t.number for t in trials], cmap="Blues", vmin=-2,
                   edgecolors="black", linewidths=0.5)  # fmt: skip
        distribution = trials[0].distributions[name]
        if getattr(distribution, "log", False):
            ax.set_xscale("log")
        if not numeric:
            ax.set_xticks(range(len(labels)), labels, rotation=30, fontsize=7)
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("score")
    return save_figure(fig, out)[0]


def build_tune_report(tune_dir: Path) -> dict[str, Path]:
    """Write tune.md, tune.html, preset.yaml and plots/ for the study in ``tune_dir``; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import optuna
    from optuna.visualization import matplotlib as optuna_plots

    study, saved = load_study(tune_dir)
    trials = study.get_trials(deepcopy=False)
    states = optuna.trial.TrialState
    complete = [t for t in trials if t.state == states.COMPLETE]
    if not complete:
        raise BadInput(f"{tune_dir}: no trial has completed yet; nothing to report")
    best = study.best_trial
    costs = {t.number: trial_cost(tune_dir, t.number) for t in trials}
    spent = sum(steps for steps, _ in costs.values())
    written = {"markdown": tune_dir / "tune.md", "html": tune_dir / "tune.html", "preset": tune_dir / "preset.yaml"}

    by_state = {s.name.lower(): sum(t.state == s for t in trials) for s in states if any(t.state == s for t in trials)}
    budget = fmt_steps(saved["total_steps"]) if saved.get("total_steps") else "the preset's"
    facts = [
        f"Algo: {saved['algo']}; env: {saved['env_id']}",
        f"Trials: {len(trials)} of {saved.get('trials')} ({', '.join(f'{n} {s}' for s, n in by_state.items())})",
        (f"Budget per seed: {budget} env steps; seeds per trial: {', '.join(map(str, saved['seeds']))} (a trial's "
         "score is the mean of their final evaluations)"),
        f"Env steps spent by the whole study, pruned and failed trials included: {spent:,}",
        (f"Sampler: TPE (seed {saved.get('sampler_seed')}); pruner: {saved.get('pruner')} (after "
         f"{saved.get('startup_trials')} trials, from a third of the budget on)"),
        f"Fixed with --set: {', '.join(saved.get('sets') or []) or 'nothing'}",
        ("The study starts from the shipped presets: trial 0 holds the env's preset (the values its space can "
         "express); the next, when the space can express them, the algo's default values for this action space."),
    ]
    starts = {("env" if t.user_attrs["preset"] is True else t.user_attrs["preset"]): t
              for t in trials if t.user_attrs.get("preset")}  # fmt: skip
    names = {"env": "the env's preset", "default": "the algo's default for this action space"}
    against = [f"{t.value:.2f} for {names.get(label, label)} (trial {t.number})" if t.state == states.COMPLETE
               else f"{names.get(label, label)} (trial {t.number}) {t.state.name.lower()}"
               for label, t in starts.items() if t.state != states.RUNNING]  # fmt: skip
    best_rows = [[k.partition("=")[0], k.partition("=")[2]] for k in best.user_attrs.get("overrides", [])]
    block = preset_block(study, saved, best, spent)
    blocks: list[Block] = [
        Heading(1, f"Tuning report: {saved['name']}"),
        Heading(2, "What was run"),
        Bullets(facts),
        Heading(2, "Best trial"),
        Para(f"Trial {best.number}: mean final return {best.value:.2f}"
             + (f", against {' and '.join(against)}." if against else ".")),
        Table(["parameter", "value"], best_rows),
        Heading(2, "Preset block"),
        Para(f"Also in `preset.yaml`: `testbed train --algo {saved['algo']} --env {saved['env_id']} --preset "
             f"{tune_dir.as_posix()}/preset.yaml` trains with it. Validate it on seeds the study never used "
             "(`testbed bench` runs seeds 0 …) before you commit it."),
        Code(block, "yaml"),
    ]
    written["preset"].write_text(block)

    blocks.append(Heading(2, "Parameter importances"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "importances will be equal" when trials tie
            importances = optuna.importance.get_param_importances(study)
        blocks.append(Para("Optuna's default evaluator over the completed trials: the share of the score's variation "
                           "that each parameter explains."))  # fmt: skip
        blocks.append(Table(["parameter", "importance"], [[k, f"{v:.3f}"] for k, v in importances.items()]))
    except (RuntimeError, ValueError) as error:
        blocks.append(Para(f"Not computed: {error}"))

    rows = []
    for t in trials:
        steps, seconds = costs[t.number]
        last = max(t.intermediate_values, default=None)
        pruned = t.state == states.PRUNED and last is not None
        rows.append([str(t.number), t.state.name.lower(), f"{t.value:.2f}" if t.state == states.COMPLETE else "—",
                     f"{last:,} (return {t.intermediate_values[last]:.2f})" if pruned else "—",
                     f"{steps:,}", f"{seconds:.0f} s", _params_text(t), t.user_attrs.get("error", "")])  # fmt: skip
    blocks.append(Heading(2, "Trial history"))
    blocks.append(Para("Score: the mean final return over the trial's seeds. A pruned trial stopped at the step shown, "
                       "where its mean evaluation fell below the median of earlier trials at that step."))  # fmt: skip
    blocks.append(Table(["trial", "state", "score", "pruned at step", "env steps", "wall-clock", "values", "error"], rows))

    plots = tune_dir / "plots"
    images = []
    # Optuna's plots switch pyplot to its own style for good: rc_context puts the settings back afterwards.
    with warnings.catch_warnings(), matplotlib.rc_context():
        warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
        images.append(("history", _save(optuna_plots.plot_optimization_history(study), plots / "history.png")))
        if study.best_trial.params and len(complete) >= 2:
            images.append(("parallel coordinates",
                           _save(optuna_plots.plot_parallel_coordinate(study), plots / "parallel.png")))  # fmt: skip
    if study.best_trial.params and len(complete) >= 2:
        images.insert(1, ("slice", plot_slices(complete, plots / "slice.png")))
    blocks.append(Heading(2, "Plots"))
    for title, path in images:
        written[path.relative_to(tune_dir).as_posix()] = path
        blocks.append(Image(path.relative_to(tune_dir).as_posix(), f"{title} of the completed trials"))
    written["markdown"].write_text(render_markdown(blocks))
    written["html"].write_text(render_html(blocks, f"Tuning report: {saved['name']}", tune_dir))
    return written
