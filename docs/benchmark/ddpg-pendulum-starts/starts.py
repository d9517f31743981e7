"""How hard the start states of a Pendulum-v1 training run's last episodes are: what a trained deterministic actor
returns from the start states of episodes 91-100 of a 20k-step run of ddpg.py with each seed (one env, seeded as
ddpg.py seeds it: `reset(seed=SEED)`, then each episode's reset draws from the env's own generator), and over 300
random start states. Beside it, near-optimal control from the same states: finite-horizon value iteration over a grid
of angles, speeds and torques on the env's own equations, played in the env, each step's torque the best against the
grid's values.

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


ANGLES, SPEEDS, TORQUES = 360, 241, np.linspace(-2.0, 2.0, 41)
"""the grid of the dynamic programme: angles over the circle, speeds over [-8, 8], torques"""


def pendulum_step(
    angle: np.ndarray, speed: np.ndarray, torque: np.ndarray
) -> tuple[np.ndarray, ...]:
    """PendulumEnv.step's maths (g 10, m 1, l 1, dt 0.05, speeds within 8): the reward and the next state."""
    reward = -((((angle + np.pi) % (2 * np.pi)) - np.pi) ** 2 + 0.1 * speed**2 + 0.001 * torque**2)
    speed = np.clip(speed + (15.0 * np.sin(angle) + 3.0 * torque) * 0.05, -8.0, 8.0)
    return reward, angle + speed * 0.05, speed


def interpolate(values: np.ndarray, angle: np.ndarray, speed: np.ndarray) -> np.ndarray:
    """Bilinear interpolation of grid `values` (ANGLES, SPEEDS), periodic in the angle."""
    a = (angle % (2 * np.pi)) / (2 * np.pi) * ANGLES
    v = (speed + 8.0) / 16.0 * (SPEEDS - 1)
    a0, v0 = np.floor(a).astype(int), np.clip(np.floor(v).astype(int), 0, SPEEDS - 2)
    fa, fv = a - a0, v - v0
    a0, a1 = a0 % ANGLES, (a0 + 1) % ANGLES
    return (
        values[a0, v0] * (1 - fa) * (1 - fv)
        + values[a1, v0] * fa * (1 - fv)
        + values[a0, v0 + 1] * (1 - fa) * fv
        + values[a1, v0 + 1] * fa * fv
    )


def optimal_values(steps: int = 200) -> list[np.ndarray]:
    """The best return from each grid state with t steps to go, for t = 0 .. steps (finite-horizon value iteration
    over the grid and TORQUES)."""
    angle, speed = np.meshgrid(
        np.arange(ANGLES) / ANGLES * 2 * np.pi, np.linspace(-8.0, 8.0, SPEEDS), indexing="ij"
    )
    angle, speed, torque = angle[..., None], speed[..., None], TORQUES
    reward, next_angle, next_speed = pendulum_step(angle, speed, torque)
    values = [np.zeros((ANGLES, SPEEDS))]
    for _ in range(steps):
        values.append((reward + interpolate(values[-1], next_angle, next_speed)).max(-1))
    return values


def planned_return(values: list[np.ndarray], state: np.ndarray) -> float:
    """The env's return from `state` with the torque that is best against the value grid at each step."""
    env = gym.make("Pendulum-v1")
    env.reset(seed=0)
    env.unwrapped.state = np.array(state)
    total, done, to_go = 0.0, False, len(values) - 1
    while not done:
        angle, speed = env.unwrapped.state
        reward, next_angle, next_speed = pendulum_step(angle, speed, TORQUES)
        torque = TORQUES[np.argmax(reward + interpolate(values[to_go - 1], next_angle, next_speed))]
        _, reward, terminated, truncated, _ = env.step(np.array([torque], dtype=np.float32))
        total, done, to_go = total + float(reward), terminated or truncated, to_go - 1
    return total


def main() -> None:
    checkpoint = torch.load(sys.argv[1], weights_only=True)
    agent = ddpg.build_agent(ddpg.Args(), None, torch.device("cpu"))
    agent.load_state_dict(checkpoint["model"])
    print(f"{sys.argv[1]} (step {checkpoint['global_step']})")
    values = optimal_values()
    for seed in map(int, sys.argv[2:]):
        states = start_states(seed)[-LAST:]
        returns = [episode_return(agent.actor, state) for state in states]
        best = [planned_return(values, state) for state in states]
        print(
            f"seed {seed}, the last {LAST} start states: the actor {np.mean(returns):.1f}",
            [round(r) for r in returns],
        )
        print(f"  planned on the value grid {np.mean(best):.1f}", [round(r) for r in best])
    rng = np.random.default_rng(0)
    starts = rng.uniform([-np.pi, -1], [np.pi, 1], (RANDOM_STARTS, 2))
    random_returns = [episode_return(agent.actor, state) for state in starts]
    planned = [planned_return(values, state) for state in starts]
    spread = np.std(random_returns) / np.sqrt(LAST)
    print(
        f"{RANDOM_STARTS} random start states: the actor {np.mean(random_returns):.1f} (a mean of {LAST} spreads by"
    )
    print(
        f"  {spread:.1f} from the start states alone), planned on the value grid {np.mean(planned):.1f}"
    )


if __name__ == "__main__":
    main()
