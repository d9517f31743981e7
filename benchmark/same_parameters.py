"""Fingerprints of the parameters each script trains at a fixed seed and thread count: a change that only moves code
around (a readability pass, a refactor) must leave them bit-identical.

    python -m benchmark.same_parameters --out before.json      # on the old commit
    python -m benchmark.same_parameters --compare before.json  # on the new one: exit status 1 if any differs

Each run is the script as a subprocess, in a temporary run folder, with one torch thread; its fingerprint is the
SHA-256 of the final checkpoint's model tensors, in order, by value (not by name: a renamed module keeps its
fingerprint), and of the optimizers' state tensors.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmark.registry import REPO

FIXED = [
    "--seed",
    "1",
    "--torch-threads",
    "1",
    "--no-progress",
    "--eval-episodes",
    "0",
    "--save-model",
]
RUNS: dict[str, list[str]] = {
    "ppo_fc": ["ppo_fc.py", "--env-id", "CartPole-v1", "--total-timesteps", "4096"],
    "ppo_lstm": ["ppo_lstm.py", "--env-id", "CartPole-v1", "--total-timesteps", "4096"],
    "ppo_transformer": [
        "ppo_transformer.py",
        "--env-id",
        "CartPole-v1",
        "--total-timesteps",
        "4096",
    ],
    "ddpg": [
        "ddpg.py",
        "--env-id",
        "Pendulum-v1",
        "--total-timesteps",
        "4096",
        "--learning-starts",
        "1000",
    ],
    "ppo_fc_atari": [
        "ppo_fc.py",
        "--env-id",
        "BreakoutNoFrameskip-v4",
        "--total-timesteps",
        "1024",
    ],
}


def fingerprint(checkpoint_path: Path) -> str:
    checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
    digest = hashlib.sha256()
    tensors = list(checkpoint["model"].values())
    optimizers = [value for key, value in sorted(checkpoint.items()) if key.endswith("optimizer")]
    for state in (state for optimizer in optimizers for state in optimizer["state"].values()):
        tensors += [value for _, value in sorted(state.items()) if isinstance(value, torch.Tensor)]
    for tensor in tensors:
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def run(name: str) -> str:
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, *RUNS[name], *FIXED, "--run-dir", folder]
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"error: {name} failed: {done.stderr.strip()[-500:]}")
        (checkpoint,) = Path(folder).glob("*/checkpoints/latest.pt")
        return fingerprint(checkpoint)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS))
    parser.add_argument("--out", type=Path, help="write the fingerprints to this JSON file")
    parser.add_argument(
        "--compare", type=Path, help="compare with the fingerprints of this JSON file"
    )
    options = parser.parse_args()
    fingerprints = {name: run(name) for name in options.runs}
    for name, value in fingerprints.items():
        print(f"{name:16} {value}")
    if options.out:
        options.out.write_text(json.dumps(fingerprints, indent=1) + "\n")
    if options.compare:
        expected = json.loads(options.compare.read_text())
        differ = [name for name, value in fingerprints.items() if expected.get(name) != value]
        print("identical" if not differ else f"differ: {' '.join(differ)}")
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
