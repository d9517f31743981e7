"""Minari export: finished episodes come back from `minari.load_dataset` exactly as `split_episodes` cut them, with
the final observation gymnasium reported, the agent's fields in the infos, lossless images; bad ids are refused."""

import os
import subprocess
import sys
from argparse import Namespace

import gymnasium as gym
import numpy as np
import pytest

from common.envs import evaluation_env, flat_observations, joint_actions, resolve_env_id
from common.errors import UsageError
from common.evaluation import play_episodes
from common.minari_export import export_to_minari
from common.trajectories import TrajectoryWriter, load_trajectories, split_episodes
from tests.helpers import REPO, NoiseEnv, run_script

minari = pytest.importorskip("minari")


@pytest.fixture(autouse=True)
def minari_root(tmp_path, monkeypatch):
    """Every test writes its datasets under its own folder, never in ~/.minari."""
    root = tmp_path / "minari"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root


def record(path, env_fns, num_steps, meta, seed=0):
    """Random actions in a SAME_STEP vector env with episode statistics (as `play_episodes` builds it), recorded to
    `path`; returns the file's data and, per env, the final observations gymnasium reported, in time order."""
    envs = gym.wrappers.vector.RecordEpisodeStatistics(
        gym.vector.SyncVectorEnv(env_fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    )
    envs.action_space.seed(seed)
    writer = TrajectoryWriter(len(env_fns), meta=meta)
    reported = [[] for _ in env_fns]
    observations, _ = envs.reset(seed=seed)
    for _ in range(num_steps):
        actions = envs.action_space.sample()
        next_observations, rewards, terminations, truncations, infos = envs.step(actions)
        writer.add_step(observations, actions, rewards, terminations, truncations, infos=infos)
        for env_index in np.flatnonzero(terminations | truncations):
            reported[env_index].append(np.array(infos["final_obs"][env_index]))
        observations = next_observations
    envs.close()
    return load_trajectories(writer.save(path)), reported


def cartpole(path, num_steps=300, num_envs=2):
    env_fns = [lambda: flat_observations(gym.make("CartPole-v1"))] * num_envs
    return record(
        path,
        env_fns,
        num_steps,
        {"args": {"env_id": "CartPole-v1", "exp_name": "random", "seed": 0}},
    )


def assert_same_episodes(dataset, data, reported):
    """Every finished episode, in order, with exactly the recorded arrays and gymnasium's final observation."""
    finished = [episode for episode in split_episodes(data) if episode.finished]
    # split_episodes' order: env, then time
    finals = [final for per_env in reported for final in per_env]
    assert len(dataset) == len(finished) == len(finals)
    for episode, exported, final in zip(finished, dataset.iterate_episodes(), finals, strict=True):
        assert len(exported) == episode.length
        assert exported.observations.shape == (episode.length + 1, *data["/observations"].shape[2:])
        assert exported.observations.dtype == data["/observations"].dtype
        np.testing.assert_array_equal(exported.observations[:-1], episode.data["/observations"])
        np.testing.assert_array_equal(exported.observations[-1], final)
        for field, key in [
            ("actions", "/actions"),
            ("rewards", "/rewards"),
            ("terminations", "/terminations"),
            ("truncations", "/truncations"),
        ]:
            assert getattr(exported, field).dtype == episode.data[key].dtype, field
            np.testing.assert_array_equal(
                getattr(exported, field), episode.data[key], err_msg=field
            )
    return finished


def test_vector_observations_round_trip(tmp_path):
    data, reported = cartpole(tmp_path / "cartpole.npz")
    episodes = split_episodes(data)
    # the recording cut episodes short: they are left out
    assert any(not episode.finished for episode in episodes)

    export_to_minari(data, "cartpole/random-v0")
    dataset = minari.load_dataset("cartpole/random-v0")

    finished = assert_same_episodes(dataset, data, reported)
    assert (
        dataset.total_steps == sum(episode.length for episode in finished) < data["/rewards"].size
    )
    metadata = [
        (m["source_env"], m["source_start"])
        for m in dataset.storage.get_episode_metadata(range(len(finished)))
    ]
    assert metadata == [(episode.env, episode.start) for episode in finished]

    made = flat_observations(gym.make("CartPole-v1"))
    assert dataset.observation_space == made.observation_space
    assert dataset.action_space == made.action_space
    assert dataset.env_spec.id == "CartPole-v1"
    assert dataset.recover_environment().observation_space == dataset.observation_space

    # The env's infos sit with the observation their step led to: the episode's return with its final observation.
    for episode, exported in zip(finished, dataset.iterate_episodes(), strict=True):
        returns = exported.infos["episode"]["r"]
        assert returns.shape == (episode.length + 1,)
        assert np.isnan(returns[0]) and returns[-1] == episode.total_reward
        np.testing.assert_array_equal(returns[1:], episode.data["/infos/episode/r"])
        assert "final_obs" not in exported.infos

    stored = dataset.storage.metadata
    assert stored["algorithm_name"] == "random"
    assert stored["onefile_rl"]["args"] == {
        "env_id": "CartPole-v1",
        "exp_name": "random",
        "seed": 0,
    }
    assert stored["jpeg_encoding"] is False


def test_flattened_observations_recover_the_flattened_env(tmp_path):
    """Blackjack's Tuple observation is recorded flattened (int64 one-hots): the dataset's env spec carries the
    flattening wrapper, so the recovered env's observations look like the dataset's."""
    env_fns = [lambda: flat_observations(gym.make("Blackjack-v1"))] * 2
    data, reported = record(
        tmp_path / "blackjack.npz", env_fns, 40, {"args": {"env_id": "Blackjack-v1"}}
    )

    export_to_minari(data, "blackjack-random-v0")
    dataset = minari.load_dataset("blackjack-random-v0")

    assert_same_episodes(dataset, data, reported)
    assert dataset.observation_space == gym.spaces.flatten_space(
        gym.make("Blackjack-v1").observation_space
    )
    recovered = dataset.recover_environment()
    assert recovered.observation_space == dataset.observation_space
    assert recovered.observation_space.contains(recovered.reset(seed=0)[0])
    assert "algorithm_name" not in dataset.storage.metadata  # no exp_name in the args


def test_observations_that_do_not_fit_the_env_get_the_datas_space_and_no_env_spec(tmp_path, capsys):
    """A script's own wrapper (ppo_transformer's previous action and reward) changes the observations: the env's
    spec would recover an env whose observations are not the dataset's."""

    def make():
        env = flat_observations(gym.make("CartPole-v1"))
        space = gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)
        return gym.wrappers.TransformObservation(
            env, lambda obs: np.append(obs, np.float32(1)), space
        )

    data, reported = record(
        tmp_path / "extra.npz", [make, make], 60, {"args": {"env_id": "CartPole-v1"}}
    )

    export_to_minari(data, "cartpole/extra-v0")
    dataset = minari.load_dataset("cartpole/extra-v0")

    assert_same_episodes(dataset, data, reported)
    assert dataset.observation_space == gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)
    assert dataset.action_space == gym.spaces.Discrete(2)  # the actions still fit the env's
    assert dataset.env_spec is None
    assert "do not fit its space" in capsys.readouterr().err


def test_multidiscrete_actions_taken_as_one_choice_keep_that_discrete_space(tmp_path, capsys):
    """The PPO scripts take MineSweeper's MultiDiscrete([4, 4]) cell as one of 16 actions, and record that index."""
    env_id = resolve_env_id("popgym-MineSweeperEasy-v0")
    env_fns = [lambda: joint_actions(flat_observations(gym.make(env_id)))] * 2
    data, reported = record(
        tmp_path / "cells.npz", env_fns, 30, {"args": {"env_id": "popgym-MineSweeperEasy-v0"}}
    )

    export_to_minari(data, "minesweeper/cells-v0")
    dataset = minari.load_dataset("minesweeper/cells-v0")

    assert_same_episodes(dataset, data, reported)
    assert dataset.action_space == gym.spaces.Discrete(16)
    # the observations and actions fit; the spec cannot be saved
    assert "do not fit" not in capsys.readouterr().err


def test_evaluation_hidden_states_come_back_in_the_infos(tmp_path):
    rng = np.random.default_rng(0)
    hidden_states = []

    def act(observations, episode_starts):
        hidden_state = rng.standard_normal((1, 2, 1, 16)).astype(np.float32)
        hidden_states.append(hidden_state[0])
        return np.array([int(observations[0, 2] > 0)]), {"policy": {"hidden_state": hidden_state}}

    path = tmp_path / "eval.npz"
    meta = {"args": {"env_id": "CartPole-v1", "exp_name": "ppo_lstm"}}
    env = evaluation_env(lambda: flat_observations(gym.make("CartPole-v1")), Namespace())
    _, lengths = play_episodes(env, act, 3, 1, path, meta)
    data = load_trajectories(path)

    export_to_minari(data, "cartpole/eval-v0")
    dataset = minari.load_dataset("cartpole/eval-v0")

    assert [len(episode) for episode in dataset] == lengths
    assert dataset.storage.metadata["algorithm_name"] == "ppo_lstm"
    start = 0
    for episode in dataset:
        exported = episode.infos["agents"]["policy"]["hidden_state"]
        assert exported.dtype == np.float32 and exported.shape == (len(episode) + 1, 2, 1, 16)
        np.testing.assert_array_equal(
            exported[:-1], np.stack(hidden_states[start : start + len(episode)])
        )
        assert np.isnan(exported[-1]).all()  # the final observation was never acted on
        start += len(episode)


@pytest.mark.parametrize(
    "dataset_id", ["no-version", "bad id-v0", "name-vx", "/rooted-v0", "../up-v0", ""]
)
def test_malformed_ids_are_refused(tmp_path, minari_root, dataset_id):
    data, _ = cartpole(tmp_path / "cartpole.npz", num_steps=40)
    with pytest.raises(UsageError, match="malformed Minari dataset id") as raised:
        export_to_minari(data, dataset_id)
    assert "\n" not in str(raised.value)
    assert not minari.list_local_datasets()


def test_existing_ids_are_refused_and_kept(tmp_path):
    data, reported = cartpole(tmp_path / "cartpole.npz", num_steps=60)
    export_to_minari(data, "cartpole/random-v0")
    other, _ = cartpole(tmp_path / "other.npz", num_steps=30, num_envs=1)
    with pytest.raises(UsageError, match="exists already") as raised:
        export_to_minari(other, "cartpole/random-v0")
    assert "\n" not in str(raised.value)
    assert_same_episodes(minari.load_dataset("cartpole/random-v0"), data, reported)


def test_missing_final_observations_are_refused(tmp_path, minari_root):
    data, _ = cartpole(tmp_path / "cartpole.npz", num_steps=60)
    without = {key: value for key, value in data.items() if key != "/infos/final_obs"}
    with pytest.raises(UsageError, match="no final observation"):
        export_to_minari(without, "cartpole/random-v0")

    nan = dict(data)
    episode = next(episode for episode in split_episodes(data) if episode.finished)
    nan["/infos/final_obs"] = data["/infos/final_obs"].copy()
    nan["/infos/final_obs"][episode.env, episode.start + episode.length - 1] = np.nan
    with pytest.raises(UsageError, match="no final observation") as raised:
        export_to_minari(nan, "cartpole/random-v0")
    assert "\n" not in str(raised.value)
    assert not minari.list_local_datasets()  # refused before anything was written


def test_missing_minari_says_what_to_install(tmp_path, monkeypatch):
    data, _ = cartpole(tmp_path / "cartpole.npz", num_steps=40)
    monkeypatch.setitem(sys.modules, "minari", None)  # import minari now raises ImportError
    with pytest.raises(UsageError, match=r'pip install "onefile-rl\[minari\]"'):
        export_to_minari(data, "cartpole/random-v0")


def test_a_minari_that_would_jpeg_encode_images_is_refused(tmp_path, monkeypatch):
    data, _ = cartpole(tmp_path / "cartpole.npz", num_steps=40)
    monkeypatch.setattr(
        minari, "create_dataset_from_buffers", lambda dataset_id, buffer, env=None, **kwargs: None
    )
    with pytest.raises(UsageError, match=r"minari\[hdf5\]>=0\.5\.4"):
        export_to_minari(data, "cartpole/random-v0")


@pytest.mark.parametrize(
    ("shape", "flatten"),
    [
        ((8, 8, 3), True),  # as the scripts record images: flattened to a uint8 vector
        # recorded as images: Minari would JPEG-encode them unless told not to
        ((32, 32, 3), False),
    ],
)
def test_uint8_images_round_trip_exactly(tmp_path, capsys, shape, flatten):
    def make():
        env = NoiseEnv(shape)
        env.observation_space.seed(1)
        return flat_observations(env) if flatten else env

    # The id is nowhere registered: the spaces come from the data.
    data, reported = record(
        tmp_path / "images.npz", [make, make], 30, {"args": {"env_id": "NoiseImages-v0"}}
    )
    # Images' final observations stay uint8 (0 where none); a flattened image is a vector, NaN where none.
    assert data["/observations"].dtype == np.uint8
    assert data["/infos/final_obs"].dtype == (np.float32 if flatten else np.uint8)

    export_to_minari(data, "noise-images-v0")
    dataset = minari.load_dataset("noise-images-v0")

    assert_same_episodes(dataset, data, reported)
    size = (int(np.prod(shape)),) if flatten else shape
    assert dataset.observation_space == gym.spaces.Box(0, 255, size, np.uint8)
    assert dataset.action_space == gym.spaces.Discrete(3)
    assert dataset.env_spec is None
    assert "'NoiseImages-v0': cannot be made" in capsys.readouterr().err


def test_a_training_recording_exports_from_the_command_line(tmp_path, minari_root):
    # The user's path: a ppo_fc run records to a folder; `python -m common.trajectories PATH --minari ID` exports it.
    recording = tmp_path / "recording"
    flags = [
        "--total-timesteps",
        "2048",
        "--run-dir",
        str(tmp_path / "runs"),
        "--no-progress",
        "--eval-episodes",
        "0",
    ]
    assert run_script("ppo_fc.py", *flags, "--save-trajectories", str(recording)).returncode == 0
    command = [
        sys.executable,
        "-m",
        "common.trajectories",
        str(recording),
        "--minari",
        "cartpole/ppo-v0",
    ]
    exported = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=os.environ)
    assert exported.returncode == 0, exported.stderr
    data = load_trajectories(recording)
    dataset = minari.load_dataset("cartpole/ppo-v0")
    finished = [episode for episode in split_episodes(data) if episode.finished]
    assert len(dataset) == len(finished) > 10
    for episode, exported_episode in zip(finished, dataset.iterate_episodes(), strict=True):
        np.testing.assert_array_equal(
            exported_episode.observations[:-1], episode.data["/observations"]
        )
        np.testing.assert_array_equal(exported_episode.actions, episode.data["/actions"])
        np.testing.assert_array_equal(exported_episode.infos["agents"]["policy"]["logprobs"][:-1],
                                      episode.data["/agents/policy/logprobs"])  # fmt: skip
    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=os.environ)
    assert (
        again.returncode == 2
        and again.stderr.startswith("error: ")
        and "exists already" in again.stderr
    )
