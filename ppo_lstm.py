"""Recurrent PPO: an MLP encoder, an LSTM or GRU, then actor and critic heads, for discrete and continuous actions.
After CleanRL's ppo_atari_lstm.py. Read top to bottom: arguments, environments, network, then ``train()``: rollout
(the hidden state carried from step to step and from rollout to rollout, zero where an episode starts), GAE, the
training sequences (whole env rollouts, or ``--bptt-len`` chunks, each from the state recorded in the rollout),
minibatch updates, Adam with a linear LR decay. Run plumbing is in ``common/``."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from gymnasium.vector import VectorEnv, VectorWrapper
from torch import Tensor
from torch.distributions import Categorical, Normal
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

import probe_envs  # noqa: F401  (registers the probe ids with gymnasium)
from common import checkpoints, env_state, stand_in
from common.cli import check_ranges, exit_status, notice, parse_args
from common.envs import env_action, env_spaces, flat_observations, resolve_env_id, vector_env
from common.errors import PolicyMismatch, TrainingDiverged, UsageError
from common.evaluation import play_episodes
from common.interrupt import GracefulInterrupt
from common.resident_memory import rss_mb
from common.run_folder import create_run_folder, run_name
from common.running_norm import RunningNorm
from common.seeding import restore_rng_state, seed_and_pick_device
from common.tracking import EpisodeLog, finish_tracking, log_episodes, start_tracking, upload_videos
from common.train_result import TrainResult
from common.trajectories import TrajectoryWriter, unused_npz_path

SCRIPT = Path(__file__).stem
CHECKPOINT_FORMAT = 2  # 2: the envs' places in their episodes and the recurrent state there ("episodes")
CHECKPOINT_KEYS = ("model", "optimizer", "iteration", "reward_rms", "episodes")
# The settings the command line decides with --resume and with --eval-checkpoint; the rest come from the checkpoint.
RUN_TIME_FLAGS = ("resume", "cuda", "torch_threads", "progress", "track", "numpy_rollout")
EVALUATION_FLAGS = ("eval_checkpoint", "seed", "eval_episodes", "sampling_method", "temperature", "sampling_k")
EVALUATION_FLAGS += ("run_dir", "cuda", "torch_threads", "save_trajectories")


@dataclass
class Args:
    """Recurrent PPO (LSTM or GRU) for discrete and continuous actions, with CleanRL's flags and defaults."""

    exp_name: str = SCRIPT
    """the name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment (torch, numpy, python and the envs)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, use a GPU when one is available"""
    torch_threads: int = 1
    """CPU threads for torch and NumPy's BLAS (0 keeps their defaults); one thread is fastest for small networks"""
    track: bool = False
    """if toggled, track the run with Weights and Biases (works with WANDB_MODE=offline)"""
    wandb_project_name: str = "onefile-rl"
    """the wandb project name"""
    wandb_entity: str | None = None
    """the wandb entity (team or user)"""
    capture_video: bool = False
    """if toggled, record videos of env 0 into `{run_dir}/{run_name}/videos`"""
    video_every: int = 50
    """with --capture-video, record one episode of env 0 in every this many"""
    run_dir: str = "runs"
    """the folder holding every run's folder (TensorBoard logs, checkpoints, videos)"""
    progress: bool = True
    """if toggled, show a progress bar with the step count, SPS and the mean return of recent episodes"""
    numpy_rollout: bool = True
    """if toggled, the rollout acts through a NumPy copy of the policy and its recurrent cell (faster on a CPU; checked against the torch policy after every rollout); off: a torch call per step"""
    save_model: bool = True
    """if toggled, write a checkpoint at the end of training (and on Ctrl-C)"""
    checkpoint_every: int = 0
    """write a checkpoint every this many iterations (0: only at the end, when --save-model)"""
    resume: str | None = None
    """continue the run of this checkpoint: its settings, run folder, step count and schedule"""
    eval_checkpoint: str | None = None
    """evaluate the agent of this checkpoint for --eval-episodes episodes, then exit"""
    eval_episodes: int = 10
    """episodes of evaluation after training, actions drawn by --sampling-method (greedy: deterministic) (0: none)"""
    sampling_method: Literal["greedy", "basic", "temperature", "topk", "bottomk"] = "greedy"
    """how evaluation (after training, and --eval-checkpoint) draws actions: greedy (argmax / mean), basic (sample), temperature, topk, bottomk"""
    temperature: float = 1.0
    """with --sampling-method temperature: divides the logits (discrete) or multiplies the std (continuous)"""
    sampling_k: int = 2
    """with --sampling-method topk / bottomk: sample among this many most / least likely actions (discrete only)"""
    save_trajectories: str | None = None
    """record the training rollouts (or, with --eval-checkpoint, the evaluation episodes) to this .npz file (an existing file is never overwritten: a free name _2, _3, ... is taken)"""
    env_id: str = "CartPole-v1"
    """the id of the gymnasium environment (ids of installed packages such as popgym and MiniGrid work as written; `module:Env-v0` imports `module` first)"""
    total_timesteps: int = 500_000
    """total timesteps of the experiment (rounded down to whole batches of --num-envs x --num-steps)"""
    num_envs: int = 8
    """the number of parallel environments (8, not CleanRL's 4: docs/ppo_lstm.md)"""
    async_envs: bool = False
    """if toggled, run the environments in subprocesses (gymnasium's AsyncVectorEnv)"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    learning_rate: float = 1e-3
    """the learning rate of the optimizer (1e-3, not CleanRL's 2.5e-4, chosen on the memory suite: docs/ppo_lstm.md)"""
    end_learning_rate: float = 0.0
    """with --anneal-lr, the learning rate falls linearly towards this value (CleanRL's schedule: the last iteration uses lr + (end - lr) * (N - 1) / N)"""
    anneal_lr: bool = True
    """toggle learning rate annealing"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 2
    """the number of minibatches (2, not CleanRL's 4, chosen on the memory suite: docs/ppo_lstm.md)"""
    update_epochs: int = 10
    """the K epochs to update the policy (10, not CleanRL's 4, chosen on the memory suite: docs/ppo_lstm.md)"""
    norm_adv: bool = True
    """toggles advantages normalization (per minibatch)"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient (0.1, not CleanRL's 0.2: docs/ppo_lstm.md)"""
    clip_vloss: bool = False
    """toggles whether or not to use a clipped loss for the value function (off, not CleanRL's on: docs/ppo_lstm.md)"""
    ent_coef: float = 0.0
    """coefficient of the entropy (0, not CleanRL's 0.01: docs/ppo_lstm.md)"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold: stop the epochs of an update once it is exceeded"""
    bootstrap_truncation: bool = True
    """if toggled, truncated episodes bootstrap from the value of their last observation"""
    norm_obs: bool = True
    """if toggled, normalise observations with running statistics, kept in the agent and frozen in evaluation (on, not CleanRL's off: docs/ppo_lstm.md)"""
    norm_reward: bool = True
    """if toggled, scale rewards by the running std of the discounted return, gymnasium's NormalizeReward (on: docs/ppo_lstm.md)"""
    norm_reward_clip: float = 10.0
    """with --norm-reward, clip the scaled rewards to [-this, this] (CleanRL's 10)"""
    hidden_size: int = 64
    """width of the encoder: one linear layer with tanh between the observation and the recurrent cell"""
    rnn_type: Literal["lstm", "gru"] = "lstm"
    """the recurrent cell: lstm or gru (on a CPU torch has a fused kernel for the LSTM only: a GRU's update steps through time and took 3-4 times as long on CartPole-v1)"""
    rnn_hidden_size: int = 128
    """the size of the recurrent cell's hidden state"""
    rnn_layers: int = 1
    """the number of stacked recurrent layers"""
    shared_core: bool = True
    """if toggled, the actor and the critic share the encoder and the recurrent cell, each with its own linear head (CleanRL's LSTM PPO); off: the critic has its own encoder and cell of the same shape, as sb3-contrib's enable_critic_lstm, at twice the cell's cost"""
    bptt_len: int = 0
    """0: each minibatch holds whole env rollouts (--num-steps long); L > 0: the rollouts are cut into chunks of L steps, each starting from the hidden state recorded in the rollout, and minibatches mix the chunks (gradients then stop at chunk starts; the cell runs faster, its padded pieces being at most L long)"""


def make_env(env_id: str, idx: int = 0, capture_video: bool = False, video_folder: str = "", video_every: int = 1):
    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(env, video_folder, episode_trigger=lambda n: n % video_every == 0)
        else:
            env = gym.make(env_id)
        return flat_observations(env)  # per env: vector observation wrappers refuse SAME_STEP autoreset

    return thunk


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Segments:
    """The pieces of a batch of sequences (T, B) between episode starts, laid out side by side and padded at their
    ends, for one call of a recurrent cell over all of them: the state is then zero exactly where an episode starts,
    and the cell runs fused over time. (A dense padded batch: torch's packed-sequence path on a CPU runs the cell step
    by step under autograd, about twice as slow here.)"""

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
        self.num_pieces, self.max_length = len(first_positions), int(self.offset.max()) + 1
        self.shape = (num_steps, num_sequences)

    def pad(self, x: Tensor) -> Tensor:
        """`x` (T, B, F) as pieces side by side, (longest piece, pieces, F), zero after each piece's end."""
        padded = x.new_zeros(self.max_length, self.num_pieces, x.shape[-1])
        padded[self.offset, self.piece] = x.transpose(0, 1).reshape(-1, x.shape[-1])
        return padded

    def unpad(self, padded: Tensor) -> Tensor:
        """The pieces' outputs back in place, (T, B, F)."""
        num_steps, num_sequences = self.shape
        return padded[self.offset, self.piece].reshape(num_sequences, num_steps, -1).transpose(0, 1)

    def initial_states(self, state: Tensor) -> Tensor:
        """Each piece's first state: `state` (layers, B, S) for each sequence's first piece, zero for the rest."""
        initial = state.new_zeros(state.shape[0], self.num_pieces, state.shape[-1])
        initial[:, self.first_pieces] = state
        return initial


class Core(nn.Module):
    """The part with memory: an encoder (a linear layer with tanh), then the recurrent cell."""

    def __init__(self, observation_size: int, hidden_size: int, rnn_type: str, rnn_hidden_size: int, layers: int):
        super().__init__()
        self.encoder = nn.Sequential(layer_init(nn.Linear(observation_size, hidden_size)), nn.Tanh())
        self.rnn = (nn.LSTM if rnn_type == "lstm" else nn.GRU)(hidden_size, rnn_hidden_size, layers)
        for name, parameter in self.rnn.named_parameters():  # CleanRL's initialisation
            if name.startswith("bias"):
                nn.init.constant_(parameter, 0)
            else:
                nn.init.orthogonal_(parameter, 1.0)
        # An LSTM's state is its hidden and cell states side by side; a GRU's is its hidden state.
        self.state_size = rnn_hidden_size * (2 if rnn_type == "lstm" else 1)

    def forward(self, x: Tensor, state: Tensor, segments: Segments | None) -> tuple[Tensor, Tensor | None]:
        """The cell's output along `x` (T, B, obs) from `state` (layers, B, state size), cut into `segments`; for one
        step (`segments` None) also the state after it. (Padded pieces do not give their last states.)"""
        features = self.encoder(x)
        if segments is None:
            output, next_state = self.rnn(features, self.cell_state(state))
            return output, self.flat_state(next_state)
        output, _ = self.rnn(segments.pad(features), self.cell_state(segments.initial_states(state)))
        return segments.unpad(output), None

    def cell_state(self, state: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        if isinstance(self.rnn, nn.LSTM):
            hidden, cell = state.chunk(2, -1)
            return hidden.contiguous(), cell.contiguous()
        return state.contiguous()

    @staticmethod
    def flat_state(state: Tensor | tuple[Tensor, Tensor]) -> Tensor:
        return torch.cat(state, -1) if isinstance(state, tuple) else state


class Agent(nn.Module):
    def __init__(self, observation_size: int, action_space: gym.Space, args: Args):
        super().__init__()
        self.action_space = action_space
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.action_size = int(action_space.n) if self.discrete else int(np.prod(action_space.shape))
        self.obs_norm = RunningNorm(observation_size) if args.norm_obs else nn.Identity()
        core = (observation_size, args.hidden_size, args.rnn_type, args.rnn_hidden_size, args.rnn_layers)
        self.core = Core(*core)
        self.critic_core = None if args.shared_core else Core(*core)
        self.state_size = sum(core.state_size for core in self.cores())
        self.rnn_layers = args.rnn_layers
        # The actor's output is the logits (discrete) or the Gaussian mean (continuous).
        self.actor = layer_init(nn.Linear(args.rnn_hidden_size, self.action_size), std=0.01)
        self.critic = layer_init(nn.Linear(args.rnn_hidden_size, 1), std=1.0)
        if not self.discrete:
            self.actor_logstd = nn.Parameter(torch.zeros(1, self.action_size))

    def cores(self) -> list[Core]:
        """The actor's core, then the critic's own if it has one; the state holds theirs side by side."""
        return [self.core] if self.critic_core is None else [self.core, self.critic_core]

    def initial_state(self, batch_size: int) -> Tensor:
        """The state of `batch_size` envs at the start of their episodes: zero, (layers, batch, state size)."""
        device = next(self.parameters()).device
        return torch.zeros(self.rnn_layers, batch_size, self.state_size, device=device)

    def forward(self, x: Tensor, state: Tensor, episode_starts: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """Along sequences of observations `x` (T, B, obs) that start in `state` (layers, B, state size), with the
        state zero wherever `episode_starts` (T, B): the actor's output and the value at each step; for one step
        (T = 1, as the rollout and evaluation call it) also the state after it, else None."""
        x = self.obs_norm(x)
        state = state * ~episode_starts[0, None, :, None]
        segments = Segments(episode_starts) if len(x) > 1 else None
        actor_hidden, next_state = self.core(x, state[..., : self.core.state_size], segments)
        critic_hidden = actor_hidden
        if self.critic_core is not None:
            critic_hidden, critic_state = self.critic_core(x, state[..., self.core.state_size :], segments)
            next_state = torch.cat([next_state, critic_state], -1) if segments is None else None
        return self.actor(actor_hidden), self.critic(critic_hidden).squeeze(-1), next_state

    def distribution(self, actor_out: Tensor) -> Categorical | Normal:
        """The policy given the actor's output: its one definition, used by the rollout, the update and evaluation."""
        if self.discrete:
            return Categorical(logits=actor_out, validate_args=False)  # validating costs more than the network
        return Normal(actor_out, self.actor_logstd.expand_as(actor_out).exp(), validate_args=False)

    def log_prob_and_entropy(self, actor_out: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """The log-probability of `action` and the policy's entropy given the actor's output. For a categorical they
        are written out (cheaper than a Categorical); `check_policy` checks them against `distribution` after every
        rollout."""
        if self.discrete:
            log_probs = actor_out.log_softmax(-1)  # -inf logits (masks) would need Categorical's clamp
            log_prob = log_probs.gather(-1, action[..., None]).squeeze(-1)
            return log_prob, -(log_probs.exp() * log_probs).sum(-1)
        policy = self.distribution(actor_out)  # independent action dimensions: log-probabilities and entropies add up
        return policy.log_prob(action).sum(-1), policy.entropy().sum(-1)

    def sampling_noise(self, batch_shape: tuple[int, ...]) -> Tensor:
        """The randomness of `sample` for a batch of observations. A rollout draws all of its steps' in one call."""
        noise = torch.empty((*batch_shape, self.action_size), device=next(self.parameters()).device)
        if self.discrete:
            return noise.exponential_().log_().neg_()  # -log(Exp(1)) is Gumbel noise
        return noise.normal_()

    @staticmethod
    def sample(policy: Categorical | Normal, noise: Tensor) -> Tensor:
        """A draw from `policy` made from `sampling_noise`: the Gumbel-max trick for a categorical, mean + std * noise
        for a Gaussian (as `rsample` does)."""
        if isinstance(policy, Categorical):
            return torch.argmax(policy.logits + noise, -1)
        return policy.mean + policy.stddev * noise


StepFunction = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
"""A rollout step: (observations, state, episode starts, noise) -> (actions, state after the step)."""


def rollout_policy(agent: Agent, numpy_rollout: bool, obs: np.ndarray) -> tuple[StepFunction, bool]:
    """One step of `Agent.sample(Agent.distribution(.), noise)` with the state update, on NumPy arrays, and whether
    it is a NumPy copy (with `numpy_rollout`, if a copy taken now acts as the torch policy does on `obs`)."""
    device = next(agent.parameters()).device

    @torch.no_grad()
    def torch_step(obs: np.ndarray, state: np.ndarray, starts: np.ndarray, noise: np.ndarray):
        as_tensor = lambda array: torch.as_tensor(array, device=device)  # noqa: E731
        actor_out, _, next_state = agent(as_tensor(obs)[None], as_tensor(state), as_tensor(starts)[None])
        action = agent.sample(agent.distribution(actor_out[0]), as_tensor(noise))
        return action.cpu().numpy(), next_state.cpu().numpy()

    if not numpy_rollout:
        return torch_step, False
    repeated, noise = stand_in.trial_inputs(obs, agent.action_size)  # from a random state: every part of it counts
    state = np.random.default_rng(0).standard_normal((agent.rnn_layers, len(repeated), agent.state_size))
    trial = (repeated, state.astype(np.float32), np.zeros(len(repeated), dtype=bool), noise)
    copy = stand_in.fitting_copy(lambda: numpy_policy_step(agent), torch_step, trial, agent)
    return (copy, True) if copy is not None else (torch_step, False)


def numpy_policy_step(agent: Agent) -> StepFunction:
    """A NumPy copy of one step of the policy and the state update, at the agent's current weights."""
    normalise, actor_out = stand_in.numpy_snapshot(agent.obs_norm), stand_in.numpy_snapshot(agent.actor)
    cores, start = [], 0  # each core's encoder, cell, and part of the state
    for core in agent.cores():
        part, start = slice(start, start + core.state_size), start + core.state_size
        cores.append((stand_in.numpy_snapshot(core.encoder), stand_in.numpy_cell(core.rnn), part))
    std = None if agent.discrete else agent.actor_logstd.detach().exp().cpu().numpy()

    def step(obs: np.ndarray, state: np.ndarray, starts: np.ndarray, noise: np.ndarray):
        x, state = normalise(obs), state * ~starts[None, :, None]
        outputs, next_states = zip(*[cell(encoder(x), state[..., part]) for encoder, cell, part in cores], strict=True)
        out = actor_out(outputs[0])
        return np.argmax(out + noise, -1) if std is None else out + std * noise, np.concatenate(next_states, -1)

    return step


def check_policy(agent: Agent, actor_outs: Tensor, noise: Tensor, actions: Tensor, numpy_copy: bool) -> Tensor:
    """The log-probabilities of the rollout's `actions` under `Agent.distribution` at `actor_outs` (the torch
    policy's outputs along the rollout), after checking that the actions are its draws with `noise` and that the
    update's written-out `log_prob_and_entropy` scores them as the distribution does."""
    policy = agent.distribution(actor_outs.flatten(0, 1))
    flat_actions, noise = actions.flatten(0, 1), noise.flatten(0, 1)
    if agent.discrete:
        stand_in.check_same_actions(flat_actions, agent.sample(policy, noise), numpy_copy, scores=policy.logits + noise)
        stand_in.check_draws(flat_actions, probs=policy.probs)
        log_probs, entropies = policy.log_prob(flat_actions), policy.entropy()
    else:
        stand_in.check_same_actions(flat_actions, agent.sample(policy, noise), numpy_copy, std=policy.stddev)
        stand_in.check_draws(flat_actions, mean=policy.mean, std=policy.stddev)
        log_probs, entropies = policy.log_prob(flat_actions).sum(-1), policy.entropy().sum(-1)
    log_probs, entropies = log_probs.reshape(actor_outs.shape[:2]), entropies.reshape(actor_outs.shape[:2])
    written_out = agent.log_prob_and_entropy(actor_outs, actions)
    stand_in.check_same_values("log-probabilities", written_out[0], log_probs, "log_prob_and_entropy")
    stand_in.check_same_values("entropies", written_out[1], entropies, "log_prob_and_entropy")
    return log_probs


def check_args(args: Args) -> None:
    """Reject bad settings before anything is built or written."""
    positive = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "hidden_size")
    positive += ("video_every", "sampling_k", "temperature", "learning_rate", "clip_coef", "max_grad_norm")
    positive += ("rnn_hidden_size", "rnn_layers")
    non_negative = ("seed", "eval_episodes", "checkpoint_every", "torch_threads", "end_learning_rate", "bptt_len")
    check_ranges(args, (*positive, "target_kl", "norm_reward_clip"), non_negative, ("gamma", "gae_lambda"))
    if args.bptt_len and args.num_steps % args.bptt_len:
        raise UsageError(f"--bptt-len {args.bptt_len} must divide --num-steps {args.num_steps}")
    num_sequences = args.num_envs * (args.num_steps // args.bptt_len if args.bptt_len else 1)
    if num_sequences % args.num_minibatches:
        what = "--num-envs x --num-steps / --bptt-len" if args.bptt_len else "--num-envs (whole-rollout sequences)"
        raise UsageError(
            f"--num-minibatches {args.num_minibatches} must divide the number of training sequences, {what} = "
            f"{num_sequences}"
        )
    batch_size = args.num_envs * args.num_steps
    if args.total_timesteps < batch_size:
        raise UsageError(f"--total-timesteps {args.total_timesteps} is less than one batch ({batch_size} steps)")


def from_checkpoint(path: str, args: Args, kept: tuple[str, ...], strict: bool) -> tuple[Args, dict]:
    """A checkpoint of this script and its run's settings, the `kept` flags from `args` (`strict`: no other differs)."""
    checkpoint = checkpoints.load(path, SCRIPT, CHECKPOINT_FORMAT, CHECKPOINT_KEYS)
    settings = checkpoints.settings(checkpoint, args, kept, strict)
    check_args(settings)
    return settings, checkpoint


def build_agent(args: Args, checkpoint: dict | None, device: torch.device) -> Agent:
    """The agent for `args.env_id`, with the checkpoint's weights if given."""
    observation_space, action_space, render_modes = env_spaces(make_env(resolve_env_id(args.env_id)))
    if args.capture_video and "rgb_array" not in render_modes:
        raise UsageError(f"--capture-video: {args.env_id!r} cannot render to rgb_array frames")
    if not isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box)):
        raise UsageError(f"{args.env_id!r} has a {type(action_space).__name__} action space; use Discrete or Box")
    if args.sampling_method in ("topk", "bottomk") and not isinstance(action_space, gym.spaces.Discrete):
        raise UsageError(f"--sampling-method {args.sampling_method} needs a discrete action space")
    agent = Agent(int(np.prod(observation_space.shape)), action_space, args).to(device)
    if checkpoint is not None:
        try:
            agent.load_state_dict(checkpoint["model"])
        except (RuntimeError, KeyError) as exc:
            raise UsageError(f"the checkpoint does not fit the agent for {args.env_id!r}: {str(exc)[:200]}") from None
    return agent


def make_envs(args: Args, video_folder: str, checkpoint: dict | None) -> tuple[VectorEnv, VectorWrapper | None]:
    """The training envs with episode statistics, and --norm-reward's scaling (also returned on its own)."""
    env_id = resolve_env_id(args.env_id)
    env_fns = [make_env(env_id, i, args.capture_video, video_folder, args.video_every) for i in range(args.num_envs)]
    envs = gym.wrappers.vector.RecordEpisodeStatistics(vector_env(env_fns, args.async_envs))
    if not args.norm_reward:
        return envs, None
    reward_normalizer = gym.wrappers.vector.NormalizeReward(envs, gamma=args.gamma)
    if checkpoint is not None:
        checkpoints.restore_reward_normalizer(reward_normalizer, checkpoint["reward_rms"])
    return reward_normalizer, reward_normalizer


def train(args: Args) -> TrainResult:
    check_args(args)
    args, checkpoint = from_checkpoint(args.resume, args, RUN_TIME_FLAGS, strict=True) if args.resume else (args, None)
    batch_size = args.num_envs * args.num_steps
    sequence_len = args.bptt_len or args.num_steps
    num_sequences = batch_size // sequence_len
    sequences_per_minibatch = num_sequences // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size

    device = seed_and_pick_device(args.seed, args.torch_deterministic, args.torch_threads, args.cuda)
    agent = build_agent(args, checkpoint, device)
    # The fused kernel updates every parameter in one call: a fifth of the update time for a network this small.
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    global_step, start_iteration = 0, 1
    if checkpoint is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
        global_step, start_iteration = int(checkpoint["global_step"]), int(checkpoint["iteration"]) + 1
        run_path = checkpoints.resume_folder(args.resume)
        if start_iteration > num_iterations:
            raise UsageError(f"{args.resume!r} is the end of its run: nothing to resume (see --eval-checkpoint)")
    else:
        run_path = create_run_folder(args.run_dir, run_name(args.env_id, args.exp_name, args.seed))
    writer = start_tracking(run_path, args, purge_step=global_step + 1 if checkpoint is not None else None)
    video_folder = run_path / "videos" / (f"from_step_{global_step}" if global_step else "")  # parts never clash
    envs, reward_normalizer = make_envs(args, str(video_folder), checkpoint)

    # Rollout storage, (num_steps, num_envs, ...): the env's side in NumPy, the agent's side in torch.
    obs_shape = envs.single_observation_space.shape
    action_shape = () if agent.discrete else (agent.action_size,)
    obs = np.zeros((args.num_steps, args.num_envs, *obs_shape), dtype=np.float32)
    final_values = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)  # where an episode was truncated
    rewards = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    terminations, truncations, episode_starts = np.zeros((3, args.num_steps, args.num_envs), dtype=bool)
    actions = np.zeros((args.num_steps, args.num_envs, *action_shape), dtype=np.int64 if agent.discrete else np.float32)
    # The state each step acted from (zero where an episode starts): training sequences start from these.
    states = np.zeros((args.num_steps, *agent.initial_state(args.num_envs).shape), dtype=np.float32)
    trajectory_writer = TrajectoryWriter(args.num_envs, meta={"args": asdict(args)}) if args.save_trajectories else None
    trajectory_path = unused_npz_path(args.save_trajectories)

    # Training sequences: sequence j covers the steps sequence_starts[j] + (0 .. sequence_len - 1) of env
    # sequence_envs[j]; `as_sequences` lays a (num_steps, num_envs, ...) array out as (sequence_len, num_sequences, ...).
    sequence_envs = torch.arange(args.num_envs, device=device).repeat_interleave(args.num_steps // sequence_len)
    sequence_starts = torch.arange(0, args.num_steps, sequence_len, device=device).repeat(args.num_envs)
    time_index = sequence_starts + torch.arange(sequence_len, device=device)[:, None]

    def as_sequences(x: Tensor) -> Tensor:
        return x[time_index, sequence_envs]

    if args.total_timesteps % batch_size:
        notice(f"--total-timesteps is rounded down to whole batches of {batch_size}: {num_iterations * batch_size}")
    if checkpoint is not None:
        restore_rng_state(checkpoint["rng"])  # last, after every module is built: building draws random numbers
    next_obs_np, _ = envs.reset(seed=args.seed + global_step)
    next_starts = np.ones(args.num_envs, dtype=bool)
    rnn_state = agent.initial_state(args.num_envs).cpu().numpy()  # carried from step to step and rollout to rollout
    if checkpoint is not None:  # continue the episodes the checkpoint cut, with the memory they had
        next_obs_np, carried = env_state.restore(envs, checkpoint["episodes"], args.seed + global_step)
        if carried:  # else the envs start new episodes
            next_starts, rnn_state = carried["episode_starts"], carried["rnn_state"]
    episodes, checkpoint_path = EpisodeLog(writer), None
    progress = tqdm(total=num_iterations * batch_size, initial=global_step, disable=not args.progress, unit="step")
    start_time, start_step = time.time(), global_step
    uploaded_videos: set[str] = set()

    def write_checkpoint(iteration: int) -> Path:
        state = {"model": agent.state_dict(), "optimizer": optimizer.state_dict(), "iteration": iteration}
        state["reward_rms"] = checkpoints.reward_normalizer_state(reward_normalizer)
        state["episodes"] = env_state.capture(envs, next_obs_np, episode_starts=next_starts, rnn_state=rnn_state)
        return checkpoints.save(run_path / "checkpoints", SCRIPT, CHECKPOINT_FORMAT, args, global_step, **state)

    iteration = saved_iteration = start_iteration - 1
    with GracefulInterrupt() as interrupt, closing(envs), progress:
        while iteration < num_iterations and not interrupt.requested:
            iteration += 1
            if args.anneal_lr:
                frac = (iteration - 1.0) / num_iterations
                optimizer.param_groups[0]["lr"] = (1.0 - frac) * args.learning_rate + frac * args.end_learning_rate
            rollout_start = time.time()

            # The rollout only acts; log-probs and values come after it, from one torch pass along its sequences.
            # float32, as the rollout stores them: integer observations (one-hot, MiniGrid's) would not normalise
            act, numpy_copy = rollout_policy(agent, args.numpy_rollout, next_obs_np.astype(np.float32))
            noise = agent.sampling_noise((args.num_steps, args.num_envs))
            noise_np, initial_state = noise.cpu().numpy(), rnn_state.copy()
            recorded_steps = []  # with --save-trajectories: what the trajectory file needs once log-probs are known
            for step in range(args.num_steps):
                global_step += args.num_envs
                obs[step], episode_starts[step] = next_obs_np, next_starts
                states[step] = rnn_state * ~next_starts[None, :, None]
                actions[step], rnn_state = act(obs[step], rnn_state, next_starts, noise_np[step])
                sent_action = env_action(actions[step], agent.action_space)
                next_obs_np, reward, terminated, truncated, infos = envs.step(sent_action)
                terminations[step], truncations[step] = terminated, truncated
                rewards[step] = (
                    reward.clip(-args.norm_reward_clip, args.norm_reward_clip) if reward_normalizer else reward
                )
                if reward_normalizer is not None:  # clipped above, not by a wrapper: the env's reward stays recoverable
                    reward = reward * np.sqrt(reward_normalizer.return_rms.var + reward_normalizer.epsilon)

                # Truncated episodes bootstrap from the value of their last observation, seen with their memory.
                truncated_only = truncated & ~terminated
                if args.bootstrap_truncation and truncated_only.any():
                    last_obs = np.stack(infos["final_obs"][truncated_only])
                    last_obs = torch.as_tensor(last_obs, dtype=torch.float32, device=device)[None]
                    with torch.no_grad():
                        continuing = torch.zeros((1, int(truncated_only.sum())), dtype=torch.bool, device=device)
                        memory = torch.as_tensor(rnn_state[:, truncated_only], device=device)
                        final_values[step, truncated_only] = agent(last_obs, memory, continuing)[1][0].cpu().numpy()
                next_starts = terminated | truncated
                episodes.record(infos, global_step)
                if trajectory_writer is not None:  # the env's own reward, not the scaled one
                    recorded_steps.append(((sent_action, reward, terminated, truncated), infos))

            with torch.no_grad():
                t_obs, t_starts = torch.as_tensor(obs, device=device), torch.as_tensor(episode_starts, device=device)
                t_actions, t_states = torch.as_tensor(actions, device=device), torch.as_tensor(states, device=device)
                actor_outs, values, _ = agent(t_obs, torch.as_tensor(initial_state, device=device), t_starts)
                logprobs = check_policy(agent, actor_outs, noise, t_actions, numpy_copy)
                next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32, device=device)[None]
                memory, next_episode_starts = (torch.as_tensor(a, device=device) for a in (rnn_state, next_starts))
                next_value = agent(next_obs, memory, next_episode_starts[None])[1][0]
                advantages = compute_gae(
                    rewards, values.cpu().numpy(), next_value.cpu().numpy(), terminations, truncations,
                    final_values, args.gamma, args.gae_lambda,
                )  # fmt: skip
                advantages = torch.as_tensor(advantages, device=device)
                returns = advantages + values
            for step, (env_step, infos) in enumerate(recorded_steps):
                fields = {
                    "logprobs": logprobs[step],
                    "values": values[step],
                    "hidden_state": states[step].swapaxes(0, 1),  # (envs, layers, state size)
                }
                if not agent.discrete:
                    fields["actions"] = actions[step]  # the unclipped sample that `logprobs` belong to
                trajectory_writer.add_step(obs[step], *env_step, {"policy": fields}, infos)
            rollout_seconds = time.time() - rollout_start

            sequences_start = time.time()
            s_obs, s_starts, s_actions = as_sequences(t_obs), as_sequences(t_starts), as_sequences(t_actions)
            s_states = t_states[sequence_starts, :, sequence_envs].transpose(0, 1)  # (layers, sequences, state size)
            s_logprobs, s_actor_outs = as_sequences(logprobs), as_sequences(actor_outs)
            s_values, s_advantages, s_returns = as_sequences(values), as_sequences(advantages), as_sequences(returns)
            sequences_seconds = time.time() - sequences_start

            update_start = time.time()
            ratios = []
            for epoch in range(args.update_epochs):
                permutation = torch.randperm(num_sequences, device=device)
                for start in range(0, num_sequences, sequences_per_minibatch):
                    mb = permutation[start : start + sequences_per_minibatch]
                    actor_out, newvalue, _ = agent(s_obs[:, mb], s_states[:, mb], s_starts[:, mb])
                    if epoch == 0 and start == 0:  # no step yet: this pass replays the rollout's on these sequences
                        recorded = (s_actor_outs[:, mb], s_values[:, mb])
                        check_replay(s_states[:, mb], s_starts[:, mb], (actor_out, newvalue), recorded)
                    newlogprob, entropy = agent.log_prob_and_entropy(actor_out, s_actions[:, mb])
                    logratio = newlogprob - s_logprobs[:, mb]
                    ratio = logratio.exp()
                    ratios.append(ratio.detach())

                    mb_advantages, mb_returns, mb_values = s_advantages[:, mb], s_returns[:, mb], s_values[:, mb]
                    if args.norm_adv and mb_advantages.numel() > 1:
                        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                    # Policy loss
                    pg_loss1 = -mb_advantages * ratio
                    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                    # Value loss
                    if args.clip_vloss:
                        v_loss_unclipped = (newvalue - mb_returns) ** 2
                        v_clipped = mb_values + torch.clamp(newvalue - mb_values, -args.clip_coef, args.clip_coef)
                        v_loss_clipped = (v_clipped - mb_returns) ** 2
                        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                    else:
                        v_loss = 0.5 * ((newvalue - mb_returns) ** 2).mean()

                    entropy_loss = entropy.mean()
                    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm, foreach=True)
                    optimizer.step()

                with torch.no_grad():  # of the epoch's last minibatch, as CleanRL logs them
                    old_approx_kl = (-logratio).mean()  # http://joschu.net/blog/kl-approx.html
                    approx_kl = ((ratio - 1) - logratio).mean()
                if args.target_kl is not None and approx_kl > args.target_kl:
                    break
            # Once per update: on a GPU every check waits for the device. A NaN or inf loss reaches the parameters.
            if not torch.stack([torch.isfinite(p).all() for p in agent.parameters()]).all():
                raise TrainingDiverged(
                    f"a loss or parameter became NaN or inf in the update at step {global_step} (last minibatch: "
                    f"policy loss {pg_loss.item():.4g}, value loss {v_loss.item():.4g}, entropy "
                    f"{entropy_loss.item():.4g}); the last good checkpoint is kept"
                )
            if args.norm_obs:
                # After the update: the stored log-probs and values, GAE and the update all used the same statistics.
                agent.obs_norm.update(s_obs.reshape(-1, *obs_shape))
            update_seconds = time.time() - update_start

            var_y = np.var(returns.cpu().numpy())
            explained_var = np.nan if var_y == 0 else 1 - np.var((returns - values).cpu().numpy()) / var_y
            sps = int((global_step - start_step) / (time.time() - start_time))
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
            writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
            writer.add_scalar("losses/entropy", entropy_loss.item(), global_step)
            writer.add_scalar("losses/old_approx_kl", old_approx_kl.item(), global_step)
            writer.add_scalar("losses/approx_kl", approx_kl.item(), global_step)
            clipfrac = ((torch.cat([r.reshape(-1) for r in ratios]) - 1.0).abs() > args.clip_coef).float().mean()
            writer.add_scalar("losses/clipfrac", clipfrac.item(), global_step)
            writer.add_scalar("losses/explained_variance", explained_var, global_step)
            writer.add_scalar("charts/SPS", sps, global_step)
            writer.add_scalar("perf/rollout_seconds", rollout_seconds, global_step)
            writer.add_scalar("perf/sequences_seconds", sequences_seconds, global_step)
            writer.add_scalar("perf/update_seconds", update_seconds, global_step)
            writer.add_scalar("system/rss_mb", rss_mb(), global_step)
            progress.update(global_step - progress.n)
            progress.set_postfix(SPS=sps, ret=episodes.recent_mean(), refresh=False)
            if args.checkpoint_every and iteration % args.checkpoint_every == 0:
                checkpoint_path, saved_iteration = write_checkpoint(iteration), iteration
            if args.track and args.capture_video:
                upload_videos(video_folder, uploaded_videos)

        # Also after a Ctrl-C, which then stops the run here (the checkpoint is that of the last whole iteration).
        if (args.save_model or (interrupt.requested and args.checkpoint_every)) and saved_iteration < iteration:
            checkpoint_path = write_checkpoint(iteration)
        if trajectory_writer is not None:
            trajectory_writer.save(trajectory_path)
    eval_returns = evaluate(agent, args, writer, global_step) if args.eval_episodes else []
    finish_tracking(writer, args.track, video_folder if args.capture_video else None, uploaded_videos)
    return TrainResult(agent, global_step, run_path, episodes.returns, episodes.lengths, eval_returns, checkpoint_path)


def check_replay(
    states: Tensor, episode_starts: Tensor, replayed: tuple[Tensor, Tensor], recorded: tuple[Tensor, Tensor]
) -> None:
    """Before the first gradient step: stop unless the update's pass along training sequences (from their recorded
    `states`, reset where `episode_starts`) gives the `recorded` actor outputs and values of the rollout's pass, to
    float32 rounding: 1e-4 of their largest magnitude (plus 1e-5). The two passes lay the batch out differently and
    run the cell with and without autograd, and the rounding grows with the cell's state (a cell state of 115 gave
    differences of 2.8e-5 in logits of 4.7). The passes are compared on outputs, not log-probabilities: a narrow
    Gaussian magnifies rounding in a log-probability (3e-5 on PendulumNoVel-v1)."""
    for replayed_part, recorded_part, what in zip(replayed, recorded, ("actor outputs", "values"), strict=True):
        replayed_part = replayed_part.detach()
        tolerance = 1e-5 + 1e-4 * recorded_part.abs().max()
        if (replayed_part - recorded_part).abs().max() <= tolerance:
            continue
        difference = (replayed_part - recorded_part).abs().reshape(*episode_starts.shape, -1).amax(-1)
        step, sequence = divmod(int(difference.argmax()), episode_starts.shape[1])
        starts = episode_starts[: step + 1, sequence].nonzero()
        where = (
            f"{step - int(starts[-1])} steps after an episode start"
            if len(starts)
            else f"{step} steps after a recorded state of norm {states[:, sequence].norm().item():.3g}"
        )
        raise PolicyMismatch(
            f"the update's {what} differ from the rollout's (largest difference {difference.max().item():.3g}, "
            f"tolerance {tolerance.item():.3g}, {where}): each training sequence must start from the state "
            f"recorded in the rollout and reset it where an episode starts"
        )


def compute_gae(
    rewards: np.ndarray, values: np.ndarray, next_value: np.ndarray, terminations: np.ndarray,
    truncations: np.ndarray, final_values: np.ndarray, gamma: float, gae_lambda: float,
) -> np.ndarray:  # fmt: skip
    """GAE for a (num_steps, num_envs) rollout, in NumPy (cheaper than torch for the recursion's small steps). An
    episode end stops the recursion; a truncated step bootstraps from `final_values`, its last observation's value."""
    nextnonterminal = 1.0 - (terminations | truncations).astype(values.dtype)
    bootstrap = np.where(truncations & ~terminations, final_values, 0.0)  # final_values elsewhere is not read
    following_values = np.concatenate([values[1:], next_value[None]])
    deltas = rewards + gamma * (following_values * nextnonterminal + bootstrap) - values
    advantages = np.zeros_like(deltas)
    lastgaelam = np.zeros_like(next_value)
    for t in reversed(range(len(deltas))):
        advantages[t] = lastgaelam = deltas[t] + gamma * gae_lambda * nextnonterminal[t] * lastgaelam
    return advantages


def select_action(agent: Agent, policy: Categorical | Normal, method: str, temperature: float, k: int) -> Tensor:
    """An action of `policy` for evaluation: greedy (argmax / mean), basic (sample), temperature, topk or bottomk."""
    if method == "greedy":
        return policy.mode
    if method == "basic":
        return policy.sample()
    if method == "temperature":
        if agent.discrete:
            return Categorical(logits=policy.logits / temperature).sample()
        return Normal(policy.mean, policy.stddev * temperature).sample()
    k = min(k, policy.logits.shape[-1])  # topk, bottomk: discrete actions only (build_agent checks)
    kept = policy.logits.topk(k, dim=-1, largest=method == "topk")
    return kept.indices.gather(-1, Categorical(logits=kept.values).sample().unsqueeze(-1)).squeeze(-1)


def evaluate(agent: Agent, args: Args, writer: SummaryWriter, step: int, record_to: Path | None = None) -> list[float]:
    """Play `args.eval_episodes` episodes (seeded with `args.seed`, actions by `args.sampling_method`, recorded to
    `record_to` with the hidden state each action came from), log them at `step`, the agent's training step, and
    return their returns."""
    device, was_training = next(agent.parameters()).device, agent.training
    agent.eval()  # dropout off, batch norm on its running statistics
    state = agent.initial_state(1)

    @torch.inference_mode()
    def act(obs: np.ndarray, episode_starts: np.ndarray) -> tuple[np.ndarray, dict]:
        nonlocal state
        obs_tensor = torch.as_tensor(obs, dtype=torch.float32, device=device)[None]
        starts = torch.as_tensor(episode_starts, device=device)[None]
        acted_from = state * ~starts[0, None, :, None]
        actor_out, _, state = agent(obs_tensor, state, starts)
        policy = agent.distribution(actor_out[0])
        action = select_action(agent, policy, args.sampling_method, args.temperature, args.sampling_k)
        fields = {"policy": {"hidden_state": acted_from.transpose(0, 1).cpu().numpy()}}
        return env_action(action.cpu().numpy(), agent.action_space), fields

    env_fn, meta = make_env(resolve_env_id(args.env_id)), {"args": asdict(args)}
    returns, lengths = play_episodes(env_fn, act, args.eval_episodes, args.seed, record_to, meta)
    log_episodes(writer, returns, lengths, step, prefix="eval")
    agent.train(was_training)
    return returns


def evaluate_checkpoint(args: Args) -> list[float]:
    """Rebuild the agent from a checkpoint alone, evaluate it, print mean and std of the return."""
    check_args(args)
    trained, checkpoint = from_checkpoint(args.eval_checkpoint, args, EVALUATION_FLAGS, strict=False)
    if trained.eval_episodes <= 0:
        raise UsageError("--eval-episodes must be positive with --eval-checkpoint")
    device = seed_and_pick_device(trained.seed, trained.torch_deterministic, trained.torch_threads, trained.cuda)
    agent = build_agent(trained, checkpoint, device)
    run_path = create_run_folder(args.run_dir, run_name(trained.env_id, trained.exp_name, trained.seed), "__eval")
    with SummaryWriter(str(run_path)) as writer:
        returns = evaluate(agent, trained, writer, checkpoint["global_step"], unused_npz_path(args.save_trajectories))
    print(f"{args.eval_checkpoint}: {len(returns)} episodes, return {np.mean(returns):.2f} +- {np.std(returns):.2f}")
    return returns


def main() -> int:
    def run() -> None:
        args = parse_args(Args)
        if args.eval_checkpoint:
            evaluate_checkpoint(args)
        else:
            print(train(args).summary())

    return exit_status(run)


if __name__ == "__main__":
    sys.exit(main())
