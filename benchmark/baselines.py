"""Speed and learning baselines to put a script's numbers in context, each measured in a fresh process.

- ``raw-env``: how fast the vector env alone steps with random actions (the upper bound on any agent's SPS).
- ``sb3``: Stable-Baselines3 PPO with CleanRL's (and ppo_fc's) default PPO settings.

Each subcommand prints one JSON object as the last line of its stdout, which the benchmark scripts read:
``python -m benchmark.baselines raw-env --steps 200000`` or ``python -m benchmark.baselines sb3 --timesteps 100000``.
"""

from __future__ import annotations

import json
import resource
import statistics
import time
from typing import Any

import gymnasium as gym
import numpy as np


def peak_rss_mb() -> float:
    """The peak resident memory of this process in MB (Linux reports ru_maxrss in KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def raw_env(
    env_id: str = "CartPole-v1", num_envs: int = 4, steps: int = 200_000, repeats: int = 3, seed: int = 1
) -> dict[str, Any]:
    """Steps per second of the vector env ppo_fc uses, with random actions and no agent.

    The env stack is ppo_fc's: SyncVectorEnv with SAME_STEP autoreset inside RecordEpisodeStatistics. One step of the
    vector env counts as `num_envs` steps, as `global_step` does in the scripts. Each of `repeats` measurements runs
    `steps` steps (after a short warm-up) and includes `envs.action_space.sample()`; the median is reported.

    Args:
        env_id: the gymnasium env id.
        num_envs: the number of envs in the vector env.
        steps: env steps per measurement (all envs together).
        repeats: the number of measurements.
        seed: seed of the envs and of the action sampler.
    """
    envs = gym.wrappers.vector.RecordEpisodeStatistics(
        gym.vector.SyncVectorEnv(
            [lambda: gym.make(env_id) for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )
    )
    envs.reset(seed=seed)
    envs.action_space.seed(seed)
    for _ in range(1_000):
        envs.step(envs.action_space.sample())
    vector_steps = max(1, steps // num_envs)
    measurements: list[float] = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(vector_steps):
            envs.step(envs.action_space.sample())
        measurements.append(vector_steps * num_envs / (time.perf_counter() - start))
    envs.close()
    return {
        "sps": statistics.median(measurements),
        "sps_all": measurements,
        "steps": vector_steps * num_envs,
        "repeats": repeats,
        "peak_rss_mb": peak_rss_mb(),
    }


def sb3(env_id: str = "CartPole-v1", timesteps: int = 100_000, seed: int = 1, torch_threads: int = 1) -> dict[str, Any]:
    """Stable-Baselines3 PPO with CleanRL's default PPO settings: its SPS and the mean return of its last 100 episodes.

    n_envs 4, n_steps 128, minibatches of 128 (4 per 512-step rollout), 4 epochs, Adam (eps 1e-5) with the learning rate 2.5e-4
    decaying linearly to 0, gamma 0.99, GAE lambda 0.95, clip 0.2, ent_coef 0.01, vf_coef 0.5, max_grad_norm 0.5,
    separate 64-64 tanh actor and critic with orthogonal initialisation, advantages normalised per minibatch, CPU.
    Unlike ppo_fc, the value loss is not clipped (SB3's `clip_range_vf` clips differently from CleanRL's clip_vloss).

    SPS counts the steps and the wall time from the end of the first iteration (rollout and update) to the end of
    training, the same span ppo_fc's first and last `charts/SPS` records cover.

    Args:
        env_id: the gymnasium env id.
        timesteps: total env steps (SB3 finishes the iteration that reaches them).
        seed: seed of SB3 (torch, numpy, envs).
        torch_threads: CPU threads for torch (ppo_fc's default is 1).
    """
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    class IterationClock(BaseCallback):
        """Records (steps, time) at the start of every rollout and at the end of training."""

        def __init__(self) -> None:
            super().__init__()
            self.marks: list[tuple[int, float]] = []

        def _on_rollout_start(self) -> None:
            self.marks.append((self.num_timesteps, time.perf_counter()))

        def _on_step(self) -> bool:
            return True

        def _on_training_end(self) -> None:
            self.marks.append((self.num_timesteps, time.perf_counter()))

    torch.set_num_threads(torch_threads)
    learning_rate = 2.5e-4
    envs = make_vec_env(env_id, n_envs=4, seed=seed)  # DummyVecEnv of Monitor-wrapped envs
    model = PPO(
        "MlpPolicy",
        envs,
        learning_rate=lambda progress_remaining: learning_rate * progress_remaining,
        n_steps=128,
        batch_size=128,
        n_epochs=4,
        gamma=0.99,
        gae_lambda=0.95,
        clip_range=0.2,
        normalize_advantage=True,
        ent_coef=0.01,
        vf_coef=0.5,
        max_grad_norm=0.5,
        policy_kwargs={"net_arch": {"pi": [64, 64], "vf": [64, 64]}, "activation_fn": torch.nn.Tanh},
        seed=seed,
        device="cpu",
        verbose=0,
    )
    clock = IterationClock()
    start = time.perf_counter()
    model.learn(total_timesteps=timesteps, callback=clock)
    wall_seconds = time.perf_counter() - start
    (first_steps, first_time), (last_steps, last_time) = clock.marks[min(1, len(clock.marks) - 1)], clock.marks[-1]
    if last_time > first_time:
        sps = (last_steps - first_steps) / (last_time - first_time)
    else:  # a single iteration: the whole of learn()
        sps = last_steps / wall_seconds
    returns = [float(info["r"]) for info in model.ep_info_buffer]
    envs.close()
    return {
        "sps": sps,
        "steps": int(model.num_timesteps),
        "wall_seconds": wall_seconds,
        "last100_return": float(np.mean(returns)) if returns else None,
        "episodes_in_window": len(returns),
        "peak_rss_mb": peak_rss_mb(),
        "torch_threads": torch_threads,
    }


if __name__ == "__main__":
    import tyro

    result = tyro.extras.subcommand_cli_from_dict({"raw-env": raw_env, "sb3": sb3})
    print(json.dumps(result))
