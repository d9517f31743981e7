"""Two ways to lower ddpg.py's floor without changing the algorithm, each timed against the plain form in 6 alternating
blocks: `torch.compile` of the critic's and the actor's losses (200 updates a block: the critic every update, the actor
every second, as the floor), and the batching that putting the critic and its target side by side would give (2,000
pairs of 256 x 256 by 256 x 256 products a block, against one `torch.bmm` of both).

    PYTHONPATH=. python docs/benchmark/ddpg-speed/lower_floor.py THREADS
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from benchmark.registry import load_script, resolve_args

BLOCKS = 6


def main() -> None:
    torch.set_num_threads(int(sys.argv[1]))
    torch.manual_seed(1)
    script, args = load_script("ddpg"), resolve_args("ddpg", [])
    agent = script.build_agent(args, None, torch.device("cpu"))
    actor_optimizer = torch.optim.Adam(agent.actor.parameters(), lr=args.learning_rate, fused=True)
    q_optimizer = torch.optim.Adam(agent.qf1.parameters(), lr=args.learning_rate, fused=True)
    observations, next_observations = torch.randn(2, args.batch_size, 3)
    actions, rewards = torch.rand(args.batch_size, 1) * 4 - 2, torch.randn(args.batch_size)

    def critic_loss(
        observations: torch.Tensor, actions: torch.Tensor, next_observations: torch.Tensor
    ) -> torch.Tensor:
        with torch.no_grad():
            next_q = agent.qf1_target(next_observations, agent.actor_target(next_observations))
        return F.mse_loss(agent.qf1(observations, actions), rewards + args.gamma * next_q)

    def actor_loss(observations: torch.Tensor) -> torch.Tensor:
        return -agent.qf1(observations, agent.actor(observations)).mean()

    def updates_with(critic: Callable, actor: Callable) -> Callable[[int], None]:
        def update(step: int) -> None:
            q_optimizer.zero_grad(set_to_none=True)
            critic(observations, actions, next_observations).backward()
            q_optimizer.step()
            if step % args.policy_frequency == 0:
                actor_optimizer.zero_grad(set_to_none=True)
                actor(observations).backward()
                actor_optimizer.step()
                script.polyak_update(agent.actor_target, agent.actor, args.tau)
                script.polyak_update(agent.qf1_target, agent.qf1, args.tau)

        return update

    plain = updates_with(critic_loss, actor_loss)
    start = time.perf_counter()
    compiled = updates_with(torch.compile(critic_loss), torch.compile(actor_loss))
    for step in range(10):
        compiled(step)
    compile_seconds = time.perf_counter() - start
    inputs, weights = (
        torch.randn(2, args.batch_size, args.hidden_size),
        torch.randn(2, args.hidden_size, args.hidden_size),
    )

    def apart(_: int) -> None:
        inputs[0] @ weights[0]
        inputs[1] @ weights[1]

    def batched(_: int) -> None:
        torch.bmm(inputs, weights)

    ways = {
        "plain": (plain, 200),
        "compiled": (compiled, 200),
        "two products": (apart, 2000),
        "one bmm": (batched, 2000),
    }
    for way, _ in ways.values():
        for step in range(20):
            way(step)
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(BLOCKS):
        for name, (way, repeats) in ways.items():
            start = time.perf_counter()
            for step in range(repeats):
                way(step)
            seconds[name].append((time.perf_counter() - start) / repeats)
    print(f"{torch.get_num_threads()} threads; compiling took {compile_seconds:.1f} s")
    for name, times in seconds.items():
        print(
            f"{name}: {np.mean(times) * 1e3:.3f} ms a call, blocks {[round(t * 1e3, 3) for t in times]}"
        )
    for new, old in (("compiled", "plain"), ("one bmm", "two products")):
        print(
            f"{new} / {old}, block by block:",
            [round(a / b, 3) for a, b in zip(seconds[new], seconds[old], strict=True)],
        )


if __name__ == "__main__":
    main()
