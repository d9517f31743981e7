"""Reading runs back from their TensorBoard events: every record, resumed runs, SPS, steps to threshold."""

from pathlib import Path

import numpy as np
import pytest
from torch.utils.tensorboard import SummaryWriter

from benchmark.events import find_run_dirs, load_events, parse_run_name, summarise_run, trailing_mean


def write_run(folder: Path, returns: list[float], sps_walltimes: list[tuple[int, float]], evals=(), rss=()) -> Path:
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
    assert summary.last_return == pytest.approx(np.mean(np.array(returns[-100:], dtype=np.float64)), abs=1e-12)
    assert summary.eval_returns == [1.5, 2.5] and summary.eval_return == 2.0
    assert summary.sps == (5_120 - 512) / 2.0  # steps over wall time, first to last SPS record
    assert summary.steps == 5_120 and summary.peak_rss_mb == 310.5


def test_steps_to_threshold_uses_the_trailing_100_episode_mean(tmp_path):
    # 150 episodes of 0, then 1s: the trailing mean of 100 reaches 0.5 at the 200th episode (50 zeros, 50 ones)
    run = summarise_run(write_run(tmp_path / "Probe1-v0__ppo_fc__1__1", [0.0] * 150 + [1.0] * 100, [(512, 1.0)]))
    assert run.steps_to_reach(0.5) == 200 * 10
    assert run.steps_to_reach(1.0) == 250 * 10
    assert run.steps_to_reach(1.5) is None
    early = summarise_run(write_run(tmp_path / "Probe1-v0__ppo_fc__2__1", [3.0, 1.0], [(512, 1.0)]))
    assert early.steps_to_reach(2.0) == 10  # fewer than 100 episodes so far: the mean of all of them


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
