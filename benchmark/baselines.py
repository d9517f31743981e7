"""Baselines that put a script's numbers in context, each run in a fresh process by the harness.

- ``raw-env``: how fast the vector env alone steps under random actions (an upper bound on any agent's SPS). Prints
  one JSON object as the last line of stdout.
- ``sb3``: a Stable-Baselines3 algorithm (PPO, RecurrentPPO from sb3-contrib, DDPG) with the settings of our
  scripts. It writes a run folder like the scripts do (``charts/episodic_return`` for every episode,
  ``charts/SPS``, ``system/rss_mb``, ``eval/episodic_return``), so the same reader, tables and plots serve both.

``python -m benchmark.baselines raw-env --env-id CartPole-v1`` or
``python -m benchmark.baselines sb3 --algo ppo --env-id CartPole-v1 --total-timesteps 100000 --seed 1``.
"""

from __future__ import annotations

import json
import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np

import probe_envs  # noqa: F401  (registers the probe ids)
from benchmark.events import safe_name


def peak_rss_mb() -> float:
    """The peak resident memory of this process in MB (Linux reports ru_maxrss in KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class RawEnvArgs:
    """Steps per second of the scripts' vector env with random actions and no agent.

    The env stack is the scripts': SyncVectorEnv with SAME_STEP autoreset inside RecordEpisodeStatistics. A step of
    the vector env counts as `num_envs` steps, as `global_step` does in the scripts. Each of `repeats` measurements
    runs `steps` steps (after a short warm-up), `envs.action_space.sample()` included; the median is reported.
    """

    env_id: str = "CartPole-v1"
    """the gymnasium env id"""
    num_envs: int = 4
    """the number of envs in the vector env"""
    steps: int = 200_000
    """env steps per measurement (all envs together)"""
    repeats: int = 3
    """the number of measurements"""
    seed: int = 1
    """seed of the envs and of the action sampler"""


def raw_env(args: RawEnvArgs) -> None:
    env_id, num_envs, steps, repeats, seed = args.env_id, args.num_envs, args.steps, args.repeats, args.seed
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
    print(
        json.dumps(
            {
                "env_id": env_id,
                "num_envs": num_envs,
                "sps": statistics.median(measurements),
                "sps_all": measurements,
                "steps": vector_steps * num_envs,
                "repeats": repeats,
                "peak_rss_mb": peak_rss_mb(),
            }
        )
    )


@dataclass
class Sb3Args:
    """A Stable-Baselines3 run with our scripts' flag names and defaults (CleanRL's), so the harness can pass a
    case's flags on unchanged."""

    algo: Literal["ppo", "recurrent_ppo", "ddpg"] = "ppo"
    """the SB3 algorithm"""
    env_id: str = "CartPole-v1"
    """the gymnasium env id"""
    total_timesteps: int = 100_000
    """env steps (on-policy algorithms finish the iteration that reaches them)"""
    seed: int = 1
    """seed of SB3 (torch, numpy, envs)"""
    run_dir: str = "runs"
    """the run folder is created inside, named as the scripts name theirs"""
    eval_episodes: int = 10
    """deterministic evaluation episodes after training"""
    torch_threads: int = 1
    """CPU threads for torch, as our scripts' default"""
    num_envs: int = 4
    """parallel envs (DummyVecEnv)"""
    num_steps: int = 128
    """PPO: steps per env per rollout"""
    num_minibatches: int = 4
    """PPO: minibatches per epoch"""
    update_epochs: int = 4
    """PPO: epochs per rollout"""
    learning_rate: float = 2.5e-4
    """Adam's learning rate (PPO: decays linearly to 0 when anneal_lr)"""
    anneal_lr: bool = True
    """PPO: linear learning-rate decay"""
    gamma: float = 0.99
    """discount"""
    gae_lambda: float = 0.95
    """PPO: GAE lambda"""
    clip_coef: float = 0.2
    """PPO: surrogate clipping"""
    ent_coef: float = 0.01
    """PPO: entropy bonus"""
    vf_coef: float = 0.5
    """PPO: value-loss weight"""
    max_grad_norm: float = 0.5
    """PPO: gradient clipping"""
    hidden_size: int = 64
    """width of the two hidden layers"""
    norm_obs: bool = False
    """PPO: VecNormalize observations"""
    norm_reward: bool = False
    """PPO: VecNormalize rewards"""
    buffer_size: int = 1_000_000
    """DDPG: replay buffer size"""
    batch_size: int = 256
    """DDPG: batch size"""
    tau: float = 0.005
    """DDPG: target smoothing"""
    learning_starts: int = 25_000
    """DDPG: random steps before learning"""
    exploration_noise: float = 0.1
    """DDPG: std of the Gaussian action noise, as a fraction of the action range"""


def sb3(args: Sb3Args) -> None:
    """Train, log every episode as our scripts do, evaluate deterministically, and print the run folder as JSON."""
    import torch
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize
    from torch.utils.tensorboard import SummaryWriter

    torch.set_num_threads(args.torch_threads)
    exp_name = f"sb3_{args.algo}"
    run_path = Path(args.run_dir) / f"{safe_name(args.env_id)}__{exp_name}__{args.seed}__{int(time.time())}"
    writer = SummaryWriter(str(run_path))
    envs = make_vec_env(args.env_id, n_envs=args.num_envs, seed=args.seed)  # DummyVecEnv of Monitor-wrapped envs
    if args.norm_obs or args.norm_reward:
        envs = VecNormalize(envs, norm_obs=args.norm_obs, norm_reward=args.norm_reward, gamma=args.gamma)
    model = build_sb3_model(args, envs)

    class Logger(BaseCallback):
        """Every finished episode (Monitor's raw return), and SPS and memory about every 512 steps."""

        def __init__(self) -> None:
            super().__init__()
            self.last_logged, self.start_time, self.start_step = 0, time.perf_counter(), 0

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    writer.add_scalar("charts/episodic_return", info["episode"]["r"], self.num_timesteps)
                    writer.add_scalar("charts/episodic_length", info["episode"]["l"], self.num_timesteps)
            if self.num_timesteps - self.last_logged >= 512:
                self.last_logged = self.num_timesteps
                sps = (self.num_timesteps - self.start_step) / (time.perf_counter() - self.start_time)
                writer.add_scalar("charts/SPS", int(sps), self.num_timesteps)
                writer.add_scalar("system/rss_mb", peak_rss_mb(), self.num_timesteps)
            return True

    model.learn(total_timesteps=args.total_timesteps, callback=Logger())
    if isinstance(envs, VecNormalize):
        envs.training, envs.norm_reward = False, False
    eval_returns = evaluate_sb3(model, envs, args)
    for episode_return in eval_returns:
        writer.add_scalar("eval/episodic_return", episode_return, model.num_timesteps)
    writer.close()
    envs.close()
    print(json.dumps({"run_dir": str(run_path), "steps": int(model.num_timesteps), "eval_returns": eval_returns}))


def build_sb3_model(args: Sb3Args, envs: Any) -> Any:
    import torch

    lr = args.learning_rate
    schedule = (lambda remaining: lr * remaining) if args.anneal_lr else lr
    hidden = [args.hidden_size, args.hidden_size]
    common = {"seed": args.seed, "device": "cpu", "verbose": 0, "gamma": args.gamma}
    if args.algo == "ddpg":
        from stable_baselines3 import DDPG
        from stable_baselines3.common.noise import NormalActionNoise

        action_space = envs.action_space
        noise_std = args.exploration_noise * (action_space.high - action_space.low) / 2
        return DDPG(
            "MlpPolicy",
            envs,
            learning_rate=lr,
            buffer_size=args.buffer_size,
            batch_size=args.batch_size,
            tau=args.tau,
            learning_starts=args.learning_starts,
            action_noise=NormalActionNoise(np.zeros(action_space.shape), noise_std),
            policy_kwargs={"net_arch": [256, 256]},
            **common,
        )
    ppo_settings = {
        "learning_rate": schedule,
        "n_steps": args.num_steps,
        "batch_size": args.num_envs * args.num_steps // args.num_minibatches,
        "n_epochs": args.update_epochs,
        "gae_lambda": args.gae_lambda,
        "clip_range": args.clip_coef,
        "normalize_advantage": True,
        "ent_coef": args.ent_coef,
        "vf_coef": args.vf_coef,
        "max_grad_norm": args.max_grad_norm,
        "policy_kwargs": {"net_arch": {"pi": hidden, "vf": hidden}, "activation_fn": torch.nn.Tanh},
        **common,
    }
    if args.algo == "recurrent_ppo":
        from sb3_contrib import RecurrentPPO

        ppo_settings["policy_kwargs"]["lstm_hidden_size"] = args.hidden_size
        return RecurrentPPO("MlpLstmPolicy", envs, **ppo_settings)
    from stable_baselines3 import PPO

    return PPO("MlpPolicy", envs, **ppo_settings)


def evaluate_sb3(model: Any, train_envs: Any, args: Sb3Args) -> list[float]:
    """Returns of `args.eval_episodes` deterministic episodes in one new env (normalisation statistics frozen)."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecNormalize

    if not args.eval_episodes:
        return []
    env = make_vec_env(args.env_id, n_envs=1, seed=args.seed + 10_000)
    if isinstance(train_envs, VecNormalize):
        env = VecNormalize(env, training=False, norm_reward=False, norm_obs=train_envs.norm_obs)
        env.obs_rms = train_envs.obs_rms
    returns, _ = evaluate_policy(
        model, env, n_eval_episodes=args.eval_episodes, deterministic=True, return_episode_rewards=True
    )
    env.close()
    return [float(value) for value in returns]


if __name__ == "__main__":
    import tyro

    command = tyro.extras.subcommand_cli_from_dict({"raw-env": RawEnvArgs, "sb3": Sb3Args})
    raw_env(command) if isinstance(command, RawEnvArgs) else sb3(command)
