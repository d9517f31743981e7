"""Where the training envs are in their episodes, saved without pickling, so that a resumed run
continues the episodes its checkpoint cut instead of starting new ones (and a recurrent agent
continues them with the memory it had).

A gymnasium env's internals (physics, step counters, a wrapper's buffers) have no general save
format, and pickling is out. What has one is how the env got there: the state of its generator when
its episode began (or the seed of that reset) and the actions since. Replayed in a fresh copy of the
env, they bring it to the same place and leave its generator where the original's is, wherever the
env draws its randomness from its own `np_random`, as gymnasium asks of envs. The replay is checked
against the observations the checkpoint holds; envs that do not replay exactly start new episodes
instead, with one notice line."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import VectorEnv, VectorWrapper

from common import atari, distributed
from common.cli import notice
from common.seeding import restore_rng_state, seed_generators

# The per-env arrays of gymnasium's vector wrappers that carry an episode (or a return) from step to
# step.
WRAPPER_ARRAYS = {
    gym.wrappers.vector.RecordEpisodeStatistics: (
        "episode_returns",
        "episode_lengths",
        "prev_dones",
    ),
    gym.wrappers.vector.NormalizeReward: ("accumulated_reward", "_prev_dones"),
}


class EpisodeRecorder(gym.Wrapper):
    """Keeps what `replay` needs to bring a fresh copy of this env to where this one is in its
    episode: how the episode's reset was seeded and the actions since (up to `MAX_STEPS`: past them,
    and for an env whose `np_random` is not a numpy Generator, the episode cannot be replayed)."""

    MAX_STEPS = 100_000  # 14 MB of 6-dimensional float32 actions held for each env; a checkpoint stores them too

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.episode_start: dict[str, Any] = {"seed": None, "rng": None}
        self.episode_actions: list[Any] | None = (
            None  # None: not replayable (no reset yet, or past MAX_STEPS)
        )
        # where resets that continue the game (a lost life) came, in the actions
        self.episode_resets: list[int] = []
        self.replay_from: dict[str, Any] | None = (
            None  # set through the vector env's set_attr, then `replay`
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is None and self.env.has_wrapper_attr("next_reset_continues"):
            # a lost life: the game and its record go on
            if self.env.get_wrapper_attr("next_reset_continues"):
                if self.episode_actions is not None:
                    self.episode_resets.append(len(self.episode_actions))
                return super().reset(options=options)
        rng = None if seed is not None else generator_state(self.unwrapped)
        # A seeded reset seeds an emulator's own generator too; otherwise the replay starts from its
        # saved state.
        emulator = None if seed is not None else atari.emulator_state(self.unwrapped)
        self.episode_start = {"seed": seed, "rng": rng, "emulator": emulator}
        self.episode_actions = [] if seed is not None or rng is not None else None
        self.episode_resets = []
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.episode_actions is not None:
            # A copy of an array action (the caller may reuse its buffer); a discrete one is an
            # immutable scalar.
            self.episode_actions.append(action.copy() if isinstance(action, np.ndarray) else action)
            if len(self.episode_actions) > self.MAX_STEPS:
                self.episode_actions = None
        return self.env.step(action)

    def episode_so_far(self) -> dict[str, Any]:
        """The record `replay` takes (or `replayable` False), with the generator's state now, which
        the replay must reach too."""
        if self.episode_actions is None:
            return {"replayable": False}
        actions, resets = (
            np.array(self.episode_actions),
            np.array(self.episode_resets, dtype=np.int64),
        )
        record = {
            "start": self.episode_start,
            "actions": actions,
            "resets": resets,
            "rng": generator_state(self),
        }
        return {"replayable": True, **record}

    def replay(self) -> tuple[Any, dict[str, Any] | None]:
        """Bring this env to where `replay_from` (another copy's `episode_so_far`) was: the
        observation there and the generator's state."""
        record, self.replay_from = self.replay_from, None
        rng = record["start"]["rng"]
        if rng is not None:
            generator = np.random.Generator(getattr(np.random, rng["bit_generator"])())
            generator.bit_generator.state = rng
            self.unwrapped.np_random = generator
        # this copy's game is not the one the record began
        if self.env.has_wrapper_attr("next_reset_continues"):
            self.env.set_wrapper_attr("next_reset_continues", False)
        if record["start"].get("emulator") is not None:
            atari.restore_emulator(self.unwrapped, record["start"]["emulator"])
        observation, _ = self.reset(seed=record["start"]["seed"])
        resets = set(record.get("resets", np.zeros(0, np.int64)).tolist())
        for step, action in enumerate(record["actions"]):
            if step in resets:
                observation, _ = self.reset()
            observation, *_ = self.step(action)
        if len(record["actions"]) in resets:  # the record's last step lost a life
            observation, _ = self.reset()
        return observation, generator_state(self)


def generator_state(env: gym.Env) -> dict[str, Any] | None:
    """The state of the env's `np_random` (None for a legacy RandomState, which some old envs still
    set)."""
    generator = env.unwrapped.np_random
    return generator.bit_generator.state if isinstance(generator, np.random.Generator) else None


def capture(envs: VectorEnv, observations: np.ndarray, **carried: np.ndarray) -> dict[str, Any]:
    """The place of `envs` (made by `common.envs.vector_env`, under gymnasium's vector wrappers) in
    their episodes, with the `observations` the agent acts on next and what else the loop `carried`
    from step to step (a recurrent state, where episodes start), as checkpoint values."""
    wrappers = {
        key: np.array(getattr(wrapper, name)) for wrapper, name, key in _wrapper_arrays(envs)
    }
    state = {"envs": list(envs.unwrapped.call("episode_so_far")), "wrappers": wrappers, **carried}
    return _checkpoint_values({**state, "observations": observations})


def restore(envs: VectorEnv, state: dict[str, Any], seed: int) -> tuple[np.ndarray, dict[str, Any]]:
    """Bring `envs` (as `capture` saw them, and now reset) back to the places `state` holds: the
    observations there, and what else was carried (NumPy arrays), with `continued` True. If an env
    cannot be replayed, or its replay reaches another observation or generator state, every env
    starts a new episode (reset with `seed`) with a notice, and nothing is carried.

    Exact for envs whose every draw comes from their own `np_random` and whose episodes depend on
    nothing an earlier episode left behind (a curriculum counter would not be restored, and the
    check sees only the generator and the observation)."""
    state = _numpy_values(state)
    if all(record["replayable"] for record in state["envs"]):
        envs.unwrapped.set_attr("replay_from", state["envs"])
        replayed = envs.unwrapped.call("replay")
        saved = state["observations"]
        per_env = (
            [{key: part[i] for key, part in saved.items()} for i in range(len(replayed))]
            if isinstance(saved, dict)  # an image and a vector (common.envs.image_and_vector)
            else saved
        )
        if all(
            _equal_observations(observation, saved) and _equal(rng, record["rng"])
            for (observation, rng), saved, record in zip(
                replayed, per_env, state["envs"], strict=True
            )
        ):
            for wrapper, name, key in _wrapper_arrays(envs):
                if key in state["wrappers"]:
                    setattr(wrapper, name, state["wrappers"][key])
            carried = {
                key: state[key] for key in state if key not in ("envs", "wrappers", "observations")
            }
            return state["observations"], {"continued": True, **carried}
    notice(
        "the envs cannot be brought back to where the checkpoint left them (see common/env_state.py): new episodes",
        every_rank=True,
    )
    observations, _ = envs.reset(seed=seed)
    return observations, {}


def start(envs: VectorEnv, checkpoint: dict | None, seed: int) -> tuple[np.ndarray, dict[str, Any]]:
    """The observations a run acts on first, and what its loop carried (nothing for a new run). A
    new run resets `envs` with `seed`; a resumed one first restores the checkpoint's generators
    (call this after everything is built: building draws random numbers), then continues the
    episodes the checkpoint cut (see `restore`).

    Under torchrun rank r's env i is seeded as env r x num_envs + i of one process would be, and a
    checkpoint of as many processes gives each rank its own generators and episodes; one of another
    number starts new episodes."""
    seed += distributed.rank() * envs.num_envs
    own = _own_state(checkpoint, seed)
    if own is not None:
        restore_rng_state(own["rng"])
    observations, _ = envs.reset(seed=seed)
    return restore(envs, own["episodes"], seed) if own is not None else (observations, {})


def _own_state(checkpoint: dict | None, seed: int) -> dict | None:
    """This rank's generators and env places in `checkpoint` (None: a new run, or a checkpoint of
    another number of processes, after which the generators are seeded with `seed`)."""
    if checkpoint is None:
        return None
    ranks = checkpoint.get("ranks", [checkpoint])
    if len(ranks) == distributed.world_size():
        return ranks[distributed.rank()]
    notice(
        f"the checkpoint was written by {len(ranks)} process(es), this run has {distributed.world_size()}: its "
        "weights, optimizer and statistics go on; the envs start new episodes and the generators are seeded anew"
    )
    seed_generators(seed)
    return None


def _equal_observations(replayed: Any, saved: Any) -> bool:
    """Whether a replayed observation is the saved one, in the saved dtype (each part of a dict)."""
    if isinstance(saved, dict):
        return replayed.keys() == saved.keys() and all(
            _equal_observations(replayed[k], saved[k]) for k in saved
        )
    return np.array_equal(np.asarray(replayed, saved.dtype), saved)


def _equal(a: Any, b: Any) -> bool:
    """Equality of generator states, which may hold arrays (MT19937's key)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[key], b[key]) for key in a)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(a, b)
    return a == b


def _wrapper_arrays(envs: VectorEnv) -> Iterator[tuple[VectorWrapper, str, str]]:
    """The `WRAPPER_ARRAYS` that the vector wrappers of `envs` have (gymnasium versions differ),
    with their keys."""
    while isinstance(envs, VectorWrapper):
        for name in WRAPPER_ARRAYS.get(type(envs), ()):
            if hasattr(envs, name):
                yield envs, name, f"{type(envs).__name__}.{name}"
        envs = envs.env


def _checkpoint_values(value: Any) -> Any:
    """NumPy arrays as tensors, inside dicts and lists: `torch.load(weights_only=True)` reads them
    back."""
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
