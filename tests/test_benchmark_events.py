"""Reading runs back from their TensorBoard events: every record, resumed runs, SPS, steps to threshold."""

from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

import ppo_fc
from benchmark.events import (
    find_run_dirs,
    load_events,
    parse_run_name,
    summarise_run,
    trailing_mean,
)


def write_run(
    folder: Path, returns: list[float], sps_walltimes: list[tuple[int, float]], evals=(), rss=()
) -> Path:
    """A run folder as the scripts write it, with chosen values, steps and wall times."""
    writer = SummaryWriter(str(folder))
    for step, value in enumerate(returns, start=1):
        writer.add_scalar("charts/episodic_return", value, step * 10, walltime=1_000.0 + step)
    for step, walltime in sps_walltimes:
        writer.add_scalar("charts/SPS", 123, step, walltime=walltime)
    for index, value in enumerate(evals):
        writer.add_scalar("eval/episodic_return", value, 10_000 + index)
    for step, value in rss:
        writer.add_scalar("system/rss_mb", value, step)
    writer.close()
    return folder


def writer_made_at(folder: Path, walltime: float, purge_step: int | None = None) -> SummaryWriter:
    """A SummaryWriter as if made at `walltime`: the events it writes itself (file version, session start) carry it."""
    with mock.patch("time.time", return_value=walltime):
        return SummaryWriter(str(folder), purge_step=purge_step)


def tensorboard_scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of every record of `tag` that TensorBoard's EventAccumulator keeps for the folder."""
    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def read_sps(events_file: Path) -> list:
    """The charts/SPS records of one events file, read by TensorBoard's EventAccumulator."""
    accumulator = EventAccumulator(str(events_file), size_guidance={"scalars": 0})
    accumulator.Reload()
    return accumulator.Scalars("charts/SPS")


def test_reader_gives_back_every_scalar_exactly(tmp_path):
    rng = np.random.default_rng(0)
    # float32 values (what the event files hold), more than EventAccumulator keeps by default (10,000)
    returns = rng.normal(size=12_345).astype(np.float32).tolist()
    run = write_run(
        tmp_path / "CartPole-v1__ppo_fc__7__1700000000",
        returns,
        sps_walltimes=[(512, 2_000.0), (1_024, 2_000.5), (5_120, 2_002.0)],
        evals=[1.5, 2.5],
        rss=[(512, 300.25), (1_024, 310.5), (5_120, 305.0)],
    )
    scalars, _ = load_events(run)
    assert [event.value for event in scalars["charts/episodic_return"]] == returns
    summary = summarise_run(run)
    assert (summary.script, summary.env_id, summary.seed) == ("ppo_fc", "CartPole-v1", 7)
    assert summary.episode_returns.tolist() == returns
    assert summary.episode_steps.tolist() == [10 * step for step in range(1, len(returns) + 1)]
    assert summary.last_return == pytest.approx(
        np.mean(np.array(returns[-100:], dtype=np.float64)), abs=1e-12
    )
    assert summary.eval_returns == [1.5, 2.5] and summary.eval_return == 2.0
    assert summary.sps == (5_120 - 512) / 2.0  # steps over wall time, first to last SPS record
    assert summary.steps == 5_120 and summary.peak_rss_mb == 310.5


def test_a_resumed_run_counts_each_step_once_and_leaves_out_the_time_between_sessions(tmp_path):
    run = tmp_path / "CartPole-v1__ppo_fc__1__1000"
    # Session 1, made at t=1000: 100 steps/s, an episode every 100 steps and SPS every 1,000, up to step 10,000 ...
    first = writer_made_at(run, 1_000.0)
    for step in range(100, 10_001, 100):
        first.add_scalar("charts/episodic_return", 1.0, step, walltime=1_000.0 + step / 100)
        if step % 1_000 == 0:
            first.add_scalar("charts/SPS", 100, step, walltime=1_000.0 + step / 100)
    first.close()  # ... where it crashes (t=1100); its last checkpoint was at step 5,000.
    # Session 2, 1,000 s later: resumed from step 5,000 with 2 s of start-up, then 50 steps/s from step 5,000 on.
    second = writer_made_at(run, 2_100.0, purge_step=5_001)
    for step in range(5_120, 10_001, 100):
        second.add_scalar(
            "charts/episodic_return", 2.0, step, walltime=2_102.0 + (step - 5_000) / 50
        )
    for step in range(6_000, 10_001, 1_000):
        second.add_scalar("charts/SPS", 50, step, walltime=2_102.0 + (step - 5_000) / 50)
    second.close()

    summary = summarise_run(run)
    kept_first, kept_second = list(range(100, 5_001, 100)), list(range(5_120, 10_001, 100))
    # nothing of session 1 at step 5,001 or later
    assert summary.episode_steps.tolist() == kept_first + kept_second
    assert summary.episode_returns.tolist() == [1.0] * len(kept_first) + [2.0] * len(kept_second)
    assert np.all(np.diff(summary.episode_steps) >= 0)
    # SPS: 4,000 steps in 40 s (session 1, steps 1,000 to 5,000) and 4,000 in 80 s (session 2, 6,000 to 10,000)
    assert summary.sps == pytest.approx(8_000 / 120, rel=1e-9)
    # Training seconds: session 1 from its start to its last kept record (50 s), then session 2 from its own start.
    expected_seconds = [step / 100 for step in kept_first] + [
        50 + 2 + (step - 5_000) / 50 for step in kept_second
    ]
    np.testing.assert_allclose(summary.episode_seconds, expected_seconds, rtol=0, atol=1e-9)
    assert summary.steps == 10_000 and summary.sessions == 2
    # TensorBoard's own EventAccumulator, reading the folder, drops the same records on the SessionLog START event.
    assert [
        step for step, _ in tensorboard_scalars(run, "charts/episodic_return")
    ] == kept_first + kept_second
    assert [step for step, _ in tensorboard_scalars(run, "charts/SPS")] == [
        1_000 * k for k in range(1, 11)
    ]


def test_sessions_are_ordered_by_when_they_started_not_by_file_name(tmp_path):
    run = tmp_path / "CartPole-v1__ppo_fc__1__1000"
    first = writer_made_at(run, 1_000.0)
    for step in (100, 200, 300):
        first.add_scalar("charts/episodic_return", 1.0, step, walltime=1_000.0 + step)
    first.close()
    second = writer_made_at(run, 2_000.0, purge_step=201)
    second.add_scalar("charts/episodic_return", 2.0, 250, walltime=2_050.0)
    second.close()
    # The resumed session's file renamed to sort first: the order must come from the events, not the names.
    resumed_file = next(run.glob("events.out.tfevents.0000002000.*"))
    resumed_file.rename(run / resumed_file.name.replace(".0000002000.", ".0000000999."))
    summary = summarise_run(run)
    assert summary.episode_steps.tolist() == [
        100,
        200,
        250,
    ] and summary.episode_returns.tolist() == [1.0, 1.0, 2.0]


def test_a_resumed_ppo_fc_run_reads_back_as_one_run(tmp_path):
    settings = dict(
        env_id="CartPole-v1", num_envs=4, num_steps=128, total_timesteps=2_048, checkpoint_every=1
    )
    args = ppo_fc.Args(
        **settings, run_dir=str(tmp_path), eval_episodes=0, save_model=False, progress=False
    )
    run = ppo_fc.train(args).run_dir
    ppo_fc.train(ppo_fc.Args(resume=str(run / "checkpoints" / "step_1024.pt"), progress=False))

    summary = summarise_run(run)
    assert summary.steps == 2_048 and len(summary.episode_steps) > 0
    assert np.all(np.diff(summary.episode_steps) >= 0) and np.all(
        np.diff(summary.episode_seconds) >= 0
    )
    scalars, _ = load_events(run)
    # each step once
    assert [event.step for event in scalars["charts/SPS"]] == [512, 1_024, 1_536, 2_048]
    # By hand, each events file read on its own: the first session's records past step 1,024 were redone.
    first_file, second_file = sorted(
        run.glob("events.out.tfevents.*"), key=lambda path: read_sps(path)[0].step
    )
    first_kept = [event for event in read_sps(first_file) if event.step <= 1_024]
    spans = [(records[0], records[-1]) for records in (first_kept, read_sps(second_file))]
    assert sum(last.step - first.step for first, last in spans) == 1_024
    seconds = sum(last.wall_time - first.wall_time for first, last in spans)
    assert summary.sps == pytest.approx(1_024 / seconds)
    assert summary.sessions == 2


def test_sps_needs_two_records_of_one_session(tmp_path):
    single = summarise_run(
        write_run(tmp_path / "CartPole-v1__ppo_fc__1__1", [1.0], [(512, 1_001.0)])
    )
    # one iteration: no figure without start-up in it
    assert single.sps is None and single.steps == 512
    run = tmp_path / "CartPole-v1__ppo_fc__2__1"
    first = writer_made_at(run, 1_000.0)
    first.add_scalar("charts/SPS", 100, 512, walltime=1_010.0)
    first.close()
    second = writer_made_at(run, 2_000.0, purge_step=513)
    second.add_scalar("charts/SPS", 100, 1_024, walltime=2_010.0)
    second.close()
    resumed = summarise_run(run)
    # the two records span the gap between the sessions
    assert resumed.sps is None and resumed.steps == 1_024


def test_steps_to_threshold_uses_the_trailing_100_episode_mean(tmp_path):
    # 150 episodes of 0, then 1s: the trailing mean of 100 reaches 0.5 at the 200th episode (50 zeros, 50 ones)
    run = summarise_run(
        write_run(tmp_path / "Probe1-v0__ppo_fc__1__1", [0.0] * 150 + [1.0] * 100, [(512, 1.0)])
    )
    assert run.steps_to_reach(0.5) == 200 * 10
    assert run.steps_to_reach(1.0) == 250 * 10
    assert run.steps_to_reach(1.5) is None
    # Fewer than 100 episodes never reach a threshold, however good they are; the 100th does.
    early = summarise_run(write_run(tmp_path / "Probe1-v0__ppo_fc__2__1", [3.0] * 99, [(512, 1.0)]))
    assert early.steps_to_reach(2.0) is None
    full = summarise_run(write_run(tmp_path / "Probe1-v0__ppo_fc__3__1", [3.0] * 100, [(512, 1.0)]))
    assert full.steps_to_reach(2.0) == 100 * 10


def test_a_case_s_window_sets_the_training_return_and_when_a_threshold_is_reached(tmp_path):
    returns = [0.0] * 90 + [1.0] * 10
    path = write_run(tmp_path / "Pendulum-v1__ddpg__1__1", returns, [(512, 1.0)])
    assert summarise_run(path).last_return == pytest.approx(0.1)  # the last 100
    last_ten = summarise_run(path, window=10)
    assert last_ten.last_return == 1.0 and last_ten.window == 10
    # the 95th episode: 5 zeros and 5 ones in its last 10
    assert last_ten.steps_to_reach(0.5) == 95 * 10
    assert summarise_run(path).steps_to_reach(0.5) is None


def test_steps_to_threshold_judges_a_step_by_every_episode_that_ended_there(tmp_path):
    run = tmp_path / "Probe1-v0__ppo_fc__1__1"
    writer = SummaryWriter(str(run))
    for step in range(1, 100):
        writer.add_scalar("charts/episodic_return", 1.0, step * 10)
    # episodes 100 and 101 end at the same step: at step 1,000 the mean is far below 1
    for value in (1.0, -1_000.0):
        writer.add_scalar("charts/episodic_return", value, 1_000)
    for step in range(101, 301):
        writer.add_scalar("charts/episodic_return", 1.0, step * 10)
    writer.close()
    summary = summarise_run(run)
    # the first step with the -1,000 out of the last 100 episodes
    assert summary.steps_to_reach(0.5) == 2_000
    assert summary.steps_to_reach(-10.0) == 1_000


def test_run_names_and_folders(tmp_path):
    assert parse_run_name("ALE-Pong-v5__ppo_fc__3__1795324882") == ("ALE-Pong-v5", "ppo_fc", 3)
    assert parse_run_name("CartPole-v1__my__exp__1__17") == ("CartPole-v1", "my__exp", 1)
    assert parse_run_name("whatever") == ("?", "whatever", None)
    write_run(tmp_path / "a" / "CartPole-v1__ppo_fc__1__1", [1.0], [(512, 1.0)])
    write_run(tmp_path / "a" / "CartPole-v1__ppo_fc__1__2__eval", [1.0], [(512, 1.0)])
    assert [path.name for path in find_run_dirs([tmp_path])] == ["CartPole-v1__ppo_fc__1__1"]


def test_trailing_mean_equals_a_plain_loop():
    values = np.random.default_rng(1).normal(size=250)
    for window in (1, 20, 100, 300):
        expected = [np.mean(values[max(0, i + 1 - window) : i + 1]) for i in range(len(values))]
        np.testing.assert_allclose(trailing_mean(values, window), expected, rtol=1e-12, atol=1e-12)


def test_a_cleanrl_run_is_stored_as_the_harness_stores_its_own_and_compared_window_by_window(
    tmp_path,
):
    from benchmark.cleanrl_runs import comparison_table, store_cleanrl_run
    from benchmark.stored import load_run, store_run

    # CleanRL logs an episode at the index of its last step (from 0), ddpg.py at the steps taken (from 1):
    # a 1,000-step episode ends at 999 in one and at 1,000 in the other, in the same window of 2,000 steps.
    cleanrl_dir = tmp_path / "runs" / "HalfCheetah-v5__ddpg_continuous_action__2__1795965431"
    writer = SummaryWriter(str(cleanrl_dir))
    for episode, value in enumerate([1.0, 3.0, 10.0, 20.0, 30.0]):
        writer.add_scalar(
            "charts/episodic_return", value, episode * 1_000 + 999, walltime=1_000.0 + episode
        )
        writer.add_scalar("charts/SPS", 100, episode * 1_000 + 999, walltime=1_000.0 + episode)
    writer.close()
    path, _ = store_cleanrl_run(cleanrl_dir, 5_000, tmp_path / "stored")
    assert path.name == "cleanrl_ddpg_continuous_action__HalfCheetah-v5__5000__2.json"
    stored, made = load_run(tmp_path / "stored", path.stem)
    assert stored.episode_returns.tolist() == [1.0, 3.0, 10.0, 20.0, 30.0]
    assert made["command"].endswith(
        "--env-id HalfCheetah-v5 --seed 2 --total-timesteps 5000 --no-cuda"
    )

    ours_dir = tmp_path / "HalfCheetah-v5__ddpg__2"
    writer = SummaryWriter(str(ours_dir))
    for episode, value in enumerate([5.0, 7.0, 100.0, 200.0, 300.0], start=1):
        writer.add_scalar(
            "charts/episodic_return", value, episode * 1_000, walltime=2_000.0 + episode
        )
    writer.close()
    ours = store_run(
        tmp_path / "ours", "ddpg__HalfCheetah-v5__5000__x__2", summarise_run(ours_dir), {}
    )
    table = comparison_table([path, ours], window=2_000).splitlines()
    assert table[2] == "| 0-2,000 | 2 | 6 |"
    assert table[3] == "| 2,000-4,000 | 15 | 150 |"
    assert table[4] == "| 4,000-6,000 | 30 | 300 |"
    assert table[5] == "| last 100 episodes | 12.8 | 122.4 |"


def test_storing_cleanrl_runs_from_a_folder_without_any_is_one_error_line(tmp_path):
    import subprocess
    import sys

    command = [
        sys.executable,
        "-m",
        "benchmark.cleanrl_runs",
        "store",
        str(tmp_path),
        "--steps",
        "10",
    ]
    command += ["--out", str(tmp_path / "stored")]
    result = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert (result.returncode, result.stderr) == (
        2,
        f"error: no TensorBoard run folder in {tmp_path}\n",
    )
    assert not (tmp_path / "stored").exists()
