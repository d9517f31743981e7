"""Reading runs back from their TensorBoard events.

Any run folder written by a script of this project (or by the Stable-Baselines3 baselines of
benchmark.baselines) works. A folder holds one events file per session: the run's first
SummaryWriter, then one more for each `--resume`, made with `purge_step` so that its file begins
with a SessionLog START event at the first step it logs. Each file is read with TensorBoard's own
`LegacyEventFileLoader` (the one `EventAccumulator` uses), keeping every record; the records of an
earlier session at or past a later session's purge step are dropped (as `EventAccumulator` drops
them), so each step counts once."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tensorboard.backend.event_processing import event_file_loader, io_wrapper
from tensorboard.backend.event_processing.event_accumulator import ScalarEvent
from tensorboard.compat.proto import event_pb2

RETURN_TAG = "charts/episodic_return"
SPS_TAG = "charts/SPS"
EVAL_TAG = "eval/episodic_return"
RSS_TAG = "system/rss_mb"
LAST_EPISODES = 100
"""the training return of a run is the mean over its last this many episodes, and a threshold is
reached by it (a case can set another window: `RunSummary.window`)"""


@dataclass
class Session:
    """What one SummaryWriter wrote: one events file of a run folder."""

    path: Path
    start: float
    """the wall time of its first event (when the writer was made)"""
    purge_step: int | None
    """the step of its SessionLog START event (a resumed run's first step; None for a run's first writer)"""
    scalars: dict[str, list[ScalarEvent]]
    """its scalar records by tag, in the order written (from `load_sessions`: only those no later session replaced)"""

    @property
    def last_record_time(self) -> float:
        """The wall time of its last scalar record (its start while it has none)."""
        return max(
            (event.wall_time for records in self.scalars.values() for event in records),
            default=self.start,
        )


def read_session(events_file: str | Path) -> Session | None:
    """Every scalar record of one events file, its first event's wall time and its purge step; None
    if it is empty."""
    start, purge_step = None, None
    scalars: dict[str, list[ScalarEvent]] = {}
    for event in event_file_loader.LegacyEventFileLoader(str(events_file)).Load():
        if start is None:
            start = event.wall_time
        if event.HasField("session_log") and event.session_log.status == event_pb2.SessionLog.START:
            purge_step = event.step if purge_step is None else min(purge_step, event.step)
        for value in event.summary.value:
            if value.HasField("simple_value"):  # the scalars EventAccumulator.Scalars gives
                scalars.setdefault(value.tag, []).append(
                    ScalarEvent(event.wall_time, event.step, value.simple_value)
                )
    return None if start is None else Session(Path(events_file), start, purge_step, scalars)


def load_sessions(run_dir: str | Path) -> list[Session]:
    """The sessions of a run folder (or of one events file) in the order they started, each keeping
    only the records below the purge steps of the sessions after it."""
    path = Path(run_dir)
    files = (
        [path]
        if path.is_file()
        else sorted(p for p in path.iterdir() if io_wrapper.IsSummaryEventsFile(str(p)))
    )
    sessions = sorted(filter(None, map(read_session, files)), key=lambda session: session.start)
    cutoff: int | None = None  # the lowest purge step of the sessions after this one
    for session in reversed(sessions):
        if cutoff is not None:
            kept = {
                tag: [event for event in records if event.step < cutoff]
                for tag, records in session.scalars.items()
            }
            session.scalars = {tag: records for tag, records in kept.items() if records}
        if session.purge_step is not None:
            cutoff = session.purge_step if cutoff is None else min(cutoff, session.purge_step)
    return sessions


def merged_scalars(sessions: list[Session]) -> dict[str, list[ScalarEvent]]:
    """The kept records of all `sessions`, by tag, session after session."""
    scalars: dict[str, list[ScalarEvent]] = {}
    for session in sessions:
        for tag, records in session.scalars.items():
            scalars.setdefault(tag, []).extend(records)
    return scalars


def load_events(run_dir: str | Path) -> tuple[dict[str, list[ScalarEvent]], float | None]:
    """Every kept scalar record of a run folder, by tag, session after session and in the order
    written (nothing sampled away), and the wall time of the folder's first event (when its first
    writer was made, near the start)."""
    sessions = load_sessions(run_dir)
    return merged_scalars(sessions), sessions[0].start if sessions else None


def training_seconds(sessions: list[Session], tag: str) -> np.ndarray:
    """Seconds of training at each kept record of `tag`: from the first session's first event on,
    each gap from a session's last kept record to the next session's first event left out."""
    seconds: list[float] = []
    elapsed = 0.0  # the training time of the sessions before this one
    for session in sessions:
        seconds += [
            elapsed + event.wall_time - session.start for event in session.scalars.get(tag, [])
        ]
        elapsed += session.last_record_time - session.start
    return np.array(seconds, dtype=np.float64)


def steps_per_second(sessions: list[Session]) -> float | None:
    """Env steps per second over the sessions' kept charts/SPS records: the sum over sessions of the
    steps from a session's first record to its last, over the sum of the wall time between them;
    None if no session has two records apart in time."""
    steps, seconds = 0, 0.0
    for session in sessions:
        records = session.scalars.get(SPS_TAG, [])
        # The first record comes after start-up and the session's first iteration, which are thus
        # left out.
        if len(records) >= 2 and records[-1].wall_time > records[0].wall_time:
            steps += records[-1].step - records[0].step
            seconds += records[-1].wall_time - records[0].wall_time
    return steps / seconds if seconds > 0 else None


def find_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """The run folders (folders holding an events file) at or under `paths`, evaluation-only runs
    left out."""
    found: set[Path] = set()
    for path in map(Path, paths):
        for events_file in [path] if path.is_file() else path.rglob("events.out.tfevents.*"):
            if not events_file.parent.name.endswith("__eval"):
                found.add(events_file.parent.resolve())
    return sorted(found)


RUN_NAME = re.compile(r"^(?P<env>.+?)__(?P<exp>.+?)__(?P<seed>-?\d+)(__(?P<time>\d+))?$")


def parse_run_name(name: str) -> tuple[str, str, int | None]:
    """(env id as written in the name, exp name, seed) from `{env_id}__{exp_name}__{seed}__{unix
    time}`, or the harness's `{env_id}__{exp_name}__{seed}` (`benchmark.jobs.RESUMABLE`); a folder
    named otherwise is its own exp name, with env "?" and no seed."""
    match = RUN_NAME.match(name)
    if match is None:
        return "?", name, None
    return match["env"], match["exp"], int(match["seed"])


def trailing_mean(values: np.ndarray, window: int) -> np.ndarray:
    """At each position, the mean of the last `window` values (of all of them, while fewer have
    come)."""
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
    """the last global step with a training record"""
    episode_steps: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """the global step at which each training episode ended (never decreasing, resumed or not)"""
    episode_seconds: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """seconds of training at which each training episode ended (see `training_seconds`: time between sessions left
    out)"""
    episode_returns: np.ndarray = field(default_factory=lambda: np.zeros(0))
    eval_returns: list[float] = field(default_factory=list)
    sps: float | None = None
    """env steps per second between the charts/SPS records of each session (see `steps_per_second`)"""
    peak_rss_mb: float | None = None
    """the largest system/rss_mb record"""
    sessions: int = 0
    """how many writers the run had: more than one when it was resumed"""
    wall_seconds: float | None = None
    """the run's wall-clock: from each session's first event to its last record (its evaluation included), summed
    over sessions; start-up before the writer and the time between sessions left out"""
    window: int = LAST_EPISODES
    """the training return is the mean of the last this many episodes, and thresholds are reached by it"""

    @property
    def last_return(self) -> float | None:
        """The mean return of the last `window` training episodes."""
        return (
            float(np.mean(self.episode_returns[-self.window :]))
            if len(self.episode_returns)
            else None
        )

    @property
    def eval_return(self) -> float | None:
        """The mean return of the evaluation episodes."""
        return float(np.mean(self.eval_returns)) if self.eval_returns else None

    def steps_to_reach(self, threshold: float) -> int | None:
        """The first global step at which at least `window` episodes have ended and the mean of the
        last `window` reaches `threshold`; None if that never happens."""
        episode = self._episode_reaching(threshold)
        return None if episode is None else int(self.episode_steps[episode])

    def seconds_to_reach(self, threshold: float) -> float | None:
        """The seconds of training (`episode_seconds`) at the step of `steps_to_reach`; None if
        never."""
        episode = self._episode_reaching(threshold)
        return None if episode is None else float(self.episode_seconds[episode])

    def _episode_reaching(self, threshold: float) -> int | None:
        if len(self.episode_returns) < self.window:
            return None
        means = trailing_mean(self.episode_returns, self.window)
        # Several episodes can end at one step: the step is judged by the last of them.
        last_at_step = np.append(self.episode_steps[1:] != self.episode_steps[:-1], True)
        full_window = np.arange(len(means)) >= self.window - 1
        reached = np.flatnonzero(full_window & last_at_step & (means >= threshold))
        return int(reached[0]) if len(reached) else None


def summarise_run(
    run_dir: str | Path,
    script: str | None = None,
    env_id: str | None = None,
    window: int = LAST_EPISODES,
) -> RunSummary:
    """Read one run folder; `script` and `env_id` default to what its name says."""
    run_dir = Path(run_dir)
    named_env, exp_name, seed = parse_run_name(run_dir.name)
    summary = RunSummary(str(run_dir), script or exp_name, env_id or named_env, seed, window=window)
    sessions = load_sessions(run_dir)
    scalars = merged_scalars(sessions)
    episodes = scalars.get(RETURN_TAG, [])
    summary.episode_steps = np.array([event.step for event in episodes], dtype=np.int64)
    summary.episode_returns = np.array([event.value for event in episodes], dtype=np.float64)
    summary.episode_seconds = training_seconds(sessions, RETURN_TAG)
    summary.eval_returns = [event.value for event in scalars.get(EVAL_TAG, [])]
    sps_records = scalars.get(SPS_TAG, [])
    # The last training step: the SPS records are training's only (evaluation writes none).
    summary.steps = (
        sps_records[-1].step
        if sps_records
        else int(summary.episode_steps[-1])
        if len(episodes)
        else 0
    )
    summary.sps = steps_per_second(sessions)
    if scalars.get(RSS_TAG):
        summary.peak_rss_mb = max(event.value for event in scalars[RSS_TAG])
    summary.sessions = len(sessions)
    summary.wall_seconds = sum(session.last_record_time - session.start for session in sessions)
    return summary


def safe_name(text: str) -> str:
    """`text` with every run of characters unsafe in a file name replaced by "-"."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text)
