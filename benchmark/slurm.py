"""Benchmarks and sweeps on a SLURM cluster (docs/cluster.md).

``python -m benchmark run ... --launcher slurm`` submits the runs not yet finished as one job array
(`submit`); ``python -m benchmark tune ... --launcher slurm`` submits its workers as one
(`submit_sweep`). Each element is ``python -m benchmark.slurm SUBMISSION`` (`element`): it runs its
command with the CPUs it was given, passes SLURM's signals on, and when SLURM warns of the time limit
(``--signal=B:USR1@S``) the run checkpoints and the element requeues itself; the next start resumes
(`--resume auto`). Every event of an element goes to its story (slurm/elements/JOB.jsonl) and its
log. ``python -m benchmark report OUT`` gathers what finished into the tables of a local run
(`report`), and names each failed element with its log's last lines."""

from __future__ import annotations

import getpass
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import tyro

from benchmark.registry import REPO
from common.errors import UsageError
from common.interrupt import STOP_SIGNALS

if TYPE_CHECKING:
    from benchmark.jobs import Job, Run
    from benchmark.run_report import Planned

TEMPLATE = Path(__file__).with_name("slurm_template.sh")
PLACEHOLDER = "{{command}}"
FOLDER = "slurm"
"""the folder of an output folder that holds its submissions, the elements' logs and stories"""
TIME_LIMIT_SIGNAL = signal.SIGUSR1
STOPPED_WITH_A_CHECKPOINT = {128 + signum for signum in STOP_SIGNALS}
"""a run's exit statuses after a stop signal: 128 + its number, once its stop checkpoint is written"""
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "REVOKED"}  # fmt: skip
"""squeue's states of an element that will not run again (it lists them for MinJobAge)"""
POLL_SECONDS = 5.0
"""how often --wait reads the queue"""
LOG_LINES = 12


@dataclass(kw_only=True)
class SlurmFlags:
    """The flags of `run` and `tune` that send their runs to a SLURM job array."""

    launcher: Literal["local", "slurm"] = "local"
    """where the runs go: processes on this machine, or one SLURM job array (docs/cluster.md)"""
    slurm_template: str | None = None
    """the array's batch script: your cluster's lines and {{command}} (default benchmark/slurm_template.sh)"""
    slurm_partition: str | None = None
    """the partition of every element (default: the template's, else the cluster's default)"""
    slurm_time: str | None = None
    """each element's time limit, as sbatch writes it (4:00:00, 2-00:00:00): a longer run requeues and resumes"""
    slurm_cpus_per_task: int | None = None
    """CPUs per element, which its run's threads use (default: the template's, else the cluster's, 1)"""
    slurm_gpus_per_task: int | None = None
    """GPUs per element (default: the template's, else none)"""
    slurm_max_running: int | None = None
    """elements of the array running at once (sbatch's --array=...%N; default: as many as the cluster gives)"""
    slurm_max_requeues: int = 20
    """an element requeued more often than this ends as failed: a run that keeps failing is not requeued forever"""
    slurm_signal_seconds: int = 300
    """seconds before the time limit at which SLURM tells an element to checkpoint and requeue itself"""
    wait: bool = False
    """with --launcher slurm: wait for the array, then report (else `python -m benchmark report OUT`, or
    tune-report)"""


@dataclass
class Report:
    """Gather a benchmark submitted with --launcher slurm: the table and figures of what finished,
    what is still queued or running, and each failed element with its log."""

    out: Annotated[str, tyro.conf.Positional]
    """the benchmark's --out"""
    wait: bool = False
    """wait until no element of it is queued or running"""


def minutes(limit: str) -> float:
    """sbatch's time format (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S) in minutes (ValueError: another)."""
    days, _, clock = limit.rpartition("-")
    parts = [int(part) for part in clock.split(":")]
    if not 1 <= len(parts) <= 3 or any(part < 0 for part in parts):
        raise ValueError(limit)
    if days:
        hours, mins, secs = ([*parts, 0, 0])[:3]
        return int(days) * 1440 + hours * 60 + mins + secs / 60
    if len(parts) == 3:
        return parts[0] * 60 + parts[1] + parts[2] / 60
    return parts[0] + (parts[1] / 60 if len(parts) == 2 else 0)


def client(*command: str, check: bool = True) -> subprocess.CompletedProcess:
    """A SLURM client's answer (UsageError: it is not on the PATH; with `check`, it refused)."""
    if shutil.which(command[0]) is None:
        raise UsageError(
            f"no {command[0]} on the PATH: --launcher slurm runs where SLURM's commands do (a cluster's login "
            "node; load its module first)"
        )
    answer = subprocess.run(command, capture_output=True, text=True)
    if check and answer.returncode != 0:
        said = (answer.stderr or answer.stdout).strip().splitlines()
        raise UsageError(f"{command[0]} refused: {said[-1] if said else answer.returncode}")
    return answer


def check_cluster(flags: SlurmFlags) -> str:
    """The template's text, once the flags, the template and the cluster are fit to submit
    (UsageError otherwise): nothing is written before."""
    problems = []
    positive = {"--slurm-cpus-per-task": flags.slurm_cpus_per_task, "--slurm-max-running": flags.slurm_max_running,
                "--slurm-signal-seconds": flags.slurm_signal_seconds}  # fmt: skip
    problems += [
        f"{flag} must be positive"
        for flag, value in positive.items()
        if value is not None and value < 1
    ]
    if (flags.slurm_gpus_per_task or 0) < 0 or flags.slurm_max_requeues < 0:
        problems.append("--slurm-gpus-per-task and --slurm-max-requeues must be at least 0")
    if flags.slurm_time is not None:
        try:
            limit = minutes(flags.slurm_time) * 60
        except ValueError:
            limit = None
            problems.append(
                f"--slurm-time {flags.slurm_time!r}: write it as sbatch does, e.g. 4:00:00 or 1-12:00:00"
            )
        if limit is not None and limit <= flags.slurm_signal_seconds + 60:
            problems.append(
                f"--slurm-time {flags.slurm_time} leaves no time to train before the signal "
                f"--slurm-signal-seconds {flags.slurm_signal_seconds} gives (and a minute of SLURM's leeway)"
            )
    path = Path(flags.slurm_template) if flags.slurm_template else TEMPLATE
    try:
        template = path.read_text()
    except OSError as exc:
        problems.append(f"--slurm-template {path}: {exc.strerror}")
        template = ""
    if template and placeholders(template) != 1:
        problems.append(
            f"{path} needs {PLACEHOLDER} once, on a line that is not a comment: the one that runs each "
            f"element (as in {TEMPLATE})"
        )
    if problems:
        raise UsageError("; ".join(problems))
    client("sbatch", "--version")
    if flags.slurm_partition is not None:
        answer = client("scontrol", "show", "partition", flags.slurm_partition, check=False)
        if answer.returncode != 0:
            names = client("sinfo", "-h", "-o", "%P", check=False).stdout.split()
            raise UsageError(
                f"--slurm-partition {flags.slurm_partition}: the cluster has no such partition "
                f"(it has {', '.join(name.rstrip('*') for name in names) or 'none that sinfo lists'})"
            )
    if "exec " + PLACEHOLDER not in template:
        print(
            f"notice: {path} runs {PLACEHOLDER} without exec: SLURM's warning before the time limit reaches the "
            "batch shell, not the element, so a run that reaches its limit is not requeued",
            file=sys.stderr,
        )
    return template


def placeholders(template: str) -> int:
    """How often the batch script's lines (not its comments) hold the placeholder."""
    return sum(
        line.count(PLACEHOLDER)
        for line in template.splitlines()
        if not line.lstrip().startswith("#")
    )


def submit_array(
    flags: SlurmFlags, template: str, folder: Path, name: str, elements: list[dict[str, Any]]
) -> tuple[str, Path]:
    """Submit `elements` (each what `element` runs) as one job array whose files go to `folder`
    (FOLDER of an output folder): its submission file, batch script and logs. Returns the array's
    job id and the submission file (UsageError: sbatch refused; nothing is left then)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "logs").mkdir(exist_ok=True)
    submission = folder / f"{name}.json"
    record = {"format": 1, "submitted_at": time.time(), "array_job": None,
              "max_requeues": flags.slurm_max_requeues, "elements": elements}  # fmt: skip
    write_json(submission, record)
    command = shlex.join([sys.executable, "-m", "benchmark.slurm", str(submission)])
    script = folder / f"{name}.sbatch"
    lines = [line if line.lstrip().startswith("#") else line.replace(PLACEHOLDER, command)
             for line in template.splitlines()]  # fmt: skip
    script.write_text("\n".join(lines) + "\n")
    array = f"0-{len(elements) - 1}" + (
        f"%{flags.slurm_max_running}" if flags.slurm_max_running else ""
    )
    sbatch = ["sbatch", "--parsable", f"--array={array}", "--requeue", "--open-mode=append"]
    sbatch += [
        f"--signal=B:{TIME_LIMIT_SIGNAL.name.removeprefix('SIG')}@{flags.slurm_signal_seconds}"
    ]
    sbatch += [f"--output={folder / 'logs' / '%A_%a.log'}", f"--chdir={REPO}"]
    for option, value in (("--partition", flags.slurm_partition), ("--time", flags.slurm_time),
                          ("--cpus-per-task", flags.slurm_cpus_per_task),
                          ("--gpus-per-task", flags.slurm_gpus_per_task)):  # fmt: skip
        if value is not None:
            sbatch.append(f"{option}={value}")
    try:
        answer = client(*sbatch, str(script))
    except UsageError:
        submission.unlink()
        script.unlink()
        raise
    array_job = answer.stdout.strip().split(";")[0]
    record["array_job"] = array_job
    write_json(submission, record)
    return array_job, submission


def write_json(path: Path, record: dict[str, Any]) -> None:
    """Write `record` to `path` atomically (a temporary file, then a rename)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(temporary, path)


def submissions(folder: Path) -> list[dict[str, Any]]:
    """The arrays submitted from `folder` (FOLDER of an output folder), oldest first, each with its
    file (`path`)."""
    found = []
    for path in sorted(folder.glob("*.json"), key=lambda path: path.stat().st_mtime):
        record = json.loads(path.read_text())
        if isinstance(record, dict) and "elements" in record and record.get("array_job"):
            found.append({**record, "path": str(path)})
    return found


def queue(arrays: list[str]) -> dict[tuple[str, int], tuple[str, str]]:
    """The elements of `arrays` that squeue lists: (array job, index) -> (state, reason)."""
    if not arrays:
        return {}
    # -t all: an ended element too, while squeue keeps it (MinJobAge)
    answer = client("squeue", "-h", "-r", "-t", "all", "-u", getpass.getuser(), "-o", "%F|%K|%T|%r")
    listed = {}
    for line in answer.stdout.splitlines():
        array_job, index, state, reason = ([*line.split("|"), "", "", "", ""])[:4]
        if array_job in arrays and index.isdigit():
            listed[(array_job, int(index))] = (state, reason)
    return listed


def accounting(arrays: list[str]) -> dict[tuple[str, int], str]:
    """How sacct says each element of `arrays` ended ("FAILED 1:0"); empty where the cluster keeps
    no accounting."""
    if not arrays or shutil.which("sacct") is None:
        return {}
    answer = client(
        "sacct", "-n", "-P", "-X", "-j", ",".join(arrays), "-o", "JobID,State,ExitCode", check=False
    )
    ended = {}
    for line in answer.stdout.splitlines() if answer.returncode == 0 else []:
        job_id, state, exit_code = ([*line.split("|"), "", "", ""])[:3]
        array_job, _, index = job_id.partition("_")
        if index.isdigit():
            ended[(array_job, int(index))] = f"{state} {exit_code}".strip()
    return ended


@dataclass
class Element:
    """Where one submitted element stands."""

    array_job: str
    index: int
    state: str | None
    """squeue's, while it lists it"""
    log: Path

    @property
    def name(self) -> str:
        return f"{self.array_job}_{self.index}"

    @property
    def active(self) -> bool:
        """queued, running, or requeued: it will run (again)"""
        return self.state is not None and self.state not in ENDED


def elements_by_name(folder: Path, key: str) -> dict[str, list[Element]]:
    """Every submitted element of `folder`, by its elements' `key` (a benchmark's job id, a sweep's
    worker), oldest first, with squeue's state."""
    found = submissions(folder)
    listed = queue([record["array_job"] for record in found])
    by_name: dict[str, list[Element]] = {}
    for record in found:
        array_job = record["array_job"]
        for index, entry in enumerate(record["elements"]):
            # another kind of array in the same folder (a sweep's, a benchmark's)
            if key not in entry:
                continue
            state = listed.get((array_job, index), (None, ""))[0]
            log = folder / "logs" / f"{array_job}_{index}.log"
            by_name.setdefault(entry[key], []).append(Element(array_job, index, state, log))
    return by_name


def runs(count: int) -> str:
    return f"{count} run{'' if count == 1 else 's'}"


def log_tail(path: Path, lines: int = LOG_LINES) -> str:
    """The last `lines` lines of a log (or why there are none)."""
    try:
        return "\n".join(path.read_text(errors="replace").rstrip().splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


# ---- the benchmark's array ----


JOB_FIELDS = ("kind", "id", "group", "label", "env_id", "seed", "command", "window", "nproc")
"""what an element needs of its `Job` beside its run folder (the rest is how it ended)"""


def job_record(job: Job, store: Path | None) -> dict[str, Any]:
    record = {name: getattr(job, name) for name in JOB_FIELDS}
    return {**record, "run_dir": str(job.run_dir), "store": str(store) if store else None}


def job_from(record: dict[str, Any]) -> Job:
    from benchmark.jobs import Job

    return Job(**{name: record[name] for name in JOB_FIELDS}, run_dir=Path(record["run_dir"]))


def submit(args: Run, planned: Planned) -> int:
    """Submit the benchmark's runs that are neither finished (stored) nor queued nor running as one
    job array, and return at once (with --wait: then wait and `gather`). The measurements of the env
    (quick, never stored) run where the report is made."""
    from benchmark.jobs import MEASUREMENTS
    from benchmark.run_report import this_command

    if args.stored_only:
        raise UsageError(
            "--stored-only trains nothing: drop --launcher slurm (or use python -m benchmark report)"
        )
    template = check_cluster(args)
    folder = planned.out / FOLDER
    waiting = [job for job in planned.to_run if job.kind not in MEASUREMENTS]
    submitted = elements_by_name(folder, "id")
    active = {
        job.id for job in waiting if any(element.active for element in submitted.get(job.id, []))
    }
    missing = [job for job in waiting if job.id not in active]
    stored = sum(job.stored is not None for job in planned.jobs)
    print(f"slurm: {runs(stored)} finished, {len(active)} queued or running, {len(missing)} to submit; results in "
          f"{planned.out}", flush=True)  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "run.json", {"args": asdict(args), "command": this_command()})
    if missing:
        name = datetime.now().strftime("submission-%Y%m%d-%H%M%S-%f")
        elements = [job_record(job, planned.stores.of(job)) for job in missing]
        array_job, _ = submit_array(args, template, folder, name, elements)
        print(
            f"slurm: submitted job array {array_job} of {len(missing)} elements; each element's log:",
            flush=True,
        )
        for index, job in enumerate(missing):
            print(
                f"  {array_job}_{index} {job.id}: {folder / 'logs' / f'{array_job}_{index}.log'}",
                flush=True,
            )
    if not args.wait:
        print(f"slurm: python -m benchmark report {shlex.quote(str(planned.out))} writes the table of what "
              "finished (--wait: once the array has ended)", flush=True)  # fmt: skip
        return 0
    return gather(planned.out, wait=True)


def report(args: Report) -> int:
    """`python -m benchmark report OUT`."""
    try:
        return gather(Path(args.out).resolve(), args.wait)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def saved_run(out: Path) -> tuple[Run, str]:
    """The `run` arguments and command of the last submission to `out` (UsageError: none)."""
    from benchmark.jobs import Run

    path = out / FOLDER / "run.json"
    if not path.is_file():
        raise UsageError(f"{out} holds no benchmark submitted with --launcher slurm (no {path})")
    saved = json.loads(path.read_text())
    values = {
        field.name: saved["args"][field.name]
        for field in fields(Run)
        if field.name in saved["args"]
    }
    values = {
        name: tuple(value) if isinstance(value, list) else value for name, value in values.items()
    }
    return Run(**{**values, "out": str(out)}), saved["command"]


def wait_for(is_active: Any, what: str) -> bool:
    """Wait until `is_active()` is false; False if a stop signal ended the wait first."""
    print(f"slurm: waiting for {what} (Ctrl-C stops waiting, not the array)", flush=True)
    try:
        while is_active():
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        print(f"\nslurm: stopped waiting; {what} goes on", file=sys.stderr, flush=True)
        return False
    return True


def gather(out: Path, wait: bool = False) -> int:
    """Write the table and figures of what finished of the benchmark submitted to `out`, as a local
    run does, leaving out what is still queued or running (named in the header); a failed element
    is reported with its story and its log's last lines, and how to submit it again."""
    from benchmark.jobs import MEASUREMENTS, run_jobs
    from benchmark.run_report import plan_benchmark, write_report

    args, command = saved_run(out)
    folder = out / FOLDER

    def still_active() -> bool:
        return any(
            element.active for found in elements_by_name(folder, "id").values() for element in found
        )

    if wait and not wait_for(still_active, "the array"):
        return 130
    planned = plan_benchmark(args)
    submitted = elements_by_name(folder, "id")
    arrays = sorted({element.array_job for found in submitted.values() for element in found})
    ended = accounting(arrays)
    queued, failed, never = [], [], []
    for job in planned.to_run:
        if job.kind in MEASUREMENTS:
            continue
        found = submitted.get(job.id, [])
        if any(element.active for element in found):
            queued.append(job)
        elif found:
            failed.append(job)
            describe_failure(job, found[-1], ended, folder, command)
        else:
            never.append(job)
    measurements = [job for job in planned.to_run if job.kind in MEASUREMENTS]
    (out / "logs").mkdir(parents=True, exist_ok=True)
    run_jobs(measurements, 1, out / "logs")
    notes = [f"- SLURM job array{'s' if len(arrays) > 1 else ''} {', '.join(arrays) or '(none)'}: "
             f"{runs(sum(job.stored is not None for job in planned.jobs))} finished, {len(failed)} failed"]  # fmt: skip
    for left_out, why in ((queued, "still queued or running"), (never, "never submitted")):
        if left_out:
            notes.append(f"- {runs(len(left_out))} {why} are left out ({', '.join(job.id for job in left_out)}); a "
                         "case short of its seeds is judged on those it has")  # fmt: skip
    notes += timings(folder, [job.id for job in planned.jobs])
    jobs = [job for job in planned.jobs if job not in queued and job not in never]
    for job in failed:
        print(f"slurm: FAILED {job.id}: {job.error}", flush=True)
    if queued:
        print(
            f"slurm: {runs(len(queued))} still queued or running: this command again (or --wait) adds them"
        )
    failures = write_report(args, planned, jobs, notes, command)
    return 1 if failures else 0


def timings(folder: Path, names: list[str]) -> list[str]:
    """A note on how long the elements of `names` waited, from their stories: from the submission
    to their first start, from a stop to the next start, and from a stop signal to its checkpoint."""
    waits: dict[str, list[float]] = {"first": [], "again": [], "checkpoint": []}
    for name in names:
        for event in read_story(story_path(folder, name)):
            if event["event"] == "start":
                waits["again" if event["restarts"] else "first"].append(event["waited_seconds"])
            elif event["event"] == "stop" and event.get("checkpoint_seconds") is not None:
                waits["checkpoint"].append(event["checkpoint_seconds"])

    def spread(values: list[float], what: str) -> str:
        values = sorted(values)
        return f"{what} {values[len(values) // 2]:.1f} s (median of {len(values)}; {values[0]:.1f} to {values[-1]:.1f})"

    parts = [spread(waits[key], what) for key, what in (
        ("first", "from the submission to the first start"), ("again", "from a stop to the next start"),
        ("checkpoint", "from the stop signal to the checkpoint written")) if waits[key]]  # fmt: skip
    return [f"- elements' timings: {'; '.join(parts)}"] if parts else []


def describe_failure(job: Job, element: Element, ended: dict, folder: Path, command: str) -> None:
    """Set `job.error` from its last element: how it ended (its story, else sacct's or squeue's
    state), its log's last lines, and how to submit it again."""
    story = read_story(story_path(folder, job.id))
    last = next((event for event in reversed(story) if event.get("element") == element.name), None)
    state = element.state or ended.get((element.array_job, element.index))
    if last is not None and last.get("error"):
        how = last["error"]
    elif last is not None and last["event"] == "stop" and last.get("step") is not None:
        how = (f"stopped by {last['signal']} with its checkpoint at step {last['step']}, and not requeued"
               f"{f' (SLURM: {state})' if state else ''}: submitted again, it resumes from there")  # fmt: skip
    elif state:
        how = f"SLURM's state {state}"
    else:
        how = "it ended without a word (killed?)"
    job.returncode = (last or {}).get("status", 1)
    job.error = (f"element {element.name} failed: {how}\nits log {element.log} ends:\n{log_tail(element.log)}\n"
                 f"to submit it again: {command} (submits only what is neither finished nor queued)")  # fmt: skip


def story_path(folder: Path, name: str) -> Path:
    return folder / "elements" / f"{name}.jsonl"


def read_story(path: Path) -> list[dict[str, Any]]:
    """The events an element recorded (one JSON object a line; a line cut by a kill is skipped)."""
    events = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            events.append(json.loads(line))
        except ValueError:
            pass
    return events


# ---- one element, on the node ----


class Story:
    """An element's events, appended to its story file and printed to its log."""

    def __init__(self, path: Path, element: str):
        self.path, self.element = path, element
        path.parent.mkdir(parents=True, exist_ok=True)

    def add(self, event: str, line: str, **values: Any) -> None:
        record = {"event": event, "element": self.element, "time": time.time(), **values}
        with open(self.path, "a") as story:
            story.write(json.dumps(record) + "\n")
        print(
            f"[{datetime.now().isoformat(timespec='seconds')}] element {self.element}: {line}",
            flush=True,
        )


def allocated_cpus() -> int:
    """The CPUs SLURM gave this element: --cpus-per-task, else the job's CPUs on its node."""
    for name in ("SLURM_CPUS_PER_TASK", "SLURM_JOB_CPUS_PER_NODE"):
        match = re.match(r"\d+", os.environ.get(name, ""))
        if match and int(match.group()) > 0:
            return int(match.group())
    return 1


def checkpoint_step(run_dir: Path) -> int | None:
    """The step of the run's last checkpoint (None: none yet)."""
    steps = [int(path.stem.removeprefix("step_")) for path in run_dir.glob("*/checkpoints/step_*.pt")
             if path.stem.removeprefix("step_").isdigit()]  # fmt: skip
    return max(steps) if steps else None


def element(submission: Path) -> int:
    """Run this element of the array `submission` (SLURM_ARRAY_TASK_ID), as its story tells."""
    record = json.loads(submission.read_text())
    index = int(os.environ["SLURM_ARRAY_TASK_ID"])
    entry = record["elements"][index]
    name = f"{os.environ.get('SLURM_ARRAY_JOB_ID', record['array_job'])}_{index}"
    folder = submission.parent
    story = Story(story_path(folder, entry.get("id") or entry["worker"]), name)
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    earlier = [event for event in read_story(story.path) if event["element"] == name]
    waited = time.time() - (earlier[-1]["time"] if earlier else record["submitted_at"])
    story.add("start", f"start {restarts + 1} on {platform.node()}, {waited:.1f} s after "
              f"{'its last stop' if earlier else 'the submission'}", restarts=restarts, waited_seconds=waited,
              node=platform.node())  # fmt: skip
    if restarts > record["max_requeues"]:
        error = f"requeued {restarts} times, more than --slurm-max-requeues {record['max_requeues']}: not run again"
        story.add("end", error, status=1, error=error)
        return 1
    if entry.get("id"):
        return run_element(entry, story, restarts, record["max_requeues"], folder.parent)
    return sweep_element(entry, story, restarts, record["max_requeues"])


def run_element(
    entry: dict[str, Any], story: Story, restarts: int, max_requeues: int, out: Path
) -> int:
    """A benchmark's run: the script with the element's CPUs; a finished run is stored as a local
    benchmark stores it."""
    from benchmark.jobs import TORCH_THREADS, job_status, prepare, read_back
    from benchmark.stored import load_run

    job = job_from(entry)
    store = Path(entry["store"]) if entry["store"] else None
    if store is not None and load_run(store, job.id) is not None:
        story.add("end", f"{job.id} has finished already (stored in {store})", status=0)
        return 0
    threads = allocated_cpus()
    if job.kind == "script" and TORCH_THREADS not in job.command:
        job.command = [*job.command, TORCH_THREADS, str(threads)]
    (out / "logs").mkdir(parents=True, exist_ok=True)
    prepare(job, out / "logs")
    before = checkpoint_step(job.run_dir)
    story.add("run", f"{job.id} with {threads} thread{'s' if threads > 1 else ''}, from "
              f"{'step 0' if before is None else f'its checkpoint at step {before}'}: {shlex.join(job.command)}",
              step=before, threads=threads)  # fmt: skip
    returncode, stderr, wall_seconds, stop = supervise(
        job.command,
        {"OMP_NUM_THREADS": str(threads)},
        "the run stops after its iteration with a checkpoint",
    )
    if stop is not None:
        step = checkpoint_step(job.run_dir)
        return stopped(story, stop, returncode, step, job.run_dir, progress=step is not None and step != before,
                       restarts=restarts, max_requeues=max_requeues)  # fmt: skip
    read_back(job, returncode, wall_seconds, "", stderr)
    # the run's own summary line, above, tells its episodes over all its sessions
    story.add("end", job_status(job, store), status=returncode, error=job.error)
    return 0 if job.error is None else returncode or 1


def sweep_element(entry: dict[str, Any], story: Story, restarts: int, max_requeues: int) -> int:
    """A sweep's worker: `python -m benchmark tune ... --worker NAME`, which on a restart runs only
    what its earlier starts left of its trials."""
    story.add("run", shlex.join(entry["command"]))
    returncode, _, _, stop = supervise(
        entry["command"], {"OMP_NUM_THREADS": str(allocated_cpus())},
        "the worker stops its trial's runs, and fails the trial as interrupted",
    )  # fmt: skip
    if stop is not None:
        return stopped(story, stop, returncode, None, None, True, restarts, max_requeues)
    story.add("end", f"the worker ended with status {returncode}", status=returncode,
              error=None if returncode == 0 else f"the worker ended with status {returncode}")  # fmt: skip
    return returncode


def supervise(
    command: list[str], environment: dict[str, str], stopping: str
) -> tuple[int, str, float, tuple[int, float] | None]:
    """Run `command` in this process group (SLURM signals every process of the job: a run stopped
    by SLURM hears it too, and the same signal again within 2 s counts once), passing each stop
    signal on to it, with a line that says what it then does (`stopping`). Returns its exit status,
    its stderr (also copied to ours, the log), its seconds, and the first stop signal with when it
    came (None: none came)."""
    start = time.time()
    process = subprocess.Popen(command, cwd=REPO, env={**os.environ, **environment}, stderr=subprocess.PIPE,
                               text=True, errors="replace")  # fmt: skip
    signals: list[tuple[int, float]] = []

    def pass_on(signum: int, frame: Any) -> None:
        signals.append((signum, time.time()))
        print(f"element: {signal.Signals(signum).name}: {stopping}", file=sys.stderr, flush=True)
        process.send_signal(signum)

    previous = {signum: signal.signal(signum, pass_on) for signum in STOP_SIGNALS}
    tail: deque[str] = deque(maxlen=200)

    def copy_stderr() -> None:
        for line in process.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            tail.append(line)

    copying = threading.Thread(target=copy_stderr, daemon=True)
    copying.start()
    try:
        returncode = process.wait()
        copying.join()
    finally:
        for signum in previous:  # the stop is told once; what SLURM sends after it is not passed on
            signal.signal(signum, lambda signum, frame: None)
    return returncode, "".join(tail), time.time() - start, signals[0] if signals else None


def stopped(
    story: Story, stop: tuple[int, float], returncode: int, step: int | None, run_dir: Path | None,
    progress: bool, restarts: int, max_requeues: int,
) -> int:  # fmt: skip
    """After a stop signal: the checkpoint the run wrote, and on SLURM's time-limit warning the
    requeue (not where it made no progress since its start, or was requeued too often)."""
    signum, at = stop
    name = signal.Signals(signum).name
    files = (
        sorted(run_dir.glob(f"*/checkpoints/step_{step}.pt"))
        if run_dir and step is not None
        else []
    )
    # A run exits with 128 + a stop signal only once its stop checkpoint is written. SLURM signals every process
    # of the job, so the run may hear it, and write, a moment before the element does: no less than 0 s.
    wrote_it = files and returncode in STOPPED_WITH_A_CHECKPOINT
    after = max(0.0, files[0].stat().st_mtime - at) if wrote_it else None
    if after is not None:
        wrote = f"checkpoint at step {step}, written {after:.1f} s after {name}"
    else:
        wrote = f"stopped by {name}" if run_dir is None else f"no checkpoint after {name}"
    ended = "the worker" if run_dir is None else "the run"
    story.add("stop", f"{wrote}; {ended} ended with status {returncode}", signal=name, step=step,
              checkpoint_seconds=after, status=returncode)  # fmt: skip
    if signum != TIME_LIMIT_SIGNAL:
        # SLURM's own requeue or preemption requeues the job; scancel or the time limit itself ends it
        return returncode
    if restarts >= max_requeues or not progress:
        why = f"it was requeued {restarts} times already (--slurm-max-requeues)" if progress else \
            "it made no progress since it started"  # fmt: skip
        error = f"not requeued at its time limit: {why}"
        story.add("end", error, status=1, error=error)
        return 1
    job_id = (
        story.element
    )  # ARRAY_INDEX: SLURM_JOB_ID of one element may be its array's id, which names them all
    answer = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True)
    if answer.returncode != 0:
        error = f"scontrol requeue {job_id} refused: {answer.stderr.strip()}"
        story.add("end", error, status=1, error=error)
        return 1
    story.add(
        "requeue", "requeued before its time limit: the next start resumes from the checkpoint"
    )
    return 0


def main() -> int:
    return element(Path(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
