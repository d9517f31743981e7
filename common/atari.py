"""Atari games (ale-py's ids) preprocessed as CleanRL's Atari scripts do, so that their returns
compare: no-op reset (up to 30), frame skip 4 with a max over the last two frames, episodic life,
fire on reset, rewards clipped to their sign, 84x84 greyscale, a frame stack. gymnasium's wrappers
do what they can (`AtariPreprocessing`, `ClipReward`, `FrameStackObservation`); what it lacks is
here: a lost life that ends an episode but not the game, and the fire on reset. docs/ppo_fc.md
"Images and Atari" says what each id gets.

An episode is a game: the per-env `RecordEpisodeStatistics` inside the stack counts the game's raw
score and its length in agent steps, and `GameStatistics` takes them for the vector env's episode
statistics."""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium as gym
import numpy as np

SCREEN_SIZE = 84
NOOP_MAX = 30
FRAME_SKIP = 4


def is_atari(env: gym.Env) -> bool:
    """Whether `env` is one of ale-py's Atari games."""
    return type(env.unwrapped).__module__.startswith("ale_py")


def is_atari_id(env_id: str) -> bool:
    """Whether `env_id` (also `module:id`) names one of ale-py's Atari games."""
    entry_point = _spec(env_id).entry_point
    return isinstance(entry_point, str) and entry_point.startswith("ale_py")


def make_kwargs(env_id: str) -> dict[str, Any]:
    """What `gym.make(env_id)` needs besides the id: frameskip=1 for an ale-py id that skips frames
    by itself (the `ALE/...-v5` ids skip 4), so that `AtariPreprocessing` skips them with its max
    over the last two frames."""
    if is_atari_id(env_id) and _spec(env_id).kwargs.get("frameskip", 1) != 1:
        return {"frameskip": 1}
    return {}


def _spec(env_id: str) -> gym.envs.registration.EnvSpec:
    module, _, name = env_id.rpartition(":")
    if module:
        importlib.import_module(module)  # a spawned worker has not imported it yet
    return gym.spec(name)


def preprocessed(env: gym.Env, frame_stack: int) -> gym.Env:
    """`env` preprocessed as CleanRL's Atari scripts do, with `frame_stack` frames in each
    observation (1: one 84x84 frame, no stack axis); any other env unchanged."""
    if not is_atari(env):
        return env
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, screen_size=SCREEN_SIZE
    )
    env = RawGameStatistics(env)
    env = EpisodicLife(env)
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireReset(env)
    # Atari's rewards are integers: the clip is their sign
    env = gym.wrappers.ClipReward(env, -1.0, 1.0)
    if frame_stack > 1:
        env = gym.wrappers.FrameStackObservation(env, frame_stack)
    return env


class RawGameStatistics(gym.wrappers.RecordEpisodeStatistics):
    """gymnasium's episode statistics of the whole game, before rewards are clipped and lives end
    episodes; each step's unclipped reward also goes into `info["raw_reward"]`, for trajectory
    files."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        info["raw_reward"] = float(reward)
        return obs, reward, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """A lost life ends the episode (terminated), as CleanRL's EpisodicLifeEnv does, but not the
    game: the reset after it only takes a no-op step, and only a game's end resets the game.
    gymnasium's `terminal_on_life_loss` would reset the whole game at every lost life.
    `info["game_over"]` says which an end is."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    @property
    def next_reset_continues(self) -> bool:
        """Whether the next reset continues the game (after a lost life), rather than starting a new
        one."""
        return not self.game_over

    @next_reset_continues.setter
    def next_reset_continues(self, value: bool) -> None:
        self.game_over = not value

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        info["game_over"] = self.game_over
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if self.game_over or seed is not None:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the no-op ended the game
                obs, info = self.env.reset(options=options)
        self.game_over = False
        self.lives = self.env.unwrapped.ale.lives()
        return obs, reset_info(info)


class FireReset(gym.Wrapper):
    """Presses FIRE, then the next action (UP in most games), after every reset, as CleanRL's
    FireResetEnv does: the games that wait for it start."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.env.reset(seed=seed, options=options)
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset(options=options)
        return obs, reset_info(info)


def reset_info(info: dict[str, Any]) -> dict[str, Any]:
    """The info of a step taken inside a reset, without what belongs to the agent's steps: the
    reset's reward is not the agent's, and its end not an episode's."""
    return {
        key: value
        for key, value in info.items()
        if key not in ("raw_reward", "game_over", "episode")
    }


class GameStatistics(gym.vector.VectorWrapper):
    """A vector env's episode statistics as gymnasium's vector `RecordEpisodeStatistics` reports
    them (`infos["episode"]` masked by `infos["_episode"]`), taken from the games'
    `RawGameStatistics`: an episode reported is a whole game, its raw score and its length in agent
    steps."""

    def step(self, actions):
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        infos = dict(infos)
        final = infos.get("final_info", {})
        if "_episode" in final:
            ended = final["_episode"] & infos["_final_info"]
            if ended.any():
                infos["episode"] = {
                    key: np.where(ended, value, 0) for key, value in final["episode"].items()
                }
                infos["_episode"] = ended
        return obs, rewards, terminations, truncations, infos


def emulator_state(env: gym.Env) -> np.ndarray | None:
    """The Atari emulator's state with its own generator (which draws the sticky actions), as bytes
    in a uint8 array; None for an env that is not an Atari game."""
    if not is_atari(env):
        return None
    return np.frombuffer(
        env.unwrapped.ale.cloneState(include_rng=True).serialize(), dtype=np.uint8
    ).copy()


def restore_emulator(env: gym.Env, state: np.ndarray) -> None:
    """Put the Atari emulator of `env` back in `state` (from `emulator_state`)."""
    import ale_py  # an Atari env exists, so ale-py is installed

    env.unwrapped.ale.restoreState(ale_py.ALEState(np.asarray(state, dtype=np.uint8).tobytes()))
