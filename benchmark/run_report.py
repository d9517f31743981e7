"""The ``run`` subcommand: it plans and runs a benchmark's jobs (`benchmark.jobs`), then reports
what they measured (a row per case and baseline, the verdicts against the reference, the speed
ratios) in results.md and results.json."""

from __future__ import annotations

import json
import shlex
import signal
import sys
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from benchmark.cases import (
    REFERENCE_MARGIN,
    SPEED_THRESHOLD,
    Case,
    CleanRLPublished,
    Learned,
    Published,
    ReferenceRuns,
    SameRun,
)
from benchmark.jobs import (
    FINISHED,
    MEASUREMENTS,
    CasePlan,
    Job,
    Run,
    Stores,
    case_seeds,
    cases_to_run,
    check,
    make_jobs,
    run_jobs,
    take_stored,
)
from benchmark.registry import REPO
from benchmark.report import (
    AGAINST_PUBLISHED,
    AGAINST_REFERENCE,
    HOW_MEASURED,
    AgainstReference,
    Row,
    RowNumbers,
    SpeedNumbers,
    against_published,
    against_published_table,
    against_reference_table,
    aggregates,
    draw,
    git_revision,
    machine,
    median_to_reach,
    report,
    results_table,
    row_numbers,
    share_of_range,
    speed_numbers,
    speed_table,
)
from common.errors import UsageError
from common.interrupt import Interrupted


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
            # none: --only-baselines left the script out
            if group is None or group in seen or not by_group[group]:
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
                    threshold=case_threshold(plan, jobs),
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


def case_threshold(plan: CasePlan, jobs: list[Job]) -> float | None:
    """What the case's row is judged against: its own threshold, or the one its reference gives."""
    case = plan.case
    if case.judged_on == "reference":
        return reference_bound(case, *task_and_reference(plan, jobs))
    if case.judged_on == "published" and isinstance(case.reference, CleanRLPublished):
        return case.reference.bound
    return case.threshold


def task_and_reference(plan: CasePlan, jobs: list[Job]) -> tuple[float | None, float | None]:
    """The random policy's mean return on the case's env, and the reference's mean evaluation (the
    published one, the return that counts as having learnt the task, or the mean over the
    reference's runs); None where not measured."""
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
    """What a case's mean evaluation must reach: the reference's, less REFERENCE_MARGIN of the
    task's range; a `Learned` reference's exactly; against a `SameRun` that did not learn the task,
    nothing (no verdict)."""
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
    """The SPS ratios measured in this run: a run taken from a store ran in another, so it has none
    (a case whose own runs were stored has no row; a reference or compared script whose runs were
    stored, no ratio)."""
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


@dataclass
class Planned:
    """A benchmark's plan: its cases and seeds, output folder, jobs and their plans, where finished
    runs are kept, and the jobs whose runs are not kept there yet (`to_run`)."""

    cases: list[Case]
    seeds: tuple[int, ...]
    out: Path
    jobs: list[Job]
    plans: list[CasePlan]
    stores: Stores
    to_run: list[Job]


def plan_benchmark(args: Run) -> Planned:
    """Every job of the benchmark, and which of them are still to run (UsageError: bad input; the
    flags' own checks end the process with status 2, `check`)."""
    cases, seeds = cases_to_run(args)
    check(args, cases, seeds)
    out = Path(
        args.out or REPO / "benchmark" / "results" / datetime.now().strftime("%Y-%m-%d_%H%M%S")
    ).resolve()
    jobs, plans = make_jobs(args, cases, seeds, out)
    # Without --reuse-runs, the output folder keeps its own finished runs: the same command again
    # runs what is missing and continues what a stop cut.
    stores = Stores(
        Path(args.reuse_baselines).resolve() if args.reuse_baselines else None,
        Path(args.reuse_runs).resolve() if args.reuse_runs else out / FINISHED,
    )
    return Planned(cases, seeds, out, jobs, plans, stores, take_stored(jobs, stores))


def run(args: Run) -> int:
    """Start every job (a script's run, a baseline's run, a raw-env measurement) as its own process
    (a case's ``nproc`` processes under torchrun), ``--workers`` processes at a time, each in a
    folder named by its job id; a crashed run is reported and the others go on. With ``--baselines``
    it also measures each script's env stack under random actions and its Stable-Baselines3
    counterpart, with settings derived from the script's own (`benchmark.registry`). Then write
    ``results.md``, ``results.json`` (every number results.md shows) and PNG figures to the output
    folder. With ``--launcher slurm``, the runs go to one SLURM job array instead
    (`benchmark.slurm`)."""
    try:
        planned = plan_benchmark(args)
        if args.launcher == "slurm":
            from benchmark import slurm

            return slurm.submit(args, planned)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    jobs, to_run, out, stores = planned.jobs, planned.to_run, planned.out, planned.stores
    notes = []
    if args.stored_only:  # the measurements, never stored and quick, still run: verdicts need them
        not_stored = [job for job in to_run if job.kind not in MEASUREMENTS]
        if all(job.stored is None for job in jobs if job.kind not in MEASUREMENTS):
            print(
                f"error: --stored-only: none of the benchmark's runs is stored in {stores.scripts}",
                file=sys.stderr,
            )
            return 2
        jobs = [job for job in jobs if job not in not_stored]
        to_run = [job for job in to_run if job.kind in MEASUREMENTS]
        if not_stored:
            notes.append(
                f"- --stored-only: {len(not_stored)} runs not yet stored are left out "
                f"({', '.join(job.id for job in not_stored)}); a case short of its seeds is judged on those it has"
            )
    (out / "logs").mkdir(parents=True, exist_ok=True)
    print(
        f"benchmark: {len(to_run)} jobs of {sum(job.nproc for job in to_run)} processes, {args.workers} processes at a "
        f"time; results in {out}",
        flush=True,
    )
    stopped: Interrupted | None = None
    try:
        run_jobs(to_run, args.workers, out / "logs", stores)
    except Interrupted as exc:  # the report of what finished, then the stop's exit status
        stopped = exc
        cut = [
            job for job in jobs if job.summary is None and job.returncode in (None, exc.exit_status)
        ]
        jobs = [job for job in jobs if job not in cut]
        print(
            f"benchmark: stopped; {len(cut)} runs to go: the same command goes on with them",
            flush=True,
        )
        notes.append(
            f"- stopped part-way by {signal.Signals(stopped.signum).name}: {len(cut)} runs cut or not started are "
            "left out (the same command goes on with them); a case short of its seeds is judged on those it has"
        )
    failed = write_report(args, planned, jobs, notes)
    if stopped is not None:
        raise stopped
    return 1 if failed else 0


def write_report(
    args: Run, planned: Planned, jobs: list[Job], notes: list[str], command: str | None = None
) -> bool:
    """Write results.md, results.json and the figures of `jobs` (those that ran or were taken from
    a store; a failed one has its `error`), with `notes` under the header (`command`: the one that
    made the benchmark, default this process's). Whether anything failed: a run, or a verdict."""
    cases, seeds, out, plans = planned.cases, planned.seeds, planned.out, planned.plans
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
    published = [
        against_published(numbers[plan.case.key], plan.case.reference)
        for plan in plans
        if isinstance(plan.case.reference, CleanRLPublished) and plan.case.key in numbers
    ]
    if published:
        tables += [
            "",
            "## Against the published results",
            "",
            *against_published_table(published),
            "",
            *AGAINST_PUBLISHED,
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
    header = [*run_header(args, cases, seeds, out, command), *notes]
    report("Benchmark", header, tables, figures, out)
    record = {
        "header": header,
        "args": asdict(args),
        "cases": [{**asdict(case), "key": case.key} for case in cases],
        "seeds": list(seeds),
        "rows": [asdict(value) for value in numbers.values()],
        "speed": [asdict(value) for value in speed],
        "against_reference": [asdict(value) for value in against],
        "against_published": [asdict(value) for value in published],
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
    return bool(failed)


def this_command() -> str:
    """The `python -m benchmark run` command this process runs, as typed."""
    if sys.argv[1:2] == ["run"]:
        return "python -m benchmark " + shlex.join(sys.argv[1:])
    return "(called from Python)"


def seeds_text(args: Run, cases: list[Case], seeds: tuple[int, ...]) -> str:
    """The seeds run, or each case's where cases set their own (the mujoco suite's)."""
    cases_by_seeds = Counter(case_seeds(args, case, seeds) for case in cases)
    if len(cases_by_seeds) == 1:
        return " ".join(map(str, next(iter(cases_by_seeds))))
    return "as each case sets them: " + "; ".join(
        f"{' '.join(map(str, case_run))} for {count} case{'s' if count > 1 else ''}"
        for case_run, count in cases_by_seeds.items()
    )


def run_header(
    args: Run, cases: list[Case], seeds: tuple[int, ...], out: Path, command: str | None = None
) -> list[str]:
    """Date, machine, command, cases and seeds: what is needed to reproduce the results."""
    command = command or this_command()
    return [
        f"- date: {datetime.now().astimezone().isoformat(timespec='seconds')}; git {git_revision(out)}",
        f"- machine: {machine()}",
        f"- command: `{command}`",
        "- cases: " + "; ".join(f"{case.name} (id {case.key})" for case in cases),
        f"- seeds {seeds_text(args, cases, seeds)}; "
        + (
            "each run an element of a SLURM job array"
            if args.launcher == "slurm"
            else f"{args.workers} process{'es' if args.workers > 1 else ''} at a time"
        ),
    ]
