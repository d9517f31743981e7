"""Reading runs back from their TensorBoard events.

Any run folder written by a script of this project (or by the Stable-Baselines3 baselines of benchmark.baselines)
works: the scalars are read with TensorBoard's own `EventAccumulator`, keeping every record.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing import event_accumulator

RETURN_TAG = "charts/episodic_return"
SPS_TAG = "charts/SPS"
EVAL_TAG = "eval/episodic_return"
RSS_TAG = "system/rss_mb"
LAST_EPISODES = 100
"""the training return of a run is the mean over its last this many episodes"""


def load_events(run_dir: str | Path) -> tuple[dict[str, list[event_accumulator.ScalarEvent]], float | None]:
    """Every scalar record of a run folder, by tag, in the order written (size guidance 0: nothing sampled away),
    and the wall time of the folder's first event (when its writer was made, near the run's start)."""
    accumulator = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    scalars = {tag: accumulator.Scalars(tag) for tag in accumulator.Tags()["scalars"]}
    try:
        return scalars, accumulator.FirstEventTimestamp()
    except ValueError:  # no events at all
        return scalars, None


def find_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """The run folders (folders holding an events file) at or under `paths`, evaluation-only runs left out."""
    found: set[Path] = set()
    for path in map(Path, paths):
        for events_file in [path] if path.is_file() else path.rglob("events.out.tfevents.*"):
            if not events_file.parent.name.endswith("__eval"):
                found.add(events_file.parent.resolve())
    return sorted(found)


RUN_NAME = re.compile(r"^(?P<env>.+?)__(?P<exp>.+)__(?P<seed>-?\d+)__(?P<time>\d+)$")


def parse_run_name(name: str) -> tuple[str, str, int | None]:
    """(env id as written in the name, exp name, seed) from `{env_id}__{exp_name}__{seed}__{unix time}`; a folder
    named otherwise is its own exp name, with env "?" and no seed."""
    match = RUN_NAME.match(name)
    if match is None:
        return "?", name, None
    return match["env"], match["exp"], int(match["seed"])


def trailing_mean(values: np.ndarray, window: int) -> np.ndarray:
    """At each position, the mean of the last `window` values (of all of them, while fewer have come)."""
    sums = np.cumsum(values, dtype=np.float64)
    sums[window:] -= sums[:-window].copy()
    return sums / np.minimum(np.arange(1, len(values) + 1), window)


@dataclass
class RunSummary:
    """What the benchmark needs of one run, read from its events."""

    run_dir: str
    script: str
    env_id: str
    seed: int | None
    steps: int = 0
    """the last global step with a record"""
    episode_steps: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """the global step at which each training episode ended"""
    episode_seconds: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """seconds since the run started at which each training episode ended"""
    episode_returns: np.ndarray = field(default_factory=lambda: np.zeros(0))
    eval_returns: list[float] = field(default_factory=list)
    sps: float | None = None
    """env steps per second from the first to the last charts/SPS record (start-up and iteration 1 left out)"""
    peak_rss_mb: float | None = None

    @property
    def last_return(self) -> float | None:
        """The mean return of the last `LAST_EPISODES` training episodes."""
        return float(np.mean(self.episode_returns[-LAST_EPISODES:])) if len(self.episode_returns) else None

    @property
    def eval_return(self) -> float | None:
        return float(np.mean(self.eval_returns)) if self.eval_returns else None

    def steps_to_reach(self, threshold: float) -> int | None:
        """The first global step at which the mean of the last `LAST_EPISODES` episodes (all of them, while fewer
        have ended) reaches `threshold`; None if it never does."""
        reached = np.flatnonzero(trailing_mean(self.episode_returns, LAST_EPISODES) >= threshold)
        return int(self.episode_steps[reached[0]]) if len(reached) else None


def summarise_run(run_dir: str | Path, script: str | None = None, env_id: str | None = None) -> RunSummary:
    """Read one run folder; `script` and `env_id` default to what its name says."""
    run_dir = Path(run_dir)
    named_env, exp_name, seed = parse_run_name(run_dir.name)
    summary = RunSummary(str(run_dir), script or exp_name, env_id or named_env, seed)
    scalars, start = load_events(run_dir)
    episodes = scalars.get(RETURN_TAG, [])
    summary.episode_steps = np.array([event.step for event in episodes], dtype=np.int64)
    summary.episode_returns = np.array([event.value for event in episodes], dtype=np.float64)
    summary.episode_seconds = np.array([event.wall_time - (start or 0.0) for event in episodes], dtype=np.float64)
    summary.eval_returns = [event.value for event in scalars.get(EVAL_TAG, [])]
    sps_records = scalars.get(SPS_TAG, [])
    # The last training record (evaluation episodes are logged at steps past the end of training).
    summary.steps = sps_records[-1].step if sps_records else int(summary.episode_steps[-1]) if len(episodes) else 0
    if len(sps_records) >= 2 and sps_records[-1].wall_time > sps_records[0].wall_time:
        first, last = sps_records[0], sps_records[-1]
        summary.sps = (last.step - first.step) / (last.wall_time - first.wall_time)
    elif sps_records:  # one iteration: only the script's own figure exists
        summary.sps = sps_records[-1].value
    if scalars.get(RSS_TAG):
        summary.peak_rss_mb = max(event.value for event in scalars[RSS_TAG])
    return summary


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text)
