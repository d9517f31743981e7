"""Where the training envs are in their episodes, saved without pickling, so that a resumed run continues the episodes
its checkpoint cut instead of starting new ones (and a recurrent agent continues them with the memory it had).

A gymnasium env's internals (physics, step counters, a wrapper's buffers) have no general save format, and pickling
is out. What has one is how the env got there: the state of its generator when its episode began (or the seed of that
reset) and the actions since. Replayed in a fresh copy of the env, they bring it to the same place and leave its
generator where the original's is, wherever the env draws its randomness from its own `np_random`, as gymnasium asks
of envs. The replay is checked against the observations the checkpoint holds; envs that do not replay exactly start
new episodes instead, with one notice line.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import VectorEnv, VectorWrapper

from common.cli import notice

# The per-env arrays of gymnasium's vector wrappers that carry an episode (or a return) from step to step.
WRAPPER_ARRAYS = {
    gym.wrappers.vector.RecordEpisodeStatistics: ("episode_returns", "episode_lengths", "prev_dones"),
    gym.wrappers.vector.NormalizeReward: ("accumulated_reward", "_prev_dones"),
}


class EpisodeRecorder(gym.Wrapper):
    """Keeps what `replay` needs to bring a fresh copy of this env to where this one is in its episode: how the
    episode's reset was seeded and the actions since."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.episode_start: dict[str, Any] = {"seed": None, "rng": None}
        self.episode_actions: list[np.ndarray] = []
        self.replay_from: dict[str, Any] | None = None  # set through the vector env's set_attr, then `replay`

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        rng = None if seed is not None else self.unwrapped.np_random.bit_generator.state
        self.episode_start, self.episode_actions = {"seed": seed, "rng": rng}, []
        return super().reset(seed=seed, options=options)

    def step(self, action):
        # A copy of an array action (the caller may reuse its buffer); a discrete one comes as an immutable scalar.
        self.episode_actions.append(action.copy() if isinstance(action, np.ndarray) else action)
        return self.env.step(action)

    def episode_so_far(self) -> dict[str, Any]:
        return {"start": self.episode_start, "actions": np.array(self.episode_actions)}

    def replay(self) -> Any:
        """Bring this env to where `replay_from` (another copy's `episode_so_far`) was; the observation there."""
        record, self.replay_from = self.replay_from, None
        rng = record["start"]["rng"]
        if rng is not None:
            generator = np.random.Generator(getattr(np.random, rng["bit_generator"])())
            generator.bit_generator.state = rng
            self.unwrapped.np_random = generator
        observation, _ = self.reset(seed=record["start"]["seed"])
        for action in record["actions"]:
            observation, *_ = self.step(action)
        return observation


def capture(envs: VectorEnv, observations: np.ndarray, **carried: np.ndarray) -> dict[str, Any]:
    """The place of `envs` (made by `common.envs.vector_env`, under gymnasium's vector wrappers) in their episodes,
    with the `observations` the agent acts on next and what else the loop `carried` from step to step (a recurrent
    state, where episodes start), as checkpoint values."""
    wrappers = {key: np.array(getattr(wrapper, name)) for wrapper, name, key in _wrapper_arrays(envs)}
    state = {"envs": list(envs.unwrapped.call("episode_so_far")), "wrappers": wrappers, **carried}
    return _checkpoint_values({**state, "observations": observations})


def restore(envs: VectorEnv, state: dict[str, Any], seed: int) -> dict[str, Any] | None:
    """Bring `envs` (as `capture` saw them, and now reset) back to the places `state` holds, and return what it
    holds (the observations, and what else was carried) as NumPy arrays. If an env does not replay to the saved
    observation, every env starts a new episode (reset with `seed`), and None comes back."""
    state = _numpy_values(state)
    envs.unwrapped.set_attr("replay_from", state["envs"])
    replayed = envs.unwrapped.call("replay")
    if not all(np.array_equal(obs, saved) for obs, saved in zip(replayed, state["observations"], strict=True)):
        notice("the envs do not replay to where the checkpoint left them (randomness outside np_random?): new episodes")
        envs.reset(seed=seed)
        return None
    for wrapper, name, key in _wrapper_arrays(envs):
        if key in state["wrappers"]:
            setattr(wrapper, name, state["wrappers"][key])
    return state


def _wrapper_arrays(envs: VectorEnv) -> Iterator[tuple[VectorWrapper, str, str]]:
    """The `WRAPPER_ARRAYS` that the vector wrappers of `envs` have (gymnasium versions differ), with their keys."""
    while isinstance(envs, VectorWrapper):
        for name in WRAPPER_ARRAYS.get(type(envs), ()):
            if hasattr(envs, name):
                yield envs, name, f"{type(envs).__name__}.{name}"
        envs = envs.env


def _checkpoint_values(value: Any) -> Any:
    """NumPy arrays as tensors, inside dicts and lists: `torch.load(weights_only=True)` reads them back."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, dict):
        return {key: _checkpoint_values(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_checkpoint_values(item) for item in value]
    return value


def _numpy_values(value: Any) -> Any:
    """The inverse of `_checkpoint_values`."""
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, dict):
        return {key: _numpy_values(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_numpy_values(item) for item in value]
    return value
