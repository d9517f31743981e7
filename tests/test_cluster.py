"""Suites and sweeps on a real SLURM cluster and a real PostgreSQL server (benchmark/slurm.py, docs/cluster.md): a
one-node cluster and a server started by the tests (tests/cluster.py), once for the session, on one xdist worker."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.cluster import (
    POSTGRES_PROGRAMS,
    SLURM_PROGRAMS,
    Postgres,
    Slurm,
    free_port,
    skip_or_fail,
)
from tests.helpers import REPO, learnt, read_scalars
from tests.test_tune import PROBES as TUNE_PROBES
from tests.test_tune import QUICK

pytestmark = pytest.mark.xdist_group("cluster")

# Two scripts, two seeds, a few thousand steps. ddpg's checkpoint every 500 steps says when its runs, the longer, can be
# stopped part-way.
TINY = ["--scripts", "ppo_fc", "ddpg", "--envs", "Pendulum-v1", "--seeds", "1", "2"]
TINY += ["--total-timesteps", "4000", "--eval-episodes", "2"]
TINY += ["--script-flags", "ppo_fc=--num-steps 256"]
TINY += [
    "--script-flags",
    "ddpg=--learning-starts 500 --buffer-size 5000 --hidden-size 64 --checkpoint-every 500",
]
ON_SLURM = ["--launcher", "slurm", "--slurm-cpus-per-task", "1"]
# the tune tests' two one-step probes, whose random policy scores 0
PROBES = [*TUNE_PROBES, "--random", "Probe4-v0=0", "--random", "Probe5-v0=0", *QUICK]
ONE_RUN = ["run", "--scripts", "ppo_fc", "--envs", "Probe1-v0", "--seeds", "1", *ON_SLURM]


@pytest.fixture(scope="session")
def slurm(tmp_path_factory) -> Slurm:
    skip_or_fail(SLURM_PROGRAMS)
    cluster = Slurm(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def postgres() -> Postgres:
    skip_or_fail(POSTGRES_PROGRAMS)
    server = Postgres()
    yield server
    server.stop()


def harness(environment: dict[str, str], *arguments: str | Path, **popen) -> subprocess.Popen:
    command = [sys.executable, "-m", "benchmark", *map(str, arguments)]
    return subprocess.Popen(command, cwd=REPO, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)  # fmt: skip


def finished(process: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    stdout, stderr = process.communicate(timeout=timeout)
    return process.returncode, stdout, stderr


def elements(stdout: str) -> dict[str, str]:
    """A submission's printed elements: job id -> ARRAY_INDEX."""
    return {
        job_id: element
        for element, job_id in re.findall(r"^  (\d+_\d+) (\S+): ", stdout, re.MULTILINE)
    }


def first_checkpoint(out: Path, job_id: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not any(out.glob(f"runs/{job_id}/*/checkpoints/step_*.pt")):
        assert time.time() < deadline, f"{job_id} wrote no checkpoint"
        time.sleep(0.05)


def kill_every_process_naming(text: str) -> None:
    """SIGKILL to every process whose command line holds `text`."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:
            pass


def story(out: Path, job_id: str) -> list[dict]:
    path = out / "slurm" / "elements" / f"{job_id}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_tiny_suite_goes_from_submission_to_table_through_two_requeues_and_equals_a_local_run(
    slurm, tmp_path
):
    # The same suite, run locally beside it: two processes, one thread each, as each element has one CPU.
    local = harness(dict(os.environ), "run", *TINY, "--workers", "2", "--out", tmp_path / "local")
    out = tmp_path / "cluster"
    settings = ["--slurm-partition", "debug", "--slurm-time", "30:00", "--slurm-max-running", "4"]
    settings += ["--slurm-signal-seconds", "120"]
    returncode, stdout, stderr = finished(
        harness(slurm.environment, "run", *TINY, *ON_SLURM, *settings, "--out", out)
    )
    assert returncode == 0, stderr
    assert "0 runs finished, 0 queued or running, 4 to submit" in stdout
    array = re.search(r"submitted job array (\d+) of 4 elements", stdout).group(1)
    submitted = elements(stdout)
    assert sorted(submitted.values()) == [f"{array}_{index}" for index in range(4)], stdout
    assert f"{out / 'slurm' / 'logs' / array}_0.log" in stdout
    # SLURM holds the settings the flags gave: partition, time limit, CPUs, the array's limit, signal and requeue
    job = slurm.run("scontrol", "show", "job", f"{array}_0").stdout
    for setting in ("Partition=debug", "TimeLimit=00:30:00", "NumCPUs=1", "Requeue=1"):
        assert setting in job, job
    job = slurm.run("scontrol", "show", "job", array).stdout
    assert "ArrayTaskThrottle=4" in job, job
    script = (next((out / "slurm").glob("submission-*.sbatch"))).read_text()
    assert script.endswith(
        f"exec {shlex.quote(sys.executable)} -m benchmark.slurm {next((out / 'slurm').glob('submission-*.json'))}\n"
    )

    # ddpg's seed 1 is requeued part-way as `scontrol requeue` (or a preemption) does it: SIGTERM, then SLURM
    # requeues it. Its seed 2 gets SLURM's warning before its time limit, as --signal=B:USR1@S sends it: the element
    # stops its run with a checkpoint and requeues itself.
    requeued = next(
        job_id for job_id in submitted if job_id.startswith("ddpg__") and job_id.endswith("__1")
    )
    warned = next(
        job_id for job_id in submitted if job_id.startswith("ddpg__") and job_id.endswith("__2")
    )
    first_checkpoint(out, requeued)
    slurm.run("scontrol", "requeue", submitted[requeued])
    first_checkpoint(out, warned)
    slurm.run("scancel", "--signal=USR1", "--batch", submitted[warned])

    # The same command again submits nothing: every run is finished, queued or running (or requeued).
    returncode, again, stderr = finished(
        harness(slurm.environment, "run", *TINY, *ON_SLURM, "--out", out)
    )
    assert returncode == 0 and ", 0 to submit" in again and "submitted" not in again, again
    assert len(list((out / "slurm").glob("submission-*.json"))) == 1

    returncode, report, stderr = finished(
        harness(slurm.environment, "report", out, "--wait"), timeout=400
    )
    assert returncode == 0, stderr + report
    assert report.count("[stored] ") == 4 and "PASS" in report, report
    assert finished(local, timeout=300)[0] == 0
    assert learnt(out) == learnt(
        tmp_path / "local"
    )  # every row and every episode, after the requeues too
    results = (out / "results.md").read_text()
    assert f"SLURM job array {array}: 4 runs finished, 0 failed" in results
    timings = r"elements' timings: from the submission to the first start [\d.]+ s \(median of 4;.*"
    timings += r"from a stop to the next start [\d.]+ s \(median of 2;.*"
    timings += r"from the stop signal to the checkpoint written [\d.]+ s \(median of 2;"
    assert re.search(timings, results), results

    for job_id, signal_name in ((requeued, "SIGTERM"), (warned, "SIGUSR1")):
        events = story(out, job_id)
        assert [event["event"] for event in events if event["event"] in ("start", "stop", "end")] == [
            "start", "stop", "start", "end"
        ], events  # fmt: skip
        stop = next(event for event in events if event["event"] == "stop")
        assert (
            stop["signal"] == signal_name
            and stop["checkpoint_seconds"] is not None
            and stop["step"] > 0
        )
        starts = [event for event in events if event["event"] == "start"]
        assert (
            events[-1]["status"] == 0
            and starts[1]["restarts"] == 1
            and starts[1]["waited_seconds"] > 0
        )
        assert all(event["threads"] == 1 for event in events if event["event"] == "run")
        log = (out / "slurm" / "logs" / f"{submitted[job_id]}.log").read_text()
        # the run's own summary line tells the whole run: its episodes in all, those of its second session
        run_dir = next((out / "runs" / job_id).iterdir())
        episodes = len(read_scalars(run_dir)["charts/episodic_return"])
        assert re.search(
            rf"{episodes} episodes \(\d+ in this session, from step {stop['step']}\)", log
        ), log
    assert [event["event"] for event in story(out, warned)].count("requeue") == 1
    assert "requeue" not in [event["event"] for event in story(out, requeued)]  # SLURM's own


def test_a_preempted_element_is_requeued_and_resumes_as_the_uninterrupted_run(slurm, tmp_path):
    suite = ["run", "--scripts", "ppo_fc", "--envs", "Pendulum-v1", "--seeds", "1"]
    suite += ["--total-timesteps", "32768", "--eval-episodes", "2"]
    suite += ["--script-flags", "ppo_fc=--num-steps 256 --checkpoint-every 1"]
    local = harness(dict(os.environ), *suite, "--out", tmp_path / "local")
    out = tmp_path / "cluster"
    returncode, stdout, stderr = finished(
        harness(slurm.environment, *suite, *ON_SLURM, "--out", out)
    )
    assert returncode == 0, stderr
    [(job_id, element)] = elements(stdout).items()
    first_checkpoint(out, job_id)
    # A job of the higher-priority partition that needs every CPU of the node preempts the element (PreemptMode
    # REQUEUE): SIGTERM, then SLURM requeues it.
    slurm.run(
        "sbatch", "--partition=urgent", "--cpus-per-task=4", "--output=/dev/null", "--wrap=sleep 1"
    )
    returncode, report, stderr = finished(harness(slurm.environment, "report", out, "--wait"))
    assert returncode == 0 and finished(local)[0] == 0, stderr + report
    assert learnt(out) == learnt(tmp_path / "local")
    events = story(out, job_id)
    assert [event["event"] for event in events if event["event"] in ("start", "stop", "end")] == [
        "start", "stop", "start", "end"
    ], events  # fmt: skip
    stop = next(event for event in events if event["event"] == "stop")
    assert stop["signal"] == "SIGTERM" and stop["checkpoint_seconds"] is not None
    assert "DUE TO PREEMPTION" in (out / "slurm" / "logs" / f"{element}.log").read_text()


def test_failed_elements_are_named_with_how_they_ended_and_their_logs_and_submitted_again(
    slurm, tmp_path
):
    broken = tmp_path / "broken"
    # A flag that only the run itself refuses: seed 1's element ends with the script's error line. Seed 2's, held
    # back by the array's limit of one element at a time, is cancelled before it starts: it has no story.
    failing = ["run", "--scripts", "ppo_fc", "--envs", "Probe1-v0", "--seeds", "1", "2"]
    failing += ["--script-flags", "ppo_fc=--save-trajectories /dev/null/below-a-file"]
    failing += [*ON_SLURM, "--slurm-max-running", "1", "--total-timesteps", "2048", "--out", broken]
    returncode, stdout, stderr = finished(harness(slurm.environment, *failing))
    assert returncode == 0, stderr
    cancelled = next(element for job, element in elements(stdout).items() if job.endswith("__2"))
    slurm.run("scancel", cancelled)
    # Runs stopped part-way: one requeued more often than --slurm-max-requeues allows, which ends as failed
    # without running again; one that scancel stops, which checkpoints and is not requeued; one killed outright
    # (SIGKILL to the element and its run), whose end only SLURM's accounting knows once squeue forgets it.
    pendulum = ["run", "--scripts", "ppo_fc", "--envs", "Pendulum-v1", "--seeds", "1", *ON_SLURM]
    pendulum += ["--script-flags", "ppo_fc=--num-steps 256 --checkpoint-every 1"]
    pendulum += ["--total-timesteps", "32768"]
    stops = {
        "limited": (["--slurm-max-requeues", "0"], ["scontrol", "requeue"]),
        "stopped": ([], ["scancel"]),
        "killed": ([], None),
    }
    stopped_elements = {}
    for name, (flags, stop) in stops.items():
        command = [*pendulum, *flags, "--out", tmp_path / name]
        returncode, stdout, stderr = finished(harness(slurm.environment, *command))
        assert returncode == 0, stderr
        [(job_id, element)] = elements(stdout).items()
        first_checkpoint(tmp_path / name, job_id)
        if (
            stop is None
        ):  # on its node: the element and its run, whose command lines name the folder
            kill_every_process_naming(str(tmp_path / name))
        else:
            slurm.run(*stop, element)
        stopped_elements[name] = element

    def report(name: str) -> str:
        returncode, stdout, _ = finished(
            harness(slurm.environment, "report", tmp_path / name, "--wait")
        )
        assert returncode == 1 and "slurm: FAILED " in stdout, stdout
        return stdout

    report("broken")
    results = (broken / "results.md").read_text()
    assert "0 runs finished, 2 failed" in results and "## Failures" in results
    assert "error: --save-trajectories '/dev/null/below-a-file'" in results, results
    # a pending element cancelled before SLURM split it from its array leaves no record, in squeue or sacct
    assert re.search(
        rf"element {cancelled} failed: (it ended without a word|SLURM's state CANCELLED)", results
    )
    assert "its log" in results and "to submit it again: python -m benchmark run" in results

    said = report("limited")
    assert "requeued 1 times, more than --slurm-max-requeues 0: not run again" in said, said
    said = report("stopped")
    stop = r"failed: stopped by SIGTERM with its checkpoint at step (\d+), and not requeued \(SLURM: CANCELLED"
    assert re.search(stop, said) and "submitted again, it resumes from there" in said, said

    deadline = time.time() + 120
    while (
        stopped_elements["killed"] in slurm.jobs()
    ):  # until squeue forgets it (MinJobAge): then sacct alone knows
        assert time.time() < deadline
        time.sleep(0.5)
    said = report("killed")
    assert f"element {stopped_elements['killed']} failed: SLURM's state FAILED 0:9" in said, said

    # To submit them again is the same command: it submits only what failed.
    returncode, stdout, stderr = finished(harness(slurm.environment, *failing))
    assert returncode == 0, stderr
    assert "0 runs finished, 0 queued or running, 2 to submit" in stdout, stdout
    slurm.run("scancel", re.search(r"submitted job array (\d+)", stdout).group(1))


def test_a_two_worker_sweep_on_postgresql_adds_up_with_a_worker_requeued_part_way(
    slurm, postgres, tmp_path
):
    study = f"sweep-{time.time_ns()}"
    command = ["tune", "ppo_fc", *PROBES, "--trials", "4", "--workers", "2", "--study", study]
    command += [
        "--storage",
        postgres.url,
        "--out",
        tmp_path / "runs",
        "--heartbeat-seconds",
        "2",
        *ON_SLURM,
        "--wait",
    ]
    sweep = harness(slurm.environment, *command)
    lines = []
    for line in sweep.stdout:
        lines.append(line)
        if line.startswith("tune: submitted job array"):
            break
    array = re.search(r"job array (\d+): 2 workers sharing 4 trials", lines[-1]).group(1)
    storage = optuna.storages.RDBStorage(postgres.url)
    deadline = time.time() + 120
    while not any(
        trial.state == TrialState.RUNNING and trial.user_attrs.get("worker", "").endswith("-1")
        for trial in optuna.load_study(study_name=study, storage=storage).get_trials()
    ):
        assert time.time() < deadline, "worker 1 started no trial"
        time.sleep(0.2)
    slurm.run(
        "scontrol", "requeue", f"{array}_1"
    )  # SIGTERM to the worker and its runs, then SLURM requeues it
    returncode, stdout, stderr = finished(sweep, timeout=300)
    assert returncode == 0, stderr + stdout

    trials = optuna.load_study(study_name=study, storage=storage).get_trials()
    interrupted = [trial for trial in trials if trial.user_attrs.get("interrupted")]
    counted = [trial for trial in trials if trial not in interrupted]
    assert [trial.state for trial in interrupted] == [TrialState.FAIL], trials
    assert interrupted[0].user_attrs["worker"].endswith("-1")
    # the trials add up: four, two a worker, the interrupted one run again by its requeued worker
    assert len(counted) == 4 and all(trial.state == TrialState.COMPLETE for trial in counted)
    workers = sorted(trial.user_attrs["worker"][-2:] for trial in counted)
    assert workers == ["-0", "-0", "-1", "-1"]

    # the report, from the login node: only the storage is needed
    report = harness(slurm.environment, "tune-report", "--study", study, "--storage", postgres.url,
                     "--out", tmp_path / "report")  # fmt: skip
    returncode, stdout, _ = finished(report)
    assert returncode == 0 and f"study '{study}': 5 trials, 4 complete, 1 fail" in stdout, stdout


def bad_template(tmp_path: Path) -> list[str]:
    template = tmp_path / "template.sh"
    template.write_text(
        "#!/bin/bash\n#SBATCH --job-name=x\n# {{command}} in a comment is not the line\necho\n"
    )
    return ["--slurm-template", str(template)]


@pytest.mark.parametrize(
    "flags, error",
    [
        (
            lambda tmp_path: ["--slurm-partition", "nope"],
            "--slurm-partition nope: the cluster has no such partition",
        ),
        (bad_template, "needs {{command}} once"),
        (lambda tmp_path: ["--slurm-time", "5:00"], "--slurm-time 5:00 leaves no time to train"),
    ],
    ids=["partition", "template", "time-limit"],
)
def test_bad_cluster_input_is_one_error_line_and_submits_nothing(slurm, tmp_path, flags, error):
    out = tmp_path / "out"
    command = [*ONE_RUN, "--out", out]
    before = slurm.jobs()
    returncode, _, stderr = finished(harness(slurm.environment, *command, *flags(tmp_path)))
    assert returncode == 2 and stderr.startswith("error: ") and len(stderr.splitlines()) == 1, (
        stderr
    )
    assert error in stderr and not out.exists() and set(slurm.jobs()) <= set(before)


def test_no_sbatch_on_the_path_is_one_error_line(tmp_path):
    out = tmp_path / "out"
    command = [*ONE_RUN, "--out", out]
    returncode, _, stderr = finished(harness({**os.environ, "PATH": str(tmp_path)}, *command))
    assert returncode == 2 and stderr.startswith("error: no sbatch on the PATH"), stderr
    assert len(stderr.splitlines()) == 1 and not out.exists()


def test_a_database_that_cannot_be_reached_is_one_error_line_and_submits_nothing(slurm, tmp_path):
    url = f"postgresql://postgres:secret@127.0.0.1:{free_port()}/postgres"
    command = [
        "tune",
        "ppo_fc",
        *PROBES,
        "--trials",
        "2",
        "--workers",
        "2",
        "--storage",
        url,
        *ON_SLURM,
    ]
    before = slurm.jobs()
    returncode, _, stderr = finished(
        harness(slurm.environment, *command, "--out", tmp_path / "runs")
    )
    assert returncode == 2 and stderr.startswith(
        "error: the database postgresql://postgres:***@127.0.0.1:"
    ), stderr
    assert (
        "cannot be reached" in stderr and len(stderr.splitlines()) == 1 and "secret" not in stderr
    )
    assert not (tmp_path / "runs").exists() and set(slurm.jobs()) <= set(before)


def test_a_report_of_a_folder_no_submission_made_is_one_error_line(tmp_path):
    returncode, _, stderr = finished(harness(dict(os.environ), "report", tmp_path))
    assert returncode == 2 and len(stderr.splitlines()) == 1, stderr
    assert stderr.startswith(
        f"error: {tmp_path} holds no benchmark submitted with --launcher slurm"
    )
