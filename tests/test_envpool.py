"""--env-backend envpool (common/envpool_atari.py): EnvPool's games in place of what common.envs.make
builds, inside the script's own make_env; whole games in the statistics; resume; bad input."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from common import envs
from common.errors import UsageError
from common.trajectories import load_trajectories
from tests.helpers import each_in_one_process, read_scalars, run_script

pytest.importorskip("envpool")
pytest.importorskip("ale_py")

ENV_ID = "ale_py:BreakoutNoFrameskip-v4"


def raw_rewards(infos: dict) -> np.ndarray:
    """Each env's points before the clip: an env whose episode ended has its step's info in
    `final_info` (SAME_STEP)."""
    points = np.zeros(2)
    for part in (infos, infos.get("final_info", {})):
        if "raw_reward" in part:
            points = np.where(part["_raw_reward"], part["raw_reward"], points)
    return points


def test_a_lost_life_ends_an_episode_and_the_game_goes_on_a_game_over_starts_the_next_in_the_same_step():
    pool = envs.envpool_envs([lambda: envs.make(ENV_ID, frame_stack=4)] * 2, ENV_ID)
    observations, _ = pool.reset(seed=1)
    assert observations.shape == (2, 4, 84, 84) and observations.dtype == np.uint8
    rng = np.random.default_rng(0)
    scores, lengths, lives_lost, games = np.zeros(2), np.zeros(2, dtype=int), np.zeros(2), []
    for _ in range(2000):  # about 4 games of each env
        next_observations, rewards, terminations, truncations, infos = pool.step(
            rng.integers(4, size=2)
        )
        assert set(np.unique(rewards)) <= {0.0, 1.0}  # clipped; Breakout's raw points are 1 to 7
        scores, lengths = scores + raw_rewards(infos), lengths + 1
        game_over = infos.get("_episode", np.zeros(2, dtype=bool))
        for i in np.flatnonzero(terminations | truncations):
            assert (
                np.array_equal(infos["final_obs"][i][-1], next_observations[i][-1]) != game_over[i]
            )
            if game_over[i]:  # a new game: the final frame is not the next observation
                games.append((infos["episode"]["r"][i], infos["episode"]["l"][i]))
                assert games[-1] == (scores[i], lengths[i]) and lives_lost[i] == 4
                scores[i], lengths[i], lives_lost[i] = 0, 0, 0
            else:  # a lost life: the game goes on from the same frame
                lives_lost[i] += 1
        observations = next_observations
    assert len(games) >= 4 and all(length > 50 for _, length in games)
    pool.close()


@pytest.mark.parametrize("seed", [1, 2])
def test_a_policy_that_never_presses_fire_still_plays_breakout_to_its_end(seed):
    # EnvPool presses FIRE only for one frame at a game's start, and not after a lost life: the
    # gymnasium path's FIRE and UP are taken for the agent, or Breakout waits for its ball forever
    pool = envs.envpool_envs([lambda: envs.make(ENV_ID, frame_stack=4)], ENV_ID)
    pool.reset(seed=seed)
    lengths = []
    for _ in range(1500):
        *_, infos = pool.step(np.zeros(1, dtype=int))
        if infos.get("_episode", [False])[0]:
            lengths.append(int(infos["episode"]["l"][0]))
    pool.close()
    assert len(lengths) >= 3 and max(lengths) < 400, lengths


def test_the_script_s_own_wrappers_wrap_envpool_s_games_and_what_it_cannot_serve_is_refused():
    def scaled():
        return gym.wrappers.TransformReward(envs.make(ENV_ID, frame_stack=1), lambda r: 10 * r)

    pool = envs.envpool_envs([scaled] * 2, ENV_ID)
    assert pool.single_observation_space.shape == (84, 84)
    pool.reset(seed=2)
    rng = np.random.default_rng(0)
    rewards = np.concatenate([pool.step(rng.integers(4, size=2))[1] for _ in range(400)])
    assert 10.0 in rewards and set(np.unique(rewards)) <= {0.0, 10.0}
    pool.close()

    def acts_otherwise():
        return gym.wrappers.TransformAction(
            envs.make(ENV_ID), lambda a: 3 - a, gym.spaces.Discrete(4)
        )

    def made_elsewhere():
        return gym.make(ENV_ID)

    for make_env, refused in [
        (acts_otherwise, "changes the actions"),
        (made_elsewhere, "did not call"),
    ]:
        with pytest.raises(UsageError, match=refused):
            envs.envpool_envs([make_env], ENV_ID)

    class FireForNoop(gym.Wrapper):  # not an ActionWrapper: found by trying each action
        def step(self, action):
            return self.env.step(1 if action == 0 else action)

    class RepeatsEachStep(gym.Wrapper):  # EnvPool has stepped once: a second step has no result
        def step(self, action):
            self.env.step(action)
            return self.env.step(action)

    for wrapper, refused in [
        (FireForNoop, "changed the actions"),
        (RepeatsEachStep, "more than once"),
    ]:
        pool = envs.envpool_envs([lambda w=wrapper: w(envs.make(ENV_ID))], ENV_ID)
        with pytest.raises(UsageError, match=refused):
            pool.unwrapped.try_each_action()


@pytest.mark.parametrize("script", ["ppo_fc.py", "ppo_lstm.py", "ppo_transformer.py"])
def test_each_script_trains_on_envpool_logs_one_score_a_game_and_resumes_with_a_notice(
    script, tmp_path
):
    runs, recording = tmp_path / "runs", tmp_path / "recording"
    flags = ["--env-id", "BreakoutNoFrameskip-v4", "--env-backend", "envpool", "--num-envs", "2"]
    flags += ["--num-steps", "128", "--total-timesteps", "1536", "--checkpoint-every", "3"]
    flags += [
        "--update-epochs",
        "1",
        "--eval-episodes",
        "1",
        "--no-progress",
        "--run-dir",
        str(runs),
    ]
    completed = run_script(script, *flags, "--save-trajectories", str(recording), timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    (run,) = runs.iterdir()
    scalars = read_scalars(run)
    logged = [(step, score) for step, score in scalars["charts/episodic_return"]]
    # the recording's games: each game's score is its raw points, and only a game's end logs one
    data = load_trajectories(recording)
    ended = data["/infos/_episode"] == 1  # NaN where no game ended
    lives = data["/terminations"] & ~ended
    assert lives.sum() >= 4 * ended.sum() > 0
    points = np.cumsum(
        sum(np.where(data[f"{part}/_raw_reward"] == 1, data[f"{part}/raw_reward"], 0.0)
            for part in ("/infos", "/infos/final_info")),
        axis=1,
    )  # fmt: skip
    for env in range(2):
        ends = np.flatnonzero(ended[env])
        scores = np.diff(np.concatenate([[0.0], points[env, ends]]))
        assert data["/infos/episode/r"][env, ends].tolist() == scores.tolist()
    assert sorted(score for _, score in logged) == sorted(data["/infos/episode/r"][ended].tolist())
    assert len(scalars["eval/episodic_return"]) == 1

    resumed = run_script(
        script, "--resume", str(run / "checkpoints" / "step_768.pt"), "--no-progress", timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "cannot be brought back" in resumed.stderr and "new episodes" in resumed.stderr
    assert read_scalars(run)["charts/learning_rate"][-1][0] == 1536


REFUSED = [
    (["--env-id", "CartPole-v1"], "runs Atari games only"),
    (["--capture-video"], "--capture-video with --env-backend envpool"),
    (["--async-envs"], "--async-envs with --env-backend envpool"),
    (["--env-backend", "gym"], "--env-backend"),
]


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    base = ["ppo_fc.py", "--env-id", "BreakoutNoFrameskip-v4", "--env-backend", "envpool"]
    return each_in_one_process(
        base, [flags for flags, _ in REFUSED], tmp_path_factory.mktemp("bad")
    )


@pytest.mark.parametrize("flags, message", REFUSED)
def test_what_envpool_cannot_run_is_one_error_line(refused, flags, message):
    completed, runs = refused[tuple(flags)]
    lines = [line for line in completed.stderr.splitlines() if line.startswith("error:")]
    assert completed.returncode == 2 and len(lines) == 1 and message in lines[0], completed.stderr
    assert "Traceback" not in completed.stderr and not runs.exists()


def test_without_the_extra_the_error_says_how_to_install_it(tmp_path):
    hide_envpool = "import sys, runpy; sys.modules['envpool'] = None; sys.argv[0] = 'ppo_fc.py'; "
    hide_envpool += "runpy.run_path('ppo_fc.py', run_name='__main__')"
    flags = ["--env-id", "BreakoutNoFrameskip-v4", "--env-backend", "envpool"]
    completed = run_script("-c", hide_envpool, *flags, "--run-dir", str(tmp_path / "runs"))
    assert completed.returncode == 2, completed.stderr
    assert (
        completed.stderr.strip().splitlines()[-1].startswith("error: --env-backend envpool needs")
    )
