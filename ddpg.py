"""DDPG for continuous actions with several envs in parallel, after CleanRL's
ddpg_continuous_action.py. Read top to bottom: arguments, environments, networks, then ``train()``:
act with exploration noise, store the transition in the replay buffer, make ``--updates-per-step``
critic updates per transition, and every ``--policy-frequency``-th update also update the actor and
move both target networks. Run plumbing is in ``common/``; docs/ddpg.md gives the reasons for the
defaults."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

import onefile_rl  # noqa: F401  (a copy kept outside the checkout finds common/ through it)
import probe_envs  # noqa: F401  (registers the probe ids with gymnasium)
from common import cli, distributed
from common.envs import flat_observations, vector_observations_only
from common.errors import UsageError
from common.run_start import Run, TrainResult

SCRIPT = Path(__file__).stem
PAGE = "docs/ddpg.md"  # what a check's error points to, in a copy too
# --save-buffer stays the command line's on --resume; continuous actions only
RUN_OPTIONS = {"kept": ("save_buffer",), "actions": (gym.spaces.Box,)}


@dataclass
class Args:
    """DDPG for continuous actions, with CleanRL's flags, and several envs in parallel."""

    exp_name: str = SCRIPT
    """the name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment (torch, numpy, python and the envs)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, use a GPU when one is available"""
    track: bool = False
    """if toggled, track the run with Weights and Biases (works with WANDB_MODE=offline)"""
    wandb_project_name: str = "onefile-rl"
    """the wandb project name"""
    wandb_entity: str | None = None
    """the wandb entity (team or user)"""
    capture_video: bool = False
    """if toggled, record videos of env 0 into the run folder's `videos`"""
    save_model: bool = True
    """if toggled, write a checkpoint at the end of training (a stop signal or Ctrl-C always does)"""
    env_id: str = "Pendulum-v1"
    """the gymnasium env id (an installed package's ids work; `module:Env-v0` imports module)"""
    total_timesteps: int = 1_000_000
    """total env transitions of the experiment (rounded down to whole vector steps)"""
    learning_rate: float = 3e-4
    """the learning rate of both optimizers"""
    buffer_size: int = 1_000_000
    """the replay memory buffer size (transitions)"""
    gamma: float = 0.99
    """the discount factor gamma"""
    tau: float = 0.005
    """target smoothing coefficient"""
    batch_size: int = 256
    """the batch size of sample from the replay memory"""
    exploration_noise: float = 0.1
    """the scale of the exploration noise, in units of each action dimension's half-range"""
    learning_starts: int = 10_000
    """transitions of uniform random actions before learning starts"""
    policy_frequency: int = 2
    """the frequency of training the actor, in critic updates (delayed)"""

    # Beyond CleanRL's flags: this script's own
    num_envs: int = 1
    """the number of parallel environments"""
    anneal_lr: bool = False
    """toggle learning rate annealing"""
    end_learning_rate: float = 0.0
    """with --anneal-lr, the learning rate falls linearly towards this value"""
    noise: Literal["gaussian", "ou"] = "gaussian"
    """the exploration noise: gaussian, or an Ornstein-Uhlenbeck process per env"""
    updates_per_step: int = 1
    """gradient steps per env transition"""
    hidden_size: int = 256
    """width of the two hidden layers of the actor and of the critic"""

    # Run plumbing: output, checkpoints, resume, evaluation, trajectories, envs' processes, threads,
    # progress
    run_dir: str = "runs"
    """the folder holding every run's folder (TensorBoard logs, checkpoints, videos)"""
    video_every: int = 50
    """with --capture-video, record one episode of env 0 in every this many"""
    checkpoint_every: int = 0
    """write a checkpoint every this many vector steps (0: only at the end, with --save-model)"""
    save_buffer: bool = False
    """if toggled, every checkpoint keeps the replay buffer (.npz), as a stop signal's does: exact --resume"""
    checkpoint_minutes: float = 10.0
    """also write latest.pt every this many minutes of training (0: never): what a kill can lose"""
    run_name: str | None = None
    """the run folder's name in --run-dir (default: {env_id}__{exp_name}__{seed}__{unix time})"""
    resume: str | None = None
    """continue this checkpoint's run (settings, folder, step, schedule); auto: --run-name's, if any"""
    check_resume: bool = False
    """if toggled, check that this script resumes exactly: a short run, whole and stopped then resumed"""
    eval_checkpoint: str | None = None
    """evaluate this checkpoint's actor for --eval-episodes episodes, without noise, then exit"""
    eval_episodes: int = 10
    """episodes of noise-free evaluation after training (0: none)"""
    eval_every: int = 0
    """also evaluate for --eval-episodes episodes every this many training steps (0: never)"""
    save_trajectories: str | None = None
    """record the training steps (--eval-checkpoint: its episodes) to this new folder"""
    async_envs: bool = False
    """if toggled, run the environments in subprocesses (gymnasium's AsyncVectorEnv)"""
    torch_threads: int | None = None
    """CPU threads for torch (default: all for layers of 256 units or more, else 1; 0: torch's)"""
    progress: bool = True
    """if toggled, show a progress bar with the step count, SPS and the recent mean return"""


OU_THETA = 0.15
"""The Ornstein-Uhlenbeck process's pull towards 0 per step, the DDPG paper's, with a time step of
1."""


def make_env(
    env_id: str,
    idx: int = 0,
    capture_video: bool = False,
    video_folder: str = "",
    video_every: int = 1,
):
    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(
                env, video_folder, episode_trigger=lambda n: n % video_every == 0
            )
        else:
            env = gym.make(env_id)
        return flat_observations(vector_observations_only(env, "ddpg.py"))

    return thunk


class QNetwork(nn.Module):
    def __init__(self, observation_size: int, action_size: int, hidden_size: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(observation_size + action_size, hidden_size),
            nn.ReLU(),
            nn.Linear(hidden_size, hidden_size),
            nn.ReLU(),
            nn.Linear(hidden_size, 1),
        )

    def forward(self, x: Tensor, a: Tensor) -> Tensor:
        return self.net(torch.cat([x, a], -1)).squeeze(-1)


class Actor(nn.Module):
    def __init__(self, observation_size: int, action_space: gym.spaces.Box, hidden_size: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(observation_size, hidden_size),
            nn.ReLU(),
            nn.Linear(hidden_size, hidden_size),
            nn.ReLU(),
            nn.Linear(hidden_size, int(np.prod(action_space.shape))),
            nn.Tanh(),
        )
        # Each action dimension's own bounds: tanh's (-1, 1) scaled to them.
        low, high = (
            torch.as_tensor(bound, dtype=torch.float32).flatten()
            for bound in (action_space.low, action_space.high)
        )
        self.register_buffer("action_scale", (high - low) / 2)
        self.register_buffer("action_bias", (high + low) / 2)
        # the actor's output is flat; the env takes this shape
        self.action_shape = action_space.shape

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x) * self.action_scale + self.action_bias


class Agent(nn.Module):
    """The actor, the critic and their target networks: one state dict for checkpoints."""

    def __init__(self, observation_size: int, action_space: gym.spaces.Box, hidden_size: int):
        super().__init__()
        self.actor = Actor(observation_size, action_space, hidden_size)
        self.qf1 = QNetwork(observation_size, self.actor.action_scale.numel(), hidden_size)
        self.actor_target = Actor(observation_size, action_space, hidden_size)
        self.qf1_target = QNetwork(observation_size, self.actor.action_scale.numel(), hidden_size)
        self.actor_target.load_state_dict(self.actor.state_dict())
        self.qf1_target.load_state_dict(self.qf1.state_dict())


def polyak_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """target <- target + tau (online - target), for every parameter in one call (parameters only: a
    layer with buffers, such as BatchNorm's running statistics, needs them moved too)."""
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)


class Transitions(NamedTuple):
    observations: Tensor
    next_observations: Tensor
    actions: Tensor
    rewards: Tensor
    terminations: Tensor


class ReplayBuffer:
    """Transitions in preallocated arrays, oldest overwritten first. It stores the true next
    observation (the last one where an episode ended) and the termination flag only: truncated
    episodes bootstrap, terminated ones never."""

    FIELDS = Transitions._fields

    def __init__(self, size: int, observation_size: int, action_size: int):
        shapes = ((observation_size,), (observation_size,), (action_size,), (), ())
        for name, shape in zip(self.FIELDS, shapes, strict=True):
            setattr(self, name, np.zeros((size, *shape), dtype=np.float32))
        self.size, self.position, self.full = size, 0, False

    def __len__(self) -> int:
        return self.size if self.full else self.position

    def add(
        self,
        obs: np.ndarray,
        next_obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        terminations: np.ndarray,
    ) -> None:
        """One vector step: a row per env."""
        rows = (self.position + np.arange(len(obs))) % self.size
        for name, value in zip(
            self.FIELDS, (obs, next_obs, actions, rewards, terminations), strict=True
        ):
            getattr(self, name)[rows] = value
        self.full |= self.position + len(obs) >= self.size
        self.position = int(rows[-1] + 1) % self.size

    def sample(self, batch_size: int, device: torch.device) -> Transitions:
        """A uniform sample of the stored transitions, as tensors."""
        rows = np.random.randint(0, len(self), batch_size)
        return Transitions(
            *(torch.as_tensor(getattr(self, name)[rows], device=device) for name in self.FIELDS)
        )

    def state(self) -> dict[str, np.ndarray]:
        filled = len(self)
        arrays = {name: getattr(self, name)[:filled] for name in self.FIELDS}
        return {**arrays, "position": np.array(self.position), "full": np.array(self.full)}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        for name in self.FIELDS:
            getattr(self, name)[: len(state[name])] = state[name]
        self.position, self.full = int(state["position"]), bool(state["full"])


def next_noise(args: Args, noise_state: np.ndarray, episode_starts: np.ndarray) -> np.ndarray:
    """Noise for one vector step, (num_envs, action size), in units of each dimension's half-range:
    Gaussian, or the Ornstein-Uhlenbeck process of each env (x += theta (0 - x) + sigma N(0, 1)),
    restarted at 0 where that env's episode starts. `noise_state` is the process's state, updated in
    place."""
    draw = np.random.normal(size=noise_state.shape).astype(np.float32)
    if args.noise == "gaussian":
        return args.exploration_noise * draw
    noise_state[episode_starts] = 0.0
    noise_state += OU_THETA * (0.0 - noise_state) + args.exploration_noise * draw
    return noise_state.copy()


def train(args: Args) -> TrainResult:
    # checks, the checkpoint --resume continues (args become its settings), seeds, device
    run = Run(args, SCRIPT, make_env, check_args, **RUN_OPTIONS)
    args, device = run.args, run.device
    num_iterations = args.total_timesteps // args.num_envs  # one vector step each
    agent = build_agent(run)
    # fused: one kernel for every parameter, about 6% of an update here (docs/ddpg.md)
    actor_optimizer = torch.optim.Adam(agent.actor.parameters(), lr=args.learning_rate, fused=True)
    q_optimizer = torch.optim.Adam(agent.qf1.parameters(), lr=args.learning_rate, fused=True)
    action_size = agent.actor.action_scale.numel()
    # The noise process's state, per env; updated in place, as `updates` (0-d), so `saved` holds them.
    noise_state = np.zeros((args.num_envs, action_size), dtype=np.float32)
    updates = np.zeros((), dtype=np.int64)
    # What a checkpoint carries, by key (the replay buffer goes to a file beside it: write_checkpoint).
    saved = {"model": agent, "actor_optimizer": actor_optimizer, "q_optimizer": q_optimizer}
    saved |= {"noise": noise_state, "updates": updates}

    def write_checkpoint(iteration: int) -> Path:  # with the replay buffer in a file beside it
        folder = run.path / "checkpoints"
        # A stop's checkpoint is the one a requeued job resumes, and a run resumed with another
        # buffer is another run; periodic ones cost a full buffer's write each (docs/ddpg.md).
        keep_buffer = args.save_buffer or run.stopped
        buffer_name = write_buffer(rb, folder, global_step) if keep_buffer else None
        state = {**saved, "buffer": buffer_name}
        path = run.save(iteration, global_step, state, **carried)
        remove_older_buffers(folder, global_step)  # once a checkpoint names the new one
        return path

    # restored on --resume
    next_obs = run.start(saved, args.num_envs, write=write_checkpoint)
    global_step = run.global_step
    episode_starts = np.ones(args.num_envs, dtype=bool)
    carried = run.carry(
        {"episode_starts": episode_starts}
    )  # updated in place: a checkpoint saves it

    # The actor, the noise and the buffer work on flat actions; the env gets them in its own shape.
    action_space = run.envs.single_action_space
    half_range = agent.actor.action_scale.cpu().numpy()
    low = action_space.low.ravel()
    high = action_space.high.ravel()
    observation_size = int(np.prod(run.envs.single_observation_space.shape))
    rb = ReplayBuffer(args.buffer_size, observation_size, action_size)
    if run.checkpoint is not None and not run.training_ended:  # a run that ended samples no more
        restore_buffer(rb, run)
    log_every = max(1, 100 // args.num_envs)  # CleanRL logs the losses every 100 steps

    qf1_values = qf1_loss = actor_loss = torch.zeros(())
    updates_at_start = int(updates)  # the losses are logged once this process has updated
    with run:  # after a Ctrl-C, the run stops at the end of this block with status 130
        for iteration in range(run.iterations_done + 1, num_iterations + 1):
            if args.anneal_lr:
                frac = (iteration - 1.0) / num_iterations
                lrnow = (1.0 - frac) * args.learning_rate + frac * args.end_learning_rate
                actor_optimizer.param_groups[0]["lr"] = lrnow
                q_optimizer.param_groups[0]["lr"] = lrnow
            obs = next_obs.astype(np.float32)
            noise = next_noise(args, noise_state, episode_starts)
            if global_step < args.learning_starts:
                # From the seeded generator that checkpoints hold (an action space's is not seeded).
                actions = np.random.uniform(low, high, (args.num_envs, action_size))
                actions = actions.astype(np.float32)
            else:
                with torch.no_grad():  # in eval mode (dropout, batch norm), as evaluation acts
                    agent.actor.eval()
                    actions = agent.actor(torch.as_tensor(obs, device=device)).cpu().numpy()
                    agent.actor.train()
                actions = np.clip(actions + noise * half_range, low, high)
            env_actions = actions.reshape(args.num_envs, *action_space.shape)
            next_obs, rewards, terminations, truncations, infos = run.envs.step(env_actions)
            global_step += args.num_envs
            # The true next observation: where an episode ended, the last one of that episode.
            real_next_obs = next_obs.astype(np.float32)
            episode_starts[...] = terminations | truncations
            if episode_starts.any():
                real_next_obs[episode_starts] = np.stack(infos["final_obs"][episode_starts])
            rb.add(obs, real_next_obs, actions, rewards, terminations)
            run.step(actions, next_obs, rewards, terminations, truncations, infos, global_step)
            run.end_rollout()

            # A run resumed without its buffer refills a batch's worth before it samples.
            if global_step >= args.learning_starts and len(rb) >= args.batch_size:
                for _ in range(args.num_envs * args.updates_per_step):
                    data = rb.sample(args.batch_size, device)
                    with torch.no_grad():
                        next_actions = agent.actor_target(data.next_observations)
                        qf1_next_target = agent.qf1_target(data.next_observations, next_actions)
                        not_done = 1 - data.terminations
                        next_q_value = data.rewards + not_done * args.gamma * qf1_next_target
                    qf1_values = agent.qf1(data.observations, data.actions)
                    qf1_loss = F.mse_loss(qf1_values, next_q_value)
                    q_optimizer.zero_grad(set_to_none=True)
                    qf1_loss.backward()
                    q_optimizer.step()
                    updates += 1
                    if updates % args.policy_frequency == 0:
                        q_of_actor = agent.qf1(data.observations, agent.actor(data.observations))
                        actor_loss = -q_of_actor.mean()
                        actor_optimizer.zero_grad(set_to_none=True)
                        actor_loss.backward()
                        actor_optimizer.step()
                        polyak_update(agent.actor_target, agent.actor, args.tau)
                        polyak_update(agent.qf1_target, agent.qf1, args.tau)
                # A NaN or inf loss reaches the parameters; checking them all takes 0.5 ms: only then.
                if not torch.isfinite(qf1_loss + actor_loss):
                    losses = {"qf1_loss": qf1_loss, "actor_loss": actor_loss}
                    run.check_finite(agent, global_step, PAGE, **losses)

            if iteration % log_every == 0 or iteration == num_iterations:
                scalars = {"charts/learning_rate": q_optimizer.param_groups[0]["lr"]}
                if updates > updates_at_start:  # as CleanRL, from the first update on
                    scalars["losses/qf1_values"] = qf1_values.mean().item()
                    scalars["losses/qf1_loss"] = qf1_loss.item()
                    scalars["losses/actor_loss"] = actor_loss.item()
                run.log.iteration(global_step, scalars)
            every = args.eval_every
            crossed = every and global_step // every > (global_step - args.num_envs) // every
            if crossed and not (iteration == num_iterations and args.eval_episodes):  # last: after
                evaluate(agent, run, step=global_step)
            # a checkpoint if one is due; Ctrl-C: the run stops after a whole iteration
            if run.iteration_done(iteration, global_step, **carried):
                break
        run.end()
    eval_returns = evaluate(agent, run)
    return run.finish(agent, eval_returns)


# What train() calls, for a second reading: argument checks, the agent, the replay buffer's file,
# evaluation.


def check_args(args: Args) -> None:
    """Reject bad settings (ValueError) before anything is built or written."""
    distributed.single_process("ddpg.py")  # no data parallelism here (docs/ddpg.md)
    positive = ("total_timesteps", "num_envs", "buffer_size", "batch_size", "policy_frequency")
    positive += ("hidden_size", "video_every", "learning_rate", "updates_per_step")
    non_negative = ("seed", "eval_episodes", "checkpoint_every", "torch_threads", "eval_every")
    non_negative += ("checkpoint_minutes", "end_learning_rate", "learning_starts")
    non_negative += ("exploration_noise",)
    cli.check_ranges(args, positive, non_negative, ("gamma", "tau"))
    if args.total_timesteps < args.num_envs:
        raise ValueError(
            f"--total-timesteps {args.total_timesteps} is less than one vector step ({args.num_envs})"
        )
    if args.eval_every and not args.eval_episodes:
        raise ValueError("--eval-every needs --eval-episodes of 1 or more")


def build_agent(run: Run) -> Agent:
    """The agent for the run's env and settings, on its device (a checkpoint's weights come later)."""
    action_space = run.action_space
    if not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
        raise UsageError(
            f"{run.args.env_id!r} has unbounded actions; the actor's tanh needs finite bounds on each one"
        )
    observation_size = int(np.prod(run.observation_space.shape))
    agent = Agent(observation_size, action_space, run.args.hidden_size).to(run.device)
    # An edited Actor whose output is not one value per action dimension fails later inside the
    # critic with a bare shape error: say here what differs and where the fix goes.
    # in eval mode: batch norm's statistics stay as they are, dropout draws nothing
    with torch.no_grad():
        agent.actor.eval()
        action_size = agent.actor(torch.zeros(1, observation_size, device=run.device)).shape[-1:]
        agent.actor.train()
    expected = agent.actor.action_scale.shape
    if action_size != expected:
        raise UsageError(
            f"the actor gives {action_size[0]} values per observation, the env takes {expected[0]} actions: "
            f"the last layer of Actor.net in {SCRIPT}.py must output one per action dimension (docs/ddpg.md, Network)"
        )
    return agent


def write_buffer(rb: ReplayBuffer, folder: Path, global_step: int) -> str:
    """The replay buffer to `buffer_step_{global_step}.npz` in `folder`, atomically; its file name."""
    name = f"buffer_step_{global_step}.npz"
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f".{name}.tmp.npz"
    np.savez(temporary, **rb.state())
    temporary.replace(folder / name)
    return name


def remove_older_buffers(folder: Path, global_step: int) -> None:
    """One buffer on disk (a full MuJoCo one is 168 MB): once `latest.pt` of `global_step` is
    written (it names this step's buffer or none), the ones of earlier steps go. A later one stays:
    it belongs to the run this one was resumed from an earlier checkpoint of."""
    for older in folder.glob("buffer_step_*.npz"):
        if int(older.stem.removeprefix("buffer_step_")) < global_step:
            older.unlink()


def restore_buffer(rb: ReplayBuffer, run: Run) -> None:
    """The replay buffer of the checkpoint --resume continues, if it was written (a stop signal's
    checkpoint, or any with --save-buffer) and is still there; else a notice, and the run goes on
    with an empty one."""
    name = run.checkpoint.get("buffer")
    buffer_path = run.path / "checkpoints" / str(name or "")
    if name and buffer_path.is_file():
        with np.load(buffer_path, allow_pickle=False) as stored:
            rb.restore(dict(stored))
        return
    why = "holds no replay buffer (a stop signal's checkpoint does; the others with --save-buffer)"
    if name:
        why = f"names {name}, which is gone (each checkpoint removes the buffers of earlier steps)"
    cli.notice(f"{run.args.resume} {why}: the resumed run starts with an empty buffer")


def evaluate(
    agent: Agent, run: Run, step: int | None = None, record_to: Path | None = None
) -> list[float]:
    """Play --eval-episodes episodes with the deterministic actor (no noise); log them at `step`
    (default: the run's) and return their returns (`Run.evaluate`)."""

    @torch.inference_mode()
    def act(obs: np.ndarray, episode_starts: np.ndarray) -> np.ndarray:
        obs_tensor = torch.as_tensor(obs, dtype=torch.float32, device=run.device)
        actions = agent.actor(obs_tensor).cpu().numpy()
        return actions.reshape(len(actions), *agent.actor.action_shape)

    return run.evaluate(agent, act, step, record_to)


def evaluate_checkpoint(args: Args) -> list[float]:
    """Rebuild the agent from a checkpoint alone, evaluate it, print mean and std of the return."""
    run = Run(args, SCRIPT, make_env, check_args, **RUN_OPTIONS)
    agent = build_agent(run)
    return run.evaluate_checkpoint(agent, lambda path: evaluate(agent, run, record_to=path))


def main() -> int:
    """The command line: --eval-checkpoint evaluates, else `train`; the exit status."""
    return cli.main(Args, train, evaluate_checkpoint)


if __name__ == "__main__":
    sys.exit(main())
