"""Evaluation episodes: one env, seeded, played to the end of each episode, optionally recorded."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from common.trajectories import TrajectoryWriter


def play_episodes(
    env_fn: Callable[[], gym.Env],
    act: Callable[[np.ndarray, np.ndarray], np.ndarray | tuple[np.ndarray, Mapping[str, Mapping[str, Any]]]],
    episodes: int,
    seed: int,
    trajectory_path: Path | None = None,
    meta: Mapping[str, Any] | None = None,
) -> tuple[list[float], list[int]]:
    """Play `episodes` episodes in one env made by `env_fn`, reset with `seed`, and return their returns and lengths.

    `act(observations, episode_starts)` gets a batch of one observation and whether it is the first of its episode
    (for agents with memory), and returns the action as the env takes it, or the action and the agent's fields to
    record for the step (`{name: {field: array}}`, e.g. a hidden state). With `trajectory_path`, the episodes are
    recorded there.
    """
    env = gym.wrappers.vector.RecordEpisodeStatistics(
        gym.vector.SyncVectorEnv([env_fn], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    )
    recorder = TrajectoryWriter(1, meta=meta) if trajectory_path is not None else None
    returns: list[float] = []
    lengths: list[int] = []
    observations, _ = env.reset(seed=seed)
    episode_starts = np.ones(1, dtype=bool)
    while len(returns) < episodes:
        actions, agents = act(observations, episode_starts), None
        if isinstance(actions, tuple):
            actions, agents = actions
        next_observations, rewards, terminations, truncations, infos = env.step(actions)
        if recorder is not None:
            recorder.add_step(observations, actions, rewards, terminations, truncations, agents, infos)
        if "_episode" in infos and infos["_episode"][0]:
            returns.append(float(infos["episode"]["r"][0]))
            lengths.append(int(infos["episode"]["l"][0]))
        observations, episode_starts = next_observations, terminations | truncations
    env.close()
    if recorder is not None:
        recorder.save(trajectory_path)
    return returns, lengths
