"""The least time ppo_transformer.py's update can spend in its network, at the script's settings:
``python -m benchmark.transformer_floor [FLAGS OF ppo_transformer.py]``.

It times the script's own agent (built as the script builds it) forward and backward, with the
optimizer's step, over one minibatch of whole training sequences (each env's rollout after its
L(K-1)-step prefix, the dense window mask of a sequence without episode starts), and multiplies by
the minibatches of an iteration. Everything else an update does only adds to this, so an iteration
cannot take less; with the rollout's time it bounds the script's SPS from above. It also splits the
pass into its matrix products and its attention (torch's profiler), to say where the time goes."""

from __future__ import annotations

import sys

import torch
from torch.profiler import profile

from benchmark.recurrent_floor import floor_agent, median_seconds, random_observations
from benchmark.registry import script_make_env
from common.cli import exit_status
from common.envs import env_spaces, resolve_env_id


def update_floor(flags: list[str], repeats: int = 30) -> dict[str, float]:
    """Seconds per iteration of the update's passes through the agent (from the median of `repeats`
    minibatches), the steps an iteration collects, and the shares of matrix products and attention
    in them."""
    script, args, agent = floor_agent("ppo_transformer", flags)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    observation_space, _, _ = env_spaces(script_make_env(script, args)(resolve_env_id(args.env_id)))
    envs = args.num_envs // args.num_minibatches
    length = agent.receptive_field + args.num_steps
    obs = random_observations(observation_space, envs, length)
    positions = torch.arange(length).repeat(envs, 1)
    mask = script.window_mask(torch.zeros(envs, length, dtype=torch.long), args.context_len)

    def minibatch() -> None:
        actor_out, value, _ = agent(obs, positions, mask)
        optimizer.zero_grad(set_to_none=True)
        (actor_out.sum() + value.sum()).backward()
        optimizer.step()

    seconds = median_seconds(minibatch, repeats)
    with profile() as profiled:
        for _ in range(5):
            minibatch()
    events = profiled.key_averages()
    total = sum(event.self_cpu_time_total for event in events)

    def share(words):
        return sum(e.self_cpu_time_total for e in events if any(w in e.key for w in words)) / total

    return {
        "seconds": seconds * args.num_minibatches * args.update_epochs,
        "steps": args.num_envs * args.num_steps,
        "matmul_share": share(("aten::mm", "aten::addmm", "aten::bmm")),
        "attention_share": share(("scaled_dot_product",)),
    }


def main() -> int:
    def run() -> None:
        floor = update_floor(sys.argv[1:])
        print(
            f"the agent's passes of one update: {floor['seconds'] * 1e3:.1f} ms per iteration of {floor['steps']} "
            f"steps (at most {floor['steps'] / floor['seconds']:,.0f} SPS from them alone); matrix products "
            f"{floor['matmul_share']:.0%}, attention {floor['attention_share']:.0%} of the pass"
        )

    return exit_status(run)


if __name__ == "__main__":
    sys.exit(main())
