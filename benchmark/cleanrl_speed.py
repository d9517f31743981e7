"""ppo_fc.py's SPS against CleanRL's ppo_continuous_action.py, side by side in one run:
``python -m benchmark.cleanrl_speed --cleanrl-script PATH``.

CleanRL's script is not in this repository: PATH is a copy ported to gymnasium 1.x, which has the
MuJoCo v5 tasks (docs/benchmark.md, "The MuJoCo and dm_control suite", says how it was set up). Both
run with the settings of the mujoco suite (`benchmark.cases.PPO_CONTINUOUS_FLAGS`, CleanRL's own
defaults for its script), one torch thread each, one at a time, in the order A B B A per env (A:
ppo_fc.py), nothing else running. SPS is each run's steady rate, read from its TensorBoard events
the same way for both (`benchmark.ab_speed.steady_sps`: start-up and the first iteration left out).

    python -m benchmark.cleanrl_speed --cleanrl-script /work/cleanrl-v5/ppo_continuous_action.py \\
        --envs HalfCheetah-v5 Hopper-v5 --total-timesteps 102400

Prints a markdown table: per env and seed each side's SPS and the ratio, and per env the ratio of
the means."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmark.ab_speed import steady_sps
from benchmark.cases import PPO_CONTINUOUS_FLAGS
from benchmark.registry import REPO


def sps_of(side: str, cleanrl_script: Path, env_id: str, seed: int, steps: int) -> float:
    """The steady SPS of one run of `side` ("ppo_fc" or "cleanrl") on `env_id`."""
    with tempfile.TemporaryDirectory() as folder:
        common = ["--env-id", env_id, "--seed", str(seed), "--total-timesteps", str(steps)]
        if side == "ppo_fc":
            command = [sys.executable, str(REPO / "ppo_fc.py"), *common, *PPO_CONTINUOUS_FLAGS]
            command += ["--torch-threads", "1", "--no-progress", "--eval-episodes", "0"]
            command += ["--no-save-model", "--run-dir", folder]
            cwd = REPO
        else:  # CleanRL writes runs/ in its working folder; CPU, one thread as ppo_fc's
            command = [sys.executable, str(cleanrl_script), *common, "--no-cuda"]
            cwd = Path(folder)
        return steady_sps(command, cwd, Path(folder), f"{side} on {env_id}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cleanrl-script", type=Path, required=True)
    parser.add_argument("--envs", nargs="+", default=["HalfCheetah-v5", "Hopper-v5"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--total-timesteps", type=int, default=102_400)
    options = parser.parse_args()
    if not options.cleanrl_script.is_file():
        print(f"error: --cleanrl-script {options.cleanrl_script}: no such file", file=sys.stderr)
        return 2
    os.environ["OMP_NUM_THREADS"] = "1"
    print(f"ppo_fc.py: {REPO}; CleanRL: {options.cleanrl_script.resolve()}")
    print(f"started {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC\n")
    print("| env | seed | ppo_fc SPS | CleanRL SPS | ppo_fc / CleanRL |\n|---|---|---|---|---|")
    for env_id in options.envs:
        means: dict[str, list[float]] = {"ppo_fc": [], "cleanrl": []}
        for index, seed in enumerate(options.seeds):
            order = ("ppo_fc", "cleanrl") if index % 2 == 0 else ("cleanrl", "ppo_fc")
            sps = {
                side: sps_of(side, options.cleanrl_script, env_id, seed, options.total_timesteps)
                for side in order
            }
            for side, value in sps.items():
                means[side].append(value)
            ratio = sps["ppo_fc"] / sps["cleanrl"]
            print(
                f"| {env_id} | {seed} | {sps['ppo_fc']:,.0f} | {sps['cleanrl']:,.0f} | {ratio:.2f} |",
                flush=True,
            )
        ours, theirs = (sum(means[side]) / len(means[side]) for side in ("ppo_fc", "cleanrl"))
        print(
            f"| **{env_id}** | mean | {ours:,.0f} | {theirs:,.0f} | **{ours / theirs:.2f}** |",
            flush=True,
        )
    print(f"\nended {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC")
    return 0


if __name__ == "__main__":
    sys.exit(main())
