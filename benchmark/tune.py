"""Hyperparameter sweeps with Optuna: ``python -m benchmark tune SCRIPT ...`` and ``python -m
benchmark tune-report``.

A trial is one setting of the space's flags (`benchmark.tune_space`), run on every env and seed
given, each run the script as a subprocess in a run folder of its own, all of a trial's runs at
once. Its value is the mean over them of the normalised score, (return - random) / (target -
random). While they run, the trial reports that mean, over the last 100 training episodes of each
run, at each tenth of the steps; Optuna's pruner can stop it there. The study lives in Optuna's
storage (a journal file, or a database URL), which any number of processes on any number of machines
share: rerunning the command continues it. docs/tune.md is the guide."""

from __future__ import annotations

import os
import platform
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import gymnasium as gym
import numpy as np
import tyro

import probe_envs  # noqa: F401  (registers the probe ids)
from benchmark.cases import SUITES, suite_cases
from benchmark.events import LAST_EPISODES, RunSummary, find_run_dirs, safe_name, summarise_run
from benchmark.processes import start_stoppable, stderr_tail, stop
from benchmark.registry import HARNESS_SET, REPO, SCRIPTS, resolve_args
from benchmark.slurm import (
    FOLDER,
    STOPPED_WITH_A_CHECKPOINT,
    SlurmFlags,
    check_cluster,
    elements_by_name,
    submit_array,
    wait_for,
)
from benchmark.tune_space import Param, build_space, space_lines
from common.envs import resolve_env_id
from common.errors import UsageError
from common.interrupt import STOP_SIGNALS  # each stops every running trial and fails it
from common.seeding import available_cores

REPORTS = 10
"""a trial reports its intermediate value at each tenth of its runs' steps"""
RANDOM_EPISODES = 100
"""episodes of the random policy's return on each env, measured once per study"""
POLL_SECONDS = 1.0
EVENTS_EVERY_SECONDS = 5.0
"""how often a running trial reads its runs' events for its intermediate values"""
STALE_HEARTBEATS = 3
"""a running trial whose process missed this many heartbeats is failed by the next process that
looks"""
STOPPED = {-signum for signum in STOP_SIGNALS} | STOPPED_WITH_A_CHECKPOINT
"""the exit statuses of a run that a stop signal ended: killed by it, or stopped with a checkpoint"""
TUNE_FOLDER = Path("runs") / "tune"
"""where a study's journal (<study>.journal) and its trials' run folders (<study>/) go by default"""


def default_storage(study: str) -> str:
    return str(TUNE_FOLDER / f"{study}.journal")


@dataclass
class Tune(SlurmFlags):
    """Sweep a script's flags with Optuna, each trial judged on every env and seed given
    (docs/tune.md; with --launcher slurm, --workers elements of a job array, docs/cluster.md)."""

    script: Annotated[str, tyro.conf.Positional]
    """the script to sweep (ppo_lstm.py or ppo_lstm)"""
    env_id: Annotated[tuple[str, ...], tyro.conf.UseAppendAction]
    """an env each trial runs on (give --env-id once per env)"""
    seeds: tuple[int, ...] = (1,)
    """each trial runs each env with each of these seeds"""
    steps: int = 100_000
    """env steps of every run"""
    trials: int = 20
    """trials this command runs (more on a rerun or in another process: they add up in the study)"""
    workers: int = 1
    """trials at a time in this process (each runs its envs and seeds at once); --launcher slurm: elements, one each"""
    study: str | None = None
    """the study's name in the storage (default: the script's name)"""
    storage: str | None = None
    """a journal file (default runs/tune/<study>.journal) or a database URL (sqlite:///..., postgresql://...)"""
    space: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """a flag to vary, FLAG=float|log:LOW:HIGH, int:LOW:HIGH or choice:A,B (repeat it; default: the script's space)"""
    space_file: tuple[str, ...] = ()
    """files of such lines, one per flag (# starts a comment)"""
    flags: str = ""
    """flags every run is given, in one string: --flags='--num-envs 8'"""
    objective: Literal["eval", "last-100"] = "eval"
    """a run's return: its deterministic evaluation at the end, or the mean of its last 100 training episodes"""
    eval_episodes: int = 20
    """evaluation episodes at the end of every run"""
    random: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """ENV=RETURN: the random policy's return on ENV (default: measured, 100 episodes)"""
    target: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """ENV=RETURN: the return that scores 1 on ENV (default: the registry's; give it again on a rerun)"""
    pruner: Literal["median", "none"] = "median"
    """stop a trial whose intermediate value is below the median of earlier trials' at the same step"""
    sampler_seed: int | None = None
    """the TPE sampler's seed (default: drawn, so that processes on one study propose different settings)"""
    heartbeat_seconds: float = 60.0
    """a running trial records a heartbeat this often; one silent for 3 of them is failed by the next process"""
    out: str | None = None
    """the folder of the trials' run folders (default runs/tune/<study>)"""
    worker: str | None = None
    """a name for this process's trials: run again under it, it runs what is left of its --trials (a requeued worker)"""


@dataclass
class TuneReport:
    """Print a study's best trial as a command line and a table of its best trials; draw its plots."""

    study: str
    """the study's name in the storage"""
    storage: str | None = None
    """a journal file (default runs/tune/<study>.journal) or a database URL"""
    top: int = 10
    """rows of the table of best trials"""
    out: str | None = None
    """the folder of the PNG plots (default runs/tune/<study>/report)"""


@dataclass(frozen=True)
class Plan:
    """What every trial of this command runs, and how its runs are scored."""

    script: str
    env_ids: tuple[str, ...]
    seeds: tuple[int, ...]
    steps: int
    flags: tuple[str, ...]
    space: tuple[Param, ...]
    objective: str
    eval_episodes: int
    bounds: dict[str, tuple[float, float]]
    """each env's (random return, target return)"""
    out: Path
    threads: int
    """each run's OMP_NUM_THREADS: the cores shared between every run of every worker"""
    heartbeat_seconds: float
    worker: str | None = None
    """--worker: the name on this process's trials"""

    def score(self, env_id: str, value: float) -> float:
        """`value`, a return on `env_id`, as a share of the way from the random policy's return to
        the target."""
        random, target = self.bounds[env_id]
        return (value - random) / (target - random)

    def settings(self) -> dict[str, Any]:
        """What makes two commands the same study: a rerun or another process must agree on all of
        it."""
        return {
            "script": self.script,
            "env_ids": list(self.env_ids),
            "seeds": list(self.seeds),
            "steps": self.steps,
            "flags": list(self.flags),
            "space": [param.line for param in self.space],
            "objective": self.objective,
            "eval_episodes": self.eval_episodes,
            "bounds": {env_id: list(bound) for env_id, bound in self.bounds.items()},
        }


def command_line(
    settings: dict[str, Any], env_id: str, flags: list[str], seed: int | None = None
) -> list[str]:
    """The command of a run of a study (`Plan.settings`) on `env_id` with the space's `flags`: the
    trial's run with its `seed`, or without one, the command the report prints."""
    command = [
        "python",
        f"{settings['script']}.py",
        "--env-id",
        env_id,
        "--total-timesteps",
        str(settings["steps"]),
    ]
    command += [] if seed is None else ["--seed", str(seed)]
    command += ["--eval-episodes", str(settings["eval_episodes"])]
    return [*command, *without_flags(settings["flags"], flags), *flags]


def flag_groups(flags: list[str]) -> list[tuple[str, list[str]]]:
    """`flags` as (field, its tokens): a flag and the values after it; --no-x sets the field x."""
    groups: list[tuple[str, list[str]]] = []
    for token in flags:
        if token.startswith("--") or not groups:
            field = token.lstrip("-").partition("=")[0].replace("-", "_")
            groups.append((field.removeprefix("no_"), [token]))
        else:
            groups[-1][1].append(token)
    return groups


def without_flags(flags: list[str], overriding: list[str]) -> list[str]:
    """`flags` less those that `overriding` sets again (the sweep's --flags under a trial's own)."""
    overridden = {field for field, _ in flag_groups(overriding)}
    return [
        token for field, tokens in flag_groups(flags) if field not in overridden for token in tokens
    ]


class RunFailed(Exception):
    """A run of a trial exited with an error."""


class Interrupted(Exception):
    """The command was stopped (Ctrl-C, SIGTERM) while the trial ran."""


def named_values(entries: tuple[str, ...], flag: str, env_ids: tuple[str, ...]) -> dict[str, float]:
    """ENV=NUMBER entries of `flag` as a dict (UsageError: malformed, or an env the sweep does not
    run)."""
    values = {}
    for entry in entries:
        env_id, _, number = entry.rpartition("=")
        try:
            values[env_id] = float(number)
        except ValueError:
            raise UsageError(f"{flag} {entry!r}: write ENV=RETURN, e.g. CartPole-v1=500") from None
        if env_id not in env_ids:
            raise UsageError(f"{flag} {entry!r}: the sweep does not run {env_id} (its --env-id)")
    return values


def registry_target(env_id: str) -> float | None:
    """The highest return of `env_id` as the registry knows it: a case's `task_max`, 1 for a popgym
    task (popgym scales every return into [-1, 1], its pendulums' into [0, 1]), else the env's own
    reward threshold, if any."""
    maxima = {
        case.task_max for name in SUITES for case in suite_cases(name) if case.env_id == env_id
    }
    maxima.discard(None)
    if maxima:
        return max(maxima)  # type: ignore[type-var]
    if env_id.startswith("popgym-"):
        return 1.0
    return gym.spec(resolve_env_id(env_id).rpartition(":")[2]).reward_threshold


def env_targets(args: Tune) -> dict[str, float]:
    """Each env's target return: the command line's, else the registry's (UsageError: none known, a malformed
    --target, or one for an env the sweep does not run)."""
    targets = named_values(args.target, "--target", args.env_id)
    for env_id in args.env_id:
        target = targets.get(env_id, registry_target(env_id))
        if target is None:
            raise UsageError(f"no target return known for {env_id}: give --target {env_id}=RETURN")
        targets[env_id] = target
    return targets


def env_bounds(args: Tune, stored: dict[str, list[float]]) -> dict[str, tuple[float, float]]:
    """Each env's (random, target) return: the random return from the command line, else the study's
    (a rerun), else measured (UsageError: a range of zero)."""
    from benchmark.baselines import random_policy_returns

    randoms = named_values(args.random, "--random", args.env_id)
    bounds = {}
    for env_id, target in env_targets(args).items():
        random = randoms.get(env_id, stored[env_id][0] if env_id in stored else None)
        if random is None:
            print(
                f"tune: measuring the random policy's return on {env_id} ({RANDOM_EPISODES} episodes)",
                flush=True,
            )
            random = float(np.mean(random_policy_returns(env_id, RANDOM_EPISODES)))
        if target == random:
            raise UsageError(
                f"{env_id}: the target return equals the random policy's ({target}): give --target"
            )
        bounds[env_id] = (random, target)
    return bounds


def check_tune(args: Tune) -> None:
    """Bad input that needs no script: a UsageError."""
    problems = []
    if args.script not in SCRIPTS:
        problems.append(f"no script {args.script} to sweep (one of {', '.join(SCRIPTS)})")
    if not args.env_id:
        problems.append("give at least one --env-id")
    for env_id in args.env_id:
        try:
            resolve_env_id(env_id)
        except UsageError as error:
            problems.append(f"--env-id: {error}")
    if not args.seeds or len(set(args.seeds)) != len(args.seeds):
        problems.append("--seeds needs one or more distinct seeds")
    if args.steps <= 0 or args.trials < 0 or args.workers < 1 or args.heartbeat_seconds <= 0:
        problems.append(
            "--steps, --workers and --heartbeat-seconds must be positive, --trials at least 0"
        )
    if args.launcher == "slurm" and args.trials < 1:
        problems.append("--launcher slurm submits workers for --trials: give at least 1")
    if args.eval_episodes < (1 if args.objective == "eval" else 0):
        problems.append("--objective eval needs --eval-episodes of at least 1")
    if problems:
        raise UsageError("; ".join(problems))
    named_values(args.random, "--random", args.env_id)
    env_targets(args)


def make_plan(args: Tune, out: Path) -> Plan:
    """The plan of this command, every flag and space line checked against the script (UsageError);
    its `bounds` come from `env_bounds`, once the study is open."""
    flags = tuple(shlex.split(args.flags))
    resolve_args(args.script, flags)
    set_by_sweep = sorted(
        {
            f"--{field.replace('_', '-')}"
            for field, _ in flag_groups(list(flags))
            if field in HARNESS_SET
        }
    )
    if set_by_sweep:
        raise UsageError(f"--flags: the sweep sets {', '.join(set_by_sweep)} itself")
    lines = space_lines(list(args.space), [Path(path) for path in args.space_file])
    space: list[Param] = []
    for env_id in args.env_id:  # the script may refuse a value on one env only (continuous actions)
        run_flags = ["--env-id", env_id, "--total-timesteps", str(args.steps), *flags]
        space = build_space(args.script, lines, run_flags)
    swept = sorted(param.flag for param in space if param.field in HARNESS_SET)
    if swept:
        raise UsageError(f"search space: the sweep sets {', '.join(swept)} itself")
    runs_at_once = args.workers * len(args.env_id) * len(args.seeds)
    return Plan(
        args.script,
        tuple(args.env_id),
        tuple(args.seeds),
        args.steps,
        flags,
        tuple(space),
        args.objective,
        args.eval_episodes,
        {},
        out,
        max(1, available_cores() // runs_at_once),
        args.heartbeat_seconds,
        args.worker,
    )


def open_storage(location: str) -> Any:
    """Optuna's storage at `location`: a database URL (RDB storage), else a journal file (made with
    its folder)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    if "://" in location:
        import sqlalchemy

        try:
            return optuna.storages.RDBStorage(location)
        except (sqlalchemy.exc.SQLAlchemyError, ImportError) as error:
            shown = sqlalchemy.engine.make_url(location).render_as_string(hide_password=True)
            cause = str(error.__cause__ or error).strip().splitlines()[0]
            if isinstance(error, ImportError):
                cause = "no driver for it: pip install -e '.[postgres]' (PostgreSQL)"
            raise UsageError(f"the database {shown} cannot be reached: {cause}") from None
    Path(location).parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(location))


@dataclass
class TrialRun:
    """One run of a trial: an env and a seed, the script's process and its run folder."""

    env_id: str
    seed: int
    run_dir: Path
    process: subprocess.Popen
    summary: RunSummary | None = None
    """what its events held when last read"""

    def read(self) -> RunSummary | None:
        """The run the script has made in `run_dir` so far (None until its events file exists)."""
        made = find_run_dirs([self.run_dir]) if self.run_dir.is_dir() else []
        self.summary = summarise_run(made[0]) if len(made) == 1 else None
        return self.summary

    def training_score(self, plan: Plan, step: int) -> float:
        """Its normalised mean of the last 100 training episodes ended by `step` (0, the random
        policy's score, before its first episode)."""
        if self.summary is None:
            return 0.0
        returns = self.summary.episode_returns[self.summary.episode_steps <= step][-LAST_EPISODES:]
        return plan.score(self.env_id, float(np.mean(returns))) if len(returns) else 0.0

    def final_score(self, plan: Plan) -> float:
        """Its normalised return at the end, by the plan's objective (RunFailed: it has none)."""
        summary = self.summary
        value = (
            None
            if summary is None
            else summary.eval_return
            if plan.objective == "eval"
            else summary.last_return
        )
        if value is None:
            missing = "evaluation" if plan.objective == "eval" else "episode"
            raise RunFailed(f"{self.env_id} seed {self.seed}: the run logged no {missing}")
        return plan.score(self.env_id, value)


def run_trial(trial: Any, plan: Plan, stopping: threading.Event) -> float:
    """Run `trial`'s runs at once, reporting its intermediate values; its value (RunFailed,
    Interrupted, or optuna.TrialPruned, each with every run stopped)."""
    values = {param.field: param.suggest(trial) for param in plan.space}
    flags = [flag for param in plan.space for flag in param.flags(values[param.field])]
    folder = plan.out / f"trial-{trial.number:04d}"
    if folder.exists():
        raise RunFailed(f"{folder} exists already (another study's runs in --out {plan.out}?)")
    folder.mkdir(parents=True)
    trial.set_user_attr("flags", shlex.join(flags))
    trial.set_user_attr("folder", str(folder.resolve()))
    trial.set_user_attr("host", f"{platform.node()} pid {os.getpid()}")
    if plan.worker is not None:
        trial.set_user_attr("worker", plan.worker)
    trial.set_user_attr("heartbeat_seconds", plan.heartbeat_seconds)
    trial.set_user_attr("heartbeat", time.time())
    environment = {**os.environ, "OMP_NUM_THREADS": str(plan.threads)}
    runs, settings = [], plan.settings()
    start = time.time()
    for env_id in plan.env_ids:
        for seed in plan.seeds:
            run_dir = folder / f"{safe_name(env_id)}__{seed}"
            command = command_line(settings, env_id, flags, seed)[1:]
            command = [sys.executable, *command, "--no-progress", "--run-dir", str(run_dir)]
            process = start_stoppable(command, REPO, run_dir, environment)
            runs.append(TrialRun(env_id, seed, run_dir, process))
    try:
        watch_trial(trial, plan, runs, stopping)
    finally:
        stop([run.process for run in runs])
    scores = [run.final_score(plan) for run in runs]
    trial.set_user_attr("wall_seconds", time.time() - start)
    trial.set_user_attr(
        "sps", float(np.mean([run.summary.sps or 0.0 for run in runs if run.summary]))
    )
    trial.set_user_attr("scores", scores)
    return float(np.mean(scores))


def watch_trial(trial: Any, plan: Plan, runs: list[TrialRun], stopping: threading.Event) -> None:
    """Wait for `runs` to end, with a heartbeat, reporting the intermediate value at each tenth of
    the steps as soon as every run has passed it (RunFailed, Interrupted, optuna.TrialPruned)."""
    import optuna

    reported, last_read, last_beat = 0, 0.0, time.time()
    while True:
        ended = all(run.process.poll() is not None for run in runs)
        # A scheduler's stop reaches the runs too: one it ended was stopped, it did not fail.
        if stopping.is_set() or any(run.process.poll() in STOPPED for run in runs):
            raise Interrupted
        for run in runs:
            if run.process.poll() not in (None, 0):
                stderr = stderr_tail(Path(f"{run.run_dir}.stderr").read_text())
                raise RunFailed(
                    f"{run.env_id} seed {run.seed}: exit status {run.process.returncode}: {stderr}"
                )
        now = time.time()
        if now - last_beat >= plan.heartbeat_seconds:
            try:
                trial.set_user_attr("heartbeat", now)
            except RuntimeError:  # UpdateFinishedTrialError: another process failed it as stale
                raise RunFailed(
                    "failed by another process: its heartbeat had stopped for too long"
                ) from None
            last_beat = now
        if ended or now - last_read >= EVENTS_EVERY_SECONDS:
            last_read = now
            reached = min(summary.steps if (summary := run.read()) else 0 for run in runs)
            while reported < REPORTS - 1 and reached >= (
                step := plan.steps * (reported + 1) // REPORTS
            ):
                trial.report(float(np.mean([run.training_score(plan, step) for run in runs])), step)
                reported += 1
                if not ended and trial.should_prune():
                    raise optuna.TrialPruned(f"at step {step}")
        if ended:
            return
        time.sleep(POLL_SECONDS)


def fail_stale_trials(study: Any, storage: Any) -> None:
    """Fail the study's running trials whose process stopped beating (killed, or its machine lost):
    their heartbeat is older than `STALE_HEARTBEATS` of their own intervals. Optuna's heartbeat is
    the RDB storage's alone; this one serves a journal too."""
    from optuna.trial import TrialState

    now = time.time()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        # A trial whose process died before its first heartbeat is judged by its start (a naive
        # local time: another machine's clock may be hours off), after a day.
        interval = trial.user_attrs.get("heartbeat_seconds", 86_400 / STALE_HEARTBEATS)
        last = trial.user_attrs.get(
            "heartbeat", trial.datetime_start.timestamp() if trial.datetime_start else now
        )
        if now - last <= STALE_HEARTBEATS * interval:
            continue
        try:  # another process may fail it first
            error = f"no heartbeat since {datetime.fromtimestamp(last).isoformat(timespec='seconds')} (process ended)"
            # no public setter for another's trial
            storage.set_trial_user_attr(trial._trial_id, "error", error)
            storage.set_trial_user_attr(trial._trial_id, "interrupted", True)
            study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
            print(
                f"tune: trial {trial.number} of {trial.user_attrs.get('host', '?')} failed: {error}",
                flush=True,
            )
        except (RuntimeError, ValueError):  # it finished meanwhile
            pass


def work(
    study: Any, storage: Any, plan: Plan, trials_left: Iterator[int], stopping: threading.Event
) -> None:
    """One worker: run trials while `trials_left` gives one and no stop is asked, telling the study
    how each ended."""
    import optuna
    from optuna.trial import TrialState

    for _ in trials_left:
        if stopping.is_set():
            return
        fail_stale_trials(study, storage)
        trial = study.ask()
        try:
            value = run_trial(trial, plan, stopping)
        except optuna.TrialPruned as pruned:
            study.tell(trial, state=TrialState.PRUNED, skip_if_finished=True)
            print(f"tune: trial {trial.number} pruned {pruned}", flush=True)
        except (RunFailed, Interrupted) as error:
            reason = (
                str(error)
                if isinstance(error, RunFailed)
                else "interrupted (Ctrl-C, SIGTERM or SIGHUP)"
            )
            fail(study, trial, reason, interrupted=isinstance(error, Interrupted))
            print(f"tune: trial {trial.number} failed: {reason.splitlines()[0]}", flush=True)
        except BaseException as error:  # a bug of the harness: the trial must not stay running
            fail(study, trial, repr(error))
            raise
        else:
            study.tell(trial, value)
            print(
                f"tune: trial {trial.number} value {value:.4f} ({trial.user_attrs['flags']})",
                flush=True,
            )


def fail(study: Any, trial: Any, reason: str, interrupted: bool = False) -> None:
    """Record `trial` as failed for `reason` (unless it has finished already: failed by another
    process as stale); an `interrupted` one (a stop, not its runs) does not count against a
    --worker's trials."""
    from optuna.trial import TrialState

    try:
        trial.set_user_attr("error", reason)
        if interrupted:
            trial.set_user_attr("interrupted", True)
    finally:
        study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)


@contextmanager
def stop_signals_set(stopping: threading.Event) -> Iterator[None]:
    """Inside it, each of `STOP_SIGNALS` sets `stopping` (once, with a line on stderr), wherever the
    main thread is."""

    def stop(signum: int, frame: Any) -> None:
        if stopping.is_set():
            return
        # set before the line: the same signal from a scheduler and a parent, at once, prints once
        stopping.signum = signum
        stopping.set()
        print(
            f"\ntune: {signal.Signals(signum).name}: stopping every running trial",
            file=sys.stderr,
            flush=True,
        )

    previous = {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def load_study(args: Tune, name: str, storage_location: str) -> tuple[Any, Any, Plan]:
    """The study (made if new), its storage and this command's plan, checked against the study's
    settings."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_tune(args)
    plan = make_plan(args, Path(args.out or TUNE_FOLDER / name))  # before anything is written
    storage = open_storage(storage_location)
    seed = args.sampler_seed if args.sampler_seed is not None else secrets.randbits(31)
    # workers in flight: no repeated proposal
    sampler = optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    pruner = optuna.pruners.MedianPruner(
        n_startup_trials=5, n_warmup_steps=args.steps * 3 // REPORTS
    )
    if args.pruner == "none":
        pruner = optuna.pruners.NopPruner()
    study = optuna.create_study(
        study_name=name,
        storage=storage,
        sampler=sampler,
        pruner=pruner,
        direction="maximize",
        load_if_exists=True,
    )
    stored = study.user_attrs.get("settings")
    if stored is None and not study.trials and any(plan.out.glob("trial-*")):
        raise UsageError(
            f"{plan.out} holds the trials of another study: give another --out, or delete them"
        )
    plan = replace(plan, bounds=env_bounds(args, stored["bounds"] if stored else {}))
    settings = plan.settings()
    if stored is None:
        study.set_user_attr("settings", settings)
        # The first trial runs the script's defaults (and --flags), where the space holds them: the
        # yardstick.
        defaults = resolve_args(plan.script, plan.flags)
        values = {
            param.field: param.value_of(getattr(defaults, param.field)) for param in plan.space
        }
        study.enqueue_trial(
            {field: value for field, value in values.items() if value is not None},
            skip_if_exists=True,
        )
        # another's, if it won
        stored = optuna.load_study(study_name=name, storage=storage).user_attrs["settings"]
    if stored != settings:
        differing = ", ".join(key for key in settings if stored.get(key) != settings[key])
        raise UsageError(f"study {name!r} in {storage_location} was made with other settings ({differing}): give "
                         "another --study, or the same settings")  # fmt: skip
    print(f"tune: study {name!r} in {storage_location}; sampler seed {seed}", flush=True)
    return study, storage, plan


def tune(args: Tune) -> int:
    args.script = args.script.removesuffix(".py")
    name = args.study or args.script
    storage_location = args.storage or default_storage(name)
    try:
        template = check_cluster(args) if args.launcher == "slurm" else None
        study, storage, plan = load_study(args, name, storage_location)
        if template is not None:
            return submit_sweep(args, template, study, plan, storage_location)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    fail_stale_trials(study, storage)
    trials = args.trials - worker_done(study, storage, args.worker)
    runs = len(plan.env_ids) * len(plan.seeds)
    print(
        f"tune: {trials} trials, {args.workers} at a time, each {runs} runs of {plan.steps:,} steps "
        f"({plan.threads} thread{'s' if plan.threads > 1 else ''} each); runs in {plan.out}",
        flush=True,
    )
    trials_left = iter(range(trials))
    lock = threading.Lock()

    def next_trial() -> Iterator[int]:
        while True:
            with lock:
                number = next(trials_left, None)
            if number is None:
                return
            yield number

    stopping = threading.Event()
    with stop_signals_set(stopping), ThreadPoolExecutor(max_workers=args.workers) as pool:
        workers = [
            pool.submit(work, study, storage, plan, next_trial(), stopping)
            for _ in range(args.workers)
        ]
        wait(workers)
    for worker in workers:
        worker.result()  # a harness bug: its traceback
    # a sweep's workers end together: tune-report reports once
    if args.worker is None:
        report(study, plan.out / "report")
    return 128 + getattr(stopping, "signum", 2) if stopping.is_set() else 0


def worker_done(study: Any, storage: Any, worker: str | None) -> int:
    """The trials `worker` has run to an end of their own (complete, pruned, or failed by their
    runs) in earlier starts; its trials still running are failed as interrupted (their process
    was this worker's, stopped)."""
    from optuna.trial import TrialState

    if worker is None:
        return 0
    done = 0
    for trial in study.get_trials(deepcopy=False):
        if trial.user_attrs.get("worker") != worker:
            continue
        if trial.state == TrialState.RUNNING:
            storage.set_trial_user_attr(trial._trial_id, "error", "its worker stopped (requeued)")
            storage.set_trial_user_attr(trial._trial_id, "interrupted", True)
            study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
        elif not trial.user_attrs.get("interrupted"):
            done += 1
    if done:
        print(f"tune: worker {worker} ran {done} of its trials before", flush=True)
    return done


def element_flags(
    args: Tune, storage_location: str, trials: int, worker: str, index: int
) -> list[str]:
    """The command line of `tune` for one worker of a sweep's array: the sweep's own flags, every
    path made absolute (an element runs in the checkout), its share of the trials and its name."""

    def absolute(path: str) -> str:
        return path if "://" in path else str(Path(path).resolve())

    flags = [args.script, "--steps", str(args.steps), "--trials", str(trials), "--workers", "1"]
    flags += ["--seeds", *map(str, args.seeds), "--study", args.study or args.script]
    flags += ["--storage", absolute(storage_location), "--worker", worker]
    flags += [
        f"--flags={args.flags}",
        "--objective",
        args.objective,
        "--eval-episodes",
        str(args.eval_episodes),
    ]
    flags += ["--pruner", args.pruner, "--heartbeat-seconds", str(args.heartbeat_seconds)]
    for flag, values in (("--env-id", args.env_id), ("--space", args.space), ("--random", args.random),
                         ("--target", args.target)):  # fmt: skip
        flags += [token for value in values for token in (flag, value)]
    if args.space_file:
        flags += ["--space-file", *map(absolute, args.space_file)]
    if (
        args.sampler_seed is not None
    ):  # each worker its own: the same seed would propose the same settings
        flags += ["--sampler-seed", str(args.sampler_seed + index)]
    if args.out is not None:
        flags += ["--out", absolute(args.out)]
    return flags


def submit_sweep(args: Tune, template: str, study: Any, plan: Plan, storage_location: str) -> int:
    """Submit the sweep as --workers elements of one job array (`template`: its batch script),
    sharing --trials and the study, and return at once (with --wait: then wait and report)."""
    if "://" not in storage_location:
        print(
            f"notice: the journal file {storage_location} is shared only where every node sees it, and file locks "
            "hold there: a database URL (postgresql://...) is safer on a cluster",
            file=sys.stderr,
        )
    name = datetime.now().strftime("sweep-%Y%m%d-%H%M%S-%f")
    shares = [
        args.trials // args.workers + (index < args.trials % args.workers)
        for index in range(args.workers)
    ]
    shares = [share for share in shares if share]  # no worker without a trial
    elements = []
    for index, share in enumerate(shares):
        worker = f"{name}-{index}"
        flags = element_flags(args, storage_location, share, worker, index)
        elements.append(
            {"worker": worker, "command": [sys.executable, "-m", "benchmark", "tune", *flags]}
        )
    folder = plan.out / FOLDER
    array_job, _ = submit_array(args, template, folder, name, elements)
    print(f"tune: submitted job array {array_job}: {len(shares)} workers sharing {args.trials} trials of study "
          f"{study.study_name!r}; each worker's log:", flush=True)  # fmt: skip
    for index, share in enumerate(shares):
        print(
            f"  {array_job}_{index} ({share} trials): {folder / 'logs' / f'{array_job}_{index}.log'}",
            flush=True,
        )
    report_command = (
        f"python -m benchmark tune-report --study {study.study_name} --storage {storage_location}"
    )
    if not args.wait:
        print(
            f"tune: {report_command} reports on it, from any machine that reaches the storage",
            flush=True,
        )
        return 0

    def active() -> bool:
        found = elements_by_name(folder, "worker").values()
        return any(
            element.active
            for elements in found
            for element in elements
            if element.array_job == array_job
        )

    if not wait_for(active, f"job array {array_job}"):
        return 130
    report(study, plan.out / "report")
    return 0


def trial_table(trials: list[Any], params: list[str]) -> list[str]:
    """A markdown table of `trials`: value, the space's values, SPS and wall-clock."""
    lines = [
        "| trial | value | "
        + " | ".join(param.replace("_", "-") for param in params)
        + " | SPS | minutes |"
    ]
    lines.append("|---" * (len(params) + 4) + "|")
    for trial in trials:
        values = [f"{value:.4g}" if isinstance(value := trial.params.get(param, ""), float) else str(value)
                  for param in params]  # fmt: skip
        sps, seconds = trial.user_attrs.get("sps"), trial.user_attrs.get("wall_seconds")
        numbers = [
            f"{sps:.0f}" if sps is not None else "",
            f"{seconds / 60:.1f}" if seconds is not None else "",
        ]
        lines.append(
            f"| {trial.number} | {trial.value:.4f} | " + " | ".join([*values, *numbers]) + " |"
        )
    return lines


def report(study: Any, out: Path, top: int = 10) -> None:
    """Print the study's counts, best trial as the command lines that run it, and a table of its
    best `top` trials; draw its plots into `out`."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    counts = {state: sum(trial.state == state for trial in trials) for state in TrialState}
    print(
        f"study {study.study_name!r}: {len(trials)} trials, "
        + ", ".join(f"{count} {state.name.lower()}" for state, count in counts.items() if count),
        flush=True,
    )
    complete = sorted(
        (t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.value, reverse=True
    )
    if not complete:
        print("no trial has completed yet", flush=True)
        return
    settings, best = study.user_attrs["settings"], complete[0]
    objective = (
        "its evaluation"
        if settings["objective"] == "eval"
        else "the mean of its last 100 training episodes"
    )
    print(f"best: trial {best.number}, value {best.value:.4f} (mean normalised score; a run's return: {objective}); "
          f"each command ran with --seed {' and '.join(map(str, settings['seeds']))}")  # fmt: skip
    for env_id in settings["env_ids"]:
        print(
            "  " + shlex.join(command_line(settings, env_id, shlex.split(best.user_attrs["flags"])))
        )
    params = sorted({param for trial in complete for param in trial.params})
    print("\n".join(["", *trial_table(complete[:top], params), ""]), flush=True)
    for figure in draw(study, complete, out):
        print(f"wrote {figure}", flush=True)


def draw(study: Any, complete: list[Any], out: Path) -> list[Path]:
    """Optuna's optimisation history and parameter importances, and the best value against
    wall-clock hours from the study's first trial, as PNG files in `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as optuna_plots

    out.mkdir(parents=True, exist_ok=True)
    figures = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
        for name, plot in (("history", optuna_plots.plot_optimization_history),
                           ("importances", optuna_plots.plot_param_importances)):  # fmt: skip
            try:
                axes = plot(study)
            except (RuntimeError, ValueError) as error:  # too few trials, or nothing varied
                print(f"{name} plot not drawn: {error}", flush=True)
                continue
            axes.figure.savefig(out / f"{name}.png", bbox_inches="tight", dpi=120)
            plt.close(axes.figure)
            figures.append(out / f"{name}.png")
    started = min(
        trial.datetime_start for trial in study.get_trials(deepcopy=False) if trial.datetime_start
    )
    ended = sorted(complete, key=lambda trial: trial.datetime_complete)
    hours = [(trial.datetime_complete - started).total_seconds() / 3600 for trial in ended]
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.step(
        hours, np.maximum.accumulate([trial.value for trial in ended]), where="post", marker="o"
    )
    axes.set_xlim(left=0)
    axes.set(
        xlabel="hours since the study's first trial", ylabel="best value", title=study.study_name
    )
    figure.savefig(out / "best_by_wall_clock.png", bbox_inches="tight", dpi=120)
    plt.close(figure)
    return [*figures, out / "best_by_wall_clock.png"]


def tune_report(args: TuneReport) -> int:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    location = args.storage or default_storage(args.study)
    if "://" not in location and not Path(location).is_file():
        print(f"error: no journal file {location}", file=sys.stderr)
        return 2
    try:
        study = optuna.load_study(study_name=args.study, storage=open_storage(location))
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyError:
        print(f"error: no study {args.study!r} in {location}", file=sys.stderr)
        return 2
    report(study, Path(args.out or TUNE_FOLDER / args.study / "report"), args.top)
    return 0
