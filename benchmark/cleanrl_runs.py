"""CleanRL's own runs beside the suite's: ``python -m benchmark.cleanrl_runs store|compare``.

A CleanRL script run here (a port kept outside this repository: docs/benchmark.md, "The MuJoCo and
dm_control suite", says how it was set up) writes only TensorBoard events into a folder a new
machine loses. `store` keeps each run's summary as the harness keeps its own runs (one JSON file per
run, `benchmark.stored`), under the job id `cleanrl_{exp name}__{env}__{steps}__{seed}`:

    python -m benchmark.cleanrl_runs store /work/cleanrl-v5/runs/* --steps 1000000 \\
        --out docs/benchmark/mujoco/cleanrl

`compare` prints, for stored runs of either kind, the mean training return in windows of steps and
over each run's last 100 episodes (`charts/episodic_return`, read the same way for both):

    python -m benchmark.cleanrl_runs compare \\
        docs/benchmark/mujoco/stored/ddpg__HalfCheetah-v5__1000000__430db406__1.json \\
        docs/benchmark/mujoco/cleanrl/cleanrl_ddpg_continuous_action__HalfCheetah-v5__1000000__1.json
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from benchmark.events import LAST_EPISODES, RunSummary, find_run_dirs, summarise_run
from benchmark.report import machine
from benchmark.stored import load_run, store_run
from common.errors import UsageError

CLEANRL = "CleanRL fe8d8a0, its script ported to gymnasium 1.x (docs/benchmark.md)"
"""the `made` record's commit for a CleanRL run: its repository's, with the port named"""


def store_cleanrl_run(run_dir: Path, steps: int, out: Path) -> tuple[Path, RunSummary]:
    """Store the summary of one CleanRL run folder (`{env}__{exp name}__{seed}__{time}`) in `out`."""
    summary = summarise_run(run_dir)
    if summary.seed is None or not len(summary.episode_returns):
        raise UsageError(f"{run_dir} is not a CleanRL run folder with episode returns")
    job_id = (
        f"cleanrl_{summary.script}__{summary.env_id.replace('/', '-')}__{steps}__{summary.seed}"
    )
    # when its last event was written: the run's end
    ended = max(path.stat().st_mtime for path in run_dir.iterdir())
    made = {
        "date": datetime.fromtimestamp(ended, timezone.utc).isoformat(timespec="seconds"),
        "git": CLEANRL,
        "machine": machine(),
        "command": f"OMP_NUM_THREADS=1 python {summary.script}.py --env-id {summary.env_id} "
        f"--seed {summary.seed} --total-timesteps {steps} --no-cuda",
        "wall_seconds": summary.wall_seconds,
    }
    return store_run(out, job_id, summary, made), summary


def window_means(steps: np.ndarray, returns: np.ndarray, window: int, end: int) -> list[float]:
    """The mean return of the episodes that end in each window of `window` steps up to `end` (NaN
    where none does). A window holds its last step, not its first: the scripts count an episode's
    last step from 1 (ddpg.py: the steps taken) or from 0 (CleanRL: the step's index)."""
    means = []
    for start in range(0, end, window):
        inside = (steps > start) & (steps <= start + window)
        means.append(float(returns[inside].mean()) if inside.any() else float("nan"))
    return means


def comparison_table(paths: list[Path], window: int) -> str:
    """A markdown table: a column per stored run, a row per window of steps, then the last-100 mean."""
    runs = []
    for path in paths:
        stored = load_run(path.parent, path.stem)  # UsageError: a file there that is not one
        if stored is None:
            raise UsageError(f"{path} is not a stored run's file")
        summary, _ = stored
        runs.append(
            (
                f"{summary.script} seed {summary.seed}",
                summary.episode_steps,
                summary.episode_returns,
            )
        )
    last_step = max(int(steps.max()) for _, steps, _ in runs if len(steps))
    end = -(-last_step // window) * window
    columns = [window_means(steps, returns, window, end) for _, steps, returns in runs]
    lines = ["| steps | " + " | ".join(name for name, _, _ in runs) + " |"]
    lines.append("|---" * (len(runs) + 1) + "|")
    for row, start in enumerate(range(0, end, window)):
        cells = ("-" if np.isnan(column[row]) else f"{column[row]:,.0f}" for column in columns)
        lines.append(f"| {start:,}-{start + window:,} | " + " | ".join(cells) + " |")
    lasts = (f"{returns[-LAST_EPISODES:].mean():,.1f}" for _, _, returns in runs)
    lines.append(f"| last {LAST_EPISODES} episodes | " + " | ".join(lasts) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    store = commands.add_parser("store", help="store CleanRL run folders' summaries")
    store.add_argument("run_dirs", nargs="+", help="CleanRL run folders, or folders holding them")
    store.add_argument("--steps", type=int, required=True, help="the runs' --total-timesteps")
    store.add_argument("--out", required=True, help="the folder of stored runs")
    compare = commands.add_parser("compare", help="window means of stored runs, side by side")
    compare.add_argument("stored", nargs="+", help="stored runs' JSON files")
    compare.add_argument("--window", type=int, default=100_000, help="steps per row")
    args = parser.parse_args()
    try:
        if args.command == "store":
            run_dirs = find_run_dirs([Path(folder) for folder in args.run_dirs])
            if not run_dirs:
                raise UsageError(f"no TensorBoard run folder in {' '.join(args.run_dirs)}")
            for run_dir in run_dirs:
                path, summary = store_cleanrl_run(run_dir, args.steps, Path(args.out))
                last = summary.episode_returns[-LAST_EPISODES:].mean()
                print(f"{path}: {summary.steps:,} steps, last-{LAST_EPISODES} return {last:,.1f}")
        else:
            print(comparison_table([Path(path) for path in args.stored], args.window))
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
