"""The ``testbed`` command's arguments: every option of every command, with its default.

Options that several commands share are declared once, in parent parsers: where a grid runs (``--workers``,
``--stack``, ``--backend``, ``--ray-address``) and what it trains (``--seeds``, ``--first-seed``,
``--total-steps``, ``--set``). Nothing here imports torch: ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

from agents import registry
from agents.config import MAX_EVAL_EPISODES, whole_number
from envs.bsuite import EXPERIMENTS as BSUITE_EXPERIMENTS
from envs.errors import BadInput, brief
from envs.factory import TRUST_FLAG
from lab.suites import SUITES

MAX_SEEDS = 256
"""The most seeds one command takes (``--seeds`` of train, bench, credit and tune): as many as one process
trains side by side, and past which a slip of the keyboard would plan for minutes or run out of memory."""
MAX_NAME = 100
"""The most characters of a bench's or a study's ``--name``: one folder name, which every file system takes."""

GRADIENT_DEFAULTS = {"--gradient-batches": 4, "--split-states": 8, "--split-actions": 4, "--split-rollouts": 4}
"""``testbed audit --gradients``'s batches K and its variance split's S, M and R, as
``agents.true_gradient.GradientSettings`` has them (which this module, free of torch, does not import)."""

DEFAULT_STACK = 16
"""Seeds per process in bench, credit and tune: the fastest stack size measured for PPO on CartPole
(benchmarks/stacking.py; the README's table)."""


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line that says where the options are listed: argparse prints
    the whole usage above the error (seven lines for ``train``), which buries the one that matters."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}. Every option: {self.prog} --help\n")


class RaisingParser(Parser):
    """The same options, for the Python API (``lab.api``): an error raises BadInput with argparse's message, where
    the command line prints it and exits."""

    def error(self, message: str) -> NoReturn:
        raise BadInput(message)


def count(text: str) -> int:
    """An integer option (steps, seeds, trials, episodes), also written ``1e5`` where that is a whole number."""
    try:
        return whole_number(text)
    except ValueError as error:
        fix = "give a whole number such as 100000 or 1e5"
        raise argparse.ArgumentTypeError(f"{brief(text, 40)} is {error}; {fix}") from None


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's defaults formatter, except where the help already says its default in words: there a
    second "(default: None)" would contradict it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help or ""
        return help_text if "default" in help_text else super()._get_help_string(action)


TRUST_HELP = (
    "import the module of a run's env id MODULE:ENV_ID, which runs its code; without it such a run is refused, as a "
    "shared run folder is data"
)


def check_sizes(args: argparse.Namespace) -> None:
    """BadInput for a count or a name beyond its bound, checked as the options are read, before any planning:
    ``--seeds`` (a count; train's list is read by ``lab.plan.parse_seeds``), ``--name`` and ``--episodes``."""
    seeds = getattr(args, "seeds", None)
    if isinstance(seeds, int) and seeds > MAX_SEEDS:
        raise BadInput(
            f"--seeds takes at most {MAX_SEEDS} seeds, got {seeds:,}; run more as further commands with --first-seed"
        )
    name = getattr(args, "name", None)
    if isinstance(name, str) and len(name) > MAX_NAME:
        raise BadInput(f"--name {brief(name, 60)} has {len(name):,} characters; give at most {MAX_NAME}")
    episodes = getattr(args, "episodes", None)
    if isinstance(episodes, int) and not 1 <= episodes <= MAX_EVAL_EPISODES:
        raise BadInput(f"--episodes must be from 1 to {MAX_EVAL_EPISODES:,}, got {episodes:,}")


def execution_options(what: str, workers_default: int | None, workers_help: str) -> argparse.ArgumentParser:
    """Where ``what`` (runs, trials) execute: the shared ``--workers``, ``--stack``, ``--backend`` and
    ``--ray-address``."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--workers", type=count, default=workers_default, help=workers_help)
    options.add_argument(
        "--stack",
        type=count,
        default=DEFAULT_STACK,
        metavar="N",
        help="the most seeds of one (algo, env) trained side by side in one process (default: %(default)s, the fastest "
        "measured; 1: one process per seed)",
    )
    options.add_argument("--backend", choices=["local", "ray"], default="local", help=f"where the {what} execute")
    options.add_argument(
        "--ray-address", default=None, help="join this Ray cluster (auto or host:port); default: start a local instance"
    )
    return options


def grid_options(seeds_default: int | None, seeds_help: str) -> argparse.ArgumentParser:
    """What a grid of runs trains: the shared ``--seeds``, ``--first-seed``, ``--total-steps`` and ``--set``."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--seeds", type=count, default=seeds_default, help=f"{seeds_help}; at most {MAX_SEEDS}")
    options.add_argument(
        "--first-seed",
        type=count,
        default=0,
        help="seeds run FIRST … FIRST+N−1; sweeps use seeds that final results never do",
    )
    options.add_argument("--total-steps", type=count, default=None, help="env steps per run (default: each preset's)")
    options.add_argument(
        "--budget-seconds",
        type=float,
        default=None,
        help="also end each run once its wall time reaches this (config key budget_seconds); compare algos at equal "
        "time",
    )
    options.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="[ALGO.]KEY=VALUE",
        help="override a config key of one algo (ALGO.KEY=VALUE) or of all (KEY=VALUE); repeatable",
    )
    return options


def build_parser(parser_class: type[Parser] = Parser) -> argparse.ArgumentParser:
    """Every command's options; ``parser_class``: how errors are reported (:class:`RaisingParser` raises them)."""
    parser = parser_class(prog="testbed", description="Compare PPO and GRPO-style agents on control tasks.")
    sub = parser.add_subparsers(dest="command", required=True)
    algos = ", ".join(registry.NAMES)
    cores = "runs at a time (default: the number of cores)"

    train = sub.add_parser("train", help="train one agent on one env", formatter_class=DefaultsFormatter)
    train.add_argument("--algo", required=True, help=f"one of: {algos}")
    train.add_argument("--env", required=True, help="any registered gymnasium id, e.g. CartPole-v1")
    train.add_argument("--seed", type=count, default=None, help="run seed (default: the preset's, 0)")
    train.add_argument("--total-steps", type=count, default=None, help="env steps (default: the preset's)")
    train.add_argument(
        "--budget-seconds",
        type=float,
        default=None,
        help="also end the run once its wall time reaches this (config key budget_seconds)",
    )
    train.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key; repeatable. Keys: the fields of the algo's config",
    )
    train.add_argument(
        "--env-kwargs",
        nargs="+",
        default=[],
        metavar="KEY:VALUE",
        help="keyword arguments of the env, e.g. horizon:300 (config key env_kwargs)",
    )
    train.add_argument(
        "--reward-delay",
        default=None,
        metavar="K|end",
        help="release rewards every K steps or at the episode's end (config key reward_delay)",
    )
    train.add_argument(
        "--preset",
        default=None,
        metavar="FILE",
        help="a presets file whose entry for --env replaces the packaged one (e.g. a tune's preset.yaml)",
    )
    train.add_argument(
        "--seeds",
        default=None,
        metavar="N|S1,S2,…",
        help=f"train several seeds side by side in one process: a count, from --seed on, or a list, of at most "
        f"{MAX_SEEDS}; each seed writes an ordinary run directory, RUN_DIR/seed<k>",
    )
    train.add_argument(
        "--run-dir",
        default=None,
        help="output directory (default: runs/ALGO/ENV/seedN-TIME); with --seeds, the folder holding seed<k>/ "
        "(default: runs/ALGO/ENV/seedsN-M-TIME)",
    )
    train.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its checkpoint")
    train.add_argument("--device", choices=["cpu", "cuda", "auto"], default=None, help="network device (default cpu)")

    evaluate = sub.add_parser("eval", help="evaluate a run's checkpoint", formatter_class=DefaultsFormatter)
    evaluate.add_argument("run_dir", help="a run directory holding config.yaml and checkpoint.pt")
    evaluate.add_argument(
        "--episodes", type=count, default=10, help=f"episodes, one per fixed seed (at most {MAX_EVAL_EPISODES:,})"
    )
    evaluate.add_argument("--stochastic", action="store_true", help="sample actions instead of the policy's mode")
    evaluate.add_argument("--video", default=None, metavar="DIR", help="also record the first episode as a GIF in DIR")
    evaluate.add_argument(
        "--env-kwargs",
        nargs="+",
        default=[],
        metavar="KEY:VALUE",
        help="env keyword arguments for this evaluation, on top of the run's (config key eval_env_kwargs), e.g. "
        "contact_cost_weight:0 to score without a reward term",
    )
    evaluate.add_argument(TRUST_FLAG, action="store_true", help=TRUST_HELP)

    grid = sub.add_parser(
        "bench",
        help="run a grid of algos × envs × seeds and report it",
        formatter_class=DefaultsFormatter,
        parents=[
            grid_options(None, "number of seeds (default: the suite's, 3)"),
            execution_options("runs", None, cores),
        ],
    )
    grid.add_argument("--suite", default=None, help=f"a named grid: {', '.join(SUITES)}")
    grid.add_argument("--algos", nargs="+", default=None, help="algos (default: the suite's, else ppo grpo sb3-ppo)")
    grid.add_argument("--envs", nargs="+", default=None, help="gymnasium ids (default: the suite's)")
    grid.add_argument(
        "--name",
        default=None,
        help=f"bench name, at most {MAX_NAME} characters: runs/bench/NAME (default: the suite's name)",
    )
    grid.add_argument(
        "--reuse-from",
        action="append",
        default=None,
        metavar="BENCH_DIR",
        help="first copy in the completed runs of another bench that this one asks for, with the same settings (e.g. "
        "PPO's runs, beside GRPO's at PPO's wall time); give it again to reuse from several benches, the first that "
        "holds a run giving it",
    )

    study = sub.add_parser(
        "credit",
        help="a credit-assignment study: sweep the horizon or reward delay, or one of bsuite's credit-assignment and "
        f"memory experiments over its sweep ({', '.join(BSUITE_EXPERIMENTS)})",
        formatter_class=DefaultsFormatter,
        parents=[grid_options(3, "number of seeds"), execution_options("runs", None, cores)],
    )
    study.add_argument(
        "--task",
        required=True,
        metavar="chain|keydoor|delayed:ENV_ID|bsuite:EXPERIMENT",
        help="the testbed's chain or key-to-door task, any env with delayed rewards, or a bsuite experiment: "
        f"{', '.join(f'bsuite:{e}' for e in BSUITE_EXPERIMENTS)} (scored by bsuite's own analysis)",
    )
    study.add_argument(
        "--horizons",
        nargs="+",
        default=None,
        metavar="H",
        help="episode lengths of chain/keydoor (default 10 30 100 300 1000); reward delays k of delayed:ENV_ID, "
        "integers or end (default 1 20 100 end); for bsuite:EXPERIMENT, indices into bsuite's sweep (default: all, "
        "e.g. 0 … 22 for umbrella_length/0 … /22), each run for bsuite's episodes unless --total-steps is given",
    )
    study.add_argument("--algos", nargs="+", default=["ppo", "grpo", "grpo-vine"], help=f"of: {algos}")
    study.add_argument("--env-kwargs", nargs="+", default=[], metavar="KEY:VALUE", help="more env keyword arguments")
    study.add_argument("--name", default=None, help="runs/bench/NAME (default: credit-TASK)")

    auditor = sub.add_parser(
        "audit",
        help="score every advantage estimator against the Monte-Carlo truth at runs' checkpoints",
        formatter_class=DefaultsFormatter,
    )
    auditor.add_argument("paths", nargs="+", help="run directories or folders holding them (a bench, a credit study)")
    auditor.add_argument(
        "--checkpoints",
        choices=["final", "kept", "all"],
        default="all",
        help="final: checkpoint.pt; kept: those keep_checkpoints kept; all: both",
    )
    auditor.add_argument("--samples", type=count, default=64, help="N: steps sampled from the policy's trajectories")
    auditor.add_argument("--branches", type=count, default=32, help="K: rollouts each for Q(s, a) and V(s) per sample")
    auditor.add_argument(
        "--max-branches",
        type=count,
        default=0,
        metavar="K_MAX",
        help="add K rollouts of each kind at a time while the truth's noise share (mean SE² / Var[A]) exceeds a "
        "quarter, up to K_MAX per sample; 0: K only",
    )
    auditor.add_argument("--groups", type=count, default=4, help="B: start states of the trajectories sampled from")
    auditor.add_argument(
        "--group-size", type=count, default=8, help="G: trajectories per start state (the group estimators' groups)"
    )
    auditor.add_argument("--vine-branches", type=count, default=8, help="rollouts per value of the vine estimator")
    auditor.add_argument(
        "--steps",
        type=count,
        nargs="+",
        default=[],
        metavar="T",
        help="sample only at these time steps (e.g. 0: the chain's only decision); default every step",
    )
    auditor.add_argument("--seed", type=count, default=0, help="the audit's seed: trajectories, samples, rollout noise")
    auditor.add_argument(
        "--gradients",
        action="store_true",
        help="also score the policy gradient each estimator gives on a batch of the run's size (PPO: n_envs × "
        "n_steps env steps; GRPO: num_groups × group_size episodes) against the true gradient from the samples' "
        "truth, and split the per-sample gradient's variance into state, action and trajectory parts; needs "
        "--groups 2 or more (the truth's standard error is clustered by start state)",
    )
    auditor.add_argument(
        "--gradient-batches",
        type=count,
        default=None,
        metavar="K",
        help="with --gradients: independent batches per estimator, at least 2, for the scores' standard errors; each "
        f"costs its trunk episodes in env steps (default {GRADIENT_DEFAULTS['--gradient-batches']})",
    )
    auditor.add_argument(
        "--gradient-vine",
        action="store_true",
        help="with --gradients: the vine estimator in every batch too, from --vine-branches rollouts at every state "
        "of the batch: about batch steps × vine branches × the mean steps left, in env steps per batch",
    )
    for flag, letter, what in (
        ("--split-states", "S", "states sampled from the trunks"),
        ("--split-actions", "M", "actions drawn from π at each state"),
        ("--split-rollouts", "R", "rollouts after each state and action"),
    ):
        auditor.add_argument(
            flag,
            type=count,
            default=None,
            metavar=letter,
            help=f"with --gradients: {letter}, the variance split's {what}, at least 2; the split costs S × M × R "
            f"rollouts to the episode's end (default {GRADIENT_DEFAULTS[flag]})",
        )
    auditor.add_argument(
        "--workers", type=count, default=None, help="checkpoints audited at a time (default: the number of cores)"
    )
    auditor.add_argument(
        "--backend",
        choices=["local", "ray"],
        default="local",
        help="where the audits execute: a pool of processes here, or Ray tasks of one CPU each",
    )
    auditor.add_argument(
        "--ray-address", default=None, help="join this Ray cluster (auto or host:port); default: start a local instance"
    )
    auditor.add_argument("--out", default=None, help="output folder (default: runs/audit/NAME, NAME the first path's)")
    auditor.add_argument(TRUST_FLAG, action="store_true", help=TRUST_HELP)

    tuner = sub.add_parser(
        "tune",
        help="tune an algo's hyperparameters on one env (Optuna: TPE + median pruner)",
        formatter_class=DefaultsFormatter,
        parents=[execution_options("trials", 1, "trials at a time, each running its seeds side by side")],
    )
    tuner.add_argument("--algo", required=True, help=f"one of: {algos}")
    tuner.add_argument("--env", required=True, help="any registered gymnasium id")
    tuner.add_argument("--trials", type=count, default=50, help="trials in the study, all runs of it together")
    tuner.add_argument(
        "--total-steps",
        type=count,
        default=None,
        help="env steps per seed of a trial (default: the preset's); PPO rounds it up to a multiple of every "
        "n_steps·n_envs the space allows, so that every trial trains the same",
    )
    tuner.add_argument(
        "--seeds",
        type=count,
        default=1,
        help=f"seeds per trial, at most {MAX_SEEDS}; its score is their mean final return",
    )
    tuner.add_argument("--first-seed", type=count, default=100, help="seeds FIRST … FIRST+K−1; bench's 0 … stay unseen")
    tuner.add_argument(
        "--space",
        default=None,
        metavar="FILE",
        help="search space YAML (default: the space the algo's module declares)",
    )
    tuner.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="fix a config key in every trial"
    )
    tuner.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="KEY=RANGE",
        help="set one key's range in the space: a YAML list or {low: …, high: …}",
    )
    tuner.add_argument(
        "--name",
        default=None,
        help=f"runs/tune/NAME and the study's name, at most {MAX_NAME} characters (default: ALGO-ENV)",
    )
    tuner.add_argument(
        "--storage",
        default=None,
        metavar="URL",
        help="an Optuna database URL shared by several drivers (default: runs/tune/NAME/study.log)",
    )
    tuner.add_argument(
        "--pruner",
        choices=["median", "none"],
        default="median",
        help="stop trials below the median of earlier ones; none where merely surviving scores well early (Hopper)",
    )
    tuner.add_argument("--startup-trials", type=count, default=5, help="trials before the pruner and TPE start")
    tuner.add_argument("--sampler-seed", type=count, default=0, help="the TPE sampler's seed")

    docs = sub.add_parser(
        "docs",
        help="make every figure and table of docs/ppo_and_grpo.md from the testbed's own runs",
        formatter_class=DefaultsFormatter,
    )
    docs.add_argument(
        "--quick", action="store_true", help="tiny budgets and one seed: every file in seconds, not the results"
    )
    docs.add_argument(
        "--out", default=None, help="folder for the figures (default: docs/figures; quick: runs/docs-quick/figures)"
    )
    docs.add_argument(
        "--runs",
        default=None,
        help="folder for the training runs, resumable (default: runs/docs; quick: runs/docs-quick)",
    )
    docs.add_argument("--workers", type=count, default=2, help="training runs at a time")

    plot = sub.add_parser("plot", help="learning curves of runs or benches", formatter_class=DefaultsFormatter)
    plot.add_argument("paths", nargs="+", help="run directories or folders holding them (benches)")
    plot.add_argument("--x", choices=["steps", "time"], default="steps", help="x-axis: env steps or wall-clock")
    plot.add_argument(
        "--metric",
        choices=["eval", "train", "both"],
        default="both",
        help="eval: the deterministic evaluations (every eval_interval steps); train: the return of the episodes that "
        "ended in each iteration; both: side by side",
    )
    plot.add_argument(
        "--out",
        default=None,
        help="image file (PNG; an SVG is written beside it). Default, for one path: PATH/plots/curves-X.png "
        "(curves-METRIC-X.png for one metric); several paths need --out",
    )

    report = sub.add_parser(
        "report", help="rebuild a bench's or a study's report from disk", formatter_class=DefaultsFormatter
    )
    report.add_argument("bench_dir", help="runs/bench/NAME or runs/tune/NAME")
    report.add_argument(
        "--against",
        default=None,
        metavar="RESULT",
        help="set the bench beside a committed result (a name of `testbed results list`, or a folder of runs) on the "
        "envs both hold, in BENCH_DIR/against-RESULT/: the same report, the result's algos named ALGO@RESULT; refused "
        "where budgets or evaluation differ",
    )

    results = sub.add_parser(
        "results",
        help="the committed results: list them, rerun them, rebuild their pages",
        formatter_class=DefaultsFormatter,
    )
    results.add_argument(
        "action",
        choices=["list", "run", "save", "restore", "pages"],
        help="list: every result with its command and provenance; run: rerun results (resumable), keep their files, "
        "rebuild the pages; save: keep the runs of a result that have ended so far in its folder, to commit them while "
        "the rest still run; restore: copy the kept runs back under runs/ (run does it first), to go on with part of a "
        "result by hand; pages: rebuild docs/results/ and the README's tables from the committed files",
    )
    results.add_argument("names", nargs="*", help="results to rerun, save or restore (see `testbed results list`)")
    results.add_argument("--all", action="store_true", help="rerun every result (long: hours to days on 2 cores)")
    results.add_argument(
        "--cheap", action="store_true", help="rerun the results marked cheap (about an hour on 2 cores)"
    )
    return parser
