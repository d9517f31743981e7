"""The benchmark harness: ``python -m benchmark run ...`` trains, ``python -m benchmark plot RUN_DIR ...`` draws.

``run`` starts every (script, env, seed) as its own process, ``--workers`` at a time, each in its own run folder, and
prints a line per finished run; a crashed run is reported and the others go on. With ``--baselines`` it also measures
the raw env and the scripts' Stable-Baselines3 counterparts in the same run. It then writes ``results.md``,
``results.json`` and PNG figures to the output folder. ``plot`` makes the same table and figures from any run folders.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import tyro

from benchmark.baselines import Sb3Args
from benchmark.cases import SB3_ALGOS, SUITES, Case, find_case
from benchmark.events import RunSummary, find_run_dirs, safe_name, summarise_run
from benchmark.report import fmt, group_runs, markdown_table, mean_std, plot_learning_curves, plot_sps

REPO = Path(__file__).resolve().parent.parent
STDERR_TAIL_LINES = 12


@dataclass
class Run:
    """Train scripts on envs with several seeds, then write the table and the figures."""

    scripts: tuple[str, ...] = ("ppo_fc",)
    """the scripts to run (file stems in the repository root)"""
    envs: tuple[str, ...] = ("CartPole-v1",)
    """the env ids to run each script on"""
    seeds: tuple[int, ...] = (1, 2, 3)
    """one run per seed"""
    total_timesteps: int | None = None
    """env steps of every run (default: each case's own, see benchmark/cases.py)"""
    suite: Literal["quick", "full"] | None = None
    """a named set of cases and seeds from benchmark/cases.py, instead of --scripts, --envs and --seeds"""
    workers: int = 1
    """processes at a time (more than one distorts SPS: the runs share the CPU)"""
    baselines: bool = False
    """also measure the raw env under random actions and each script's Stable-Baselines3 counterpart"""
    eval_episodes: int = 10
    """deterministic evaluation episodes at the end of every run"""
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

    kind: Literal["script", "sb3", "raw-env"]
    case: Case
    seed: int
    command: list[str]
    run_dir: Path
    """the folder given to the process as its --run-dir (its run folder is made inside)"""
    returncode: int | None = None
    wall_seconds: float = 0.0
    error: str | None = None
    output: dict[str, Any] = field(default_factory=dict)
    """the JSON a baseline printed"""
    summary: RunSummary | None = None
    """the run the job made, read back from its events"""

    @property
    def label(self) -> str:
        name = self.case.script if self.kind == "script" else f"{self.kind} ({self.case.script})"
        return f"{name} {self.case.env_id}" + ("" if self.kind == "raw-env" else f" seed {self.seed}")

    @property
    def script(self) -> str:
        """The row this job's runs appear under."""
        return self.case.script if self.kind == "script" else f"sb3_{SB3_ALGOS[self.case.script]}"


def cases_to_run(args: Run) -> tuple[list[Case], tuple[int, ...]]:
    if args.suite is not None:
        entries, seeds = SUITES[args.suite]
        return [find_case(script, env_id, steps) for script, env_id, steps in entries], seeds
    return [
        find_case(script, env_id, args.total_timesteps) for script in args.scripts for env_id in args.envs
    ], args.seeds


def check(args: Run, cases: list[Case], seeds: tuple[int, ...]) -> None:
    """Bad input: one `error:` line and exit status 2, before anything runs."""
    problems = []
    if args.total_timesteps is not None and args.total_timesteps <= 0:
        problems.append("--total-timesteps must be positive")
    if not seeds or len(set(seeds)) != len(seeds):
        problems.append("--seeds needs one or more distinct seeds")
    if args.workers < 1 or args.eval_episodes < 0:
        problems.append("--workers must be at least 1 and --eval-episodes at least 0")
    for script in sorted({case.script for case in cases}):
        if not (REPO / f"{script}.py").is_file():
            problems.append(f"no script {script}.py in {REPO}")
        if args.baselines and script not in SB3_ALGOS:
            problems.append(f"{script} has no Stable-Baselines3 counterpart in benchmark/cases.py (drop --baselines)")
    if problems:
        print("error: " + "; ".join(problems), file=sys.stderr)
        sys.exit(2)


def sb3_flags(case: Case) -> list[str]:
    """The case's flags that the SB3 baseline also has (the same names), so it runs with the same settings."""
    known = {item.name for item in fields(Sb3Args)}
    kept, keep = [], False
    for token in case.flags:
        if token.startswith("--"):
            keep = token[2:].split("=")[0].replace("-", "_").removeprefix("no_") in known
        if keep:
            kept.append(token)
    return kept


def make_jobs(args: Run, cases: list[Case], seeds: tuple[int, ...], out: Path) -> list[Job]:
    jobs = []
    for case in cases:
        env_name = safe_name(case.env_id)
        if args.baselines:
            command = [sys.executable, "-m", "benchmark.baselines", "raw-env", "--env-id", case.env_id]
            command += ["--num-envs", str(case.num_envs), "--steps", str(min(case.total_timesteps, 200_000))]
            jobs.append(Job("raw-env", case, 0, command, out / "runs" / f"raw-env__{env_name}"))
        for seed in seeds:
            common = ["--env-id", case.env_id, "--total-timesteps", str(case.total_timesteps), "--seed", str(seed)]
            common += ["--eval-episodes", str(args.eval_episodes)]
            run_dir = out / "runs" / f"{case.script}__{env_name}__{seed}"
            command = [sys.executable, str(REPO / f"{case.script}.py"), *common, "--run-dir", str(run_dir)]
            jobs.append(Job("script", case, seed, [*command, "--no-progress", *case.flags], run_dir))
            if args.baselines:
                algo = SB3_ALGOS[case.script]
                run_dir = out / "runs" / f"sb3_{algo}__{env_name}__{seed}"
                command = [sys.executable, "-m", "benchmark.baselines", "sb3", "--algo", algo, *common]
                jobs.append(Job("sb3", case, seed, [*command, "--run-dir", str(run_dir), *sb3_flags(case)], run_dir))
    return jobs


def run_job(job: Job, logs: Path) -> Job:
    """Run the job's process; record how it ended, then what it printed (a baseline) or the run it made (the rest)."""
    start = time.perf_counter()
    process = subprocess.run(job.command, cwd=REPO, capture_output=True, text=True)
    job.wall_seconds, job.returncode = time.perf_counter() - start, process.returncode
    (logs / f"{job.run_dir.name}.stdout").write_text(process.stdout)
    (logs / f"{job.run_dir.name}.stderr").write_text(process.stderr)
    if process.returncode != 0:
        stderr_tail = "\n".join(process.stderr.strip().splitlines()[-STDERR_TAIL_LINES:]) or "(no stderr)"
        job.error = f"exit status {process.returncode}: {stderr_tail}"
    elif job.kind == "raw-env":
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
            job.summary = summarise_run(made[0], script=job.script, env_id=job.case.env_id)
        except Exception as exc:  # a corrupt events file is reported like a crash
            job.error = f"reading the events of {made[0]} failed: {exc!r}"
    return job


def run_jobs(jobs: list[Job], workers: int, logs: Path) -> None:
    """Run the jobs, `workers` at a time, printing a line as each ends."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run_job, job, logs) for job in jobs]
        for done, future in enumerate(as_completed(futures), start=1):
            job = future.result()
            if job.error is not None:
                status = f"FAILED: {job.error.splitlines()[-1]}"
            elif job.summary is not None:
                run = job.summary
                status = f"last-100 return {fmt(run.last_return)}, eval {fmt(run.eval_return)}, SPS {fmt(run.sps, 0)}"
            else:
                status = f"SPS {fmt(job.output.get('sps'), 0)}"
            print(f"[{done}/{len(jobs)}] {job.label}: {job.wall_seconds:.0f} s, {status}", flush=True)


def verdict(case: Case, runs: list[RunSummary], failed: list[Job]) -> str:
    """PASS when every seed ran and reached the case's threshold; '-' when the case has no threshold."""
    if failed:
        return "FAIL"
    if case.threshold is None:
        return "-"
    ok = runs and all(run.last_return is not None and run.last_return >= case.threshold for run in runs)
    return "PASS" if ok else "FAIL"


def results_table(rows: list[tuple[str, str, Case | None, list[RunSummary], list[Job]]]) -> list[str]:
    """The results table: one row per (script, env)."""
    table_rows = []
    for script, env_id, case, runs, failed in rows:
        threshold = case.threshold if case is not None else None
        reached = [run.steps_to_reach(threshold) for run in runs] if threshold is not None else []
        reached_known = [steps for steps in reached if steps is not None]
        if threshold is None:
            to_threshold = "-"
        elif reached_known:
            to_threshold = f"{np.mean(reached_known):,.0f} ({len(reached_known)} of {len(reached)} seeds)"
        else:
            to_threshold = "not reached"
        table_rows.append(
            [
                script,
                env_id,
                " ".join([*(str(run.seed) for run in runs), *(f"{job.seed} (failed)" for job in failed)]),
                fmt(float(np.mean([run.steps for run in runs])) if runs else None, 0),
                mean_std([run.last_return for run in runs]),
                mean_std([run.eval_return for run in runs]),
                to_threshold if threshold is None else f"{to_threshold} (≥ {threshold:g})",
                mean_std([run.sps for run in runs], 0),
                fmt(max((run.peak_rss_mb for run in runs if run.peak_rss_mb is not None), default=None), 0),
                verdict(case, runs, failed) if case is not None else "-",
            ]
        )
    header = [
        "script",
        "env",
        "seeds",
        "steps",
        "last-100 training return",
        "eval return (deterministic)",
        "steps to threshold",
        "SPS",
        "peak RSS (MB)",
        "result",
    ]
    return markdown_table(header, table_rows)


def speed_table(groups: dict[tuple[str, str], list[RunSummary]], raw: dict[str, float], ours: list[str]) -> list[str]:
    """Each of our scripts' SPS as a ratio to the raw env and to the SB3 rows on the same env."""

    def mean_sps(runs: list[RunSummary]) -> float:
        return float(np.mean([run.sps for run in runs if run.sps is not None] or [np.nan]))

    rows = []
    for (script, env_id), runs in sorted(groups.items()):
        if script not in ours:
            continue
        sps = mean_sps(runs)
        sb3_sps = mean_sps(groups.get((f"sb3_{SB3_ALGOS.get(script, '?')}", env_id), []))
        raw_sps = raw.get(env_id, np.nan)
        rows.append(
            [
                script,
                env_id,
                fmt(sps, 0),
                fmt(raw_sps, 0),
                fmt(sps / raw_sps, 2),
                fmt(sb3_sps, 0),
                fmt(sps / sb3_sps, 2),
            ]
        )
    header = ["script", "env", "SPS", "raw env SPS", "script / raw env", "SB3 SPS", "script / SB3"]
    return markdown_table(header, rows)


def draw(groups: dict[tuple[str, str], list[RunSummary]], raw: dict[str, float], out: Path) -> list[Path]:
    bars = [
        (f"{script}\n{env_id}", [run.sps for run in runs if run.sps is not None])
        for (script, env_id), runs in sorted(groups.items())
    ]
    bars += [(f"raw env\n{env_id}", [sps]) for env_id, sps in sorted(raw.items())]
    return [*plot_learning_curves(groups, out), plot_sps(bars, out / "sps.png")]


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
    return f"{cpu}, {os.cpu_count()} CPUs; Python {platform.python_version()}; {', '.join(versions)}"


def git_revision() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return "unknown"
    return (head.stdout.strip() or "unknown") + (" (uncommitted changes)" if dirty.stdout.strip() else "")


def report(title: str, header_lines: list[str], tables: list[str], figures: list[Path], out: Path) -> None:
    lines = [f"# {title}", "", *header_lines, "", *tables, "", "## Figures", ""]
    lines += [f"![{figure.stem}]({figure.name})" for figure in figures]
    (out / "results.md").write_text("\n".join(lines).rstrip() + "\n")


def run(args: Run) -> int:
    cases, seeds = cases_to_run(args)
    check(args, cases, seeds)
    out = Path(args.out or REPO / "benchmark" / "results" / datetime.now().strftime("%Y-%m-%d_%H%M%S")).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    jobs = make_jobs(args, cases, seeds, out)
    print(f"benchmark: {len(jobs)} processes, {args.workers} at a time; results in {out}", flush=True)
    run_jobs(jobs, args.workers, out / "logs")

    rows = []
    for case in cases:
        for kind in ("script", "sb3"):
            case_jobs = [job for job in jobs if job.case == case and job.kind == kind]
            if case_jobs:
                runs = [job.summary for job in case_jobs if job.summary is not None]
                failed = [job for job in case_jobs if job.summary is None]
                rows.append((case_jobs[0].script, case.env_id, case if kind == "script" else None, runs, failed))
    groups = group_runs(job.summary for job in jobs if job.summary is not None)
    raw = {job.case.env_id: job.output["sps"] for job in jobs if "sps" in job.output}
    figures = draw(groups, raw, out)
    tables = ["## Results", "", *results_table(rows)]
    if args.baselines:
        ours = sorted({case.script for case in cases})
        tables += ["", "## Speed against the baselines (same run)", "", *speed_table(groups, raw, ours)]
    tables += ["", *HOW_MEASURED]
    failures = [job for job in jobs if job.error is not None]
    if failures:
        tables += ["", "## Failures", ""]
        for job in failures:
            tables += [f"### {job.label}", "", "```", shlex.join(job.command), job.error, "```", ""]
    report("Benchmark", run_header(args, cases, seeds), tables, figures, out)
    write_json(out / "results.json", args, cases, seeds, jobs)
    failed_cases = [row for row in rows if row[2] is not None and verdict(row[2], row[3], row[4]) == "FAIL"]
    print(f"{'FAIL' if failed_cases or failures else 'PASS'}: wrote {out / 'results.md'}", flush=True)
    return 1 if failed_cases or failures else 0


def run_header(args: Run, cases: list[Case], seeds: tuple[int, ...]) -> list[str]:
    """Date, machine, command, cases and seeds: what is needed to reproduce the results."""
    command = "python -m benchmark " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["run"] else "(called from Python)"
    described = [
        f"{case.name} {case.total_timesteps:,} steps" + (f" {shlex.join(case.flags)}" if case.flags else "")
        for case in cases
    ]
    return [
        f"- date: {datetime.now().astimezone().isoformat(timespec='seconds')}; git {git_revision()}",
        f"- machine: {machine()}",
        f"- command: `{command}`",
        "- cases: " + "; ".join(described),
        f"- seeds {' '.join(map(str, seeds))}; {args.workers} process{'es' if args.workers > 1 else ''} at a time",
    ]


def write_json(path: Path, args: Run, cases: list[Case], seeds: tuple[int, ...], jobs: list[Job]) -> None:
    """The same results as results.md, for scripts: every job and every run's numbers."""
    record = {
        "args": asdict(args),
        "cases": [asdict(case) for case in cases],
        "seeds": list(seeds),
        "jobs": [
            {
                "label": job.label,
                "command": job.command,
                "returncode": job.returncode,
                "wall_seconds": job.wall_seconds,
                "error": job.error,
                "output": job.output,
            }
            for job in jobs
        ],
        "runs": [
            {
                "script": run.script,
                "env_id": run.env_id,
                "seed": run.seed,
                "run_dir": run.run_dir,
                "steps": run.steps,
                "last100_return": run.last_return,
                "eval_return": run.eval_return,
                "sps": run.sps,
                "peak_rss_mb": run.peak_rss_mb,
            }
            for run in (job.summary for job in jobs)
            if run is not None
        ],
    }
    path.write_text(json.dumps(record, indent=2) + "\n")


HOW_MEASURED = [
    "How the numbers are measured:",
    "- Everything is read from the runs' TensorBoard events with TensorBoard's `EventAccumulator`, keeping every "
    "record. The last-100 training return is the mean of the last 100 `charts/episodic_return` records (every episode "
    "of every env); the eval return is the mean of `eval/episodic_return` (deterministic policy after training); "
    "± is the population std across seeds.",
    "- Steps to threshold: the first step at which the mean of the last 100 episodes reaches the case's threshold "
    "(averaged over the seeds that reach it).",
    "- SPS: (last step - first step) / (wall time between the first and the last `charts/SPS` record), so start-up, "
    "the first iteration and the final evaluation are left out. Peak RSS: the largest `system/rss_mb` record.",
    "- Raw env: the scripts' vector env stack under random actions, no agent: an upper bound on any agent's SPS.",
]


def plot(args: Plot) -> int:
    run_dirs = find_run_dirs(args.run_dirs)
    if not run_dirs:
        print(f"error: no TensorBoard event files under {' '.join(args.run_dirs)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summaries = [summarise_run(run_dir) for run_dir in run_dirs]
    groups = group_runs(summaries)
    rows = [(script, env_id, None, runs, []) for (script, env_id), runs in sorted(groups.items())]
    figures = draw(groups, {}, out)
    header_lines = [f"- runs: {len(summaries)} run folders under {' '.join(args.run_dirs)}"]
    report("Runs", header_lines, ["## Results", "", *results_table(rows), "", *HOW_MEASURED], figures, out)
    print(f"wrote {out / 'results.md'} and {len(figures)} figures", flush=True)
    return 0


def main() -> int:
    command = tyro.extras.subcommand_cli_from_dict({"run": Run, "plot": Plot})
    return run(command) if isinstance(command, Run) else plot(command)


if __name__ == "__main__":
    sys.exit(main())
