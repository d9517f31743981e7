"""Reference runs kept between benchmarks (`python -m benchmark run --reuse-baselines DIR`).

The fixed-settings references of `benchmark.registry.REFERENCES` take hours on a CPU and do not
depend on the scripts, so each finished run is written to DIR as one JSON file named by its job id
(which holds the reference, env, steps, a hash of its settings and the seed): what the tables need
of the run (`RunSummary`: every training episode's step, time and return, the evaluation returns,
SPS), with when, where and how it was made. A later benchmark that asks for the same job reads it
back instead of running it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from benchmark.events import RunSummary
from common.errors import UsageError

FORMAT = 1


def stored_path(folder: str | Path, job_id: str) -> Path:
    return Path(folder) / f"{job_id}.json"


def store_run(folder: str | Path, job_id: str, summary: RunSummary, made: dict[str, Any]) -> Path:
    """Write `summary` and `made` (date, commit, machine, command, wall seconds) for `job_id`,
    atomically."""
    record = {
        "format": FORMAT,
        "job_id": job_id,
        "made": made,
        "run": {
            "run_dir": summary.run_dir,
            "script": summary.script,
            "env_id": summary.env_id,
            "seed": summary.seed,
            "steps": summary.steps,
            "episode_steps": summary.episode_steps.astype(int).tolist(),
            "episode_seconds": np.round(summary.episode_seconds, 2).tolist(),
            # as read (float32 values), so that a table of stored runs equals one of the runs
            "episode_returns": summary.episode_returns.tolist(),
            "eval_returns": [float(value) for value in summary.eval_returns],
            "sps": summary.sps,
            "peak_rss_mb": summary.peak_rss_mb,
            "sessions": summary.sessions,
            "wall_seconds": summary.wall_seconds,
        },
    }
    path = stored_path(folder, job_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    # then a rename: a reader never sees half a file
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(record, separators=(",", ":")))
    os.replace(temporary, path)
    return path


def load_run(folder: str | Path, job_id: str) -> tuple[RunSummary, dict[str, Any]] | None:
    """The stored run of `job_id` and how it was made, or None if `folder` has none (UsageError: a
    file there that is not one)."""
    path = stored_path(folder, job_id)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        run = record["run"] if record["format"] == FORMAT and record["job_id"] == job_id else None
    except (ValueError, KeyError, TypeError):
        run = None
    if run is None:
        raise UsageError(
            f"{path} is not a stored run of format {FORMAT} for {job_id}: delete it to run it again"
        )
    summary = RunSummary(
        run_dir=run["run_dir"],
        script=run["script"],
        env_id=run["env_id"],
        seed=run["seed"],
        steps=run["steps"],
        episode_steps=np.array(run["episode_steps"], dtype=np.int64),
        episode_seconds=np.array(run["episode_seconds"], dtype=np.float64),
        episode_returns=np.array(run["episode_returns"], dtype=np.float64),
        eval_returns=run["eval_returns"],
        sps=run["sps"],
        peak_rss_mb=run["peak_rss_mb"],
        sessions=run["sessions"],
        wall_seconds=run.get("wall_seconds"),  # runs stored before it was kept have none
    )
    return summary, record["made"]
