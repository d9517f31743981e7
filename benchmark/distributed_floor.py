"""What data parallelism costs on this machine and the most it can give, for ppo_fc.py run with the same per-rank
settings: ``python -m benchmark.distributed_floor [--iterations 60] [--calls 1000] [FLAGS OF ppo_fc.py]``.

Under torchrun each rank runs what one process runs with the same settings, plus one all-reduce of the gradients per
minibatch step (`common.distributed.average_gradients`), which no data-parallel PPO avoids; the other collectives
(the advantages' statistics once per epoch, the Ctrl-C flag and the episodes once per iteration) are a few more. So
N ranks give at most

    SPS(N) = N x B / (T1 + K x c(N))

B: one rank's steps per iteration; T1: one process's iteration (rollout and update); K: minibatch steps per iteration
(update epochs x minibatches); c(N): one all-reduce of the gradient buffer among N processes. This measures c(2) (two
gloo processes alone on the machine), T1 (a run of the script in one process), and a run of the script on 2 ranks,
with where its time goes (`perf/rollout_seconds`, `perf/update_seconds`, `perf/collective_seconds`).
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmark.events import load_events
from benchmark.recurrent_floor import floor_agent
from benchmark.registry import REPO, launcher
from common.cli import exit_status


def time_all_reduces(
    rank: int, world_size: int, port: int, size: int, calls: int, results: mp.Queue
) -> None:
    """In each of `world_size` processes: `calls` all-reduces of `size` float32 after 50 that warm
    up; rank 0 puts the seconds of each in `results`."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    buffer = torch.zeros(size)
    for _ in range(50):
        dist.all_reduce(buffer)
    dist.barrier()
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        dist.all_reduce(buffer)
        seconds.append(time.perf_counter() - start)
    if rank == 0:
        results.put(seconds)
    dist.destroy_process_group()


def all_reduce_seconds(size: int, calls: int, world_size: int = 2) -> np.ndarray:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    results = context.Queue()
    workers = [
        context.Process(
            target=time_all_reduces, args=(rank, world_size, port, size, calls, results)
        )
        for rank in range(world_size)
    ]
    for worker in workers:
        worker.start()
    seconds = np.array(results.get(timeout=600))
    for worker in workers:
        worker.join()
    return seconds


def run_script(flags: list[str], nproc: int, total_timesteps: int, out: Path) -> dict[str, float]:
    """Run ppo_fc.py with `flags` in `nproc` processes; its mean seconds per iteration of each perf
    key (the first iteration left out: start-up) and its SPS."""
    base = [
        "ppo_fc.py",
        *flags,
        "--total-timesteps",
        str(total_timesteps),
        "--no-progress",
        "--eval-episodes",
        "0",
    ]
    base += ["--no-save-model", "--run-dir", str(out)]
    subprocess.run([*launcher(nproc), *base], cwd=REPO, check=True, capture_output=True)
    (run_dir,) = out.iterdir()
    scalars, _ = load_events(run_dir)
    numbers = {
        key.split("/")[1]: float(np.mean([event.value for event in scalars[key][1:]]))
        for key in ("perf/rollout_seconds", "perf/update_seconds", "perf/collective_seconds")
        if key in scalars
    }
    sps = scalars["charts/SPS"]
    numbers["sps"] = (sps[-1].step - sps[0].step) / (sps[-1].wall_time - sps[0].wall_time)
    return numbers


def main() -> int:
    def run() -> None:
        parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        parser.add_argument(
            "--iterations", type=int, default=60, help="iterations of each run of the script"
        )
        parser.add_argument("--calls", type=int, default=1000, help="all-reduces timed")
        options, flags = parser.parse_known_args()
        _, args, agent = floor_agent("ppo_fc", flags)
        size = sum(parameter.numel() for parameter in agent.parameters())
        steps, minibatch_steps = (
            args.num_envs * args.num_steps,
            args.update_epochs * args.num_minibatches,
        )
        seconds = all_reduce_seconds(size, options.calls)
        mean, median, p90 = seconds.mean(), np.median(seconds), np.percentile(seconds, 90)
        print(f"all-reduce of the {size:,} gradients between 2 processes ({options.calls} calls): mean {mean * 1e3:.2f}"
              f" ms, median {median * 1e3:.2f} ms, 90th percentile {p90 * 1e3:.2f} ms")  # fmt: skip
        with tempfile.TemporaryDirectory() as folder:
            one = run_script(flags, 1, options.iterations * steps, Path(folder) / "one")
            two = run_script(flags, 2, 2 * options.iterations * steps, Path(folder) / "two")
        single = one["rollout_seconds"] + one["update_seconds"]
        print(f"1 process: {one['sps']:,.0f} SPS; per iteration of {steps} steps: rollout "
              f"{one['rollout_seconds'] * 1e3:.1f} ms, update {one['update_seconds'] * 1e3:.1f} ms")  # fmt: skip
        print(f"2 processes, the same per-rank settings: {two['sps']:,.0f} SPS ({two['sps'] / one['sps']:.2f}x); per "
              f"iteration of {2 * steps} steps: rollout {two['rollout_seconds'] * 1e3:.1f} ms, update "
              f"{two['update_seconds'] * 1e3:.1f} ms, of which rank 0 waited in collectives "
              f"{two['collective_seconds'] * 1e3:.1f} ms")  # fmt: skip
        for name, cost in (("mean", mean), ("median", median)):
            bound = 2 * steps / (single + minibatch_steps * cost)
            print(f"floor with the {name} all-reduce: 2 x {steps} / ({single * 1e3:.1f} + {minibatch_steps} x "
                  f"{cost * 1e3:.2f}) ms = at most {bound:,.0f} SPS, {bound * single / steps:.2f}x the SPS of one "
                  "process's rollout and update")  # fmt: skip

    return exit_status(run)


if __name__ == "__main__":
    sys.exit(main())
