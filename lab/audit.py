"""``testbed audit``: every advantage estimator scored against the Monte-Carlo truth, for runs' checkpoints.

For each run and each checkpoint asked for (the final ``checkpoint.pt``, the ones ``keep_checkpoints``
kept), ``agents.true_advantage`` samples N steps of the policy's own trajectories, measures the true advantage
there by rollouts from the restored state, and computes every estimator on the same steps. Each
checkpoint's samples go to ``OUT/<run>/<checkpoint>/samples.csv`` with ``audit.json`` (settings, cost);
an audit already done with the same settings is not redone. The scores (``agents.audit_scores``) are
computed per checkpoint, overall and by the distance to the episode's end, then averaged over seeds:
``scores.csv``, ``audit.md`` / ``audit.html`` and the plots. With ``--gradients``, each checkpoint's gradient
audit too (``agents.true_gradient``; its files and report section: ``lab.audit_gradients``).

Checkpoints are audited by a pool of ``--workers`` processes. Each checkpoint's numbers depend only on the
checkpoint and the settings, never on the number of workers.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from agents import registry, rundir
from agents.audit_scores import NOISE_TARGET, noise_share
from agents.true_advantage import AuditEnv, AuditSettings
from agents.true_gradient import GradientSettings
from envs import start_states as starts
from envs.errors import BadInput
from envs.factory import check_saved_env_id
from lab import audit_gradients
from lab.board import HEARTBEAT_S, Heartbeat
from lab.document import (
    Block,
    Heading,
    Image,
    Para,
    Table,
    fmt_duration,
    fmt_sig,
    render_html,
    render_markdown,
    write_rows,
)
from lab.results import env_label, find_runs, natural_key

DISTANCE_BINS = ((1, 10), (10, 100), (100, 1000), (1000, 10**9))
"""Bins of steps left to the episode's end, [low, high): how far a sample is from the rewards that end it."""
SAMPLE_COLUMNS = ("t", "member", "steps_left", "truth", "truth_se")
"""samples.csv's columns before the estimators': where each sample is, and the truth there."""
SCORES = ("sign_agreement", "rank_correlation", "bias", "variance", "mse", "relative_mse", "truth_noise", "noise_share")


@dataclass(frozen=True)
class Target:
    """One checkpoint of one run to audit."""

    run_dir: Path
    checkpoint: str  # file name in run_dir
    out: Path  # where its samples go


def checkpoint_files(run_dir: Path, which: str) -> list[str]:
    """``final``: checkpoint.pt; ``kept``: the checkpoint-at-<s>.pt files; ``all``: both, earliest first."""
    kept = sorted((p.name for p in run_dir.glob("checkpoint-at-*.pt")), key=natural_key)
    final = [rundir.CHECKPOINT] if (run_dir / rundir.CHECKPOINT).exists() else []
    return {"final": final, "kept": kept, "all": kept + final}[which]


def plan(paths: Sequence[Path], which: str, out: Path, trust_env_module: bool = False) -> list[Target]:
    """Every checkpoint to audit under ``paths``; bad input (an algo without a policy of its own, an env whose
    state cannot be set, no checkpoint at all) is refused here, before any work. Run folders are data: an env
    id naming a module to import is refused unless ``trust_env_module`` (``--trust-env-module``)."""
    targets, checked = [], set()
    here = Path.cwd().resolve()
    for run in find_runs(paths):
        declared = registry.entries().get(run.algo)
        if declared is None or declared.base not in ("ppo", "grpo"):
            raise BadInput(f"{run.run_dir}: the audit scores the testbed's own ppo and grpo agents, not {run.algo}")
        env = env_label(run.config)
        if env not in checked:  # a replay check steps the env: once per env, not per run
            check_saved_env_id(run.config.get("env_id"), str(run.run_dir / "config.yaml"), trust_env_module)
            try:
                starts.restore_mode(run.config["env_id"], **(run.config.get("env_kwargs") or {}))
            except starts.NotRestorable as error:
                raise BadInput(f"{run.run_dir}: the audit restores states mid-episode, and {error}") from None
            checked.add(env)
        where = run.run_dir.resolve()
        relative = where.relative_to(here) if where.is_relative_to(here) else Path(where.name)
        for name in checkpoint_files(run.run_dir, which):
            targets.append(Target(run.run_dir, name, out / relative / name.removesuffix(".pt")))
    if not targets:
        raise BadInput(
            f"no {which} checkpoint under {', '.join(map(str, paths))}: runs keep earlier checkpoints only with --set "
            "keep_checkpoints=STEP,…; use --checkpoints final"
        )
    return targets


def done_record(target: Target, settings: AuditSettings) -> dict[str, Any] | None:
    """The audit.json of an audit of ``target`` already on disk with the same settings, else None."""
    done = target.out / "audit.json"
    if done.exists():
        record = json.loads(done.read_text())
        # An audit written before a setting existed ran with its default.
        saved = audit_gradients.full_settings(record["settings"])
        if saved == json.loads(json.dumps(asdict(settings))) and (target.out / "samples.csv").exists():
            return record
    return None


@dataclass
class Loaded:
    """A run's checkpoint, read back for the audit."""

    algo: registry.Algo
    values: dict[str, Any]  # config.yaml's values, less the algo
    cfg: Any  # the resolved config
    checkpoint: dict[str, Any]
    audit_env: AuditEnv
    model: Any  # the policy: an ActorCritic (PPO) or an Actor (GRPO)


def load_policy(run_dir: Path, name: str) -> Loaded:
    """The policy of checkpoint ``name`` of a run, with its config and the audit's env (``true_advantage``)."""
    from agents import runlog, true_advantage
    from agents.config import build_config

    values = rundir.read_config(run_dir)
    algo = registry.get(values.pop("algo"))
    cfg = build_config(algo.config, values)
    checkpoint = runlog.load_checkpoint(run_dir, {"algo": algo.name, "env_id": cfg.env_id}, name)
    audit_env = true_advantage.env_maker(cfg, checkpoint["normalizers"])
    shape_env = audit_env.make(1)
    try:
        model = algo.load_policy(cfg, shape_env, checkpoint["model"])
    finally:
        shape_env.close()
    return Loaded(algo, values, cfg, checkpoint, audit_env, model)


def measure(
    config_text: str,
    checkpoint: bytes,
    name: str,
    settings: AuditSettings,
    gradients: GradientSettings | None = None,
) -> tuple[dict[str, Any], list[dict], tuple[dict[str, Any], list[dict], list[dict]] | None]:
    """One checkpoint's audit, in a worker process on any machine: the run's config.yaml and checkpoint travel
    as data, and (the record of audit.json, the rows of samples.csv, and with ``gradients`` the gradient audit's
    record, scores and true gradient: ``lab.audit_gradients``) come back."""
    import tempfile

    import torch

    from agents import true_advantage, true_gradient

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = Path(scratch)
        (run_dir / "config.yaml").write_text(config_text)
        (run_dir / name).write_bytes(checkpoint)
        loaded = load_policy(run_dir, name)
    cfg, audit_env, model, ckpt = loaded.cfg, loaded.audit_env, loaded.model, loaded.checkpoint
    algo, values = loaded.algo.name, loaded.values
    started = time.perf_counter()
    result = true_advantage.audit(audit_env, model, cfg.gamma, settings)
    record = {
        "checkpoint": name,
        "algo": algo,
        "seed": cfg.seed,
        "env": env_label({**values, "env_id": cfg.env_id}),
        "global_step": ckpt["global_step"],
        "gamma": cfg.gamma,
        "value_scale": audit_env.reward_scale,
        "restore": audit_env.mode,
        "settings": asdict(settings),
        "branches": result.branches,
        "env_steps": result.env_steps,
        "seconds": round(time.perf_counter() - started, 1),
    }
    if gradients is None:
        return record, result.rows(), None
    batch = true_gradient.run_batch(cfg, loaded.algo.base, settings)
    found = true_gradient.gradient_audit(audit_env, model, cfg.gamma, settings, gradients, batch, result)
    gradient_record = audit_gradients.gradient_record(record, found, batch, gradients)
    return record, result.rows(), (gradient_record, found.rows(), found.truth_rows())


def read_audit(folder: Path) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """An audited checkpoint's audit.json and the rows of its samples.csv."""
    with open(folder / "samples.csv", newline="") as f:
        return json.loads((folder / "audit.json").read_text()), list(csv.DictReader(f))


def write_audit(target: Target, record: dict[str, Any], rows: list[dict]) -> dict[str, Any]:
    """samples.csv, then audit.json (which marks the audit done), in the target's folder."""
    target.out.mkdir(parents=True, exist_ok=True)
    write_rows(target.out / "samples.csv", rows)
    record = {"run_dir": str(target.run_dir), **record}
    rundir.atomic_write_text(target.out / "audit.json", json.dumps(record, indent=1))
    return record


def heartbeat_line(elapsed_s: float, done: int, total: int, workers: int, seconds_each: list[float]) -> str:
    """``[1m10s] audits 3/12 done · ETA 4m30s``: the ETA is the mean time of the audits finished in this
    invocation, times the audits left, over the workers; ``n/a`` before the first finishes."""
    eta = "n/a"
    if seconds_each:
        eta = fmt_duration(statistics.fmean(seconds_each) * (total - done) / max(1, workers))
    return f"[{fmt_duration(elapsed_s)}] audits {done}/{total} done · ETA {eta}"


def run_audits(
    targets: list[Target],
    settings: AuditSettings,
    workers: int,
    backend: str = "local",
    ray_address: str | None = None,
    heartbeat_s: float = HEARTBEAT_S,
    gradients: GradientSettings | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every target's audit not yet on disk (with ``gradients``, its gradient audit too: ``lab.audit_gradients``),
    ``workers`` at a time on this machine (``local``) or as Ray tasks of one CPU each (``ray``). Each is written
    as soon as it finishes, with a line printed, and a heartbeat line comes every ``heartbeat_s`` seconds; one
    that fails is reported and the others go on. A checkpoint whose advantage audit is done but not its gradient
    audit measures both again (the gradient audit needs the samples' states) and writes the gradients only.
    Returns the records of the audits done (in the targets' order) and a line for each failure."""
    records = {i: done_record(target, settings) for i, target in enumerate(targets)}
    done = {
        i
        for i, record in records.items()
        if record is not None
        and (gradients is None or audit_gradients.done_gradients(targets[i].out, settings, gradients) is not None)
    }
    todo = [i for i in range(len(targets)) if i not in done]
    jobs = {
        i: (
            (targets[i].run_dir / "config.yaml").read_text(),
            (targets[i].run_dir / targets[i].checkpoint).read_bytes(),
            targets[i].checkpoint,
        )
        for i in todo
    }
    failures: list[str] = []
    seconds_each: list[float] = []  # the audits finished by this invocation: the ETA's basis

    def beat(elapsed_s: float) -> None:
        print(heartbeat_line(elapsed_s, len(done), len(targets), workers, seconds_each), flush=True)

    def finished(i: int, result: Callable[[], tuple[dict[str, Any], list[dict], Any]]) -> None:
        target = targets[i]
        try:
            record, rows, found = result()
            if records[i] is None:
                records[i] = write_audit(target, record, rows)
            if found is not None:
                audit_gradients.write_gradients(target.out, target.run_dir, *found)
        except Exception as error:  # noqa: BLE001  one checkpoint's failure is reported; the others go on
            failures.append(f"{target.run_dir / target.checkpoint}: {type(error).__name__}: {error}")
            print(f"failed: {failures[-1]}", file=sys.stderr, flush=True)
            return
        done.add(i)
        seconds, extra = record["seconds"], ""
        if found is not None:
            costs = [found[0][part] for part in ("batches", "split")]
            seconds += sum(cost["seconds"] for cost in costs)
            extra = f"; gradients {sum(cost['env_steps'] for cost in costs):,} env steps more, {seconds:.0f} s in all"
        seconds_each.append(seconds)
        print(
            f"[{len(done)}/{len(targets)}] {record['env']} {record['algo']} seed {record['seed']} at step "
            f"{record['global_step']:,}: {record['env_steps']:,} env steps, {record['seconds']:.0f} s{extra}",
            flush=True,
        )

    with Heartbeat(beat, heartbeat_s):
        if backend == "ray":
            from lab.executor import connect_ray, import_ray

            ray = import_ray()
            connect_ray(ray_address, workers)
            remote = ray.remote(num_cpus=1)(measure)
            pending = {remote.remote(*jobs[i], settings, gradients): i for i in todo}
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                finished(pending.pop(ready[0]), partial(ray.get, ready[0]))
        else:
            with ProcessPoolExecutor(max_workers=max(1, workers), mp_context=get_context("spawn")) as pool:
                futures = {pool.submit(measure, *jobs[i], settings, gradients): i for i in todo}
                for future in as_completed(futures):
                    finished(futures[future], future.result)
    return [r for r in (records[i] for i in range(len(targets))) if r is not None], failures


def checkpoint_scores(record: dict[str, Any], samples: list[dict[str, str]]) -> list[dict[str, Any]]:
    """One row per estimator and distance bin (``all`` first) of one audited checkpoint (:func:`read_audit`)."""
    import torch

    from agents.audit_scores import scores

    estimators = [name for name in samples[0] if name not in SAMPLE_COLUMNS]
    rows = []
    bins = [("all", samples)] + [
        (f"{low}–{high - 1}" if high < 10**9 else f"≥{low}", [s for s in samples if low <= int(s["steps_left"]) < high])
        for low, high in DISTANCE_BINS
    ]
    for bin_name, chosen in bins:
        if not chosen:
            continue
        truth = torch.tensor([float(s["truth"]) for s in chosen], dtype=torch.float64)
        se = torch.tensor([float(s["truth_se"]) for s in chosen], dtype=torch.float64)
        spread, share = float(truth.var(unbiased=False)), noise_share(truth, se)
        for name in estimators:
            estimate = torch.tensor([float(s[name]) for s in chosen], dtype=torch.float64)
            score = scores(estimate, truth, se)
            score["relative_mse"] = score["mse"] / spread if spread > 0 else None
            score["noise_share"] = share
            rows.append(
                {
                    "env": record["env"],
                    "algo": record["algo"],
                    "seed": record["seed"],
                    "global_step": record["global_step"],
                    "checkpoint": record["checkpoint"],
                    "estimator": name,
                    "steps_left": bin_name,
                    **score,
                }
            )
    return rows


def mean_or_none(values: list[Any]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Scores averaged over seeds, per (env, algo, checkpoint, estimator, bin); ``seeds`` counts them."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[(row["env"], row["algo"], row["checkpoint"], row["estimator"], row["steps_left"])].append(row)
    return [
        {
            "env": env,
            "algo": algo,
            "checkpoint": checkpoint,
            "estimator": estimator,
            "steps_left": bin_name,
            "seeds": len(members),
            "samples": sum(m["samples"] for m in members),
            "signed": sum(m["signed"] for m in members),
            "global_step": round(statistics.fmean(m["global_step"] for m in members)),
            **{score: mean_or_none([m[score] for m in members]) for score in SCORES},
        }
        for (env, algo, checkpoint, estimator, bin_name), members in groups.items()
    ]


def _fmt(value: float | None) -> str:
    return fmt_sig(value, 3)


def plot_scores(summary: list[dict[str, Any]], out: Path) -> Path:
    """Rank correlation, sign agreement and MSE / Var[A] (all samples) against the env (horizon, delay), one
    line per estimator, one row of panels per algo and checkpoint."""
    import matplotlib

    from lab.plot import new_figure, save_figure

    rows = [r for r in summary if r["steps_left"] == "all"]
    envs = sorted({r["env"] for r in rows}, key=natural_key)
    policies = sorted({(r["algo"], r["checkpoint"]) for r in rows})
    panels = [
        ("rank_correlation", "Spearman ρ(Â, A)"),
        ("sign_agreement", "sign agreement"),
        ("relative_mse", "MSE / Var[A]"),
    ]
    fig, axes = new_figure(len(panels) * len(policies), ncols=len(panels), panel_size=(4.6, 3.2))
    # One colour per estimator across every panel; up to 20 estimators stay apart.
    palette = matplotlib.colormaps["tab20"]
    colours = {name: palette(k % 20) for k, name in enumerate(sorted({r["estimator"] for r in rows}))}
    for p, (algo, checkpoint) in enumerate(policies):
        mine = [r for r in rows if (r["algo"], r["checkpoint"]) == (algo, checkpoint)]
        for (score, label), ax in zip(panels, axes[p * len(panels) : (p + 1) * len(panels)]):
            for estimator in sorted({r["estimator"] for r in mine}):
                points = [
                    (envs.index(r["env"]), r[score])
                    for r in mine
                    if r["estimator"] == estimator and r[score] is not None
                ]
                if points:
                    ax.plot(*zip(*sorted(points)), marker="o", label=estimator, color=colours[estimator])
            ax.set_xticks(
                range(len(envs)), [e.partition("[")[2].rstrip("]") or e for e in envs], rotation=30, fontsize=7
            )
            ax.set_title(f"{algo}, {checkpoint}: {label}", fontsize=9)
            if score == "relative_mse":
                ax.set_yscale("symlog", linthresh=0.1)
                ax.set_ylim(bottom=0)  # a ratio of squares: never negative
        labelled = [ax for ax in axes[p * len(panels) : (p + 1) * len(panels)] if ax.get_legend_handles_labels()[0]]
        if labelled:
            labelled[0].legend(fontsize=6)
    return save_figure(fig, out / "plots" / "audit-scores.png")[0]


def plot_scatter(out: Path, audits: list[list[dict[str, str]]], env: str) -> Path:
    """Estimate against truth for every sample of ``env``'s audits (each a samples.csv's rows), one panel per
    estimator."""
    from lab.plot import new_figure, save_figure

    samples: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for rows in audits:
        for s in rows:
            for name, value in s.items():
                if name not in SAMPLE_COLUMNS:
                    samples[name].append((float(s["truth"]), float(value)))
    fig, axes = new_figure(len(samples), ncols=4, panel_size=(3.2, 3.0))
    for (name, points), ax in zip(samples.items(), axes):
        ax.scatter(*zip(*points), s=6, alpha=0.5, rasterized=True)  # thousands of points: an image inside the SVG
        ax.axhline(0, color="grey", lw=0.5)
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("true advantage A", fontsize=8)
    slug = "".join(c if c.isalnum() else "_" for c in env).strip("_")
    return save_figure(fig, out / "plots" / f"scatter-{slug}.png")[0]


def build_report(out: Path, command: str) -> dict[str, Path]:
    """scores.csv, audit.md, audit.html and the plots, from every audit.json under ``out``."""
    folders = sorted((p.parent for p in out.rglob("audit.json")), key=lambda p: natural_key(str(p)))
    if not folders:
        raise BadInput(f"{out} holds no audited checkpoint (audit.json); run testbed audit first")
    audits = [read_audit(folder) for folder in folders]
    records = [record for record, _ in audits]
    rows = [row for record, samples in audits for row in checkpoint_scores(record, samples)]
    write_rows(out / "scores.csv", rows)
    summary = summarize(rows)
    cost = sum(r["seconds"] for r in records)
    settings = records[0]["settings"]
    K, reached = settings["branches"], sorted({record.get("branches", settings["branches"]) for record in records})
    rollouts = f"{K} Q- and {K} V-rollouts each"
    if settings.get("max_branches"):
        rollouts += (
            f", {K} more of each at a time while the truth's noise share exceeded {settings['noise_target']:.0%}, up "
            f"to {settings['max_branches']} (reached: {', '.join(map(str, reached))})"
        )
    blocks: list[Block] = [
        Heading(1, "Advantage estimators against the Monte-Carlo truth"),
        Para(
            f"Command: `{command}`. {len(records)} checkpoints; per checkpoint {settings['samples']} sampled steps of "
            f"{settings['groups']}×{settings['group_size']} trunk episodes, the truth from {rollouts} (common random "
            f"numbers), vine values from {settings['vine_branches']} rollouts. Audit seed {settings['seed']}. Cost: "
            f"{sum(r['env_steps'] for r in records):,} env steps; the checkpoints' audits took {cost:,.0f} s together "
            "(each one's wall time, in one process)."
        ),
        Para(
            "Sign agreement counts samples whose truth is more than 2 standard errors from 0. ρ is Spearman's rank "
            "correlation. Bias, variance and MSE are in the estimator's own units; outcome, process and step_alive are "
            "normalized, so compare them by ρ and sign. MSE / Var[A] is 0 for a perfect estimate and 1 for one as far "
            "off as the truth's own spread. Truth noise is the mean SE², the part of the MSE the truth adds. Noise "
            "share is truth noise / Var[A]: near 0, the truth is sharp against what it measures. Scores are means over "
            "seeds."
        ),
        Image(
            "plots/audit-scores.png",
            "scores against the env",
            "Rank correlation, sign agreement and MSE / Var[A] per estimator (all samples), for each algo and "
            "checkpoint",
        ),
    ]
    plot_scores(summary, out)
    header = [
        "algo",
        "checkpoint (mean step)",
        "estimator",
        "seeds",
        "samples",
        "clearly signed",
        "sign agr.",
        "ρ",
        "bias",
        "variance",
        "MSE",
        "MSE / Var[A]",
        "truth noise",
        "noise share",
    ]
    noisy = sorted(
        {
            (r["env"], r["algo"], r["checkpoint"])
            for r in summary
            if r["steps_left"] == "all" and r["noise_share"] is not None and r["noise_share"] > NOISE_TARGET
        }
    )
    if noisy:
        blocks.append(
            Para(
                f"**Too few rollouts** for {len(noisy)} of the audited (env, algo, checkpoint) cells: there the "
                f"truth's noise is more than {NOISE_TARGET:.0%} of its spread (noise share = mean SE² / Var[A]), so "
                "its scores measure the noise as much as the estimators. More `--branches` shrink SE² in proportion; "
                "`--max-branches` adds them where needed: " + "; ".join(f"{e} {a} {c}" for e, a, c in noisy) + "."
            )
        )
    for env in sorted({r["env"] for r in summary}, key=natural_key):
        mine = sorted(
            (r for r in summary if r["env"] == env and r["steps_left"] == "all"),
            key=lambda r: (r["algo"], r["global_step"], r["estimator"]),
        )
        blocks += [
            Heading(2, env),
            Table(
                header,
                [
                    [
                        r["algo"],
                        f"{r['checkpoint']} ({r['global_step']:,})",
                        r["estimator"],
                        str(r["seeds"]),
                        str(r["samples"]),
                        str(r["signed"]),
                        *(_fmt(r[s]) for s in SCORES),
                    ]
                    for r in mine
                ],
            ),
        ]
        image = plot_scatter(out, [samples for record, samples in audits if record["env"] == env], env)
        shown = env.replace("[", " (").replace("]", ")")  # brackets would end a Markdown image's alt text
        blocks.append(
            Image(
                str(image.relative_to(out)),
                f"estimate against truth on {shown}",
                f"Every sample of {shown}, all algos and checkpoints",
            )
        )
    blocks += audit_gradients.report_blocks(out)
    paths = {"md": out / "audit.md", "html": out / "audit.html", "csv": out / "scores.csv"}
    rundir.atomic_write_text(paths["md"], render_markdown(blocks))
    rundir.atomic_write_text(paths["html"], render_html(blocks, "Advantage audit", out))
    return paths
