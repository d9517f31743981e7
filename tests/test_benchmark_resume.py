"""A benchmark that outlives a session: the same `python -m benchmark run` command after a stop (Ctrl-C, SIGTERM, a
killed machine) runs only what is missing and continues the runs that were cut, exactly (docs/benchmark.md)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, learnt

# A tiny suite: ppo_fc, then ddpg, one at a time. ddpg's checkpoint at step 600 (with its buffer: exact after a
# SIGKILL too) says when to stop it: past its random steps, well before its end (1,448 steps of updates to go).
TINY_SUITE = ["run", "--scripts", "ppo_fc", "ddpg", "--envs", "Pendulum-v1", "--seeds", "1"]
TINY_SUITE += ["--total-timesteps", "2048", "--eval-episodes", "2", "--workers", "1"]
TINY_SUITE += ["--script-flags", "ddpg=--learning-starts 300 --buffer-size 5000 --hidden-size 64"]
TINY_SUITE += ["--script-flags", "ddpg=--checkpoint-every 600 --save-buffer"]
TINY_SUITE += ["--script-flags", "ppo_fc=--num-steps 256"]


def suite(out: Path, **popen: object) -> subprocess.Popen:
    command = [sys.executable, "-m", "benchmark", *TINY_SUITE, "--out", str(out)]
    return subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
    )


# one xdist worker for the module: its uninterrupted suite is made once
pytestmark = pytest.mark.xdist_group("benchmark_resume")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[list[dict], dict[str, list]]:
    out = tmp_path_factory.mktemp("uninterrupted")
    whole = suite(out)
    assert whole.wait(timeout=600) == 0, whole.communicate()[1][-3000:]
    return learnt(out)


@pytest.mark.parametrize("stop", ["SIGTERM to the harness", "SIGKILL to every process"])
def test_the_same_suite_command_after_a_stop_runs_what_is_missing_and_continues_what_was_cut(
    tmp_path, uninterrupted, stop
):
    out = tmp_path / "cut"
    first = suite(out, start_new_session=True)
    deadline = time.time() + 300
    # until ddpg, the second job, has written its first checkpoint: ppo_fc is then stored as finished
    while not any(out.glob("runs/ddpg__*/*/checkpoints/latest.pt")) and time.time() < deadline:
        time.sleep(0.02)
    assert first.poll() is None, "the benchmark ended before it could be stopped"
    if stop.startswith("SIGTERM"):
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == 143
        # the report of what finished: ppo_fc's row; ddpg's cut run is left out, not failed
        partial = json.loads((out / "results.json").read_text())
        assert [row["label"] for row in partial["rows"]] == ["ppo_fc"] and not partial["rows"][0][
            "failed_seeds"
        ]
        assert (
            "stopped part-way by SIGTERM: 1 runs cut or not started"
            in (out / "results.md").read_text()
        )
    else:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=60)
    stdout = first.communicate()[0]
    assert "(ppo_fc): " in stdout and "stored in" in stdout, stdout

    # Part-way, --stored-only reports what is stored and trains nothing: the cut ddpg run is left as it was, and the
    # baselines are not started; the env measurements (never stored, quick) still run.
    (cut_run,) = (out / "runs").glob("ddpg__*/*")
    cut_files = sorted((path.name, path.stat().st_size) for path in cut_run.rglob("*"))
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmark",
            *TINY_SUITE,
            "--out",
            str(out),
            "--stored-only",
            "--baselines",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.returncode == 0 and "benchmark: 2 jobs" in report.stdout, report.stderr[-3000:]
    partial = json.loads((out / "results.json").read_text())
    assert [row["label"] for row in partial["rows"]] == ["ppo_fc"]
    assert (
        sorted(job["kind"] for job in partial["jobs"] if job["returncode"] is not None)
        == ["raw-env"] * 2
    )
    left_out = next(line for line in partial["header"] if line.startswith("- --stored-only"))
    listed = left_out.split("(", 1)[1].split(")")[0].split(", ")
    assert sorted(job_id.split("__")[0] for job_id in listed) == ["ddpg", "sb3_ppo", "sb3_td3"], (
        left_out
    )
    assert sorted((path.name, path.stat().st_size) for path in cut_run.rglob("*")) == cut_files

    again = suite(out)
    stdout, stderr = again.communicate(timeout=600)
    assert again.returncode == 0, stderr[-3000:]
    assert "[stored] ppo_fc__" in stdout and "benchmark: 1 jobs" in stdout, stdout
    (ddpg_run,) = (out / "runs").glob("ddpg__*/*")
    sessions = len(list(ddpg_run.glob("events.*")))
    assert sessions == 2, f"the cut run went on in its own folder, as a second session: {sessions}"
    assert learnt(out) == uninterrupted
