"""Classic-control tasks with the velocity entries of the observation set to zero.

Hiding velocities turns a fully observed task into a standard partially observed benchmark: the agent sees positions
and angles only, so it must infer velocities from the history. Memoryless agents plateau well below the full-state
scores; recurrent and transformer agents solve them. The observation space is unchanged (zero lies inside it).
"""

from __future__ import annotations

import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv, PendulumEnv


class _HideVelocity:
    """Zeroes ``velocity_indices`` of every observation that ``reset`` and ``step`` return."""

    velocity_indices: tuple[int, ...] = ()

    def _hide(self, observation: np.ndarray) -> np.ndarray:
        observation = np.array(observation, dtype=np.float32)
        observation[list(self.velocity_indices)] = 0.0
        return observation

    def reset(self, *, seed=None, options=None):
        observation, info = super().reset(seed=seed, options=options)
        return self._hide(observation), info

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        return self._hide(observation), reward, terminated, truncated, info


class CartPoleNoVelEnv(_HideVelocity, CartPoleEnv):
    """CartPole-v1 observing [cart position, 0, pole angle, 0]: cart velocity and pole angular velocity hidden."""

    velocity_indices = (1, 3)


class PendulumNoVelEnv(_HideVelocity, PendulumEnv):
    """Pendulum-v1 observing [cos(theta), sin(theta), 0]: the angular velocity hidden."""

    velocity_indices = (2,)
