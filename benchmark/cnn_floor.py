"""The least time ppo_fc.py's update can take with a CNN, against what it takes, in one run:
``python -m benchmark.cnn_floor [FLAGS OF ppo_fc.py]`` (default: BreakoutNoFrameskip-v4 with CleanRL's Atari settings).

The floor is the network's arithmetic alone: the script's own agent (built as the script builds it, with its default
threads) forward and backward over one minibatch of random uint8 frames, with the loss's outputs and Adam's step,
times the minibatches of an iteration. The script then trains with the flags, and its `perf/update_seconds` (the
median over its iterations after the first) is set against the floor. Run it alone on the machine."""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile

import torch

from benchmark.events import find_run_dirs, load_events
from benchmark.recurrent_floor import floor_agent, median_seconds
from benchmark.registry import REPO
from common.cli import exit_status
from common.envs import env_spaces, resolve_env_id

ATARI = ["--env-id", "BreakoutNoFrameskip-v4", "--num-envs", "8", "--clip-coef", "0.1", "--total-timesteps", "6144"]


def update_floor_seconds(flags: list[str], repeats: int = 20) -> tuple[float, int]:
    """Seconds of an iteration's update that the network's arithmetic takes, and the threads it ran on."""
    script, args, agent = floor_agent("ppo_fc", flags)
    observation_space, _, _ = env_spaces(script.make_env(resolve_env_id(args.env_id)))
    minibatch_size = args.num_envs * args.num_steps // args.num_minibatches
    frames = torch.randint(0, 256, (minibatch_size, *observation_space.shape), dtype=torch.uint8)
    actions = torch.randint(0, agent.action_size, (minibatch_size,))
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)

    def minibatch() -> None:
        _, logprob, entropy, value = agent.get_action_and_value(frames, actions)
        loss = -logprob.mean() - args.ent_coef * entropy.mean() + args.vf_coef * value.square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    seconds = median_seconds(minibatch, repeats) * args.update_epochs * args.num_minibatches
    return seconds, torch.get_num_threads()


def script_update_seconds(flags: list[str]) -> float:
    """The median `perf/update_seconds` of a ppo_fc.py run with `flags`, its first iteration left out."""
    with tempfile.TemporaryDirectory() as run_dir:
        quiet = ["--no-progress", "--eval-episodes", "0", "--no-save-model", "--run-dir", run_dir]
        subprocess.run([sys.executable, "ppo_fc.py", *flags, *quiet], cwd=REPO, check=True, capture_output=True)
        (run,) = find_run_dirs([run_dir])
        scalars, _ = load_events(run)
        return statistics.median(event.value for event in scalars["perf/update_seconds"][1:])


def main() -> None:
    flags = sys.argv[1:] or ATARI
    floor, threads = update_floor_seconds(flags)
    update = script_update_seconds(flags)
    print(f"floor {floor:.2f} s per iteration ({threads} threads); the script's update {update:.2f} s: "
          f"{floor / update:.2f} of the floor's speed")  # fmt: skip


if __name__ == "__main__":
    sys.exit(exit_status(main))
