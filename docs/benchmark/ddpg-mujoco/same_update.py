"""A one-off check that ddpg.py's update and the harness's SB3 baseline (TD3 with one critic and no target policy
smoothing) are the same algorithm: from the same weights and the same 6 batches, ddpg.py's update lines (as written in
its train(), copied here) and SB3's TD3.train() end with the same parameters, up to float rounding.

    PYTHONPATH=. python docs/benchmark/ddpg-mujoco/same_update.py [ENV_ID]   # unit action bounds: HalfCheetah-v5
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from stable_baselines3.common.logger import configure
from stable_baselines3.common.type_aliases import ReplayBufferSamples

from benchmark.baselines import build_sb3_model, make_sb3_envs
from benchmark.registry import ddpg_sb3_settings, load_script, resolve_args

UPDATES = 6


def main() -> None:
    env_id = sys.argv[1] if len(sys.argv) > 1 else "HalfCheetah-v5"
    ddpg = load_script("ddpg")
    args = resolve_args("ddpg", ["--env-id", env_id])
    settings = ddpg_sb3_settings(args)
    model = build_sb3_model("td3", settings, make_sb3_envs(env_id, settings, 1), 1)
    model.set_logger(configure(None, []))
    torch.manual_seed(0)
    agent = ddpg.build_agent(args, None, torch.device("cpu"))
    pairs = {
        "actor": (agent.actor.net, model.actor.mu),
        "actor target": (agent.actor_target.net, model.actor_target.mu),
        "critic": (agent.qf1.net, model.critic.q_networks[0]),
        "critic target": (agent.qf1_target.net, model.critic_target.q_networks[0]),
    }
    with torch.no_grad():
        for ours, theirs in pairs.values():
            for mine, its in zip(ours.parameters(), theirs.parameters(), strict=True):
                its.copy_(mine)
    start = {name: [p.clone() for p in ours.parameters()] for name, (ours, _) in pairs.items()}
    actor_optimizer = torch.optim.Adam(agent.actor.parameters(), lr=args.learning_rate, fused=True)
    q_optimizer = torch.optim.Adam(agent.qf1.parameters(), lr=args.learning_rate, fused=True)
    action_size = agent.actor.action_scale.numel()
    observation_size = agent.qf1.net[0].in_features - action_size
    batches = []
    for _ in range(UPDATES):
        observations, next_observations = torch.randn(2, args.batch_size, observation_size)
        actions = (
            torch.rand(args.batch_size, action_size) * 2 - 1
        )  # unit bounds: SB3's scaled actions are the env's
        rewards, terminations = (
            torch.randn(args.batch_size),
            (torch.rand(args.batch_size) < 0.1).float(),
        )
        batches.append((observations, next_observations, actions, rewards, terminations))
    given = iter(batches)

    def sample(batch_size: int, env: object = None) -> ReplayBufferSamples:
        obs, next_obs, actions, rewards, terminations = next(given)
        return ReplayBufferSamples(obs, actions, next_obs, terminations[:, None], rewards[:, None])

    model.replay_buffer.sample = sample
    model._current_progress_remaining = 1.0
    model.train(gradient_steps=UPDATES, batch_size=args.batch_size)

    updates = 0
    for (
        observations,
        next_observations,
        b_actions,
        b_rewards,
        b_terminations,
    ) in batches:  # ddpg.py's lines
        with torch.no_grad():
            next_q = agent.qf1_target(next_observations, agent.actor_target(next_observations))
            next_q_value = b_rewards + (1 - b_terminations) * args.gamma * next_q
        qf1_values = agent.qf1(observations, b_actions)
        qf1_loss = F.mse_loss(qf1_values, next_q_value)
        q_optimizer.zero_grad(set_to_none=True)
        qf1_loss.backward()
        q_optimizer.step()
        updates += 1
        if updates % args.policy_frequency == 0:
            actor_loss = -agent.qf1(observations, agent.actor(observations)).mean()
            actor_optimizer.zero_grad(set_to_none=True)
            actor_loss.backward()
            actor_optimizer.step()
            ddpg.polyak_update(agent.actor_target, agent.actor, args.tau)
            ddpg.polyak_update(agent.qf1_target, agent.qf1, args.tau)

    for name, (ours, theirs) in pairs.items():
        moved = max(
            (p - p0).abs().max().item()
            for p, p0 in zip(ours.parameters(), start[name], strict=True)
        )
        apart = max(
            (p - q).abs().max().item()
            for p, q in zip(ours.parameters(), theirs.parameters(), strict=True)
        )
        print(f"{name}: moved by up to {moved:.2e}, ddpg.py and SB3 apart by up to {apart:.2e}")


if __name__ == "__main__":
    main()
