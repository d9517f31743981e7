"""Run a script's `train()` under torchrun (or plain python) for tests/test_distributed.py, and write what each rank
ends with to `OUT/rank{r}.pt`: its parameters, episode returns, and the local and averaged values
of every `common.distributed.mean` call.

    python tests/distributed_run.py OUT SCRIPT '{"env_id": "Probe4-v0", ...}' [--same-data RANKS]

`--same-data RANKS` makes RANKS ranks (under torchrun) and one process with RANKS x num_envs envs (plain python) act
on the same data: the sampling noise is drawn for all envs at once and each rank takes its envs' part, and each rank's
minibatch indices are drawn for all ranks, the one process taking their union as its minibatch."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import cli, distributed


class NanOnRank1(gym.Env):
    """Rewards 1.0, and on rank 1 NaN from its 300th step on: a NaN in one rank's data only."""

    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)
    steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.steps += 1
        nan = distributed.rank() == 1 and self.steps >= 300
        return np.zeros(1, np.float32), float("nan") if nan else 1.0, True, False, {}


gym.register("NanOnRank1-v0", entry_point=NanOnRank1)


def same_data(module, ranks: int, num_envs: int, num_minibatches: int) -> None:
    """Patch the script's sampling and `torch.randperm` as the module's docstring says; `num_envs` is per rank."""
    original_randperm, draws = torch.randperm, {"noise": 0, "perm": 0}

    def rank_rows(draw_all, dim: int):
        """`draw_all()` (every rank's envs along `dim`, from a generator of its own) and this rank's part of it."""
        draws["noise"] += 1
        with torch.random.fork_rng():
            torch.manual_seed(1000 + draws["noise"])
            drawn = draw_all()
        if distributed.world_size() == 1:
            return drawn
        return drawn.narrow(dim, distributed.rank() * num_envs, num_envs).contiguous()

    # ppo_fc, ppo_lstm: the rollout's noise, (steps, envs, ...)
    if hasattr(module.Agent, "sampling_noise"):
        original_noise = module.Agent.sampling_noise
        module.Agent.sampling_noise = lambda self, shape: rank_rows(
            lambda: original_noise(self, (shape[0], ranks * num_envs)), dim=1
        )
    else:  # ppo_transformer draws each step's actions from a Categorical over its envs: the Gumbel-max trick
        module.Categorical.sample = lambda policy: (policy.logits + rank_rows(
            lambda: torch.empty(ranks * num_envs, policy.logits.shape[-1]).exponential_().log_().neg_(), dim=0
        )).argmax(-1)  # fmt: skip
    # ppo_fc's batch is step-major; the others' sequences are env-major
    env_major = module.__name__ != "ppo_fc"

    def randperm(size, *, device=None):
        draws["perm"] += 1
        local = size if distributed.world_size() > 1 else size // ranks
        with torch.random.fork_rng():
            torch.manual_seed(2000 + draws["perm"])
            perms = torch.stack([original_randperm(local) for _ in range(ranks)])
        if distributed.world_size() > 1:
            return perms[distributed.rank()].to(device)
        ranks_first = torch.arange(ranks)[:, None]
        if env_major:  # rank r's sequence (or env) i is the one process's r x local + i
            global_index = ranks_first * local + perms
        else:  # rank r's step t of env e is the one process's step t of env r x num_envs + e
            step, env = torch.div(perms, num_envs, rounding_mode="floor"), perms % num_envs
            global_index = step * ranks * num_envs + ranks_first * num_envs + env
        minibatch = local // num_minibatches
        blocks = [
            global_index[:, k * minibatch : (k + 1) * minibatch].reshape(-1)
            for k in range(num_minibatches)
        ]
        return torch.cat(blocks).to(device)

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
        local_envs = (
            args.num_envs if distributed.launched_size() > 1 else args.num_envs // options.same_data
        )
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
                "environ": {
                    name: os.environ.get(name) for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE")
                },
            },
            Path(options.out) / f"rank{distributed.rank()}.pt",
        )

    return cli.exit_status(run)


if __name__ == "__main__":
    sys.exit(main())
