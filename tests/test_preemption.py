"""Runs that survive a cluster: the schedulers' stop signals, checkpoints by wall-clock time, and a
requeued command that resumes itself (docs/outputs.md, "Preemption and faults")."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from common import checkpoints
from tests.helpers import REPO, each_in_one_process, read_scalars

QUICK = ["--no-progress", "--eval-episodes", "0", "--checkpoint-minutes", "0"]
SCRIPT_FLAGS = {
    "ppo_fc.py": ["--async-envs"],
    "ppo_lstm.py": ["--env-id", "CartPole-v1", "--num-envs", "2", "--num-steps", "64"],
    "ppo_transformer.py": ["--env-id", "CartPole-v1", "--num-envs", "2", "--num-steps", "64"],
    "ddpg.py": ["--save-buffer", "--learning-starts", "100", "--buffer-size", "5000"],
}


def start(script: str, runs: Path, *flags: str) -> subprocess.Popen:
    """`script` with `flags`, for a long time, in a process group of its own (a job's processes)."""
    command = [sys.executable, script, "--total-timesteps", "100000000", "--run-dir", str(runs)]
    return subprocess.Popen(
        [*command, *QUICK, *flags],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_until_training(process: subprocess.Popen, runs: Path, seconds: float = 0.5) -> None:
    """Until the run has logged an iteration, then `seconds` more."""
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        events = list(runs.glob("*/events.*"))
        if events and events[0].stat().st_size > 2000:  # past the hyperparameters table
            time.sleep(seconds)
            return
        time.sleep(0.2)
    raise AssertionError(f"the run did not start: {process.communicate()[1][-3000:]}")


@pytest.mark.parametrize(
    "script, sent",
    [
        ("ppo_fc.py", signal.SIGTERM),
        ("ppo_fc.py", signal.SIGUSR1),
        ("ppo_fc.py", signal.SIGHUP),
        ("ppo_lstm.py", signal.SIGTERM),
        ("ppo_transformer.py", signal.SIGTERM),
        ("ddpg.py", signal.SIGTERM),
    ],
)
def test_a_stop_signal_to_the_job_ends_the_iteration_with_a_checkpoint_and_its_status(
    tmp_path, script, sent
):
    # Sent to every process of the job, env workers included, as SLURM does; no --save-model, no --checkpoint-every.
    runs = tmp_path / "runs"
    process = start(script, runs, "--no-save-model", *SCRIPT_FLAGS[script])
    wait_until_training(process, runs)
    os.killpg(process.pid, sent)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + sent, stderr[-3000:]
    assert f"interrupt: {sent.name}: stopping after this iteration" in stderr
    assert "interrupted: stopped after the iteration" in stderr and "Traceback" not in stderr
    (run,) = runs.iterdir()
    checkpoint = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)
    assert (run / "checkpoints" / f"step_{checkpoint['global_step']}.pt").is_file()
    # TensorBoard holds every iteration up to the checkpoint, which is the state after the last one
    logged = read_scalars(run)["charts/learning_rate"]
    if script != "ddpg.py":
        assert logged[-1][0] == checkpoint["global_step"] > 0
    else:  # logged every 100 steps
        assert checkpoint["global_step"] - 100 < logged[-1][0] <= checkpoint["global_step"]
        assert checkpoint["buffer"] == f"buffer_step_{checkpoint['global_step']}.npz"
        assert (run / "checkpoints" / checkpoint["buffer"]).is_file()


def test_a_second_signal_stops_at_once_but_the_first_one_s_duplicate_does_not():
    # In a process of its own: pytest-xdist's workers may run tests outside the main thread, where no handler runs.
    script = """
import os, signal, time
from common import interrupt
from common.interrupt import GracefulInterrupt, Interrupted

def stopped(*signals, pause=0.0):
    sent_all = False
    try:
        with GracefulInterrupt():
            for sent in signals:
                os.kill(os.getpid(), sent)  # its handler runs before the next line
                time.sleep(pause)
            sent_all = True
    except Interrupted as exc:  # at once (not sent_all), or as the block ends (after the iteration)
        return sent_all, exc.exit_status

# SLURM's SIGTERM and torchrun's agent passing it on: one request, which ends the block with its status
assert stopped(signal.SIGTERM, signal.SIGTERM) == (True, 143)
assert stopped(signal.SIGTERM, signal.SIGTERM, signal.SIGINT) == (False, 143)  # then Ctrl-C: at once
assert stopped(signal.SIGHUP) == (True, 129)
interrupt.SAME_REQUEST_SECONDS = 0.1
assert stopped(signal.SIGUSR1, signal.SIGUSR1, pause=0.2) == (False, 138)  # later: a second request
print("ok")
"""
    completed = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True
    )
    assert completed.stdout.strip() == "ok", completed.stderr[-3000:]


def test_a_stop_signal_while_evaluating_a_checkpoint_ends_it_with_its_status(tmp_path):
    runs = tmp_path / "runs"
    trained = subprocess.run(
        [sys.executable, "ppo_fc.py", "--total-timesteps", "1024", "--run-dir", str(runs), *QUICK],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    (run,) = runs.iterdir()
    command = [
        sys.executable,
        "ppo_fc.py",
        "--eval-checkpoint",
        str(run / "checkpoints" / "latest.pt"),
    ]
    command += ["--eval-episodes", "100000", "--no-progress", "--run-dir", str(runs)]
    process = subprocess.Popen(command, cwd=REPO, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while len(list(runs.iterdir())) < 2 and time.time() < deadline:  # its run folder
        time.sleep(0.2)
    time.sleep(2)
    process.send_signal(signal.SIGTERM)
    try:
        _, stderr = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # once under load the signal's exception did not end it
        process.kill()
        raise AssertionError(
            f"SIGTERM did not end it: {process.communicate()[1][-3000:]}"
        ) from None
    assert process.returncode == 143 and "Traceback" not in stderr, stderr[-3000:]


LOST_IN_A_FINALIZER = """
import os, signal, sys
from common.cli import exit_status

class Finalised:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs here, and Python drops its exception
        for _ in range(1000):
            pass

def run():
    Finalised()
    print("the signal's exception was lost", file=sys.stderr, flush=True)
    while True:
        pass

sys.exit(exit_status(run))
"""


def test_a_stop_request_whose_exception_is_lost_still_ends_the_run_with_its_status():
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, "-c", LOST_IN_A_FINALIZER],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Exception ignored" in completed.stderr and "was lost" in completed.stderr
    assert completed.returncode == 143 and time.monotonic() - started < 30, completed.stderr[-2000:]


def test_a_stop_signal_to_the_benchmark_harness_reaches_its_runs(tmp_path):
    # To the harness alone (`kill PID`, `docker stop`): it passes the signal on, starts nothing more, and ends with
    # the signal's status once its runs have written their checkpoints.
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "benchmark",
        "run",
        "--scripts",
        "ppo_fc",
        "--envs",
        "CartPole-v1",
    ]
    command += [
        "--seeds",
        "1",
        "2",
        "--total-timesteps",
        "100000000",
        "--no-baselines",
        "--workers",
        "1",
    ]
    command += ["--out", str(out)]
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 180
    # until the run has logged an iteration (past the hyperparameters table), then a little more
    while time.time() < deadline and not any(
        events.stat().st_size > 2000 for events in out.rglob("events.*")
    ):
        time.sleep(0.2)
    time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr[-3000:]
    assert "benchmark: SIGTERM: stopping every running run" in stderr and "Traceback" not in stderr
    runs = {path.parent.parent for path in out.rglob("checkpoints/latest.pt")}
    (run,) = runs  # seed 2 never started
    assert run.name == "CartPole-v1__ppo_fc__1"  # the harness names it (benchmark.jobs.RESUMABLE)
    checkpoint = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)
    assert read_scalars(run)["charts/learning_rate"][-1][0] == checkpoint["global_step"] > 0
    assert "FAILED: interrupted: stopped after the iteration" in stdout


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
TWO_RANKS = [
    "ppo_fc.py",
    "--num-steps",
    "64",
    "--total-timesteps",
    str(30 * 512),
    "--checkpoint-every",
    "4",
]
TWO_RANKS += ["--checkpoint-minutes", "0", "--no-progress", "--eval-episodes", "0"]


def worker_of_rank(torchrun: subprocess.Popen, rank: int) -> int:
    """The pid of torchrun's worker process of `rank`."""
    for child in Path(f"/proc/{torchrun.pid}/task/{torchrun.pid}/children").read_text().split():
        if f"RANK={rank}".encode() in Path(f"/proc/{child}/environ").read_bytes().split(b"\0"):
            return int(child)
    raise AssertionError(f"no worker of rank {rank}")


def episodes_and_parameters(run: Path) -> tuple[list, dict]:
    scalars = read_scalars(run)
    checkpoint = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)
    return scalars["charts/episodic_return"], checkpoint["model"]


def test_a_killed_worker_restarted_by_torchrun_goes_on_from_the_checkpoint_in_the_same_run(
    tmp_path,
):
    # `--max-restarts 1` starts every worker again, with the same command: `--resume auto` finds the run's latest.pt.
    whole = subprocess.run([*TORCHRUN, *TWO_RANKS, "--run-dir", str(tmp_path / "whole")], cwd=REPO,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert whole.returncode == 0, whole.stderr[-3000:]
    runs = tmp_path / "runs"
    command = [*TORCHRUN, "--max-restarts", "1", *TWO_RANKS, "--run-dir", str(runs)]
    command += ["--run-name", "restarted", "--resume", "auto"]
    process = subprocess.Popen(command, cwd=REPO, stderr=subprocess.PIPE, text=True)
    latest = runs / "restarted" / "checkpoints" / "latest.pt"
    deadline = time.time() + 120
    while (
        time.time() < deadline
        and not (runs / "restarted" / "checkpoints" / "step_4096.pt").is_file()
    ):
        time.sleep(0.1)
    time.sleep(1)  # past the checkpoint
    os.kill(worker_of_rank(process, 1), signal.SIGKILL)
    killed_at = time.time()
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr[-3000:]
    # the restarted workers went on from a checkpoint: they did not write the first one again
    assert (runs / "restarted" / "checkpoints" / "step_4096.pt").stat().st_mtime < killed_at
    assert len(list((runs / "restarted").glob("events.*"))) == 2
    assert stderr.count("interrupt:") <= 1 and list(runs.iterdir()) == [runs / "restarted"]
    assert torch.load(latest, weights_only=True)["global_step"] == 30 * 512
    (whole_run,) = (tmp_path / "whole").iterdir()
    episodes, parameters = episodes_and_parameters(runs / "restarted")
    whole_episodes, whole_parameters = episodes_and_parameters(whole_run)
    assert episodes == whole_episodes
    for name, value in whole_parameters.items():
        torch.testing.assert_close(parameters[name], value, rtol=0, atol=0, msg=name)


def test_a_stop_signal_to_one_rank_stops_both_after_the_same_iteration(tmp_path):
    runs = tmp_path / "runs"
    flags = ["ppo_fc.py", "--total-timesteps", "100000000", "--run-dir", str(runs), *QUICK]
    # PYTHONFAULTHANDLER: if the ranks do not stop, SIGABRT makes each print where its threads are
    environment = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    process = subprocess.Popen(
        [*TORCHRUN, *flags], cwd=REPO, stderr=subprocess.PIPE, text=True, env=environment
    )
    wait_until_training(process, runs)
    workers = [worker_of_rank(process, rank) for rank in (0, 1)]
    os.kill(workers[1], signal.SIGTERM)
    try:
        _, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        for worker in workers:
            os.kill(worker, signal.SIGABRT)
        raise AssertionError(
            f"the ranks did not stop: {process.communicate(timeout=60)[1][-6000:]}"
        ) from None
    assert stderr.count("interrupted: stopped after the iteration") == 2, stderr[-3000:]
    assert "exitcode  : 143" in stderr or "exitcode: 143" in stderr.replace(" ", "")
    (run,) = runs.iterdir()
    checkpoint = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)
    assert (
        checkpoint["global_step"] == checkpoint["iteration"] * 1024
        and len(checkpoint["ranks"]) == 2
    )
    assert read_scalars(run)["charts/learning_rate"][-1][0] == checkpoint["global_step"]


def test_the_same_command_starts_a_run_then_continues_it_after_a_kill(tmp_path):
    # A requeued job: the same command each time. Killed before its first checkpoint, it starts the run again in its
    # folder; killed after one, it goes on from there; the run ends with what an uninterrupted run logs.
    runs = tmp_path / "runs"
    flags = ["--env-id", "Probe1-v0", "--num-steps", "128", "--total-timesteps", str(24 * 512)]
    flags += [
        "--checkpoint-every",
        "6",
        "--checkpoint-minutes",
        "0",
        "--no-progress",
        "--eval-episodes",
        "0",
    ]
    command = [
        sys.executable,
        "ppo_fc.py",
        *flags,
        "--run-dir",
        str(runs),
        "--run-name",
        "job",
        "--resume",
        "auto",
    ]
    folder = runs / "job"
    for ready in (
        lambda: any(folder.glob("events.*")),  # before any checkpoint
        lambda: (folder / "checkpoints" / "step_6144.pt").is_file(),
    ):
        process = subprocess.Popen(command, cwd=REPO, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while not ready() and time.time() < deadline:
            time.sleep(0.02)
        process.kill()
        process.wait()
    assert not (folder / "checkpoints" / "step_12288.pt").exists()
    started = time.time()
    last = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert last.returncode == 0, last.stderr[-3000:]
    assert (folder / "checkpoints" / "step_6144.pt").stat().st_mtime < started  # went on from it
    assert list(runs.iterdir()) == [folder]
    whole = subprocess.run([sys.executable, "ppo_fc.py", *flags, "--run-dir", str(tmp_path / "whole")], cwd=REPO,
                           capture_output=True, text=True)  # fmt: skip
    assert whole.returncode == 0, whole.stderr[-3000:]
    (whole_run,) = (tmp_path / "whole").iterdir()
    episodes, parameters = episodes_and_parameters(folder)
    whole_episodes, whole_parameters = episodes_and_parameters(whole_run)
    assert episodes == whole_episodes  # TensorBoard: each step once, over three writers
    for name, value in whole_parameters.items():
        torch.testing.assert_close(parameters[name], value, rtol=0, atol=0, msg=name)
    # the run has ended (evaluated, with --eval-episodes 0): the same command does nothing, writes nothing
    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 0 and "has ended: nothing is left to do" in again.stderr, (
        again.stderr
    )
    assert episodes_and_parameters(folder)[0] == whole_episodes
    assert len(list(folder.glob("events.*"))) == 3


def test_the_same_command_evaluates_a_run_killed_during_its_evaluation_once(tmp_path):
    # Killed after its last checkpoint, before its evaluation was done (or before a benchmark stored it): the same
    # command trains no more, evaluates it once, then finds it ended.
    flags = ["--env-id", "Pendulum-v1", "--num-steps", "256", "--total-timesteps", "2048"]
    flags += [
        "--eval-episodes",
        "60",
        "--no-progress",
        "--run-dir",
        str(tmp_path),
        "--run-name",
        "job",
    ]
    command = [sys.executable, "ppo_fc.py", *flags, "--resume", "auto"]
    latest = tmp_path / "job" / "checkpoints" / "latest.pt"
    process = subprocess.Popen(command, cwd=REPO, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not latest.is_file() and time.time() < deadline:
        time.sleep(0.02)
    process.kill()
    assert process.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    assert "evaluation" not in torch.load(latest, weights_only=True)
    training = read_scalars(latest.parent.parent)["charts/episodic_return"]

    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 0 and "it is evaluated now" in again.stderr, again.stderr[-3000:]
    scalars = read_scalars(latest.parent.parent)
    assert scalars["charts/episodic_return"] == training  # no step trained again
    evaluated = scalars["eval/episodic_return"]
    assert len(evaluated) == 60 and {step for step, _ in evaluated} == {2048}
    recorded = torch.load(latest, weights_only=True)["evaluation"]
    assert recorded == pytest.approx([value for _, value in evaluated])

    last = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert last.returncode == 0 and "nothing is left to do" in last.stderr, last.stderr[-3000:]
    assert f"eval return {np.mean(recorded):.2f}" in last.stdout
    assert read_scalars(latest.parent.parent)["eval/episodic_return"] == evaluated  # not twice


NAMELESS = [None, "a/b", ".."]


@pytest.fixture(scope="module")
def nameless_resumes(tmp_path_factory) -> dict:
    """`ppo_fc.py --resume auto` with each of NAMELESS as its --run-name (None: none), all in one process: by name, the
    completed call and the --run-dir it was given."""
    folder = tmp_path_factory.mktemp("nameless")
    flag_lists = [["--run-name", name] if name else [] for name in NAMELESS]
    done = each_in_one_process(["ppo_fc.py", "--resume", "auto"], flag_lists, folder)
    return {name: done[tuple(flags)] for name, flags in zip(NAMELESS, flag_lists, strict=True)}


@pytest.mark.parametrize("name", NAMELESS)
def test_resume_auto_needs_a_run_name(nameless_resumes, name):
    completed, run_dir = nameless_resumes[name]
    assert completed.returncode == 2 and completed.stderr.startswith(
        "error: --resume auto needs --run-name"
    )
    assert len(completed.stderr.strip().splitlines()) == 1 and not run_dir.exists()


def test_checkpoints_by_wall_clock_keep_latest_alone(tmp_path, monkeypatch):
    import ppo_fc

    # due after every iteration
    args = ppo_fc.Args(env_id="Probe1-v0", num_steps=128, total_timesteps=8 * 512, checkpoint_minutes=1e-6,
                       save_model=False, run_dir=str(tmp_path), progress=False, eval_episodes=0)  # fmt: skip
    written = []
    save = checkpoints.save
    monkeypatch.setattr(
        checkpoints, "save", lambda *a, **k: written.append((a[3], a[4])) or save(*a, **k)
    )
    result = ppo_fc.train(args)
    assert written == [(512 * i, False) for i in range(1, 9)]
    assert [p.name for p in (result.run_dir / "checkpoints").iterdir()] == ["latest.pt"]
    assert torch.load(result.checkpoint, weights_only=True)["global_step"] == 8 * 512


DDPG_JOB = dict(
    learning_starts=100, buffer_size=500, batch_size=64, hidden_size=32, eval_episodes=0
)


@pytest.mark.parametrize(
    "steps, checkpoints_due",
    [
        (800, ["--checkpoint-minutes", "0"]),  # the stop's checkpoint alone
        # a checkpoint due after every iteration, the stop's too: latest.pt alone by time, step_N.pt by iterations
        (400, ["--checkpoint-minutes", "1e-6"]),
        (400, ["--checkpoint-minutes", "0", "--checkpoint-every", "1"]),
    ],
    ids=["stop-only", "due-by-time", "due-by-iterations"],
)  # fmt: skip
def test_ddpg_stopped_without_save_buffer_resumes_as_the_uninterrupted_run(
    tmp_path, steps, checkpoints_due
):
    # A requeued job: SIGTERM part-way, then the same command. Without --save-buffer periodic checkpoints hold no
    # buffer, but the stop's, even where one was due anyway, must: a run resumed with an empty buffer is another run.
    import ddpg

    settings = {**DDPG_JOB, "total_timesteps": steps}
    runs, flags = tmp_path / "runs", []
    for name, value in settings.items():
        flags += ["--" + name.replace("_", "-"), str(value)]
    command = [sys.executable, "ddpg.py", *flags, *checkpoints_due, "--no-progress"]
    command += ["--run-dir", str(runs), "--run-name", "job", "--resume", "auto"]
    process = subprocess.Popen(
        command, cwd=REPO, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        events = list((runs / "job").glob("events.*"))
        if (
            events and events[0].stat().st_size > 1950
        ):  # step 200 logged: learning, the buffer wrapped
            break
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr[-3000:]
    folder = runs / "job" / "checkpoints"
    stopped = torch.load(folder / "latest.pt", weights_only=True)
    step = stopped["global_step"]
    assert 100 < step < steps and (folder / f"step_{step}.pt").is_file()
    assert stopped["buffer"] == f"buffer_step_{step}.npz"
    assert [path.name for path in folder.glob("*.npz")] == [stopped["buffer"]]  # one on disk
    resumed = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert resumed.returncode == 0 and "empty buffer" not in resumed.stderr, resumed.stderr[-3000:]
    assert not list(folder.glob("*.npz"))  # the end's checkpoint, without --save-buffer, has none
    whole = ddpg.train(ddpg.Args(**settings, run_dir=str(tmp_path / "whole"), progress=False))
    episodes, parameters = episodes_and_parameters(runs / "job")
    whole_episodes, whole_parameters = episodes_and_parameters(whole.run_dir)
    assert len(episodes) == steps // 200 and episodes == whole_episodes
    for name, value in whole_parameters.items():
        torch.testing.assert_close(parameters[name], value, rtol=0, atol=0, msg=name)
