"""Running a benchmark's jobs: a `run`'s cases planned into jobs (a script's run, a baseline's, a
raw-env or random-policy measurement), run as processes ``--workers`` at a time, and runs taken from
or kept in a store."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro

from benchmark.cases import (
    SUITES,
    Case,
    ReferenceRuns,
    SameRun,
    find_case,
    settings_hash,
    suite_cases,
)
from benchmark.events import LAST_EPISODES, RunSummary, find_run_dirs, safe_name, summarise_run
from benchmark.processes import PassedOn, passing_stop_signals_on, stderr_tail
from benchmark.registry import (
    REFERENCES,
    REPO,
    SCRIPTS,
    launcher,
    resolve_args,
    same_settings_flags,
)
from benchmark.report import fmt, git_revision, machine
from benchmark.slurm import SlurmFlags
from benchmark.stored import load_run, store_run, stored_path
from common.errors import UsageError
from common.seeding import available_cores

RAW_ENV_STEPS = 200_000
"""env steps of each raw-env measurement (fewer when a case is shorter)"""
DEFAULT_SCRIPTS, DEFAULT_ENVS, DEFAULT_SEEDS = ("ppo_fc",), ("CartPole-v1",), (1, 2, 3)
DEFAULT_EVAL_EPISODES = 10
RANDOM_POLICY_EPISODES = 100
"""episodes of each measurement of the random policy's return"""


@dataclass
class Run(SlurmFlags):
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
            "mujoco",
            "rss-growth",
            "distributed",
            "distributed-speed",
            "atari",
            "atari-transformer",
        ]
        | None
    ) = None
    """a named set of cases and seeds from benchmark/cases.py, instead of --scripts, --envs,
    --total-timesteps and --nproc"""
    nproc: int | None = None
    """processes under torchrun for every script run (default 1: plain python; a suite sets its cases' own)"""
    script_flags: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
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
    """the same for the scripts' runs (default <out>/finished): a comparison reuses its yardstick's runs"""
    only_baselines: bool = False
    """run the references, baselines and random-policy measurements only, not the scripts (to fill --reuse-baselines)"""
    stored_only: bool = False
    """train nothing: the table and figures of the runs already stored, each case judged on the seeds it has"""
    out: str | None = None
    """output folder (default benchmark/results/<date>_<time>): the same command with the same --out after a stop
    runs only what is missing and continues the runs it cut"""


MEASUREMENTS = ("raw-env", "random-policy")
"""the kinds of job that measure an env and print one JSON line: quick, and never stored"""


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
    """`cases` with the flags of each `SCRIPT=FLAGS` entry added to that script's cases (and to a
    case another is judged against in the same run); a malformed entry or a script no case runs is a
    UsageError."""
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


FINISHED = "finished"
"""the folder in a benchmark's --out that keeps its finished runs (benchmark/stored.py), unless
--reuse-runs names another"""
RESUMABLE = ("--resume", "auto", "--run-name")
TORCH_THREADS = "--torch-threads"
"""how a script's job starts: its run folder's name follows, a name of its own in the job's
--run-dir, so that the same job in the same --out goes on from the run's latest checkpoint"""


def case_seeds(args: Run, case: Case, seeds: tuple[int, ...]) -> tuple[int, ...]:
    """The seeds of a case's runs: the command line's --seeds, else the case's own, else `seeds`
    (the suite's or the default)."""
    return seeds if args.seeds is not None or case.seeds is None else case.seeds


def eval_episodes(args: Run) -> int:
    """The evaluation episodes of every run: the command line's, else the suite's, else 10."""
    if args.eval_episodes is not None:
        return args.eval_episodes
    return SUITES[args.suite].eval_episodes if args.suite is not None else DEFAULT_EVAL_EPISODES


def baseline_seeds(args: Run, seeds: tuple[int, ...]) -> tuple[int, ...]:
    """The seeds of the Stable-Baselines3 baselines: the suite's own where it has them and --seeds
    is not given."""
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
    """Every job of the benchmark, once each: a baseline that several cases share (the same
    settings, env and steps) runs once, and so does a raw-env measurement (the same script, env and
    flags)."""
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
        # baselines and measurements run in one process
        job.nproc = case.nproc if kind == "script" else 1
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
            # under as many processes: the ratio of SPS is of the scripts, not of their numbers of
            # processes
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
            for seed in case_seeds(args, case, seeds):
                command = [
                    *script_launcher,
                    str(REPO / f"{script_case.script}.py"),
                    *run_flags,
                    "--seed",
                    str(seed),
                ]
                # the same command continues the run where an earlier benchmark's stop cut it
                name = f"{env_name}__{script_case.script}__{seed}"
                command += ["--no-progress", *RESUMABLE, name, *script_case.flags]
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


def run_job(job: Job, logs: Path, threads: int | None = None, runs: PassedOn | None = None) -> Job:
    """Run the job's process, with `threads` as each of its processes' share of the cores
    (OMP_NUM_THREADS, which the scripts' default --torch-threads reads, where not set already), and
    reached by the harness's stop signals through `runs`; record how it ended (`read_back`)."""
    prepare(job, logs)
    start = time.perf_counter()
    environment = {"OMP_NUM_THREADS": str(threads)} if threads else {}
    environment = {**environment, **os.environ}
    process = (runs or PassedOn()).run(job.command, cwd=REPO, env=environment)
    (logs / f"{job.id}.stdout").write_text(process.stdout)
    (logs / f"{job.id}.stderr").write_text(process.stderr)
    return read_back(
        job, process.returncode, time.perf_counter() - start, process.stdout, process.stderr
    )


def prepare(job: Job, logs: Path) -> None:
    """Before the job's process starts: a baseline cut by a stop starts again, and the job records
    the commit it starts at (a background benchmark can outlive a commit)."""
    if job.kind == "sb3" and job.run_dir.exists():
        shutil.rmtree(job.run_dir)
    job.revision = git_revision(logs.parent)


def read_back(job: Job, returncode: int, wall_seconds: float, stdout: str, stderr: str) -> Job:
    """Record how the job's process ended (`returncode`, after `wall_seconds`), then what it
    printed (a measurement's JSON line in `stdout`) or the run it made (the rest)."""
    job.wall_seconds, job.returncode = wall_seconds, returncode
    if returncode != 0:
        job.error = f"exit status {returncode}: {stderr_tail(stderr)}"
    elif job.kind in MEASUREMENTS:
        try:
            job.output = json.loads(stdout.strip().splitlines()[-1])
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
    """A job's command less the interpreter, the run folder and the checkout's folder of a script,
    which differ between machines and benchmarks, less how the harness names and resumes its run
    (`RESUMABLE`: runs stored before it had them match), and less the threads a cluster's element
    gives it (its allocation: a run-time flag)."""
    parts = command[1:]
    for option, values in (
        ("--run-dir", 1), (RESUMABLE[0], 1), (RESUMABLE[2], 1), (TORCH_THREADS, 1)
    ):  # fmt: skip
        if option in parts:
            at = parts.index(option)
            parts = parts[:at] + parts[at + 1 + values :]
    return [Path(part).name if part.endswith(".py") else part for part in parts]


@dataclass(frozen=True)
class Stores:
    """Where finished runs are kept between benchmarks (benchmark/stored.py): the references'
    (--reuse-baselines) and the scripts' with their SB3 baselines' (--reuse-runs)."""

    references: Path | None = None
    scripts: Path | None = None

    def of(self, job: Job) -> Path | None:
        """The store of `job`'s run, if it is kept."""
        if job.label in REFERENCES:
            return self.references
        return self.scripts if job.kind in ("script", "sb3") else None


def take_stored(jobs: list[Job], stores: Stores) -> list[Job]:
    """The jobs still to run: a job whose run is in its store takes it from there (UsageError: a
    stored file that cannot be read, or that another command made)."""
    to_run = []
    for job in jobs:
        store = stores.of(job)
        kept = load_run(store, job.id) if store is not None else None
        if kept is None:
            to_run.append(job)
            continue
        # The job id names the settings, not every flag (the evaluation episodes): the whole command
        # must match.
        stored_command = shlex.split(kept[1].get("command", ""))
        if portable(stored_command) != portable(job.command):
            message = "was made by another command than this benchmark's (its made.command): delete it to run it again"
            raise UsageError(f"{stored_path(store, job.id)} {message}")
        # the window is the case's, not the store's: a stored run keeps every episode, not its case
        job.summary, job.stored = replace(kept[0], window=job.window), kept[1]
        print(
            f"[stored] {job.id} ({job.label}): made {job.stored['date']} at {job.stored['git']}",
            flush=True,
        )
    return to_run


def workers_taken(job: Job, workers: int) -> int:
    """The workers a job takes: one per process, so that `workers` bounds the processes at a time; a
    job of more processes than `workers` takes them all (it runs alone)."""
    return min(job.nproc, workers)


def run_jobs(jobs: list[Job], workers: int, logs: Path, stores: Stores = Stores()) -> None:
    """Run the jobs, `workers` processes at a time (every seed's first: a partial benchmark then
    covers every case), printing a line as each ends. Jobs start in that order, each once enough
    workers are free for its processes. A run that has a store in `stores` is stored there as it
    ends. A stop signal (Ctrl-C, SIGTERM, SIGUSR1, SIGHUP) reaches the running jobs, which stop
    after their iteration with a checkpoint; no other job starts, and the harness then ends with
    status 128 + the signal's number (`Interrupted`)."""
    waiting = sorted(jobs, key=lambda job: -1 if job.seed is None else job.seed)
    running: dict[Future[Job], int] = {}
    threads = max(1, available_cores() // workers)  # a process's share: no core runs two threads
    done, runs = 0, PassedOn()
    with passing_stop_signals_on(runs), ThreadPoolExecutor(max_workers=workers) as pool:
        while (waiting and runs.signum is None) or running:
            # In order, none skipping ahead: single processes started past a torchrun job could keep
            # it waiting.
            while (
                waiting
                and runs.signum is None
                and sum(running.values()) + workers_taken(waiting[0], workers) <= workers
            ):
                job = waiting.pop(0)
                future = pool.submit(run_job, job, logs, threads, runs)
                running[future] = workers_taken(job, workers)
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
