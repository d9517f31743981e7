"""Reading runs back from their TensorBoard events, and the tables and figures made from them.

Any run folder written by a script of this project (or by the Stable-Baselines3 baselines of benchmark.baselines)
works: the scalars are read with TensorBoard's own `EventAccumulator`, keeping every record.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
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
SMOOTHING_EPISODES = 20
"""learning curves show the mean of a trailing window of this many episodes"""
CURVE_POINTS = 200


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


# Tables


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.{digits}f}"


def mean_std(values: Sequence[float | None], digits: int = 1) -> str:
    """`mean ± std` over the known values (population std), noting how many of them are known."""
    known = [value for value in values if value is not None]
    if not known:
        return "n/a"
    text = f"{np.mean(known):,.{digits}f} ± {np.std(known):,.{digits}f}"
    return text if len(known) == len(values) else f"{text} ({len(known)} of {len(values)})"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def group_runs(runs: Iterable[RunSummary]) -> dict[tuple[str, str], list[RunSummary]]:
    """Runs by (script, env id), seeds in order."""
    groups: dict[tuple[str, str], list[RunSummary]] = defaultdict(list)
    for run in runs:
        groups[run.script, run.env_id].append(run)
    return {key: sorted(runs, key=lambda run: (run.seed is None, run.seed or 0)) for key, runs in groups.items()}


# Figures


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text)


def _curve(runs: Sequence[RunSummary], x_of: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The smoothed return of each run on a common x grid (up to where the shortest run ends), as (grid, curves)."""
    usable = [run for run in runs if len(run.episode_returns)]
    if not usable:
        return None
    end = min(float(getattr(run, x_of)[-1]) for run in usable)
    grid = np.linspace(0.0, end, CURVE_POINTS) if end > 0 else np.zeros(1)
    curves = []
    for run in usable:
        smoothed = trailing_mean(run.episode_returns, SMOOTHING_EPISODES)
        curves.append(np.interp(grid, getattr(run, x_of), smoothed))
    return grid, np.array(curves)


def _pyplot():
    """matplotlib's pyplot, drawing to files only (imported here: reading runs does not need matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_learning_curves(groups: dict[tuple[str, str], list[RunSummary]], out: Path) -> list[Path]:
    """Per env, two figures with a line per script: the episodic return against env steps and against wall-clock
    time; the line is the mean across seeds, the band spans the lowest to the highest seed."""
    plt = _pyplot()
    written = []
    for env_id in sorted({env_id for _, env_id in groups}):
        for x_of, label, stem in (
            ("episode_steps", "environment steps", "return_vs_steps"),
            ("episode_seconds", "wall-clock time (s)", "return_vs_time"),
        ):
            figure, axes = plt.subplots(figsize=(7, 4.5))
            for (script, group_env), runs in sorted(groups.items()):
                curve = _curve(runs, x_of) if group_env == env_id else None
                if curve is None:
                    continue
                grid, curves = curve
                line = axes.plot(grid, curves.mean(0), label=f"{script} ({len(curves)} seeds)")[0]
                axes.fill_between(grid, curves.min(0), curves.max(0), color=line.get_color(), alpha=0.2)
            axes.set(
                title=env_id,
                xlabel=label,
                ylabel=f"episodic return (mean of {SMOOTHING_EPISODES} episodes)",
            )
            axes.grid(alpha=0.3)
            if axes.has_data():
                axes.legend()
            path = out / f"{stem}_{safe_name(env_id)}.png"
            figure.tight_layout()
            figure.savefig(path, dpi=100)
            plt.close(figure)
            written.append(path)
    return written


def plot_sps(bars: Sequence[tuple[str, list[float]]], path: Path) -> Path:
    """A bar per (label, SPS of each seed): the mean, with the lowest and highest seed as the error bar."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(max(5, 1.4 * len(bars) + 2), 4.5))
    means = [float(np.mean(values)) if values else 0.0 for _, values in bars]
    low = [mean - min(values) if values else 0.0 for mean, (_, values) in zip(means, bars, strict=True)]
    high = [max(values) - mean if values else 0.0 for mean, (_, values) in zip(means, bars, strict=True)]
    positions = np.arange(len(bars))
    axes.bar(positions, means, yerr=[low, high], capsize=4, color="tab:blue")
    for position, mean in zip(positions, means, strict=True):
        axes.annotate(
            f"{mean:,.0f}", (position, mean), ha="center", va="bottom", xytext=(0, 3), textcoords="offset points"
        )
    axes.set_xticks(positions, [label for label, _ in bars], rotation=20, ha="right")
    axes.set(ylabel="environment steps per second", title="speed (bar: mean over seeds; whiskers: min to max)")
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
