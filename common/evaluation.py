"""Evaluation episodes: one env, seeded, played to the end of each episode, optionally recorded;
logged after training, or in a run folder of their own for --eval-checkpoint."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch.distributions import Categorical, Distribution, Normal, TransformedDistribution
from torch.utils.tensorboard import SummaryWriter

from common import distributed
from common.cli import notice
from common.envs import evaluation_env, resolve_env_id
from common.errors import UsageError
from common.run_folder import create_run_folder, run_name
from common.tracking import finish_tracking, log_episodes, start_tracking, wandb_history
from common.trajectories import TrajectoryRecording, check_destination, new_recording_folder

Act = Callable[
    [np.ndarray, np.ndarray], np.ndarray | tuple[np.ndarray, Mapping[str, Mapping[str, Any]]]
]


EPISODE_STEP_LIMIT = 100_000
"""An evaluation episode that has not ended after this many steps is cut there, as truncated: an env
with no time limit (dm_control's lqr tasks) would otherwise be played forever. Above the limits of
the envs this project runs (Atari's 27,000 steps of 4 frames, MuJoCo's and dm_control's 1,000)."""


def play_episodes(
    env: gym.vector.VectorEnv,
    act: Act,
    episodes: int,
    seed: int,
    trajectory_path: Path | None = None,
    meta: Mapping[str, Any] | None = None,
) -> tuple[list[float], list[int]]:
    """Play `episodes` episodes in `env`, one env (`common.envs.evaluation_env`), reset with
    `seed`, and return their returns and lengths; `env` is closed after them.

    `act(observations, episode_starts)` gets a batch of one observation and whether it is the first
    of its episode (for agents with memory), and returns the action as the env takes it, or the
    action and the agent's fields to record for the step (`{name: {field: array}}`, e.g. a hidden
    state). With `trajectory_path`, the episodes are recorded there."""
    recorder = (
        TrajectoryRecording(trajectory_path, 1, meta or {}) if trajectory_path is not None else None
    )
    returns: list[float] = []
    lengths: list[int] = []
    observations, _ = env.reset(seed=seed)
    episode_starts = np.ones(1, dtype=bool)
    steps, summed_rewards = 0, 0.0  # of the episode under way: for one cut at the step limit
    while len(returns) < episodes:
        actions, agents = act(observations, episode_starts), None
        if isinstance(actions, tuple):
            actions, agents = actions
        next_observations, rewards, terminations, truncations, infos = env.step(actions)
        steps, summed_rewards = steps + 1, summed_rewards + float(rewards[0])
        ended = "_episode" in infos and bool(infos["_episode"][0])
        cut = steps >= EPISODE_STEP_LIMIT and not ended
        if cut:
            truncations = np.ones_like(truncations)
            notice(
                f"an evaluation episode had not ended after {EPISODE_STEP_LIMIT:,} steps (the env sets no time "
                "limit): each is cut there, and its return is of those steps; give the env a limit in make_env "
                "(gym.make's max_episode_steps) for shorter ones"
            )
        if recorder is not None:
            recorder.add_step(
                observations,
                actions,
                rewards,
                terminations,
                truncations,
                agents=agents,
                infos=infos,
            )
        if ended:
            returns.append(float(infos["episode"]["r"][0]))
            lengths.append(int(infos["episode"]["l"][0]))
        if cut:
            returns.append(summed_rewards)
            lengths.append(steps)
            next_observations, _ = env.reset()
        if ended or cut:
            steps, summed_rewards = 0, 0.0
        observations, episode_starts = next_observations, terminations | truncations
    if isinstance(env.unwrapped, gym.vector.SyncVectorEnv):
        _drop_unplayed_video(env.unwrapped.envs[0])
    env.close()
    if recorder is not None:
        recorder.flush()
    return returns, lengths


def _drop_unplayed_video(env: gym.Env) -> None:
    """The autoreset after the last episode starts another, which RecordVideo begins to record: not
    a video to keep."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.RecordVideo) and env.recording:
            env.recorded_frames, env.recording = [], False
        env = env.env


def evaluate(
    agent: torch.nn.Module, act: Act, make_env: Callable, args: Any, writer: SummaryWriter, step: int,
    record_to: Path | None,
) -> list[float]:  # fmt: skip
    """Play `args.eval_episodes` episodes of `args.env_id` (made by the script's `make_env`, seeded
    with `args.seed`) with `act` (see `play_episodes`), the agent in eval mode (dropout off, batch
    norm on its running statistics); log them at `step`, the agent's training step, record them to
    `record_to`, and return their returns. None are played with --eval-episodes 0, or on a rank
    other than 0 under torchrun."""
    if not args.eval_episodes or not distributed.is_main():
        return []
    was_training = agent.training
    agent.eval()
    env_id, meta = resolve_env_id(args.env_id), {"args": dataclasses.asdict(args)}
    # --eval-checkpoint --capture-video records the evaluation episodes; a training run's videos are of training.
    videos = args.capture_video and args.eval_checkpoint is not None
    env_fn = make_env(env_id, 0, videos, str(Path(writer.log_dir) / "videos"), args.video_every)
    env = evaluation_env(env_fn, args)
    returns, lengths = play_episodes(env, act, args.eval_episodes, args.seed, record_to, meta)
    log_episodes(writer, returns, lengths, step, prefix="eval")
    history = wandb_history(writer)
    if history is not None:  # now: rows of a step whose iteration was sent would wait for the next
        history.send()
    agent.train(was_training)
    return returns


def evaluate_checkpoint(
    args: Any, trained: Any, evaluate: Callable[[SummaryWriter, Path | None], list[float]]
) -> list[float]:
    """--eval-checkpoint: `evaluate(writer, record_to)` the agent of the checkpoint, whose run's settings are
    `trained`, in a new run folder (its name ending in `__eval`); print the mean and std of the return. One process:
    under torchrun with more than one, an `error:` before anything is written."""
    distributed.single_process("--eval-checkpoint")
    if trained.eval_episodes <= 0:
        raise UsageError("--eval-episodes must be positive with --eval-checkpoint")
    check_destination(args.save_trajectories)
    run_path = create_run_folder(
        args.run_dir, run_name(trained.env_id, trained.exp_name, trained.seed), "__eval"
    )
    # with --track, a wandb run of its own: the evaluation run's name
    writer = start_tracking(run_path, trained)
    recording = (
        new_recording_folder(args.save_trajectories) if args.save_trajectories is not None else None
    )
    returns = evaluate(writer, recording)
    finish_tracking(writer, run_path / "videos" if trained.capture_video else None, set())
    print(
        f"{args.eval_checkpoint}: {len(returns)} episodes, return {np.mean(returns):.2f} +- {np.std(returns):.2f}"
    )
    return returns


def select_action(policy: Distribution, method: str, temperature: float, k: int) -> torch.Tensor:
    """An action of `policy` for evaluation (--sampling-method): greedy (argmax / mean), basic
    (sample), temperature (logits divided by it, or the std multiplied), topk or bottomk (a sample
    among the `k` most or least likely actions of a categorical). Another distribution takes greedy
    (`greedy_action`) and basic (its `sample`)."""
    if method == "greedy":
        return greedy_action(policy)
    if method == "basic":
        return policy.sample()
    if method == "temperature" and isinstance(policy, Categorical):
        return Categorical(logits=policy.logits / temperature).sample()
    if method == "temperature" and isinstance(policy, Normal):
        return Normal(policy.mean, policy.stddev * temperature).sample()
    if method in ("topk", "bottomk") and isinstance(policy, Categorical):
        kept = policy.logits.topk(min(k, policy.logits.shape[-1]), dim=-1, largest=method == "topk")
        return kept.indices.gather(
            -1, Categorical(logits=kept.values).sample().unsqueeze(-1)
        ).squeeze(-1)
    raise UsageError(
        f"--sampling-method {method} does not apply to a {type(policy).__name__} policy"
    )


def greedy_action(policy: Distribution) -> torch.Tensor:
    """The policy's `mode`; for a TransformedDistribution that has none (a tanh-squashed Gaussian,
    a Beta scaled to the bounds), its transforms applied to its base distribution's greedy action
    (tanh of the Gaussian's mean, as SAC evaluates)."""
    try:
        return policy.mode
    except NotImplementedError:
        if not isinstance(policy, TransformedDistribution):
            raise UsageError(
                f"--sampling-method greedy takes the policy's mode, and Agent.distribution's "
                f"{type(policy).__name__} has none: define its `mode` property, or evaluate with --sampling-method "
                "basic"
            ) from None
    action = greedy_action(policy.base_dist)
    for transform in policy.transforms:
        action = transform(action)
    return action
