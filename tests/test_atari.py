"""common/atari.py: CleanRL's Atari preprocessing, episodes that are games, and exact resume mid-game."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from common import atari, env_state
from common.envs import episode_statistics, resolve_env_id, vector_env

pytest.importorskip("ale_py")

IDS = ["BreakoutNoFrameskip-v4", "ALE/Breakout-v5"]


def make(env_id: str, frame_stack: int = 4):
    env_id = resolve_env_id(env_id)
    return lambda: atari.preprocessed(gym.make(env_id, **atari.make_kwargs(env_id)), frame_stack)


@pytest.mark.parametrize("env_id", IDS)
def test_both_id_forms_get_84x84_grey_frames_skipped_by_the_preprocessing(env_id):
    env = make(env_id)()
    assert env.observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    # the -v5 id's own skip of 4 is off: AtariPreprocessing skips, with its max
    assert env.unwrapped._frameskip == 1
    sticky = 0.25 if env_id.startswith("ALE/") else 0.0  # the -v5 ids keep their sticky actions
    assert env.unwrapped.ale.getFloat("repeat_action_probability") == sticky
    assert make(env_id, frame_stack=1)().observation_space.shape == (84, 84)
    env.close()


def test_a_lost_life_ends_the_episode_but_not_the_game():
    env = make("BreakoutNoFrameskip-v4")()
    env.reset(seed=1)
    rng = np.random.default_rng(1)
    lives, episodes, games = [], 0, 0
    while games < 2:
        _, reward, terminated, truncated, info = env.step(int(rng.integers(4)))
        # clipped; Breakout's raw rewards are 1-7
        assert reward in (-1.0, 0.0, 1.0) and info["raw_reward"] >= reward
        if terminated or truncated:
            episodes += 1
            games += info["game_over"]
            env.reset()
            lives.append(env.unwrapped.ale.lives())
    assert episodes == 10  # five lives a game
    assert lives == [
        4,
        3,
        2,
        1,
        5,
        4,
        3,
        2,
        1,
        5,
    ]  # a lost life continues the game; a game over starts a new one


@pytest.mark.parametrize("env_id", IDS)
def test_a_checkpoint_brings_the_games_back_exactly_sticky_actions_included(env_id):
    envs = episode_statistics(vector_env([make(env_id)] * 2, async_envs=False))
    observations, _ = envs.reset(seed=3)
    rng = np.random.default_rng(0)
    games_ended = 0
    for _ in range(400):  # past the end of the first games: later ones begin with an unseeded reset
        observations, *_, infos = envs.step(rng.integers(4, size=2))
        games_ended += int(infos.get("_episode", np.zeros(2)).sum())
    assert games_ended > 0
    state = env_state.capture(envs, observations)
    actions = rng.integers(4, size=(100, 2))
    expected = [envs.step(action)[0] for action in actions]

    fresh = episode_statistics(vector_env([make(env_id)] * 2, async_envs=False))
    fresh.reset(seed=99)
    restored, carried = env_state.restore(fresh, state, seed=5)
    assert carried.get("continued") and np.array_equal(restored, observations)
    assert all(
        np.array_equal(fresh.step(action)[0], observation)
        for action, observation in zip(actions, expected, strict=True)
    )
