"""What a run hands its user, read back with the client that reads it: wandb's offline run file against TensorBoard's
reader, videos, and trajectory recordings after a kill, a resume, and a long run."""

import json
import os
import signal
import subprocess
import sys
import time
from argparse import Namespace
from collections import Counter
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from common import evaluation
from common.envs import evaluation_env
from common.trajectories import load_trajectories, split_episodes
from common.wandb_file import TransactionLog
from tests.helpers import (
    REPO,
    assert_one_error_line,
    read_scalars,
    read_wandb_runs,
    run_in_one_process,
    run_script,
)

OFFLINE = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "SDL_VIDEODRIVER": "dummy"}
EPISODE_KEYS = ("charts/episodic_return", "charts/episodic_length")


def wandb_env(tmp_path: Path) -> dict[str, str]:
    """Offline wandb, its settings and caches in the test's folder (tests run in parallel)."""
    folders = {
        name: str(tmp_path / "wandb-home" / name)
        for name in ("config", "cache", "data", "artifacts")
    }
    return {
        **OFFLINE,
        "WANDB_CONFIG_DIR": folders["config"],
        "WANDB_CACHE_DIR": folders["cache"],
        "WANDB_DATA_DIR": folders["data"],
        "WANDB_ARTIFACT_DIR": folders["artifacts"],
    }


def test_track_without_a_wandb_key_is_one_error_line_and_leaves_no_run_folder(tmp_path):
    # online (no WANDB_MODE), no API key and no terminal to ask for one: wandb raises its UsageError
    environment = {key: value for key, value in os.environ.items() if not key.startswith("WANDB_")}
    environment |= wandb_env(tmp_path) | {"HOME": str(tmp_path), "WANDB_SILENT": "true"}
    del environment["WANDB_MODE"]
    runs = tmp_path / "runs"
    command = [
        sys.executable,
        "ppo_fc.py",
        "--track",
        "--run-dir",
        str(runs),
        "--total-timesteps",
        "1024",
    ]
    done = subprocess.run(
        command, cwd=REPO, env=environment, stdin=subprocess.DEVNULL, capture_output=True, text=True
    )
    assert_one_error_line(done, "--track: wandb: No API key configured")
    assert "WANDB_MODE=offline" in done.stderr
    assert not any(runs.iterdir())


def steps_by_key(rows: list[dict], keys) -> dict[str, Counter]:
    """For each key, how many rows hold it at each global step."""
    return {key: Counter(row["global_step"] for row in rows if key in row) for key in keys}


def tensorboard_steps(scalars: dict, keys) -> dict[str, Counter]:
    return {key: Counter(step for step, _ in scalars.get(key, [])) for key in keys}


def test_wandb_history_holds_what_tensorboard_holds_once_each(tmp_path):
    runs = tmp_path / "runs"
    flags = [
        "--env-id",
        "CartPole-v1",
        "--total-timesteps",
        "4096",
        "--run-dir",
        str(runs),
        "--no-progress",
    ]
    flags += ["--track", "--capture-video", "--video-every", "10", "--eval-episodes", "3"]
    completed = run_script("ppo_fc.py", *flags, env=wandb_env(tmp_path))
    assert completed.returncode == 0, completed.stderr[-3000:]
    (run,) = runs.iterdir()
    # no copy of the event file, nested or not
    assert len(list(run.rglob("events.out.tfevents.*"))) == 1
    assert not list(run.glob("wandb/*/files/**/wandb"))
    (tracked,) = read_wandb_runs(run)
    scalars = read_scalars(run)
    rows = tracked.history
    assert all("global_step" in row for row in rows)
    assert tracked.name == run.name and tracked.config["env_id"] == "CartPole-v1"
    assert tracked.config["total_timesteps"] == 4096 and tracked.config["track"] is True

    # Every episode once, with its return, length and step.
    episodes = Counter(
        (row["global_step"], row["charts/episodic_return"], row["charts/episodic_length"])
        for row in rows
        if "charts/episodic_return" in row
    )
    logged = Counter(
        (step, value, length)
        for (step, value), (_, length) in zip(
            scalars["charts/episodic_return"], scalars["charts/episodic_length"], strict=True
        )
    )
    assert episodes == logged and sum(episodes.values()) > 50

    # One row per iteration holding all its scalars, at the steps TensorBoard has them.
    iteration_rows = [row for row in rows if "charts/SPS" in row]
    assert [row["global_step"] for row in iteration_rows] == [
        step for step, _ in scalars["charts/SPS"]
    ]
    assert len(iteration_rows) == 8
    for key in (
        "losses/value_loss",
        "charts/learning_rate",
        "system/rss_mb",
        "losses/explained_variance",
    ):
        assert [row[key] for row in iteration_rows] == pytest.approx(
            [value for _, value in scalars[key]]
        )

    # Evaluation returns, at the last training step.
    evaluation = [
        (row["global_step"], row["eval/episodic_return"])
        for row in rows
        if "eval/episodic_return" in row
    ]
    # whole returns: exact
    assert evaluation == scalars["eval/episodic_return"] and len(evaluation) == 3

    # Each video once.
    # wandb's video-file rows
    videos = [row["videos/sha256"] for row in rows if "videos/path" in row]
    assert len(videos) == len(set(videos)) == len(list(run.glob("videos/*.mp4"))) >= 2


def stop_when(process: subprocess.Popen, ready, timeout: float = 240, every: float = 0.05) -> None:
    """SIGKILL `process` at the first moment `ready()` holds, checked every `every` seconds while the process is
    stopped (SIGSTOP)."""
    deadline = time.time() + timeout
    while time.time() < deadline and process.poll() is None:
        time.sleep(every)
        os.kill(process.pid, signal.SIGSTOP)
        if ready():
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
            return
        os.kill(process.pid, signal.SIGCONT)
    raise AssertionError(
        f"the run ended or ran out of time before it could be killed: {process.communicate()[1]}"
    )


def killed_recording(script: str, flags: list[str], recording: Path) -> Path:
    """`recording`: what a long run of `script` with `flags` recorded, SIGKILLed once it had written two files."""
    command = [
        sys.executable,
        script,
        *flags,
        "--total-timesteps",
        "200000",
        "--save-trajectories",
        str(recording),
    ]
    process = subprocess.Popen(command, cwd=REPO, stderr=subprocess.PIPE, text=True)
    stop_when(process, lambda: len(list(recording.glob("steps_*.npz"))) >= 2)
    return recording


def test_a_run_killed_between_checkpoints_and_resumed_logs_each_step_once_and_records_each_step_once(
    tmp_path,
):
    # Probe1's episodes last one step: 512 wandb rows an iteration, so wandb's writer has written rows past the
    # checkpoint by the time of the kill (it writes whole 32 KiB blocks). Checkpoints every 20 iterations of 128 steps
    # leave the recording's files of 2,048 steps a file that starts past the checkpoint.
    runs, recording = tmp_path / "runs", tmp_path / "recording"
    flags = [
        "--env-id",
        "Probe1-v0",
        "--total-timesteps",
        str(48 * 512),
        "--checkpoint-every",
        "20",
    ]
    flags += ["--run-dir", str(runs), "--no-progress", "--eval-episodes", "0", "--track"]
    flags += ["--save-trajectories", str(recording)]
    env = {**os.environ, **wandb_env(tmp_path)}
    process = subprocess.Popen(
        [sys.executable, "ppo_fc.py", *flags], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True
    )

    def checkpoint_step() -> int:
        return max(
            (int(p.stem.removeprefix("step_")) for p in runs.glob("*/checkpoints/step_*.pt")),
            default=0,
        )

    def past_the_checkpoint() -> bool:
        killed = read_wandb_runs(runs)
        written = [row["global_step"] for run in killed for row in run.history]
        files = [int(p.stem.removeprefix("steps_")) for p in recording.glob("steps_*.npz")]
        step = checkpoint_step()
        return (
            step > 0
            and max(written, default=0) >= step + 4 * 512
            and max(files, default=0) * 4 >= step
        )

    stop_when(process, past_the_checkpoint, every=0.3)
    (run,) = runs.iterdir()
    resumed = run_script("ppo_fc.py", "--resume", str(run / "checkpoints" / "latest.pt"), "--track", "--no-progress",
                         env=wandb_env(tmp_path))  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    first, second = read_wandb_runs(run)
    assert first.id == second.id and first.name == second.name == run.name
    # what TensorBoard shows: each step once (the resumed writer's purge_step); wandb's two parts: the same, once
    scalars = read_scalars(run)
    keys = (*EPISODE_KEYS, "charts/SPS", "losses/value_loss")
    assert steps_by_key(first.history + second.history, keys) == tensorboard_steps(scalars, keys)
    assert len(scalars["charts/episodic_return"]) == 48 * 512  # the whole run, every episode once

    # The recording: every step once, in order, each env's steps the whole run's.
    data = load_trajectories(recording)
    assert data["/rewards"].shape == (4, 48 * 128)
    returns = [episode.total_reward for episode in split_episodes(data) if episode.finished]
    assert len(returns) == 48 * 512
    assert (data["/observations"] == 0).all()  # Probe1's observation


def test_two_ranks_send_every_rank_s_episodes_once_from_rank_0(tmp_path):
    runs = tmp_path / "runs"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "ppo_fc.py",
    ]
    command += [
        "--env-id",
        "CartPole-v1",
        "--total-timesteps",
        "4096",
        "--num-steps",
        "64",
        "--track",
    ]
    command += ["--run-dir", str(runs), "--no-progress", "--eval-episodes", "0"]
    completed = subprocess.run(
        command,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **wandb_env(tmp_path)},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    (run,) = runs.iterdir()
    (tracked,) = read_wandb_runs(tmp_path)  # one wandb run in all: rank 1 started none
    scalars = read_scalars(run)
    keys = (*EPISODE_KEYS, "charts/SPS", "perf/collective_seconds")
    assert steps_by_key(tracked.history, keys) == tensorboard_steps(scalars, keys)
    returns = Counter(
        row["charts/episodic_return"] for row in tracked.history if "charts/episodic_return" in row
    )
    assert returns == Counter(value for _, value in scalars["charts/episodic_return"])
    assert len(scalars["charts/SPS"]) == 4096 // (2 * 4 * 64)


def test_eval_checkpoint_records_videos_and_sends_them_to_a_wandb_run_of_its_own(tmp_path):
    runs = tmp_path / "runs"
    trained = run_script("ppo_fc.py", "--total-timesteps", "512", "--run-dir", str(runs), "--no-progress",
                         "--eval-episodes", "0")  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    (run,) = runs.iterdir()
    flags = [
        "--eval-checkpoint",
        str(run / "checkpoints" / "latest.pt"),
        "--eval-episodes",
        "3",
        "--run-dir",
    ]
    flags += [
        str(runs),
        "--capture-video",
        "--video-every",
        "1",
        "--track",
        "--wandb-project-name",
        "evals",
    ]
    evaluated = run_script("ppo_fc.py", *flags, env=wandb_env(tmp_path))
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    (evaluation,) = runs.glob("*__eval")
    videos = sorted(evaluation.glob("videos/*.mp4"))
    assert len(videos) == 3 and all(video.stat().st_size > 0 for video in videos)
    (tracked,) = read_wandb_runs(evaluation)
    assert tracked.name == evaluation.name and tracked.project == "evals"
    assert len([row for row in tracked.history if "eval/episodic_return" in row]) == 3
    assert len({row["videos/sha256"] for row in tracked.history if "videos/path" in row}) == 3
    assert not read_wandb_runs(run)  # the training run was not tracked, and stays so


def test_a_run_killed_while_recording_leaves_a_readable_recording(tmp_path):
    flags = ["--env-id", "CartPole-v1", "--run-dir", str(tmp_path / "runs"), "--no-progress"]
    data = load_trajectories(killed_recording("ppo_fc.py", flags, tmp_path / "recording"))
    assert data["/rewards"].shape[1] >= 2 * 2048 and data["/rewards"].shape[1] % 2048 == 0
    assert not np.isnan(data["/rewards"]).any()


def test_recording_300k_steps_holds_a_fixed_amount_of_memory(tmp_path):
    # Measured (2026-11-26, 16 envs): 339 MB at iteration 11 and 346 MB at the end. Holding every step, as the
    # recorder did before it wrote as it went, added about 150 MB over 300k steps.
    flags = [
        "--env-id",
        "CartPole-v1",
        "--total-timesteps",
        "300000",
        "--num-envs",
        "16",
        "--update-epochs",
        "1",
    ]
    flags += [
        "--num-minibatches",
        "1",
        "--run-dir",
        str(tmp_path / "runs"),
        "--no-progress",
        "--eval-episodes",
        "0",
    ]
    completed = run_script("ppo_fc.py", *flags, "--save-trajectories", str(tmp_path / "recording"))
    assert completed.returncode == 0, completed.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    memory = [value for _, value in read_scalars(run)["system/rss_mb"]]
    assert memory[-1] - memory[10] < 25, memory[::10]
    assert load_trajectories(tmp_path / "recording")["/rewards"].shape == (16, 299008 // 16)


SCRIPTS = ["ppo_fc.py", "ppo_lstm.py", "ppo_transformer.py", "ddpg.py"]


@pytest.fixture(scope="module")
def below_a_file(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Each script run with --save-trajectories below a file: the completed call, and the folder holding only the
    file before it."""
    folders = {script: tmp_path_factory.mktemp("below") for script in SCRIPTS}
    calls = []
    for script, folder in folders.items():
        (folder / "file").write_text("")
        env_id = "Pendulum-v1" if script == "ddpg.py" else "CartPole-v1"
        flags = ["--env-id", env_id, "--run-dir", str(folder / "runs"), "--no-progress"]
        calls.append([script, *flags, "--save-trajectories", str(folder / "file" / "recording")])
    return dict(
        zip(SCRIPTS, zip(run_in_one_process(calls), folders.values(), strict=True), strict=True)
    )


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_recording_below_a_file_is_one_error_line_with_nothing_written(below_a_file, script):
    completed, folder = below_a_file[script]
    assert completed.returncode == 2, completed.stderr[-3000:]
    assert (
        completed.stderr.startswith("error: --save-trajectories")
        and len(completed.stderr.splitlines()) == 1
    )
    assert "is a file, not a folder" in completed.stderr
    assert sorted(path.name for path in folder.iterdir()) == ["file"]


def test_a_checkpoint_writes_the_logs_up_to_it(tmp_path):
    # ddpg.py logs its iterations every 99 steps here (3 envs); a checkpoint between two is where a killed run resumes
    # from: the episodes logged before it must be in TensorBoard's file and sent to wandb by then, else they are
    # never logged. The first episodes end at step 600, logged iterations at 594 and 693, checkpoints every 21 steps.
    runs = tmp_path / "runs"
    flags = [
        "--env-id",
        "Pendulum-v1",
        "--num-envs",
        "3",
        "--total-timesteps",
        "30000",
        "--checkpoint-every",
        "7",
    ]
    flags += [
        "--learning-starts",
        "0",
        "--run-dir",
        str(runs),
        "--no-progress",
        "--eval-episodes",
        "0",
        "--track",
    ]
    env = {**os.environ, **wandb_env(tmp_path)}
    process = subprocess.Popen(
        [sys.executable, "ddpg.py", *flags], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True
    )
    stop_when(process, lambda: any(runs.glob("*/checkpoints/step_630.pt")), timeout=120)
    (run,) = runs.iterdir()
    checkpoint = max(
        int(path.stem.removeprefix("step_")) for path in run.glob("checkpoints/step_*.pt")
    )
    assert checkpoint < 693, "killed after the next logged iteration: the test shows nothing"
    assert [step for step, _ in read_scalars(run)["charts/episodic_return"]] == [600, 600, 600]
    # wandb: in its file by then, or else in the checkpoint, which a resumed run sends them from
    saved = torch.load(run / "checkpoints" / f"step_{checkpoint}.pt", weights_only=True)
    (killed,) = read_wandb_runs(run)
    episodes = [
        [row["global_step"] for row in rows if "charts/episodic_return" in row]
        for rows in (json.loads(saved["wandb"]), killed.history)
    ]
    assert [600, 600, 600] in episodes


def assert_whole_in_minari(recording: Path, dataset_id: str) -> None:
    """The recording's finished episodes, read back by minari.load_dataset: uint8 frames, and each episode's last
    observation the final one the env reported (the `_final_obs` mask marks it; 0 elsewhere). An observation of an
    image and a vector is checked part by part, a Dict in Minari."""
    minari = pytest.importorskip("minari")
    from common.minari_export import export_to_minari

    data = load_trajectories(recording)
    parts = ["image", "vector"] if "/observations/image" in data else [""]
    key = lambda root, part: f"{root}/{part}" if part else root  # noqa: E731
    assert (
        data[key("/observations", parts[0])].dtype
        == data[key("/infos/final_obs", parts[0])].dtype
        == np.uint8
    )
    export_to_minari(data, dataset_id)
    finished = [episode for episode in split_episodes(data) if episode.finished]
    dataset = minari.load_dataset(dataset_id)
    assert len(dataset) == len(finished) > 0
    for episode, exported in zip(finished, dataset.iterate_episodes(), strict=True):
        assert episode.data["/infos/_final_obs"][-1]
        for part in parts:
            observations = exported.observations[part] if part else exported.observations
            assert observations.dtype == (np.float32 if part == "vector" else np.uint8)
            np.testing.assert_array_equal(
                observations[:-1], episode.data[key("/observations", part)]
            )
            np.testing.assert_array_equal(
                observations[-1], episode.data[key("/infos/final_obs", part)][-1]
            )


def test_image_recordings_reach_minari_whole_after_a_kill_and_a_clean_end(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    # Killed: the files written before the kill read back, frames and final frames uint8.
    # two envs, not four: a file is 2,048 steps of each, and the kill comes after two; one epoch: what is checked is
    # the recording, not what is learnt
    flags = ["--env-id", "ImageMemory-v0", "--num-envs", "2", "--run-dir", str(tmp_path / "runs")]
    flags += ["--no-progress", "--update-epochs", "1"]
    assert_whole_in_minari(
        killed_recording("ppo_fc.py", flags, tmp_path / "killed"), "images/killed-v0"
    )
    # A clean end, on Atari: games of several episodes (lives), compressed frames.
    pytest.importorskip("ale_py")
    clean, runs = tmp_path / "clean", tmp_path / "atari"
    flags = ["--env-id", "BreakoutNoFrameskip-v4", "--num-envs", "2", "--total-timesteps", "1024"]
    flags += [
        "--update-epochs",
        "1",
        "--run-dir",
        str(runs),
        "--no-progress",
        "--eval-episodes",
        "0",
        "--save-trajectories",
        str(clean),
    ]
    assert run_script("ppo_fc.py", *flags).returncode == 0
    assert_whole_in_minari(clean, "breakout/clean-v0")


def test_image_and_vector_recordings_reach_minari_whole_after_a_kill_and_a_clean_end(
    tmp_path, monkeypatch
):
    # ppo_transformer on images: each observation is a uint8 frame and a vector (the previous action and reward). One
    # epoch: what is checked is the recording, not what is learnt.
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    flags = [
        "--env-id",
        "ImageMemory-v0",
        "--num-envs",
        "2",
        "--eval-episodes",
        "0",
        "--no-progress",
        "--update-epochs",
        "1",
    ]
    flags += ["--run-dir", str(tmp_path / "runs")]
    assert_whole_in_minari(
        killed_recording("ppo_transformer.py", flags, tmp_path / "killed"), "parts/killed-v0"
    )
    clean = tmp_path / "clean"
    completed = run_script(
        "ppo_transformer.py", *flags, "--total-timesteps", "512", "--save-trajectories", str(clean)
    )
    assert completed.returncode == 0, completed.stderr
    data = load_trajectories(clean)
    assert data["/observations/vector"].shape == (2, 256, 3) and "/observations" not in data
    assert_whole_in_minari(clean, "parts/clean-v0")


def test_an_atari_checkpoint_evaluates_whole_games_in_a_fresh_process(tmp_path):
    pytest.importorskip("ale_py")
    runs = tmp_path / "runs"
    flags = [
        "--env-id",
        "ALE/Breakout-v5",
        "--num-envs",
        "2",
        "--total-timesteps",
        "512",
        "--run-dir",
        str(runs),
    ]
    assert run_script("ppo_fc.py", *flags, "--no-progress", "--eval-episodes", "0").returncode == 0
    (run,) = runs.iterdir()
    flags = ["--eval-checkpoint", str(run / "checkpoints" / "latest.pt"), "--eval-episodes", "2"]
    evaluated = run_script(
        "ppo_fc.py", *flags, "--sampling-method", "basic", "--run-dir", str(tmp_path / "eval")
    )
    assert evaluated.returncode == 0, evaluated.stderr
    (eval_run,) = (tmp_path / "eval").iterdir()
    returns = [value for _, value in read_scalars(eval_run)["eval/episodic_return"]]
    lengths = [value for _, value in read_scalars(eval_run)["eval/episodic_length"]]
    # raw scores of whole games
    assert len(returns) == 2 and all(value == int(value) >= 0 for value in returns)
    assert min(lengths) > 100  # five lives of a random-ish Breakout agent: a single life is shorter


# One-step episodes: many wandb rows, so that wandb-core writes rows past a checkpoint before a kill. A checkpoint
# every 8 iterations: the first kill comes 3 x 512 rows past one (later where wandb lags), the second at the next,
# which comes before the run's end. ppo_fc: 32 iterations of 4 x 128 steps; the recurrent scripts: 20 iterations of
# their 8 x 128 (their rollout's cost is by the step of the vector env, whatever its number of envs). Few epochs and
# small networks: what is checked is the rows, not what is learnt.
PROBE1_RUN = ["--env-id", "Probe1-v0", "--num-steps", "128"]
KILLED_RUNS = {
    "ppo_fc.py": ([*PROBE1_RUN, "--num-envs", "4", "--total-timesteps", str(32 * 512)], 512),
    "ppo_lstm.py": ([*PROBE1_RUN, "--total-timesteps", str(40 * 512), "--update-epochs", "2"], 512),
    "ppo_transformer.py": (
        [*PROBE1_RUN, "--total-timesteps", str(40 * 512), "--update-epochs", "2"],
        512,
    ),
    "ddpg.py": (
        [
            *("--env-id", "ContinuousProbe1-v0", "--num-envs", "4", "--total-timesteps", "6000"),
            *("--learning-starts", "2000", "--buffer-size", "8000", "--save-buffer"),
            *("--torch-threads", "1", "--hidden-size", "64", "--batch-size", "64"),
        ],
        100,  # 25 vector steps, and an iteration's row every 25
    ),
}


def test_a_finished_run_trained_on_and_killed_on_the_way_reads_back_as_the_run_started_with_that_budget(
    tmp_path,
):
    # A clean end at 2,048 steps, then the same run name with --resume auto and --total-timesteps 6,144, killed
    # once a checkpoint past the first end is written, then that command again: the checkpoint read in a fresh
    # process, TensorBoard's reader and wandb's offline file give what a run started at 6,144 gives.
    runs, env = tmp_path / "runs", {**os.environ, **wandb_env(tmp_path)}
    flags = [
        "--env-id",
        "CartPole-v1",
        "--num-steps",
        "128",
        "--no-anneal-lr",
        "--track",
        "--save-model",
    ]
    flags += [
        "--run-dir",
        str(runs),
        "--checkpoint-every",
        "1",
        "--no-progress",
        "--eval-episodes",
        "2",
    ]

    def run(*more: str, wait: bool = True) -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, "ppo_fc.py", *more],
            cwd=REPO,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert not wait or process.wait() == 0, process.stderr.read()[-3000:]
        return process

    run(*flags, "--run-name", "whole", "--total-timesteps", "6144")
    run(*flags, "--run-name", "trained-on", "--total-timesteps", "2048")
    again = ["--run-name", "trained-on", "--resume", "auto", "--total-timesteps", "6144"]
    again += ["--run-dir", str(runs), "--track", "--no-progress"]
    stop_when(
        run(*again, wait=False), lambda: (runs / "trained-on/checkpoints/step_3072.pt").exists()
    )
    run(*again)

    whole, trained_on = (
        torch.load(runs / name / "checkpoints" / "latest.pt", weights_only=True)
        for name in ("whole", "trained-on")
    )
    assert trained_on["global_step"] == 6144 and trained_on["model"].keys() == whole["model"].keys()
    for key, value in whole["model"].items():
        torch.testing.assert_close(trained_on["model"][key], value, rtol=0, atol=0, msg=key)
    scalars = {name: read_scalars(runs / name) for name in ("whole", "trained-on")}
    assert (
        scalars["trained-on"]["charts/episodic_return"]
        == scalars["whole"]["charts/episodic_return"]
    )
    assert [step for step, _ in scalars["trained-on"]["charts/learning_rate"]] == list(
        range(512, 6145, 512)
    )
    episodes = {}
    for name in ("whole", "trained-on"):
        rows = [row for part in read_wandb_runs(runs / name) for row in part.history]
        episodes[name] = Counter(
            (row["global_step"], row["charts/episodic_return"])
            for row in rows
            if EPISODE_KEYS[0] in row
        )
    assert episodes["trained-on"] == episodes["whole"] and max(episodes["whole"].values()) == 1


@pytest.mark.parametrize("script", list(KILLED_RUNS))
def test_wandb_holds_every_row_once_after_kills_long_after_and_just_after_a_checkpoint(
    tmp_path, script
):
    # Three parts: killed once rows well past its checkpoint are in wandb's file (the resumed run must not send them
    # again), resumed and killed the moment its next checkpoint is written (rows before it may not have reached the
    # file: the checkpoint holds them), resumed to the end. The parts' offline files then hold what TensorBoard holds.
    flags, steps_between = KILLED_RUNS[script]
    runs = tmp_path / "runs"
    flags = [
        *flags,
        "--checkpoint-every",
        "8" if script != "ddpg.py" else "250",
        "--run-dir",
        str(runs),
    ]
    flags += ["--no-progress", "--eval-episodes", "0", "--track"]
    env = {**os.environ, **wandb_env(tmp_path)}

    def checkpoint_step() -> int:
        steps = [int(p.stem.removeprefix("step_")) for p in runs.glob("*/checkpoints/step_*.pt")]
        return max(steps, default=0)

    logs: dict[Path, TransactionLog] = {}  # read as they grow
    last_written = [0]

    def written_past(step: int) -> bool:
        for path in runs.glob("*/wandb/offline-run-*/run-*.wandb"):
            rows = logs.setdefault(path, TransactionLog(path)).new_rows()
            last_written[0] = max([last_written[0], *(row["global_step"] for row in rows)])
        return last_written[0] > step

    first = subprocess.Popen(
        [sys.executable, script, *flags], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True
    )
    stop_when(
        first,
        lambda: (step := checkpoint_step()) > 0 and written_past(step + 3 * steps_between),
        every=0.3,
    )
    killed_at = checkpoint_step()
    (run,) = runs.iterdir()
    resume = [
        sys.executable,
        script,
        "--resume",
        str(run / "checkpoints" / "latest.pt"),
        "--track",
        "--no-progress",
    ]
    second = subprocess.Popen(resume, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    stop_when(second, lambda: checkpoint_step() > killed_at)
    last = subprocess.run(resume, cwd=REPO, env=env, capture_output=True, text=True)
    assert last.returncode == 0, last.stderr[-3000:]

    parts = read_wandb_runs(run)
    # a part killed before wandb-core wrote its run's record wrote no row either
    assert len(parts) == 3 and len({part.id for part in parts if part.history}) == 1
    rows = [row for part in parts for row in part.history]
    scalars = read_scalars(run)
    episodes = Counter(
        (row["global_step"], row["charts/episodic_return"], row["charts/episodic_length"])
        for row in rows
        if "charts/episodic_return" in row
    )
    shown = Counter(
        (step, value, length)
        for (step, value), (_, length) in zip(
            scalars["charts/episodic_return"], scalars["charts/episodic_length"], strict=True
        )
    )
    assert episodes == shown and sum(shown.values()) > 0
    for key in ("charts/learning_rate", "charts/SPS"):
        assert steps_by_key(rows, [key]) == tensorboard_steps(scalars, [key])


class EndlessEnv(gym.Env):
    """An env with no time limit whose episodes never end (as dm_control's lqr tasks under a policy that does not
    reach the goal): one reward a step."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 1.0, False, False, {}


def test_evaluation_cuts_an_episode_that_never_ends_at_its_step_limit_and_records_it_truncated(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(evaluation, "EPISODE_STEP_LIMIT", 30)
    calls = []

    def act(observations, episode_starts):
        calls.append(bool(episode_starts[0]))
        assert len(calls) <= 100, "evaluation played on past its step limit"
        return np.zeros(1, dtype=np.int64)

    env = evaluation_env(EndlessEnv, Namespace())
    path = tmp_path / "eval.npz"
    returns, lengths = evaluation.play_episodes(
        env, act, 2, 1, path, {"args": {"env_id": "Endless"}}
    )

    assert (returns, lengths) == ([30.0, 30.0], [30, 30])
    assert [k for k, start in enumerate(calls) if start] == [0, 30]  # the second starts afresh
    data = load_trajectories(path)
    assert np.flatnonzero(data["/truncations"][0]).tolist() == [29, 59]
    episodes = [(episode.total_reward, episode.finished) for episode in split_episodes(data)]
    assert episodes == [(30.0, True), (30.0, True)]
    notices = [line for line in capsys.readouterr().err.splitlines() if line.startswith("notice:")]
    assert len(notices) == 1 and "had not ended after 30 steps" in notices[0], notices
