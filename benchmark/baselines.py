"""Baselines that put a script's numbers in context, each run in a fresh process by the harness.

- ``raw-env``: how fast the script's own vector env stack steps under random actions, with no agent (an upper bound
  on any agent's SPS). Prints one JSON object as the last line of stdout.
- ``sb3``: a Stable-Baselines3 algorithm (PPO, RecurrentPPO from sb3-contrib, DDPG) with settings the harness derives
  from a script's (`benchmark.registry`), given as one JSON object. It writes a run folder like the scripts do
  (``charts/episodic_return`` for every episode, ``charts/SPS``, ``system/rss_mb``, ``eval/episodic_return``), so the
  same reader, tables and plots serve both.

``python -m benchmark.baselines raw-env --script ppo_fc --env-id CartPole-v1`` or
``python -m benchmark.baselines sb3 --algo ppo --env-id CartPole-v1 --total-timesteps 100000 --seed 1
--settings "$(python -m benchmark.registry ppo_fc)"``.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np

import probe_envs  # noqa: F401  (registers the probe ids)
from benchmark.events import safe_name
from benchmark.registry import SCRIPTS, load_script, resolve_args
from common import atari
from common.envs import flat_observations, resolve_env_id
from common.resident_memory import rss_mb
from common.seeding import threads_for


@dataclass
class RawEnvArgs:
    """Steps per second of a script's vector env stack (`common.envs.training_envs` of its
    `make_env`) with random actions and no agent.

    A step of the vector env counts as `num_envs` steps, as `global_step` does in the scripts. Each
    of `repeats` measurements runs `steps` steps (after a short warm-up),
    `envs.action_space.sample()` included; the median is reported."""

    script: str = "ppo_fc"
    """the script whose env stack is measured"""
    env_id: str = "CartPole-v1"
    """the gymnasium env id"""
    flags: str = "[]"
    """the case's flags for the script, as a JSON list (they decide the number of envs and the wrappers)"""
    steps: int = 200_000
    """env steps per measurement (all envs together)"""
    repeats: int = 3
    """the number of measurements"""
    seed: int = 1
    """seed of the envs and of the action sampler"""


def raw_env(args: RawEnvArgs) -> None:
    settings = resolve_args(args.script, [*json.loads(args.flags), "--env-id", args.env_id])
    envs = SCRIPTS[args.script].vector_env(load_script(args.script), settings)
    envs.reset(seed=args.seed)
    envs.action_space.seed(args.seed)
    for _ in range(1_000):
        envs.step(envs.action_space.sample())
    num_envs = envs.num_envs
    vector_steps = max(1, args.steps // num_envs)
    measurements: list[float] = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        for _ in range(vector_steps):
            envs.step(envs.action_space.sample())
        measurements.append(vector_steps * num_envs / (time.perf_counter() - start))
    envs.close()
    print(
        json.dumps(
            {
                "script": args.script,
                "env_id": args.env_id,
                "num_envs": num_envs,
                "sps": statistics.median(measurements),
                "sps_all": measurements,
                "steps": vector_steps * num_envs,
                "repeats": args.repeats,
            }
        )
    )


@dataclass
class RandomPolicyArgs:
    """The mean return of the uniformly random policy (`action_space.sample()`) on an env, as the
    scripts make it: the bottom of the task's range in the memory suite's table. Prints one JSON
    object as the last line of stdout."""

    env_id: str = "CartPole-v1"
    """the gymnasium env id"""
    episodes: int = 100
    """the number of episodes"""
    seed: int = 1
    """episode k resets with seed + k; the action sampler is seeded with `seed`"""


def random_policy_returns(env_id: str, episodes: int, seed: int = 1) -> list[float]:
    """The return of each of `episodes` episodes of the random policy on `env_id` (see
    `RandomPolicyArgs`)."""
    env = flat_env(env_id)
    env.action_space.seed(seed)
    returns = []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        episode_return, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            episode_return, done = episode_return + float(reward), terminated or truncated
        returns.append(episode_return)
    env.close()
    return returns


def random_policy(args: RandomPolicyArgs) -> None:
    returns = random_policy_returns(args.env_id, args.episodes, args.seed)
    summary = {"env_id": args.env_id, "episodes": args.episodes, "seed": args.seed}
    print(
        json.dumps(
            {
                **summary,
                "mean": float(np.mean(returns)),
                "std": float(np.std(returns)),
                "returns": returns,
            }
        )
    )


@dataclass
class Sb3Args:
    """A Stable-Baselines3 run with the settings of one of our scripts (see `benchmark.registry`)."""

    algo: Literal["ppo", "recurrent_ppo", "ddpg", "td3"]
    """the SB3 algorithm"""
    settings: str
    """the algorithm's settings as one JSON object, as `benchmark.registry` derives them from a script's"""
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
    label: str | None = None
    """the run's exp name, which names its row in the tables (default sb3_<algo>)"""


def sb3(args: Sb3Args) -> None:
    """Train, log every episode as our scripts do, evaluate deterministically, and print the run
    folder as JSON."""
    import torch
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import VecNormalize
    from torch.utils.tensorboard import SummaryWriter

    settings = json.loads(args.settings)
    if settings["torch_threads"]:
        torch.set_num_threads(settings["torch_threads"])
    exp_name = args.label or f"sb3_{args.algo}"
    run_path = (
        Path(args.run_dir)
        / f"{safe_name(args.env_id)}__{exp_name}__{args.seed}__{int(time.time())}"
    )
    writer = SummaryWriter(str(run_path))
    envs = make_sb3_envs(args.env_id, settings, args.seed)
    model = build_sb3_model(args.algo, settings, envs, args.seed)
    # left out: by the network, by the scripts' own rule
    threads_for(settings["torch_threads"], model.policy)

    class Logger(BaseCallback):
        """Every finished episode (Monitor's raw return), and SPS and resident memory about every
        512 steps."""

        def __init__(self) -> None:
            super().__init__()
            self.last_logged, self.start_time, self.start_step = 0, time.perf_counter(), 0

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    writer.add_scalar(
                        "charts/episodic_return", info["episode"]["r"], self.num_timesteps
                    )
                    writer.add_scalar(
                        "charts/episodic_length", info["episode"]["l"], self.num_timesteps
                    )
            if self.num_timesteps - self.last_logged >= 512:
                self.last_logged = self.num_timesteps
                sps = (self.num_timesteps - self.start_step) / (
                    time.perf_counter() - self.start_time
                )
                writer.add_scalar("charts/SPS", int(sps), self.num_timesteps)
                # as the scripts log it
                writer.add_scalar("system/rss_mb", rss_mb(), self.num_timesteps)
            return True

    model.learn(total_timesteps=args.total_timesteps, callback=Logger())
    if isinstance(envs, VecNormalize):
        envs.training, envs.norm_reward = False, False
    eval_returns = evaluate_sb3(model, envs, args)
    for episode_return in eval_returns:
        writer.add_scalar("eval/episodic_return", episode_return, model.num_timesteps)
    writer.close()
    envs.close()
    print(
        json.dumps(
            {
                "run_dir": str(run_path),
                "steps": int(model.num_timesteps),
                "eval_returns": eval_returns,
            }
        )
    )


def flat_env(env_id: str) -> gym.Env:
    """The env of `env_id` as the scripts see it: any installed package's id (popgym, MiniGrid),
    with the observation flattened to a vector (`common.envs`). SB3's own `make_vec_env(env_id)`
    knows neither."""
    return flat_observations(gym.make(resolve_env_id(env_id)))


def sb3_vec_env(env_id: str, num_envs: int, seed: int, async_envs: bool = False) -> Any:
    """Monitor-wrapped envs of `flat_env` in SB3's DummyVecEnv (SubprocVecEnv with `async_envs`)."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    vec_env_cls = SubprocVecEnv if async_envs else DummyVecEnv
    return make_vec_env(
        partial(flat_env, env_id), n_envs=num_envs, seed=seed, vec_env_cls=vec_env_cls
    )


def sb3_atari_env(
    env_id: str, num_envs: int, seed: int, frame_stack: int, async_envs: bool = False
) -> Any:
    """SB3's Atari envs (`make_atari_env`: Monitor, then AtariWrapper) with `frame_stack` frames
    (VecFrameStack), made as the scripts make the id (the `-v5` ids with frameskip=1: AtariWrapper
    skips 4)."""
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack

    env_id = resolve_env_id(env_id)
    vec_env_cls = SubprocVecEnv if async_envs else DummyVecEnv
    envs = make_atari_env(
        env_id, num_envs, seed, vec_env_cls=vec_env_cls, env_kwargs=atari.make_kwargs(env_id)
    )
    return VecFrameStack(envs, frame_stack) if frame_stack > 1 else envs


def make_sb3_envs(
    env_id: str, settings: dict[str, Any], seed: int, num_envs: int | None = None
) -> Any:
    """The SB3 vector env of `settings` (`num_envs` of them, default the settings'): `sb3_atari_env`
    for an Atari game, else `sb3_vec_env`; in VecNormalize when observations or rewards are
    normalised."""
    from stable_baselines3.common.vec_env import VecNormalize

    num_envs, async_envs = num_envs or settings["num_envs"], settings.get("async_envs", False)
    if "atari_frame_stack" in settings:
        envs = sb3_atari_env(env_id, num_envs, seed, settings["atari_frame_stack"], async_envs)
    else:
        envs = sb3_vec_env(env_id, num_envs, seed, async_envs)
    if not (settings.get("norm_obs") or settings.get("norm_reward")):
        return envs
    return VecNormalize(
        envs,
        norm_obs=settings["norm_obs"],
        norm_reward=settings["norm_reward"],
        clip_reward=settings["clip_reward"],
        gamma=settings["model"]["gamma"],
    )


def build_sb3_model(algo: str, settings: dict[str, Any], envs: Any, seed: int) -> Any:
    """The SB3 model of `algo` with `settings` (see `benchmark.registry`) on `envs`."""
    import torch

    start, end = settings["learning_rate"], settings["end_learning_rate"]
    activation = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[settings["activation"]]
    hidden = settings["hidden_sizes"]
    common = {"seed": seed, "device": "cpu", "verbose": 0, **settings["model"]}
    # remaining: 1 at the start, 0 at the end
    common["learning_rate"] = lambda remaining: end + (start - end) * remaining
    if algo in ("ddpg", "td3"):
        from stable_baselines3 import DDPG, TD3
        from stable_baselines3.common.noise import NormalActionNoise, OrnsteinUhlenbeckActionNoise

        action_space = envs.action_space
        # SB3 adds the noise to the action scaled to [-1, 1], so its scale is in half-ranges
        # already, as the script's.
        noise_std = np.full(action_space.shape, settings["exploration_noise"])
        policy_kwargs = {
            "net_arch": hidden,
            "activation_fn": activation,
            **settings.get("policy_kwargs", {}),
        }
        # the DDPG paper's discrete form: a time step of 1
        if settings.get("noise", "gaussian") == "ou":
            action_noise = OrnsteinUhlenbeckActionNoise(
                np.zeros(action_space.shape), noise_std, theta=0.15, dt=1.0
            )
        else:
            action_noise = NormalActionNoise(np.zeros(action_space.shape), noise_std)
        algorithm = DDPG if algo == "ddpg" else TD3
        return algorithm(
            "MlpPolicy", envs, action_noise=action_noise, policy_kwargs=policy_kwargs, **common
        )
    policy_kwargs = {"net_arch": {"pi": hidden, "vf": hidden}, "activation_fn": activation}
    policy_kwargs.update(settings.get("policy_kwargs", {}))
    encoder = "Cnn" if "atari_frame_stack" in settings else "Mlp"
    if algo == "recurrent_ppo":
        from sb3_contrib import RecurrentPPO

        return RecurrentPPO(f"{encoder}LstmPolicy", envs, policy_kwargs=policy_kwargs, **common)
    from stable_baselines3 import PPO

    return PPO(f"{encoder}Policy", envs, policy_kwargs=policy_kwargs, **common)


def evaluate_sb3(model: Any, train_envs: Any, args: Sb3Args) -> list[float]:
    """Returns of `args.eval_episodes` deterministic episodes in one new env (normalisation
    statistics frozen)."""
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecNormalize

    if not args.eval_episodes:
        return []
    unnormalised = {
        **json.loads(args.settings),
        "norm_obs": False,
        "norm_reward": False,
        "async_envs": False,
    }
    env = make_sb3_envs(args.env_id, unnormalised, args.seed + 10_000, num_envs=1)
    if isinstance(train_envs, VecNormalize):
        env = VecNormalize(env, training=False, norm_reward=False, norm_obs=train_envs.norm_obs)
        if train_envs.norm_obs:  # SB3 makes no statistics without it
            env.obs_rms = train_envs.obs_rms
    returns, _ = evaluate_policy(
        model,
        env,
        n_eval_episodes=args.eval_episodes,
        deterministic=True,
        return_episode_rewards=True,
    )
    env.close()
    return [float(value) for value in returns]


if __name__ == "__main__":
    import tyro

    commands = {
        "raw-env": (RawEnvArgs, raw_env),
        "sb3": (Sb3Args, sb3),
        "random-policy": (RandomPolicyArgs, random_policy),
    }
    command = tyro.extras.subcommand_cli_from_dict(
        {name: args for name, (args, _) in commands.items()}
    )
    next(function for args, function in commands.values() if isinstance(command, args))(command)
