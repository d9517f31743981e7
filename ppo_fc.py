"""PPO with an MLP actor and critic, for discrete and continuous actions.

One file, read top to bottom: the arguments, the environments, the network, then ``train()`` with the rollout loop,
GAE, minibatch updates and Adam with a linear learning-rate decay, all inline. Run it with
``python ppo_fc.py --env-id CartPole-v1``; ``--help`` lists every flag.

Correctness details that PPO implementations often get wrong, handled here:
- Vector envs autoreset in the same step (gymnasium's SAME_STEP), and truncated episodes bootstrap from the value of
  their real last observation (``final_obs``); terminations never bootstrap.
- Observation and reward normalisation statistics are saved in checkpoints and frozen during evaluation.
- Continuous actions are clipped only when sent to the env; log-probabilities are those of the unclipped sample.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import os
import random
import resource
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro
from tensorboard.compat.proto.summary_pb2 import Summary
from torch.distributions import Categorical, Normal
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

import probe_envs  # noqa: F401  (registers the probe ids with gymnasium)
from common.trajectories import TrajectoryWriter

# Validating distribution arguments costs more than the small network's forward pass; the inputs here are well formed.
torch.distributions.Distribution.set_default_validate_args(False)

SCRIPT = Path(__file__).stem
CHECKPOINT_FORMAT = 2  # 2: the actor and critic layers live in `.layers` (state-dict keys changed)
CHECKPOINT_KEYS = ("model", "optimizer", "args", "global_step", "iteration", "rng")
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


@dataclass
class Args:
    exp_name: str = SCRIPT
    """the name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment (torch, numpy, python and the envs)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, use a GPU when one is available"""
    torch_threads: int = 1
    """CPU threads for torch (0 keeps torch's default); one thread is fastest for small networks"""
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

    # Checkpoints, evaluation and trajectories
    save_model: bool = True
    """if toggled, write a checkpoint at the end of training (and on Ctrl-C)"""
    checkpoint_every: int = 0
    """write a checkpoint every this many iterations (0: only at the end, when --save-model)"""
    resume: str | None = None
    """continue the run of this checkpoint: its settings, run folder, step count and schedule"""
    eval_checkpoint: str | None = None
    """evaluate the agent of this checkpoint for --eval-episodes episodes, then exit"""
    eval_episodes: int = 10
    """episodes of evaluation with the deterministic policy after training (0: none)"""
    sampling_method: Literal["greedy", "basic", "temperature", "topk", "bottomk"] = "greedy"
    """how --eval-checkpoint draws actions: greedy (argmax / mean), basic (sample), temperature, topk, bottomk (evaluation after training is greedy)"""
    temperature: float = 1.0
    """with --sampling-method temperature: divides the logits (discrete) or multiplies the std (continuous)"""
    sampling_k: int = 2
    """with --sampling-method topk / bottomk: sample among this many most / least likely actions (discrete only)"""
    save_trajectories: str | None = None
    """record the training rollouts (or, with --eval-checkpoint, the evaluation episodes) to this .npz file"""

    # Algorithm
    env_id: str = "CartPole-v1"
    """the id of the gymnasium environment"""
    total_timesteps: int = 500_000
    """total timesteps of the experiment"""
    num_envs: int = 4
    """the number of parallel environments"""
    async_envs: bool = False
    """if toggled, run the environments in subprocesses (gymnasium's AsyncVectorEnv)"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    end_learning_rate: float = 0.0
    """with --anneal-lr, the learning rate falls linearly towards this value (CleanRL's schedule: the last iteration uses lr + (end - lr) * (N - 1) / N)"""
    anneal_lr: bool = True
    """toggle learning rate annealing"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of minibatches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization (per minibatch)"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function"""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold: stop the epochs of an update once it is exceeded"""
    bootstrap_truncation: bool = True
    """if toggled, truncated episodes bootstrap from the value of their last observation"""
    norm_obs: bool = False
    """if toggled, normalise observations with running statistics (kept in the agent, frozen in evaluation)"""
    norm_reward: bool = False
    """if toggled, scale rewards by the running std of the discounted return (gymnasium's NormalizeReward)"""
    hidden_size: int = 64
    """width of the two hidden layers of the actor and of the critic"""


class UsageError(Exception):
    """Bad input: reported as one `error:` line and exit status 2, before any training."""


class TrainingDiverged(Exception):
    """A loss or parameter became NaN or inf; the last good checkpoint is kept."""


def make_env(env_id: str, idx: int, capture_video: bool, video_folder: str, video_every: int):
    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(
                env, video_folder, episode_trigger=lambda episode: episode % video_every == 0
            )
        else:
            env = gym.make(env_id)
        # Per env, not on the vector env: vector observation wrappers refuse SAME_STEP autoreset, and applied here they
        # also flatten `final_obs`.
        if not isinstance(env.observation_space, gym.spaces.Box) or len(env.observation_space.shape) != 1:
            env = gym.wrappers.FlattenObservation(env)
        return env

    return thunk


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class RunningNorm(nn.Module):
    """Normalises inputs by running mean and variance. The statistics are buffers, so they live in the state dict
    (and checkpoints); they change only when `update` is called, which only training does, after each update."""

    def __init__(self, size: int, clip: float = 10.0, epsilon: float = 1e-8):
        super().__init__()
        self.register_buffer("mean", torch.zeros(size, dtype=torch.float64))
        self.register_buffer("var", torch.ones(size, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self.clip, self.epsilon = clip, epsilon

    def update(self, batch: torch.Tensor) -> None:
        batch = batch.to(torch.float64)
        batch_mean, batch_var, batch_count = batch.mean(0), batch.var(0, unbiased=False), batch.shape[0]
        delta, total = batch_mean - self.mean, self.count + batch_count
        self.mean += delta * batch_count / total
        self.var.copy_(
            (self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total) / total
        )
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(self.var + self.epsilon).to(x.dtype)
        return ((x - self.mean.to(x.dtype)) * scale).clamp(-self.clip, self.clip)


class MLP(nn.Module):
    """A tanh MLP with orthogonal initialisation. `forward` applies the layers' weights itself, which saves the few µs
    that each nn.Module call costs on a CPU, in every minibatch."""

    def __init__(self, in_size: int, hidden_size: int, out_size: int, out_std: float):
        super().__init__()
        self.layers = nn.ModuleList(
            [
                layer_init(nn.Linear(in_size, hidden_size)),
                layer_init(nn.Linear(hidden_size, hidden_size)),
                layer_init(nn.Linear(hidden_size, out_size), std=out_std),
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *hidden_layers, out_layer = self.layers
        for layer in hidden_layers:
            x = torch.tanh(F.linear(x, layer.weight, layer.bias))
        return F.linear(x, out_layer.weight, out_layer.bias)


class Agent(nn.Module):
    def __init__(self, observation_size: int, action_space: gym.Space, hidden_size: int, norm_obs: bool):
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        action_size = int(action_space.n) if self.discrete else int(np.prod(action_space.shape))
        self.obs_norm = RunningNorm(observation_size) if norm_obs else nn.Identity()
        self.critic = MLP(observation_size, hidden_size, 1, out_std=1.0)
        # logits (discrete) or the Gaussian mean (continuous)
        self.actor = MLP(observation_size, hidden_size, action_size, out_std=0.01)
        if not self.discrete:
            self.actor_logstd = nn.Parameter(torch.zeros(1, action_size))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(self.obs_norm(x)).squeeze(-1)

    def distribution(self, x: torch.Tensor) -> Categorical | Normal:
        """The policy at observations `x` as a torch distribution (for evaluation and inspection)."""
        out = self.actor(self.obs_norm(x))
        if self.discrete:
            return Categorical(logits=out)
        return Normal(out, self.actor_logstd.expand_as(out).exp())

    def get_action_and_value(
        self, x: torch.Tensor, action: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Action (sampled when not given), its log-probability, the policy's entropy, and the value at `x`."""
        x = self.obs_norm(x)
        actor_out = self.actor(x)
        if action is None:
            action = self.sample(actor_out, self.sampling_noise(actor_out.shape[:-1]))
        return action, *self.score(actor_out, action), self.critic(x).squeeze(-1)

    def sampling_noise(self, batch_shape: tuple[int, ...]) -> torch.Tensor:
        """The randomness of `sample` for a batch of actor outputs. A rollout draws all of its steps' in one call."""
        out_layer = self.actor.layers[-1]
        noise = torch.empty((*batch_shape, out_layer.out_features), device=out_layer.weight.device)
        if self.discrete:
            return noise.exponential_().log_().neg_()  # -log(Exp(1)) is Gumbel noise
        return noise.normal_()

    def sample(self, actor_out: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """An action from the actor's output and `sampling_noise`: the policy of `distribution`, in two operations,
        since torch.distributions objects cost more than this small network's forward pass."""
        if self.discrete:
            return torch.argmax(actor_out + noise, -1)  # Gumbel-max: a sample of the categorical of these logits
        return actor_out + self.actor_logstd.exp() * noise

    @torch.no_grad()
    def numpy_policy(self) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """`sample` at the current weights as a NumPy function of (float32 observations, `sampling_noise`), for the
        rollout. On a CPU, a NumPy call on arrays this small costs a third of a torch call: per 512-step rollout with
        the default network, 5 ms against 17 ms, measured in place. A snapshot: take a new one after an update."""
        *hidden, out = [
            (layer.weight.T.cpu().numpy().copy(), layer.bias.cpu().numpy().copy()) for layer in self.actor.layers
        ]
        normalize = None if isinstance(self.obs_norm, nn.Identity) else copy.deepcopy(self.obs_norm).cpu()
        std = None if self.discrete else self.actor_logstd.exp().cpu().numpy()

        def policy(obs: np.ndarray, noise: np.ndarray) -> np.ndarray:
            x = obs if normalize is None else normalize(torch.from_numpy(obs)).numpy()
            for weight, bias in hidden:
                x = np.tanh(x @ weight + bias)
            actor_out = x @ out[0] + out[1]
            return np.argmax(actor_out + noise, -1) if self.discrete else actor_out + std * noise

        return policy

    def score(self, actor_out: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The log-probability of `action` and the policy's entropy, from the actor's output."""
        if self.discrete:
            log_probs = torch.log_softmax(actor_out, -1)
            log_prob = log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            return log_prob, -(log_probs.exp() * log_probs).sum(-1)
        logstd = self.actor_logstd.expand_as(actor_out)
        # Independent Gaussian action dimensions: log-probabilities and entropies add up.
        log_prob = (-0.5 * ((action - actor_out) * torch.exp(-logstd)).square() - logstd - HALF_LOG_2PI).sum(-1)
        return log_prob, (0.5 + HALF_LOG_2PI + logstd).sum(-1)


@dataclass
class TrainResult:
    agent: Agent
    """the trained agent (on the training device)"""
    global_step: int
    """environment steps taken, over all envs"""
    episode_returns: list[float] = field(default_factory=list)
    """the return of every finished training episode, in order"""
    episode_lengths: list[int] = field(default_factory=list)
    """the length of every finished training episode, in order"""
    eval_returns: list[float] = field(default_factory=list)
    """returns of the evaluation episodes after training"""
    run_dir: Path | None = None
    """the run's folder: TensorBoard events, checkpoints, videos"""
    checkpoint: Path | None = None
    """the last checkpoint written, if any"""


def check_args(args: Args) -> None:
    """Reject bad settings before anything is built or written."""
    positive = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "hidden_size")
    for name in positive:
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    for name in ("eval_episodes", "checkpoint_every", "torch_threads"):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be zero or more, got {getattr(args, name)}")
    if args.video_every <= 0 or args.sampling_k <= 0 or args.temperature <= 0 or args.learning_rate <= 0:
        raise UsageError("--video-every, --sampling-k, --temperature and --learning-rate must be positive")
    if args.end_learning_rate < 0 or args.clip_coef <= 0 or args.max_grad_norm <= 0:
        raise UsageError("--end-learning-rate must be zero or more, --clip-coef and --max-grad-norm positive")
    if args.target_kl is not None and args.target_kl <= 0:
        raise UsageError(f"--target-kl must be positive when given, got {args.target_kl}")
    if not (0 <= args.gamma <= 1 and 0 <= args.gae_lambda <= 1):
        raise UsageError(f"--gamma and --gae-lambda must lie in [0, 1], got {args.gamma} and {args.gae_lambda}")
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches:
        raise UsageError(
            f"--num-minibatches {args.num_minibatches} does not divide the batch of --num-envs x --num-steps = "
            f"{batch_size}; pick a divisor of {batch_size}"
        )
    if args.total_timesteps < batch_size:
        raise UsageError(f"--total-timesteps {args.total_timesteps} is less than one batch ({batch_size} steps)")


def probe_spaces(env_id: str) -> tuple[gym.Space, gym.Space]:
    """The (flattened) observation space and the action space of `env_id`, or a UsageError saying what is wrong."""
    try:
        env = make_env(env_id, 0, False, "", 1)()
    except Exception as exc:  # unknown ids, missing modules or extras, observation spaces that cannot be flattened
        raise UsageError(f"cannot make env {env_id!r}: {type(exc).__name__}: {exc}") from None
    observation_space, action_space = env.observation_space, env.action_space
    env.close()
    if not isinstance(observation_space, gym.spaces.Box) or observation_space.shape is None:
        raise UsageError(
            f"{env_id!r} has an observation space gymnasium cannot flatten to a vector: {observation_space}"
        )
    if not isinstance(action_space, (gym.spaces.Discrete, gym.spaces.Box)):
        raise UsageError(f"{env_id!r} has a {type(action_space).__name__} action space; ppo_fc takes Discrete or Box")
    return observation_space, action_space


def load_checkpoint(path: str) -> dict:
    """Read a checkpoint of this script without unpickling; a missing, corrupt or foreign file is a UsageError."""
    if not Path(path).is_file():
        raise UsageError(f"checkpoint {path!r} does not exist")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a corrupt file; all mean "cannot read it"
        raise UsageError(
            f"cannot read checkpoint {path!r}: corrupt, or holds pickled objects ({type(exc).__name__})"
        ) from None
    if not isinstance(checkpoint, dict) or checkpoint.get("script") != SCRIPT:
        found = checkpoint.get("script") if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise UsageError(f"{path!r} is not a {SCRIPT} checkpoint (it is from {found!r})")
    missing = [key for key in CHECKPOINT_KEYS if key not in checkpoint]
    if checkpoint.get("format") != CHECKPOINT_FORMAT or missing:
        raise UsageError(f"{path!r} is a {SCRIPT} checkpoint of another format (missing {missing or 'nothing'})")
    if checkpoint["args"].get("norm_reward") and "reward_rms" not in checkpoint:
        raise UsageError(f"{path!r} lacks the reward-normalisation statistics its run used")
    return checkpoint


def args_from_checkpoint(checkpoint: dict, overrides: dict) -> Args:
    """The checkpoint's settings, with `overrides` (what the command line decides) on top."""
    try:
        args = Args(**{**checkpoint["args"], **overrides})
    except (KeyError, TypeError) as exc:
        raise UsageError(f"the checkpoint's settings do not match this version of {SCRIPT}: {exc}") from None
    check_args(args)
    return args


def save_checkpoint(state: dict, folder: Path, global_step: int) -> Path:
    """Write `step_{global_step}.pt` and `latest.pt` atomically: a temporary file in the same folder, then a rename."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in (f"step_{global_step}.pt", "latest.pt"):
        temporary = folder / f".{name}.tmp"
        torch.save(state, temporary)
        os.replace(temporary, folder / name)
    return folder / "latest.pt"


def build_agent(args: Args, checkpoint: dict | None, device: torch.device) -> tuple[Agent, gym.Space]:
    """The agent for `args.env_id` (with the checkpoint's weights, if given) and the env's action space."""
    observation_space, action_space = probe_spaces(args.env_id)
    agent = Agent(int(np.prod(observation_space.shape)), action_space, args.hidden_size, args.norm_obs).to(device)
    if checkpoint is not None:
        try:
            agent.load_state_dict(checkpoint["model"])
        except (RuntimeError, KeyError) as exc:
            raise UsageError(f"the checkpoint does not fit the agent for {args.env_id!r}: {str(exc)[:200]}") from None
    return agent, action_space


def env_action(action: np.ndarray, action_space: gym.Space) -> np.ndarray:
    """The agent's action as the env takes it: offset by `start` (Discrete) or clipped to the bounds (Box)."""
    if isinstance(action_space, gym.spaces.Discrete):
        return action + int(action_space.start) if action_space.start else action
    action = action.reshape(action.shape[0], *action_space.shape)
    return np.clip(action, action_space.low, action_space.high)


def log_episodes(writer: SummaryWriter, returns: list[float], lengths: list[int], global_step: int) -> None:
    """Log every episode that ended at `global_step` in one event. Each event costs ~0.1 ms of the writer thread's
    time, which dominates the rollout when many short episodes end together (as in the probe envs)."""
    values = [Summary.Value(tag="charts/episodic_return", simple_value=value) for value in returns]
    values += [Summary.Value(tag="charts/episodic_length", simple_value=value) for value in lengths]
    writer.file_writer.add_summary(Summary(value=values), global_step)


def seed_and_pick_device(args: Args) -> torch.device:
    """Seed python, NumPy and torch, set torch's CPU threads, and return the device to run on."""
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    return torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")


def new_run_name(args: Args) -> str:
    """`{env_id}__{exp_name}__{seed}__{unix time}`, with `/` and `:` of the env id made safe for a folder name."""
    safe_env_id = args.env_id.replace("/", "-").replace(":", "-")
    return f"{safe_env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"


def rss_mb() -> float:
    """The process's resident memory in MB (the peak where /proc is missing)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def train(args: Args) -> TrainResult:
    check_args(args)
    checkpoint = load_checkpoint(args.resume) if args.resume else None
    if checkpoint is not None and Path(args.resume).resolve().parent.name != "checkpoints":
        raise UsageError(f"--resume takes a checkpoint inside a run's checkpoints/ folder, got {args.resume!r}")
    if checkpoint is not None:
        # The checkpoint's settings define the run; only how it is shown and tracked comes from the command line.
        shown = {name: getattr(args, name) for name in ("progress", "track", "cuda", "resume", "torch_threads")}
        args = args_from_checkpoint(checkpoint, shown)
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = args.total_timesteps // batch_size

    device = seed_and_pick_device(args)
    agent, action_space = build_agent(args, checkpoint, device)
    # The fused kernel updates every parameter in one call: a fifth of the update time for a network this small.
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    if checkpoint is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])

    if checkpoint is not None:
        run_path = Path(args.resume).resolve().parent.parent
        run_name = run_path.name
    else:
        run_name = new_run_name(args)
        run_path = Path(args.run_dir) / run_name
    if args.track:
        import wandb

        # Before the SummaryWriter exists, so that wandb can patch it (sync_tensorboard).
        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            sync_tensorboard=True,
            config=asdict(args),
            name=run_name,
            dir=str(run_path),
            save_code=True,
        )
    run_path.mkdir(parents=True, exist_ok=True)
    writer = SummaryWriter(str(run_path))
    writer.add_text(
        "hyperparameters",
        "|param|value|\n|-|-|\n" + "\n".join(f"|{key}|{value}|" for key, value in asdict(args).items()),
    )

    video_folder = str(run_path / "videos")
    env_fns = [
        make_env(args.env_id, i, args.capture_video, video_folder, args.video_every) for i in range(args.num_envs)
    ]
    vector_env = gym.vector.AsyncVectorEnv if args.async_envs else gym.vector.SyncVectorEnv
    envs = gym.wrappers.vector.RecordEpisodeStatistics(
        vector_env(env_fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    )
    reward_normalizer = None
    if args.norm_reward:
        envs = reward_normalizer = gym.wrappers.vector.NormalizeReward(envs, gamma=args.gamma)
        if checkpoint is not None:
            reward_normalizer.return_rms.mean = checkpoint["reward_rms"]["mean"].numpy()
            reward_normalizer.return_rms.var = checkpoint["reward_rms"]["var"].numpy()
            reward_normalizer.return_rms.count = float(checkpoint["reward_rms"]["count"])

    # Rollout storage, in NumPy: filled step by step without conversions.
    obs_shape = envs.single_observation_space.shape
    action_shape = () if agent.discrete else (int(np.prod(action_space.shape)),)
    obs = np.zeros((args.num_steps, args.num_envs, *obs_shape), dtype=np.float32)
    final_obs = np.zeros_like(obs)  # where an episode was truncated: its real last observation
    actions = np.zeros((args.num_steps, args.num_envs, *action_shape), dtype=np.int64 if agent.discrete else np.float32)
    rewards = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    terminations = np.zeros((args.num_steps, args.num_envs), dtype=bool)
    truncations = np.zeros((args.num_steps, args.num_envs), dtype=bool)
    trajectory_writer = None
    if args.save_trajectories:
        trajectory_writer = TrajectoryWriter(args.num_envs, meta={"args": asdict(args)})

    global_step, start_iteration = 0, 1
    if checkpoint is not None:
        global_step, start_iteration = int(checkpoint["global_step"]), int(checkpoint["iteration"]) + 1
        # Last, after every module is built: building consumes random numbers.
        torch.set_rng_state(checkpoint["rng"]["torch"])
        numpy_rng = checkpoint["rng"]["numpy"]
        np.random.set_state(("MT19937", numpy_rng["key"].numpy().astype(np.uint32), *numpy_rng["rest"]))
        random.setstate((3, tuple(checkpoint["rng"]["python"].tolist()), None))
    # Env internals cannot be saved without pickling: a resumed run starts fresh episodes, seeded apart from the first.
    next_obs_np, _ = envs.reset(seed=args.seed + global_step)

    result = TrainResult(agent=agent, global_step=global_step, run_dir=run_path)
    recent_returns: deque[float] = deque(maxlen=20)
    progress = tqdm(total=args.total_timesteps, initial=global_step, disable=not args.progress, unit="step")
    start_time, start_step = time.time(), global_step

    def checkpoint_state(iteration: int, global_step: int) -> dict:
        numpy_state = np.random.get_state()
        state = {
            "script": SCRIPT,
            "format": CHECKPOINT_FORMAT,
            "model": agent.state_dict(),
            "optimizer": optimizer.state_dict(),
            "args": asdict(args),
            "global_step": global_step,
            "iteration": iteration,
            "rng": {
                "torch": torch.get_rng_state(),
                "numpy": {"key": torch.from_numpy(numpy_state[1].astype(np.int64)), "rest": list(numpy_state[2:])},
                "python": torch.tensor(random.getstate()[1]),
            },
        }
        if reward_normalizer is not None:
            rms = reward_normalizer.return_rms
            state["reward_rms"] = {
                "mean": torch.as_tensor(rms.mean),
                "var": torch.as_tensor(rms.var),
                "count": float(rms.count),
            }
        return state

    completed = (start_iteration - 1, global_step)
    uploaded_videos: set[str] = set()
    stop_requested = False

    def request_stop(signum, frame) -> None:
        nonlocal stop_requested
        if stop_requested:
            raise KeyboardInterrupt
        stop_requested = True
        print("\ninterrupt: stopping after this iteration (Ctrl-C again to stop now)", file=sys.stderr)

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous_handler = signal.signal(signal.SIGINT, request_stop) if in_main_thread else None
    try:
        for iteration in range(start_iteration, num_iterations + 1):
            if args.anneal_lr:
                frac = (iteration - 1.0) / num_iterations
                optimizer.param_groups[0]["lr"] = args.learning_rate + frac * (
                    args.end_learning_rate - args.learning_rate
                )
            rollout_start = time.time()

            # The rollout asks the agent only for actions, from a NumPy snapshot of its policy, with the noise of all
            # steps drawn at once. Log-probs and values come after it, from one torch pass over all steps: per step,
            # each torch call would cost more than its arithmetic at this size.
            policy = agent.numpy_policy()
            noise = agent.sampling_noise((args.num_steps, args.num_envs)).cpu().numpy()
            recorded_steps = []  # with --save-trajectories: what the trajectory file needs once log-probs are known
            with torch.inference_mode():
                for step in range(args.num_steps):
                    global_step += args.num_envs
                    obs[step] = next_obs_np
                    action = actions[step] = policy(obs[step], noise[step])
                    sent_action = env_action(action, action_space)
                    next_obs_np, reward, terminated, truncated, infos = envs.step(sent_action)
                    rewards[step], terminations[step], truncations[step] = reward, terminated, truncated

                    if args.bootstrap_truncation and truncated.any():
                        final_obs[step, truncated] = np.stack(infos["final_obs"][truncated])
                    if "_episode" in infos:
                        finished = infos["_episode"]
                        episodic_returns = infos["episode"]["r"][finished].tolist()
                        episodic_lengths = infos["episode"]["l"][finished].tolist()
                        log_episodes(writer, episodic_returns, episodic_lengths, global_step)
                        result.episode_returns += episodic_returns
                        result.episode_lengths += episodic_lengths
                        recent_returns.extend(episodic_returns)
                    if trajectory_writer is not None:
                        raw_reward = reward
                        if reward_normalizer is not None:  # record what the env paid, not the scaled reward
                            raw_reward = reward * np.sqrt(reward_normalizer.return_rms.var + reward_normalizer.epsilon)
                        recorded_steps.append((sent_action, raw_reward, terminated, truncated, infos))

                b_obs = torch.as_tensor(obs, device=device).reshape(-1, *obs_shape)
                b_actions = torch.as_tensor(actions, device=device).reshape(-1, *action_shape)
                _, b_logprobs, _, b_values = agent.get_action_and_value(b_obs, b_actions)
                values = b_values.reshape(args.num_steps, args.num_envs)
                next_value = agent.get_value(torch.as_tensor(next_obs_np, dtype=torch.float32, device=device))
                # Truncated episodes bootstrap from the value of their last observation; terminated ones never do.
                final_values = np.zeros_like(rewards)
                truncated_only = truncations & ~terminations
                if args.bootstrap_truncation and truncated_only.any():
                    truncated_final_obs = torch.as_tensor(final_obs[truncated_only], device=device)
                    final_values[truncated_only] = agent.get_value(truncated_final_obs).cpu().numpy()
                advantages = compute_gae(
                    rewards,
                    values.cpu().numpy(),
                    next_value.cpu().numpy(),
                    terminations,
                    truncations,
                    final_values,
                    args.gamma,
                    args.gae_lambda,
                )
                advantages = torch.as_tensor(advantages, device=device)
                returns = advantages + values
            if trajectory_writer is not None:
                logprobs = b_logprobs.reshape(args.num_steps, args.num_envs)
                for step, (sent_action, raw_reward, terminated, truncated, infos) in enumerate(recorded_steps):
                    agent_fields = {"logprobs": logprobs[step], "values": values[step]}
                    if not agent.discrete:
                        agent_fields["actions"] = actions[step]  # the unclipped sample that `logprobs` belong to
                    trajectory_writer.add_step(
                        obs[step], sent_action, raw_reward, terminated, truncated, {"policy": agent_fields}, infos
                    )
            rollout_seconds = time.time() - rollout_start

            update_start = time.time()
            b_advantages = advantages.reshape(-1)
            b_returns = returns.reshape(-1)

            clipfracs = []
            losses_finite = torch.ones((), dtype=torch.bool, device=device)
            for _epoch in range(args.update_epochs):
                permutation = torch.randperm(batch_size, device=device)
                for start in range(0, batch_size, minibatch_size):
                    mb_inds = permutation[start : start + minibatch_size]
                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
                    logratio = newlogprob - b_logprobs[mb_inds]
                    ratio = logratio.exp()

                    with torch.no_grad():
                        # calculate approx_kl http://joschu.net/blog/kl-approx.html
                        old_approx_kl = (-logratio).mean()
                        approx_kl = ((ratio - 1) - logratio).mean()
                        clipfracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean())

                    mb_advantages, mb_returns, mb_values = b_advantages[mb_inds], b_returns[mb_inds], b_values[mb_inds]
                    if args.norm_adv and minibatch_size > 1:
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
                    losses_finite &= torch.isfinite(loss)

                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    # foreach: the default loops over the gradients one by one on a CPU.
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm, foreach=True)
                    optimizer.step()

                if args.target_kl is not None and approx_kl > args.target_kl:
                    break
            # Checked once per update, not per minibatch: on a GPU every check waits for the device.
            if not losses_finite or not all(torch.isfinite(p).all() for p in agent.parameters()):
                raise TrainingDiverged(
                    f"a loss or parameter became NaN or inf in the update at step {global_step} (last minibatch: "
                    f"policy loss {pg_loss.item():.4g}, value loss {v_loss.item():.4g}, entropy {entropy_loss.item():.4g})"
                )
            if args.norm_obs:
                # After the update: the stored log-probs and values, GAE and the update all used the same statistics.
                agent.obs_norm.update(b_obs)
            update_seconds = time.time() - update_start

            y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
            var_y = np.var(y_true)
            explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y
            sps = int((global_step - start_step) / (time.time() - start_time))
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
            writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
            writer.add_scalar("losses/entropy", entropy_loss.item(), global_step)
            writer.add_scalar("losses/old_approx_kl", old_approx_kl.item(), global_step)
            writer.add_scalar("losses/approx_kl", approx_kl.item(), global_step)
            writer.add_scalar("losses/clipfrac", torch.stack(clipfracs).mean().item(), global_step)
            writer.add_scalar("losses/explained_variance", explained_var, global_step)
            writer.add_scalar("charts/SPS", sps, global_step)
            writer.add_scalar("perf/rollout_seconds", rollout_seconds, global_step)
            writer.add_scalar("perf/update_seconds", update_seconds, global_step)
            writer.add_scalar("system/rss_mb", rss_mb(), global_step)
            progress.update(global_step - progress.n)
            if recent_returns:
                progress.set_postfix(SPS=sps, ret=f"{np.mean(recent_returns):.2f}", refresh=False)
            completed = (iteration, global_step)
            if args.checkpoint_every and iteration % args.checkpoint_every == 0:
                state = checkpoint_state(*completed)
                result.checkpoint = save_checkpoint(state, run_path / "checkpoints", global_step)
            if args.track and args.capture_video:
                upload_videos(video_folder, uploaded_videos)
            if stop_requested:
                if args.save_model or args.checkpoint_every:
                    saved = save_checkpoint(checkpoint_state(*completed), run_path / "checkpoints", global_step)
                    print(f"interrupted: checkpoint written to {saved}", file=sys.stderr)
                raise KeyboardInterrupt
    finally:
        if in_main_thread:
            signal.signal(signal.SIGINT, previous_handler)
        progress.close()
        envs.close()
        writer.flush()

    result.global_step = global_step
    if args.save_model and completed[0] >= start_iteration:
        result.checkpoint = save_checkpoint(checkpoint_state(*completed), run_path / "checkpoints", global_step)
    if trajectory_writer is not None:
        trajectory_writer.save(args.save_trajectories)
    if args.eval_episodes:
        result.eval_returns = evaluate(agent, args, writer, global_step, device)
    writer.close()
    if args.track:
        import wandb

        if args.capture_video:
            upload_videos(video_folder, uploaded_videos)
        wandb.finish()
    return result


def compute_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_value: np.ndarray,
    terminations: np.ndarray,
    truncations: np.ndarray,
    final_values: np.ndarray,
    gamma: float,
    gae_lambda: float,
) -> np.ndarray:
    """Generalised advantage estimates for a (num_steps, num_envs) rollout.

    An episode boundary stops the recursion. A truncated step bootstraps from `final_values` (the value of its real
    last observation, zero when truncation bootstrapping is off); a terminated one from nothing. In NumPy: the
    recursion runs one small operation after another, and each costs a fraction of a torch call's overhead.
    """
    nextnonterminal = 1.0 - (terminations | truncations).astype(values.dtype)
    bootstrap = np.where(truncations & ~terminations, final_values, 0.0)  # other entries may be stale: not read
    following_values = np.concatenate([values[1:], next_value[None]])
    deltas = rewards + gamma * (following_values * nextnonterminal + bootstrap) - values
    advantages = np.zeros_like(deltas)
    lastgaelam = np.zeros_like(next_value)
    for t in reversed(range(len(deltas))):
        advantages[t] = lastgaelam = deltas[t] + gamma * gae_lambda * nextnonterminal[t] * lastgaelam
    return advantages


def select_action(agent: Agent, obs: torch.Tensor, method: str, temperature: float = 1.0, k: int = 2) -> torch.Tensor:
    """An action for evaluation: greedy (argmax / mean), basic (sample), temperature, topk or bottomk (discrete)."""
    dist = agent.distribution(obs)
    if method == "greedy":
        return dist.probs.argmax(-1) if agent.discrete else dist.mean
    if method == "basic":
        return dist.sample()
    if method == "temperature":
        if agent.discrete:
            return Categorical(logits=dist.logits / temperature).sample()
        return Normal(dist.mean, dist.stddev * temperature).sample()
    if not agent.discrete:
        raise UsageError(f"--sampling-method {method} needs a discrete action space")
    k = min(k, dist.logits.shape[-1])
    kept = dist.logits.topk(k, dim=-1, largest=method == "topk")
    return kept.indices.gather(-1, Categorical(logits=kept.values).sample().unsqueeze(-1)).squeeze(-1)


def evaluate(
    agent: Agent,
    args: Args,
    writer: SummaryWriter,
    global_step: int,
    device: torch.device,
    method: str = "greedy",
    trajectory_path: str | None = None,
) -> list[float]:
    """Play `args.eval_episodes` episodes in one env, seeded from `args.seed`; log and return their returns.

    The agent's observation statistics are only read here, never updated.
    """
    env = gym.wrappers.vector.RecordEpisodeStatistics(
        gym.vector.SyncVectorEnv(
            [make_env(args.env_id, 0, False, "", 1)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )
    )
    trajectory_writer = TrajectoryWriter(1, meta={"args": asdict(args)}) if trajectory_path else None
    returns: list[float] = []
    obs_np, _ = env.reset(seed=args.seed)
    with torch.inference_mode():
        while len(returns) < args.eval_episodes:
            obs = torch.as_tensor(obs_np, dtype=torch.float32, device=device)
            action = select_action(agent, obs, method, args.temperature, args.sampling_k)
            sent_action = env_action(action.cpu().numpy(), env.single_action_space)
            next_obs_np, reward, terminated, truncated, infos = env.step(sent_action)
            if trajectory_writer is not None:
                trajectory_writer.add_step(obs_np, sent_action, reward, terminated, truncated, infos=infos)
            if "_episode" in infos and infos["_episode"][0]:
                returns.append(float(infos["episode"]["r"][0]))
                writer.add_scalar("eval/episodic_return", returns[-1], global_step + len(returns) - 1)
            obs_np = next_obs_np
    env.close()
    if trajectory_writer is not None:
        trajectory_writer.save(trajectory_path)
    return returns


def upload_videos(video_folder: str, uploaded: set[str]) -> None:
    """Send the videos of `video_folder` that are not in `uploaded` to wandb, and remember them there."""
    import wandb

    for path in sorted(Path(video_folder).glob("*.mp4")):
        if str(path) not in uploaded:
            wandb.log({"videos": wandb.Video(str(path), format="mp4")})
            uploaded.add(str(path))


def evaluate_checkpoint(args: Args) -> list[float]:
    """Rebuild the agent from a checkpoint alone, evaluate it, print mean and std of the return."""
    check_args(args)
    checkpoint = load_checkpoint(args.eval_checkpoint)
    evaluation = {
        name: getattr(args, name)
        for name in (
            "eval_episodes",
            "sampling_method",
            "temperature",
            "sampling_k",
            "run_dir",
            "cuda",
            "torch_threads",
        )
    }
    trained = args_from_checkpoint(checkpoint, evaluation)
    if trained.eval_episodes <= 0:
        raise UsageError("--eval-episodes must be positive with --eval-checkpoint")
    device = seed_and_pick_device(trained)
    agent, _ = build_agent(trained, checkpoint, device)
    if trained.sampling_method in ("topk", "bottomk") and not agent.discrete:
        raise UsageError(f"--sampling-method {trained.sampling_method} needs a discrete action space")
    agent.eval()
    run_path = Path(args.run_dir) / f"{new_run_name(trained)}__eval"
    writer = SummaryWriter(str(run_path))
    returns = evaluate(
        agent, trained, writer, int(checkpoint["global_step"]), device, trained.sampling_method, args.save_trajectories
    )
    writer.close()
    print(f"{args.eval_checkpoint}: {len(returns)} episodes, return {np.mean(returns):.2f} +- {np.std(returns):.2f}")
    return returns


def parse_args(argv: list[str] | None = None) -> Args:
    """tyro's parser, with a parse error reduced to one `error:` line (exit status 2)."""
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        return tyro.cli(Args, args=argv)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            return tyro.cli(Args, args=argv)
    except SystemExit:
        lines = [line.strip(" │╭╮╰╯─-") for line in captured.getvalue().splitlines()]
        lines = [line for line in lines if line]
        message = lines[1] if len(lines) > 1 else "invalid arguments"
        raise UsageError(f"{message} (see --help)") from None


def main() -> int:
    try:
        args = parse_args()
        if args.eval_checkpoint:
            evaluate_checkpoint(args)
        else:
            result = train(args)
            summary = f"{result.run_dir}: {result.global_step} steps, {len(result.episode_returns)} episodes"
            if result.episode_returns:
                summary += f", last-100 return {np.mean(result.episode_returns[-100:]):.2f}"
            if result.eval_returns:
                summary += f", eval return {np.mean(result.eval_returns):.2f} +- {np.std(result.eval_returns):.2f}"
            print(summary)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except TrainingDiverged as exc:
        print(f"error: training diverged: {exc}; the last good checkpoint is kept", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
