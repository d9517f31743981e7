"""The least time ddpg.py's updates can take per env transition, at the script's settings: ``python
-m benchmark.ddpg_floor [FLAGS OF ddpg.py]``.

With one update per transition, DDPG's speed is bound by the update's arithmetic. This times the
script's own networks (built as the script builds them) and Adam optimizers on a random batch, with
no env and no replay buffer: the critic's update (the targets' forward passes, the critic's forward
and backward, its step) every update, and the actor's (its forward and the critic's, backward, its
step, both targets' move) every `--policy-frequency` updates. Everything else a run does (env steps,
actions, sampling the buffer, logging) only adds to it, so a run cannot go faster after
`--learning-starts`. The two updates below are written as ddpg.py's `train()` writes them: an edit
of the update there must be made here too for the floor to stay its floor."""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from benchmark.recurrent_floor import floor_agent, median_seconds
from benchmark.registry import resolve_args
from common.cli import exit_status


def update_floor_seconds(flags: list[str], repeats: int = 200) -> tuple[float, float]:
    """Seconds of the critic's update and of the actor's (with the targets' move), each the median
    of `repeats`, for ddpg.py run with `flags`."""
    script, args, agent = floor_agent("ddpg", flags)
    # as ddpg.py's
    actor_optimizer = torch.optim.Adam(agent.actor.parameters(), lr=args.learning_rate, fused=True)
    q_optimizer = torch.optim.Adam(agent.qf1.parameters(), lr=args.learning_rate, fused=True)
    observation_size = agent.qf1.net[0].in_features - agent.actor.action_scale.numel()
    observations, next_observations = torch.randn(2, args.batch_size, observation_size)
    actions = torch.rand(args.batch_size, agent.actor.action_scale.numel()) * 2 - 1
    rewards, terminations = torch.randn(args.batch_size), torch.zeros(args.batch_size)

    def critic_update() -> None:
        with torch.no_grad():
            next_q = agent.qf1_target(next_observations, agent.actor_target(next_observations))
            next_q_value = rewards + (1 - terminations) * args.gamma * next_q
        loss = F.mse_loss(agent.qf1(observations, actions), next_q_value)
        q_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        q_optimizer.step()

    def actor_update() -> None:
        loss = -agent.qf1(observations, agent.actor(observations)).mean()
        actor_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        actor_optimizer.step()
        script.polyak_update(agent.actor_target, agent.actor, args.tau)
        script.polyak_update(agent.qf1_target, agent.qf1, args.tau)

    return median_seconds(critic_update, repeats), median_seconds(actor_update, repeats)


def main() -> int:
    def run() -> None:
        args = resolve_args("ddpg", sys.argv[1:])
        critic, actor = update_floor_seconds(sys.argv[1:])
        per_transition = args.updates_per_step * (critic + actor / args.policy_frequency)
        print(
            f"critic update {critic * 1e3:.2f} ms, actor update and targets {actor * 1e3:.2f} ms: "
            f"{per_transition * 1e3:.2f} ms per transition (at most {1 / per_transition:,.0f} SPS once learning starts)"
        )

    return exit_status(run)


if __name__ == "__main__":
    sys.exit(main())
