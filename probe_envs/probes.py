"""Andy Jones' probe environments, plus a memory probe and continuous-action versions.

Each probe isolates one way an agent can be broken: value learning, observation-dependent values, reward
discounting, advantage and policy learning, and memory (Probe7; RepeatCue, how far back). Every docstring states the
optimal policy and the true values for any discount ``gamma``; ``optimal_value(gamma)`` and ``optimal_action()`` give
them for the env's current state (the state the last observation came from), so tests can check an agent for any
gamma.

Observations are float32 ``Box`` arrays. Episodes end by termination, never truncation, so a correct agent never
bootstraps from their last state. Randomness comes only from ``self.np_random``, seeded by ``reset(seed=...)``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class ProbeEnv(gym.Env):
    """Shared episode mechanics: a fixed horizon, a per-step observation and a per-step reward.

    Subclasses set ``horizon``, ``observation_bounds``, ``num_actions`` (or ``continuous`` for a Box(-1, 1, (1,))
    action) and define ``_observation()`` (reading ``self.t``, the step index, and ``self.cue``, a random 0 or 1
    drawn at reset) and ``_reward(action)``. The observation that comes with the termination repeats the last one: it
    is never acted on and stays inside the observation space.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    horizon: int = 1
    # A constant observation [0] still gets a non-empty Box: gymnasium warns on every make when low == high.
    observation_bounds: tuple[list[float], list[float]] = ([-1.0], [1.0])
    num_actions: int = 1
    continuous: bool = False

    def __init__(self, render_mode: str | None = None):
        self.render_mode = render_mode
        # Spaces are per instance: a space carries its own RNG for sample().
        self.observation_space = _box(*self.observation_bounds)
        self.action_space = (
            _box([-1.0], [1.0]) if self.continuous else spaces.Discrete(self.num_actions)
        )
        self.t = 0
        self.cue = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.t = 0
        self.cue = int(self.np_random.integers(2))
        return self._observation(), {}

    def step(self, action):
        reward = float(self._reward(action))
        terminated = self.t == self.horizon - 1
        if not terminated:
            self.t += 1
        return self._observation(), reward, terminated, False, {}

    def optimal_action(self) -> int | np.ndarray:
        """The optimal action in the current state (any action is optimal where it does not matter)."""
        return np.zeros(1, dtype=np.float32) if self.continuous else 0

    def optimal_value(self, gamma: float) -> float:
        """The discounted return from the current state under the optimal policy: the closed form of the docstring."""
        raise NotImplementedError

    def _observation(self) -> np.ndarray:
        raise NotImplementedError

    def _reward(self, action) -> float:
        raise NotImplementedError


def _box(low, high) -> spaces.Box:
    return spaces.Box(
        np.array(low, dtype=np.float32), np.array(high, dtype=np.float32), dtype=np.float32
    )


def _scalar_action(action) -> float:
    """The continuous action as a float, clipped to the action space [-1, 1]."""
    return float(np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[0], -1.0, 1.0))


class Probe1(ProbeEnv):
    """One action, observation [0], one step, reward +1.

    Breaks: the value network or its loss. True value: V([0]) = 1.
    """

    def _observation(self):
        return np.zeros(1, dtype=np.float32)

    def _reward(self, action):
        return 1.0

    def optimal_value(self, gamma):
        return 1.0


class Probe2(ProbeEnv):
    """One action, observation [-1] or [+1] at random, one step, reward equal to the observation.

    Breaks: backpropagation through the value network. True values: V([-1]) = -1, V([+1]) = +1.
    """

    observation_bounds = ([-1.0], [1.0])

    def _observation(self):
        return np.array([2 * self.cue - 1], dtype=np.float32)

    def _reward(self, action):
        return 2 * self.cue - 1

    def optimal_value(self, gamma):
        return float(2 * self.cue - 1)


class Probe3(ProbeEnv):
    """One action, observation [0] then [1], two steps, reward +1 at the end only.

    Breaks: reward discounting and bootstrapping. True values: V([0]) = gamma, V([1]) = 1.
    """

    horizon = 2
    observation_bounds = ([0.0], [1.0])

    def _observation(self):
        return np.array([self.t], dtype=np.float32)

    def _reward(self, action):
        return float(self.t == self.horizon - 1)

    def optimal_value(self, gamma):
        return gamma if self.t == 0 else 1.0


class Probe4(ProbeEnv):
    """Two actions, observation [0], one step, reward +1 for action 1 and -1 for action 0.

    Breaks: the policy gradient and advantages. Optimal policy: always action 1; V*([0]) = 1.
    Under a policy taking action 1 with probability p, V([0]) = 2p - 1.
    """

    num_actions = 2

    def _observation(self):
        return np.zeros(1, dtype=np.float32)

    def _reward(self, action):
        return 1.0 if int(action) == 1 else -1.0

    def optimal_action(self):
        return 1

    def optimal_value(self, gamma):
        return 1.0


class Probe5(ProbeEnv):
    """Two actions, observation [0] or [1] at random, one step, reward +1 if the action equals the observation, else -1.

    Breaks: the policy's dependence on the observation. Optimal policy: action = observation; V*([0]) = V*([1]) = 1.
    """

    observation_bounds = ([0.0], [1.0])
    num_actions = 2

    def _observation(self):
        return np.array([self.cue], dtype=np.float32)

    def _reward(self, action):
        return 1.0 if int(action) == self.cue else -1.0

    def optimal_action(self):
        return self.cue

    def optimal_value(self, gamma):
        return 1.0


class Probe6(ProbeEnv):
    """Two actions, ten steps; the observation is [t, t mod 2] for t = 0..9; reward +1 if the action equals t mod 2.

    Breaks: following the observation step by step over a longer horizon. Optimal policy: action = t mod 2.
    True values under the optimal policy: V([t, t mod 2]) = sum of gamma^k for k = 0..9-t, so V(0) = (1 - gamma^10) /
    (1 - gamma).
    """

    horizon = 10
    observation_bounds = ([0.0, 0.0], [9.0, 1.0])
    num_actions = 2

    def _observation(self):
        return np.array([self.t, self.t % 2], dtype=np.float32)

    def _reward(self, action):
        return 1.0 if int(action) == self.t % 2 else 0.0

    def optimal_action(self):
        return self.t % 2

    def optimal_value(self, gamma):
        remaining = self.horizon - self.t
        return float(remaining) if gamma == 1 else (1 - gamma**remaining) / (1 - gamma)


class Probe7(ProbeEnv):
    """The memory probe: two actions, four steps; a cue 0 or 1 at random is shown first, then [0] three times.

    Reward 0 except at the last step (t = 3): +1 if the action equals the cue, else 0.
    Breaks: memory. Optimal policy: at t = 3 take the action equal to the cue seen at t = 0; the first three actions
    do not matter. True values with memory: V(t) = gamma^(3 - t). A memoryless agent cannot tell the cue at t = 3, so
    its expected return is at most 0.5 and its values at most 0.5 * gamma^(3 - t).
    """

    horizon = 4
    observation_bounds = ([0.0], [1.0])
    num_actions = 2

    def _observation(self):
        return np.array([self.cue if self.t == 0 else 0], dtype=np.float32)

    def _reward(self, action):
        return float(self.t == self.horizon - 1 and int(action) == self.cue)

    def optimal_action(self):
        return self.cue

    def optimal_value(self, gamma):
        return gamma ** (self.horizon - 1 - self.t)


class RepeatCue(ProbeEnv):
    """The memory-length probe: two actions, 128 steps; a cue [-1] or [+1] at random is shown at the first step, then
    [0] to the end. Every step pays +1/128 if the action equals the cue (0 for [-1], 1 for [+1]), else -1/128.

    Breaks: memory that reaches back far enough. The last step needs the cue from 127 steps before. An agent whose
    memory reaches m < 127 steps back can be right at steps 0..m and at chance after, an expected return of
    (m + 1) / 128; a memoryless one gets 1/128. Optimal policy: action = cue at every step, return 1; true values
    V(t) = (sum of gamma^k for k = 0..127-t) / 128.
    """

    horizon = 128
    observation_bounds = ([-1.0], [1.0])
    num_actions = 2

    def _observation(self):
        return np.array([2 * self.cue - 1 if self.t == 0 else 0], dtype=np.float32)

    def _reward(self, action):
        return (1.0 if int(action) == self.cue else -1.0) / self.horizon

    def optimal_action(self):
        return self.cue

    def optimal_value(self, gamma):
        remaining = self.horizon - self.t
        return (
            float(remaining) if gamma == 1 else (1 - gamma**remaining) / (1 - gamma)
        ) / self.horizon


class ContinuousProbe1(Probe1):
    """Probe1 with a Box(-1, 1, (1,)) action: observation [0], one step, reward +1. V([0]) = 1."""

    continuous = True


class ContinuousProbe2(Probe2):
    """Probe2 with a Box(-1, 1, (1,)) action: observation ±1, one step, reward = observation. V(o) = o."""

    continuous = True


class ContinuousProbe3(Probe3):
    """Probe3 with a Box(-1, 1, (1,)) action: [0] then [1], reward +1 at the end. V([0]) = gamma, V([1]) = 1."""

    continuous = True


class ContinuousProbe4(Probe4):
    """Observation [0], one step, action a in [-1, 1], reward -(a - 0.5)^2.

    Optimal action: a = 0.5; V*([0]) = 0. A Gaussian policy with mean m and std s has V([0]) = -((m - 0.5)^2 + s^2)
    (less where the clipping to [-1, 1] bites).
    """

    continuous = True

    def _reward(self, action):
        return -((_scalar_action(action) - 0.5) ** 2)

    def optimal_action(self):
        return np.array([0.5], dtype=np.float32)

    def optimal_value(self, gamma):
        return 0.0


class ContinuousProbe5(Probe2):
    """Observation o = -1 or +1 at random, one step, action a in [-1, 1], reward -(a - 0.5 * o)^2.

    Optimal action: a = 0.5 * o; V*(o) = 0. A Gaussian policy with mean m(o) and std s has
    V(o) = -((m(o) - 0.5 * o)^2 + s^2) (less where the clipping to [-1, 1] bites).
    """

    continuous = True

    def _reward(self, action):
        return -((_scalar_action(action) - self.optimal_action()[0]) ** 2)

    def optimal_action(self):
        return np.array([0.5 * (2 * self.cue - 1)], dtype=np.float32)

    def optimal_value(self, gamma):
        return 0.0


class MultiDiscreteProbe(Probe5):
    """Observation [0] or [1] at random, one step, a MultiDiscrete([2, 3]) action (a, b): reward +0.5 if a equals
    the observation, and +0.5 if b equals twice the observation.

    Breaks: an agent that draws one choice per part, each from the observation, and adds the parts'
    log-probabilities. Optimal action: (o, 2o); V*([0]) = V*([1]) = 1.
    """

    def __init__(self, render_mode: str | None = None):
        super().__init__(render_mode)
        self.action_space = spaces.MultiDiscrete([2, 3])

    def _reward(self, action):
        return 0.5 * float(int(action[0]) == self.cue) + 0.5 * float(int(action[1]) == 2 * self.cue)

    def optimal_action(self):
        return np.array([self.cue, 2 * self.cue])
