"""The least time a recurrent script's update can spend in its cell, at the script's settings:
``python -m benchmark.recurrent_floor [FLAGS OF ppo_lstm.py]``.

It times the script's own agent (built as the script builds it) forward and backward over one
minibatch of whole training sequences with no episode start inside them, so nothing is padded, and
multiplies by the minibatches of an iteration. Episode starts only add to this (a piece per episode,
padded to the longest), and so does everything else an update does, so an iteration cannot take
less; with the env stack's time under random actions (the harness's raw-env row) it bounds the
script's SPS from above."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import torch

from benchmark.registry import load_script, resolve_args, script_agent
from common.cli import exit_status
from common.envs import (
    env_spaces,
    observation_map,
    observation_tensor,
    observation_zeros,
    resolve_env_id,
)
from common.run_start import usage_errors


def median_seconds(
    step: Callable[[], object],
    repeats: int,
    warmup: int = 5,
    synchronize: Callable[[], object] = lambda: None,
) -> float:
    """The median time of `repeats` calls of `step`, after `warmup` that set up oneDNN's (or
    cuDNN's) kernels, with `synchronize` (a GPU's) before and after each timed call."""
    times = []
    for _ in range(repeats + warmup):
        synchronize()
        start = time.perf_counter()
        step()
        synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times[warmup:])[repeats // 2]


def floor_agent(name: str, flags: list[str]) -> tuple[ModuleType, Any, torch.nn.Module]:
    """Script `name`, its `Args` for `flags` (checked as the script checks them) and its agent on
    the CPU, built as the script builds it, with the script's seed and torch threads set: what every
    floor times."""
    script, args = load_script(name), resolve_args(name, flags)
    usage_errors(script.check_args)(args)  # as the script's Run calls it
    torch.manual_seed(args.seed)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    # which sets the default threads
    return (script, args, script_agent(script, args))


def random_observations(space: Any, *leading: int) -> Any:
    """Random observations of `space` with the `leading` axes, as the agents take them: uint8 images
    of random pixels, normal float32 vectors (each part of an image and a vector)."""
    generator = np.random.default_rng(0)
    fill = lambda part: (  # noqa: E731
        generator.integers(0, 256, part.shape, dtype=np.uint8)
        if part.dtype == np.uint8
        else generator.standard_normal(part.shape, dtype=np.float32)
    )
    return observation_tensor(observation_map(fill, observation_zeros(space, *leading)))


def cell_floor_seconds(flags: list[str], repeats: int = 50) -> tuple[float, int]:
    """Seconds per iteration of the update's passes through the agent without padding (from the
    median of `repeats` minibatches), and the steps an iteration collects, for ppo_lstm.py run with
    `flags`."""
    script, args, agent = floor_agent("ppo_lstm", flags)
    sequence_len = args.bptt_len or args.num_steps
    sequences = args.num_envs * args.num_steps // sequence_len // args.num_minibatches
    observation_space, _, _ = env_spaces(script.make_env(resolve_env_id(args.env_id)))
    x = random_observations(observation_space, sequence_len, sequences)
    state = agent.initial_state(sequences)
    no_starts = torch.zeros(sequence_len, sequences, dtype=torch.bool)

    def minibatch() -> None:
        actor_out, value, _ = agent(x, state, no_starts)
        (actor_out.sum() + value.sum()).backward()

    seconds = median_seconds(minibatch, repeats)
    return seconds * args.num_minibatches * args.update_epochs, args.num_envs * args.num_steps


def main() -> int:
    def run() -> None:
        seconds, steps = cell_floor_seconds(sys.argv[1:])
        print(
            f"the agent's passes of one update without padding: {seconds * 1e3:.1f} ms per iteration of {steps} steps "
            f"(at most {steps / seconds:,.0f} SPS from them alone)"
        )

    return exit_status(run)


if __name__ == "__main__":
    sys.exit(main())
