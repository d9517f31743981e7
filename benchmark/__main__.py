"""The benchmark harness: ``python -m benchmark run ...`` trains, ``python -m benchmark plot RUN_DIR ...`` draws.

``run`` starts every job (a script's run, a baseline's run, a raw-env measurement) as its own process (a case's
``nproc`` processes under torchrun), ``--workers`` processes at a time, each in a folder named by its job id; a crashed
run is reported and the others go on. With ``--baselines`` it also measures each script's env stack under random
actions and its Stable-Baselines3 counterpart, with settings derived from the script's own (`benchmark.registry`). It
then writes ``results.md``, ``results.json`` (every number results.md shows) and PNG figures to the output folder.
``plot`` makes the same table and figures from any run folders.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import tyro

from benchmark.cases import (
    REFERENCE_MARGIN,
    SPEED_THRESHOLD,
    SUITES,
    Case,
    Learned,
    Published,
    ReferenceRuns,
    SameRun,
    find_case,
    settings_hash,
    suite_cases,
)
from benchmark.events import LAST_EPISODES, RunSummary, find_run_dirs, safe_name, summarise_run
from benchmark.processes import stderr_tail
from benchmark.registry import REFERENCES, SCRIPTS, launcher, resolve_args, same_settings_flags
from benchmark.report import (
    AgainstReference,
    Row,
    RowNumbers,
    SpeedNumbers,
    against_reference_table,
    aggregates,
    fmt,
    median_to_reach,
    plain_name,
    plot_aggregate,
    plot_learning_curves,
    plot_sps,
    results_table,
    row_numbers,
    share_of_range,
    speed_numbers,
    speed_table,
)
from benchmark.stored import load_run, store_run, stored_path
from benchmark.tune import Tune, TuneReport, tune, tune_report
from common.errors import UsageError
from common.seeding import available_cores

REPO = Path(__file__).resolve().parent.parent
RAW_ENV_STEPS = 200_000
"""env steps of each raw-env measurement (fewer when a case is shorter)"""
DEFAULT_SCRIPTS, DEFAULT_ENVS, DEFAULT_SEEDS = ("ppo_fc",), ("CartPole-v1",), (1, 2, 3)
DEFAULT_EVAL_EPISODES = 10
RANDOM_POLICY_EPISODES = 100
"""episodes of each measurement of the random policy's return"""


@dataclass
class Run:
    """Train scripts on envs with several seeds, then write the table and the figures."""

    scripts: tuple[str, ...] | None = None
    """the scripts to run (file stems in the repository root; default ppo_fc)"""
    envs: tuple[str, ...] | None = None
    """the env ids to run each script on (default CartPole-v1)"""
    seeds: tuple[int, ...] | None = None
    """one run per seed (default 1 2 3; with --suite, replaces the suite's seeds)"""
    total_timesteps: int | None = None
    """env steps of every run (default: each case's own, see benchmark/cases.py)"""
    suite: (
        Literal[
            "quick",
            "full",
            "recurrent",
            "bptt",
            "memory",
            "memory-speed",
            "memory-transformer",
            "memory-transformer-no-par",
            "transformer",
            "memory-length",
            "popgym-easy",
            "lstm-norm-adv",
            "memory-lstm-no-norm-adv",
            "popgym-easy-lstm-no-norm-adv",
            "ddpg",
            "ddpg-envs",
            "ddpg-time",
            "ddpg-mujoco",
            "distributed",
            "distributed-speed",
            "atari",
            "atari-transformer",
        ]
        | None
    ) = None
    """a named set of cases and seeds from benchmark/cases.py, instead of --scripts, --envs, --total-timesteps
    and --nproc"""
    nproc: int | None = None
    """processes under torchrun for every script run (default 1: plain python; a suite sets its cases' own)"""
    script_flags: tuple[str, ...] = ()
    """SCRIPT=FLAGS: flags added to every case of that script, e.g. 'ppo_transformer=--learning-rate 1e-3'"""
    workers: int = 1
    """processes at a time: a job under torchrun counts as its processes, and one of more processes than this runs
    alone (more than one distorts SPS: the runs share the CPU)"""
    baselines: bool = False
    """also measure each script's env stack under random actions and its Stable-Baselines3 counterpart"""
    eval_episodes: int | None = None
    """deterministic evaluation episodes at the end of every run (default: the suite's, else 10)"""
    reuse_baselines: str | None = None
    """a folder of stored reference runs (benchmark/registry.py REFERENCES): those stored there are reused, not run
    again (the table gives their date and commit); those missing are run and stored there as each finishes"""
    reuse_runs: str | None = None
    """the same for the scripts' runs: a killed benchmark resumes, a comparison reuses its yardstick's runs"""
    only_baselines: bool = False
    """run the references, baselines and random-policy measurements only, not the scripts (to fill --reuse-baselines)"""
    out: str | None = None
    """output folder (default benchmark/results/<date>_<time>); runs go to <out>/runs, their output to <out>/logs"""


@dataclass
class Plot:
    """Draw the learning curves and the SPS chart, and write the table, for run folders made by any script here."""

    run_dirs: Annotated[tuple[str, ...], tyro.conf.Positional]
    """run folders, or folders holding them (searched recursively for TensorBoard event files)"""
    out: str = "benchmark-plots"
    """output folder for results.md and the PNG files"""


@dataclass
class Job:
    """One process of the benchmark and how it ended."""

    kind: Literal["script", "sb3", "raw-env", "random-policy"]
    id: str
    """unique in a benchmark: names the job's run folder and logs"""
    group: str
    """the row the job belongs to: its id without the seed"""
    label: str
    env_id: str
    seed: int | None
    command: list[str]
    run_dir: Path
    """the folder given to the process as its --run-dir (its run folder is made inside)"""
    returncode: int | None = None
    wall_seconds: float = 0.0
    error: str | None = None
    output: dict[str, Any] = field(default_factory=dict)
    """the JSON a raw-env measurement printed"""
    summary: RunSummary | None = None
    """the run the job made, read back from its events"""
    stored: dict[str, Any] | None = None
    """for a reference run taken from --reuse-baselines: when and where it was made (not run again)"""
    revision: str | None = None
    """the commit the process started at (a background benchmark can outlive a commit)"""
    window: int = LAST_EPISODES
    """the case's window of training episodes (`Case.window`)"""
    nproc: int = 1
    """the processes the job starts: a script's case's `Case.nproc` under torchrun, 1 for the rest"""


@dataclass
class CasePlan:
    """A case and the groups of jobs that measure it."""

    case: Case
    baseline_group: str | None = None
    raw_env_job: str | None = None
    reference: Case | None = None
    """the case of `case.compare_with` with the same settings"""
    reference_group: str | None = None
    """the runs of the case's `ReferenceRuns`"""
    random_policy_job: str | None = None
    """the measurement of the random policy's return on the case's env"""


def cases_to_run(args: Run) -> tuple[list[Case], tuple[int, ...]]:
    if args.suite is not None:
        return with_script_flags(suite_cases(args.suite), args.script_flags), args.seeds or SUITES[
            args.suite
        ].seeds
    scripts, envs = args.scripts or DEFAULT_SCRIPTS, args.envs or DEFAULT_ENVS
    cases = [
        find_case(script, env_id, args.total_timesteps) for script in scripts for env_id in envs
    ]
    if args.nproc is not None:
        cases = [replace(case, nproc=args.nproc) for case in cases]
    return with_script_flags(cases, args.script_flags), args.seeds or DEFAULT_SEEDS


def with_script_flags(cases: list[Case], script_flags: tuple[str, ...]) -> list[Case]:
    """`cases` with the flags of each `SCRIPT=FLAGS` entry added to that script's cases (and to a case another is
    judged against in the same run); a malformed entry or a script no case runs is a UsageError."""
    added: dict[str, tuple[str, ...]] = {}
    for entry in script_flags:
        script, equals, flags = entry.partition("=")
        if not equals or not script or not flags.strip():
            raise UsageError(
                f"--script-flags {entry!r}: write SCRIPT=FLAGS, e.g. 'ppo_lstm=--no-norm-adv'"
            )
        if script not in {case.script for case in cases}:
            raise UsageError(f"--script-flags {entry!r}: no case of this benchmark runs {script}")
        added[script] = (*added.get(script, ()), *shlex.split(flags))

    def with_flags(case: Case) -> Case:
        reference = case.reference
        if isinstance(reference, SameRun):
            reference = replace(reference, case=with_flags(reference.case))
        return replace(case, flags=(*case.flags, *added.get(case.script, ())), reference=reference)

    return [with_flags(case) for case in cases] if added else cases


def eval_episodes(args: Run) -> int:
    """The evaluation episodes of every run: the command line's, else the suite's, else 10."""
    if args.eval_episodes is not None:
        return args.eval_episodes
    return SUITES[args.suite].eval_episodes if args.suite is not None else DEFAULT_EVAL_EPISODES


def baseline_seeds(args: Run, seeds: tuple[int, ...]) -> tuple[int, ...]:
    """The seeds of the Stable-Baselines3 baselines: the suite's own where it has them and --seeds is not given."""
    suite_seeds = SUITES[args.suite].baseline_seeds if args.suite is not None else None
    return seeds if args.seeds is not None or suite_seeds is None else suite_seeds


def check(args: Run, cases: list[Case], seeds: tuple[int, ...]) -> None:
    """Bad input: one `error:` line and exit status 2, before anything runs."""
    problems = []
    if args.suite is not None:
        named = [
            ("--scripts", args.scripts),
            ("--envs", args.envs),
            ("--total-timesteps", args.total_timesteps),
        ]
        given = [flag for flag, value in [*named, ("--nproc", args.nproc)] if value is not None]
        if given:
            problems.append(
                f"--suite {args.suite} sets the scripts, envs, steps and processes: drop {', '.join(given)} (--seeds "
                "replaces the suite's seeds)"
            )
    if args.total_timesteps is not None and args.total_timesteps <= 0:
        problems.append("--total-timesteps must be positive")
    if any(case.nproc < 1 for case in cases):
        problems.append("--nproc must be at least 1")
    if not seeds or len(set(seeds)) != len(seeds):
        problems.append("--seeds needs one or more distinct seeds")
    if args.workers < 1 or (args.eval_episodes is not None and args.eval_episodes < 0):
        problems.append("--workers must be at least 1 and --eval-episodes at least 0")
    for script in sorted({case.script for case in cases}):
        if not (REPO / f"{script}.py").is_file():
            problems.append(f"no script {script}.py in {REPO}")
        elif args.baselines and script not in SCRIPTS:
            problems.append(
                f"{script} has no entry in benchmark/registry.py for its baselines (drop --baselines)"
            )
    for other in sorted({case.compare_with for case in cases if case.compare_with is not None}):
        if not (REPO / f"{other}.py").is_file():
            problems.append(f"no script {other}.py in {REPO} to compare with")
    if not problems:
        for case in cases:
            try:
                resolve_args(case.script, case.flags)
                if case.compare_with is not None:
                    same_settings_flags(case.script, case.flags, case.compare_with)
            except (UsageError, ValueError) as exc:
                problems.append(f"the flags of case {case.name}: {exc}")
    if problems:
        print("error: " + "; ".join(problems), file=sys.stderr)
        sys.exit(2)


def make_jobs(
    args: Run, cases: list[Case], seeds: tuple[int, ...], out: Path
) -> tuple[list[Job], list[CasePlan]]:
    """Every job of the benchmark, once each: a baseline that several cases share (the same settings, env and steps)
    runs once, and so does a raw-env measurement (the same script, env and flags)."""
    jobs: dict[str, Job] = {}
    plans = []

    def add(kind: Literal["script", "sb3", "raw-env", "random-policy"], group: str, label: str, case: Case,
            seed: int | None, command):  # fmt: skip
        job_id = group if seed is None else f"{group}__{seed}"
        run_dir = out / "runs" / job_id
        if kind in ("script", "sb3"):
            command = [*command, "--run-dir", str(run_dir)]
        job = Job(
            kind, job_id, group, label, case.env_id, seed, command, run_dir, window=case.window
        )
        job.nproc = (
            case.nproc if kind == "script" else 1
        )  # baselines and measurements run in one process
        jobs.setdefault(job_id, job)

    baselines_module = [sys.executable, "-m", "benchmark.baselines"]
    for case in cases:
        plan = CasePlan(case)
        run_flags = ["--env-id", case.env_id, "--total-timesteps", str(case.total_timesteps)]
        run_flags += ["--eval-episodes", str(eval_episodes(args))]
        env_name = safe_name(case.env_id)
        scripts = [case]
        if case.compare_with is not None:
            flags = same_settings_flags(case.script, case.flags, case.compare_with)
            # under as many processes: the ratio of SPS is of the scripts, not of their numbers of processes
            plan.reference = Case(
                case.compare_with, case.env_id, case.total_timesteps, flags=flags, nproc=case.nproc
            )
            scripts.append(plan.reference)
        if isinstance(case.reference, SameRun):  # the suite runs that case too
            plan.reference_group = case.reference.case.key
        if isinstance(case.reference, ReferenceRuns):
            reference = REFERENCES[case.reference.name]
            settings_id = settings_hash(reference.settings)
            plan.reference_group = (
                f"{reference.name}__{env_name}__{case.total_timesteps}__{settings_id}"
            )
            for seed in case.reference.seeds:
                command = [
                    *baselines_module,
                    "sb3",
                    "--algo",
                    reference.sb3_algo,
                    *run_flags,
                    "--seed",
                    str(seed),
                ]
                command += ["--settings", json.dumps(reference.settings), "--label", reference.name]
                add("sb3", plan.reference_group, reference.name, case, seed, command)
        if case.task_max is not None:
            plan.random_policy_job = f"random-policy__{env_name}"
            command = [*baselines_module, "random-policy", "--env-id", case.env_id]
            command += ["--episodes", str(RANDOM_POLICY_EPISODES)]
            add("random-policy", plan.random_policy_job, "random policy", case, None, command)
        for script_case in [] if args.only_baselines else scripts:
            script_launcher = launcher(script_case.nproc)
            for seed in seeds:
                command = [
                    *script_launcher,
                    str(REPO / f"{script_case.script}.py"),
                    *run_flags,
                    "--seed",
                    str(seed),
                ]
                command += ["--no-progress", *script_case.flags]
                add("script", script_case.key, script_case.script, script_case, seed, command)
        if args.baselines:
            script = SCRIPTS[case.script]
            settings = script.sb3_settings(
                resolve_args(case.script, [*case.flags, "--env-id", case.env_id])
            )
            baseline_name = f"sb3_{script.sb3_algo}__{env_name}__{case.total_timesteps}"
            plan.baseline_group = f"{baseline_name}__{settings_hash(settings)}"
            for seed in baseline_seeds(args, seeds):
                command = [*baselines_module, "sb3", "--algo", script.sb3_algo, *run_flags]
                command += ["--seed", str(seed), "--settings", json.dumps(settings)]
                add("sb3", plan.baseline_group, f"sb3_{script.sb3_algo}", case, seed, command)
            plan.raw_env_job = f"raw-env__{case.script}__{env_name}__{settings_hash(case.flags)}"
            command = [*baselines_module, "raw-env", "--script", case.script]
            command += ["--env-id", case.env_id, "--flags", json.dumps(case.flags)]
            command += ["--steps", str(min(case.total_timesteps, RAW_ENV_STEPS))]
            add("raw-env", plan.raw_env_job, f"raw env ({case.script})", case, None, command)
        plans.append(plan)
    return list(jobs.values()), plans


def run_job(job: Job, logs: Path, threads: int | None = None) -> Job:
    """Run the job's process, with `threads` as each of its processes' share of the cores (OMP_NUM_THREADS, which the
    scripts' default --torch-threads reads, where not set already); record how it ended, then what it printed (raw
    env) or the run it made (the rest)."""
    job.revision, start = git_revision(logs.parent), time.perf_counter()
    environment = {"OMP_NUM_THREADS": str(threads)} if threads else {}
    environment = {**environment, **os.environ}
    process = subprocess.run(job.command, cwd=REPO, capture_output=True, text=True, env=environment)
    job.wall_seconds, job.returncode = time.perf_counter() - start, process.returncode
    (logs / f"{job.id}.stdout").write_text(process.stdout)
    (logs / f"{job.id}.stderr").write_text(process.stderr)
    if process.returncode != 0:
        job.error = f"exit status {process.returncode}: {stderr_tail(process.stderr)}"
    elif job.kind in ("raw-env", "random-policy"):
        try:
            job.output = json.loads(process.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            job.error = "printed no JSON result"
    else:
        made = find_run_dirs([job.run_dir]) if job.run_dir.is_dir() else []
        if len(made) != 1:
            job.error = f"expected one run folder in {job.run_dir}, found {len(made)}"
            return job
        try:
            job.summary = summarise_run(
                made[0], script=job.label, env_id=job.env_id, window=job.window
            )
        except Exception as exc:  # a corrupt events file is reported like a crash
            job.error = f"reading the events of {made[0]} failed: {exc!r}"
    return job


def portable(command: list[str]) -> list[str]:
    """A job's command less the interpreter, the run folder and the checkout's folder of a script, which differ
    between machines and benchmarks."""
    at = command.index("--run-dir") if "--run-dir" in command else len(command)
    return [
        Path(part).name if part.endswith(".py") else part
        for part in command[1:at] + command[at + 2 :]
    ]


@dataclass(frozen=True)
class Stores:
    """Where finished runs are kept between benchmarks (benchmark/stored.py): the references' (--reuse-baselines)
    and the scripts' with their SB3 baselines' (--reuse-runs)."""

    references: Path | None = None
    scripts: Path | None = None

    def of(self, job: Job) -> Path | None:
        """The store of `job`'s run, if it is kept."""
        if job.label in REFERENCES:
            return self.references
        return self.scripts if job.kind in ("script", "sb3") else None


def take_stored(jobs: list[Job], stores: Stores) -> list[Job]:
    """The jobs still to run: a job whose run is in its store takes it from there (UsageError: a stored file that
    cannot be read, or that another command made)."""
    to_run = []
    for job in jobs:
        store = stores.of(job)
        kept = load_run(store, job.id) if store is not None else None
        if kept is None:
            to_run.append(job)
            continue
        # The job id names the settings, not every flag (the evaluation episodes): the whole command must match.
        stored_command = shlex.split(kept[1].get("command", ""))
        if portable(stored_command) != portable(job.command):
            message = "was made by another command than this benchmark's (its made.command): delete it to run it again"
            raise UsageError(f"{stored_path(store, job.id)} {message}")
        job.summary, job.stored = kept
        print(
            f"[stored] {job.id} ({job.label}): made {job.stored['date']} at {job.stored['git']}",
            flush=True,
        )
    return to_run


def workers_taken(job: Job, workers: int) -> int:
    """The workers a job takes: one per process, so that `workers` bounds the processes at a time; a job of more
    processes than `workers` takes them all (it runs alone)."""
    return min(job.nproc, workers)


def run_jobs(jobs: list[Job], workers: int, logs: Path, stores: Stores = Stores()) -> None:
    """Run the jobs, `workers` processes at a time (every seed's first: a partial benchmark then covers every case),
    printing a line as each ends. Jobs start in that order, each once enough workers are free for its processes. A
    run that has a store in `stores` is stored there as it ends."""
    waiting = sorted(jobs, key=lambda job: -1 if job.seed is None else job.seed)
    running: dict[Future[Job], int] = {}
    threads = max(1, available_cores() // workers)  # a process's share: no core runs two threads
    done = 0
    with ThreadPoolExecutor(max_workers=workers) as pool:
        while waiting or running:
            # In order, none skipping ahead: single processes started past a torchrun job could keep it waiting.
            while waiting and sum(running.values()) + workers_taken(waiting[0], workers) <= workers:
                job = waiting.pop(0)
                running[pool.submit(run_job, job, logs, threads)] = workers_taken(job, workers)
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                del running[future]
                done += 1
                job = future.result()
                status = job_status(job, stores.of(job))
                print(
                    f"[{done}/{len(jobs)}] {job.id} ({job.label}): {job.wall_seconds:.0f} s, {status}",
                    flush=True,
                )


def job_status(job: Job, store: Path | None) -> str:
    """How a job ended, for its line as it ends; its run is stored in `store` here, if given."""
    if job.error is not None:
        return f"FAILED: {job.error.splitlines()[-1]}"
    if job.summary is not None:
        run = job.summary
        status = f"last-{run.window} return {fmt(run.last_return)}, eval {fmt(run.eval_return)}, SPS {fmt(run.sps, 0)}"
        if store is not None:
            made = {
                "date": datetime.now().astimezone().isoformat(timespec="seconds"),
                "git": job.revision,
            }
            made |= {
                "machine": machine(),
                "command": shlex.join(job.command),
                "wall_seconds": job.wall_seconds,
            }
            status += f"; stored in {store_run(store, job.id, run, made)}"
        return status
    if job.kind == "random-policy":
        return f"return {fmt(job.output.get('mean'), 3)} over {job.output.get('episodes')} episodes"
    return f"SPS {fmt(job.output.get('sps'), 0)}"


def rows_of(jobs: list[Job], plans: list[CasePlan]) -> list[Row]:
    """A row per case, and one per baseline (once, however many cases share it)."""
    by_group: dict[str, list[Job]] = defaultdict(list)
    for job in jobs:
        by_group[job.group].append(job)
    rows, seen = [], set()
    for plan in plans:
        case = plan.case
        groups = [
            (case.key, case.flags, case.nproc, True),
            (plan.reference_group, (), 1, False),  # baselines run in one process
            (plan.baseline_group, (), 1, False),
        ]
        if plan.reference is not None:
            groups.insert(
                1, (plan.reference.key, plan.reference.flags, plan.reference.nproc, False)
            )
        for group, flags, nproc, judged in groups:
            if (
                group is None or group in seen or not by_group[group]
            ):  # none: --only-baselines left the script out
                continue
            seen.add(group)
            group_jobs = by_group[group]
            rows.append(
                Row(
                    label=group_jobs[0].label,
                    env_id=case.env_id,
                    key=group,
                    total_timesteps=case.total_timesteps,
                    flags=flags,
                    nproc=nproc,
                    threshold=(
                        reference_bound(case, *task_and_reference(plan, jobs))
                        if case.judged_on == "reference"
                        else case.threshold
                    ),
                    judged=judged,
                    judged_on=case.judged_on,
                    runs=[job.summary for job in group_jobs if job.summary is not None],
                    failed_seeds=[
                        job.seed
                        for job in group_jobs
                        if job.summary is None and job.seed is not None
                    ],
                )
            )
    return rows


def task_and_reference(plan: CasePlan, jobs: list[Job]) -> tuple[float | None, float | None]:
    """The random policy's mean return on the case's env, and the reference's mean evaluation (the published one,
    the return that counts as having learnt the task, or the mean over the reference's runs); None where not
    measured."""
    random_job = next((job for job in jobs if job.id == plan.random_policy_job), None)
    random_return = random_job.output.get("mean") if random_job is not None else None
    reference, task_max = plan.case.reference, plan.case.task_max
    if isinstance(reference, Published):
        return random_return, reference.eval_return
    if isinstance(reference, Learned):
        learned = (
            None
            if random_return is None
            else random_return + reference.share * (task_max - random_return)
        )
        return random_return, learned
    evals = [
        job.summary.eval_return
        for job in jobs
        if job.group == plan.reference_group
        and job.summary is not None
        and job.summary.eval_return is not None
    ]
    return random_return, float(np.mean(evals)) if evals else None


def reference_bound(
    case: Case, random_return: float | None, reference_eval: float | None
) -> float | None:
    """What a case's mean evaluation must reach: the reference's, less REFERENCE_MARGIN of the task's range; a
    `Learned` reference's exactly; against a `SameRun` that did not learn the task, nothing (no verdict)."""
    if random_return is None or reference_eval is None or case.task_max is None:
        return None
    task_range = case.task_max - random_return
    if isinstance(case.reference, Learned):
        return reference_eval
    if (
        isinstance(case.reference, SameRun)
        and reference_eval < random_return + case.reference.learned.share * task_range
    ):
        return None
    return reference_eval - REFERENCE_MARGIN * task_range


def against_reference(
    plan: CasePlan, jobs: list[Job], rows: list[Row], numbers: dict[str, RowNumbers]
) -> AgainstReference:
    """The case's line of the table against its reference (for a case judged on "reference")."""
    case = plan.case
    random_return, reference_eval = task_and_reference(plan, jobs)
    script_row = next((row for row in rows if row.key == case.key), None)
    reference_row = next((row for row in rows if row.key == plan.reference_group), None)
    script_runs = script_row.runs if script_row is not None else []
    reference_runs = reference_row.runs if reference_row is not None else []
    speed_threshold = None
    if random_return is not None and reference_eval is not None:
        speed_threshold = random_return + SPEED_THRESHOLD * (reference_eval - random_return)
    script_numbers = numbers.get(case.key)
    script_eval = script_numbers.eval_return_mean if script_numbers else None
    reference_jobs = [
        job for job in jobs if job.group == plan.reference_group and job.summary is not None
    ]
    made = [
        f"seed {job.seed} {job.stored['date'][:10]} at {job.stored['git']}"
        for job in reference_jobs
        if job.stored
    ]
    return AgainstReference(
        env_id=case.env_id,
        total_timesteps=case.total_timesteps,
        random_return=random_return,
        task_max=case.task_max,
        reference=case.reference.name
        if isinstance(case.reference, ReferenceRuns)
        else case.reference.source,
        reference_eval=reference_eval,
        reference_seeds=[run.seed for run in reference_runs],
        reference_made=made,
        script=case.script,
        script_eval=script_eval,
        script_eval_std=script_numbers.eval_return_std if script_numbers else None,
        bound=reference_bound(case, random_return, reference_eval),
        script_score=share_of_range(script_eval, random_return, case.task_max),
        reference_score=share_of_range(reference_eval, random_return, case.task_max),
        speed_threshold=speed_threshold,
        script_steps=median_to_reach(script_runs, speed_threshold, seconds=False),
        script_seconds=median_to_reach(script_runs, speed_threshold, seconds=True),
        reference_steps=median_to_reach(reference_runs, speed_threshold, seconds=False),
        reference_seconds=median_to_reach(reference_runs, speed_threshold, seconds=True),
        verdict=script_numbers.verdict if script_numbers else "-",
    )


def speed_rows(
    jobs: list[Job], plans: list[CasePlan], numbers: dict[str, RowNumbers]
) -> list[SpeedNumbers]:
    """The SPS ratios measured in this run: a run taken from a store ran in another, so it has none (a case whose own
    runs were stored has no row; a reference or compared script whose runs were stored, no ratio)."""
    raw = {job.id: job.output.get("sps") for job in jobs if job.kind == "raw-env"}
    stored = {job.group for job in jobs if job.stored is not None}
    rows = []
    for plan in plans:
        baseline_group = plan.baseline_group or (
            plan.reference_group if plan.reference_group not in stored else None
        )
        other = (
            numbers[plan.reference.key]
            if plan.reference and plan.reference.key not in stored
            else None
        )
        if plan.case.key in numbers and plan.case.key not in stored and (baseline_group or other):
            raw_env_sps = raw.get(plan.raw_env_job) if plan.raw_env_job else None
            rows.append(
                speed_numbers(
                    numbers[plan.case.key], raw_env_sps, numbers.get(baseline_group or ""), other
                )
            )
    return rows


def draw(rows: list[Row], raw_bars: list[tuple[str, list[float]]], out: Path) -> list[Path]:
    bars = [
        (f"{plain_name(row)}\n{row.env_id}", [run.sps for run in row.runs if run.sps is not None])
        for row in rows
    ]
    figures = [*plot_learning_curves(rows, out), plot_sps([*bars, *raw_bars], out / "sps.png")]
    values = aggregates(rows)
    if values:
        figures.append(plot_aggregate(values, out / "aggregate_iqm.png"))
    return figures


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = []
    for package in ("torch", "gymnasium", "numpy", "stable-baselines3"):
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            pass
    return (
        f"{cpu}, {os.cpu_count()} CPUs; Python {platform.python_version()}; {', '.join(versions)}"
    )


def git_revision(output: Path) -> str:
    """The commit the code runs at, "(uncommitted changes)" added if a tracked file outside `output` has changed."""
    # A benchmark rewrites its own output folder (tracked where its results are committed, as under docs/benchmark/):
    # that is no change to the code that ran.
    outside_output = (
        ["--", ".", f":(exclude){output.relative_to(REPO)}"] if output.is_relative_to(REPO) else []
    )
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", *outside_output],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
    except OSError:
        return "unknown"
    return (head.stdout.strip() or "unknown") + (
        " (uncommitted changes)" if dirty.stdout.strip() else ""
    )


def report(
    title: str, header_lines: list[str], tables: list[str], figures: list[Path], out: Path
) -> None:
    lines = [f"# {title}", "", *header_lines, "", *tables, "", "## Figures", ""]
    lines += [f"![{figure.stem}]({figure.name})" for figure in figures]
    (out / "results.md").write_text("\n".join(lines).rstrip() + "\n")


def run(args: Run) -> int:
    try:
        cases, seeds = cases_to_run(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    check(args, cases, seeds)
    out = Path(
        args.out or REPO / "benchmark" / "results" / datetime.now().strftime("%Y-%m-%d_%H%M%S")
    ).resolve()
    jobs, plans = make_jobs(args, cases, seeds, out)
    stores = Stores(
        *(
            Path(folder).resolve() if folder else None
            for folder in (args.reuse_baselines, args.reuse_runs)
        )
    )
    try:
        to_run = take_stored(jobs, stores)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    (out / "logs").mkdir(parents=True, exist_ok=True)
    print(
        f"benchmark: {len(to_run)} jobs of {sum(job.nproc for job in to_run)} processes, {args.workers} processes at a "
        f"time; results in {out}",
        flush=True,
    )
    run_jobs(to_run, args.workers, out / "logs", stores)

    rows = rows_of(jobs, plans)
    numbers = {row.key: row_numbers(row) for row in rows}
    speed = speed_rows(jobs, plans, numbers)
    raw_bars = [
        (f"raw env\n{job.label} {job.output['env_id']}", [job.output["sps"]])
        for job in jobs
        if "sps" in job.output
    ]
    figures = draw(rows, raw_bars, out)
    tables = ["## Results", "", *results_table(list(numbers.values()))]
    against = [
        against_reference(plan, jobs, rows, numbers)
        for plan in plans
        if plan.case.judged_on == "reference"
    ]
    if against:
        tables += [
            "",
            "## Against the reference",
            "",
            *against_reference_table(against),
            "",
            *AGAINST_REFERENCE,
        ]
    if speed:
        tables += [
            "",
            "## Speed against the baselines and other scripts (same run)",
            "",
            *speed_table(speed),
        ]
    tables += ["", *HOW_MEASURED]
    failures = [job for job in jobs if job.error is not None]
    if failures:
        tables += ["", "## Failures", ""]
        for job in failures:
            tables += [f"### {job.id}", "", "```", shlex.join(job.command), job.error, "```", ""]
    header = run_header(args, cases, seeds, out)
    report("Benchmark", header, tables, figures, out)
    record = {
        "header": header,
        "args": asdict(args),
        "cases": [{**asdict(case), "key": case.key} for case in cases],
        "seeds": list(seeds),
        "rows": [asdict(value) for value in numbers.values()],
        "speed": [asdict(value) for value in speed],
        "against_reference": [asdict(value) for value in against],
        "aggregate": [asdict(value) for value in aggregates(rows)],
        "jobs": [
            {
                "id": job.id,
                "kind": job.kind,
                "group": job.group,
                "seed": job.seed,
                "nproc": job.nproc,
                "command": job.command,
                "returncode": job.returncode,
                "wall_seconds": job.wall_seconds,
                "error": job.error,
                "output": job.output,
                "run_dir": job.summary.run_dir if job.summary else None,
                "stored": job.stored,
            }
            for job in jobs
        ],
    }
    (out / "results.json").write_text(json.dumps(record, indent=2) + "\n")
    failed = failures or any(value.verdict == "FAIL" for value in numbers.values())
    print(f"{'FAIL' if failed else 'PASS'}: wrote {out / 'results.md'}", flush=True)
    return 1 if failed else 0


def run_header(args: Run, cases: list[Case], seeds: tuple[int, ...], out: Path) -> list[str]:
    """Date, machine, command, cases and seeds: what is needed to reproduce the results."""
    command = (
        "python -m benchmark " + shlex.join(sys.argv[1:])
        if sys.argv[1:2] == ["run"]
        else "(called from Python)"
    )
    return [
        f"- date: {datetime.now().astimezone().isoformat(timespec='seconds')}; git {git_revision(out)}",
        f"- machine: {machine()}",
        f"- command: `{command}`",
        "- cases: " + "; ".join(f"{case.name} (id {case.key})" for case in cases),
        f"- seeds {' '.join(map(str, seeds))}; {args.workers} process{'es' if args.workers > 1 else ''} at a time",
    ]


AGAINST_REFERENCE = [
    f"A case passes when its mean evaluation over seeds reaches the reference's less {REFERENCE_MARGIN:.0%} of the "
    "task's range (maximum less the random policy's return). Share of range: (eval - random) / (max - random). Speed "
    f"threshold: the random return plus {SPEED_THRESHOLD:.0%} of the way to the reference's evaluation, reached by "
    "the mean of the last 100 training episodes (or a case's own window); steps and seconds of training to it are "
    "medians over seeds (n/a: the median seed never reached it). Seconds of stored reference runs were measured in "
    "another session: compare SPS in one run.",
]

HOW_MEASURED = [
    "How the numbers are measured:",
    "- Everything is read from the runs' TensorBoard events with TensorBoard's own readers, keeping every record; "
    "a resumed run's records after its checkpoint are dropped, as TensorBoard drops them. The last-100 training "
    "return is the mean of the last 100 `charts/episodic_return` records (every episode of every env; a case can set "
    "another window, marked in the table); the eval return is the mean of `eval/episodic_return` (deterministic "
    "policy after training). ± is the sample standard deviation across seeds (ddof=1); one seed shows none.",
    "- IQM (5 seeds or more): the interquartile mean across seeds, `scipy.stats.trim_mean(x, 0.25)`, with a 95% "
    "percentile bootstrap interval (50,000 resamples, `scipy.stats.bootstrap`): rliable's definitions (Agarwal et "
    "al., NeurIPS 2021). The aggregate figure takes the IQM over the runs of every case with a positive threshold, "
    "each return divided by its case's threshold, resampling the runs of each case on their own (stratified).",
    "- Steps to threshold: per seed, the first step at which the mean of the last 100 episodes (or the case's window: "
    "a full one) "
    "reaches the case's threshold; the median over seeds, a seed that never reaches it counting as beyond the budget. "
    "Beside it, the median seconds of training to that step: from the run's first event (start-up included) to the "
    "episode's record, the gaps between a run's sessions left out.",
    "- SPS: per session of a run (a resumed run has two or more), steps between the first and the last `charts/SPS` "
    "record over the wall time between them, summed over sessions: start-up, the first iteration, the final "
    "evaluation and the time between a crash and its resume are left out. Peak RSS: the largest `system/rss_mb` "
    "record, the process's resident memory when it was logged (scripts and baselines alike).",
    "- Raw env: the script's own vector env stack, with the case's flags, under random actions and no agent: an "
    "upper bound on any agent's SPS. Baselines run with settings derived from the script's (benchmark/registry.py); "
    "a baseline two cases share runs once.",
]


def plot(args: Plot) -> int:
    run_dirs = find_run_dirs(args.run_dirs)
    if not run_dirs:
        print(f"error: no TensorBoard event files under {' '.join(args.run_dirs)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    groups: dict[tuple[str, str], list[RunSummary]] = defaultdict(list)
    for summary in map(summarise_run, run_dirs):
        groups[summary.script, summary.env_id].append(summary)
    rows = [
        Row(
            label,
            env_id,
            f"{label}__{safe_name(env_id)}",
            runs=sorted(runs, key=lambda run: (run.seed is None, run.seed or 0)),
        )
        for (label, env_id), runs in sorted(groups.items())
    ]
    figures = draw(rows, [], out)
    numbers = [row_numbers(row) for row in rows]
    header_lines = [f"- runs: {len(run_dirs)} run folders under {' '.join(args.run_dirs)}"]
    report(
        "Runs",
        header_lines,
        ["## Results", "", *results_table(numbers), "", *HOW_MEASURED],
        figures,
        out,
    )
    print(f"wrote {out / 'results.md'} and {len(figures)} figures", flush=True)
    return 0


def main() -> int:
    commands = {
        "run": (Run, run),
        "plot": (Plot, plot),
        "tune": (Tune, tune),
        "tune-report": (TuneReport, tune_report),
    }
    command = tyro.extras.subcommand_cli_from_dict(
        {name: kind for name, (kind, _) in commands.items()}
    )
    return next(function for kind, function in commands.values() if isinstance(command, kind))(
        command
    )


if __name__ == "__main__":
    sys.exit(main())
