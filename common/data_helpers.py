"""Trajectory data helpers: nested and flattened dicts, lists of dicts, time-major and batch-major arrays, and
episodes cut from batch-major streams.

These follow digideep's ``environment.data_helpers``. A rollout is a list of per-step (possibly nested) dicts; the
helpers turn it into one flat dict whose keys are unix-style paths (``/agents/policy/values``) and whose values are
lists over time, fill the steps where a key was missing, and turn time-major lists into batch-major arrays.

Choices where digideep's documentation contradicts itself:

- Missing entries are filled by :func:`nonify`: ``None`` for scalar leaves, a NaN-filled float array for NumPy arrays.
  :func:`convert_time_to_batch_major` turns any remaining ``None`` into NaN, so a key that was missing on some steps
  becomes a float array with NaN exactly where it was missing.
- :func:`convert_time_to_batch_major` keeps each key's dtype (integer actions stay integers, float64 stays float64)
  instead of casting everything to float32; only keys with missing entries become float.
- Every filled entry is a new, independent object: changing one never changes another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def join_keys(key1: str, key2: str, sep: str = "/") -> str:
    """Join two unix-style keys with exactly one separator between them: ``join_keys('/agent1',
    'artifacts')`` gives ``'/agent1/artifacts'``."""
    return key1.rstrip(sep) + sep + key2.lstrip(sep)


def flatten_dict(dic: Mapping, sep: str = "/", prefix: str = "") -> dict[str, Any]:
    """Flatten a nested dict into one level whose keys are paths: ``{"a": 1, "b": {"c": 1}}`` gives
    ``{"/a": 1, "/b/c": 1}``.

    Keys are converted with ``str``. An empty nested dict is kept as a leaf so that
    :func:`unflatten_dict` restores it. A key that contains ``sep`` raises ``ValueError``, since the
    flattening could not be undone."""
    flat: dict[str, Any] = {}
    for key, value in dic.items():
        key = str(key)
        if sep in key or key == "":
            raise ValueError(
                f"flatten_dict: key {key!r} is empty or contains the separator {sep!r}"
            )
        path = join_keys(prefix, key, sep) if prefix else sep + key
        if isinstance(value, Mapping) and value:
            flat.update(flatten_dict(value, sep=sep, prefix=path))
        else:
            flat[path] = value
    return flat


def unflatten_dict(dic: Mapping[str, Any], sep: str = "/") -> dict[str, Any]:
    """Undo :func:`flatten_dict`: ``{"/a": 1, "/b/c": 1}`` gives ``{"a": 1, "b": {"c": 1}}``.

    The leading separator is optional. A path that is both a leaf and a prefix of another path
    raises ``ValueError``."""
    nested: dict[str, Any] = {}
    for path, value in dic.items():
        *parents, leaf = path.strip(sep).split(sep)
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"unflatten_dict: {path!r} passes through a leaf")
        if leaf in node:
            raise ValueError(f"unflatten_dict: {path!r} collides with another key")
        # An empty dict leaf is copied: a later path through it must not change the caller's object.
        node[leaf] = {} if isinstance(value, Mapping) and not value else value
    return nested


def nonify(element: Any) -> Any:
    """An object of the same structure as ``element`` standing for "missing".

    Lists and tuples keep their structure (recursively) with ``None`` at every scalar leaf. A NumPy array becomes a
    NaN-filled array of its shape (its own dtype if floating, else float64), so that missing steps stack with present
    ones. Dicts are not accepted (flatten them first). Each call builds new objects.

    >>> nonify([(1, 2, 3), (1, 2, 4, 5, [-1, -2])])
    [(None, None, None), (None, None, None, None, [None, None])]
    """
    if isinstance(element, np.ndarray):
        dtype = element.dtype if np.issubdtype(element.dtype, np.floating) else np.float64
        return np.full(element.shape, np.nan, dtype=dtype)
    if isinstance(element, Mapping):
        raise TypeError("nonify: dicts are not accepted; flatten them with flatten_dict first")
    if isinstance(element, (list, tuple)):
        return type(element)(nonify(item) for item in element)
    return None


def update_dict_of_lists(
    dic: dict[str, list], item: Mapping[str, Any], index: int = 0
) -> dict[str, list]:
    """Append each value of the (flat) ``item`` to the list under its key in ``dic``, in place, and return ``dic``.

    ``index`` is the step that ``item`` belongs to: a key whose list is shorter than ``index`` (seen for the first
    time, or missing from some earlier steps) gets missing entries (:func:`nonify` of the value) first, so that the
    value lands at position ``index``. A list already ``index`` long or longer is simply appended to. Keys of ``dic``
    that ``item`` lacks are left short; :func:`complete_dict_of_list` fills them.

    >>> update_dict_of_lists({'a': [1, 2, 3], 'c': [[-1, -2], [-3, -4]]}, {'a': 4, 'b': [1, 2]}, index=3)
    {'a': [1, 2, 3, 4], 'c': [[-1, -2], [-3, -4]], 'b': [[None, None], [None, None], [None, None], [1, 2]]}
    """
    for key, value in item.items():
        values = dic.setdefault(key, [])
        values.extend(nonify(value) for _ in range(index - len(values)))
        values.append(value)
    return dic


def complete_dict_of_list(dic: dict[str, list], length: int) -> dict[str, list]:
    """Pad every list in ``dic`` to ``length`` entries, in place, with :func:`nonify` of its last entry; return ``dic``.

    >>> complete_dict_of_list({'a': [1, 2], 'c': [[-1, -2]]}, 3)
    {'a': [1, 2, None], 'c': [[-1, -2], [None, None], [None, None]]}
    """
    for key, values in dic.items():
        if len(values) > length:
            raise ValueError(
                f"complete_dict_of_list: {key!r} has {len(values)} entries, more than length={length}"
            )
        reference = values[-1] if values else None
        values.extend(nonify(reference) for _ in range(length - len(values)))
    return dic


def list_of_dicts_to_flattened_dict_of_lists(
    samples: Sequence[Mapping], length: int
) -> dict[str, list]:
    """Turn a list of per-step (nested) dicts into one flat dict of lists, each ``length`` long.

    A key missing from some steps gets :func:`nonify` entries there.

    >>> list_of_dicts_to_flattened_dict_of_lists([{'a': {'f': 1}, 'info': 10}, {'a': {'f': 3}, 'step': 80}], 2)
    {'/a/f': [1, 3], '/info': [10, None], '/step': [None, 80]}
    """
    if length < len(samples):
        raise ValueError(f"length={length} is shorter than the {len(samples)} samples")
    dic: dict[str, list] = {}
    for index, sample in enumerate(samples):
        update_dict_of_lists(dic, flatten_dict(sample), index=index)
    return complete_dict_of_list(dic, length)


def _to_array(key: str, values: Any) -> np.ndarray:
    """``values`` as one array; ``None`` entries become NaN. Ragged values raise ``ValueError``
    naming the key."""
    try:
        array = np.asarray(values)
    except ValueError as exc:
        raise ValueError(f"{key!r}: entries have different shapes ({exc})") from None
    if array.dtype == object:
        try:
            array = np.array(values, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"{key!r}: entries are not numeric or have different shapes ({exc})"
            ) from None
    return array


def convert_time_to_batch_major(episode: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Swap the first two axes of every value: ``{key: (num_steps, batch_size, ...)}`` becomes
    ``{key: array (batch_size, num_steps, ...)}``.

    Each array keeps its dtype; ``None`` entries (missing steps) become NaN in a float64 array.

    >>> convert_time_to_batch_major({'key1': [[[1], [2]], [[3], [4]], [[5], [6]]]})['key1'][:, :, 0]
    array([[1, 3, 5],
           [2, 4, 6]])
    """
    result = {}
    for key, values in episode.items():
        array = _to_array(key, values)
        if array.ndim < 2:
            raise ValueError(
                f"{key!r}: expected (num_steps, batch_size, ...), got shape {array.shape}"
            )
        result[key] = np.ascontiguousarray(array.swapaxes(0, 1))
    return result


def dict_of_lists_to_list_of_dicts(dic: Mapping[str, Sequence], num: int) -> list[dict[str, Any]]:
    """Split a flat dict of per-worker sequences into one dict per worker (e.g. to hand each env its action).

    Every value must have exactly ``num`` entries.

    >>> dict_of_lists_to_list_of_dicts({'a1': ([1, 2], [3, 4]), 'a2': ([9], [8])}, 2)
    [{'a1': [1, 2], 'a2': [9]}, {'a1': [3, 4], 'a2': [8]}]
    """
    for key, values in dic.items():
        if len(values) != num:
            raise ValueError(
                f"dict_of_lists_to_list_of_dicts: {key!r} has {len(values)} entries, expected {num}"
            )
    return [{key: values[i] for key, values in dic.items()} for i in range(num)]


def extract_keywise(dic: Mapping[str, Mapping], key: Any) -> dict[str, Any]:
    """Take ``key`` out of every first-level entry:
    ``extract_keywise({'agent1': {'a': [1, 2]}, 'agent2': {'a': [3, 4]}}, 'a')`` gives
    ``{'agent1': [1, 2], 'agent2': [3, 4]}``."""
    missing = [name for name, entry in dic.items() if key not in entry]
    if missing:
        raise KeyError(f"extract_keywise: {key!r} is missing from {missing}")
    return {name: entry[key] for name, entry in dic.items()}


def describe(batch: Mapping[str, Any]) -> str:
    """A table of every key's shape, dtype, NaN and inf counts, mean and std; a nested dict is
    flattened first.

    Digideep's shape, NaN and statistics debugging units in one call: print it to inspect a rollout
    or a minibatch. Tensors are accepted (anything ``np.asarray`` takes); non-numeric values show
    ``-`` for the statistics."""
    rows = [("key", "shape", "dtype", "nan", "inf", "mean", "std")]
    nested = any(isinstance(value, Mapping) for value in batch.values())
    for key, value in (flatten_dict(batch) if nested else batch).items():
        if hasattr(value, "detach"):  # torch tensors, without importing torch here
            value = value.detach().cpu().numpy()
        array = np.asarray(value)
        if np.issubdtype(array.dtype, np.number) or array.dtype == bool:
            numbers = array.astype(np.float64)
            finite = numbers[np.isfinite(numbers)]
            stats = (
                str(int(np.isnan(numbers).sum())),
                str(int(np.isinf(numbers).sum())),
                f"{finite.mean():.4g}" if finite.size else "-",
                f"{finite.std():.4g}" if finite.size else "-",
            )
        else:
            stats = ("-", "-", "-", "-")
        rows.append((key, str(tuple(array.shape)), str(array.dtype), *stats))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


@dataclass
class Episode:
    """One env's stream between two episode ends."""

    env: int
    """Which env of the vector env it came from."""
    start: int
    """Index of its first step in the recording."""
    finished: bool
    """False for the unfinished tail of a stream: the recording stopped before the episode ended."""
    data: dict[str, np.ndarray]
    """Every per-step key, time-major ``(length, ...)``."""

    @property
    def length(self) -> int:
        return len(self.data["/rewards"])

    @property
    def total_reward(self) -> float:
        """The undiscounted return."""
        return float(self.data["/rewards"].sum())


def split_episodes(data: Mapping[str, np.ndarray]) -> list[Episode]:
    """Cut every env's stream at terminations and truncations, in env order then time order.

    An episode ends on the step whose termination or truncation is set. Steps after the last end of
    a stream form a final episode with ``finished=False``."""
    ends = np.asarray(data["/terminations"], dtype=bool) | np.asarray(
        data["/truncations"], dtype=bool
    )
    per_step = {key: value for key, value in data.items() if not key.startswith("/meta/")}
    episodes = []
    for env_index in range(ends.shape[0]):
        start = 0
        stops = [int(t) + 1 for t in np.flatnonzero(ends[env_index])]
        if not stops or stops[-1] < ends.shape[1]:
            stops.append(ends.shape[1])
        for stop in stops:
            episode_data = {key: value[env_index, start:stop] for key, value in per_step.items()}
            episodes.append(
                Episode(env_index, start, bool(ends[env_index, stop - 1]), episode_data)
            )
            start = stop
    return episodes
