"""The tables and figures made from runs read back by `benchmark.events`."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from benchmark.events import RunSummary, safe_name, trailing_mean

SMOOTHING_EPISODES = 20
"""learning curves show the mean of a trailing window of this many episodes"""
CURVE_POINTS = 200


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
