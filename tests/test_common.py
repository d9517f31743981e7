"""common/: the command line, checkpoints, seeding, run folders, Ctrl-C handling, the draws check."""

import os
import re
import signal
import subprocess
import sys
import textwrap
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from common import checkpoints, env_state, seeding, tracking
from common.cli import check_ranges, notice, one_line, parse_args
from common.envs import vector_env
from common.errors import PolicyMismatch, TrainingDiverged, UsageError, check_finite
from common.rollout_checks import check_draws
from common.run_folder import create_run_folder
from common.running_norm import RunningNorm
from common.tracking import TrainingLog
from common.trajectories import RolloutRecorder, load_trajectories, new_recording_folder

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Flags:
    total_timesteps: int = 500_000
    """total timesteps of the experiment"""
    num_envs: int = 4
    """the number of parallel environments"""


# --- the command line ----------------------------------------------------------------------------------------------


def test_a_misspelled_flag_gives_one_line_with_tyros_hint():
    with pytest.raises(UsageError) as caught:
        parse_args(Flags, ["--total-timestep", "30000"])
    message = str(caught.value)
    assert "\n" not in message and message.startswith("Unrecognized options: --total-timestep")
    assert "Perhaps you meant: --total-timesteps" in message and message.endswith("(see --help)")
    with pytest.raises(UsageError, match=r"--num-envs.*'four'"):
        parse_args(Flags, ["--num-envs", "four"])
    assert parse_args(Flags, ["--num-envs", "2"]) == Flags(num_envs=2)


# The two layouts tyro has used for this message: boxed (0.8 to 1.0.5) and ruled with dashes (1.0.6 on, when its
# output is not a terminal), each wrapped at a narrow width.
BOXED = """\
╭─ Unrecognized options ─────────────╮
│ Unrecognized options:              │
│ --total-timestep                   │
│ ────────────────────────────────── │
│ Perhaps you meant:                 │
│     --total-timesteps INT          │
│         total timesteps of the     │
│         experiment (default: 5)    │
│ ────────────────────────────────── │
│ For full helptext, run ppo_fc.py   │
│ --help                             │
╰────────────────────────────────────╯
"""
RULED = """\
 Unrecognized options
 ---------------------------------
  Unrecognized options:
  --total-timestep
  ---------------------------------
  Perhaps you meant:
      --total-timesteps INT
          total timesteps of the
          experiment (default: 5)
  ---------------------------------
  For full helptext, run ppo_fc.py
  --help
"""


@pytest.mark.parametrize(
    "layout", [BOXED, RULED, "\x1b[1m" + BOXED.replace("options:", "options:\x1b[0m")]
)
def test_one_line_does_not_depend_on_tyros_layout(layout):
    assert one_line(layout) == (
        "Unrecognized options: --total-timestep; Perhaps you meant: --total-timesteps INT total timesteps of the "
        "experiment (default: 5)"
    )


def test_check_ranges_names_the_first_bad_flag():
    check_ranges(Flags(), positive=["num_envs", "total_timesteps"])
    with pytest.raises(UsageError, match="--num-envs must be positive, got 0"):
        check_ranges(Flags(num_envs=0), positive=["total_timesteps", "num_envs"])
    with pytest.raises(UsageError, match=r"must lie in \[0, 1\]"):
        check_ranges(Flags(num_envs=2), unit_interval=["num_envs"])


def test_a_notice_is_printed_once(capsys):
    notice("the same thing")
    notice("the same thing")
    assert capsys.readouterr().err == "notice: the same thing\n"


# --- checkpoints and seeding ---------------------------------------------------------------------------------------


def test_checkpoints_are_written_atomically_and_checked_when_read(tmp_path):
    path = checkpoints.save(
        tmp_path / "checkpoints", "script", Flags(), 1024, model={"w": torch.ones(2)}
    )
    # no temporary file left
    assert {p.name for p in path.parent.iterdir()} == {"latest.pt", "step_1024.pt"}
    assert (path.parent / "step_1024.pt").read_bytes() == path.read_bytes()
    checkpoint = checkpoints.load(path, ["model"])
    assert (
        checkpoint["args"] == {"total_timesteps": 500_000, "num_envs": 4}
        and checkpoint["global_step"] == 1024
        and checkpoint["script"] == "script"
    )
    with pytest.raises(UsageError, match=r"\(written by script.py\) .* it has no \['optimizer'\]"):
        checkpoints.load(path, ["model", "optimizer"])


def test_a_state_that_does_not_fit_is_named_by_its_keys_and_shapes():
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    wider = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 2))
    assert checkpoints.state_difference(module.state_dict(), module) == ""
    assert checkpoints.state_difference(wider.state_dict(), module) == (
        "shapes differ: 0.weight (5, 3) there, (4, 3) here, 0.bias (5,) there, (4,) here, "
        "1.weight (2, 5) there, (2, 4) here"
    )
    longer = torch.nn.Sequential(*module, torch.nn.Linear(2, 2))
    assert checkpoints.state_difference(module.state_dict(), longer) == (
        "the checkpoint lacks 2.weight, 2.bias"
    )
    assert (
        checkpoints.state_difference(longer.state_dict(), module)
        == "this run has no 2.weight, 2.bias"
    )
    # an optimizer: its parameters, by the shapes of the moments it kept (none before its first step)
    optimizer = torch.optim.Adam(module.parameters())
    assert checkpoints.state_difference(optimizer.state_dict(), optimizer) == ""
    module(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    one_more = torch.optim.Adam([*module.parameters(), torch.nn.Parameter(torch.zeros(7))])
    assert checkpoints.state_difference(optimizer.state_dict(), one_more) == (
        "the checkpoint lacks param_groups[0][4]"
    )
    other = torch.optim.Adam(wider.parameters())
    assert checkpoints.state_difference(optimizer.state_dict(), other).startswith(
        "shapes differ: param_groups[0][0] (4, 3) there, (5, 3) here"
    )
    assert checkpoints.state_difference(torch.zeros(3, 2), np.zeros((3, 4))) == (
        "shapes differ: its shape (3, 2) there, (3, 4) here"
    )
    with pytest.raises(
        UsageError, match=r"'model' \(written by ppo_x.py\) does not fit this run's: shapes"
    ):
        checkpoints.restore({"script": "ppo_x", "model": wider.state_dict()}, {"model": module})
    with pytest.raises(UsageError, match=r"has no 'extra', which this script saves"):
        checkpoints.restore({"model": module.state_dict()}, {"model": module, "extra": np.zeros(2)})


def test_a_checkpoint_s_settings_must_be_fields_of_the_script_s_args():
    checkpoint = {
        "script": "other",
        "args": {"total_timesteps": 7, "num_envs": 2, "rnn_type": "gru"},
    }
    with pytest.raises(
        UsageError,
        match=r"\(written by other.py\) does not fit this script: its settings \['rnn_type'\]",
    ):
        checkpoints.settings(checkpoint, Flags(), (), strict=False)
    # a field an edit added takes its default
    del checkpoint["args"]["rnn_type"], checkpoint["args"]["num_envs"]
    assert checkpoints.settings(checkpoint, Flags(), (), strict=False) == Flags(total_timesteps=7)


def test_rng_state_round_trip_gives_the_same_numbers():
    seeding.seed_and_pick_device(3, True, 0, cuda=False)
    state = seeding.rng_state()
    first = (torch.rand(3), np.random.rand(3), __import__("random").random())
    seeding.restore_rng_state(state)
    second = (torch.rand(3), np.random.rand(3), __import__("random").random())
    torch.testing.assert_close(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])
    assert first[2] == second[2]


LSTM_ON_MANY_SHAPES = """
import sys, torch
from common import seeding
if sys.argv[1] == "bounded":
    seeding.seed_and_pick_device(1, True, 1, cuda=False)
torch.set_num_threads(1)
lstm = torch.nn.LSTM(128, 128)
lstm(torch.randn(4, 4, 128))
start = int(open("/proc/self/statm").read().split()[1]) * 4096
for length in range(1, 129):  # a new shape each call, as ppo_lstm's update makes them
    for sequences in (3, 5):
        output, _ = lstm(torch.randn(length, sequences, 128, requires_grad=True))
        output.sum().backward()
print((int(open("/proc/self/statm").read().split()[1]) * 4096 - start) / 2**20)
"""


def test_seed_and_pick_device_bounds_the_memory_of_onednn_kernels_for_new_shapes():
    # A process's memory grew by about 145 MB over these 256 shapes with oneDNN's default cache (some processes only
    # 69), and by 21 to 42 with the bound (2026-11-28); each process is fresh, since oneDNN reads the bound when it
    # makes its first kernel. Three of each: every bounded one below every default one.
    names = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY")
    environment = {key: value for key, value in os.environ.items() if key not in names}
    grown = {
        case: [float(subprocess.run(
            [sys.executable, "-c", LSTM_ON_MANY_SHAPES, case], capture_output=True, text=True, check=True,
            cwd=REPO, env=environment,
        ).stdout.split()[-1]) for _ in range(3)]
        for case in ("bounded", "default")
    }  # fmt: skip
    assert max(grown["bounded"]) < min(grown["default"]), grown


def test_rng_state_carries_the_cuda_generators_when_cuda_is_used(monkeypatch):
    # No GPU here: torch.cuda is replaced by a stand-in with two devices, and the test checks what is saved and set.
    device_states = [
        torch.tensor([1, 2], dtype=torch.uint8),
        torch.tensor([3, 4], dtype=torch.uint8),
    ]
    restored = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: device_states)
    monkeypatch.setattr(
        torch.cuda, "set_rng_state", lambda state, device: restored.__setitem__(device, state)
    )
    state = seeding.rng_state()
    assert [s.tolist() for s in state["cuda"]] == [[1, 2], [3, 4]]
    seeding.restore_rng_state(state)
    assert {device: s.tolist() for device, s in restored.items()} == {0: [1, 2], 1: [3, 4]}


# --- run folders and output files ----------------------------------------------------------------------------------


def test_run_folders_started_in_the_same_second_get_a_suffix(tmp_path):
    folders = [create_run_folder(tmp_path, "CartPole-v1__ppo_fc__1__1700000000") for _ in range(3)]
    assert [f.name for f in folders] == [
        "CartPole-v1__ppo_fc__1__1700000000",
        "CartPole-v1__ppo_fc__1__1700000000_2",
        "CartPole-v1__ppo_fc__1__1700000000_3",
    ]
    assert create_run_folder(tmp_path, "x", "__eval").name == "x__eval"
    assert create_run_folder(tmp_path, "x", "__eval").name == "x_2__eval"  # still ends in __eval


def test_a_run_dir_that_is_a_file_is_refused_in_one_line(tmp_path):
    (tmp_path / "runs").write_text("a file")
    for run_dir in (tmp_path / "runs", tmp_path / "runs" / "below"):
        with pytest.raises(UsageError, match="is a file, or inside one"):
            create_run_folder(run_dir, "x")


def test_recordings_never_take_an_existing_path(tmp_path, capsys):
    assert new_recording_folder(tmp_path / "a.npz") == tmp_path / "a.npz"  # created
    assert new_recording_folder(tmp_path / "a.npz") == tmp_path / "a_2.npz"  # a folder there
    assert "a.npz exists; the trajectories go to" in capsys.readouterr().err
    (tmp_path / "b").write_bytes(b"a file")
    assert new_recording_folder(tmp_path / "b") == tmp_path / "b_2" and (tmp_path / "b_2").is_dir()


# --- Ctrl-C and worker processes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("sent", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP])
def test_async_env_workers_survive_a_stop_signal_of_the_whole_process_group(tmp_path, sent):
    # What a terminal (SIGINT) or a scheduler does: the signal to every process of the job. The workers must not die
    # of it, so the training process can step them to the end of its iteration. Their parent's SIGTERM still ends them
    # (gymnasium's close(terminate=True)), else a run that fails before it closes its envs would hang at exit.
    script = textwrap.dedent(
        """
        import signal, sys, time
        import gymnasium as gym
        from common.envs import vector_env
        from common.interrupt import GracefulInterrupt

        envs = vector_env([lambda: gym.make("CartPole-v1")] * 2, async_envs=True)
        envs.reset(seed=0)
        try:
            with GracefulInterrupt() as interrupt:
                print("ready", flush=True)
                while not interrupt.requested:
                    time.sleep(0.01)
                for _ in range(20):  # the rest of the iteration
                    envs.step(envs.action_space.sample())
                print("stepped after the interrupt", flush=True)
        except KeyboardInterrupt:  # raised when the block ends: the training process stops there
            workers = list(envs.processes)
            envs.close(terminate=True)
            print("terminated", [worker.exitcode for worker in workers], flush=True)
            sys.exit(0)
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert process.stdout.readline().strip() == "ready"
    os.killpg(process.pid, sent)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "stepped after the interrupt" in stdout
    assert "terminated [-15, -15]" in stdout  # by their parent's SIGTERM


def test_async_env_workers_that_take_their_parent_s_sigterm_late_end_by_it_without_a_traceback():
    # gymnasium's close(terminate=True), also AsyncVectorEnv.__del__'s, sends SIGTERM and closes the pipes at once. A
    # worker's thread that tells its parent's SIGTERM from a scheduler's can run late under load (here made late),
    # and the worker saw the closed pipe first: a BrokenPipeError traceback for each worker, exit status 1.
    script = textwrap.dedent(
        """
        import signal, time
        import gymnasium as gym

        def late(signals, wait=signal.sigwaitinfo):
            info = wait(signals)
            time.sleep(1)
            return info

        signal.sigwaitinfo = late
        from common.envs import vector_env

        envs = vector_env([lambda: gym.make("CartPole-v1")] * 2, async_envs=True)
        envs.reset(seed=0)
        workers = list(envs.processes)
        envs.close(terminate=True)
        print("terminated", [worker.exitcode for worker in workers], flush=True)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "terminated [-15, -15]" in result.stdout
    assert "Traceback" not in result.stderr


# --- NumPy snapshots -----------------------------------------------------------------------------------------------


def test_draws_of_the_policy_pass_and_other_draws_do_not():
    generator = torch.Generator().manual_seed(0)
    # some actions all but impossible
    probs = torch.softmax(torch.randn(2048, 4, generator=generator) * 3, -1)
    for _ in range(200):  # honest draws never raise, rare actions included
        check_draws(torch.multinomial(probs, 1, generator=generator).squeeze(-1), probs=probs)
    sharper = torch.softmax(torch.log(probs) * 3, -1)
    with pytest.raises(PolicyMismatch, match="not draws"):
        check_draws(torch.multinomial(sharper, 1, generator=generator).squeeze(-1), probs=probs)
    mean, std = (
        torch.randn(512, 2, generator=generator),
        torch.rand(512, 2, generator=generator) + 0.1,
    )
    check_draws(mean + std * torch.randn(512, 2, generator=generator), mean=mean, std=std)
    with pytest.raises(PolicyMismatch, match="not draws"):
        check_draws(mean + 0.5 * std * torch.randn(512, 2, generator=generator), mean=mean, std=std)


def test_rare_draws_of_a_nearly_deterministic_policy_are_no_alarm():
    # Each action is expected 256 times, but its count's variance is 0.05: two rare draws are 9 standard errors.
    probs = torch.tensor([[1 - 1e-4, 1e-4], [1e-4, 1 - 1e-4]]).repeat(256, 1)
    actions = probs.argmax(-1)
    actions[[0, 2]] = 1  # both rows expect action 0
    check_draws(actions, probs=probs)


def test_env_state_restores_envs_mid_episode_and_their_wrappers(tmp_path):
    # Pendulum-v1: random starts, Box actions, 200-step episodes; 3 envs cut 50 steps into their second episodes.
    def stack():
        envs = vector_env([lambda: gym.make("Pendulum-v1")] * 3, async_envs=False)
        return gym.wrappers.vector.NormalizeReward(
            gym.wrappers.vector.RecordEpisodeStatistics(envs)
        )

    actions = np.random.default_rng(0).uniform(-2, 2, (500, 3, 1)).astype(np.float32)
    original = stack()
    obs, _ = original.reset(seed=5)
    # past one autoreset: the state of each env's generator at its reset is kept
    for action in actions[:250]:
        obs, *_ = original.step(action)
    path = tmp_path / "state.pt"
    torch.save(env_state.capture(original, obs, marker=np.arange(3)), path)

    copy = stack()
    # the scripts' part
    checkpoints.restore_reward_normalizer(copy, checkpoints.reward_normalizer_state(original))
    copy.reset(seed=99)
    observations, carried = env_state.restore(copy, torch.load(path, weights_only=True), seed=99)
    assert np.array_equal(observations, obs) and np.array_equal(carried["marker"], np.arange(3))
    for action in actions[250:]:
        expected, got = original.step(action), copy.step(action)
        for part in range(4):
            np.testing.assert_array_equal(got[part], expected[part])
        if "episode" in expected[4]:
            np.testing.assert_array_equal(got[4]["episode"]["r"], expected[4]["episode"]["r"])


class LegacyRandomEnv(gym.Env):
    """An old-style env that keeps a RandomState as its np_random: it trains, and a resume starts new episodes."""

    observation_space = gym.spaces.Box(0, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.np_random = np.random.RandomState(seed)
        self.t = 0
        return np.array([self.np_random.uniform()], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.np_random.uniform()], np.float32), 0.0, self.t == 2, False, {}


def test_env_state_of_envs_that_cannot_be_replayed_starts_new_episodes(capsys):
    original = vector_env([LegacyRandomEnv] * 2, async_envs=False)
    obs, _ = original.reset(seed=0)
    for _ in range(3):  # past an autoreset
        obs, *_ = original.step(np.zeros(2, dtype=np.int64))
    state = env_state.capture(original, obs)
    copy = vector_env([LegacyRandomEnv] * 2, async_envs=False)
    copy.reset(seed=1)
    observations, carried = env_state.restore(copy, state, seed=7)
    assert carried == {} and "cannot be brought back" in capsys.readouterr().err
    np.testing.assert_array_equal(
        observations, vector_env([LegacyRandomEnv] * 2, async_envs=False).reset(seed=7)[0]
    )


@pytest.mark.parametrize(
    "every, at_end, interrupted, written",
    [
        (2, False, False, [2, 4]),  # on the way only
        (2, True, False, [2, 4, 5]),  # and at the end
        (0, True, False, [5]),  # at the end only
        (2, False, True, [2, 4, 5]),  # a stop signal: the last whole iteration too
        (0, False, True, [5]),  # a stop signal with neither flag: a checkpoint still
        (0, False, False, []),  # neither, and no signal: nothing
        (5, True, False, [5]),  # the end is saved once
    ],
)
def test_the_checkpoint_schedule(every, at_end, interrupted, written):
    iterations = []
    args = Namespace(checkpoint_every=every, save_model=at_end, checkpoint_minutes=0)
    schedule = checkpoints.CheckpointSchedule(
        lambda i: iterations.append(i) or Path(f"{i}.pt"), args, 0
    )
    for iteration in range(1, 6):
        assert not schedule.time_due()  # --checkpoint-minutes 0: never
        schedule.iteration_done(iteration, time_due=False)
    last = schedule.run_ended(5, interrupted)
    assert iterations == written
    assert last == (Path(f"{written[-1]}.pt") if written else None)


def test_the_time_schedule_writes_latest_alone_and_counts_from_the_last_checkpoint(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(checkpoints.time, "monotonic", lambda: clock[0])
    written = []
    args = Namespace(checkpoint_every=4, save_model=False, checkpoint_minutes=1.5)
    schedule = checkpoints.CheckpointSchedule(
        lambda i: written.append((i, schedule.step_file)) or Path("latest.pt"), args, 0
    )
    for iteration, seconds in enumerate([30, 60, 95, 100, 188, 200, 250], start=1):
        clock[0] = seconds
        schedule.iteration_done(iteration, schedule.time_due())
    # 95 s: due by time (latest.pt alone); 4 by iterations (a step file); each restarts the clock, so 188 s is not due
    assert written == [(3, False), (4, True), (6, False)]


def test_a_signal_handled_as_the_stop_decision_returns_stops_after_the_next_iteration(monkeypatch):
    """Under torchrun a rank spends much of its time waiting in the all-reduce that decides whether
    to stop, so a signal's handler often runs just as it returns: that request must not be lost."""
    from types import SimpleNamespace

    from common import distributed
    from common.interrupt import GracefulInterrupt, _Request
    from common.run_start import Run

    run = Run.__new__(Run)
    run.interrupt = GracefulInterrupt()
    run.saving = SimpleNamespace(time_due=lambda: False, iteration_done=lambda *_: None)
    run.log = SimpleNamespace(iteration_started=lambda: None)

    def signal_as_the_reduction_returns(*values: float) -> list[float]:
        run.interrupt._handle(signal.SIGTERM, None)  # the handler runs after the values were sent
        return list(values)

    monkeypatch.setattr(distributed, "max_over_ranks", signal_as_the_reduction_returns)
    _Request.clear()
    assert not run.iteration_done(1, 1024)
    assert run.iteration_done(2, 2048) and run.interrupt.signum == signal.SIGTERM
    _Request.clear()


@dataclass
class Recorded:
    save_trajectories: Path | None


def test_the_rollout_recorder_records_the_env_s_own_reward_and_the_agent_s_fields(tmp_path):
    envs = gym.wrappers.vector.RecordEpisodeStatistics(
        vector_env([lambda: gym.make("CartPole-v1")] * 2, False)
    )
    normalizer = gym.wrappers.vector.NormalizeReward(envs, gamma=0.99)
    recorder = RolloutRecorder(Recorded(tmp_path / "rollout"), 2, None, None, normalizer)
    obs, _ = normalizer.reset(seed=0)
    for _ in range(2):  # two rollouts of 3 steps
        for _ in range(3):
            next_obs, scaled, terminated, truncated, infos = normalizer.step(
                np.zeros(2, dtype=np.int64)
            )
            recorder.step(obs, np.zeros(2), scaled, terminated, truncated, infos)
            # CartPole pays 1 per step: the scaled reward is not
            assert not np.allclose(scaled, 1.0)
            obs = next_obs
        recorder.end_rollout(values=np.arange(6).reshape(3, 2))
    recorder.save()
    data = load_trajectories(tmp_path / "rollout")
    np.testing.assert_allclose(data["/rewards"], 1.0, rtol=1e-5)
    assert data["/agents/policy/values"].tolist() == [[0, 2, 4, 0, 2, 4], [1, 3, 5, 1, 3, 5]]
    nothing = RolloutRecorder(Recorded(None), 2)
    nothing.step(obs, 0, 0, 0, 0, {})
    assert nothing.rollout == [] and nothing.recording is None  # no path: records nothing


def test_resident_memory_imports_without_resource_and_reads_macos_bytes(monkeypatch):
    # Windows has no `resource` module: the import must not fail (there /proc is missing too: NaN).
    code = "import sys; sys.modules['resource'] = None; from common.resident_memory import rss_mb; print(rss_mb())"
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1]
    )
    assert completed.returncode == 0 and float(completed.stdout) > 10, completed.stderr
    import resource

    from common import resident_memory

    def no_proc(*args, **kwargs):
        raise OSError("no /proc")

    monkeypatch.setattr(resident_memory, "open", no_proc, raising=False)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    monkeypatch.setattr(sys, "platform", "darwin")  # ru_maxrss in bytes
    assert resident_memory.rss_mb() == pytest.approx(peak / 2**20, rel=0.05)
    monkeypatch.setattr(sys, "platform", "linux")  # in kilobytes
    assert resident_memory.rss_mb() == pytest.approx(peak / 2**10, rel=0.05)
    monkeypatch.setattr(resident_memory, "resource", None)
    assert np.isnan(resident_memory.rss_mb())


# --- observation normalisation ---------------------------------------------------------------------------------------


def test_running_norm_passes_some_features_as_they_are_and_only_scales_others_also_in_numpy():
    norm = RunningNorm(4, as_is=slice(1, 3), scaled_only=slice(3, 4))
    rng = np.random.default_rng(0)
    batch = rng.normal([5.0, 0.3, 0.5, 2.0], [2.0, 0.5, 0.5, 1.0], (500, 4))
    norm.update(torch.as_tensor(batch))
    x = torch.tensor([[7.0, 0.0, 1.0, -3.0]], dtype=torch.float64)
    expected = [
        (7.0 - batch[:, 0].mean())
        / batch[:, 0].std(),  # the running statistics are the batch's, bar epsilon
        0.0,
        1.0,
        -3.0 / np.sqrt(np.mean(batch[:, 3] ** 2)),  # the root mean square: not shifted
    ]
    np.testing.assert_allclose(norm(x)[0], expected, rtol=1e-5)
    np.testing.assert_allclose(
        norm.numpy_snapshot()(x.numpy().astype(np.float32))[0], expected, rtol=1e-5
    )
    plain = RunningNorm(4)
    plain.update(torch.as_tensor(batch))
    np.testing.assert_allclose(plain(x)[0], (x[0] - batch.mean(0)) / batch.std(0), rtol=1e-5)


def test_the_default_threads_follow_the_network(monkeypatch):
    import ppo_fc

    # what the harness sets for a job's share of the cores
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    before = torch.get_num_threads()
    vectors = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    image = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    try:
        seeding.threads_for(None, ppo_fc.Agent(vectors, gym.spaces.Discrete(2), 64, False))
        assert torch.get_num_threads() == 1  # small products: threads do not pay
        seeding.threads_for(None, ppo_fc.Agent(image, gym.spaces.Discrete(2), 64, False))
        assert torch.get_num_threads() == 2  # the CNN: every core of the share
        seeding.threads_for(
            None,
            torch.nn.Sequential(torch.nn.Linear(3, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)),
        )
        assert torch.get_num_threads() == 2  # ddpg's 256-unit layers too
        seeding.threads_for(1, ppo_fc.Agent(image, gym.spaces.Discrete(2), 64, False))
        assert torch.get_num_threads() == 2  # a number given is kept (seed_and_pick_device set it)
    finally:
        torch.set_num_threads(before)


def test_the_default_threads_need_no_affinity_call_and_tf32_is_off(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # macOS and Windows have none
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert seeding.available_cores() == os.cpu_count()
    before = torch.get_num_threads()
    try:
        seeding.threads_for(None, torch.nn.Linear(256, 256))
        assert torch.get_num_threads() == os.cpu_count()
    finally:
        torch.set_num_threads(before)
    seeding.seed_and_pick_device(1, True, 1, cuda=False)
    # the rollout's checks need float32 convolutions on a GPU
    assert not torch.backends.cudnn.allow_tf32


def test_the_log_times_each_iterations_rollout_and_update(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    now = [100.0]
    monkeypatch.setattr(tracking.time, "time", lambda: now[0])
    writer = SummaryWriter(str(tmp_path))
    args = Namespace(capture_video=False, progress=False)
    log = TrainingLog(writer, args, tmp_path, total_steps=20, global_step=0)
    for step, (start, rollout_end, end) in [(10, (101, 104, 110)), (20, (111, 116, 117))]:
        now[0] = start
        log.iteration_started()
        now[0] = rollout_end
        log.rollout_done()
        now[0] = end
        log.iteration(step, {"charts/learning_rate": 1e-3})
    writer.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    seconds = lambda tag: [(e.step, e.value) for e in events.Scalars(tag)]  # noqa: E731
    assert seconds("perf/rollout_seconds") == [(10, 3.0), (20, 5.0)]
    assert seconds("perf/update_seconds") == [(10, 6.0), (20, 1.0)]


def test_the_finite_check_names_the_parameter_the_loss_that_went_first_and_where_the_fix_goes():
    network = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    check_finite(network, 64, "docs/x.md", policy_loss=torch.tensor(0.5))  # all finite: nothing
    with torch.no_grad():
        network[1].bias.fill_(float("nan"))
    with pytest.raises(TrainingDiverged) as nan_loss:
        check_finite(
            network,
            64,
            "docs/x.md",
            policy_loss=torch.tensor(0.5),
            value_loss=torch.tensor(float("inf")),
        )
    assert re.search(
        r"at step 64, first 1\.bias \(last minibatch: policy loss 0\.5, value loss inf\); the value loss went first: "
        r".*the fix goes in the loss or the update in train\(\) \(docs/x\.md, \"When a check stops a run\"\)",
        str(nan_loss.value),
    ), str(nan_loss.value)
    with pytest.raises(TrainingDiverged, match=r"the losses stayed finite, so a step moved it"):
        check_finite(network, 64, None, policy_loss=torch.tensor(0.5))
