"""``testbed audit --gradients``: the policy gradient each advantage estimator gives on a batch of the run's own
size, scored against the true gradient, and the variance split (``agents.true_gradient``), per checkpoint.

Each checkpoint's gradient audit goes to ``OUT/<run>/<checkpoint>/`` beside its advantage audit:
``gradient_scores.csv`` (one row per estimator), ``true_gradient.csv`` (g and its standard error per coordinate
of θ) and ``gradients.json`` (settings, batch size, norms, costs), written last, which marks it done; one
already done with the same settings is not redone. The report's section: :func:`report_blocks`.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agents import rundir
from agents.true_advantage import AuditSettings
from agents.true_gradient import SPLIT_PARTS, Batch, GradientAudit, GradientSettings
from lab.document import DASH, Block, Heading, Para, Table, counted, fmt_sig, write_rows
from lab.results import natural_key

RECORD, SCORES, TRUTH = "gradients.json", "gradient_scores.csv", "true_gradient.csv"


def full_settings(saved: dict[str, Any]) -> dict[str, Any]:
    """An audit's settings as audit.json keeps them, with the default of each setting it was written before, as
    JSON reads them back (tuples as lists)."""
    return {**json.loads(json.dumps(asdict(AuditSettings()))), **saved}


def done_gradients(out: Path, settings: AuditSettings, gradients: GradientSettings) -> dict[str, Any] | None:
    """The gradients.json of a gradient audit in ``out`` already on disk with the same settings, else None."""
    done = out / RECORD
    if not done.exists() or not (out / SCORES).exists():
        return None
    record = json.loads(done.read_text())
    asked = json.loads(json.dumps({"settings": asdict(settings), "gradients": asdict(gradients)}))
    return record if {key: record.get(key) for key in asked} == asked else None


def gradient_record(
    audit_record: dict[str, Any], result: GradientAudit, batch: Batch, gradients: GradientSettings
) -> dict[str, Any]:
    """gradients.json's record, from the advantage audit's record (``lab.audit.measure``) and the gradient audit."""
    truth, batches = result.truth, result.batches
    return {
        **{key: audit_record[key] for key in ("checkpoint", "algo", "seed", "env", "global_step", "settings")},
        "gradients": asdict(gradients),
        "batch": {
            **asdict(batch),
            "mean_steps": statistics.fmean(b.steps for b in batches),
            "mean_episodes": statistics.fmean(b.episodes for b in batches),
        },
        "truth": {
            "samples": truth.samples,
            "norm": float(truth.gradient.norm()),
            "standard_error_norm": float(truth.standard_error.norm()),
            "env_steps": truth.env_steps,
            "seconds": round(audit_record["seconds"] + result.seconds["truth"], 1),
        },
        "batches": {"env_steps": sum(b.env_steps for b in batches), "seconds": round(result.seconds["batches"], 1)},
        "split": {
            "states": result.split_states,
            "env_steps": result.split_env_steps,
            "seconds": round(result.seconds["split"], 1),
        },
    }


def write_gradients(out: Path, run_dir: Path, record: dict[str, Any], rows: list[dict], truth: list[dict]) -> None:
    """gradient_scores.csv and true_gradient.csv, then gradients.json (which marks the gradient audit done)."""
    out.mkdir(parents=True, exist_ok=True)
    write_rows(out / SCORES, rows)
    write_rows(out / TRUTH, truth)
    rundir.atomic_write_text(out / RECORD, json.dumps({"run_dir": str(run_dir), **record}, indent=1))


def read_gradients(out: Path) -> list[tuple[dict[str, Any], list[dict[str, str]]]]:
    """Every gradient audit under ``out`` that rests on the advantage audit beside it (one left from an audit since
    redone with other settings is not): its gradients.json and the rows of its gradient_scores.csv."""
    found = []
    for record_path in sorted(out.rglob(RECORD), key=lambda p: natural_key(str(p))):
        record, beside = json.loads(record_path.read_text()), record_path.with_name("audit.json")
        if not beside.exists() or full_settings(json.loads(beside.read_text())["settings"]) != record["settings"]:
            continue
        with open(record_path.with_name(SCORES), newline="") as f:
            found.append((record, list(csv.DictReader(f))))
    return found


def number(text: str | None) -> float | None:
    return float(text) if text not in (None, "") else None


def summarize(audits: list[tuple[dict[str, Any], list[dict[str, str]]]]) -> list[dict[str, Any]]:
    """Per (env, algo, checkpoint, estimator): the scores' and split's means over seeds; a score's standard error
    is that of a mean of independent per-seed means, √(Σ SE²) / seeds."""
    groups: dict[tuple, list[tuple[dict[str, Any], dict[str, str]]]] = defaultdict(list)
    for record, rows in audits:
        for row in rows:
            groups[(record["env"], record["algo"], record["checkpoint"], row["estimator"])].append((record, row))
    summary = []
    for (env, algo, checkpoint, estimator), members in groups.items():
        batch = members[0][0]["batch"]
        entry: dict[str, Any] = {
            "env": env,
            "algo": algo,
            "checkpoint": checkpoint,
            "estimator": estimator,
            "seeds": len(members),
            "global_step": round(statistics.fmean(record["global_step"] for record, _ in members)),
            "batch": f"{batch['steps']:,} steps"
            if batch["steps"] is not None
            else f"{batch['groups']}×{batch['group_size']} episodes",
            "scored": any(row["batch_steps"] for _, row in members),
        }
        for score in ("cosine", "relative_error"):
            values = [number(row[score]) for _, row in members]
            ses = [number(row[f"{score}_se"]) for _, row in members]
            present = [v for v in values if v is not None]
            entry[score] = statistics.fmean(present) if present else None
            entry[f"{score}_se"] = (
                math.sqrt(sum(se**2 for se in ses)) / len(ses) if present and None not in ses else None
            )
        for part in SPLIT_PARTS:
            parts = [number(row[f"var_{part}"]) for _, row in members]
            entry[f"var_{part}"] = statistics.fmean(parts) if None not in parts else None
        summary.append(entry)
    return summary


def with_se(value: float | None, se: float | None) -> str:
    if value is None:
        return DASH
    return fmt_sig(value, 3) if se is None else f"{fmt_sig(value, 3)} ± {fmt_sig(se, 2)}"


def share(part: float | None, total: float | None) -> str:
    return DASH if part is None or not total else f"{part / total:.0%}"


def report_blocks(out: Path) -> list[Block]:
    """The report's gradient section, and ``OUT/gradient_scores.csv`` with every checkpoint's rows; nothing where
    no checkpoint's gradients were audited."""
    audits = read_gradients(out)
    if not audits:
        return []
    keys = ("env", "algo", "seed", "global_step", "checkpoint")
    write_rows(out / SCORES, [{**{k: record[k] for k in keys}, **row} for record, rows in audits for row in rows])
    records = [record for record, _ in audits]
    gradients = records[0]["gradients"]
    blocks: list[Block] = [
        Heading(2, "Policy gradients against the true gradient"),
        Para(
            "The true gradient g = E[A(s, a) ∇log π(a|s)] comes from the samples above (their true advantages), with "
            "a standard error clustered by start state. Each estimator's ĝ is the gradient of the surrogate "
            "mean_j Â_j log π(a_j|s_j) (at the batch's own policy, also the gradient of PPO's clipped objective) on a "
            "batch of the size one update of the run trains on (PPO: n_envs × n_steps env steps; GRPO: num_groups × "
            f"group_size episodes), over {gradients['batches']} independent batches per checkpoint"
            + (", the vine's values from rollouts at every state of a batch" if gradients["vine"] else "")
            + ". cos is cos(ĝ, g) (1: the true direction); rel. error is ‖ĝ − g‖ / ‖g‖ (0: the true gradient; 1: "
            "as far off as ĝ = 0); both are means over the batches ± their standard errors (over seeds, √ΣSE² / "
            "seeds). outcome, process and step_alive are normalized: judge them by cos. The variance split (Tucker "
            f"et al. 2018) is of the per-sample gradient Â ∇log π(a|s), from {gradients['split_states']} states × "
            f"{gradients['split_actions']} actions × {gradients['split_rollouts']} rollouts each: Var[g] and the "
            "shares of it that come from the state, the action and the rest of the trajectory, for the Monte-Carlo "
            "return with no baseline (return), less the mean of the state's other returns (return_state_mean) and "
            "less the run's critic (return_critic, PPO). A share can come out negative when the part is small."
        ),
    ]
    vague = [r for r in records if r["truth"]["standard_error_norm"] > r["truth"]["norm"] / 2]
    if vague:
        blocks.append(
            Para(
                f"**The truth is vague** for {len(vague)} of {len(records)} checkpoints: the norm of its standard "
                "errors is more than half of ‖g‖, so the scores there measure its noise as much as the estimators. "
                "More `--samples` (and `--groups`, the clusters) shrink it: "
                + "; ".join(f"{r['env']} {r['algo']} seed {r['seed']} {r['checkpoint']}" for r in vague)
                + "."
            )
        )
    header = ["algo", "checkpoint (mean step)", "estimator", "seeds", "batch", "cos ± SE", "rel. error ± SE"]
    header += ["Var[g]", "state", "action", "trajectory"]
    summary = summarize(audits)
    for env in sorted({r["env"] for r in summary}, key=natural_key):
        mine = sorted(
            (r for r in summary if r["env"] == env), key=lambda r: (r["algo"], r["global_step"], r["checkpoint"])
        )
        rows = [
            [
                r["algo"],
                f"{r['checkpoint']} ({r['global_step']:,})",
                r["estimator"],
                str(r["seeds"]),
                r["batch"] if r["scored"] else DASH,
                with_se(r["cosine"], r["cosine_se"]),
                with_se(r["relative_error"], r["relative_error_se"]),
                fmt_sig(r["var_total"], 3),
                *(share(r[f"var_{part}"], r["var_total"]) for part in ("state", "action", "trajectory")),
            ]
            for r in mine
        ]
        cost = [record for record in records if record["env"] == env]
        blocks += [
            Heading(3, f"{env}: gradients"),
            Para(
                f"The truth: {cost[0]['truth']['samples']} samples per checkpoint, "
                f"{sum(c['truth']['env_steps'] for c in cost):,} env steps and "
                f"{sum(c['truth']['seconds'] for c in cost):,.1f} s over {counted(len(cost), 'checkpoint')}; the "
                f"batches {sum(c['batches']['env_steps'] for c in cost):,} env steps and "
                f"{sum(c['batches']['seconds'] for c in cost):,.1f} s; the split "
                f"{sum(c['split']['env_steps'] for c in cost):,} env steps and "
                f"{sum(c['split']['seconds'] for c in cost):,.1f} s. Mean ‖g‖ "
                f"{fmt_sig(statistics.fmean(c['truth']['norm'] for c in cost), 3)}, the norm of its standard errors "
                f"{fmt_sig(statistics.fmean(c['truth']['standard_error_norm'] for c in cost), 3)}."
            ),
            Table(header, rows),
        ]
    return blocks
