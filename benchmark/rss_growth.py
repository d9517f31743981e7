"""Resident memory as a run grows: ``python -m benchmark.rss_growth RUN_DIR...``.

For each run folder, the peak of its `system/rss_mb` records (the process's resident memory, logged
every iteration) up to step 100k and up to its last step, and what grew between them. A ddpg run's
replay buffer is allocated whole but becomes resident as it fills (NumPy's zeros are pages the
kernel maps on first write), so the growth it may show is the buffer's rows written between the two
steps: the table gives those bytes beside the growth (obs + next obs + action + reward + termination,
float32, read off the env's spaces). Growth beyond that is a leak to look for.

    python -m benchmark.rss_growth benchmark/results/mujoco/runs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

from benchmark.events import RSS_TAG, find_run_dirs, load_events, parse_run_name
from common.envs import resolve_env_id

EARLY_STEP = 100_000


def buffer_bytes_per_row(env_id: str) -> int:
    """Bytes of one ddpg.py replay-buffer row on `env_id` (its flattened spaces, float32)."""
    env = gym.make(resolve_env_id(env_id))
    observation = gym.spaces.flatdim(env.observation_space)
    action = int(np.prod(env.action_space.shape))
    env.close()
    return 4 * (2 * observation + action + 2)


def growth(run_dir: Path, env_id: str | None = None) -> dict[str, object] | None:
    """Peak RSS up to `EARLY_STEP` and up to the end, in MB, of one run folder (None without RSS
    records that reach past `EARLY_STEP`); for ddpg, the buffer's bytes written in between."""
    scalars, _ = load_events(run_dir)
    records = scalars.get(RSS_TAG, [])
    if not records or records[-1].step <= EARLY_STEP:
        return None
    named_env, script, seed = parse_run_name(run_dir.name)
    env_id = env_id or named_env
    early = max(event.value for event in records if event.step <= EARLY_STEP)
    end = max(event.value for event in records)
    row: dict[str, object] = {
        "run": run_dir.name, "script": script, "env": env_id, "seed": seed, "last_step": records[-1].step,
        "early_mb": early, "end_mb": end, "growth_mb": end - early, "buffer_growth_mb": None,
    }  # fmt: skip
    if script == "ddpg":
        rows = min(records[-1].step, 1_000_000) - EARLY_STEP  # the default --buffer-size
        row["buffer_growth_mb"] = rows * buffer_bytes_per_row(env_id) / 2**20
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", help="run folders, or folders holding them")
    parser.add_argument("--env-id", help="the env id, where the run folders' names do not give it")
    options = parser.parse_args()
    runs = find_run_dirs(options.run_dirs)
    if not runs:
        print(
            f"error: no TensorBoard event files under {' '.join(options.run_dirs)}", file=sys.stderr
        )
        return 2
    print(
        f"| run | RSS at {EARLY_STEP:,} (MB) | at its last step (MB) | growth (MB) | ddpg's buffer rows written (MB) |"
    )
    print("|---|---|---|---|---|")
    for run_dir in runs:
        row = growth(run_dir, options.env_id)
        if row is None:
            continue
        buffer = row["buffer_growth_mb"]
        print(
            f"| {row['run']} ({row['last_step']:,} steps) | {row['early_mb']:,.0f} | {row['end_mb']:,.0f} | "
            f"{row['growth_mb']:+,.0f} | {'-' if buffer is None else f'{buffer:,.0f}'} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
