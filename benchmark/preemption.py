"""What a preemption costs each script: ``python -m benchmark.preemption [--out FILE] [--repeats 3]
[--cases NAME ...]``.

Each case starts a script as SLURM would run it (a process group of its own), lets it train (until
its TensorBoard events show a first `charts/SPS` record, its first iteration done, and then
--wait-seconds more; ddpg until its events reach --ddpg-steps, so that its replay buffer holds that
many transitions, or --ddpg-max-seconds have passed), then sends SIGTERM to the
whole group (`os.killpg`, as slurmstepd does at a time limit or preemption) and times the seconds
from the signal to the script's exit. It records the exit status (143 expected), whether stderr
holds a traceback, the run's iteration length from its events (`perf/rollout_seconds` +
`perf/update_seconds`, and the steps per iteration over the last `charts/SPS`), and the sizes of
`checkpoints/latest.pt` and of ddpg's `buffer_step_N.npz` (--save-buffer).

One checkpoint write is then timed apart from the run, on the checkpoint the run wrote:
`torch.save` of the dict loaded back from `latest.pt` into a BytesIO and its atomic write to disk,
once (the `latest.pt` alone that --checkpoint-minutes writes) and twice (`step_N.pt` and `latest.pt`,
at a stop), plus for ddpg the script's own `write_buffer` of a ReplayBuffer holding the run's
transitions. The cost of --checkpoint-minutes M is that periodic write over M minutes of training.
Last, `ddpg.write_buffer` of a full 1M-transition HalfCheetah buffer (17 observation and 6 action
values, random float32) is timed and its file size read: the largest write --save-buffer makes.

The markdown table goes to stdout, everything measured to --out as JSON (and each run, as it ends,
as a line of --out with the suffix .runs.jsonl). Run it on an otherwise
idle machine: the exit times include the rest of the iteration that was running at the signal, so
they fall anywhere from the teardown alone to a whole iteration more; they are read with
`Popen.wait(timeout)`, which polls every 50 ms at most. The writes go to the page cache (the scripts
do not fsync), as they do in a run. ``--table-from FILE`` prints an earlier --out file's table."""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from benchmark.registry import REPO
from common.run_folder import write_atomically

KILL_WAIT_SECONDS = 30.0
"""SLURM's default KillWait: the seconds between its SIGTERM and its SIGKILL"""
EXIT_LIMIT_SECONDS = 300.0
"""the harness SIGKILLs a group that has not ended this long after the SIGTERM"""
START_LIMIT_SECONDS = 600.0
"""the longest a run may take to reach the point at which it is signalled"""
WRITE_REPEATS = 5
"""checkpoint writes timed per run (the median is kept)"""
RECENT_ITERATIONS = 10
"""the iteration length is the median over this many last logged iterations"""
FULL_BUFFER = (1_000_000, 17, 6)
"""transitions, observation size and action size of the full buffer timed alone (HalfCheetah)"""
SPS_TAG = "charts/SPS"
MINUTES = (10.0, 5.0)
"""--checkpoint-minutes values whose cost the table shows"""


@dataclass(frozen=True)
class Case:
    name: str
    script: str
    flags: tuple[str, ...] = ()
    ddpg_steps: bool = False
    """signal once the events reach --ddpg-steps (else --wait-seconds after the events file)"""


CASES = (
    Case("ppo_fc CartPole-v1", "ppo_fc.py", ("--env-id", "CartPole-v1")),
    Case("ppo_fc BreakoutNoFrameskip-v4", "ppo_fc.py", ("--env-id", "BreakoutNoFrameskip-v4")),
    Case(
        "ddpg HalfCheetah-v5 --save-buffer",
        "ddpg.py",
        ("--env-id", "HalfCheetah-v5", "--save-buffer", "--buffer-size", "1000000"),
        ddpg_steps=True,
    ),
    Case("ppo_lstm CartPole-v1", "ppo_lstm.py", ("--env-id", "CartPole-v1")),
    Case("ppo_transformer CartPole-v1", "ppo_transformer.py", ("--env-id", "CartPole-v1")),
)


@dataclass
class RunResult:
    """One run of a case, signalled once."""

    case: str
    seed: int
    command: list[str]
    signalled: bool = False
    """False if the run ended (or failed) before the harness signalled it"""
    step_at_signal: int | None = None
    """the last step logged in the events before the signal"""
    seconds_to_signal: float | None = None
    """from the start of the process to the signal"""
    exit_seconds: float | None = None
    """from the SIGTERM to the process's exit"""
    group_left_seconds: float | None = None
    """from the SIGTERM until no process of the group was left"""
    exit_status: int | None = None
    killed: bool = False
    """the harness had to SIGKILL it (EXIT_LIMIT_SECONDS)"""
    traceback: bool = False
    stderr_tail: str = ""
    checkpoint_step: int | None = None
    step_files: list[str] = field(default_factory=list)
    checkpoint_bytes: int | None = None
    buffer_bytes: int | None = None
    buffer_transitions: int | None = None
    steps_per_iteration: int | None = None
    iteration_seconds: float | None = None
    """median of perf/rollout_seconds + perf/update_seconds over the last logged iterations"""
    last_sps: float | None = None
    sps_iteration_seconds: float | None = None
    """steps per iteration over the last charts/SPS (which counts from the run's start)"""
    save_seconds: float | None = None
    """torch.save to a BytesIO of the loaded latest.pt dict (median)"""
    write_one_seconds: float | None = None
    """the save and one atomic write (latest.pt alone: --checkpoint-minutes) (median)"""
    write_two_seconds: float | None = None
    """the save and two atomic writes (step_N.pt and latest.pt: at a stop) (median)"""
    buffer_write_seconds: float | None = None
    """ddpg.write_buffer of the run's transitions (median)"""


def events_file(run_dir: Path) -> Path | None:
    found = sorted(run_dir.glob("*/events.out.tfevents.*"))
    return found[0] if found else None


def scalars(path: Path) -> dict[str, list[Any]]:
    """Every scalar record of an events file (or a run folder), by tag, with TensorBoard's
    EventAccumulator (nothing sampled away). A file still being written is read up to its last
    whole record."""
    accumulator = EventAccumulator(str(path), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: accumulator.Scalars(tag) for tag in accumulator.Tags()["scalars"]}


def last_step(path: Path, tag: str | None = None) -> int:
    """The largest step of a scalar record (of `tag`, or of any) in an events file (0 if none yet)."""
    try:
        records = scalars(path)
    except Exception:  # a file caught in the middle of a write: try again later
        return 0
    chosen = records.values() if tag is None else [records.get(tag, [])]
    return max((r.step for values in chosen for r in values), default=0)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a zombie's group still answers
        return True
    return True


def run_once(case: Case, seed: int, folder: Path, options: argparse.Namespace) -> RunResult:
    """Start the case's script, wait, SIGTERM its group, time the exit and read what it left."""
    run_dir = folder / f"{re.sub(r'[^A-Za-z0-9]+', '_', case.name).strip('_')}-{seed}"
    extra = options.ddpg_flags.split() if case.ddpg_steps else []
    command = [sys.executable, case.script, *case.flags, *extra, "--seed", str(seed)]
    command += ["--run-dir", str(run_dir), "--no-progress"]
    result = RunResult(case.name, seed, command)
    log = folder / f"{run_dir.name}.log"
    with open(log, "w") as stderr:
        start = time.monotonic()
        process = subprocess.Popen(
            command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True
        )
        try:
            signal_at = wait_to_signal(case, process, run_dir, start, options)
            if signal_at is not None:
                result.signalled = True
                result.step_at_signal = signal_at
                result.seconds_to_signal = time.monotonic() - start
                sent = time.monotonic()
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    result.exit_status = process.wait(EXIT_LIMIT_SECONDS)
                except subprocess.TimeoutExpired:
                    result.killed = True
                result.exit_seconds = time.monotonic() - sent
                while group_alive(process.pid) and time.monotonic() - sent < EXIT_LIMIT_SECONDS:
                    time.sleep(0.01)
                result.group_left_seconds = time.monotonic() - sent
        finally:
            if group_alive(process.pid):
                os.killpg(process.pid, signal.SIGKILL)
            status = process.wait()
            result.exit_status = status if result.exit_status is None else result.exit_status
    text = log.read_text()
    result.traceback = "Traceback" in text
    result.stderr_tail = "\n".join(text.strip().splitlines()[-8:])
    read_run(result, run_dir)
    return result


def wait_to_signal(
    case: Case, process: subprocess.Popen, run_dir: Path, start: float, options: argparse.Namespace
) -> int | None:
    """Wait until the run is to be signalled: --wait-seconds after its events show a first
    `charts/SPS` record (its first iteration done); ddpg's once its events reach --ddpg-steps, or
    --ddpg-max-seconds after the start, whichever comes first. The last step its events show then
    (None: the process ended first, or took longer than START_LIMIT_SECONDS)."""
    trained_at = None
    while process.poll() is None and time.monotonic() - start < START_LIMIT_SECONDS:
        time.sleep(0.5)
        path = events_file(run_dir)
        if path is None:
            continue
        step = last_step(path, SPS_TAG)
        if case.ddpg_steps:
            if step >= options.ddpg_steps or time.monotonic() - start >= options.ddpg_max_seconds:
                return step
            continue
        if step and trained_at is None:
            trained_at = time.monotonic()
        if trained_at is not None and time.monotonic() - trained_at >= options.wait_seconds:
            return last_step(path)
    return None


def median_seconds(action: Any, repeats: int = WRITE_REPEATS) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        action()
        times.append(time.perf_counter() - began)
    return float(np.median(times))


def read_run(result: RunResult, run_dir: Path) -> None:
    """The run's iteration length from its events, its checkpoint's size and step, and the time one
    checkpoint write takes."""
    found = sorted(p.parent for p in run_dir.glob("*/events.out.tfevents.*"))
    if not found:
        return
    run = found[0]
    records = scalars(run)
    rollout = records.get("perf/rollout_seconds", [])[-RECENT_ITERATIONS:]
    update = records.get("perf/update_seconds", [])[-RECENT_ITERATIONS:]
    if rollout and update:
        sums = [a.value + b.value for a, b in zip(rollout, update, strict=True)]
        result.iteration_seconds = float(np.median(sums))
    sps = records.get("charts/SPS", [])
    if sps:
        result.last_sps = float(sps[-1].value)
    checkpoints = run / "checkpoints"
    latest = checkpoints / "latest.pt"
    if not latest.is_file():
        return
    result.checkpoint_bytes = latest.stat().st_size
    result.step_files = sorted(p.name for p in checkpoints.glob("step_*.pt"))
    checkpoint = torch.load(latest, map_location="cpu", weights_only=True)
    result.checkpoint_step = int(checkpoint["global_step"])
    args = checkpoint["args"]
    result.steps_per_iteration = int(args["num_envs"]) * int(args.get("num_steps", 1))
    if result.last_sps:
        result.sps_iteration_seconds = result.steps_per_iteration / result.last_sps
    scratch = checkpoints / "timing"
    scratch.mkdir()

    def save() -> io.BytesIO:
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        return buffer

    def write(files: int) -> None:
        buffer = save()
        for name in ("step_0.pt", "latest.pt")[-files:]:
            write_atomically(scratch / name, buffer.getbuffer())

    result.save_seconds = median_seconds(save)
    result.write_one_seconds = median_seconds(lambda: write(1))
    result.write_two_seconds = median_seconds(lambda: write(2))
    buffers = sorted(checkpoints.glob("buffer_step_*.npz"))
    if buffers:
        result.buffer_bytes = buffers[-1].stat().st_size
        result.buffer_write_seconds, result.buffer_transitions = time_stored_buffer(
            buffers[-1], args["buffer_size"], scratch
        )


def load_ddpg() -> Any:
    sys.path.insert(0, str(REPO))
    import ddpg

    return ddpg


def time_stored_buffer(path: Path, size: int, scratch: Path) -> tuple[float, int]:
    """ddpg.write_buffer's seconds (median) for a ReplayBuffer refilled from the run's buffer file,
    and its number of transitions."""
    ddpg = load_ddpg()
    with np.load(path, allow_pickle=False) as stored:
        state = dict(stored)
    observation_size, action_size = state["observations"].shape[1], state["actions"].shape[1]
    rb = ddpg.ReplayBuffer(size, observation_size, action_size)
    rb.restore(state)
    seconds = median_seconds(lambda: ddpg.write_buffer(rb, scratch, 0))
    return seconds, len(rb)


def full_buffer(folder: Path, repeats: int) -> dict[str, Any]:
    """ddpg.write_buffer of a full ReplayBuffer(*FULL_BUFFER) of random float32 data: every time,
    its median and its file's size."""
    ddpg = load_ddpg()
    size, observation_size, action_size = FULL_BUFFER
    rb = ddpg.ReplayBuffer(size, observation_size, action_size)
    generator = np.random.default_rng(0)
    for name in rb.FIELDS:
        array = getattr(rb, name)
        array[...] = generator.standard_normal(array.shape, dtype=np.float32)
    rb.terminations[...] = generator.random(size, dtype=np.float32) < 0.001
    rb.full, rb.position = True, 0
    times = []
    for index in range(repeats):
        began = time.perf_counter()
        name = ddpg.write_buffer(rb, folder, index)
        times.append(time.perf_counter() - began)
        file_bytes = (folder / name).stat().st_size
        (folder / name).unlink()
    return {
        "transitions": size,
        "observation_size": observation_size,
        "action_size": action_size,
        "write_seconds": times,
        "median_write_seconds": float(np.median(times)),
        "file_bytes": file_bytes,
    }


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{min(values):.2f} / {np.median(values):.2f} / {max(values):.2f}"


def median_of(runs: list[RunResult], name: str) -> float | None:
    values = [getattr(run, name) for run in runs if getattr(run, name) is not None]
    return float(np.median(values)) if values else None


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def summary(name: str, runs: list[RunResult]) -> dict[str, Any]:
    """A case's row: medians over its runs."""
    periodic = median_of(runs, "write_one_seconds")
    at_stop = median_of(runs, "write_two_seconds")
    buffer_write = median_of(runs, "buffer_write_seconds")
    if buffer_write is not None:  # ddpg writes the buffer with each checkpoint
        periodic = None if periodic is None else periodic + buffer_write
        at_stop = None if at_stop is None else at_stop + buffer_write
    checkpoint_bytes, buffer_bytes = (
        median_of(runs, "checkpoint_bytes"),
        median_of(runs, "buffer_bytes"),
    )
    return {
        "case": name,
        "runs": len(runs),
        "exit_statuses": [run.exit_status for run in runs],
        "exit_seconds": [run.exit_seconds for run in runs if run.exit_seconds is not None],
        "iteration_seconds": median_of(runs, "iteration_seconds"),
        "sps_iteration_seconds": median_of(runs, "sps_iteration_seconds"),
        "steps_per_iteration": median_of(runs, "steps_per_iteration"),
        "periodic_checkpoint_seconds": periodic,
        "stop_checkpoint_seconds": at_stop,
        "checkpoint_mb": None if checkpoint_bytes is None else checkpoint_bytes / 1e6,
        "buffer_mb": None if buffer_bytes is None else buffer_bytes / 1e6,
        "cost_percent": {
            str(minutes): None if periodic is None else 100 * periodic / (60 * minutes)
            for minutes in MINUTES
        },
    }


def table(rows: list[dict[str, Any]], full: dict[str, Any] | None) -> str:
    lines = [
        "| case | runs | exit status | signal to exit s (min / median / max) | iteration s (perf; "
        "steps/SPS) | checkpoint s (periodic; at stop) | checkpoint MB | buffer MB | cost at 10 min "
        "| cost at 5 min |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        statuses = ", ".join(str(status) for status in row["exit_statuses"])
        cost = row["cost_percent"]
        lines.append(
            f"| {row['case']} | {row['runs']} | {statuses} | {spread(row['exit_seconds'])} | "
            f"{fmt(row['iteration_seconds'], 4)}; {fmt(row['sps_iteration_seconds'], 4)} | "
            f"{fmt(row['periodic_checkpoint_seconds'], 4)}; {fmt(row['stop_checkpoint_seconds'], 4)} | "
            f"{fmt(row['checkpoint_mb'], 3)} | {fmt(row['buffer_mb'], 1)} | "
            f"{fmt(cost['10.0'], 4)}% | {fmt(cost['5.0'], 4)}% |"
        )
    if full is not None:
        seconds = full["median_write_seconds"]
        lines.append(
            f"| ddpg full 1M buffer, write_buffer alone | {len(full['write_seconds'])} | - | - | - | "
            f"{seconds:.3f} (buffer only) | - | {full['file_bytes'] / 1e6:.1f} | "
            f"{100 * seconds / 600:.3f}% | {100 * seconds / 300:.3f}% |"
        )
    return "\n".join(lines)


def table_of(payload: dict[str, Any]) -> str:
    """The table of an --out file, its rows made again from its runs."""
    by_case: dict[str, list[RunResult]] = {}
    for run in payload["runs"]:
        by_case.setdefault(run["case"], []).append(RunResult(**run))
    rows = [summary(name, runs) for name, runs in by_case.items()]
    return table(rows, payload["full_buffer"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmark.preemption", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=Path("preemption.json"), help="the JSON file")
    parser.add_argument("--repeats", type=int, default=3, help="runs per case (seeds 1 to N)")
    parser.add_argument(
        "--repeats-for",
        nargs=2,
        action="append",
        default=[],
        metavar=("CASE_PREFIX", "N"),
        help="fewer (or more) runs for the cases whose name starts with CASE_PREFIX",
    )
    parser.add_argument(
        "--cases", nargs="*", help="only the cases whose name starts with one of these"
    )
    parser.add_argument(
        "--wait-seconds", type=float, default=20.0, help="training after the first logged iteration"
    )
    parser.add_argument("--ddpg-steps", type=int, default=20_000, help="ddpg's step at the signal")
    parser.add_argument(
        "--ddpg-max-seconds",
        type=float,
        default=420.0,
        help="signal ddpg this long after its start even if --ddpg-steps is not reached",
    )
    parser.add_argument("--ddpg-flags", default="", help="more flags for ddpg.py, one string")
    parser.add_argument("--full-buffer-repeats", type=int, default=3, help="0: skip it")
    parser.add_argument("--keep", type=Path, help="keep the run folders here (default: temporary)")
    parser.add_argument(
        "--table-from", type=Path, help="print the table of an earlier --out file, and run nothing"
    )
    options = parser.parse_args(argv)
    if options.table_from is not None:
        print(table_of(json.loads(options.table_from.read_text())))
        return 0
    cases = [c for c in CASES if not options.cases or c.name.startswith(tuple(options.cases))]
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    rows, all_runs = [], []
    with tempfile.TemporaryDirectory(prefix="preemption-") as temporary:
        folder = options.keep or Path(temporary)
        folder.mkdir(parents=True, exist_ok=True)
        for case in cases:
            repeats = options.repeats
            for prefix, count in options.repeats_for:
                if case.name.startswith(prefix):
                    repeats = int(count)
            runs = []
            for seed in range(1, repeats + 1):
                result = run_once(case, seed, folder, options)
                runs.append(result)
                with open(options.out.with_suffix(".runs.jsonl"), "a") as lines:
                    lines.write(json.dumps(asdict(result)) + "\n")
                print(
                    f"{case.name} seed {seed}: status {result.exit_status}, signalled at step "
                    f"{result.step_at_signal} after {fmt(result.seconds_to_signal, 1)} s, exit in "
                    f"{fmt(result.exit_seconds, 2)} s, checkpoint step {result.checkpoint_step}",
                    flush=True,
                )
                if result.exit_status != 128 + signal.SIGTERM or result.traceback:
                    print(result.stderr_tail, flush=True)
            all_runs += runs
            rows.append(summary(case.name, runs))
        full = None
        if options.full_buffer_repeats:
            scratch = folder / "full_buffer"
            scratch.mkdir(exist_ok=True)
            full = full_buffer(scratch, options.full_buffer_repeats)
    report = table(rows, full)
    print(f"\ncommit {commit}, {started}\n\n{report}")
    late = [run for run in all_runs if (run.exit_seconds or 0) > KILL_WAIT_SECONDS]
    for run in late:
        print(f"over SLURM's KillWait ({KILL_WAIT_SECONDS:.0f} s): {run.case} seed {run.seed}")
    payload = {
        "commit": commit,
        "started": started,
        "finished": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": [sys.executable, "-m", "benchmark.preemption", *(argv or sys.argv[1:])],
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(options).items()},
        "cases": rows,
        "runs": [asdict(run) for run in all_runs],
        "full_buffer": full,
        "table": report,
    }
    options.out.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
