"""The terms of recorded episodes' returns: ``python -m benchmark.reward_terms RECORDING...``.

Gymnasium's MuJoCo tasks give their reward's terms in each step's info (`reward_forward`,
`reward_ctrl`, `reward_contact`, `reward_survive`, ...), and a step's reward is their sum. Summed
over the finished episodes of a recording (`--save-trajectories`, with `--eval-checkpoint` for a
trained policy's evaluation episodes), they say what a return is made of: how a task's versions
differ for one policy (Humanoid-v5 charges a contact cost that v4 does not, and pays the healthy
reward only while healthy), or which term a run that falls short is missing. The table gives each
term's mean and std over the episodes, and their sum beside the return, which it must equal.

    python ppo_fc.py --env-id Humanoid-v5 --eval-checkpoint RUN/checkpoints/latest.pt --save-trajectories eval
    python -m benchmark.reward_terms eval
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import numpy as np

from benchmark.report import markdown_table, spread
from benchmark.statistics import mean_std
from common.data_helpers import Episode, split_episodes
from common.trajectories import TrajectoryFileError, load_trajectories

TERM_PREFIX = "reward_"
INFO_PREFIXES = ("/infos/", "/infos/final_info/")


def episode_terms(episode: Episode) -> dict[str, float]:
    """Each reward term of the step infos summed over one episode; the last step's, with gymnasium's
    same-step autoreset, is in `final_info`. A step whose info lacks the term adds nothing (NaN where
    the recording has no entry, 0 where the vector env filled one in)."""
    terms: dict[str, float] = {}
    for key, values in episode.data.items():
        for prefix in INFO_PREFIXES:
            name = key[len(prefix) :]
            if key.startswith(prefix) and name.startswith(TERM_PREFIX) and "/" not in name:
                terms[name] = terms.get(name, 0.0) + float(np.nansum(values))
    return terms


def terms_table(episodes: Sequence[Episode], per_episode: Sequence[dict[str, float]]) -> list[str]:
    """A markdown table of each term's mean ± std over `episodes` (`per_episode`: their
    `episode_terms`), with the return and the length."""
    names = sorted({name for terms in per_episode for name in terms})
    columns = {name: [terms.get(name, 0.0) for terms in per_episode] for name in names}
    columns["sum of the terms"] = [sum(terms.values()) for terms in per_episode]
    columns["return"] = [episode.total_reward for episode in episodes]
    columns["length"] = [float(episode.length) for episode in episodes]
    return markdown_table(list(columns), [[spread(*mean_std(v)) for v in columns.values()]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recordings", nargs="+", help="trajectory files or recording folders")
    options = parser.parse_args(argv)
    for recording in options.recordings:
        try:
            episodes = [e for e in split_episodes(load_trajectories(recording)) if e.finished]
        except TrajectoryFileError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if not episodes:
            print(f"error: {recording!r} holds no finished episode", file=sys.stderr)
            return 2
        per_episode = [episode_terms(episode) for episode in episodes]
        if not any(per_episode):
            print(
                f"error: the step infos of {recording!r} hold no {TERM_PREFIX}* terms "
                "(gymnasium's MuJoCo tasks give them)",
                file=sys.stderr,
            )
            return 2
        print(f"{recording}: {len(episodes)} finished episode{'s' if len(episodes) > 1 else ''}")
        print("\n".join(terms_table(episodes, per_episode)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
