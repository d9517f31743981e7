"""The statistics the benchmark reports across seeds.

- Mean and spread: the sample standard deviation (ddof=1); one seed has no spread.
- IQM: the interquartile mean, the mean of the middle 50% of runs (`scipy.stats.trim_mean(x, 0.25)`), with a 95%
  percentile bootstrap confidence interval over 50,000 resamples, stratified by task when several are aggregated:
  the definitions of rliable (Agarwal et al., "Deep Reinforcement Learning at the Edge of the Statistical Precipice",
  NeurIPS 2021; its `get_interval_estimates` defaults), computed with `scipy.stats.bootstrap`.
- Steps to threshold: the median over seeds, a seed that never reaches the threshold counting as beyond the budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

MIN_SEEDS_FOR_IQM = 5
"""fewer seeds than this give no IQM: a quarter trimmed from each end of fewer runs leaves too
little"""
BOOTSTRAP_RESAMPLES = 50_000
CONFIDENCE = 0.95


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    """The mean and the sample standard deviation (ddof=1) of `values`; no spread for one value,
    nothing for none."""
    if not values:
        return None, None
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else None


def iqm(values: Sequence[float] | np.ndarray) -> float:
    """The interquartile mean of `values` (all of them, flattened)."""
    return float(stats.trim_mean(np.ravel(values), 0.25))


def iqm_interval(tasks: Sequence[Sequence[float]], seed: int = 0) -> tuple[float, float]:
    """The 95% percentile bootstrap interval of the IQM of the runs of all `tasks` together (one
    sequence of run scores per task), resampling the runs of each task on their own (rliable's
    stratified bootstrap)."""

    def statistic(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        return stats.trim_mean(np.concatenate(samples, axis=axis), 0.25, axis=axis)

    samples = [np.asarray(task, dtype=np.float64) for task in tasks]
    if all(np.ptp(sample) == 0 for sample in samples):  # every resample gives the same IQM
        value = iqm(np.concatenate(samples))
        return value, value
    result = stats.bootstrap(
        samples,
        statistic,
        n_resamples=BOOTSTRAP_RESAMPLES,
        confidence_level=CONFIDENCE,
        method="percentile",
        vectorized=True,
        batch=5_000,
        rng=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def median_steps_to_threshold(steps: Sequence[int | None]) -> float | None:
    """The median of each seed's steps to the threshold, None (never reached) counting as infinitely
    many: the result is `math.inf` when the median seed never reached it, None when there are no
    seeds."""
    if not steps:
        return None
    return float(np.median([math.inf if value is None else value for value in steps]))
