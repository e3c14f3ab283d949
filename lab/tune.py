"""Hyperparameter studies: Optuna's TPE sampler and median pruner over ordinary training runs.

``testbed tune --algo ALGO --env ENV_ID`` is RL Zoo's ``--optimize`` for this testbed. Each trial samples
config values from a search space (the one the algo's module declares by default, or a YAML file), trains its K seeds
side by side as ordinary ``testbed train`` runs under ``runs/tune/NAME/trialNNNN/``, and scores the
mean of their final evaluations. While they train, the mean over seeds of each evaluation is reported
to the pruner, which stops a trial that falls below the median of earlier trials at the same step.

The study lives in a storage that Optuna reads: by default a journal file, ``runs/tune/NAME/study.log``;
with ``--storage URL`` any database Optuna accepts, so drivers on several machines can share one study.
A study is idempotent: ``--trials N`` is the study's total, so a rerun adds only what is missing, and a
trial that a killed driver left running resumes from its runs' checkpoints, wherever the study folder now is
(``lab.study.left_running``). Trials run on the same backends as ``bench`` (``lab.bench``): the local pool,
or one Ray task per trial; a failed trial is recorded with its error and the study goes on.

Trials train equal budgets. A run trains whole iterations, and PPO's, n_steps · n_envs, is what trials tune: the
budget is rounded up to a multiple of every iteration size the space allows (``lab.space.iteration_sizes``).
GRPO's iterations end with their episodes: its trials may train up to one more, as the report shows.

A study starts from the shipped presets (:func:`starting_points`): the env's own, then the algo's
default for the action space, so the report shows whether tuning beat them. Tuning seeds start at 100 by
default: the seeds ``bench`` reports on (0 …) stay unseen by the search.
"""

from __future__ import annotations

import dataclasses
import math
import socket
import sys
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import optuna
import yaml

from agents import registry, rundir
from agents.config import SEED_LIMIT, build_config, load_preset, parse_overrides
from envs import action_space_of
from envs.errors import BadInput
from lab.bench import BENCH_NAME
from lab.cells import Cell, Outcome, Stop, pack_stacks
from lab.document import fmt_return
from lab.executor import connect_ray, import_ray, pack_run, receive_cell, stop_signals
from lab.plan import resolve_run
from lab.space import (
    Param,
    admitting,
    as_list,
    default_space,
    for_action_space,
    iteration_sizes,
    parse_space,
    with_ranges,
)
from lab.study import (
    STUDY_FILE,
    STUDY_ID,
    TUNE_FILE,
    TUNE_ROOT,
    check_journal,
    left_running,
    read_tune_yaml,
    set_aside_stale,
    storage_for,
    study_id_of,
    trial_dir,
)
from lab.trials import (
    REFUSED,
    Reporter,
    known_costs,
    reporter_for,
    run_trial,
    run_trial_remote,
    settle,
    study_heartbeat,
)
from lab.tune_report import budget_text, build_tune_report, pairs_text, seeds_text

FIRST_TUNING_SEED = 100
RESERVED = {"seed": "--first-seed and --seeds", "total_steps": "--total-steps", "env_id": "--env"}
"""Config keys a study sets itself, which neither its space nor --set may."""


# ── a study's plan: everything is checked before the first trial starts ─────────────────────────────


@dataclass(frozen=True)
class TunePlan:
    name: str
    algo: str
    env_id: str
    continuous: bool  # the env's action space is a Box: which of the presets' defaults applies
    trials: int
    total_steps: int | None  # as asked; None: the preset's budget
    seeds: tuple[int, ...]
    space: dict[str, Param]
    space_text: str
    sets: tuple[str, ...]
    storage: str | None  # None: the journal file in the study's folder
    pruner: str
    startup_trials: int
    sampler_seed: int
    steps_per_seed: int | None = None  # what every trial trains per seed; None until plan_tune resolves it
    iteration_sizes: tuple[int, ...] | None = None  # env steps an iteration can take (iteration_sizes); None: they vary

    def definition(self) -> dict[str, Any]:
        """What makes two runs of ``tune`` the same study: a rerun with another definition is refused."""
        return {
            "algo": self.algo,
            "env_id": self.env_id,
            "total_steps": self.total_steps,
            "seeds": list(self.seeds),
            "sets": list(self.sets),
            "space": yaml.safe_load(self.space_text),
        }

    def describe(self) -> str:
        """The study's size in one line, as the console prints it before the first trial."""
        assert self.steps_per_seed is not None
        return (
            f"{self.trials} trials; {seeds_text(self.seeds)}; budget "
            f"{budget_text(self.total_steps, self.steps_per_seed, self.iteration_sizes)}"
        )

    def cells(self, overrides: list[str]) -> list[Cell]:
        """A trial's runs: one per seed, with the study's --set pairs and the trial's sampled values."""
        pairs = (*self.sets, *overrides)
        return [Cell(self.algo, self.env_id, seed, self.steps_per_seed, pairs) for seed in self.seeds]

    def config(self, values: dict[str, Any]) -> Any:
        """The validated config a trial with these sampled values trains; BadInput if the algo refuses it."""
        fixed: dict[str, Any] = {**parse_overrides(list(self.sets)), **values, "seed": self.seeds[0]}
        steps = self.steps_per_seed or self.total_steps
        if steps is not None:
            fixed["total_steps"] = steps
        return resolve_run(registry.get(self.algo), self.env_id, fixed)[0]


def read_space_file(path: Path) -> tuple[str, str]:
    """A ``--space FILE``'s text and the name messages give it; BadInput where it cannot be read."""
    form = "give a YAML search space, config keys mapped to [choices] or {low, high} (docs/tuning.md)"
    if not path.is_file():
        raise BadInput(f"--space {path}: no such file; {form}")
    try:
        return path.read_bytes().decode("utf-8"), path.name
    except UnicodeDecodeError:
        raise BadInput(f"--space {path} is not UTF-8 text; {form}") from None
    except OSError as error:
        raise BadInput(f"--space {path}: cannot be read ({error.strerror or error}); {form}") from None


def plan_tune(
    algo: str,
    env_id: str,
    trials: int,
    total_steps: int | None,
    seeds: int,
    space_file: str | None,
    sets: list[str],
    name: str | None,
    storage: str | None = None,
    first_seed: int = FIRST_TUNING_SEED,
    pruner: str = "median",
    startup_trials: int = 5,
    sampler_seed: int = 0,
    varies: tuple[str, ...] = (),
) -> TunePlan:
    """Resolve and check a study's settings: the algo, env, space, budget, seeds and the preset they vary."""
    spec = registry.get(algo)
    name = name or f"{algo}-{env_id.replace('/', '_')}"
    if not BENCH_NAME.fullmatch(name):
        raise BadInput(
            f"--name {name!r} is not a study name: give one folder name (it becomes runs/tune/NAME) made of letters, "
            "digits, '.', '_' and '-', not starting with '.'"
        )
    if trials < 1:
        raise BadInput(f"--trials must be at least 1, got {trials}")
    if seeds < 1:
        raise BadInput(f"--seeds must be at least 1, got {seeds}")
    if not (first_seed >= 0 and first_seed + seeds - 1 < SEED_LIMIT):
        raise BadInput(f"--first-seed must leave every seed in [0, 2**32 - 1], got {first_seed}")
    if total_steps is not None and total_steps < 1:
        raise BadInput(f"--total-steps must be positive, got {total_steps}")
    if pruner not in ("median", "none"):
        raise BadInput(f"unknown --pruner {pruner!r}; choose median or none")
    if startup_trials < 0:
        raise BadInput(f"--startup-trials must be >= 0, got {startup_trials}")
    continuous = isinstance(action_space_of(env_id), gym.spaces.Box)  # BadInput for an id gymnasium does not know
    if space_file is not None:
        text, source = read_space_file(Path(space_file))
    else:
        text, source = default_space(spec)
    text = with_ranges(text, varies, source)
    space = parse_space(text, source)
    fields = [f.name for f in dataclasses.fields(spec.config)]
    unknown = sorted(set(space) - set(fields))
    if unknown:
        raise BadInput(
            f"{source}: {', '.join(unknown)} {'is not a config key' if len(unknown) == 1 else 'are not config keys'} "
            f"of {algo}; valid keys: {', '.join(fields)}"
        )
    fixed = sorted(set(space) & set(spec.fixed))
    if fixed and space_file is None:  # a variant's default space: its parent's, less what the variant fixes
        text = yaml.safe_dump({k: v for k, v in yaml.safe_load(text).items() if k not in fixed}, sort_keys=False)
        space = parse_space(text, source)
    elif fixed:
        raise BadInput(
            f"{source}: {algo} fixes {', '.join(fixed)}; remove {'it' if len(fixed) == 1 else 'them'} from the space, "
            "or tune the algo it varies"
        )
    text, space = for_action_space(text, space, continuous)  # no σ to tune on discrete actions
    set_keys = {pair.partition("=")[0].strip() for pair in sets}
    for key, option in RESERVED.items():
        if key in space or key in set_keys:
            where = f"{source} tunes" if key in space else "--set fixes"
            raise BadInput(f"{where} {key}, which a study sets itself from {option}; remove it from there")
    if set_keys & set(spec.fixed):
        keys = ", ".join(sorted(set_keys & set(spec.fixed)))
        raise BadInput(f"{algo} fixes {keys}; use --algo {spec.base} to set {keys}")
    swept = sorted(set(space) & set_keys)
    if swept:
        raise BadInput(f"--set {', '.join(swept)} fixes what the space tunes; drop one of the two")
    plan = TunePlan(
        name,
        algo,
        env_id,
        continuous,
        trials,
        total_steps,
        tuple(range(first_seed, first_seed + seeds)),
        space,
        text,
        tuple(sets),
        storage,
        pruner,
        startup_trials,
        sampler_seed,
    )
    base = plan.config({})  # the preset with --set: BadInput for a bad key or value
    spec.validate(base)
    for param in space.values():
        for value in param.ends():
            try:
                admitting(plan.config, {param.name: value}, space)
            except BadInput as error:
                raise BadInput(
                    f"{source}: {param.name} includes {value!r}, which {algo} refuses ({error}); narrow the range"
                ) from None
    sizes = iteration_sizes(space, plan.config, source)
    asked = base.total_steps  # --total-steps, else the preset's
    steps = asked if sizes is None else math.ceil(asked / math.lcm(*sizes)) * math.lcm(*sizes)
    return dataclasses.replace(plan, steps_per_seed=steps, iteration_sizes=sizes)


# ── the study ──────────────────────────────────────────────────────────────────────────────────────


def open_study(plan: TunePlan, tune_dir: Path) -> optuna.Study:
    """Create or load the study NAME in its storage, with its sampler and pruner."""

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warmup = plan.config({}).total_steps // 3  # RL Zoo: no pruning in the first third of the budget
    pruner = (
        optuna.pruners.MedianPruner(n_startup_trials=plan.startup_trials, n_warmup_steps=warmup)
        if plan.pruner == "median"
        else optuna.pruners.NopPruner()
    )
    study = optuna.create_study(
        storage=storage_for(plan.storage, tune_dir),
        study_name=plan.name,
        direction="maximize",
        pruner=pruner,
        load_if_exists=True,
    )
    # Seeded by the number of trials the study holds: a study run in one go is reproducible, and a resumed
    # one does not draw the random start-up trials it drew before.
    study.sampler = optuna.samplers.TPESampler(
        seed=plan.sampler_seed + len(study.get_trials(deepcopy=False)), n_startup_trials=max(plan.startup_trials, 1)
    )
    return study


def check_tune_dir(tune_dir: Path, plan: TunePlan) -> None:
    path = tune_dir / TUNE_FILE
    if path.exists():
        saved = read_tune_yaml(tune_dir)
        if {k: saved.get(k) for k in plan.definition()} != plan.definition():
            differ = sorted(k for k, v in plan.definition().items() if saved.get(k) != v)
            raise BadInput(
                f"{tune_dir} holds a study with other {', '.join(differ)}; use another --name for different settings"
            )
        if saved.get("steps_per_seed", plan.steps_per_seed) != plan.steps_per_seed:  # same settings, other presets
            raise BadInput(
                f"{tune_dir} holds a study whose trials trained {saved['steps_per_seed']:,} env steps per seed, and "
                f"the same settings now give {plan.steps_per_seed:,} (the presets changed); use another --name"
            )


def write_tune_yaml(tune_dir: Path, plan: TunePlan) -> str:
    """Write the study's settings and the command that ran it into tune.yaml; returns the folder's identity
    (``lab.study.STUDY_ID``), made with the study and kept through reruns, moves and renames."""
    path = tune_dir / TUNE_FILE
    saved = read_tune_yaml(tune_dir) if path.exists() else {}
    merged = {
        "name": plan.name,
        STUDY_ID: study_id_of(saved),
        **plan.definition(),
        "steps_per_seed": plan.steps_per_seed,
        "trials": plan.trials,
        "iteration_sizes": list(plan.iteration_sizes or []) or None,
        "storage": plan.storage,
        "pruner": plan.pruner,
        "startup_trials": plan.startup_trials,
        "sampler_seed": plan.sampler_seed,
        "commands": [*saved.get("commands", []), " ".join(["testbed", *sys.argv[1:]])],
    }
    tune_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(merged, sort_keys=False))
    return merged[STUDY_ID]


def starting_points(plan: TunePlan) -> dict[str, dict[str, Any]]:
    """The presets a study tries first, as values of the space's parameters (the rest of a trial's config is
    always the env's preset): the env's own preset (``env``), with the values the space can express; then,
    if the space can express all of them and they differ, the values of the algo's default for the env's
    action space (``default``, what an env without a preset entry gets)."""
    spec = registry.get(plan.algo)
    default, _ = load_preset(spec.preset, "", plan.continuous)  # "": no env entry
    configs = {
        "env": plan.config({}),
        "default": build_config(
            spec.config, {**default, "env_id": plan.env_id, **spec.fixed, **parse_overrides(list(plan.sets))}
        ),
    }
    points: dict[str, dict[str, Any]] = {}
    for label, cfg in configs.items():
        resolved = rundir.config_to_dict(cfg)
        expressed = {name: p.expressing(as_list(resolved[name])) for name, p in plan.space.items()}
        params = {name: value for name, (held, value) in expressed.items() if held}
        if params not in points.values() and (label == "env" or len(params) == len(plan.space)):
            points[label] = params
    return points


def enqueue_presets(study: optuna.Study, plan: TunePlan) -> None:
    """Queue the starting points (:func:`starting_points`) that the study has not tried yet, ahead of any
    sampled trial, so the report shows whether tuning beat the shipped presets. A preset adopted from the
    study changes the env's starting point: the default it then differs from is queued unless some trial
    already trained its values (the old preset was the default)."""
    trials = study.get_trials(deepcopy=False)
    tried = {t.user_attrs.get("preset") for t in trials}
    for label, params in starting_points(plan).items():
        older_env_preset = label == "env" and True in tried  # True: how an older study marked the env's preset
        if label not in tried and not older_env_preset and not any(t.params == params for t in trials):
            study.enqueue_trial(params, user_attrs={"preset": label})


def overrides_of(values: dict[str, Any]) -> list[str]:
    """``key=value`` pairs for ``testbed train --set``, values in YAML's flow style."""
    return [
        f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
        for k, v in values.items()
    ]


def new_trial(study: optuna.Study, plan: TunePlan, driver: str, study_id: str = "") -> optuna.Trial | None:
    """Ask for a trial and sample its values, marked with the folder's identity (``lab.study.left_running``) and,
    for people, where its driver runs; a sample the algo refuses is told as failed (no env step spent)."""

    trial = study.ask()
    values = {name: param.suggest(trial) for name, param in plan.space.items()}
    trial.set_user_attr("driver", driver)
    trial.set_user_attr(STUDY_ID, study_id)
    trial.set_user_attr("overrides", overrides_of(values))
    try:
        plan.config(values)
    except BadInput as error:
        trial.set_user_attr("error", f"{REFUSED}: {error}")
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return None
    return trial


class RayReporter:
    """A Ray actor on the driver's node: the trials' tasks report through it to the study's storage."""

    def __init__(self, plan: TunePlan, tune_dir: str) -> None:
        self.study = open_study(plan, Path(tune_dir))
        self.reporters: dict[int, Reporter] = {}

    def report(self, trial_id: int, step: int, value: float) -> bool:
        if trial_id not in self.reporters:
            self.reporters[trial_id] = reporter_for(self.study, trial_id)
        return self.reporters[trial_id](step, value)


# ── the driver ─────────────────────────────────────────────────────────────────────────────────────


def _started(study: optuna.Study) -> int:
    return sum(t.state != optuna.trial.TrialState.WAITING for t in study.get_trials(deepcopy=False))


def run_study(
    plan: TunePlan, workers: int, backend: str, ray_address: str | None, root: Path = TUNE_ROOT, stack: int = 1
) -> tuple[Path, dict[str, int]]:
    """Run the study until it holds ``plan.trials`` trials; write its report. (tune dir, counts by state).
    ``stack``: a trial's seeds train in processes of at most this many seeds (``train --seeds``)."""
    tune_dir = root / plan.name
    if workers < 1:
        raise BadInput(f"--workers must be at least 1, got {workers}")  # before anything is written
    if backend == "ray":
        connect_ray(ray_address, workers * len(pack_stacks(plan.cells([]), stack)))
    elif backend != "local":
        raise BadInput(f"unknown --backend {backend!r}; choose local or ray")
    driver = f"{socket.gethostname()}:{tune_dir.resolve()}"
    counts: dict[str, int] = {}
    with rundir.DirLock(tune_dir):
        check_tune_dir(tune_dir, plan)
        if plan.storage is None:
            check_journal(tune_dir / STUDY_FILE, repair=True)
        study = open_study(plan, tune_dir)
        known_costs(study.get_trials(deepcopy=False), tune_dir)  # else its report would count trials as costing 0
        study_id = write_tune_yaml(tune_dir, plan)
        enqueue_presets(study, plan)
        # Held lock: the folder's running trials are dead drivers', to continue from their checkpoints.
        resumable = left_running(study.get_trials(deepcopy=False), study_id, plan.storage is not None, driver)
        for trial in resumable:
            print(f"trial {trial.number}: left running by a driver that stopped; it continues", flush=True)
        interrupted = _drive(study, plan, tune_dir, (driver, study_id), workers, backend, counts, stack, resumable)
        if any(t.state.name == "COMPLETE" for t in study.get_trials(deepcopy=False)):
            build_tune_report(tune_dir)
    if interrupted:
        raise KeyboardInterrupt
    return tune_dir, counts


def _drive(
    study: optuna.Study,
    plan: TunePlan,
    tune_dir: Path,
    driver: tuple[str, str],
    workers: int,
    backend: str,
    counts: dict[str, int],
    stack: int,
    resumable: list[Any],
) -> bool:
    """Start trials until the study is full, ``workers`` at a time, the ``resumable`` ones first; True if stopped
    by Ctrl-C or SIGTERM. ``driver``: (where it runs, the folder's identity), as new trials record them."""
    stop = Stop()
    ray_reporter = None
    remote_refs: set[Any] = set()
    if backend == "ray":
        ray = import_ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        ray_reporter = ray.remote(num_cpus=0, scheduling_strategy=here)(RayReporter).remote(plan, str(tune_dir))
        remote = ray.remote(num_cpus=len(pack_stacks(plan.cells([]), stack)))(run_trial_remote)

    def execute(trial: Any) -> tuple[list[Outcome], bool]:
        bench_dir = trial_dir(tune_dir, trial.number)
        cells = plan.cells(list(trial.user_attrs["overrides"]))
        set_aside_stale(bench_dir, cells)
        if backend == "local":
            return run_trial(cells, bench_dir, reporter_for(study, trial._trial_id), stack=stack, stop=stop)
        for cell in cells:
            cell.run_dir(bench_dir).parent.mkdir(parents=True, exist_ok=True)
        ref = remote.remote(
            cells, [pack_run(c.run_dir(bench_dir)) for c in cells], ray_reporter, trial._trial_id, stack
        )
        remote_refs.add(ref)
        outcomes, pruned, files = ray.get(ref)
        remote_refs.discard(ref)
        return [receive_cell(o, f, bench_dir) for o, f in zip(outcomes, files)], pruned

    pending: dict[Future[tuple[list[Outcome], bool]], Any] = {}
    finished = sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))  # by earlier runs of the study
    beat = study_heartbeat(counts, finished, plan.trials, pending, stop, len(plan.seeds), plan.steps_per_seed)
    with stop_signals(), ThreadPoolExecutor(max_workers=workers) as pool, beat:
        try:
            while True:
                while len(pending) < workers and (resumable or _started(study) < plan.trials):
                    trial = resumable.pop(0) if resumable else new_trial(study, plan, *driver)
                    if trial is None:
                        counts["failed"] = counts.get("failed", 0) + 1
                        continue
                    values = pairs_text(trial.user_attrs["overrides"]) or "the preset"
                    print(f"trial {trial.number}: {values}", flush=True)
                    pending[pool.submit(execute, trial)] = trial
                if not pending:
                    return False
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    trial = pending.pop(future)
                    state, score = settle(study, trial, *future.result(), trial_dir(tune_dir, trial.number))
                    counts[state] = counts.get(state, 0) + 1
                    scored = f", score {fmt_return(score)}" if score is not None else ""
                    print(f"trial {trial.number}: {state}{scored}", flush=True)
        except KeyboardInterrupt:
            # Local trials' seeds checkpoint and exit; Ray trials are cancelled, and restart next time. Either
            # way their trials stay running, for the next run of the command to continue.
            stop.request()
            for ref in remote_refs:
                ray.cancel(ref)
            wait(pending)
            return True
