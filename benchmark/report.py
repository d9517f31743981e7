"""The results of a benchmark: its rows and their numbers (for results.md and results.json alike),
the tables, the figures and results.md, made from runs read back by `benchmark.events`; ``plot``
makes them from any run folders."""

from __future__ import annotations

import math
import os
import platform
import subprocess
import sys
import textwrap
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Annotated

import numpy as np
import tyro

from benchmark.cases import REFERENCE_MARGIN, SPEED_THRESHOLD, CleanRLPublished
from benchmark.events import (
    LAST_EPISODES,
    RunSummary,
    find_run_dirs,
    safe_name,
    summarise_run,
    trailing_mean,
)
from benchmark.registry import REPO
from benchmark.statistics import (
    MIN_SEEDS_FOR_IQM,
    iqm,
    iqm_interval,
    mean_std,
    median_steps_to_threshold,
)

SMOOTHING_EPISODES = 20
"""learning curves show the mean of a trailing window of this many episodes"""
CURVE_POINTS = 200


@dataclass
class Row:
    """One line of the results: the runs of one group of jobs (a case of a script, or its baseline),
    by seed."""

    label: str
    """what made the runs: a script, `sb3_<algo>`, or a run folder's exp name"""
    env_id: str
    key: str
    """the group's identity (its job ids without the seed)"""
    total_timesteps: int | None = None
    flags: tuple[str, ...] = ()
    nproc: int = 1
    """processes of each run (under torchrun when more than 1; 1 for baselines and runs read back from folders)"""
    threshold: float | None = None
    """the case's threshold"""
    judged: bool = False
    """whether the row gets a PASS/FAIL verdict (our scripts' cases with a threshold)"""
    judged_on: str = "training"
    """what the threshold applies to (`benchmark.cases.Case.judged_on`): training, reached or eval"""
    runs: list[RunSummary] = field(default_factory=list)
    failed_seeds: list[int] = field(default_factory=list)


@dataclass
class RowNumbers:
    """Every number the results show for a row, computed once for results.md and results.json."""

    label: str
    env_id: str
    key: str
    total_timesteps: int | None
    flags: list[str]
    seeds: list[int | None]
    failed_seeds: list[int]
    steps: float | None
    """mean over seeds of the last training step"""
    last_return_mean: float | None
    last_return_std: float | None
    """sample std (ddof=1) across seeds; None with one seed"""
    last_return_iqm: float | None
    """interquartile mean across seeds (with 5 seeds or more), and its 95% bootstrap interval"""
    last_return_iqm_low: float | None
    last_return_iqm_high: float | None
    eval_return_mean: float | None
    eval_return_std: float | None
    threshold: float | None
    judged_on: str
    steps_to_threshold: list[int | None]
    """per seed: the first step at which the mean of the last 100 episodes reached the threshold (None: never)"""
    median_steps_to_threshold: float | None
    """the median over seeds, seeds that never reached it counting as beyond the budget (None then)"""
    median_beyond_budget: bool
    sps_mean: float | None
    sps_std: float | None
    peak_rss_mb: float | None
    """the largest resident memory any seed's run logged"""
    verdict: str
    """PASS, FAIL, or - (no threshold, or a baseline)"""
    nproc: int = 1
    """processes of each run (`Row.nproc`)"""
    window: int = LAST_EPISODES
    """the training return's window of episodes"""
    seconds_to_threshold: list[float | None] = field(default_factory=list)
    """per seed: the seconds of training at `steps_to_threshold` (None: never)"""
    median_seconds_to_threshold: float | None = None
    """the median over seeds of those seconds (None when the median seed never reached it)"""
    wall_minutes_mean: float | None = None
    """mean over seeds of a run's wall-clock in minutes (`RunSummary.wall_seconds`)"""


def row_numbers(row: Row) -> RowNumbers:
    runs = row.runs
    last_returns = [run.last_return for run in runs if run.last_return is not None]
    evals = [run.eval_return for run in runs if run.eval_return is not None]
    sps = [run.sps for run in runs if run.sps is not None]
    wall_minutes = [run.wall_seconds / 60 for run in runs if run.wall_seconds is not None]
    iqm_value = low = high = None
    if len(last_returns) >= MIN_SEEDS_FOR_IQM:
        iqm_value = iqm(last_returns)
        low, high = iqm_interval([last_returns])
    on_training = row.threshold is not None and row.judged_on in ("training", "reached")
    to_threshold = [run.steps_to_reach(row.threshold) for run in runs] if on_training else []
    seconds_to_threshold = (
        [run.seconds_to_reach(row.threshold) for run in runs] if on_training else []
    )
    median = median_steps_to_threshold(to_threshold)
    (return_mean, return_std), (eval_mean, eval_std), (sps_mean, sps_std) = map(
        mean_std, (last_returns, evals, sps)
    )
    verdict = "-"
    if row.judged and row.threshold is not None:
        if row.judged_on == "reached":  # -inf for a seed that never reached it
            judged_returns = [
                row.threshold if steps is not None else -math.inf for steps in to_threshold
            ]
        else:
            on_training_return = row.judged_on in ("training", "published")
            judged_returns = last_returns if on_training_return else evals
        passed = runs and not row.failed_seeds and len(judged_returns) == len(runs)
        # Against a reference or a published figure the mean over seeds is judged; otherwise every
        # seed.
        judged = (
            np.mean(judged_returns)
            if row.judged_on in ("reference", "published") and passed
            else min(judged_returns, default=0)
        )
        verdict = "PASS" if passed and judged >= row.threshold else "FAIL"
    elif row.judged and row.failed_seeds:
        verdict = "FAIL"
    return RowNumbers(
        label=row.label,
        env_id=row.env_id,
        key=row.key,
        total_timesteps=row.total_timesteps,
        flags=list(row.flags),
        nproc=row.nproc,
        seeds=[run.seed for run in runs],
        failed_seeds=list(row.failed_seeds),
        steps=float(np.mean([run.steps for run in runs])) if runs else None,
        last_return_mean=return_mean,
        last_return_std=return_std,
        last_return_iqm=iqm_value,
        last_return_iqm_low=low,
        last_return_iqm_high=high,
        eval_return_mean=eval_mean,
        eval_return_std=eval_std,
        threshold=row.threshold,
        judged_on=row.judged_on,
        steps_to_threshold=to_threshold,
        median_steps_to_threshold=None if median is None or math.isinf(median) else median,
        median_beyond_budget=median is not None and math.isinf(median),
        seconds_to_threshold=seconds_to_threshold,
        median_seconds_to_threshold=median_to_reach(runs, row.threshold, seconds=True)
        if on_training
        else None,
        sps_mean=sps_mean,
        sps_std=sps_std,
        peak_rss_mb=max(
            (run.peak_rss_mb for run in runs if run.peak_rss_mb is not None), default=None
        ),
        verdict=verdict,
        window=runs[0].window if runs else LAST_EPISODES,
        wall_minutes_mean=float(np.mean(wall_minutes)) if wall_minutes else None,
    )


@dataclass
class SpeedNumbers:
    """A script row's SPS against the raw speed of its env stack and against its baseline, measured
    in one run."""

    label: str
    env_id: str
    key: str
    flags: list[str]
    sps: float | None
    raw_env_sps: float | None
    script_over_raw_env: float | None
    baseline: str | None
    baseline_sps: float | None
    script_over_baseline: float | None
    nproc: int = 1
    """processes of each of the script's runs (`Row.nproc`); the raw env and the baseline run in one"""
    reference: str | None = None
    """another script with the same settings (the case's `compare_with`)"""
    reference_sps: float | None = None
    script_over_reference: float | None = None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, None when either is unknown or the denominator is 0."""
    return None if numerator is None or not denominator else numerator / denominator


def speed_numbers(
    row: RowNumbers,
    raw_env_sps: float | None,
    baseline: RowNumbers | None,
    reference: RowNumbers | None = None,
) -> SpeedNumbers:
    baseline_sps = baseline.sps_mean if baseline is not None else None
    reference_sps = reference.sps_mean if reference is not None else None
    return SpeedNumbers(
        label=row.label,
        env_id=row.env_id,
        key=row.key,
        flags=row.flags,
        nproc=row.nproc,
        sps=row.sps_mean,
        raw_env_sps=raw_env_sps,
        script_over_raw_env=ratio(row.sps_mean, raw_env_sps),
        baseline=baseline.label if baseline is not None else None,
        baseline_sps=baseline_sps,
        script_over_baseline=ratio(row.sps_mean, baseline_sps),
        reference=reference.label if reference is not None else None,
        reference_sps=reference_sps,
        script_over_reference=ratio(row.sps_mean, reference_sps),
    )


# Tables


def fmt(value: float | None, digits: int = 1) -> str:
    return (
        "n/a"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else f"{value:,.{digits}f}"
    )


def with_flags(label: str, flags: Sequence[str]) -> str:
    """A row's name in a table: the script and the flags it ran with, which tell apart two rows of
    one script."""
    return label + (f" `{' '.join(flags)}`" if flags else "")


LEGEND_WIDTH = 60
BAR_LABEL_WIDTH = 32
"""characters a line of a row's name takes in a legend, and under a bar"""


def plain_name(row: Row, width: int | None = None) -> str:
    """A row's name in a figure: the script, its flags and its processes (when more than one), which
    tell apart two rows of one script on one env; in lines of `width` characters at most, where given
    (a flag and its value stay whole), so that a case's long flags stay inside the figure."""
    flags = f" {' '.join(row.flags)}" if row.flags else ""
    name = row.label + flags + (f", {row.nproc} processes" if row.nproc > 1 else "")
    if width is None:
        return name
    return textwrap.fill(name, width, break_on_hyphens=False, break_long_words=False)


def spread(mean: float | None, std: float | None, digits: int = 1) -> str:
    """`mean ± std`, or the mean alone when there is no spread (one seed)."""
    return fmt(mean, digits) if std is None else f"{fmt(mean, digits)} ± {fmt(std, digits)}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def threshold_text(numbers: RowNumbers) -> str:
    if numbers.threshold is None:
        return "-"
    if numbers.judged_on == "eval":
        return f"- (judged on the eval return ≥ {numbers.threshold:g})"
    if numbers.judged_on == "reference":
        return (
            f"- (judged on the mean eval return ≥ {numbers.threshold:.4g}: see the reference table)"
        )
    if numbers.judged_on == "published":
        return f"- (judged on the mean training return ≥ {numbers.threshold:.6g}: see the published table)"
    reached = sum(steps is not None for steps in numbers.steps_to_threshold)
    budget = f"> {numbers.total_timesteps:,}" if numbers.total_timesteps else "beyond the budget"
    median = budget if numbers.median_beyond_budget else fmt(numbers.median_steps_to_threshold, 0)
    if numbers.median_seconds_to_threshold is not None:
        median += f" in {numbers.median_seconds_to_threshold:,.0f} s"
    return f"{median} ({reached} of {len(numbers.steps_to_threshold)} seeds reached ≥ {numbers.threshold:g})"


def results_table(rows: Sequence[RowNumbers]) -> list[str]:
    header = [
        "script",
        "env",
        "steps",
        "processes",
        "seeds",
        "last-100 training return (or as marked)",
        "IQM [95% CI]",
        "eval return (deterministic)",
        "median steps to threshold (and seconds of training)",
        "SPS",
        "wall-clock per run (min)",
        "peak RSS (MB)",
        "result",
    ]
    lines = []
    for numbers in rows:
        seeds = [
            *(str(seed) for seed in numbers.seeds),
            *(f"{seed} (failed)" for seed in numbers.failed_seeds),
        ]
        iqm_text = "-"
        if numbers.last_return_iqm is not None:
            iqm_text = f"{fmt(numbers.last_return_iqm)} [{fmt(numbers.last_return_iqm_low)}, "
            iqm_text += f"{fmt(numbers.last_return_iqm_high)}]"
        lines.append(
            [
                with_flags(numbers.label, numbers.flags),
                numbers.env_id,
                fmt(numbers.steps, 0),
                str(numbers.nproc),
                " ".join(seeds),
                spread(numbers.last_return_mean, numbers.last_return_std)
                + (f" (last {numbers.window})" if numbers.window != LAST_EPISODES else ""),
                iqm_text,
                spread(numbers.eval_return_mean, numbers.eval_return_std),
                threshold_text(numbers),
                spread(numbers.sps_mean, numbers.sps_std, 0),
                fmt(numbers.wall_minutes_mean),
                fmt(numbers.peak_rss_mb, 0),
                numbers.verdict,
            ]
        )
    return markdown_table(header, lines)


@dataclass
class AgainstPublished:
    """A case judged against a published result (`benchmark.cases.CleanRLPublished`): its figure
    and run time beside the case's training and evaluation returns, wall-clock, SPS and memory."""

    env_id: str
    script: str
    source: str
    """the published script, the id it ran and its tag"""
    published_mean: float
    published_std: float
    published_minutes: float | None
    seeds: list[int | None]
    last_return_mean: float | None
    last_return_std: float | None
    eval_return_mean: float | None
    eval_return_std: float | None
    wall_minutes_mean: float | None
    sps_mean: float | None
    peak_rss_mb: float | None
    standing: str
    """"above" its mean, "within its std", or how far short of its mean less its std"""
    verdict: str


def against_published(numbers: RowNumbers, published: CleanRLPublished) -> AgainstPublished:
    """The case's line of the table against `published`."""
    mean = numbers.last_return_mean
    if mean is None:
        standing = "n/a"
    elif mean >= published.mean:
        standing = "above its mean"
    elif mean >= published.bound:
        standing = "within its std"
    else:
        standing = f"short by {fmt(published.bound - mean)}"
    return AgainstPublished(
        env_id=numbers.env_id,
        script=numbers.label,
        source=published.source,
        published_mean=published.mean,
        published_std=published.std,
        published_minutes=published.minutes,
        seeds=numbers.seeds,
        last_return_mean=mean,
        last_return_std=numbers.last_return_std,
        eval_return_mean=numbers.eval_return_mean,
        eval_return_std=numbers.eval_return_std,
        wall_minutes_mean=numbers.wall_minutes_mean,
        sps_mean=numbers.sps_mean,
        peak_rss_mb=numbers.peak_rss_mb,
        standing=standing,
        verdict=numbers.verdict,
    )


def against_published_table(rows: Sequence[AgainstPublished]) -> list[str]:
    header = [
        "task", "script", "seeds", "published (mean ± std)", "last-100 training return", "eval return", "standing",
        "wall-clock per run (min): here / published", "SPS", "peak RSS (MB)", "result",
    ]  # fmt: skip
    lines = [
        [
            row.env_id,
            row.script,
            " ".join(map(str, row.seeds)),
            f"{spread(row.published_mean, row.published_std, 2)} ({row.source})",
            spread(row.last_return_mean, row.last_return_std),
            spread(row.eval_return_mean, row.eval_return_std),
            row.standing,
            f"{fmt(row.wall_minutes_mean)} / {fmt(row.published_minutes)}",
            fmt(row.sps_mean, 0),
            fmt(row.peak_rss_mb, 0),
            row.verdict,
        ]
        for row in rows
    ]
    return markdown_table(header, lines)


AGAINST_PUBLISHED = [
    "A case passes when the mean over seeds of its last-100 training return (every episode of every env, as CleanRL's "
    "`charts/episodic_return`) reaches the published mean less the published std. The published figures are CleanRL's "
    "Open RL Benchmark's for the tag named, on MuJoCo v4 (the cases run v5, the version gymnasium 1.x ships; "
    "dm_control's ids are the same) at the same budget; its run times come from CleanRL's runtime tables (none is "
    "published for DDPG). Wall-clock here: a run's time from its first event to its last record, its evaluation "
    "included and the time between its sessions left out; runs two at a time on 2 cores share the CPU, so the "
    "wall-clock and SPS of such a suite are not speed figures (docs/benchmark.md gives the ratio measured alone).",
]


def speed_table(rows: Sequence[SpeedNumbers]) -> list[str]:
    header = [
        "script",
        "env",
        "processes",
        "SPS",
        "raw env SPS",
        "script / raw env",
        "baseline",
        "baseline SPS",
        "script / baseline",
        "other script (same settings)",
        "its SPS",
        "script / other",
    ]
    lines = [
        [
            with_flags(numbers.label, numbers.flags),
            numbers.env_id,
            str(numbers.nproc),
            fmt(numbers.sps, 0),
            fmt(numbers.raw_env_sps, 0),
            fmt(numbers.script_over_raw_env, 2),
            numbers.baseline or "-",
            fmt(numbers.baseline_sps, 0),
            fmt(numbers.script_over_baseline, 2),
            numbers.reference or "-",
            fmt(numbers.reference_sps, 0),
            fmt(numbers.script_over_reference, 2),
        ]
        for numbers in rows
    ]
    return markdown_table(header, lines)


@dataclass
class AgainstReference:
    """A case judged against a reference (`judged_on` "reference"): the task's range, the script's
    and the reference's deterministic evaluations, the pass bound, and how soon each reaches a
    common speed threshold."""

    env_id: str
    total_timesteps: int
    random_return: float | None
    """the uniformly random policy's mean return (the bottom of the range)"""
    task_max: float
    reference: str
    """the reference: a REFERENCES label, or a published source"""
    reference_eval: float | None
    """its mean evaluation return over seeds (or the published one)"""
    reference_seeds: list[int | None]
    reference_made: list[str]
    """for stored reference runs: when and at which commit each was made"""
    script: str
    script_eval: float | None
    script_eval_std: float | None
    bound: float | None
    """the script's mean evaluation must reach this: the reference's less `REFERENCE_MARGIN` of the range"""
    script_score: float | None
    """the script's evaluation as a share of the way from the random return to the task's maximum"""
    reference_score: float | None
    speed_threshold: float | None
    """the random return plus `SPEED_THRESHOLD` of the way to the reference's evaluation (on the last-100 mean)"""
    script_steps: float | None
    """median over seeds of the steps to the speed threshold (None: the median seed never reached it)"""
    script_seconds: float | None
    reference_steps: float | None
    reference_seconds: float | None
    verdict: str


def share_of_range(value: float | None, low: float | None, high: float) -> float | None:
    return None if value is None or low is None or high == low else (value - low) / (high - low)


def median_to_reach(
    runs: Sequence[RunSummary], threshold: float | None, seconds: bool
) -> float | None:
    """The median over `runs` of the steps (or seconds of training) to `threshold`, a run that never
    reaches it counting as beyond; None when the median run never reaches it."""
    if threshold is None or not runs:
        return None
    reach = [
        run.seconds_to_reach(threshold) if seconds else run.steps_to_reach(threshold)
        for run in runs
    ]
    median = median_steps_to_threshold(reach)
    return None if median is None or math.isinf(median) else median


def against_reference_table(rows: Sequence[AgainstReference]) -> list[str]:
    header = [
        "task (steps)", "random", "max", "reference", "its eval (share of range)", "script eval (share)", "pass bound",
        "speed threshold", "steps to it: script / reference", "seconds to it: script / reference", "result",
    ]  # fmt: skip
    lines = []
    for row in rows:
        reference = row.reference + (
            f", seeds {' '.join(map(str, row.reference_seeds))}" if row.reference_seeds else ""
        )
        if row.reference_made:
            reference += f" (stored: {'; '.join(row.reference_made)})"
        lines.append(
            [
                f"{row.env_id} ({row.total_timesteps:,})",
                fmt(row.random_return, 3),
                f"{row.task_max:g}",
                reference,
                f"{fmt(row.reference_eval, 3)} ({fmt(row.reference_score, 2)})",
                f"{spread(row.script_eval, row.script_eval_std, 3)} ({fmt(row.script_score, 2)})",
                fmt(row.bound, 3),
                fmt(row.speed_threshold, 3),
                f"{fmt(row.script_steps, 0)} / {fmt(row.reference_steps, 0)}",
                f"{fmt(row.script_seconds, 0)} / {fmt(row.reference_seconds, 0)}",
                row.verdict,
            ]
        )
    return markdown_table(header, lines)


# Figures


def _curve(runs: Sequence[RunSummary], x_of: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The smoothed return of each run on a common x grid (up to where the shortest run ends), as
    (grid, curves)."""
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
    """matplotlib's pyplot, drawing to files only (imported here: reading runs does not need
    matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_learning_curves(rows: Sequence[Row], out: Path) -> list[Path]:
    """Per env, two figures with a line per row: the episodic return against env steps and against
    wall-clock time (training time only); the line is the mean across seeds, the band spans the
    lowest to the highest seed."""
    plt = _pyplot()
    written = []
    by_env: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        by_env[row.env_id].append(row)
    for env_id, env_rows in sorted(by_env.items()):
        for x_of, label, stem in (
            ("episode_steps", "environment steps", "return_vs_steps"),
            ("episode_seconds", "wall-clock time of training (s)", "return_vs_time"),
        ):
            figure, axes = plt.subplots(figsize=(7, 4.5), layout="constrained")
            for row in env_rows:
                curve = _curve(row.runs, x_of)
                if curve is None:
                    continue
                grid, curves = curve
                name = plain_name(row, LEGEND_WIDTH) + (
                    f" ({row.total_timesteps:,} steps)" if row.total_timesteps else ""
                )
                seeds = f"{len(curves)} seed{'s' if len(curves) > 1 else ''}"
                line = axes.plot(grid, curves.mean(0), label=f"{name}, {seeds}")[0]
                axes.fill_between(
                    grid, curves.min(0), curves.max(0), color=line.get_color(), alpha=0.2
                )
            axes.set(
                title=env_id,
                xlabel=label,
                ylabel=f"episodic return (mean of {SMOOTHING_EPISODES} episodes)",
            )
            axes.grid(alpha=0.3)
            if axes.has_data():
                axes.legend()
            path = out / f"{stem}_{safe_name(env_id)}.png"
            figure.savefig(path, dpi=100)
            plt.close(figure)
            written.append(path)
    return written


def plot_sps(bars: Sequence[tuple[str, list[float]]], path: Path) -> Path:
    """A bar per (label, SPS of each seed), top to bottom: the mean, with the lowest and highest seed
    as the error bar. Horizontal, so that a label of several lines (a case's flags) has room."""
    plt = _pyplot()
    lines = [label.count("\n") + 1 for label, _ in bars]
    # each bar as tall as its label's lines
    heights = [0.25 + 0.17 * count for count in lines]
    figure, axes = plt.subplots(figsize=(8, 1.2 + sum(heights)), layout="constrained")
    means = [float(np.mean(values)) if values else 0.0 for _, values in bars]
    low = [
        mean - min(values) if values else 0.0 for mean, (_, values) in zip(means, bars, strict=True)
    ]
    high = [
        max(values) - mean if values else 0.0 for mean, (_, values) in zip(means, bars, strict=True)
    ]
    centres = np.cumsum(heights) - np.asarray(heights) / 2
    ends = np.add(means, high)
    axes.barh(centres, means, height=np.asarray(heights) * 0.7, xerr=[low, high], capsize=4)
    for centre, mean, end in zip(centres, means, ends, strict=True):
        axes.annotate(
            f"{mean:,.0f}", (end, centre), va="center", xytext=(4, 0), textcoords="offset points"
        )
    axes.set_yticks(centres, [label for label, _ in bars])
    axes.set_ylim(sum(heights), 0)  # the first bar on top
    axes.set_xlim(0, max([*ends, 1.0]) * 1.15)  # room for the numbers
    axes.set(
        xlabel="environment steps per second",
        title="speed (bar: mean over seeds; whiskers: min to max)",
    )
    axes.grid(axis="x", alpha=0.3)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


@dataclass
class Aggregate:
    """The IQM of one label's runs over all cases with a positive threshold, each run's last-100
    return divided by its case's threshold (1 = the threshold), with the stratified bootstrap
    interval when every case has 5 seeds or more."""

    label: str
    cases: int
    runs: int
    iqm: float
    low: float | None
    high: float | None


def aggregates(rows: Sequence[Row]) -> list[Aggregate]:
    by_label: dict[str, list[list[float]]] = defaultdict(list)
    for row in rows:
        # a ratio to it would not
        if row.threshold is None or row.threshold <= 0 or row.judged_on != "training":
            continue  # order returns, and an eval threshold is not one on the training return
        scores = [
            run.last_return / row.threshold for run in row.runs if run.last_return is not None
        ]
        if scores:
            by_label[row.label].append(scores)
    result = []
    for label, tasks in sorted(by_label.items()):
        low = high = None
        if all(len(task) >= MIN_SEEDS_FOR_IQM for task in tasks):
            low, high = iqm_interval(tasks)
        runs = sum(len(task) for task in tasks)
        result.append(Aggregate(label, len(tasks), runs, iqm(np.concatenate(tasks)), low, high))
    return result


def plot_aggregate(values: Sequence[Aggregate], path: Path) -> Path:
    """One point per label: the IQM of the threshold-normalised returns, with its 95% interval where
    known."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7, 1.2 + 0.6 * len(values)), layout="constrained")
    for position, value in enumerate(values):
        error = None
        if value.low is not None and value.high is not None:
            error = [[value.iqm - value.low], [value.high - value.iqm]]
        axes.errorbar(value.iqm, position, xerr=error, fmt="o", capsize=4)
    axes.set_yticks(
        range(len(values)),
        [f"{value.label} ({value.runs} runs, {value.cases} cases)" for value in values],
    )
    axes.axvline(1.0, color="gray", linestyle="--", linewidth=1)
    axes.set(
        xlabel="IQM of last-100 return / case threshold (95% stratified bootstrap CI)",
        title="aggregate",
    )
    axes.grid(axis="x", alpha=0.3)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def draw(rows: list[Row], raw_bars: list[tuple[str, list[float]]], out: Path) -> list[Path]:
    bars = [
        (
            f"{plain_name(row, BAR_LABEL_WIDTH)}\n{row.env_id}",
            [run.sps for run in row.runs if run.sps is not None],
        )
        for row in rows
    ]
    figures = plot_learning_curves(rows, out)
    if bars or raw_bars:  # a benchmark stopped before any run finished has none to draw
        figures.append(plot_sps([*bars, *raw_bars], out / "sps.png"))
    values = aggregates(rows)
    if values:
        figures.append(plot_aggregate(values, out / "aggregate_iqm.png"))
    return figures


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = []
    for package in ("torch", "gymnasium", "numpy", "stable-baselines3"):
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            pass
    return (
        f"{cpu}, {os.cpu_count()} CPUs; Python {platform.python_version()}; {', '.join(versions)}"
    )


def git_revision(output: Path) -> str:
    """The commit the code runs at, "(uncommitted changes)" added if a tracked file that can run has
    changed: one outside `output`, docs/, tests/ and the Markdown files."""
    # A benchmark rewrites its own output folder (tracked where its results are committed, as under
    # docs/benchmark/), and a long one runs while its pages are written: no change to what ran.
    code = ["--", ".", ":(exclude)docs", ":(exclude)tests", ":(exclude,glob)**/*.md"]
    if output.is_relative_to(REPO):
        code.append(f":(exclude){output.relative_to(REPO)}")
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", *code],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
    except OSError:
        return "unknown"
    return (head.stdout.strip() or "unknown") + (
        " (uncommitted changes)" if dirty.stdout.strip() else ""
    )


def report(
    title: str, header_lines: list[str], tables: list[str], figures: list[Path], out: Path
) -> None:
    lines = [f"# {title}", "", *header_lines, "", *tables, "", "## Figures", ""]
    lines += [f"![{figure.stem}]({figure.name})" for figure in figures]
    (out / "results.md").write_text("\n".join(lines).rstrip() + "\n")


AGAINST_REFERENCE = [
    f"A case passes when its mean evaluation over seeds reaches the reference's less {REFERENCE_MARGIN:.0%} of the "
    "task's range (maximum less the random policy's return). Share of range: (eval - random) / (max - random). Speed "
    f"threshold: the random return plus {SPEED_THRESHOLD:.0%} of the way to the reference's evaluation, reached by "
    "the mean of the last 100 training episodes (or a case's own window); steps and seconds of training to it are "
    "medians over seeds (n/a: the median seed never reached it). Seconds of stored reference runs were measured in "
    "another session: compare SPS in one run.",
]


HOW_MEASURED = [
    "How the numbers are measured:",
    "- Everything is read from the runs' TensorBoard events with TensorBoard's own readers, keeping every record; "
    "a resumed run's records after its checkpoint are dropped, as TensorBoard drops them. The last-100 training "
    "return is the mean of the last 100 `charts/episodic_return` records (every episode of every env; a case can set "
    "another window, marked in the table); the eval return is the mean of `eval/episodic_return` (deterministic "
    "policy after training). ± is the sample standard deviation across seeds (ddof=1); one seed shows none.",
    "- IQM (5 seeds or more): the interquartile mean across seeds, `scipy.stats.trim_mean(x, 0.25)`, with a 95% "
    "percentile bootstrap interval (50,000 resamples, `scipy.stats.bootstrap`): rliable's definitions (Agarwal et "
    "al., NeurIPS 2021). The aggregate figure takes the IQM over the runs of every case with a positive threshold, "
    "each return divided by its case's threshold, resampling the runs of each case on their own (stratified).",
    "- Steps to threshold: per seed, the first step at which the mean of the last 100 episodes (or the case's window: "
    "a full one) "
    "reaches the case's threshold; the median over seeds, a seed that never reaches it counting as beyond the budget. "
    "Beside it, the median seconds of training to that step: from the run's first event (start-up included) to the "
    "episode's record, the gaps between a run's sessions left out.",
    "- SPS: per session of a run (a resumed run has two or more), steps between the first and the last `charts/SPS` "
    "record over the wall time between them, summed over sessions: start-up, the first iteration, the final "
    "evaluation and the time between a crash and its resume are left out. Peak RSS: the largest `system/rss_mb` "
    "record, the process's resident memory when it was logged (scripts and baselines alike).",
    "- Raw env: the script's own vector env stack, with the case's flags, under random actions and no agent: an "
    "upper bound on any agent's SPS. Baselines run with settings derived from the script's (benchmark/registry.py); "
    "a baseline two cases share runs once.",
]


@dataclass
class Plot:
    """Draw the learning curves and the SPS chart, and write the table, for run folders made by any
    script here."""

    run_dirs: Annotated[tuple[str, ...], tyro.conf.Positional]
    """run folders, or folders holding them (searched recursively for TensorBoard event files)"""
    out: str = "benchmark-plots"
    """output folder for results.md and the PNG files"""


def plot(args: Plot) -> int:
    run_dirs = find_run_dirs(args.run_dirs)
    if not run_dirs:
        print(f"error: no TensorBoard event files under {' '.join(args.run_dirs)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    groups: dict[tuple[str, str], list[RunSummary]] = defaultdict(list)
    for summary in map(summarise_run, run_dirs):
        groups[summary.script, summary.env_id].append(summary)
    rows = [
        Row(
            label,
            env_id,
            f"{label}__{safe_name(env_id)}",
            runs=sorted(runs, key=lambda run: (run.seed is None, run.seed or 0)),
        )
        for (label, env_id), runs in sorted(groups.items())
    ]
    figures = draw(rows, [], out)
    numbers = [row_numbers(row) for row in rows]
    header_lines = [f"- runs: {len(run_dirs)} run folders under {' '.join(args.run_dirs)}"]
    report(
        "Runs",
        header_lines,
        ["## Results", "", *results_table(numbers), "", *HOW_MEASURED],
        figures,
        out,
    )
    print(f"wrote {out / 'results.md'} and {len(figures)} figures", flush=True)
    return 0
