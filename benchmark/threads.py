"""Each script's SPS at 1 and at 2 torch threads, by network: ``python -m benchmark.threads
[--repeats N]``.

Every case runs as the user runs it, a subprocess of the script with `--torch-threads 1` and
`--torch-threads 2` alternating (ABAB...), alone on the machine; the SPS is read from the run's
events (the first iteration, with its start-up, left out). The default of --torch-threads is chosen
from these ratios (docs/benchmark.md)."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile

from benchmark.events import find_run_dirs, load_sessions, steps_per_second
from benchmark.registry import REPO

QUIET = ("--no-progress", "--eval-episodes", "0", "--no-save-model")
CASES = {
    "ppo_fc MLP, CartPole-v1": ("ppo_fc.py", "--env-id", "CartPole-v1", "--total-timesteps", "30720"),
    "ppo_lstm LSTM, CartPole-v1": ("ppo_lstm.py", "--env-id", "CartPole-v1", "--total-timesteps", "30720"),
    "ppo_transformer, CartPole-v1": ("ppo_transformer.py", "--env-id", "CartPole-v1", "--total-timesteps", "8192"),
    "ddpg 256x256, Pendulum-v1": (
        "ddpg.py", "--env-id", "Pendulum-v1", "--total-timesteps", "6000", "--learning-starts", "1000",
    ),
    "ppo_fc CNN, Breakout, 8 envs": (
        "ppo_fc.py", "--env-id", "BreakoutNoFrameskip-v4", "--num-envs", "8", "--total-timesteps", "4096",
    ),
    "ppo_lstm CNN, Breakout, 8 envs": (
        "ppo_lstm.py", "--env-id", "BreakoutNoFrameskip-v4", "--total-timesteps", "4096", "--num-minibatches", "4",
        "--update-epochs", "4", "--no-norm-reward",
    ),
}  # fmt: skip


def run_sps(command: tuple[str, ...], threads: int) -> float:
    """The SPS of one run of `command` (a script and its flags) at `threads` torch threads."""
    with tempfile.TemporaryDirectory() as run_dir:
        flags = (*command[1:], *QUIET, "--torch-threads", str(threads), "--run-dir", run_dir)
        subprocess.run(
            [sys.executable, command[0], *flags], cwd=REPO, check=True, capture_output=True
        )
        (run,) = find_run_dirs([run_dir])
        return steps_per_second(load_sessions(run))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    options = parser.parse_args()
    print("| case | SPS, 1 thread | SPS, 2 threads | 2 threads / 1 |\n|---|---|---|---|")
    for name in options.cases:
        sps = {1: [], 2: []}
        for _ in range(options.repeats):
            for threads in (1, 2):
                sps[threads].append(run_sps(CASES[name], threads))
        one, two = statistics.median(sps[1]), statistics.median(sps[2])
        shown = lambda values: " ".join(f"{value:,.0f}" for value in values)  # noqa: E731
        print(f"| {name} | {shown(sps[1])} | {shown(sps[2])} | {two / one:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
