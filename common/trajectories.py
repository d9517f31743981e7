"""Trajectory files: record what a vector env and an agent did, reload it, cut it into episodes.

A trajectory file is an ``.npz`` archive written by NumPy and read with ``allow_pickle=False``. A recording made
as a run goes (``--save-trajectories PATH``, :class:`TrajectoryRecording`) is a folder PATH of such files, each
holding the next stretch of steps of every env (``steps_{first step:010d}.npz``); :func:`load_trajectories` reads a
folder as one file. Keys are digideep's flattened paths; every per-step array is batch-major, ``(num_envs, T, ...)``:

- ``/observations``: the observation each action was taken from.
- ``/actions``, ``/rewards``, ``/terminations``, ``/truncations``.
- ``/masks``: 1.0 while the episode goes on, 0.0 on its last step (digideep's convention).
- ``/agents/<name>/<field>``: per-agent outputs such as log-probs, values and hidden states.
- ``/infos/<key>``: numeric per-env entries of the env's ``infos``; steps where a key was absent hold NaN.
- ``/meta/args``: the run's arguments as JSON text (a 0-d string array); ``/meta/format``: the format version.

``python -m common.trajectories PATH`` prints a summary of a file; with ``--minari DATASET_ID`` it writes the
finished episodes as a local Minari dataset (``common.minari_export``).
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import io
import json
import os
import sys
import warnings
import zipfile
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from common import distributed
from common.cli import notice
from common.data_helpers import (
    convert_time_to_batch_major,
    describe,
    flatten_dict,
    list_of_dicts_to_flattened_dict_of_lists,
    split_episodes,
    unflatten_dict,
)
from common.envs import observation_map
from common.errors import UsageError
from common.run_folder import create_run_folder, write_atomically

FORMAT_VERSION = 1
FLUSH_STEPS = 2048
"""A recording writes its steps to a file once it holds this many vector steps (or a rollout, if
longer)..."""
FLUSH_BYTES = 2**26
"""... or this many bytes of observations (64 MiB: 8 Atari envs' 84x84x4 frames take 2,048 steps to
460 MB)."""
CHUNK_PREFIX = "steps_"
STEP_KEYS = ("/observations", "/actions", "/rewards", "/terminations", "/truncations", "/masks")
"""Keys every trajectory file holds."""
SILENTLY_SKIPPED_INFOS = frozenset({"/final_info"})
"""Info keys that are never numeric and left out without a warning: gymnasium's finished episodes'
info dicts."""


def _image_of(observations: Any) -> tuple[str, np.ndarray | None]:
    """The uint8 images (num_envs, ...) among per-env `observations` (an array, or a dict of parts),
    and their key below `/observations` ("" for the whole); None where there are none."""
    parts = flatten_dict(observations) if isinstance(observations, Mapping) else {"": observations}
    for key, part in parts.items():
        if part.dtype == np.uint8 and part.ndim > 2:
            return ("/" + key.strip("/")) if key else "", part
    return "", None


def _with_parts(infos: dict[str, Any]) -> dict[str, Any]:
    """`infos` with an object array of dicts (gymnasium's `final_obs` of Dict observations) split
    into one object array per part, under `key/part`."""
    split = {}
    for key, value in infos.items():
        dicts = isinstance(value, np.ndarray) and value.dtype == object and value.ndim == 1
        first = next((item for item in value if item is not None), None) if dicts else None
        if not isinstance(first, Mapping):
            split[key] = value
            continue
        for part in first:
            column = np.empty(len(value), dtype=object)
            column[:] = [None if item is None else item[part] for item in value]
            split[f"{key}/{part}"] = column
    return split


class TrajectoryFileError(ValueError):
    """A trajectory file is missing, corrupt, or not in this format."""


def _absent(value: Any) -> bool:
    """An info entry that no env has at this step: an object array of None only."""
    return isinstance(value, np.ndarray) and value.dtype == object and all(v is None for v in value)


def _numeric_info(value: Any, num_envs: int) -> np.ndarray | None:
    """An info entry as a numeric ``(num_envs, ...)`` array, or None when it has no numeric form.

    Object arrays (gymnasium's ``final_obs``) become dense arrays: of integer images (uint8 frames)
    in their own dtype with 0 for the envs that have no entry (gymnasium's ``_final_obs`` mask says
    which have one), of the rest as floats with NaN."""
    if not isinstance(value, np.ndarray) or value.ndim == 0 or value.shape[0] != num_envs:
        return None
    if value.dtype != object:
        return (
            value.copy() if np.issubdtype(value.dtype, np.number) or value.dtype == bool else None
        )
    present = [np.asarray(item) for item in value if item is not None]
    if not present or any(
        p.shape != present[0].shape or not np.issubdtype(p.dtype, np.number) for p in present
    ):
        return None
    dtype = present[0].dtype
    if (
        np.issubdtype(dtype, np.integer)
        and present[0].ndim >= 2
        and all(p.dtype == dtype for p in present)
    ):
        dense = np.zeros((num_envs, *present[0].shape), dtype=dtype)
    else:
        dense = np.full(
            (num_envs, *present[0].shape), np.nan, dtype=np.result_type(dtype, np.float32)
        )
    for env_index, item in enumerate(value):
        if item is not None:
            dense[env_index] = item
    return dense


class TrajectoryWriter:
    """Collects per-step data from a vector env and writes it as a trajectory file.

    Call :meth:`add_step` once per vector-env step, then :meth:`save`::

        writer = TrajectoryWriter(num_envs=4, meta={"args": vars(args)})
        obs, _ = envs.reset(seed=1)
        for _ in range(num_steps):
            action = ...
            next_obs, reward, terminated, truncated, infos = envs.step(action)
            writer.add_step(obs, action, reward, terminated, truncated,
                            agents={"policy": {"logprobs": logprob, "values": value}}, infos=infos)
            obs = next_obs
        writer.save("rollouts.npz")

    Arrays are copied when added, so the caller may reuse its buffers. Info entries with no numeric per-env form
    (strings, dicts) are left out, with one warning per key; gymnasium's ``final_info`` (the finished episodes' info
    dicts, which every vector env with autoreset returns) is left out without one.
    """

    def __init__(self, num_envs: int, meta: Mapping[str, Any] | None = None):
        if num_envs < 1:
            raise ValueError(f"num_envs must be positive, got {num_envs}")
        self.num_envs = num_envs
        self.meta = dict(meta or {})
        self.steps: list[dict[str, Any]] = []
        self._skipped_info_keys: set[str] = set()

    def __len__(self) -> int:
        return len(self.steps)

    def add_step(
        self,
        observations: Any,
        actions: Any,
        rewards: Any,
        terminations: Any,
        truncations: Any,
        agents: Mapping[str, Mapping[str, Any]] | None = None,
        infos: Mapping[str, Any] | None = None,
    ) -> None:
        """Record one vector-env step. Every value has the leading dimension ``num_envs`` (tensors
        are accepted)."""
        terminations = self._per_env("terminations", terminations).astype(bool)
        truncations = self._per_env("truncations", truncations).astype(bool)
        step: dict[str, Any] = {
            "observations": observation_map(partial(self._per_env, "observations"), observations),
            "actions": self._per_env("actions", actions),
            "rewards": self._per_env("rewards", rewards),
            "terminations": terminations,
            "truncations": truncations,
            "masks": (~(terminations | truncations)).astype(np.float32),
        }
        if agents:
            step["agents"] = {
                name: {
                    field: self._per_env(f"agents/{name}/{field}", value)
                    for field, value in fields.items()
                }
                for name, fields in agents.items()
            }
        if infos is not None:
            numeric = self._numeric_infos(infos)
            image_key, image = _image_of(step["observations"])
            if image is not None and f"/final_obs{image_key}" not in numeric:
                # Images: final observations at every step, 0 where none (`_final_obs` says), so
                # they stay uint8.
                numeric[f"/final_obs{image_key}"] = np.zeros_like(image)
                numeric["/_final_obs"] = np.zeros(self.num_envs, bool)
            if numeric:
                step["infos"] = unflatten_dict(numeric)
        self.steps.append(step)

    def _per_env(self, name: str, value: Any) -> np.ndarray:
        if hasattr(value, "detach"):  # torch tensors, without importing torch here
            value = value.detach().cpu().numpy()
        array = np.array(value, copy=True)
        if array.ndim == 0 or array.shape[0] != self.num_envs:
            raise ValueError(
                f"{name}: expected a leading dimension of num_envs={self.num_envs}, got {array.shape}"
            )
        return array

    def _numeric_infos(self, infos: Mapping[str, Any]) -> dict[str, np.ndarray]:
        numeric = {}
        for key, value in _with_parts(flatten_dict(infos)).items():
            array = _numeric_info(value, self.num_envs)
            if array is not None:
                numeric[key] = array
            elif _absent(value):  # at this step only, as dm_env's discount at a reset: NaN there
                continue
            elif key not in self._skipped_info_keys and key not in SILENTLY_SKIPPED_INFOS:
                self._skipped_info_keys.add(key)
                warnings.warn(
                    f"trajectory writer: info {key!r} has no numeric per-env form; not recorded",
                    stacklevel=3,
                )
        return numeric

    def to_dict(self) -> dict[str, np.ndarray]:
        """The recorded steps as the flattened, batch-major dict that :meth:`save` writes."""
        if not self.steps:
            raise ValueError("no steps recorded")
        time_major = list_of_dicts_to_flattened_dict_of_lists(self.steps, len(self.steps))
        data = convert_time_to_batch_major(time_major)
        data["/meta/format"] = np.array(FORMAT_VERSION)
        for key, value in self.meta.items():
            data[f"/meta/{key}"] = np.array(json.dumps(value, default=str))
        return data

    def save(self, path: str | Path) -> Path:
        """Write the file atomically (a temporary file in the same folder, then a rename) and return
        its path.

        The ``.npz`` suffix is added when missing."""
        path = npz_path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        data = self.to_dict()
        images = any(
            value.dtype == np.uint8 and value.ndim > 3
            for key, value in data.items()
            if key.startswith("/observations")
        )
        # frames compress well; vectors hardly do
        (np.savez_compressed if images else np.savez)(buffer, **data)
        write_atomically(path, buffer.getbuffer())
        return path


class TrajectoryRecording:
    """A trajectory file written as the steps come: a folder `path` of files of at most
    `flush_steps` vector steps or about `flush_bytes` of observations each (and a rollout's steps at
    least, which `RolloutRecorder` adds together). A process killed at any moment leaves every file
    written before whole, and one that stops on an error writes the steps that wait;
    :func:`load_trajectories` reads the folder.

    `start` continues the recording in `path` at its step `start` (a resumed run): files of later
    steps, recorded by a run killed after its checkpoint, are removed, since the resumed run records
    those steps again. A folder that does not hold exactly the steps before `start` is a
    TrajectoryFileError, and nothing is removed."""

    def __init__(
        self,
        path: str | Path,
        num_envs: int,
        meta: Mapping[str, Any],
        start: int = 0,
        flush_steps: int = FLUSH_STEPS,
        flush_bytes: int = FLUSH_BYTES,
    ):
        self.path, self.steps_written, self.flush_steps, self.flush_bytes = (
            Path(path),
            start,
            flush_steps,
            flush_bytes,
        )
        self.buffer, self.buffered_bytes = TrajectoryWriter(num_envs, meta), 0
        if start:
            later = _continuable_at(self.path, start)
            for chunk in later:
                chunk.unlink()
        self.path.mkdir(parents=True, exist_ok=True)
        atexit.register(self.flush)  # an error that ends the run keeps the steps recorded before it

    def add_step(self, observations: Any, *step: Any, **fields: Any) -> None:
        """:meth:`TrajectoryWriter.add_step`, then a file written once `flush_steps` steps or
        `flush_bytes` wait."""
        self.buffer.add_step(observations, *step, **fields)
        observations = self.buffer.steps[-1]["observations"]
        self.buffered_bytes += sum(
            part.nbytes
            for part in (
                observations.values() if isinstance(observations, dict) else [observations]
            )
        )
        if len(self.buffer) >= self.flush_steps or self.buffered_bytes >= self.flush_bytes:
            self.flush()

    def flush(self) -> None:
        """Write the waiting steps to the folder's next file, atomically."""
        if not len(self.buffer):
            return
        self.buffer.save(self.path / f"{CHUNK_PREFIX}{self.steps_written:010d}.npz")
        self.steps_written += len(self.buffer)
        self.buffer.steps, self.buffered_bytes = [], 0


class RolloutRecorder:
    """Training rollouts to the trajectory recording `args.save_trajectories` (None: records
    nothing), with the run's `args` (a dataclass) as its meta data. The env's side is recorded step
    by step; the agent's fields, known once the rollout's log-probabilities and values are, at the
    end of each rollout, when the steps go to the recording. Under torchrun each rank records its
    own envs, rank r > 0 to `{stem}.rank{r}{suffix}`.

    A new recording goes to that path, or, if something is there already, to the first free `_2`,
    `_3`, ... A run resumed from a checkpoint continues the recording that `checkpoint_state` put in
    it when its envs continue the episodes the checkpoint cut (`carried`, what
    `common.env_state.start` gave, says so); else, or if that recording is not as the checkpoint
    left it, it starts a new one, with a notice: a recording never holds an episode spliced from
    two."""

    def __init__(
        self,
        args: Any,
        num_envs: int,
        checkpoint: Mapping[str, Any] | None = None,
        carried: Mapping[str, Any] | None = None,
        reward_normalizer: Any = None,
    ):
        path, self.reward_normalizer = args.save_trajectories, reward_normalizer
        self.recording: TrajectoryRecording | None = None
        self.rollout: list[tuple[tuple[Any, ...], Mapping[str, Any]]] = []
        if path is None:
            return
        meta = {"args": dataclasses.asdict(args)}
        recorded = _own_rank_entry(checkpoint)
        if recorded is not None and (carried or {}).get("continued"):
            try:
                self.recording = TrajectoryRecording(
                    recorded["path"], num_envs, meta, int(recorded["steps"])
                )
                return
            except TrajectoryFileError as exc:
                notice(f"the recording cannot go on ({exc}): a new one", every_rank=True)
        elif recorded is not None:
            notice(
                f"the envs start new episodes: a new recording, not {recorded['path']}",
                every_rank=True,
            )
        rank = distributed.rank()
        path = (
            Path(path)
            if rank == 0
            else Path(path).with_name(f"{Path(path).stem}.rank{rank}{Path(path).suffix}")
        )
        self.recording = TrajectoryRecording(new_recording_folder(path), num_envs, meta)

    def step(
        self, obs: Any, action: Any, reward: Any, terminated: Any, truncated: Any, infos: Mapping
    ) -> None:
        """One vector-env step: the env's observation acted on, the action the env was sent, and its
        reward, scaled by `reward_normalizer` (gymnasium's NormalizeReward) if given: the env's own
        reward is recorded."""
        if self.recording is None:
            return
        if self.reward_normalizer is not None:
            reward = reward * np.sqrt(
                self.reward_normalizer.return_rms.var + self.reward_normalizer.epsilon
            )
        self.rollout.append(
            ((observation_map(np.array, obs), action, reward, terminated, truncated), infos)
        )

    def end_rollout(self, **agent_fields: Any) -> None:
        """The agent's fields for the rollout's steps, each (steps, num_envs, ...): recorded under
        `policy`."""
        for t, (env_step, infos) in enumerate(self.rollout):
            # none (ddpg's): no `agents` entry, rather than an empty one that has no array form
            fields = {"policy": {name: value[t] for name, value in agent_fields.items()}}
            self.recording.add_step(*env_step, agents=fields if agent_fields else None, infos=infos)
        self.rollout = []

    def checkpoint_state(self) -> dict[str, Any] | None:
        """For a checkpoint (each rank's under `ranks`): the recorded steps are written first, so
        that a run resumed from it continues the recording exactly. None when not recording."""
        if self.recording is None:
            return None
        self.recording.flush()
        return {"path": str(self.recording.path.resolve()), "steps": self.recording.steps_written}

    def save(self) -> None:
        """At the end of the run: the last steps to the recording."""
        if self.recording is not None:
            self.recording.flush()


def _own_rank_entry(checkpoint: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """This rank's recording in `checkpoint` (None without one, or for a checkpoint of another
    number of processes)."""
    if checkpoint is None:
        return None
    ranks = checkpoint.get("ranks", [checkpoint])
    return (
        ranks[distributed.rank()].get("trajectories")
        if len(ranks) == distributed.world_size()
        else None
    )


def _continuable_at(folder: Path, start: int) -> list[Path]:
    """The files of `folder` that start at or after step `start`, after checking that the others
    hold exactly the steps before it, one after another (a TrajectoryFileError if not)."""
    steps, later = 0, []
    for chunk in _chunks(folder) if folder.is_dir() else ():
        first = _chunk_start(chunk)
        if first >= start:
            later.append(chunk)
        elif first != steps:
            raise TrajectoryFileError(f"{str(chunk)!r} should start at step {steps}")
        else:
            steps += _chunk_length(chunk)
    if steps != start:
        raise TrajectoryFileError(
            f"{str(folder)!r} holds {steps} steps before the checkpoint's {start}"
        )
    return later


def npz_path(path: str | Path) -> Path:
    """`path` with the `.npz` suffix that :meth:`TrajectoryWriter.save` gives it."""
    path = Path(path)
    return path if path.suffix == ".npz" else path.with_name(path.name + ".npz")


def new_recording_folder(path: str | Path) -> Path:
    """Create the folder of a new recording for `path`: `path` itself, or, when something is there
    already (an earlier run's recording, a file), the first free `stem_2`, `stem_3`, ..., with a
    notice. Created atomically: a recording is never overwritten, nor shared by two runs."""
    wanted = Path(path)
    created = create_run_folder(wanted.parent, wanted.stem, wanted.suffix)
    if created != wanted:
        notice(f"{wanted} exists; the trajectories go to {created}", every_rank=True)
    return created


def check_destination(path: str | Path | None) -> None:
    """A UsageError, before anything is written, if a recording cannot be made at `path` (None:
    nothing to check): a file stands where one of its folders would be, or the nearest existing
    folder cannot be written."""
    if path is None:
        return
    path = Path(path).absolute()
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(
                    f"--save-trajectories {str(path)!r}: {str(parent)!r} is a file, not a folder"
                )
            if not os.access(parent, os.W_OK | os.X_OK):
                raise UsageError(
                    f"--save-trajectories {str(path)!r}: cannot write in {str(parent)!r}"
                )
            return


def _chunks(folder: Path) -> list[Path]:
    """A recording's files, in the order of their steps (a temporary file being written is not one)."""
    return sorted(folder.glob(f"{CHUNK_PREFIX}*.npz"), key=_chunk_start)


def _chunk_start(chunk: Path) -> int:
    try:
        return int(chunk.stem.removeprefix(CHUNK_PREFIX))
    except ValueError:
        raise TrajectoryFileError(
            f"{str(chunk)!r} is not a recording's file (steps_<first step>.npz)"
        ) from None


def _chunk_length(chunk: Path) -> int:
    with np.load(chunk, allow_pickle=False) as archive:  # reads only this array
        return archive["/rewards"].shape[1]


def _concatenated(chunks: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The chunks' steps as one recording, `/meta/*` from the first. A key absent from some chunks
    (an info that first appeared later) holds NaN there, as within one file; a key's dtype is the
    one all its chunks' take (an info present at every step of one chunk and missing at some steps
    of another is float64 in both)."""
    data = {key: value for key, value in chunks[0].items() if key.startswith("/meta/")}
    keys = dict.fromkeys(key for chunk in chunks for key in chunk if not key.startswith("/meta/"))
    for key in keys:
        present = [chunk[key] for chunk in chunks if key in chunk]
        dtype = np.result_type(*present)
        if len(present) < len(chunks) and not np.issubdtype(dtype, np.floating):
            dtype = np.dtype(np.float64)
        trailing = present[0].shape[2:]
        parts = [
            chunk[key] if key in chunk else np.full((*chunk["/rewards"].shape, *trailing), np.nan)
            for chunk in chunks
        ]
        data[key] = np.concatenate(parts, axis=1, dtype=dtype)
    return data


def load_trajectories(path: str | Path) -> dict[str, np.ndarray]:
    """Read a trajectory file, or a recording's folder of them (their steps in order), into a flat
    dict of arrays, never unpickling.

    ``/meta/*`` entries are returned as they are stored (JSON text in 0-d string arrays;
    ``json.loads(str(x))`` reads them). Raises :class:`TrajectoryFileError` for a missing, corrupt
    or foreign file."""
    path = Path(path)
    if path.is_dir():
        chunks, steps = [], 0
        for chunk in _chunks(path):
            if _chunk_start(chunk) != steps:
                raise TrajectoryFileError(
                    f"{str(chunk)!r} should start at step {steps}: a file of the recording is gone"
                )
            chunks.append(load_trajectories(chunk))
            steps += chunks[-1]["/rewards"].shape[1]
        if not chunks:
            raise TrajectoryFileError(f"{str(path)!r} holds no recorded steps")
        return _concatenated(chunks)
    if not path.is_file():
        raise TrajectoryFileError(f"trajectory file {str(path)!r} does not exist")
    try:
        with np.load(path, allow_pickle=False) as archive:
            data = {key: archive[key] for key in archive.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        reason = "it holds pickled data" if "pickle" in str(exc) else str(exc)
        raise TrajectoryFileError(
            f"{str(path)!r} is not a readable .npz trajectory file ({reason})"
        ) from None
    missing = [
        key
        for key in STEP_KEYS
        if key not in data and not any(k.startswith(key + "/") for k in data)
    ]
    if missing:
        raise TrajectoryFileError(
            f"{str(path)!r} is not a trajectory file: it lacks {', '.join(missing)}"
        )
    shape = data["/rewards"].shape
    if len(shape) != 2:
        raise TrajectoryFileError(f"{str(path)!r}: /rewards should be (num_envs, T), got {shape}")
    for key, value in data.items():
        if not key.startswith("/meta/") and value.shape[:2] != shape:
            raise TrajectoryFileError(
                f"{str(path)!r}: {key} has shape {value.shape}, expected {shape} + (...)"
            )
    return data


def transitions(data: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A recording's steps as a replay buffer's transitions, time-major, `(T, num_envs, ...)`: the
    order in which ddpg.py's loop adds them (`.reshape(-1, ...)` gives its buffer's rows). Each
    step's `next_observations` is the true one: the next step's observation, or where the episode
    ended there, its last (`/infos/final_obs`). The last recorded step is left out, as its next
    observation is not recorded unless its episode ended. For checking a buffer edit
    (docs/ddpg.md, "Checking a replay-buffer edit")."""
    ended = data["/terminations"] | data["/truncations"]
    following = data["/observations"][:, 1:]
    if "/infos/final_obs" in data:
        mask = ended[:, :-1].reshape(*ended[:, :-1].shape, *(1,) * (following.ndim - 2))
        following = np.where(mask, data["/infos/final_obs"][:, :-1], following)
    steps = {
        "observations": data["/observations"][:, :-1],
        "next_observations": following,
        "actions": data["/actions"][:, :-1],
        "rewards": data["/rewards"][:, :-1],
        "terminations": data["/terminations"][:, :-1],
        "truncations": data["/truncations"][:, :-1],
    }
    return {name: np.swapaxes(value, 0, 1) for name, value in steps.items()}


def summarize(data: Mapping[str, np.ndarray]) -> str:
    """A human-readable summary: envs, steps, episodes, returns of finished episodes, and every
    key's statistics."""
    num_envs, num_steps = data["/rewards"].shape
    episodes = split_episodes(data)
    returns = np.array([episode.total_reward for episode in episodes if episode.finished])
    lines = [
        f"envs: {num_envs}  steps per env: {num_steps}  transitions: {num_envs * num_steps}",
        f"episodes: {len(returns)} finished, {len(episodes) - len(returns)} unfinished",
    ]
    if returns.size:
        lines.append(
            f"return: mean {returns.mean():.4g}  min {returns.min():.4g}  max {returns.max():.4g}"
        )
    lines.append(
        describe({key: value for key, value in data.items() if not key.startswith("/meta/")})
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m common.trajectories",
        description="Summarize a trajectory file, or export it to Minari.",
    )
    parser.add_argument(
        "path", help="a recording's folder (--save-trajectories) or a .npz trajectory file"
    )
    parser.add_argument(
        "--minari",
        metavar="DATASET_ID",
        help="write the finished episodes as this local Minari dataset",
    )
    options = parser.parse_args(argv)
    try:
        data = load_trajectories(options.path)
        if options.minari:
            from common.minari_export import export_to_minari

            dataset = export_to_minari(data, options.minari)
            print(
                f"{options.minari}: {dataset.total_episodes} episodes, {dataset.total_steps} steps"
            )
            return 0
    except (TrajectoryFileError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(summarize(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
