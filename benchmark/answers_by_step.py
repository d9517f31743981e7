"""Where an agent's answers on a popgym card game go wrong, by the step within the episode: ``python
-m benchmark.answers_by_step PATH [PATH ...] [--steps 0 5 10 ...] [--count-recall] [--by-answer]``,
each the trajectories of an evaluation (``--eval-checkpoint CHECKPOINT --save-trajectories PATH``, a
folder) of any script.

The card games (RepeatFirst, CountRecall, ...) pay a positive reward for a right answer and a
negative one for a wrong one, so the share of right answers at a step is the share of positive
rewards there. With ``--count-recall`` the table also gives how far the answers are from the right
count on CountRecallEasy: each step deals a card and asks how many cards of a queried colour have
been dealt so far (this one included). That count is rebuilt from the observations (their first four
entries: the dealt colour and the queried colour, one-hot) and checked against the rewards. With
``--by-answer`` it also gives, for each action, its share of the answers on the scored steps (those
with a reward) and the share of those answers that were right: an agent that never gives one answer
shows it there."""

from __future__ import annotations

import argparse
import json
import sys

import gymnasium as gym
import numpy as np

from common.envs import resolve_env_id
from common.trajectories import TrajectoryFileError, load_trajectories, split_episodes


def true_counts(observations: np.ndarray) -> np.ndarray:
    """CountRecallEasy's right answer at each step of one episode: how many of the cards dealt so
    far have the queried colour."""
    dealt, queried = observations[:, 0:2].argmax(1), observations[:, 2:4].argmax(1)
    dealt_so_far = np.cumsum(np.eye(2)[dealt], axis=0)
    return dealt_so_far[np.arange(len(queried)), queried]


def answers_by_step(
    data: dict[str, np.ndarray], count_recall: bool = False
) -> tuple[np.ndarray, np.ndarray | None]:
    """The share of right answers at each step of the finished episodes (up to the shortest one's
    length), and with `count_recall` the mean absolute error of the count there."""
    episodes = [episode for episode in split_episodes(data) if episode.finished]
    if not episodes:
        raise TrajectoryFileError("it holds no finished episode")
    length = min(episode.length for episode in episodes)
    right = np.stack([episode.data["/rewards"][:length] > 0 for episode in episodes])
    if not count_recall:
        return right.mean(0), None
    errors = []
    for episode in episodes:
        error = np.abs(
            episode.data["/actions"].reshape(-1) - true_counts(episode.data["/observations"])
        )
        if not np.array_equal(error == 0, episode.data["/rewards"] > 0):
            raise TrajectoryFileError(
                "its rewards do not match the counts: not a CountRecallEasy evaluation"
            )
        errors.append(error[:length])
    return right.mean(0), np.stack(errors).mean(0)


def answers_by_action(data: dict[str, np.ndarray]) -> dict[int, tuple[float, float | None]]:
    """For each action of a discrete agent (its env's, where the file's args name one that can be
    made): its share of the answers on the scored steps (a non-zero reward), and the share of them
    that were right (None for an action never given)."""
    scored = data["/rewards"] != 0
    actions, right = data["/actions"][scored].astype(int), data["/rewards"][scored] > 0
    try:
        space = gym.make(resolve_env_id(json.loads(str(data["/meta/args"]))["env_id"])).action_space
        num_actions = int(space.n)
    # no args, an env that cannot be made here, or not a discrete one: the answers given
    except Exception:
        num_actions = int(actions.max()) + 1
    return {
        action: (
            (actions == action).mean(),
            right[actions == action].mean() if (actions == action).any() else None,
        )
        for action in range(num_actions)
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmark.answers_by_step", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "paths", nargs="+", help="trajectory files of evaluations on a popgym card game"
    )
    parser.add_argument(
        "--steps",
        nargs="+",
        type=int,
        default=[0, 5, 10, 20, 30, 40],
        help="where each range starts",
    )
    parser.add_argument(
        "--count-recall", action="store_true", help="also the count's error (CountRecallEasy)"
    )
    parser.add_argument(
        "--by-answer", action="store_true", help="also each action's share of answers and of right"
    )
    options = parser.parse_args(argv)
    starts = sorted(set(options.steps))
    if starts[0] < 0:
        print("error: --steps must not be negative", file=sys.stderr)
        return 2
    rows, shortest = [], None
    for path in options.paths:
        try:
            data = load_trajectories(path)
        except TrajectoryFileError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        try:
            right, error = answers_by_step(data, options.count_recall)
        except TrajectoryFileError as exc:
            print(f"error: {path!r}: {exc}", file=sys.stderr)
            return 2
        rows.append((path, right, error))
        shortest = len(right) if shortest is None else min(shortest, len(right))
    ranges = [
        (first, last)
        for first, last in zip(starts, [*starts[1:], shortest], strict=True)
        if first < last
    ]
    if not ranges:
        print(
            f"error: every --steps range starts at or after the episodes' end ({shortest} steps)",
            file=sys.stderr,
        )
        return 2
    print("| file | " + " | ".join(f"steps {first}-{last - 1}" for first, last in ranges) + " |")
    print("|---" * (len(ranges) + 1) + "|")
    for path, right, error in rows:
        cells = [
            f"{right[first:last].mean():.2f}"
            + ("" if error is None else f", error {error[first:last].mean():.2f}")
            for first, last in ranges
        ]
        print(f"| {path} | " + " | ".join(cells) + " |")
    for path in options.paths if options.by_answer else ():
        shares = answers_by_action(load_trajectories(path))
        print(f"\n| {path}: action | share of answers | right when given |\n|---|---|---|")
        for action, (share, right) in shares.items():
            print(f"| {action} | {share:.3f} | {'-' if right is None else f'{right:.3f}'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
