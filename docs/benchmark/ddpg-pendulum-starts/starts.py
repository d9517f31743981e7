"""How hard the start states of a Pendulum-v1 training run's last episodes are: what a trained deterministic actor
returns from the start states of episodes 91-100 of a 20k-step run of ddpg.py with each seed (one env, seeded as
ddpg.py seeds it: `reset(seed=SEED)`, then each episode's reset draws from the env's own generator), beside its mean
over 300 random start states.

    python docs/benchmark/ddpg-pendulum-starts/starts.py CHECKPOINT SEED [SEED ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import ddpg

EPISODES = 100
LAST = 10
RANDOM_STARTS = 300


def start_states(seed: int) -> list[np.ndarray]:
    """The (angle, velocity) each of the first EPISODES episodes of env 0 starts from."""
    env = gym.make("Pendulum-v1")
    env.reset(seed=seed)
    states = []
    for _ in range(EPISODES):
        states.append(np.array(env.unwrapped.state))
        env.reset()
    return states


def episode_return(actor: torch.nn.Module, state: np.ndarray) -> float:
    """The return of one episode of the deterministic actor from `state`."""
    env = gym.make("Pendulum-v1")
    env.reset(seed=0)
    env.unwrapped.state = np.array(state)
    observation = np.array([np.cos(state[0]), np.sin(state[0]), state[1]], dtype=np.float32)
    total, done = 0.0, False
    while not done:
        with torch.no_grad():
            action = actor(torch.as_tensor(observation)[None]).numpy()[0]
        observation, reward, terminated, truncated, _ = env.step(action)
        total, done = total + float(reward), terminated or truncated
    return total


def main() -> None:
    checkpoint = torch.load(sys.argv[1], weights_only=True)
    agent = ddpg.build_agent(ddpg.Args(), None, torch.device("cpu"))
    agent.load_state_dict(checkpoint["model"])
    print(f"{sys.argv[1]} (step {checkpoint['global_step']})")
    for seed in map(int, sys.argv[2:]):
        returns = [episode_return(agent.actor, state) for state in start_states(seed)]
        print(
            f"seed {seed}: the last {LAST} start states {np.mean(returns[-LAST:]):.1f}",
            [round(r) for r in returns[-LAST:]],
        )
    rng = np.random.default_rng(0)
    random_returns = [episode_return(agent.actor, rng.uniform([-np.pi, -1], [np.pi, 1])) for _ in range(RANDOM_STARTS)]
    spread = np.std(random_returns) / np.sqrt(LAST)
    print(
        f"{RANDOM_STARTS} random start states: mean {np.mean(random_returns):.1f}, "
        f"std of a {LAST}-episode mean {spread:.1f}"
    )


if __name__ == "__main__":
    main()
