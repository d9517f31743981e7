"""What `--track` costs: ``python -m benchmark.tracking_cost [--script ppo_fc.py] [--rounds 3]
[--steps 100000] [--before DIR] [FLAGS OF THE SCRIPT]``.

Runs the script without and with `--track` (wandb offline), in alternation, `--rounds` times each,
and prints every run's SPS (its last `charts/SPS`, steps per second since training started) and the
median of each arm. With `--before DIR`, a checkout of another commit (for example `git worktree add
DIR c1eb9db`), its script without `--track` runs in the same alternation: the cost of the change
without tracking, measured in the same run."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmark.events import load_events
from benchmark.registry import REPO
from common.cli import exit_status


def run_sps(checkout: Path, script: str, flags: list[str], track: bool, run_dir: Path) -> float:
    """One run of `script` in `checkout`; its last `charts/SPS`."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    command = [
        sys.executable,
        script,
        *flags,
        "--run-dir",
        str(run_dir),
        "--no-progress",
        "--eval-episodes",
        "0",
    ]
    command += ["--no-save-model", *(["--track"] if track else [])]
    completed = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True)
    if completed.returncode:
        raise RuntimeError(f"{' '.join(command)} failed: {completed.stderr[-2000:]}")
    (run,) = run_dir.iterdir()
    scalars, _ = load_events(run)
    return float(scalars["charts/SPS"][-1].value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmark.tracking_cost", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--script", default="ppo_fc.py")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument(
        "--before", type=Path, help="a checkout of another commit, run without --track"
    )
    options, flags = parser.parse_known_args(argv)
    flags = ["--total-timesteps", str(options.steps), *flags]
    arms = {"without --track": (REPO, False), "with --track": (REPO, True)}
    if options.before is not None:
        arms = {f"{options.before} without --track": (options.before.resolve(), False), **arms}
    results: dict[str, list[float]] = {name: [] for name in arms}

    def measure() -> None:
        with tempfile.TemporaryDirectory() as folder:
            for round_index in range(options.rounds):
                for name, (checkout, track) in arms.items():
                    run_dir = (
                        Path(folder) / f"{round_index}-{len(results[name])}-{track}-{hash(name)}"
                    )
                    results[name].append(run_sps(checkout, options.script, flags, track, run_dir))
                    print(
                        f"round {round_index + 1}, {name}: {results[name][-1]:.0f} SPS", flush=True
                    )
        print(f"\n| {options.script} {' '.join(flags)} | SPS of each run | median |\n|---|---|---|")
        for name, values in results.items():
            print(f"| {name} | {', '.join(f'{v:.0f}' for v in values)} | {np.median(values):.0f} |")

    return exit_status(measure)


if __name__ == "__main__":
    sys.exit(main())
