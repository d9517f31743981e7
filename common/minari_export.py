"""Trajectory files as local Minari datasets, so offline-RL libraries that read Minari can train on recorded runs.

A Minari episode holds T actions, rewards, terminations and truncations, and T + 1 observations: the last is the
observation the final step led to, which a SAME_STEP vector env reports only in ``final_obs``. Hence only finished
episodes can be exported, and each needs the ``/infos/final_obs`` entry of its last step.

Minari's infos are T + 1 long too: entry 0 belongs to the first observation (the reset's info) and entry t + 1 to
the observation step t led to (that step's info). The exported infos follow that alignment:

- the env's infos (``/infos/<key>``, except ``final_obs`` and its ``_final_obs`` mask) are what step t returned, so
  they go to entry t + 1, under ``infos[<key>]``; entry 0, the reset's info, was never recorded;
- the agent's fields (``/agents/<name>/<field>``) come from acting on observation t, so they go to entry t, under
  ``infos["agents"][<name>][<field>]``; entry T, the final observation, was never acted on;
- the entry that was not recorded is NaN for float arrays and 0 (False) otherwise, so every array keeps its dtype.
"""

from __future__ import annotations

import inspect
import json
import shutil
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from common.cli import notice, one_line
from common.data_helpers import Episode, split_episodes
from common.envs import flat_observations, joint_actions, resolve_env_id
from common.errors import UsageError

if TYPE_CHECKING:
    from minari import MinariDataset

FINAL_OBS = "/infos/final_obs"
NOT_INFOS = frozenset(
    {"/observations", "/actions", "/rewards", "/terminations", "/truncations", "/masks"}
)
"""Per-step keys that are Minari's own fields, or (masks) only restate them: not copied into the
infos."""
FINAL_OBS_KEYS = frozenset({FINAL_OBS, "/infos/_final_obs"})
"""The final observation and its mask: they become each episode's last observation, not infos."""
MINARI_EXTRA = "onefile-rl[minari]"
MINARI_FLOOR = "0.5.4"
"""The first Minari whose create_dataset_from_buffers takes jpeg_encoding, and the one this export
was checked with."""


def export_to_minari(data: Mapping[str, np.ndarray], dataset_id: str) -> MinariDataset:
    """Write the finished episodes of trajectory data (`load_trajectories`) as the local Minari
    dataset `dataset_id`, under Minari's datasets folder (``MINARI_DATASETS_PATH``, else
    ``~/.minari/datasets``), and return it.

    Episodes come in `split_episodes` order; an episode still running when the recording stopped is
    left out, since the observation its last step led to was not recorded. The observation space is
    the flattened one the scripts use (`common.envs.flat_observations`) and the dataset's env spec
    includes that wrapper, so ``recover_environment()`` makes an env whose observations look like
    the dataset's. When the run's env cannot be made, or the recorded arrays do not fit its spaces
    (a script's own wrapper, such as ppo_transformer's previous action and reward), the spaces come
    from the data and the dataset has no env spec. Nothing is written on a UsageError."""
    minari = _import_minari()
    from minari.data_collector import EpisodeBuffer
    from minari.dataset.minari_dataset import parse_dataset_id
    from minari.storage.datasets_root_dir import get_dataset_path

    try:
        parse_dataset_id(dataset_id)
    # TypeError: Minari's parser fails so on an id without a version
    except (ValueError, TypeError):
        raise UsageError(
            f"malformed Minari dataset id {dataset_id!r}: use name-vN or namespace/name-vN "
            "(letters, digits, '-' and '_'; N an integer)"
        ) from None
    dataset_path = get_dataset_path(dataset_id)
    if dataset_path.exists():
        raise UsageError(
            f"Minari dataset {dataset_id!r} exists already at {dataset_path}; choose another name or version, "
            f"or delete it first (minari delete {dataset_id})"
        )

    meta = _meta(data)
    args = meta.get("args") if isinstance(meta.get("args"), dict) else {}
    episodes = [episode for episode in split_episodes(data) if episode.finished]
    if not episodes:
        raise UsageError(
            "the trajectories hold no finished episode; Minari stores whole episodes only"
        )
    buffers = [_episode_buffer(EpisodeBuffer, episode) for episode in episodes]
    env, observation_space, action_space = _spaces(args.get("env_id"), data)

    exp_name, env_id = args.get("exp_name"), args.get("env_id", "an unknown env")
    description = (
        f"{len(episodes)} finished episodes of {exp_name or 'a run'} on {env_id}, exported from a onefile-rl "
        "trajectory file; observations flattened as the scripts see them; infos are aligned with the observations "
        "(entry t + 1 holds step t's env info, entry t the agent's fields for observation t, the missing entry is NaN "
        "or 0); the run's settings are in the metadata entry 'onefile_rl'."
    )
    try:
        with warnings.catch_warnings():
            # Left out on purpose: no author, e-mail or code link is known here (nor, without
            # exp_name, the algorithm), and the data's env is the eval env.
            warnings.filterwarnings(
                "ignore",
                r"`(code_permalink|author|author_email|eval_env|algorithm_name)` is set to None",
            )
            warnings.filterwarnings("ignore", r"env_spec is None")
            dataset = minari.create_dataset_from_buffers(
                dataset_id,
                buffers,
                env=env,
                algorithm_name=str(exp_name) if exp_name is not None else None,
                action_space=action_space,
                observation_space=observation_space,
                description=description,
                data_format="hdf5",
                jpeg_encoding=False,  # images stay exact: Minari would JPEG-encode Box(0, 255) uint8 images
            )
        dataset.storage.update_metadata({"onefile_rl": meta})
        dataset.storage.update_episode_metadata(
            [{"source_env": episode.env, "source_start": episode.start} for episode in episodes]
        )
    except BaseException as exc:
        # A half-written dataset would block the id; but one that appeared since the check above is
        # not ours.
        if not isinstance(exc, FileExistsError) and not (
            isinstance(exc, ValueError) and "already exists" in str(exc)
        ):
            shutil.rmtree(dataset_path, ignore_errors=True)
        raise
    finally:
        if env is not None:
            env.close()
    return dataset


def _import_minari() -> Any:
    """Minari and its HDF5 backend, imported only here: the scripts run without them."""
    try:
        import h5py  # noqa: F401  (Minari's HDF5 storage, imported by Minari only when it writes)
        import minari
    except ImportError as exc:
        raise UsageError(
            f'exporting to Minari needs {exc.name or "minari"}: pip install "{MINARI_EXTRA}"'
        ) from None
    # Minari 0.5.3 JPEG-encodes image observations with no way to turn it off; 0.5.4 has the switch.
    if "jpeg_encoding" not in inspect.signature(minari.create_dataset_from_buffers).parameters:
        raise UsageError(
            f"minari {getattr(minari, '__version__', '?')} cannot store images losslessly; "
            f'pip install -U "minari[hdf5]>={MINARI_FLOOR}"'
        )
    return minari


def _meta(data: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The ``/meta/*`` entries, parsed from their JSON text where they are JSON."""
    meta = {}
    for key, value in data.items():
        if key.startswith("/meta/"):
            try:
                meta[key.removeprefix("/meta/")] = json.loads(str(value))
            except ValueError:
                meta[key.removeprefix("/meta/")] = str(value)
    return meta


def _episode_buffer(episode_buffer: type, episode: Episode) -> Any:
    """One finished episode as Minari's EpisodeBuffer: T + 1 observations and infos, T of everything
    else."""
    steps = episode.data
    where = (
        f"the episode of env {episode.env} that ends at step {episode.start + episode.length - 1}"
    )
    if not _parts(steps, FINAL_OBS):
        raise UsageError(
            f"{where} has no final observation: the data lacks {FINAL_OBS} (a SAME_STEP vector env's)"
        )
    observations, finals = _parts(steps, "/observations"), _parts(steps, FINAL_OBS)
    if observations.keys() != finals.keys():
        raise UsageError(
            f"{where}: final observations of parts {list(finals)}, observations {list(observations)}"
        )
    with_final = {}
    for part, observed in observations.items():
        final = finals[part][-1]
        if final.shape != observed.shape[1:]:
            raise UsageError(
                f"{where}: final observation of shape {final.shape}, observations {observed.shape[1:]}"
            )
        if np.issubdtype(final.dtype, np.floating) and np.isnan(final).all():
            raise UsageError(
                f"{where} has no final observation ({FINAL_OBS} is NaN there); it cannot be exported"
            )
        with_final[part] = np.concatenate([observed, final[None].astype(observed.dtype)])
    return episode_buffer(
        observations=with_final.pop("") if "" in with_final else with_final,
        actions=steps["/actions"],
        rewards=steps["/rewards"],
        terminations=steps["/terminations"],
        truncations=steps["/truncations"],
        infos=_infos(steps),
    )


def _infos(steps: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The per-step extras as Minari's nested, T + 1 long infos (see the module's docstring for the
    alignment)."""
    infos: dict[str, Any] = {}
    for key, values in steps.items():
        if (
            key in NOT_INFOS
            or key in FINAL_OBS_KEYS
            or key.startswith(("/observations/", FINAL_OBS + "/"))
        ):
            continue
        missing = np.full(
            (1, *values.shape[1:]), np.nan if values.dtype.kind in "fc" else 0, dtype=values.dtype
        )
        # returned by step t: belongs to the observation the step led to
        if key.startswith("/infos/"):
            path, padded = key.removeprefix("/infos/").split("/"), np.concatenate([missing, values])
            if path[0] == "agents":
                raise UsageError(
                    f"info {key!r} clashes with the agents' fields, exported under infos['agents']"
                )
        else:  # the agent's fields for observation t
            path, padded = key.strip("/").split("/"), np.concatenate([values, missing])
        node = infos
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = padded
    return infos


def _spaces(
    env_id: str | None, data: Mapping[str, np.ndarray]
) -> tuple[gym.Env | None, gym.Space, gym.Space]:
    """The env to name in the dataset (None: no env spec) and the observation and action spaces to
    store: the env's where the recorded arrays fit them, else the data's."""
    parts, actions = _parts(data, "/observations"), data["/actions"]
    # one array, or a dict of an image and a vector (common.envs.image_and_vector)
    observations = parts.get("", parts)
    env, reason = _made_env(env_id) if env_id is not None else (None, "")
    observation_space = action_space = None
    if env is not None:
        observation_space = (
            env.observation_space if _fits(observations, env.observation_space) else None
        )
        action_space = env.action_space if _fits(actions, env.action_space) else None
        for name, array, space, fitting in [
            ("observations", observations, env.observation_space, observation_space),
            ("actions", actions, env.action_space, action_space),
        ]:
            # e.g. ppo_transformer's observations, which carry the previous action and reward
            if fitting is None:
                reason = f"{reason}; " * bool(reason) + (
                    f"the recorded {name} ({_described(array)}) do not fit its space {space}"
                )
    if reason:
        from_data = [
            name
            for name, space in [("observation", observation_space), ("action", action_space)]
            if not space
        ]
        spaces = (
            f", and its {' and '.join(from_data)} space{'s' * (len(from_data) > 1)} from the data"
            * bool(from_data)
        )
        notice(f"{env_id!r}: {reason}; the Minari dataset gets no env spec{spaces}")
        if env is not None:
            env.close()
            env = None
    return (
        env,
        observation_space or _box_of(observations),
        action_space or _action_space_of(actions),
    )


def _made_env(env_id: str) -> tuple[gym.Env | None, str]:
    """The run's env with the scripts' flat observations, and why its spec cannot go into the
    dataset ("" if it can: gymnasium can write it as JSON and remake the env from it)."""
    try:
        env = joint_actions(flat_observations(gym.make(resolve_env_id(env_id))))
    except Exception as exc:  # an unknown id, missing extras, a broken env: the data still exports
        return None, f"cannot be made ({one_line(str(exc))})"
    spec = env.spec
    try:
        # A wrapper that does not record its arguments has kwargs None: gymnasium cannot remake it.
        remakeable = spec is not None and all(
            wrapper.kwargs is not None for wrapper in spec.additional_wrappers
        )
        remakeable = remakeable and bool(spec.to_json())
    except (TypeError, ValueError):  # a callable in the spec: gymnasium cannot write it as JSON
        remakeable = False
    return env, "" if remakeable else "has a spec that cannot be saved and remade"


def _parts(data: Mapping[str, np.ndarray], key: str) -> dict[str, np.ndarray]:
    """The arrays of `key` by part: {"": the array} where it is one, {part: array} for `key/part`
    entries."""
    if key in data:
        return {"": data[key]}
    return {
        name.removeprefix(key + "/"): value
        for name, value in data.items()
        if name.startswith(key + "/")
    }


def _fits(array: np.ndarray | dict[str, np.ndarray], space: gym.Space) -> bool:
    """Whether the recorded ``(num_envs, T, ...)`` array (or dict of them) has the space's shape and
    a dtype of its kind."""
    if isinstance(array, dict):
        return isinstance(space, gym.spaces.Dict) and array.keys() == space.keys() and all(
            _fits(part, space[key]) for key, part in array.items()
        )  # fmt: skip
    return (
        space.shape is not None
        and array.shape[2:] == space.shape
        and np.can_cast(array.dtype, space.dtype, "same_kind")
    )


def _described(array: np.ndarray | dict[str, np.ndarray]) -> str:
    if isinstance(array, dict):
        return ", ".join(f"{key}: {_described(part)}" for key, part in array.items())
    return f"{array.dtype}, shape {array.shape[2:]}"


def _box_of(array: np.ndarray | dict[str, np.ndarray]) -> gym.Space:
    """The widest Box of the recorded array's shape and dtype (a Dict of them for a dict of arrays)."""
    if isinstance(array, dict):
        return gym.spaces.Dict({key: _box_of(part) for key, part in array.items()})
    dtype = array.dtype
    if dtype.kind == "f":
        low, high = -np.inf, np.inf
    elif dtype.kind in "iu":
        low, high = np.iinfo(dtype).min, np.iinfo(dtype).max
    elif dtype.kind == "b":
        low, high = 0, 1
    else:
        raise UsageError(f"recorded arrays of dtype {dtype} have no Minari space")
    return gym.spaces.Box(low, high, array.shape[2:], dtype)


def _action_space_of(actions: np.ndarray) -> gym.Space:
    """Integer scalar actions as Discrete, from 0 (or the smallest action, if negative) to the
    largest action recorded, which may be fewer actions than the env has; other actions as the
    widest Box."""
    if actions.ndim == 2 and actions.dtype.kind in "iu":
        start = min(0, int(actions.min()))
        return gym.spaces.Discrete(int(actions.max()) - start + 1, start=start)
    return _box_of(actions)
