"""Data parallelism under torchrun (CPU, gloo, 2 processes): the same maths as one process, ranks that agree, one
writer, resume, errors and learning. Each test starts torchrun in a subprocess."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import REPO, read_scalars, visit_states

import ppo_fc
from benchmark.registry import script_agent
from common.trajectories import load_trajectories, split_episodes

# torchrun's own traceback, as it reports its workers' failure or a Ctrl-C: what comes before it is the workers'.
TORCHRUN_TRACEBACK = 'Traceback (most recent call last):\n  File "<frozen runpy>"'
SMALL = dict(num_steps=16, num_minibatches=4, update_epochs=2, progress=False, eval_episodes=0)


def torchrun(out, script: str, settings: dict, *options: str, nproc: int = 2, timeout: int = 180):
    """`tests/distributed_run.py` under `torchrun --standalone --nproc-per-node nproc`."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
    ]
    command += ["tests/distributed_run.py", str(out), script, json.dumps(settings), *options]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def plain(out, script: str, settings: dict, *options: str, timeout: int = 180):
    """`tests/distributed_run.py` in one process, without torchrun."""
    command = [
        sys.executable,
        "tests/distributed_run.py",
        str(out),
        script,
        json.dumps(settings),
        *options,
    ]
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")
    }
    return subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env
    )


def ended(out, rank: int) -> dict:
    return torch.load(out / f"rank{rank}.pt", weights_only=True)


def assert_ok(process: subprocess.CompletedProcess) -> None:
    assert process.returncode == 0, process.stderr[-3000:]


@pytest.mark.parametrize(
    "env_id, extra",
    [("CartPole-v1", dict(norm_obs=True)), ("Pendulum-v1", dict(norm_obs=True, clip_vloss=False))],
)
def test_two_ranks_compute_the_update_of_one_process_with_the_whole_batch(tmp_path, env_id, extra):
    # One iteration: 2 ranks x 4 envs and 1 process x 8 envs act on the same noise and take the same minibatches.
    settings = dict(
        SMALL,
        env_id=env_id,
        run_dir=str(tmp_path / "runs"),
        save_model=False,
        norm_reward=False,
        **extra,
    )
    assert_ok(
        torchrun(
            tmp_path / "two",
            "ppo_fc",
            dict(settings, num_envs=4, total_timesteps=128),
            "--same-data=2",
        )
    )
    assert_ok(
        plain(
            tmp_path / "one",
            "ppo_fc",
            dict(settings, num_envs=8, total_timesteps=128),
            "--same-data=2",
        )
    )
    one, rank0, rank1 = (
        ended(tmp_path / "one", 0),
        ended(tmp_path / "two", 0),
        ended(tmp_path / "two", 1),
    )
    assert rank0["global_step"] == one["global_step"] == 128
    for name, expected in one["state"].items():
        torch.testing.assert_close(rank0["state"][name], expected, rtol=1e-4, atol=1e-5, msg=name)
        torch.testing.assert_close(
            rank1["state"][name], rank0["state"][name], rtol=0, atol=0, msg=name
        )


def test_the_return_statistics_after_a_rollout_are_those_of_all_envs(tmp_path):
    # Within the rollout each rank scales by its own statistics; after it, by those of every rank's envs together.
    settings = dict(
        SMALL,
        env_id="CartPole-v1",
        run_dir=str(tmp_path / "runs"),
        save_model=True,
        norm_reward=True,
    )
    assert_ok(
        torchrun(
            tmp_path / "two",
            "ppo_fc",
            dict(settings, num_envs=4, total_timesteps=128),
            "--same-data=2",
        )
    )
    assert_ok(
        plain(
            tmp_path / "one",
            "ppo_fc",
            dict(settings, num_envs=8, total_timesteps=128),
            "--same-data=2",
        )
    )
    one, two = (
        torch.load(
            Path(ended(tmp_path / r, 0)["run_dir"]) / "checkpoints" / "latest.pt", weights_only=True
        )
        for r in ("one", "two")
    )
    assert (
        one["reward_rms"]["count"] == pytest.approx(two["reward_rms"]["count"])
        and one["reward_rms"]["count"] > 128
    )
    for key in ("mean", "var"):
        torch.testing.assert_close(
            two["reward_rms"][key], one["reward_rms"][key], rtol=1e-7, atol=0
        )


@pytest.fixture(scope="module")
def trained_on_two_ranks(tmp_path_factory) -> Path:
    """The folder of a torchrun of 2 ranks x 2 envs that trained 16 iterations with observation and reward
    normalisation, recording each rank's rollouts (`rollouts.npz`, `rollouts.rank1.npz`), run folder in `runs/`."""
    out = tmp_path_factory.mktemp("two_ranks")
    settings = dict(
        SMALL, env_id="CartPole-v1", num_envs=2, total_timesteps=16 * 64, save_model=False
    )
    settings.update(norm_obs=True, norm_reward=True)
    assert_ok(
        torchrun(
            out,
            "ppo_fc",
            dict(settings, run_dir=str(out / "runs"), save_trajectories=str(out / "rollouts.npz")),
        )
    )
    return out


@pytest.mark.xdist_group("trained_on_two_ranks")  # its module fixture made once
def test_after_training_both_ranks_hold_the_same_parameters(trained_on_two_ranks):
    rank0, rank1 = ended(trained_on_two_ranks, 0), ended(trained_on_two_ranks, 1)
    assert rank0["global_step"] == rank1["global_step"] == 16 * 64
    for name, value in rank0["state"].items():
        torch.testing.assert_close(rank1["state"][name], value, rtol=0, atol=0, msg=name)


@pytest.mark.xdist_group("trained_on_two_ranks")  # its module fixture made once
def test_rank_0_logs_the_episodes_of_every_rank(trained_on_two_ranks):
    out = trained_on_two_ranks
    finished = {
        rank: [
            episode.total_reward
            for episode in split_episodes(load_trajectories(file))
            if episode.finished
        ]
        for rank, file in ((0, out / "rollouts.npz"), (1, out / "rollouts.rank1.npz"))
    }
    assert len(finished[0]) > 5 and len(finished[1]) > 5
    (run,) = (out / "runs").iterdir()
    logged = [value for _, value in read_scalars(run)["charts/episodic_return"]]
    assert sorted(logged) == sorted(finished[0] + finished[1])
    assert ended(out, 0)["returns"] == ended(out, 1)["returns"] and len(
        ended(out, 0)["returns"]
    ) == len(logged)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ranks_to_their_end(out, arguments: list[str], nproc: int = 2, timeout: int = 180):
    """`python ARGUMENTS` in `nproc` processes with the environment torchrun gives its ranks (met at
    a free localhost port), each waited for to its own end. torchrun stops every rank as soon as one
    has failed, so what the others do after it, which a loaded machine may delay, shows only here."""
    environment = {**os.environ, "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc)}
    environment.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    ranks = [
        subprocess.Popen(
            [sys.executable, *arguments], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env={**environment, "RANK": str(rank), "LOCAL_RANK": str(rank)},
        )
        for rank in range(nproc)
    ]  # fmt: skip
    ended = []
    try:
        for rank in ranks:
            stdout, stderr = rank.communicate(timeout=timeout)
            ended.append(subprocess.CompletedProcess(rank.args, rank.returncode, stdout, stderr))
    finally:
        for rank in ranks:
            rank.kill()  # after a timeout: none left behind
    return ended


def two_machines(
    out, script: str, settings: list[dict], timeout: int = 180
) -> list[subprocess.CompletedProcess]:
    """Two torchrun launches of one process each, met at a localhost endpoint as two machines would: rank 1's
    LOCAL_RANK is 0. `settings[i]` goes to the launch i. Each result's `stderr` is its worker's own (torchrun writes
    it to a file), its `stdout` all that torchrun printed, its agent's reports and tracebacks included."""
    endpoint = f"127.0.0.1:{free_port()}"
    launches = [
        subprocess.Popen(
            [
                sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=test", "--max-restarts=0",
                "--redirects=3", f"--log-dir={out}/torchrun{i}",
                "tests/distributed_run.py", str(out), script, json.dumps(launch_settings),
            ],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for i, launch_settings in enumerate(settings)
    ]  # fmt: skip
    results = []
    for i, launch in enumerate(launches):
        output, _ = launch.communicate(timeout=timeout)
        (worker_stderr,) = Path(out, f"torchrun{i}").glob("**/stderr.log")
        results.append(
            subprocess.CompletedProcess(
                launch.args, launch.returncode, output, worker_stderr.read_text()
            )
        )
    return results


def test_two_machines_make_one_run_folder_written_by_global_rank_0(tmp_path):
    settings = dict(
        SMALL,
        env_id="CartPole-v1",
        num_envs=2,
        total_timesteps=4 * 64,
        run_dir=str(tmp_path / "runs"),
    )
    for launch in two_machines(tmp_path, "ppo_fc", [dict(settings, checkpoint_every=2)] * 2):
        assert_ok(launch)
    environs = [ended(tmp_path, rank)["environ"] for rank in (0, 1)]
    assert environs == [
        {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"},
        {"RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2"},
    ]
    (run,) = (tmp_path / "runs").iterdir()
    assert len(list(run.glob("events.*"))) == 1
    assert sorted(path.name for path in (run / "checkpoints").iterdir()) == [
        "latest.pt",
        "step_128.pt",
        "step_256.pt",
    ]
    assert [step for step, _ in read_scalars(run)["charts/learning_rate"]] == [64, 128, 192, 256]


def test_resume_under_torchrun_continues_as_the_uninterrupted_run(tmp_path):
    settings = dict(
        SMALL, env_id="CartPole-v1", num_envs=2, total_timesteps=6 * 64, checkpoint_every=3
    )
    settings.update(
        save_model=True, norm_obs=True, norm_reward=True, run_dir=str(tmp_path / "runs")
    )
    assert_ok(torchrun(tmp_path / "whole", "ppo_fc", settings))
    whole = ended(tmp_path / "whole", 0)
    middle = Path(whole["run_dir"]) / "checkpoints" / "step_192.pt"
    checkpoint = torch.load(middle, weights_only=True)
    assert len(checkpoint["ranks"]) == 2 and all(
        len(rank["episodes"]["envs"]) == 2 for rank in checkpoint["ranks"]
    )
    copy = tmp_path / "copy" / middle.parents[1].name
    shutil.copytree(
        middle.parents[1], copy, ignore=shutil.ignore_patterns("step_384.pt", "latest.pt")
    )
    resume = dict(resume=str(copy / "checkpoints" / "step_192.pt"), progress=False)
    assert_ok(torchrun(tmp_path / "resumed", "ppo_fc", resume))
    for rank in (0, 1):
        resumed = ended(tmp_path / "resumed", rank)
        assert resumed["global_step"] == 384 and resumed["run_dir"] == str(copy)
        for name, value in whole["state"].items():
            torch.testing.assert_close(resumed["state"][name], value, rtol=0, atol=0, msg=name)
    # Another number of processes goes on, with new episodes, and says so; its iterations are of its own batch.
    process = plain(tmp_path / "one", "ppo_fc", resume)
    assert_ok(process)
    assert "the checkpoint was written by 2 process(es), this run has 1" in process.stderr
    assert ended(tmp_path / "one", 0)["global_step"] == 384
    logged = read_scalars(copy)["charts/learning_rate"]
    assert [step for step, _ in logged if step > 192] == [
        224,
        256,
        288,
        320,
        352,
        384,
    ]  # 32-step batches now


def test_bad_input_on_one_rank_ends_both_within_seconds(tmp_path):
    settings = dict(
        SMALL,
        env_id="CartPole-v1",
        num_envs=2,
        total_timesteps=100 * 64,
        run_dir=str(tmp_path / "runs"),
    )
    start = time.time()
    good, bad = two_machines(
        tmp_path, "ppo_fc", [settings, dict(settings, env_id="NoSuchEnv-v0")], timeout=120
    )
    # torchrun's start-up included; the run itself would take far longer
    assert time.time() - start < 60
    assert bad.returncode != 0 and "error: unknown env id 'NoSuchEnv-v0'" in bad.stderr
    assert (
        good.returncode != 0
        and "error: rank 0: a collective failed, most likely because another process of the run stopped"
        in good.stderr
    )
    # the workers' own (torchrun's reports are its own)
    assert "Traceback" not in good.stderr + bad.stderr


def test_a_target_kl_break_on_one_ranks_data_stops_both_ranks_epochs(tmp_path):
    settings = dict(
        SMALL,
        env_id="CartPole-v1",
        num_envs=4,
        num_steps=32,
        total_timesteps=6 * 256,
        update_epochs=8,
    )
    settings.update(
        target_kl=0.002, run_dir=str(tmp_path / "runs"), save_model=False, learning_rate=1e-3
    )
    assert_ok(torchrun(tmp_path, "ppo_fc", settings, timeout=120))
    rank0, rank1 = ended(tmp_path, 0), ended(tmp_path, 1)
    # Each record: ([old_approx_kl, approx_kl] of this rank's data, the same averaged over both ranks).
    local_kls = [
        (mine[1], theirs[1], averaged[1])
        for (mine, averaged), (theirs, _) in zip(rank0["means"], rank1["means"], strict=True)
    ]
    # Some epoch's data crossed the target on one rank only: a rank deciding alone would have left the other waiting.
    assert any((a > 0.002) != (b > 0.002) for a, b, _ in local_kls)
    # some epochs stopped
    assert any(average > 0.002 for _, _, average in local_kls) and len(local_kls) < 6 * 8
    for name, value in rank0["state"].items():
        torch.testing.assert_close(rank1["state"][name], value, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("env_id", ["Probe4-v0", "Probe5-v0"])
def test_two_ranks_learn_the_probes(tmp_path, env_id):
    # 2 ranks x 2 envs: the global batch of the one-process probe tests (4 envs x 128 steps), over as many steps.
    settings = dict(
        env_id=env_id, num_envs=2, total_timesteps=20_480, save_model=False, eval_episodes=0
    )
    assert_ok(
        torchrun(tmp_path, "ppo_fc", dict(settings, progress=False, run_dir=str(tmp_path / "runs")))
    )
    args = ppo_fc.Args(env_id=env_id)
    agent = script_agent(ppo_fc, args, {"model": ended(tmp_path, 1)["state"]})
    for env, observation in visit_states(env_id):
        x = torch.as_tensor(observation[None], dtype=torch.float32)
        with torch.no_grad():
            value, policy = agent.get_value(x).item(), agent.distribution(agent(x)[0])
        assert value == pytest.approx(env.optimal_value(args.gamma), abs=0.1), observation
        assert policy.probs[0, env.optimal_action()].item() >= 0.95, observation


@pytest.mark.parametrize("script", ["ppo_lstm", "ppo_transformer"])
def test_recurrent_scripts_train_under_torchrun_with_ranks_that_agree(tmp_path, script):
    settings = dict(
        env_id="CartPole-v1", num_envs=4, num_steps=32, num_minibatches=2, total_timesteps=4 * 256
    )
    settings.update(
        norm_obs=True,
        norm_adv=True,
        progress=False,
        eval_episodes=0,
        run_dir=str(tmp_path / "runs"),
    )
    assert_ok(torchrun(tmp_path, script, dict(settings, checkpoint_every=2, save_model=True)))
    rank0, rank1 = ended(tmp_path, 0), ended(tmp_path, 1)
    assert rank0["global_step"] == rank1["global_step"] == 4 * 256
    for name, value in rank0["state"].items():
        torch.testing.assert_close(rank1["state"][name], value, rtol=0, atol=0, msg=name)
    (run,) = (tmp_path / "runs").iterdir()
    assert rank0["returns"] == rank1["returns"]
    assert len(read_scalars(run)["charts/episodic_return"]) == len(rank0["returns"]) > 0
    checkpoint = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)
    assert len(checkpoint["ranks"]) == 2 and checkpoint["global_step"] == 4 * 256
    # each rank's memory or context, not rank 0's twice
    carried = [rank["episodes"] for rank in checkpoint["ranks"]]
    assert not all(
        torch.equal(carried[0][key], carried[1][key])
        for key in carried[0]
        if key not in ("envs", "wrappers")
    )


def test_ddpg_refuses_more_than_one_process(tmp_path):
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "ddpg.py",
    ]
    process = subprocess.run(
        [*command, "--run-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    workers = process.stderr.split(TORCHRUN_TRACEBACK)[0]
    assert process.returncode != 0 and "error: ddpg.py runs in one process" in workers
    # every rank refuses, not only the first to get there: torchrun stops the others after it
    arguments = ["ddpg.py", "--total-timesteps", "300", "--run-dir", str(tmp_path)]
    for rank in ranks_to_their_end(tmp_path, arguments):
        assert rank.returncode == 2 and rank.stderr.startswith("error: ddpg.py runs in one process")
    assert not list(tmp_path.iterdir())


def test_ctrl_c_under_torchrun_stops_every_rank_after_the_same_iteration_with_a_checkpoint(
    tmp_path,
):
    flags = [
        "--total-timesteps",
        "10000000",
        "--no-progress",
        "--run-dir",
        str(tmp_path),
        "--checkpoint-every",
        "1",
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "ppo_fc.py", *flags],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group, which the test interrupts as a terminal's Ctrl-C does
    )  # fmt: skip
    deadline = time.time() + 120
    while not list(tmp_path.glob("*/checkpoints/latest.pt")) and time.time() < deadline:
        time.sleep(0.2)  # until the first iteration is done: every rank is in the training loop
    time.sleep(1)  # a few iterations
    # torchrun's workers have sessions of their own: it passes it on
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    workers = stderr.split(TORCHRUN_TRACEBACK)[0]  # before torchrun's own report
    assert (
        workers.count("interrupted: stopped after the iteration") == 2
        and "Traceback" not in workers
    ), stderr
    (run,) = tmp_path.iterdir()
    checkpoint = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)
    assert (
        checkpoint["global_step"] == checkpoint["iteration"] * 1024 > 0
        and len(checkpoint["ranks"]) == 2
    )
    logged = read_scalars(run)["charts/learning_rate"]
    # the checkpoint is the state after the last logged iteration
    assert logged[-1][0] == checkpoint["global_step"]


@pytest.mark.parametrize("script", ["ppo_lstm", "ppo_transformer"])
def test_recurrent_scripts_on_two_ranks_compute_the_update_of_one_process(tmp_path, script):
    # Minibatches of whole sequences (envs) from both ranks; the recurrent state and context of each env its own.
    settings = dict(
        SMALL,
        env_id="CartPole-v1",
        num_minibatches=2,
        run_dir=str(tmp_path / "runs"),
        save_model=False,
    )
    # (within a rollout each rank scales its own)
    settings.update(norm_obs=True, norm_adv=True, norm_reward=False)
    assert_ok(
        torchrun(
            tmp_path / "two",
            script,
            dict(settings, num_envs=4, total_timesteps=128),
            "--same-data=2",
        )
    )
    assert_ok(
        plain(
            tmp_path / "one",
            script,
            dict(settings, num_envs=8, total_timesteps=128),
            "--same-data=2",
        )
    )
    one, rank0 = ended(tmp_path / "one", 0), ended(tmp_path / "two", 0)
    for name, expected in one["state"].items():
        torch.testing.assert_close(rank0["state"][name], expected, rtol=1e-4, atol=1e-5, msg=name)


def test_a_nan_on_one_ranks_data_stops_every_rank_with_the_last_good_checkpoint(tmp_path):
    settings = dict(
        env_id="NanOnRank1-v0",
        num_envs=1,
        num_steps=64,
        total_timesteps=64 * 100,
        checkpoint_every=1,
    )
    # Without advantage normalisation the NaN reaches rank 0 only through the averaged gradients.
    settings.update(norm_adv=False, progress=False, eval_episodes=0, run_dir=str(tmp_path / "runs"))
    process = torchrun(tmp_path, "ppo_fc", settings, timeout=120)
    workers = process.stderr.split(TORCHRUN_TRACEBACK)[0]
    stopped = "error: a loss or parameter became NaN or inf"
    assert process.returncode != 0 and stopped in workers, workers
    assert "Traceback" not in workers
    (run,) = (tmp_path / "runs").iterdir()
    # Rank 1's NaN rewards start in its fifth rollout (its steps 300 on): the checkpoint of the fourth is the last.
    checkpoint = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)
    assert checkpoint["global_step"] == 4 * 128
    assert all(torch.isfinite(value).all() for value in checkpoint["model"].values())
    # every rank stops at the NaN, not only the first to say so (torchrun stops the rest after it)
    each = tmp_path / "each"
    arguments = ["tests/distributed_run.py", str(each), "ppo_fc"]
    arguments.append(json.dumps(dict(settings, run_dir=str(each / "runs"))))
    for rank in ranks_to_their_end(tmp_path, arguments):
        assert rank.returncode == 1 and stopped in rank.stderr, rank.stderr
        assert "Traceback" not in rank.stderr


def test_a_backend_torch_does_not_know_and_world_size_without_torchrun_are_refused(tmp_path):
    settings = dict(
        SMALL, env_id="CartPole-v1", num_envs=2, total_timesteps=256, run_dir=str(tmp_path / "runs")
    )
    process = torchrun(
        tmp_path, "ppo_fc", dict(settings, dist_backend="carrier-pigeon"), timeout=120
    )
    workers = process.stderr.split(TORCHRUN_TRACEBACK)[0]
    refusal = "error: --dist-backend 'carrier-pigeon'"
    assert process.returncode != 0 and refusal in workers, workers
    # every rank refuses before training, not only the first to get there (torchrun stops the rest)
    arguments = ["tests/distributed_run.py", str(tmp_path), "ppo_fc"]
    arguments.append(json.dumps(dict(settings, dist_backend="carrier-pigeon")))
    for rank in ranks_to_their_end(tmp_path, arguments):
        assert rank.returncode == 2 and rank.stderr.startswith(refusal), rank.stderr
    env = {**os.environ, "WORLD_SIZE": "2"}
    flags = ["--total-timesteps", "2048", "--run-dir", str(tmp_path / "runs")]
    alone = subprocess.run(
        [sys.executable, "ppo_fc.py", *flags], cwd=REPO, capture_output=True, text=True, env=env
    )
    assert alone.returncode == 2 and "start the script with torchrun" in alone.stderr
    assert not (tmp_path / "runs").exists()
