"""Where an agent's answers on popgym's CountRecallEasy go wrong, by the step within the episode:
``python -m benchmark.count_recall FILE.npz [FILE.npz ...]``, each file the trajectories of an evaluation
(``--eval-checkpoint CHECKPOINT --save-trajectories FILE.npz``) of any script.

Each step deals a card and asks how many cards of a queried colour have been dealt so far (this one included); the
answer is the action. The count is rebuilt from the observations (their first four entries: the dealt colour and the
queried colour, one-hot) and checked against the rewards, which are positive exactly where the answer is right.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from common.trajectories import TrajectoryFileError, load_trajectories, split_episodes

STEP_RANGES = ((0, 5), (5, 10), (10, 20), (20, 30), (30, 40), (40, 51))
"""the ranges of steps within an episode (first, one past the last) that the table averages over"""


def true_counts(observations: np.ndarray) -> np.ndarray:
    """The right answer at each step of one episode: how many of the cards dealt so far have the queried colour."""
    dealt, queried = observations[:, 0:2].argmax(1), observations[:, 2:4].argmax(1)
    dealt_so_far = np.cumsum(np.eye(2)[dealt], axis=0)
    return dealt_so_far[np.arange(len(queried)), queried]


def errors_by_step(data: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The share of right answers and the mean absolute error of the count at each step of the finished episodes."""
    episodes = [episode for episode in split_episodes(data) if episode.finished]
    if not episodes:
        raise TrajectoryFileError("it holds no finished episode")
    length = min(episode.length for episode in episodes)
    errors = []
    for episode in episodes:
        error = np.abs(episode.data["/actions"].reshape(-1) - true_counts(episode.data["/observations"]))
        if not np.array_equal(error == 0, episode.data["/rewards"] > 0):
            raise TrajectoryFileError("its rewards do not match the counts: not a CountRecallEasy evaluation")
        errors.append(error[:length])
    errors = np.stack(errors)
    return (errors == 0).mean(0), errors.mean(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmark.count_recall", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="trajectory files of CountRecallEasy evaluations")
    paths = parser.parse_args(argv).paths
    rows = []
    for path in paths:
        try:
            data = load_trajectories(path)
        except TrajectoryFileError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        try:
            right, error = errors_by_step(data)
        except TrajectoryFileError as exc:
            print(f"error: {path!r}: {exc}", file=sys.stderr)
            return 2
        cells = [
            f"{right[first:last].mean():.2f} right, error {error[first:last].mean():.2f}" for first, last in STEP_RANGES
        ]
        rows.append(f"| {path} | " + " | ".join(cells) + " |")
    print("| file | " + " | ".join(f"steps {first}-{last - 1}" for first, last in STEP_RANGES) + " |")
    print("|---" * (len(STEP_RANGES) + 1) + "|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
