"""Recurrent PPO (an MLP encoder, an LSTM or GRU, actor and critic heads) for discrete and
continuous actions, after CleanRL's ppo_atari_lstm.py. Read top to bottom: arguments, environments,
network, then ``train()``. Run plumbing is in ``common/``; docs/ppo_lstm.md gives the reasons for
the defaults."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal, NamedTuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from torch import Tensor
from torch.distributions import Categorical, Normal

import onefile_rl  # noqa: F401  (a copy kept outside the checkout finds common/ through it)
import probe_envs  # noqa: F401  (registers the probe ids with gymnasium)
from common import cli, envs, rollout_checks
from common.envs import cnn_layout, observation_tensor, observation_zeros
from common.numpy_copy import numpy_copy
from common.run_start import Run, TrainResult
from common.running_norm import RunningNorm

SCRIPT = Path(__file__).stem
PAGE = "docs/ppo_lstm.md"  # what a check's error points to, in a copy too


@dataclass
class Args:
    """Recurrent PPO (LSTM or GRU) for discrete and continuous actions, with CleanRL's flags."""

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
    """if toggled, record videos of env 0 into `{run_dir}/{run_name}/videos`"""
    env_id: str = "CartPole-v1"
    """the gymnasium env id (an installed package's ids work; `module:Env-v0` imports module)"""
    total_timesteps: int = 500_000
    """total timesteps of the experiment (rounded down to whole batches)"""
    learning_rate: float = 1e-3
    """the learning rate of the optimizer (docs/ppo_lstm.md)"""
    num_envs: int = 8
    """the number of parallel environments (docs/ppo_lstm.md)"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 2
    """the number of minibatches (docs/ppo_lstm.md)"""
    update_epochs: int = 10
    """the K epochs to update the policy (docs/ppo_lstm.md)"""
    norm_adv: bool = True
    """toggles advantages normalization (per minibatch)"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient (docs/ppo_lstm.md)"""
    clip_vloss: bool = False
    """toggles whether or not to use a clipped loss for the value function (docs/ppo_lstm.md)"""
    ent_coef: float = 0.0
    """coefficient of the entropy (docs/ppo_lstm.md)"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold: stop the epochs of an update once it is exceeded"""

    # Beyond CleanRL's flags: this script's own
    end_learning_rate: float = 0.0
    """with --anneal-lr, the learning rate falls linearly towards this value"""
    bootstrap_truncation: bool = True
    """if toggled, truncated episodes bootstrap from the value of their last observation"""
    norm_obs: bool = True
    """if toggled, normalise observations by running statistics (frozen in evaluation; no images)"""
    norm_reward: bool = True
    """if toggled, scale rewards by the running std of the discounted return (docs/ppo_lstm.md)"""
    norm_reward_clip: float = 10.0
    """with --norm-reward, clip the scaled rewards to [-this, this] (CleanRL's 10)"""
    hidden_size: int = 64
    """width of the encoder, a linear layer with tanh before the recurrent cell (for vectors)"""
    encoder: Literal["auto", "mlp", "cnn"] = "auto"
    """auto: the Nature CNN for uint8 images (rank 2-3, channels first or last, 36x36 up)"""
    rnn_type: Literal["lstm", "gru"] = "lstm"
    """the recurrent cell: lstm or gru (a GRU is slower on a CPU: docs/ppo_lstm.md)"""
    rnn_hidden_size: int = 128
    """the size of the recurrent cell's hidden state"""
    rnn_layers: int = 1
    """the number of stacked recurrent layers"""
    shared_core: bool = True
    """if toggled, the actor and critic share the encoder and cell; off: the critic has its own"""
    bptt_len: int = 0
    """0: minibatches of whole env rollouts; L > 0: of L-step chunks from the recorded states"""

    # Run plumbing: output, checkpoints, resume, evaluation, trajectories, envs' processes, threads,
    # progress
    run_dir: str = "runs"
    """the folder holding every run's folder (TensorBoard logs, checkpoints, videos)"""
    video_every: int = 50
    """with --capture-video, record one episode of env 0 in every this many"""
    save_model: bool = True
    """if toggled, write a checkpoint at the end of training (a stop signal or Ctrl-C always does)"""
    checkpoint_every: int = 0
    """write a checkpoint every this many iterations (0: only at the end, when --save-model)"""
    checkpoint_minutes: float = 10.0
    """also write latest.pt every this many minutes of training (0: never): what a kill can lose"""
    run_name: str | None = None
    """the run folder's name in --run-dir (default: {env_id}__{exp_name}__{seed}__{unix time})"""
    resume: str | None = None
    """continue this checkpoint's run (settings, folder, step, schedule); auto: --run-name's, if any"""
    check_resume: bool = False
    """if toggled, check that this script resumes exactly: a short run, whole and stopped then resumed"""
    eval_checkpoint: str | None = None
    """evaluate the agent of this checkpoint for --eval-episodes episodes, then exit"""
    eval_episodes: int = 10
    """episodes of evaluation after training, actions drawn by --sampling-method (0: none)"""
    sampling_method: Literal["greedy", "basic", "temperature", "topk", "bottomk"] = "greedy"
    """how evaluation acts: greedy (argmax / mean), basic (a sample), temperature, topk, bottomk"""
    temperature: float = 1.0
    """with --sampling-method temperature: divides the logits, or multiplies the std"""
    sampling_k: int = 2
    """with --sampling-method topk / bottomk: sample among this many most / least likely actions"""
    save_trajectories: str | None = None
    """record the training rollouts (--eval-checkpoint: its episodes) to this new folder"""
    async_envs: bool = False
    """if toggled, run the environments in subprocesses (gymnasium's AsyncVectorEnv)"""
    env_backend: Literal["gymnasium", "envpool"] = "gymnasium"
    """how Atari games are stepped: gymnasium's wrappers, or EnvPool's C++ threads ([envpool] extra)"""
    numpy_rollout: bool = True
    """if toggled, the rollout acts through a NumPy copy of the policy, checked against it"""
    torch_threads: int | None = None
    """CPU threads for torch (default: all for a CNN or 256-unit layers, else 1; 0: torch's)"""
    progress: bool = True
    """if toggled, show a progress bar with the step count, SPS and the recent mean return"""
    dist_backend: str | None = None
    """under torchrun: the process group's backend (default: nccl on a GPU, gloo on the CPU)"""


def make_env(
    env_id: str,
    idx: int = 0,
    capture_video: bool = False,
    video_folder: str = "",
    video_every: int = 1,
):
    def thunk():
        # gym.make, gymnasium's RecordVideo for env 0 (--capture-video), CleanRL's Atari wrappers
        # (only for Atari games; one frame: the LSTM remembers), observations as the network takes them
        video = video_folder if capture_video and idx == 0 else None
        return envs.make(env_id, frame_stack=1, video_folder=video, video_every=video_every)

    return thunk


def layer_init(
    layer: nn.Linear | nn.Conv2d, std: float = math.sqrt(2), bias_const: float = 0.0
) -> nn.Module:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class NatureCNN(nn.Module):
    """The Nature DQN's three convolutions and 512 units, as in CleanRL's ppo_atari_lstm.py, on
    images of `layout` ("hw", "chw" or "hwc"), uint8, scaled by 1/255; any leading batch axes. A
    vector of `vector_size` (a Dict observation's other parts) joins the convolutions' output, so
    that the 512 units can combine the two."""

    def __init__(self, image_space: gym.spaces.Box, layout: str, vector_size: int = 0):
        super().__init__()
        self.image_shape, self.layout = image_space.shape, layout
        channels = {"hw": 1, "chw": self.image_shape[0], "hwc": self.image_shape[-1]}[layout]
        self.convs = nn.Sequential(
            layer_init(nn.Conv2d(channels, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            conv_size = self.convs(self.channels_first(torch.zeros(1, *self.image_shape))).shape[1]
        self.linear = nn.Sequential(layer_init(nn.Linear(conv_size + vector_size, 512)), nn.ReLU())
        # oneDNN's convolutions: 1.5x faster on a CPU
        self.convs.to(memory_format=torch.channels_last)

    def channels_first(self, x: Tensor) -> Tensor:
        """A batch of images of this layout as (batch, channels, height, width)."""
        return (
            x.unsqueeze(1)
            if self.layout == "hw"
            else x.permute(0, 3, 1, 2)
            if self.layout == "hwc"
            else x
        )

    def forward(self, x: Tensor, vector: Tensor | None = None) -> Tensor:
        batch_shape = x.shape[: x.dim() - len(self.image_shape)]
        x = self.channels_first(x.reshape(-1, *self.image_shape)) / 255.0
        x = self.convs(x.contiguous(memory_format=torch.channels_last))
        if vector is not None:
            x = torch.cat([x, vector.reshape(len(x), -1)], -1)
        return self.linear(x).reshape(*batch_shape, -1)


class Core(nn.Module):
    """The part with memory: an encoder (a linear layer with tanh, or the Nature CNN for images),
    then the recurrent cell."""

    def __init__(self, observation_space: gym.Space, layout: str | None, args: Args):
        super().__init__()
        # an image and a vector (common.envs.image_and_vector)
        parts = isinstance(observation_space, gym.spaces.Dict)
        image_space = observation_space["image"] if parts else observation_space
        vector_size = int(np.prod(observation_space["vector"].shape)) if parts else 0
        if layout is not None:  # ppo_atari_lstm.py's: the CNN's 512 features feed the cell
            self.encoder = NatureCNN(image_space, layout, vector_size)
            encoder_size = 512
        else:
            observation_size = int(np.prod(image_space.shape)) + vector_size
            linear = layer_init(nn.Linear(observation_size, args.hidden_size))
            self.encoder = nn.Sequential(linear, nn.Tanh())
            encoder_size = args.hidden_size
        cell = nn.LSTM if args.rnn_type == "lstm" else nn.GRU
        self.rnn = cell(encoder_size, args.rnn_hidden_size, args.rnn_layers)
        for name, parameter in self.rnn.named_parameters():  # CleanRL's initialisation
            if name.startswith("bias"):
                nn.init.constant_(parameter, 0)
            else:
                nn.init.orthogonal_(parameter, 1.0)

    @property
    def state_size(self) -> int:
        """An LSTM's state is its hidden and cell states side by side; a GRU's is its hidden state."""
        return self.rnn.hidden_size * (2 if isinstance(self.rnn, nn.LSTM) else 1)

    def forward(
        self, x: Tensor, state: Tensor, segments: Segments | None
    ) -> tuple[Tensor, Tensor | None]:
        """The cell's output along `x` (T, B, obs...) cut into `segments`, each piece from its own
        `state` (layers, pieces, state size); for one step (`segments` None, `state` (layers, B,
        state size)) also the state after it."""
        features = self.encoder(x["image"], x["vector"]) if isinstance(x, dict) else self.encoder(x)
        if segments is None:
            output, next_state = self.rnn(features, self.cell_state(state))
            return output, self.flat_state(next_state)
        output, _ = self.rnn(segments.pad(features), self.cell_state(state))
        return segments.unpad(output), None

    def cell_state(self, state: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        if isinstance(self.rnn, nn.LSTM):
            hidden, cell = state.chunk(2, -1)
            return hidden.contiguous(), cell.contiguous()
        return state.contiguous()

    @staticmethod
    def flat_state(state: Tensor | tuple[Tensor, Tensor]) -> Tensor:
        return torch.cat(state, -1) if isinstance(state, tuple) else state


class AgentOutput(NamedTuple):
    """What `Agent.forward` gives, taken by name where it is called: an auxiliary output (a
    prediction head, say) is one more field here, given in `forward`."""

    actor_out: Tensor
    value: Tensor
    state: Tensor | None
    """the state after the step (one step alone: T = 1), else None"""


class Agent(nn.Module):
    def __init__(self, observation_space: gym.Space, action_space: gym.Space, args: Args):
        super().__init__()
        self.action_space = action_space
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.action_size = (
            int(action_space.n) if self.discrete else int(np.prod(action_space.shape))
        )
        # An image goes to the CNN as it is; a vector, or an image taken as one (--encoder mlp),
        # flat and normalised. A Dict observation is an image and a vector
        # (common.envs.image_and_vector): the vector, normalised, joins the image's CNN features
        # (or, with --encoder mlp, its flattened pixels).
        self.parts = isinstance(observation_space, gym.spaces.Dict)
        image_space = observation_space["image"] if self.parts else observation_space
        vector_size = int(np.prod(observation_space["vector"].shape)) if self.parts else 0
        layout = cnn_layout(image_space, args.encoder)
        self.cnn = layout is not None
        self.flatten = nn.Identity() if layout else nn.Flatten(start_dim=2)  # after the (T, B) axes
        normalised_size = vector_size if layout else int(np.prod(image_space.shape)) + vector_size
        self.obs_norm = (
            RunningNorm(normalised_size) if args.norm_obs and normalised_size else nn.Identity()
        )
        self.core = Core(observation_space, layout, args)
        self.critic_core = None if args.shared_core else Core(observation_space, layout, args)
        # logits or mean
        self.actor = layer_init(nn.Linear(self.core.rnn.hidden_size, self.action_size), std=0.01)
        self.critic = layer_init(nn.Linear(self.cores()[-1].rnn.hidden_size, 1), std=1.0)
        if not self.discrete:
            self.actor_logstd = nn.Parameter(torch.zeros(1, self.action_size))

    @property
    def state_size(self) -> int:
        """The state's size per layer: each core's, side by side (read from the cells: an edit of a
        cell's size or layers is followed)."""
        return sum(core.state_size for core in self.cores())

    @property
    def rnn_layers(self) -> int:
        return self.core.rnn.num_layers

    def cores(self) -> list[Core]:
        """The actor's core, then the critic's own if any: the state holds theirs side by side."""
        return [self.core] if self.critic_core is None else [self.core, self.critic_core]

    def initial_state(self, batch_size: int) -> Tensor:
        """The state an episode starts from, for `batch_size` envs: zero, (layers, batch, state
        size). Its one definition: the rollout, the update's sequences, bootstrapping and
        evaluation all reset to it through `reset_state` (a learned start is an edit of this alone)."""
        device = next(self.parameters()).device
        return torch.zeros(self.rnn_layers, batch_size, self.state_size, device=device)

    def reset_state(self, state: Tensor, starts: Tensor) -> Tensor:
        """`state` (layers, B, state size) where each env goes on, the initial state where its
        episode `starts` (B,)."""
        return torch.where(starts[None, :, None], self.initial_state(state.shape[1]), state)

    def forward(self, x: Tensor, state: Tensor, episode_starts: Tensor) -> AgentOutput:
        """Along observations `x` (T, B, obs) from `state` (layers, B, state size), the initial
        state wherever `episode_starts` (T, B): the actor's output and the value at each step; for
        one step (T = 1) also the state after it."""
        if self.parts and self.cnn:
            x = {"image": x["image"], "vector": self.obs_norm(x["vector"])}
        else:
            x = self.obs_norm(self.normalised_part(x))
        state = self.reset_state(state, episode_starts[0])
        segments = Segments(episode_starts) if len(episode_starts) > 1 else None
        if segments is not None:  # each piece's: the sequence's state, or an episode's start
            state = segments.initial_state(state, self.initial_state(segments.num_pieces))
        actor_hidden, next_state = self.core(x, state[..., : self.core.state_size], segments)
        critic_hidden = actor_hidden
        if self.critic_core is not None:
            critic_hidden, critic_state = self.critic_core(
                x, state[..., self.core.state_size :], segments
            )
            next_state = torch.cat([next_state, critic_state], -1) if segments is None else None
        return AgentOutput(
            self.actor(actor_hidden), self.critic(critic_hidden).squeeze(-1), next_state
        )

    def update_obs_norm(self, x: Tensor | dict[str, Tensor]) -> None:
        """With --norm-obs (never of an image through the CNN): the running statistics take in the
        batch of observations `x` of every rank."""
        if isinstance(self.obs_norm, RunningNorm):
            self.obs_norm.update(self.normalised_part(x))

    def normalised_part(self, x: Tensor | dict[str, Tensor]) -> Tensor:
        """What `obs_norm` normalises: a Dict's vector with the CNN, else the observation flat (an
        image as it is for the CNN, its pixels flattened with --encoder mlp, then a Dict's vector).
        """
        if not self.parts:
            return self.flatten(x.float())
        if self.cnn:
            return x["vector"]
        return torch.cat([self.flatten(x["image"].float()), x["vector"]], -1)

    @torch.no_grad()
    def bootstrap_value(
        self, obs: np.ndarray | dict, state: np.ndarray, starts: np.ndarray | None = None
    ) -> np.ndarray:
        """The values of a batch of observations, each one step on from its `state`, or from the
        initial state where its episode `starts` (none where not given)."""
        device = next(self.parameters()).device
        x = observation_tensor(obs, device)[None]
        state = torch.as_tensor(state, device=device)
        if starts is None:
            starts = np.zeros(state.shape[1], dtype=bool)
        return self(x, state, torch.as_tensor(starts, device=device)[None]).value[0].cpu().numpy()

    def distribution(self, actor_out: Tensor) -> Categorical | Normal:
        """The policy given the actor's output: its one definition, used by the rollout, the update
        and evaluation."""
        if self.discrete:
            # validating costs more than the network
            return Categorical(logits=actor_out, validate_args=False)
        return Normal(actor_out, self.actor_logstd.expand_as(actor_out).exp(), validate_args=False)

    def log_prob_and_entropy(self, actor_out: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """The log-probability of `action` and the policy's entropy given the actor's output."""
        policy = self.distribution(actor_out)
        if self.discrete:
            return policy.log_prob(action), policy.entropy()
        # independent dimensions add up
        return policy.log_prob(action).sum(-1), policy.entropy().sum(-1)

    def sampling_noise(self, batch_shape: tuple[int, ...]) -> Tensor:
        """The randomness of `sample` for a batch of observations (a rollout draws all of its steps'
        at once)."""
        noise = torch.empty((*batch_shape, self.action_size), device=next(self.parameters()).device)
        if self.discrete:
            return noise.exponential_().log_().neg_()  # -log(Exp(1)) is Gumbel noise
        return noise.normal_()

    def env_action(self, action: np.ndarray) -> np.ndarray:
        """The env's form of actions: offset by `start` (Discrete), or shaped and clipped to the
        bounds (Box; the log-probability stays the unclipped sample's, as CleanRL's ClipAction)."""
        space = self.action_space
        if self.discrete:
            return action + int(space.start) if space.start else action
        return np.clip(action.reshape(len(action), *space.shape), space.low, space.high)

    @staticmethod
    def sample(policy: Categorical | Normal, noise: Tensor) -> Tensor:
        """A draw from `policy` made from `sampling_noise`: the Gumbel-max trick, or mean + std *
        noise."""
        if isinstance(policy, Categorical):
            return torch.argmax(policy.logits + noise, -1)
        if isinstance(policy, Normal):
            return policy.mean + policy.stddev * noise
        raise NotImplementedError(
            f"Agent.sample cannot draw from a {type(policy).__name__}: write its draw"
        )


def train(args: Args) -> TrainResult:
    # checks, torchrun, the checkpoint --resume continues (args become its settings), seeds, device
    run = Run(args, SCRIPT, make_env, check_args)
    args, device, world_size = run.args, run.device, run.world_size
    global_batch_size = args.num_envs * args.num_steps * world_size  # over all processes
    num_iterations = args.total_timesteps // global_batch_size
    norm_adv = args.norm_adv and global_batch_size > args.num_minibatches  # one step has no std

    agent = build_agent(run)
    # fused: one kernel for every parameter, a fifth of the update time for a network this small
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    # what a checkpoint carries, by key: restored on --resume; rank 0's on every rank under torchrun
    next_obs = run.start({"model": agent, "optimizer": optimizer}, global_batch_size)
    global_step = run.global_step
    next_starts = np.ones(args.num_envs, dtype=bool)
    # a copy: the loop writes into it, and a learned initial state's array is its parameter's memory
    next_rnn_state = agent.initial_state(args.num_envs).detach().cpu().numpy().copy()
    # the loop's state across steps, updated in place: checkpoints save it, and resume restores it
    carried = run.carry({"episode_starts": next_starts, "rnn_state": next_rnn_state})

    # Rollout storage in NumPy, filled without conversions; images stay uint8 until the network.
    action_shape = () if agent.discrete else (agent.action_size,)
    action_dtype = np.int64 if agent.discrete else np.float32
    obs = observation_zeros(run.envs.single_observation_space, args.num_steps, args.num_envs)
    actions = np.zeros((args.num_steps, args.num_envs, *action_shape), dtype=action_dtype)
    rewards = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    terminations, truncations, episode_starts = np.zeros((3, *rewards.shape), dtype=bool)
    # where an episode was truncated: the value of its last observation
    final_values = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    # the state each step acted from (an episode's start state): training sequences start there
    rnn_states = np.zeros((args.num_steps, *next_rnn_state.shape), dtype=np.float32)
    sequences = TrainingSequences(args.num_steps, args.num_envs, args.bptt_len, device)
    max_reward = args.norm_reward_clip

    with run:  # after a Ctrl-C, the run stops at the end of this block with status 130
        for iteration in range(run.iterations_done + 1, num_iterations + 1):
            if args.anneal_lr:
                frac = (iteration - 1.0) / num_iterations
                lrnow = (1.0 - frac) * args.learning_rate + frac * args.end_learning_rate
                optimizer.param_groups[0]["lr"] = lrnow

            # The rollout acts in eval mode; log-probs and values come after it, in one torch pass.
            agent.eval()
            b_noise = agent.sampling_noise((args.num_steps, args.num_envs))  # (steps, envs, ...)
            noise = b_noise.cpu().numpy()
            # the state an episode starts from, as the rollout records it (a learned one moves)
            start_state = agent.initial_state(args.num_envs).detach().cpu().numpy()
            first = (next_obs, next_rnn_state, next_starts, noise[0])
            act = rollout_policy(agent, args.numpy_rollout, first, (obs, episode_starts, noise))
            for step in range(args.num_steps):
                global_step += args.num_envs * world_size
                obs[step] = next_obs
                episode_starts[step] = next_starts
                rnn_states[step] = np.where(next_starts[None, :, None], start_state, next_rnn_state)
                actions[step], next_rnn_state[...] = act(
                    obs[step], next_rnn_state, next_starts, noise[step]
                )
                sent_action = agent.env_action(actions[step])
                next_obs, reward, terminated, truncated, infos = run.envs.step(sent_action)
                terminations[step], truncations[step] = terminated, truncated
                # clipped here, not by a wrapper: the recorder scales the env's own reward back
                rewards[step] = reward.clip(-max_reward, max_reward) if args.norm_reward else reward
                run.step(sent_action, next_obs, reward, terminated, truncated, infos, global_step)
                # truncated episodes bootstrap from their last observation's value, seen with memory
                truncated_only = truncated & ~terminated
                if args.bootstrap_truncation and truncated_only.any():
                    last = (infos["final_obs"][truncated_only], next_rnn_state[:, truncated_only])
                    final_values[step, truncated_only] = agent.bootstrap_value(*last)
                next_starts[...] = terminated | truncated
            run.combine_return_stats()  # all ranks go on from the return statistics of all envs

            # The batch, (num_steps, num_envs, ...): log-probs and values from one pass along it.
            with torch.no_grad():
                b_obs = observation_tensor(obs, device)
                b_starts = torch.as_tensor(episode_starts, device=device)
                b_actions = torch.as_tensor(actions, device=device)
                b_rnn_states = torch.as_tensor(rnn_states, device=device)
                rollout_pass = agent(b_obs, b_rnn_states[0], b_starts)
                b_actor_outs, b_values = rollout_pass.actor_out, rollout_pass.value
                b_logprobs = check_policy(b_actor_outs, b_noise, b_actions, agent, act)
                next_value = agent.bootstrap_value(next_obs, next_rnn_state, next_starts)
                advantages = compute_gae(
                    rewards, b_values.cpu().numpy(), next_value, terminations, truncations,
                    final_values, args.gamma, args.gae_lambda,
                )  # fmt: skip
                b_advantages = torch.as_tensor(advantages, device=device)
                b_returns = b_advantages + b_values
            sampled = {} if agent.discrete else {"actions": actions}  # the unclipped sample
            states = rnn_states.swapaxes(1, 2)  # (num_steps, num_envs, layers, state size)
            run.end_rollout(logprobs=b_logprobs, values=b_values, hidden_state=states, **sampled)

            agent.train()
            ratios = []
            for epoch in range(args.update_epochs):
                order = torch.randperm(sequences.count, device=device)
                minibatches = order.view(args.num_minibatches, -1)
                if norm_adv:  # every global minibatch's mean and std: the epoch's in one all-reduce
                    by_minibatch = b_advantages[sequences.index(minibatches)].transpose(0, 1)
                    adv_means, adv_stds = run.mean_std_over_ranks(by_minibatch)
                for i, mb in enumerate(minibatches):
                    mb_inds = sequences.index(mb)  # its sequences' steps, (length, sequences)
                    mb_initial_state = sequences.initial_state(b_rnn_states, mb)
                    mb_sequences = (b_obs[mb_inds], mb_initial_state, b_starts[mb_inds])
                    output = agent(*mb_sequences)
                    actor_out, newvalue = output.actor_out, output.value
                    if epoch == 0 and i == 0:  # no step yet: this pass replays the rollout's
                        recorded = (b_actor_outs[mb_inds], b_values[mb_inds])
                        in_eval = partial(eval_pass, agent, act.buffers, *mb_sequences)
                        check_replay(mb_sequences, recorded, (actor_out, newvalue), in_eval)
                    newlogprob, entropy = agent.log_prob_and_entropy(actor_out, b_actions[mb_inds])
                    logratio = newlogprob - b_logprobs[mb_inds]
                    ratio = logratio.exp()
                    ratios.append(ratio.detach())

                    mb_advantages = b_advantages[mb_inds]
                    if norm_adv:
                        mb_advantages = (mb_advantages - adv_means[i]) / (adv_stds[i] + 1e-8)

                    pg_loss1 = -mb_advantages * ratio
                    pg_loss2 = -mb_advantages * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)
                    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                    if args.clip_vloss:
                        v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                        v_clipped = b_values[mb_inds] + torch.clamp(
                            newvalue - b_values[mb_inds], -args.clip_coef, args.clip_coef
                        )
                        v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                    else:
                        v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                    entropy_loss = entropy.mean()
                    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    run.average_gradients(agent.parameters())  # the global minibatch's
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm, foreach=True)
                    optimizer.step()

                with torch.no_grad():  # of the epoch's last minibatch, as CleanRL logs them
                    old_approx_kl = (-logratio).mean()  # http://joschu.net/blog/kl-approx.html
                    approx_kl = ((ratio - 1) - logratio).mean()
                if args.target_kl is not None:  # the global minibatch's KL: every rank stops alike
                    kls = run.mean_over_ranks(torch.stack([old_approx_kl, approx_kl]))
                    old_approx_kl, approx_kl = kls
                    if approx_kl > args.target_kl:
                        break
            losses = {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy_loss}
            run.check_finite(agent, global_step, PAGE, **losses)
            # after the update, which used the rollout's statistics (taken in the sequences' order)
            agent.update_obs_norm(b_obs[sequences.index()])

            clipfrac = ((torch.cat(ratios, 1) - 1.0).abs() > args.clip_coef).float().mean()
            y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
            var_y = np.var(y_true)
            explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y
            run.log.iteration(global_step, {
                "charts/learning_rate": optimizer.param_groups[0]["lr"],
                "losses/value_loss": v_loss.item(), "losses/policy_loss": pg_loss.item(),
                "losses/entropy": entropy_loss.item(), "losses/clipfrac": clipfrac.item(),
                "losses/old_approx_kl": old_approx_kl.item(), "losses/approx_kl": approx_kl.item(),
                "losses/explained_variance": float(explained_var),
            })  # fmt: skip
            if run.iteration_done(iteration, global_step, **carried):  # a checkpoint if due; Ctrl-C
                break
        run.end()
    eval_returns = evaluate(agent, run)  # rank 0 alone
    return run.finish(agent, eval_returns)


def compute_gae(
    rewards: np.ndarray, values: np.ndarray, next_value: np.ndarray, terminations: np.ndarray,
    truncations: np.ndarray, final_values: np.ndarray, gamma: float, gae_lambda: float,
) -> np.ndarray:  # fmt: skip
    """GAE for a (num_steps, num_envs) rollout in NumPy (cheaper than torch for its small steps): an
    episode end stops the recursion; a truncated step bootstraps from `final_values`."""
    # The flags at t are those that step t returned: CleanRL's dones[t + 1].
    nextnonterminal = 1.0 - (terminations | truncations).astype(values.dtype)
    # final_values elsewhere is not read
    bootstrap = np.where(truncations & ~terminations, final_values, 0.0)
    following_values = np.concatenate([values[1:], next_value[None]])
    deltas = rewards + gamma * (following_values * nextnonterminal + bootstrap) - values
    advantages = np.zeros_like(deltas)
    lastgaelam = np.zeros_like(next_value)
    for t in reversed(range(len(deltas))):
        advantages[t] = lastgaelam = (
            deltas[t] + gamma * gae_lambda * nextnonterminal[t] * lastgaelam
        )
    return advantages


# What train() calls, for a second reading: argument checks, the agent, the rollout's stand-in for
# the policy and its checks, the update's sequences, evaluation.


def check_args(args: Args) -> None:
    """Reject bad settings (ValueError) before anything is built or written."""
    positive = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs")
    positive += ("hidden_size", "video_every", "sampling_k", "temperature", "learning_rate")
    positive += ("clip_coef", "max_grad_norm", "rnn_hidden_size", "rnn_layers")
    non_negative = ("seed", "eval_episodes", "checkpoint_every", "torch_threads")
    non_negative += ("checkpoint_minutes", "end_learning_rate", "bptt_len")
    cli.check_ranges(
        args, (*positive, "target_kl", "norm_reward_clip"), non_negative, ("gamma", "gae_lambda")
    )
    if args.bptt_len and args.num_steps % args.bptt_len:
        raise ValueError(f"--bptt-len {args.bptt_len} must divide --num-steps {args.num_steps}")
    num_sequences = args.num_envs * (args.num_steps // args.bptt_len if args.bptt_len else 1)
    if num_sequences % args.num_minibatches:
        what = "--num-envs (whole-rollout sequences)"
        if args.bptt_len:
            what = "--num-envs x --num-steps / --bptt-len"
        raise ValueError(
            f"--num-minibatches {args.num_minibatches} must divide the number of training sequences, {what} = "
            f"{num_sequences}"
        )
    batch_size = args.num_envs * args.num_steps * int(os.environ.get("WORLD_SIZE", 1))  # torchrun's
    if args.total_timesteps < batch_size:
        raise ValueError(
            f"--total-timesteps {args.total_timesteps} is less than one batch ({batch_size} steps)"
        )


def build_agent(run: Run) -> Agent:
    """The agent for the run's env and settings, on its device (a checkpoint's weights come later)."""
    return Agent(run.observation_space, run.action_space, run.args).to(run.device)


def rollout_policy(
    agent: Agent,
    numpy_rollout: bool,
    first: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    stored: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> rollout_checks.Acting:
    """One step of `Agent.sample(Agent.distribution(.), noise)` and the state update, on NumPy
    arrays, as the rollout calls it: (observations, state, episode starts, noise) -> (actions, state
    after the step). A NumPy copy (with `numpy_rollout`: recorded from the torch step and checked
    against it on the rollout's `first` inputs) or the torch step. It keeps what it was given and
    gave, for the check after the rollout against what the loop `stored`: its observations,
    episode starts and noise, (steps, envs, ...) (it stores the state after resetting it)."""
    device = next(agent.parameters()).device
    as_tensor = partial(torch.as_tensor, device=device)

    @torch.no_grad()
    def policy_step(obs: Tensor, state: Tensor, starts: Tensor, noise: Tensor):
        output = agent(obs[None], state, starts[None])
        return agent.sample(agent.distribution(output.actor_out[0]), noise), output.state

    def torch_step(obs: np.ndarray, state: np.ndarray, starts: np.ndarray, noise: np.ndarray):
        x = observation_tensor(obs, device)
        action, next_state = policy_step(x, as_tensor(state), as_tensor(starts), as_tensor(noise))
        return action.cpu().numpy(), next_state.cpu().numpy()

    def update_pass(obs: np.ndarray, state: np.ndarray, starts: np.ndarray, noise: np.ndarray):
        x = observation_tensor(obs, device)  # the update's pass, for one step
        return agent(x[None], as_tensor(state), as_tensor(starts)[None]).actor_out[0]

    act = torch_step
    # Images act through the torch policy: a NumPy copy of a CNN would not be faster.
    if numpy_rollout and not agent.cnn and not agent.parts:
        act = numpy_copy(policy_step, first, agent) or torch_step
    names = ("obs[step]", "next_rnn_state", "next_starts", "noise[step]")
    keeps = (stored[0], None, *stored[1:])  # not the state: the loop stores it after its reset
    start_state = (
        "define it in Agent.initial_state alone, which Agent.reset_state and Segments read"
    )
    return rollout_checks.Acting(
        act, torch_step, act is not torch_step, agent, update_pass, names, keeps, PAGE,
        action_of=lambda output: output[0], starts=2, start_state=start_state,
    )  # fmt: skip


def check_policy(
    actor_outs: Tensor, noise: Tensor, actions: Tensor, agent: Agent, act: rollout_checks.Acting
) -> Tensor:
    """The log-probabilities of the rollout's `actions` under `Agent.distribution` at the torch
    policy's `actor_outs`, after checking that the loop acted through `act` as it stored and that
    the actions are the policy's draws with `noise`; where they are not, `act` says why."""
    act.check(agent, actions)
    policy = agent.distribution(actor_outs.flatten(0, 1))
    flat_actions, noise = actions.flatten(0, 1), noise.flatten(0, 1)
    explain = partial(act.explain, actor_outs.flatten(0, 1))
    sampled = agent.sample(policy, noise)
    rollout_checks.check_actions(flat_actions, policy, sampled, noise, explain, section=act.section)
    return agent.log_prob_and_entropy(actor_outs, actions)[0]


def check_replay(
    sequences: tuple[Tensor, Tensor, Tensor],
    recorded: tuple[Tensor, Tensor],
    replayed: tuple[Tensor, Tensor],
    eval_replay: Callable[[], tuple[Tensor, Tensor]],
) -> None:
    """Before the first gradient step: stop unless the update's pass along training `sequences`
    (observations, their recorded initial state, episode starts) gives the `recorded` actor outputs
    and values of the rollout's pass, to float32 rounding (docs/ppo_lstm.md, "Update"); where it
    does not, `eval_replay` decides: the same pass in eval mode, as the rollout acted."""
    initial_state, episode_starts = sequences[1:]

    def where(index: int) -> str:
        step, sequence = divmod(index, episode_starts.shape[1])
        starts = episode_starts[: step + 1, sequence].nonzero()
        if len(starts):
            return f"{step - int(starts[-1])} steps after an episode start"
        norm = initial_state[:, sequence].norm().item()
        return f"{step} steps after a recorded state of norm {norm:.3g}"

    why = (
        "the update's pass differs from the rollout's: each training sequence must start from the "
        "state recorded in the rollout and reset it where an episode starts, to Agent.initial_state "
        f'(read by Segments.initial_state and Agent.reset_state; {PAGE}, "When a check stops a run")'
    )
    rollout_checks.check_replay(recorded, replayed, why, where, eval_replay)


@torch.no_grad()
def eval_pass(agent: Agent, buffers: dict[str, Tensor], *inputs: Tensor) -> tuple[Tensor, Tensor]:
    """The actor outputs and values of `agent` in eval mode, with the `buffers` (batch norm's
    statistics) it had then: as the rollout acted."""
    agent.eval()
    output = torch.func.functional_call(agent, buffers, inputs)
    agent.train()
    return output.actor_out, output.value


class TrainingSequences:
    """The rollout (num_steps, num_envs, ...) cut into the update's sequences: whole env rollouts,
    or with --bptt-len L, L-step chunks. Sequence j is the steps `starts[j]` + (0 .. `length` - 1)
    of env `envs[j]`."""

    def __init__(self, num_steps: int, num_envs: int, bptt_len: int, device: torch.device):
        self.length = bptt_len or num_steps
        chunks = num_steps // self.length
        self.envs = torch.arange(num_envs, device=device).repeat_interleave(chunks)
        self.starts = torch.arange(0, num_steps, self.length, device=device).repeat(num_envs)
        self.steps = self.starts + torch.arange(self.length, device=device)[:, None]
        self.count = len(self.starts)

    def index(self, which: Tensor | slice = slice(None)) -> tuple[Tensor, Tensor]:
        """Where the sequences `which` lie in a tensor (num_steps, num_envs, ...): indexed by it, it
        gives them side by side, (length, *which's shape, ...)."""
        return self.steps[:, which], self.envs[which]

    def initial_state(self, states: Tensor, which: Tensor) -> Tensor:
        """The states recorded (num_steps, layers, num_envs, S) at the starts of the sequences
        `which`: (layers, len(which), S)."""
        return states[self.starts[which], :, self.envs[which]].transpose(0, 1)


class Segments:
    """The pieces of sequences (T, B) between episode starts, side by side and padded at their ends,
    for one fused call of the cell over all of them, from the initial state at each episode start
    (docs/ppo_lstm.md, "Update")."""

    def __init__(self, episode_starts: Tensor):
        num_steps, num_sequences = episode_starts.shape
        boundaries = episode_starts.clone()
        boundaries[0] = True  # every sequence's first piece starts from the state given for it
        flat = boundaries.T.reshape(-1)  # sequence by sequence: position b * T + t
        first_positions = flat.nonzero().squeeze(-1)
        self.piece = flat.cumsum(0) - 1  # of each position
        self.offset = torch.arange(len(flat), device=flat.device) - first_positions[self.piece]
        pieces = boundaries.sum(0)
        self.first_pieces = pieces.cumsum(0) - pieces  # each sequence's first
        self.num_pieces = len(first_positions)
        self.max_length = int(self.offset.max()) + 1
        self.shape = (num_steps, num_sequences)

    def pad(self, x: Tensor) -> Tensor:
        """`x` (T, B, F) as pieces side by side, (longest piece, pieces, F), zero after each piece's
        end."""
        padded = x.new_zeros(self.max_length, self.num_pieces, x.shape[-1])
        padded[self.offset, self.piece] = x.transpose(0, 1).reshape(-1, x.shape[-1])
        return padded

    def unpad(self, padded: Tensor) -> Tensor:
        """The pieces' outputs back in place, (T, B, F)."""
        num_steps, num_sequences = self.shape
        return padded[self.offset, self.piece].reshape(num_sequences, num_steps, -1).transpose(0, 1)

    def initial_state(self, state: Tensor, episode_start: Tensor) -> Tensor:
        """Each piece's first state: `state` (layers, B, S) for each sequence's first piece, and for
        the rest, which start episodes, theirs in `episode_start` (layers, pieces, S)."""
        return episode_start.index_copy(1, self.first_pieces, state)


def evaluate(agent: Agent, run: Run, record_to: Path | None = None) -> list[float]:
    """Play --eval-episodes episodes, actions by --sampling-method, each recorded with the hidden
    state it came from; log them at the run's step and return their returns (`Run.evaluate`)."""
    device = run.device
    state = agent.initial_state(1)

    @torch.inference_mode()
    def act(obs: np.ndarray, episode_starts: np.ndarray) -> tuple[np.ndarray, dict]:
        nonlocal state
        obs_tensor = observation_tensor(obs, device)[None]
        starts = torch.as_tensor(episode_starts, device=device)[None]
        acted_from = agent.reset_state(state, starts[0])
        output = agent(obs_tensor, state, starts)
        state = output.state
        action = run.select_action(agent.distribution(output.actor_out[0]))
        fields = {"policy": {"hidden_state": acted_from.transpose(0, 1).cpu().numpy()}}
        return agent.env_action(action.cpu().numpy()), fields

    return run.evaluate(agent, act, record_to=record_to)


def evaluate_checkpoint(args: Args) -> list[float]:
    """Rebuild the agent from a checkpoint alone, evaluate it, print mean and std of the return."""
    run = Run(args, SCRIPT, make_env, check_args)  # the checkpoint's run
    agent = build_agent(run)
    return run.evaluate_checkpoint(agent, lambda record_to: evaluate(agent, run, record_to))


def main() -> int:
    """The command line: --eval-checkpoint evaluates, else `train`; the exit status."""
    return cli.main(Args, train, evaluate_checkpoint)


if __name__ == "__main__":
    sys.exit(main())
