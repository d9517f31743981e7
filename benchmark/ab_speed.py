"""SPS of two variants side by side, in one run: ``python -m benchmark.ab_speed``.

A variant is a checkout (``--a-checkout``, ``--b-checkout``: each run starts in that folder, so ``common/`` comes from
it too) and extra flags (``--a-flags``, ``--b-flags``). Per case and seed, the two run one at a time in the order
A B B A, A B B A, ... (seed 1: A then B; seed 2: B then A), so that neither side always runs first on a machine whose
speed drifts. SPS is the run's steady rate, read with TensorBoard's loader: the steps from its first ``charts/SPS``
record to its last over the wall time between them (``benchmark.events.steps_per_second``: start-up and the first
iteration are left out).

    # before and after a change: two checkouts
    python -m benchmark.ab_speed --a-checkout /tmp/before --b-checkout . --cases ppo_fc ppo_lstm
    # with and without the NumPy copy of the policy
    python -m benchmark.ab_speed --b-flags=--no-numpy-rollout --cases ppo_fc ppo_fc_acrobot

Prints a markdown table: per case and seed each side's SPS and B / A, and per case the mean of each side and the
ratio of the means."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmark.events import load_sessions, steps_per_second

COMMON = ["--torch-threads", "1", "--no-progress", "--eval-episodes", "0", "--no-save-model"]
CASES: dict[str, list[str]] = {
    "ppo_fc": ["ppo_fc.py", "--env-id", "CartPole-v1", "--total-timesteps", "100000"],
    "ppo_fc_acrobot": ["ppo_fc.py", "--env-id", "Acrobot-v1", "--total-timesteps", "100000"],
    # the README's continuous-control settings
    "ppo_fc_halfcheetah": [
        "ppo_fc.py", "--env-id", "HalfCheetah-v5", "--total-timesteps", "20480", "--num-envs", "1",
        "--num-steps", "2048", "--num-minibatches", "32", "--update-epochs", "10", "--learning-rate", "3e-4",
        "--ent-coef", "0", "--norm-obs", "--norm-reward",
    ],
    "ppo_lstm": ["ppo_lstm.py", "--env-id", "CartPole-v1", "--total-timesteps", "50000"],
    "ppo_lstm_novel": ["ppo_lstm.py", "--env-id", "CartPoleNoVel-v1", "--total-timesteps", "50000"],
    "ppo_transformer": ["ppo_transformer.py", "--env-id", "CartPole-v1", "--total-timesteps", "20000"],
    "ppo_transformer_novel": [
        "ppo_transformer.py", "--env-id", "CartPoleNoVel-v1", "--total-timesteps", "20000"
    ],
    "ddpg": ["ddpg.py", "--env-id", "Pendulum-v1", "--total-timesteps", "6000", "--learning-starts", "1000"],
}  # fmt: skip


def run_sps(checkout: Path, case: str, seed: int, flags: list[str]) -> float:
    """The steady SPS of one run of `case` from `checkout`."""
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, *CASES[case], "--seed", str(seed), *COMMON]
        return steady_sps([*command, "--run-dir", folder, *flags], checkout, Path(folder), case)


def steady_sps(command: list[str], cwd: Path, runs: Path, name: str) -> float:
    """Run `command` in `cwd`; the steady SPS of the one run folder it wrote under `runs` (searched
    below it: an env id with a `/` makes a folder deeper)."""
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"error: {name} failed in {cwd}: {done.stderr.strip()[-800:]}")
    (run_dir,) = {events.parent for events in runs.rglob("events.out.tfevents.*")}
    sps = steps_per_second(load_sessions(run_dir))
    if sps is None:
        raise SystemExit(f"error: {name} logged no SPS")
    return sps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a-checkout", type=Path, default=Path("."))
    parser.add_argument("--b-checkout", type=Path, default=Path("."))
    parser.add_argument("--a-flags", default="", help="extra flags of side A, as one string")
    parser.add_argument("--b-flags", default="", help="extra flags of side B, as one string")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4])
    options = parser.parse_args()
    sides = {
        "A": (options.a_checkout.resolve(), shlex.split(options.a_flags)),
        "B": (options.b_checkout.resolve(), shlex.split(options.b_flags)),
    }
    start = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    print(f"A: {sides['A'][0]} {options.a_flags}".rstrip())
    print(f"B: {sides['B'][0]} {options.b_flags}".rstrip())
    print(f"started {start} UTC\n")
    print("| case | seed | A SPS | B SPS | B / A |\n|---|---|---|---|---|")
    for case in options.cases:
        means = {"A": [], "B": []}
        for index, seed in enumerate(options.seeds):
            order = ("A", "B") if index % 2 == 0 else ("B", "A")
            sps = {side: run_sps(*sides[side][:1], case, seed, sides[side][1]) for side in order}
            for side in sps:
                means[side].append(sps[side])
            print(
                f"| {case} | {seed} | {sps['A']:,.0f} | {sps['B']:,.0f} | {sps['B'] / sps['A']:.3f} |",
                flush=True,
            )
        a, b = (sum(means[side]) / len(means[side]) for side in ("A", "B"))
        print(f"| **{case}** | mean | {a:,.0f} | {b:,.0f} | **{b / a:.3f}** |", flush=True)
    print(f"\nended {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC")
    return 0


if __name__ == "__main__":
    sys.exit(main())
