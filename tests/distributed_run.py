"""Run a script's `train()` under torchrun (or plain python) for tests/test_distributed.py, and write what each rank
ends with to `OUT/rank{r}.pt`: its parameters, episode returns, and the local and averaged values
of every `common.distributed.mean` call.

    python tests/distributed_run.py OUT SCRIPT '{"env_id": "Probe4-v0", ...}' [--same-data RANKS]

`--same-data RANKS` makes RANKS ranks (under torchrun) and one process with RANKS x num_envs envs (plain python) act
on the same data: the sampling noise is drawn for all envs at once and each rank takes its envs' columns, and each
rank's minibatch indices are drawn for all ranks, the one process taking their union as its minibatch (ppo_fc's
batch order: step-major, then env)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import cli, distributed


def same_data(module, ranks: int, num_envs: int, num_minibatches: int) -> None:
    """Patch `module.Agent.sampling_noise` and `torch.randperm` as the docstring says; `num_envs` is per rank."""
    original_noise, original_randperm = module.Agent.sampling_noise, torch.randperm
    draws = {"noise": 0, "perm": 0}

    def sampling_noise(self, batch_shape):
        steps, envs = batch_shape
        draws["noise"] += 1
        with torch.random.fork_rng():
            torch.manual_seed(1000 + draws["noise"])
            noise = original_noise(self, (steps, ranks * num_envs))
        if distributed.world_size() == 1:
            return noise
        rank = distributed.rank()
        return noise[:, rank * envs : (rank + 1) * envs].contiguous()

    def randperm(size, *, device=None):
        draws["perm"] += 1
        local = size if distributed.world_size() > 1 else size // ranks
        with torch.random.fork_rng():
            torch.manual_seed(2000 + draws["perm"])
            perms = [original_randperm(local) for _ in range(ranks)]
        if distributed.world_size() > 1:
            return perms[distributed.rank()].to(device)
        minibatch = local // num_minibatches
        step, env = torch.div(torch.stack(perms), num_envs, rounding_mode="floor"), torch.stack(perms) % num_envs
        global_index = step * ranks * num_envs + torch.arange(ranks)[:, None] * num_envs + env
        blocks = [global_index[:, k * minibatch : (k + 1) * minibatch].reshape(-1) for k in range(num_minibatches)]
        return torch.cat(blocks).to(device)

    module.Agent.sampling_noise = sampling_noise
    torch.randperm = randperm


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("script")
    parser.add_argument("settings")
    parser.add_argument("--same-data", type=int, default=0)
    options = parser.parse_args()
    module = importlib.import_module(options.script)
    args = module.Args(**json.loads(options.settings))
    if options.same_data:
        local_envs = args.num_envs if distributed.launched_size() > 1 else args.num_envs // options.same_data
        same_data(module, options.same_data, local_envs, args.num_minibatches)
    means = []
    original_mean = distributed.mean

    def recorded_mean(values):
        averaged = original_mean(values)
        means.append((values.tolist(), averaged.tolist()))
        return averaged

    distributed.mean = recorded_mean

    def run() -> None:
        result = module.train(args)
        Path(options.out).mkdir(parents=True, exist_ok=True)
        torch.save(
            {
                "state": result.agent.state_dict(),
                "returns": result.episode_returns,
                "global_step": result.global_step,
                "run_dir": str(result.run_dir),
                "means": means,
                "environ": {name: os.environ.get(name) for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE")},
            },
            Path(options.out) / f"rank{distributed.rank()}.pt",
        )

    return cli.exit_status(run)


if __name__ == "__main__":
    sys.exit(main())
