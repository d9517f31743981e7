"""Trajectory files: write/read round trip, no pickle, episode splitting at the rollout edges, errors."""

import json
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import probe_envs  # noqa: F401  (registers the probe ids)
from common.errors import UsageError
from common.trajectories import (
    STEP_KEYS,
    TrajectoryFileError,
    TrajectoryRecording,
    TrajectoryWriter,
    check_destination,
    load_trajectories,
    split_episodes,
)

REPO = Path(__file__).resolve().parents[1]


def record(env_id="Probe6-v0", num_envs=3, num_steps=25, seed=0):
    """Random actions in a SAME_STEP vector env, recorded with the writer; also returns the env-reported returns."""
    envs = gym.wrappers.vector.RecordEpisodeStatistics(
        gym.vector.SyncVectorEnv(
            [lambda: gym.make(env_id)] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )
    )
    envs.action_space.seed(seed)
    writer = TrajectoryWriter(num_envs, meta={"args": {"env_id": env_id, "seed": seed}})
    observations, _ = envs.reset(seed=seed)
    reported = []
    for _ in range(num_steps):
        actions = envs.action_space.sample()
        next_observations, rewards, terminations, truncations, infos = envs.step(actions)
        values = np.arange(num_envs, dtype=np.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a vector env's usual infos record without a warning
            writer.add_step(
                observations,
                actions,
                rewards,
                terminations,
                truncations,
                agents={"policy": {"values": values, "logprobs": -values}},
                infos=infos,
            )
        for env_index in np.flatnonzero(infos.get("_episode", [])):
            reported.append((env_index, float(infos["episode"]["r"][env_index])))
        observations = next_observations
    return writer, reported


def test_info_entries_without_numeric_form_are_left_out_with_one_warning():
    writer = TrajectoryWriter(2)
    infos = {
        # gymnasium's: left out without a warning
        "final_info": np.array([{"a": 1}, None], dtype=object),
        "_final_info": np.array([True, False]),
        "mission": np.array(["go left", "go right"]),
    }
    zeros = np.zeros(2)
    with pytest.warns(UserWarning) as caught:
        writer.add_step(zeros, zeros, zeros, zeros, zeros, infos=infos)
        writer.add_step(zeros, zeros, zeros, zeros, zeros, infos=infos)
    assert [str(warning.message) for warning in caught] == [
        "trajectory writer: info '/mission' has no numeric per-env form; not recorded"
    ]
    assert set(writer.to_dict()) >= {"/infos/_final_info"}
    assert not {"/infos/final_info", "/infos/mission"} & set(writer.to_dict())


def test_an_info_entry_no_env_has_at_a_step_reads_back_nan_there_without_a_warning():
    """dm_control's tasks through Shimmy: `timestep.discount` is None where an episode starts (dm_env's first
    step), a float elsewhere."""
    writer = TrajectoryWriter(2)
    zeros = np.zeros(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for discount in ([1.0, 0.5], [None, None], [1.0, 1.0]):
            infos = {
                "timestep.discount": np.array(discount, dtype=None if None in discount else float)
            }
            writer.add_step(zeros, zeros, zeros, zeros, zeros, infos=infos)
    np.testing.assert_array_equal(
        writer.to_dict()["/infos/timestep.discount"], [[1.0, np.nan, 1.0], [0.5, np.nan, 1.0]]
    )


def test_round_trip_keeps_keys_shapes_dtypes_and_values(tmp_path):
    writer, _ = record()
    written = writer.to_dict()
    path = writer.save(tmp_path / "rollout")
    assert path.name == "rollout.npz" and not list(tmp_path.glob(".*tmp"))
    loaded = load_trajectories(path)
    assert set(loaded) == set(written)
    for key in written:
        assert loaded[key].dtype == written[key].dtype
        np.testing.assert_array_equal(loaded[key], written[key])
    for key in (*STEP_KEYS, "/agents/policy/values", "/agents/policy/logprobs"):
        assert loaded[key].shape[:2] == (3, 25), key
    assert loaded["/observations"].shape == (3, 25, 2)
    assert json.loads(str(loaded["/meta/args"])) == {"env_id": "Probe6-v0", "seed": 0}
    np.testing.assert_array_equal(
        loaded["/masks"], 1.0 - (loaded["/terminations"] | loaded["/truncations"])
    )
    assert loaded["/infos/final_obs"].shape == (3, 25, 2)


def test_files_load_without_pickle(tmp_path):
    writer, _ = record()
    path = writer.save(tmp_path / "r.npz")
    with np.load(path, allow_pickle=False) as archive:
        for key in archive.files:
            archive[key]  # an array that needs pickle raises ValueError here


def test_episode_returns_equal_the_env_reported_returns(tmp_path):
    writer, reported = record(num_steps=40)
    episodes = split_episodes(load_trajectories(writer.save(tmp_path / "r.npz")))
    finished = [(episode.env, episode.total_reward) for episode in episodes if episode.finished]
    assert sorted(finished) == sorted(reported) and len(finished) >= 6
    assert all(episode.length == 10 for episode in episodes if episode.finished)


def test_final_obs_recorded_for_the_steps_that_end_episodes(tmp_path):
    writer, _ = record(num_steps=12)
    data = writer.to_dict()
    ends = data["/terminations"] | data["/truncations"]
    final = data["/infos/final_obs"]
    assert np.isnan(final[~ends]).all()
    np.testing.assert_array_equal(final[ends], np.tile([9.0, 1.0], (int(ends.sum()), 1)))


def make_data(ends_at, truncations_at=(), num_steps=6):
    """One env, rewards 1..num_steps, terminations and truncations at the given steps."""
    terminations = np.zeros((1, num_steps), dtype=bool)
    truncations = np.zeros((1, num_steps), dtype=bool)
    terminations[0, list(ends_at)] = True
    truncations[0, list(truncations_at)] = True
    rewards = np.arange(1, num_steps + 1, dtype=np.float64)[None]
    return {
        "/observations": np.zeros((1, num_steps, 1), np.float32),
        "/actions": np.zeros((1, num_steps), np.int64),
        "/rewards": rewards,
        "/terminations": terminations,
        "/truncations": truncations,
        "/masks": (~(terminations | truncations)).astype(np.float32),
        "/meta/args": np.array("{}"),
    }


def test_split_at_terminations_and_truncations_including_the_edges():
    # Ends on the first and the last step of the rollout, a truncation in between.
    episodes = split_episodes(make_data(ends_at=[0, 5], truncations_at=[3]))
    assert [(e.start, e.length, e.finished, e.total_reward) for e in episodes] == [
        (0, 1, True, 1.0),
        (1, 3, True, 2.0 + 3 + 4),
        (4, 2, True, 5.0 + 6),
    ]
    assert "/meta/args" not in episodes[0].data


def test_unfinished_tail_is_marked_and_a_stream_without_ends_is_one_unfinished_episode():
    episodes = split_episodes(make_data(ends_at=[2]))
    assert [(e.start, e.length, e.finished) for e in episodes] == [(0, 3, True), (3, 3, False)]
    (whole,) = split_episodes(make_data(ends_at=[]))
    assert (whole.start, whole.length, whole.finished, whole.total_reward) == (0, 6, False, 21.0)


def test_termination_and_truncation_on_the_same_step_end_one_episode():
    episodes = split_episodes(make_data(ends_at=[1], truncations_at=[1]))
    assert [(e.start, e.length, e.finished) for e in episodes] == [(0, 2, True), (2, 4, False)]


def test_writer_rejects_wrong_batch_size():
    writer = TrajectoryWriter(2)
    with pytest.raises(ValueError, match="num_envs=2"):
        writer.add_step(np.zeros((3, 1)), np.zeros(3), np.zeros(3), np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="no steps"):
        writer.to_dict()


def test_missing_corrupt_and_foreign_files_give_clear_errors(tmp_path):
    with pytest.raises(TrajectoryFileError, match="does not exist"):
        load_trajectories(tmp_path / "nope.npz")
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"\x80\x04not a zip at all")
    with pytest.raises(TrajectoryFileError, match="not a readable"):
        load_trajectories(garbage)
    writer, _ = record(num_steps=5)
    good = writer.save(tmp_path / "good.npz")
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(good.read_bytes()[:300])
    with pytest.raises(TrajectoryFileError):
        load_trajectories(truncated)
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, weights=np.zeros(3))
    with pytest.raises(TrajectoryFileError, match="lacks /observations"):
        load_trajectories(foreign)
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, **{key: np.array([[object()]], dtype=object) for key in STEP_KEYS})
    with pytest.raises(TrajectoryFileError, match="pickled"):
        load_trajectories(pickled)
    assert zipfile.is_zipfile(pickled)


def test_command_line_summary_and_error(tmp_path):
    writer, reported = record(num_steps=30)
    path = writer.save(tmp_path / "r.npz")
    result = subprocess.run(
        [sys.executable, "-m", "common.trajectories", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = result.stdout.splitlines()
    assert lines[0].startswith("envs: 3  steps per env: 30")
    assert lines[1].startswith(f"episodes: {len(reported)} finished")
    returns = [r for _, r in reported]
    assert (
        lines[2]
        == f"return: mean {np.mean(returns):.4g}  min {min(returns):.4g}  max {max(returns):.4g}"
    )
    assert any(line.startswith("/agents/policy/values") and "(3, 30)" in line for line in lines)
    failed = subprocess.run(
        [sys.executable, "-m", "common.trajectories", str(tmp_path / "missing.npz")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert failed.returncode == 2
    assert failed.stderr.startswith("error: ") and len(failed.stderr.strip().splitlines()) == 1


# --- recordings written as the run goes ----------------------------------------------------------------------------


def recorded_steps(recording, num_steps, info_from=None, observation_dtype=np.float32):
    """`num_steps` steps of 2 envs into `recording`, step t's observation t; an info key from step `info_from` on."""
    for t in range(num_steps):
        infos = {"late": np.full(2, t)} if info_from is not None and t >= info_from else {}
        observations = np.full((2, 3), t, dtype=observation_dtype)
        recording.add_step(
            observations, np.zeros(2), np.ones(2), np.zeros(2), np.zeros(2), infos=infos
        )


def test_a_recording_writes_a_file_each_flush_steps_and_holds_no_more(tmp_path):
    recording = TrajectoryRecording(tmp_path / "r", 2, {"args": {}}, flush_steps=10)
    recorded_steps(recording, 25)
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [
        "steps_0000000000.npz",
        "steps_0000000010.npz",
    ]
    assert len(recording.buffer) == 5  # what a killed run would lose: fewer than flush_steps
    # what a run killed now leaves: every step before the last flush
    data = load_trajectories(tmp_path / "r")
    assert data["/observations"][0, :, 0].tolist() == list(range(20))
    recording.flush()
    assert load_trajectories(tmp_path / "r")["/observations"][1, :, 0].tolist() == list(range(25))


def test_an_info_key_that_first_appears_in_a_later_file_reads_back_nan_before(tmp_path):
    recording = TrajectoryRecording(tmp_path / "r", 2, {}, flush_steps=10)
    recorded_steps(recording, 30, info_from=15)
    recording.flush()
    late = load_trajectories(tmp_path / "r")["/infos/late"]
    assert late.shape == (2, 30) and late.dtype == np.float64
    assert np.isnan(late[:, :15]).all() and late[0, 15:].tolist() == list(range(15, 30))


def test_a_recording_keeps_the_observations_dtype(tmp_path):
    recording = TrajectoryRecording(tmp_path / "r", 2, {}, flush_steps=4)
    recorded_steps(recording, 6, observation_dtype=np.uint8)
    recording.flush()
    assert load_trajectories(tmp_path / "r")["/observations"].dtype == np.uint8


def test_a_continued_recording_drops_the_files_after_its_start_and_a_gap_is_an_error(tmp_path):
    recording = TrajectoryRecording(tmp_path / "r", 2, {}, flush_steps=10)
    recorded_steps(recording, 30)
    continued = TrajectoryRecording(tmp_path / "r", 2, {}, start=10, flush_steps=10)
    assert [p.name for p in (tmp_path / "r").iterdir()] == ["steps_0000000000.npz"]
    with pytest.raises(TrajectoryFileError, match="holds 10 steps before the checkpoint's 15"):
        TrajectoryRecording(tmp_path / "r", 2, {}, start=15)
    # a later file, kept when continuing is refused
    (tmp_path / "r" / "steps_0000000040.npz").write_bytes(b"")
    with pytest.raises(TrajectoryFileError, match="holds 10 steps before the checkpoint's 20"):
        TrajectoryRecording(tmp_path / "r", 2, {}, start=20)
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [
        "steps_0000000000.npz",
        "steps_0000000040.npz",
    ]
    (tmp_path / "r" / "steps_0000000040.npz").unlink()
    recorded_steps(continued, 12)
    continued.flush()
    assert load_trajectories(tmp_path / "r")["/observations"][0, :, 0].tolist() == [
        *range(10),
        *range(12),
    ]
    (tmp_path / "r" / "steps_0000000010.npz").unlink()
    with pytest.raises(TrajectoryFileError, match="should start at step 10"):
        load_trajectories(tmp_path / "r")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrajectoryFileError, match="holds no recorded steps"):
        load_trajectories(tmp_path / "empty")


def test_a_recording_below_a_file_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="is a file, not a folder"):
        check_destination(tmp_path / "file" / "below" / "r")
    check_destination(tmp_path / "new" / "r")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_an_info_key_of_one_dtype_in_one_file_and_with_gaps_in_the_next_reads_back_as_float(
    tmp_path,
):
    # An info at every step of one file keeps its dtype there (a bool mask, an int length); with gaps it is float64.
    recording = TrajectoryRecording(tmp_path / "r", 2, {}, flush_steps=4)
    for t in range(8):
        infos = (
            {"length": np.full(2, t), "_length": np.ones(2, dtype=bool)} if t < 4 or t % 2 else {}
        )
        recording.add_step(
            np.zeros((2, 3)), np.zeros(2), np.ones(2), np.zeros(2), np.zeros(2), infos=infos
        )
    data = load_trajectories(tmp_path / "r")
    assert data["/infos/length"].dtype == data["/infos/_length"].dtype == np.float64
    assert data["/infos/length"][0].tolist()[:4] == [0, 1, 2, 3] and np.isnan(
        data["/infos/length"][0, 4]
    )


def test_final_observations_of_images_stay_uint8_and_vectors_keep_nan_where_none(tmp_path):
    for shape, kept in [((1, 36, 36), True), ((6,), False)]:
        writer = TrajectoryWriter(num_envs=2)
        observations = np.zeros((2, *shape), dtype=np.uint8)
        final = np.array([None, observations[1] + 7], dtype=object)
        writer.add_step(observations, [0, 1], [0.0, 1.0], [False, True], [False, False], infos={})
        writer.add_step(
            observations,
            [0, 1],
            [0.0, 1.0],
            [False, True],
            [False, False],
            infos={"final_obs": final, "_final_obs": np.array([False, True])},
        )
        data = writer.to_dict()
        if kept:  # 0 where there is none; `_final_obs` says which steps have one
            assert data["/infos/final_obs"].dtype == np.uint8 and data["/infos/_final_obs"].tolist() == [
                [False, False], [False, True]
            ]  # fmt: skip
        else:  # a uint8 vector is recorded as before: NaN at the steps without an entry
            assert (
                np.isnan(data["/infos/final_obs"][:, 0]).all()
                and (data["/infos/final_obs"][1, 1] == 7).all()
            )
