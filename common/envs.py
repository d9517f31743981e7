"""Env ids of any installed package that registers gymnasium envs, and observations made flat for
the networks."""

from __future__ import annotations

import ctypes.util
import importlib
import importlib.util
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from importlib import metadata
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.spaces import Box, Dict, Discrete, Space, Text, Tuple

from common import distributed, envpool_atari
from common.atari import GameStatistics, make_kwargs, preprocessed
from common.checkpoints import restore_reward_normalizer
from common.cli import notice, one_line
from common.env_state import EpisodeRecorder
from common.envpool_atari import EnvPoolEnvs, EnvPoolGames, uses_envpool
from common.errors import UsageError
from common.interrupt import (
    end_as_terminated_if_the_pipe_broke,
    ignore_stop_signals,
    stop_signals_held,
)


def _headless_rendering_backend() -> None:
    """MUJOCO_GL for a machine without a display, where the user has not chosen one: EGL, else
    OSMesa, where the library is installed.

    dm_control and gymnasium's MuJoCo envs read MUJOCO_GL when they are imported (so this runs
    before anything imports them; spawned env workers inherit it). Unset, dm_control takes GLFW,
    which has no display to open here: every run printed GLFW's "The DISPLAY environment variable
    is missing" warning, and rendering (--capture-video) failed. EGL and OSMesa render without one.
    Where neither library is found nothing can render, and the choice is left to dm_control."""
    # PYOPENGL_PLATFORM: the user's own OpenGL platform, which MuJoCo's EGL would refuse
    chosen = ("MUJOCO_GL", "PYOPENGL_PLATFORM", "DISPLAY", "WAYLAND_DISPLAY")
    if any(os.environ.get(name) for name in chosen):
        return
    for backend, library in (("egl", "EGL"), ("osmesa", "OSMesa")):
        if ctypes.util.find_library(library):
            os.environ["MUJOCO_GL"] = backend
            return


_headless_rendering_backend()

# The module whose import here registered each id: this process has the id now, a spawned worker
# does not.
_registered_by: dict[str, str] = {}

# Namespaces of ids whose registering module the id does not name: Shimmy registers dm_control's
# tasks (`dm_control/cartpole-balance-v0`) with functions as entry points, which name no package.
_NAMESPACE_MODULES = {"dm_control": "shimmy"}
DM_CONTROL_EXTRA = 'pip install -e ".[dmc]"'


def resolve_env_id(env_id: str) -> str:
    """An id that gym.make accepts in any process (also in AsyncVectorEnv worker subprocesses
    started with spawn).

    An id written `module:id`, or registered by gymnasium or by code the caller imported (with a
    class as its entry point), comes back unchanged; one whose entry point names another package
    comes back as `package:id`. Otherwise the installed package that registers it is imported (first
    the one the id's prefix names, then those that require gymnasium) and the id comes back as
    `module:id`, also on later calls, so workers import it too. A dm_control id that is not there
    says why (`_dm_control_unknown`). MuJoCo's warnings about model files are quieted from here on
    (`_quiet_mujoco_warnings`)."""
    resolved = _resolved(env_id)
    # where the env uses MuJoCo, its entry point's module imports it: imported here, as gym.make
    # would, MuJoCo's warnings are quieted before the first env is made
    _import_entry_point(resolved)
    _quiet_mujoco_warnings()
    return resolved


def _resolved(env_id: str) -> str:
    if env_id in gym.registry:
        module = (
            _registered_by.get(env_id)
            or _NAMESPACE_MODULES.get(_namespace(env_id))
            or _entry_point_package(env_id)
        )
        return f"{module}:{env_id}" if module else env_id
    module, _, name = env_id.rpartition(":")
    if module:
        if not _imports(module):
            raise UsageError(f"env id {env_id!r}: module {module!r} cannot be imported")
        if name in gym.registry:
            return env_id
        raise _unknown(env_id, name)
    for module in _candidate_modules(env_id):
        if _imports(module) and env_id in gym.registry:
            return f"{_registered_by.get(env_id, module)}:{env_id}"
    if _namespace(env_id) == "dm_control":
        raise _dm_control_unknown(env_id)
    raise _unknown(env_id, env_id)


def _namespace(env_id: str) -> str | None:
    """The namespace of an id (`dm_control` of `dm_control/cartpole-balance-v0`), None without one;
    of a malformed id too (gymnasium's parser would raise: `_unknown` says what is wrong)."""
    name = env_id.rpartition(":")[2]
    return name.partition("/")[0] if "/" in name else None


def _entry_point_package(env_id: str) -> str | None:
    """The package of a registered id's entry point where it is not gymnasium's own (a package
    imported before, by the caller or another part of the program, such as ale_py): a spawned worker
    must import it too."""
    entry_point = gym.spec(env_id).entry_point
    package = entry_point.split(":")[0].split(".")[0] if isinstance(entry_point, str) else None
    return package if package and package != "gymnasium" else None


def _candidate_modules(env_id: str) -> Iterator[str]:
    """Modules that may register `env_id`, likeliest first; a generator, so the scan stops once the
    id is found."""
    if _namespace(env_id) in _NAMESPACE_MODULES:
        yield _NAMESPACE_MODULES[_namespace(env_id)]
        return  # nothing else registers these: a scan of every package would only take seconds
    yield re.split(r"[-/]", env_id)[0].lower()  # popgym-..., MiniGrid-..., ALE/...
    # gymnasium < 1.0 loaded this entry-point group itself; 1.x no longer does, so import what
    # packages declare there.
    yield from (entry_point.module for entry_point in metadata.entry_points(group="gymnasium.envs"))
    # Top-level modules of the distributions that require gymnasium (not gymnasium-robotics), from
    # top_level.txt or the files a distribution installed.
    owners = metadata.packages_distributions()
    for distribution in metadata.distributions():
        if any(
            re.match(r"\s*gymnasium(?![\w.-])", r, re.IGNORECASE)
            for r in distribution.requires or []
        ):
            name = distribution.metadata["Name"]
            yield from (
                module
                for module, names in owners.items()
                if name in names and module.isidentifier()
            )


def _imports(module: str) -> bool:
    """Whether `module` imports; any error counts as no, since the scan tries packages that may be
    broken."""
    before = set(gym.registry)
    try:
        importlib.import_module(module)
    except Exception:
        return False
    _registered_by.update(dict.fromkeys(set(gym.registry) - before, module))
    return True


def _dm_control_unknown(env_id: str) -> UsageError:
    """The error for a dm_control id that Shimmy did not register: with dm_control's tasks
    registered, gymnasium's suggestion; without them, the extra to install and why they are not
    there (Shimmy registers none when dm_control fails to import, and says nothing)."""
    if any(_namespace(registered) == "dm_control" for registered in gym.registry):
        return _unknown(env_id, env_id, module_hint=False)
    try:
        importlib.import_module("shimmy.dm_control_compatibility")
        why = "Shimmy registered no dm_control tasks"
    except Exception as exc:
        why = f"{type(exc).__name__}: {one_line(str(exc))}"
    return UsageError(
        f"env id {env_id!r} needs Shimmy and dm_control ({why}): install them with {DM_CONTROL_EXTRA}"
    )


def _unknown(env_id: str, name: str, module_hint: bool = True) -> UsageError:
    """The error for an id nothing registers, with gymnasium's own suggestion ("Did you mean ...")
    when it has one, and with `module_hint`, how to name the package that registers it."""
    try:
        gym.spec(name)
        hint = ""
    except gym.error.Error as exc:
        # Keep only messages that add something: a suggestion, the versions there are, a malformed
        # id.
        plain = str(exc).startswith("No registered env") or str(exc).endswith("doesn't exist.")
        hint = "" if plain else f" ({one_line(str(exc))})"
    how = f"; if a package registers it, pass it as module:{name}" if module_hint else ""
    return UsageError(f"unknown env id {env_id!r}{hint}{how}")


def _import_entry_point(env_id: str) -> None:
    entry_point = gym.spec(env_id.rpartition(":")[2]).entry_point
    if isinstance(entry_point, str):
        try:
            gym.envs.registration.load_env_creator(entry_point)
        except Exception:  # gym.make reports it, where the env is made (`env_spaces`)
            pass


def _quiet_mujoco_warnings() -> None:
    """Where MuJoCo is imported, its deprecation warnings about model files kept from the user, who
    cannot act on them: each compile of HalfCheetah-v5 or dm_control's cheetah printed that
    `settotalmass` is deprecated (on stderr, or through dm_control's absl logger), and MuJoCo wrote
    it to MUJOCO_LOG.TXT in the working folder. Its other warnings (an unstable simulation) still
    go to stderr. dm_control sets its own handler when it is imported, maybe after this (in an env
    worker, `_in_worker`), hence the filter on absl's logger too."""
    mujoco = sys.modules.get("mujoco")
    if mujoco is None:
        return
    mujoco.set_mju_user_warning(_mujoco_warning)
    if importlib.util.find_spec("absl") is not None:
        from absl import logging as absl_logging

        absl_logging.get_absl_logger().addFilter(_not_a_mujoco_deprecation)


def _is_mujoco_deprecation(message: str) -> bool:
    return "is deprecated and will be removed" in message


def _mujoco_warning(message: str) -> None:
    if not _is_mujoco_deprecation(message):
        print(f"WARNING: {message}", file=sys.stderr)


def _not_a_mujoco_deprecation(record: logging.LogRecord) -> bool:
    return not _is_mujoco_deprecation(record.getMessage())


def flat_observations(
    env: gym.Env, keep_images: bool = False, image_parts: bool = False
) -> gym.Env:
    """`env` with a flat 1-D Box observation: Text parts of Dict/Tuple observations left out (one
    notice line), any non-1-D-Box space flattened with gymnasium's FlattenObservation wrapper; with
    `keep_images`, an image (`image_layout`) as it is, for the network to take through its CNN or
    flatten (--encoder mlp); with `image_parts` too, a Dict or Tuple with one image part as
    `image_and_vector` makes it."""
    space = env.observation_space
    if keep_images and image_layout(space):
        return env
    text = [(path, leaf) for path, leaf in _leaves(space) if _is_text(leaf)]
    if text:
        name = _env_name(env)
        if _only_text(space):
            raise UsageError(
                f"{name}: the observation has only text parts, which the networks cannot take"
            )
        parts = ", ".join(f"'{_name(path)}' ({type(leaf).__name__})" for path, leaf in text)
        were = "is" if len(text) == 1 else "are"
        notice(
            f"{name}: observation part{'s' * (len(text) > 1)} {parts} {were} left out; the agent sees the rest"
        )
        # only top-level parts go: gymnasium's own wrapper does that
        if all(len(path) == 1 for path, _ in text):
            keys = list(space.keys()) if isinstance(space, Dict) else list(range(len(space)))
            env = gym.wrappers.FilterObservation(
                env, [key for key in keys if not _is_text(space[key])]
            )
        else:
            kept, drop_text = _without_text(space)
            env = gym.wrappers.TransformObservation(env, drop_text, kept)
        space = env.observation_space
    if (
        keep_images
        and image_parts
        and sum(1 for _, leaf in _leaves(space) if image_layout(leaf)) == 1
    ):
        return image_and_vector(env)
    for path, leaf in _leaves(space):
        if not _flattenable(leaf):
            what = (
                f"observation part '{_name(path)}' ({leaf})"
                if path
                else f"observation space {leaf}"
            )
            raise UsageError(f"{what} cannot be flattened to a vector")
    if isinstance(space, Box) and len(space.shape) == 1:
        return env
    return gym.wrappers.FlattenObservation(env)


IMAGE, VECTOR = "image", "vector"
"""the two parts of an observation of an image and a vector (`image_and_vector`)"""


def image_and_vector(env: gym.Env) -> gym.Env:
    """`env`, whose Dict or Tuple observation has one image part (`image_layout`), with a Dict
    observation of two: IMAGE, that image as it is, and VECTOR, the other parts flattened into one
    float32 vector; the image alone where there are no other parts. The networks take the image
    through their CNN and join the vector to its features."""
    space = env.observation_space
    leaves = list(_leaves(space))
    image_path, image_space = next((path, leaf) for path, leaf in leaves if image_layout(leaf))
    if len(leaves) == 1:
        return gym.wrappers.TransformObservation(
            env, lambda observation: _part(observation, image_path), image_space
        )
    rest = Tuple([leaf for path, leaf in leaves if path != image_path])
    for path, leaf in leaves:
        if path != image_path and not _flattenable(leaf):
            raise UsageError(
                f"observation part '{_name(path)}' ({leaf}) cannot be flattened to a vector"
            )
    flat_rest = gym.spaces.flatten_space(rest)
    vector_space = Box(
        flat_rest.low.astype(np.float32), flat_rest.high.astype(np.float32), dtype=np.float32
    )

    def split(observation: Any) -> dict[str, np.ndarray]:
        values = [_part(observation, path) for path, _ in leaves]
        others = tuple(
            value for (path, _), value in zip(leaves, values, strict=True) if path != image_path
        )
        vector = gym.spaces.flatten(rest, others).astype(np.float32)
        return {IMAGE: np.asarray(_part(observation, image_path)), VECTOR: vector}

    return gym.wrappers.TransformObservation(
        env, split, Dict({IMAGE: image_space, VECTOR: vector_space})
    )


def _part(value: Any, path: tuple) -> Any:
    for key in path:
        value = value[key]
    return value


class Observations(dict):
    """The parts of `image_and_vector` observations (a dict of arrays or tensors with the same
    leading axes), indexed together as one array is: `obs[step]` and `obs[step] = next_obs` read and
    write that index of every part; a part's name (a string) gives the part."""

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, str):
            return super().__getitem__(index)
        return Observations({key: part[index] for key, part in self.items()})

    def __setitem__(self, index: Any, observation: Any) -> None:
        if isinstance(index, str):
            super().__setitem__(index, observation)
            return
        for key, part in self.items():
            part[index] = observation[key]

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Observations:
        """Each part with axes `start_dim` to `end_dim` as one (tensor parts: torch's `flatten`)."""
        return Observations({key: part.flatten(start_dim, end_dim) for key, part in self.items()})


def observation_map(function: Callable[..., Any], *observations: Any) -> Any:
    """`function` of the observations' arrays, or of each part of `image_and_vector` ones (dicts of
    arrays; the result is `Observations`): the function gets the same part of each."""
    if isinstance(observations[0], dict):
        return Observations({
            key: function(*(observation[key] for observation in observations))
            for key in observations[0]
        })  # fmt: skip
    return function(*observations)


def stacked_observations(observations: Any) -> Any:
    """A sequence of observations as one batch (each part of `image_and_vector` ones stacked)."""
    return observation_map(lambda *parts: np.stack(parts), *observations)


def observation_tensor(observation: Any, device: torch.device | str = "cpu") -> Any:
    """An observation (or batch) as the networks take it, on `device`: images as they are (uint8;
    they become float inside the network), everything else as float32; each part of an
    `image_and_vector` one. An array of observations (a vector env's `final_obs`) is a batch."""
    if isinstance(observation, np.ndarray) and observation.dtype == object:
        observation = stacked_observations(observation)
    as_tensor = lambda part: torch.as_tensor(  # noqa: E731
        part, dtype=None if part.dtype in (np.uint8, torch.uint8) else torch.float32, device=device
    )
    return observation_map(as_tensor, observation)


def observation_zeros(space: Space, *leading: int) -> Any:
    """Zeros for observations of `space` with the `leading` axes (steps, envs): uint8 for an image,
    else float32 (`Observations` of the two for an `image_and_vector` observation)."""
    if isinstance(space, Dict):
        return Observations({key: observation_zeros(part, *leading) for key, part in space.items()})
    return np.zeros((*leading, *space.shape), dtype=np.uint8 if image_layout(space) else np.float32)


CNN_MIN_SIDE = 36
"""the smallest height and width an image may have: the Nature CNN's convolutions (8 by 4, 4 by 2, 3
by 1) leave one pixel of 36"""


def image_layout(space: Space) -> str | None:
    """ "hw", "chw" or "hwc" where `space` is an image, None where it is not. An image is a uint8 Box
    of rank 2, or of rank 3 with its channels first or last, whose height and width are CNN_MIN_SIDE
    or more. The channel axis is the end axis under CNN_MIN_SIDE: a rank-3 space with both end axes
    under it, or neither (a volume), is not an image. So MiniGrid's 7x7x3 symbolic view is not one,
    and an 84x84 Atari frame stack of 4 is "chw"."""
    if not isinstance(space, Box) or space.dtype != np.uint8:
        return None
    large = tuple(side >= CNN_MIN_SIDE for side in space.shape)  # any other rank matches no layout
    return {(True, True): "hw", (False, True, True): "chw", (True, True, False): "hwc"}.get(large)


def cnn_layout(space: Space, encoder: str) -> str | None:
    """The layout of the image a CNN reads under --encoder, None for an MLP: with "auto", a CNN for
    an image (`image_layout`); with "mlp", never; with "cnn", always (a UsageError where the
    observation is not an image)."""
    if encoder == "mlp":
        return None
    if encoder == "cnn" and image_layout(space) is None:
        rule = f"a uint8 Box of rank 2, or 3 with channels first or last, at least {CNN_MIN_SIDE}x{CNN_MIN_SIDE}"
        raise UsageError(f"--encoder cnn needs an image observation ({rule}), not {space}")
    return image_layout(space)


def vector_observations_only(env: gym.Env, script: str) -> gym.Env:
    """`env` as it is where no part of its observation is an image (`image_layout`); a UsageError
    that names the part where one is, for a `script` that has no CNN."""
    for path, leaf in _leaves(env.observation_space):
        if image_layout(leaf):
            what = f"observation part '{_name(path)}'" if path else "observation"
            image = f"an image (uint8 {leaf.shape})"
            raise UsageError(
                f"{_env_name(env)}: its {what} is {image}; {script} takes vector observations only"
            )
    return env


def _env_name(env: gym.Env) -> str:
    return env.spec.id if env.spec else type(env.unwrapped).__name__


def _leaves(space: Space, path: tuple = ()) -> Iterator[tuple[tuple, Space]]:
    """Every space inside `space` that is not a Dict or Tuple, with its path of keys and indices."""
    if not isinstance(space, Dict | Tuple):
        yield path, space
        return
    for key, part in space.items() if isinstance(space, Dict) else enumerate(space):
        yield from _leaves(part, (*path, key))


def _name(path: tuple) -> str:
    return ".".join(map(str, path))  # 'mission', 'inner.note', '1'


def _is_text(space: Space) -> bool:
    """gymnasium's Text, and other spaces of strings such as MiniGrid's MissionSpace (not a Text
    subclass)."""
    return isinstance(space, Text) or (space.dtype is not None and space.dtype.kind == "U")


def _without_text(space: Space) -> tuple[Space, Callable[[Any], Any]]:
    """`space` without its text parts (and Dicts and Tuples left empty), and the function that drops
    them from a value."""
    if isinstance(space, Dict):
        kept = {key: _without_text(part) for key, part in space.items() if not _only_text(part)}
        kept_space = Dict({key: part for key, (part, _) in kept.items()}, sort_keys=False)
        return kept_space, lambda value: {key: drop(value[key]) for key, (_, drop) in kept.items()}
    if isinstance(space, Tuple):
        kept = [(i, *_without_text(part)) for i, part in enumerate(space) if not _only_text(part)]
        return Tuple([part for _, part, _ in kept]), lambda value: tuple(
            drop(value[i]) for i, _, drop in kept
        )
    return space, lambda value: value


def _only_text(space: Space) -> bool:
    """Whether nothing but text is left of `space` (an empty Dict or Tuple counts: it adds nothing)."""
    return all(_is_text(leaf) for _, leaf in _leaves(space))


def _flattenable(space: Space) -> bool:
    """Whether flatten_space gives a Box; it returns Sequence and Graph spaces unflattened and
    raises on others."""
    try:
        return isinstance(gym.spaces.flatten_space(space), Box)
    except (NotImplementedError, TypeError, ValueError):
        return False


def env_spaces(env_fn: Callable[[], gym.Env]) -> tuple[Space, Space, list[str]]:
    """The observation and action spaces and the render modes of the env that `env_fn` makes (a
    `make_env` thunk); an env that cannot be made is a UsageError that says why."""
    try:
        env = env_fn()
    except UsageError:
        raise
    except Exception as exc:  # missing extras, broken envs: the message says what to fix
        raise UsageError(
            f"cannot make the env: {type(exc).__name__}: {one_line(str(exc))}"
        ) from None
    spaces = env.observation_space, env.action_space, list(env.metadata.get("render_modes", []))
    env.close()
    return spaces


MAX_JOINT_ACTIONS = 4096
"""the most combinations of a MultiDiscrete action space that `joint_actions` turns into one
Discrete space"""


def make(
    env_id: str,
    frame_stack: int = 1,
    video_folder: str | None = None,
    video_every: int = 1,
    joint: bool = True,
) -> gym.Env:
    """One env as the PPO scripts' networks take it: `gym.make(env_id)` (an Atari game with
    `common.atari.make_kwargs`: it skips no frames itself), recorded by gymnasium's RecordVideo
    into `video_folder`, every `video_every`-th episode, where that is given; then `prepared` with
    `frame_stack` and `joint`. While `envpool_envs` makes its envs, one of EnvPool's games in its
    place."""
    if _pool_games is not None:
        return _pool_games.slot(frame_stack)
    if video_folder is None:
        return prepared(gym.make(env_id, **make_kwargs(env_id)), frame_stack, joint)
    env = gym.make(env_id, render_mode="rgb_array", **make_kwargs(env_id))
    env = gym.wrappers.RecordVideo(
        env, video_folder, episode_trigger=lambda n: n % video_every == 0
    )
    return prepared(env, frame_stack, joint)


def prepared(env: gym.Env, frame_stack: int = 1, joint: bool = True) -> gym.Env:
    """`env` as the PPO scripts' networks take it: an Atari game preprocessed as CleanRL's Atari
    scripts do (`common.atari.preprocessed`, `frame_stack` frames in each observation), the
    observation a vector, an image, or an image and a vector (`flat_observations`), and, with
    `joint`, MultiDiscrete or MultiBinary actions as one Discrete (`joint_actions`; a copy whose
    agent draws a choice per part passes False). Wrapped per env: gymnasium's vector observation
    wrappers refuse SAME_STEP autoreset."""
    env = flat_observations(preprocessed(env, frame_stack), keep_images=True, image_parts=True)
    return joint_actions(env) if joint else env


def joint_actions(env: gym.Env) -> gym.Env:
    """`env` with a MultiDiscrete action space of at most MAX_JOINT_ACTIONS combinations taken as
    one Discrete action per combination (row-major: the last part varies fastest), so a PPO agent
    picks a grid cell, say, as one choice, not as coordinates drawn independently; any other action
    space is left as it is."""
    space = env.action_space
    if not isinstance(space, gym.spaces.MultiDiscrete) or space.nvec.ndim != 1:
        return env
    combinations = int(np.prod(space.nvec, dtype=np.int64))
    if combinations > MAX_JOINT_ACTIONS:
        return env  # refused by checked_spaces, with the action space named
    parts, start = space.nvec, space.start

    def env_part_actions(action: Any) -> np.ndarray:
        return (np.array(np.unravel_index(int(action), parts)) + start).astype(space.dtype)

    return gym.wrappers.TransformAction(env, env_part_actions, Discrete(combinations))


def checked_spaces(
    make_env: Callable[[str], Callable[[], gym.Env]],
    args: Any,
    actions: tuple[type[Space], ...] = (Discrete, Box),
) -> tuple[Space, Space]:
    """The observation and action spaces of `args.env_id` (made by the script's `make_env`), after
    checking them against the script and the flags of `args`: an action space of the `actions`
    types, frames for --capture-video, discrete actions for the topk and bottomk sampling methods.
    """
    env_id = resolve_env_id(args.env_id)
    # --env-backend envpool: EnvPool's games stand in for this env, checked against it
    if uses_envpool(args):  # refused here, before the run has a folder
        envpool_atari.check(env_id, args)
        envpool_envs([make_env(env_id)], env_id).unwrapped.try_each_action()
    observation_space, action_space, render_modes = env_spaces(make_env(env_id))
    if args.capture_video and "rgb_array" not in render_modes:
        raise UsageError(f"--capture-video: {args.env_id!r} cannot render to rgb_array frames")
    if not isinstance(action_space, actions):
        use = " or ".join(space.__name__ for space in actions)
        raise UsageError(
            f"{args.env_id!r} has a {type(action_space).__name__} action space; use {use}"
        )
    if getattr(args, "sampling_method", None) in ("topk", "bottomk") and not isinstance(
        action_space, gym.spaces.Discrete
    ):
        raise UsageError(f"--sampling-method {args.sampling_method} needs a discrete action space")
    return observation_space, action_space


def training_envs(
    make_env: Callable[..., Callable[[], gym.Env]],
    args: Any,
    video_folder: str,
    checkpoint: dict | None,
) -> tuple[gym.vector.VectorEnv, gym.wrappers.vector.NormalizeReward | None]:
    """The training envs of a script's `args` (`make_env(env_id, index, capture_video, video_folder,
    video_every)`), with episode statistics and, with --norm-reward, gymnasium's NormalizeReward on
    top (its statistics from the `checkpoint` a run resumes); that wrapper is also returned on its
    own (None without it)."""
    env_id = resolve_env_id(args.env_id)
    # over all ranks: one env records videos
    indices = distributed.rank() * args.num_envs + np.arange(args.num_envs)
    env_fns = [
        make_env(env_id, int(i), args.capture_video, video_folder, args.video_every)
        for i in indices
    ]
    if uses_envpool(args):
        envs = envpool_envs(env_fns, env_id)
    else:
        envs = episode_statistics(vector_env(env_fns, args.async_envs))
    if not getattr(args, "norm_reward", False):  # a script without the flag has no normalisation
        return envs, None
    reward_normalizer = gym.wrappers.vector.NormalizeReward(envs, gamma=args.gamma)
    if checkpoint is not None:
        if checkpoint.get("reward_rms") is None:
            raise UsageError("the checkpoint has no reward statistics for --norm-reward")
        restore_reward_normalizer(reward_normalizer, checkpoint["reward_rms"])
    return reward_normalizer, reward_normalizer


def vector_env(env_fns: Sequence[Callable[[], gym.Env]], async_envs: bool) -> gym.vector.VectorEnv:
    """The envs of `env_fns`, stepped together and reset in the step where an episode ends
    (gymnasium's SAME_STEP autoreset; `final_obs` holds the last observation). With `async_envs`,
    each in its own process, which ignores Ctrl-C and the schedulers' stop signals
    (`common.interrupt`): the training process decides when to stop and finishes its iteration
    first. Each env records its episode so far (`common.env_state`), for
    checkpoints that continue it."""
    env_fns = [partial(_recorded, env_fn) for env_fn in env_fns]
    if not async_envs:
        return gym.vector.SyncVectorEnv(env_fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    quiet_mujoco = "mujoco" in sys.modules  # the envs use it (`_quiet_mujoco_warnings`)
    env_fns = [partial(_in_worker, env_fn, os.getpid(), quiet_mujoco) for env_fn in env_fns]
    with stop_signals_held():
        return gym.vector.AsyncVectorEnv(env_fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def evaluation_env(env_fn: Callable[[], gym.Env], args: Any) -> gym.vector.VectorEnv:
    """One env to play evaluation episodes in, as the training envs are stepped (SAME_STEP, with
    episode statistics): the script's `env_fn`, or under --env-backend envpool one EnvPool game in
    its place."""
    if uses_envpool(args):
        return envpool_envs([env_fn], resolve_env_id(args.env_id))
    return episode_statistics(
        gym.vector.SyncVectorEnv([env_fn], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    )


_pool_games: EnvPoolGames | None = None
"""While `envpool_envs` makes its envs: the games whose slots `make` hands out."""


def envpool_envs(env_fns: list[Callable[[], gym.Env]], env_id: str) -> gym.vector.VectorEnv:
    """The envs of `env_fns` (the script's `make_env`) with EnvPool's games of `env_id` in place of
    what `make` builds (`common.envpool_atari`), checked to have the spaces of `env_fns[0]`'s env
    as gymnasium makes it."""
    global _pool_games
    spaces = env_spaces(env_fns[0])[:2]
    _pool_games = EnvPoolGames(env_id, len(env_fns))
    try:
        envs = EnvPoolEnvs(env_fns, _pool_games)
    finally:
        _pool_games = None
    if (envs.single_observation_space, envs.single_action_space) != spaces:
        envs.refuse(
            f"--env-backend envpool: EnvPool's envs observe {envs.single_observation_space} and "
            f"act in {envs.single_action_space}, make_env's {spaces[0]} and {spaces[1]}: use "
            "--env-backend gymnasium"
        )
    return episode_statistics(envs)


def episode_statistics(envs: gym.vector.VectorEnv) -> gym.vector.VectorEnv:
    """`envs` with gymnasium's vector episode statistics, or for Atari games (`common.atari`), where
    a lost life ends an episode, the statistics of whole games, reported in the same way."""
    if all(envs.call("has_wrapper_attr", "next_reset_continues")):
        return GameStatistics(envs)
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


def _recorded(env_fn: Callable[[], gym.Env]) -> gym.Env:
    return EpisodeRecorder(env_fn())


def _in_worker(
    env_fn: Callable[[], gym.Env], training_process: int, quiet_mujoco: bool = False
) -> gym.Env:
    if os.getpid() == training_process:  # AsyncVectorEnv makes one env in the training process too
        return env_fn()
    ignore_stop_signals()  # first: the worker was started with them held
    if quiet_mujoco:  # before env_fn compiles a model
        importlib.import_module("mujoco")
        _quiet_mujoco_warnings()
    return _WorkerEnv(env_fn())


class _WorkerEnv(gym.Wrapper):
    """An env in an AsyncVectorEnv worker process, which ends by SIGTERM when the training process
    closes its pipe (`end_as_terminated_if_the_pipe_broke`)."""

    def close(self) -> None:
        try:
            super().close()
        finally:
            end_as_terminated_if_the_pipe_broke()
