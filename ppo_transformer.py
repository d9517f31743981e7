"""PPO with a causal transformer memory (GPT-style blocks over one token per step, a sliding window
of attention in every layer, actor and critic heads on the current step's token) for discrete and
continuous actions. Read top to bottom: arguments, environments, network, then ``train()``. Run
plumbing is in ``common/``; docs/ppo_transformer.md gives the reasons for the defaults."""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.distributions import Categorical, Normal

import onefile_rl  # noqa: F401  (a copy kept outside the checkout finds common/ through it)
import probe_envs  # noqa: F401  (registers the probe ids with gymnasium)
from common import cli, envs, rollout_checks
from common.envs import cnn_layout, observation_map, observation_tensor, observation_zeros
from common.run_start import Run, TrainResult
from common.running_norm import RunningNorm

SCRIPT = Path(__file__).stem
PAGE = "docs/ppo_transformer.md"  # what a check's error points to, in a copy too


@dataclass
class Args:
    """PPO with a causal transformer memory for discrete and continuous actions, with CleanRL's
    flags."""

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
    """the learning rate of the optimizer (docs/ppo_transformer.md)"""
    num_envs: int = 8
    """the number of parallel environments (docs/ppo_transformer.md)"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 2
    """the number of minibatches (docs/ppo_transformer.md)"""
    update_epochs: int = 10
    """the K epochs to update the policy (docs/ppo_transformer.md)"""
    norm_adv: bool = False
    """toggles advantages normalization per minibatch (off here: docs/ppo_transformer.md)"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient (docs/ppo_transformer.md)"""
    clip_vloss: bool = False
    """toggles whether or not to use a clipped loss for the value function"""
    ent_coef: float = 0.0
    """coefficient of the entropy (docs/ppo_transformer.md)"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = 0.02
    """stop the epochs of an update once the approximate KL exceeds this (None: never)"""

    # Beyond CleanRL's flags: this script's own
    end_learning_rate: float = 0.0
    """with --anneal-lr, the learning rate falls linearly towards this value"""
    bootstrap_truncation: bool = True
    """if toggled, truncated episodes bootstrap from the value of their last observation"""
    norm_obs: bool = True
    """if toggled, normalise the env's observations (not images, not the previous action, reward)"""
    norm_reward: bool = True
    """if toggled, scale rewards by the running std of the discounted return (NormalizeReward)"""
    norm_reward_clip: float = 10.0
    """with --norm-reward, clip the scaled rewards to [-this, this] (CleanRL's 10)"""
    d_model: int = 64
    """the width of the tokens (the residual stream)"""
    n_heads: int = 4
    """the attention heads of each layer (they divide --d-model, into an even width each)"""
    n_layers: int = 2
    """the transformer blocks: the memory reaches back --n-layers x (--context-len - 1) steps"""
    context_len: int = 32
    """K: each step attends to itself and the K - 1 steps before it in its episode, in each layer"""
    prev_action_reward: bool = True
    """if toggled, observations carry the previous action and reward (zeros at episode starts)"""
    encoder: Literal["auto", "mlp", "cnn"] = "auto"
    """auto: a CNN for uint8 images (rank 2-3, channels first or last, 36x36 or more), else MLP"""

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
    torch_threads: int | None = None
    """CPU threads for torch (default: all for a CNN or 256-unit layers, else 1; 0: torch's)"""
    progress: bool = True
    """if toggled, show a progress bar with the step count, SPS and the recent mean return"""
    dist_backend: str | None = None
    """under torchrun: the process group's backend (default: nccl on a GPU, gloo on the CPU)"""


def make_env(
    env_id: str, idx: int = 0, capture_video: bool = False, video_folder: str = "", video_every: int = 1,
    prev_action_reward: bool = True,
):  # fmt: skip
    def thunk():
        # gym.make, gymnasium's RecordVideo for env 0 (--capture-video), CleanRL's Atari wrappers
        # (only for Atari games; one frame, as the memory sees the steps before it), observations as
        # the network takes them
        video = video_folder if capture_video and idx == 0 else None
        env = envs.make(env_id, frame_stack=1, video_folder=video, video_every=video_every)
        # others: refused later
        actions_known = isinstance(env.action_space, (gym.spaces.Discrete, gym.spaces.Box))
        return PreviousActionReward(env) if prev_action_reward and actions_known else env

    return thunk


class PreviousActionReward(gym.Wrapper):
    """Appends the previous action (one-hot when discrete) and reward to the flat observation, or
    to the "vector" part of an image's (an image alone gets one); zeros at an episode's first step.
    Inside the env: evaluation, trajectory files and replays see them too."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.discrete = isinstance(env.action_space, gym.spaces.Discrete)
        self.action_size = (
            int(env.action_space.n) if self.discrete else int(np.prod(env.action_space.shape))
        )
        space = env.observation_space
        extra = np.full(self.action_size + 1, np.inf, dtype=np.float32)
        self.image = cnn_layout(space, "auto") is not None
        if self.image:
            space = gym.spaces.Dict({"image": space, "vector": gym.spaces.Box(-extra, extra)})
        elif isinstance(space, gym.spaces.Dict):
            vector = space["vector"]
            low, high = np.concatenate([vector.low, -extra]), np.concatenate([vector.high, extra])
            space = gym.spaces.Dict({"image": space["image"], "vector": gym.spaces.Box(low, high)})
        else:
            low, high = space.low.astype(np.float32), space.high.astype(np.float32)
            space = gym.spaces.Box(np.concatenate([low, -extra]), np.concatenate([high, extra]))
        self.observation_space = space

    def with_previous(
        self, obs: np.ndarray | dict, action=None, reward: float = 0.0
    ) -> np.ndarray | dict:
        previous = np.zeros(self.action_size + 1, dtype=np.float32)
        if action is not None and self.discrete:
            previous[int(action) - int(self.env.action_space.start)] = 1.0
        elif action is not None:
            previous[:-1] = np.asarray(action, dtype=np.float32).reshape(-1)
        previous[-1] = reward
        if self.image:
            return {"image": obs, "vector": previous}
        if isinstance(obs, dict):
            return {"image": obs["image"], "vector": np.concatenate([obs["vector"], previous])}
        return np.concatenate([np.asarray(obs, dtype=np.float32), previous])

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self.with_previous(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self.with_previous(obs, action, float(reward)), reward, terminated, truncated, info


def layer_init(
    layer: nn.Linear | nn.Conv2d, std: float = math.sqrt(2), bias_const: float = 0.0
) -> nn.Module:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class NatureCNN(nn.Module):
    """The Nature DQN's three convolutions and 512 units, as in CleanRL's ppo_atari.py, on images of
    `layout` ("hw", "chw" or "hwc"), uint8, scaled by 1/255; any leading batch axes."""

    def __init__(self, image_space: gym.spaces.Box, layout: str):
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
        self.linear = nn.Sequential(layer_init(nn.Linear(conv_size, 512)), nn.ReLU())
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

    def forward(self, x: Tensor) -> Tensor:
        batch_shape = x.shape[: x.dim() - len(self.image_shape)]
        x = self.channels_first(x.reshape(-1, *self.image_shape)) / 255.0
        x = x.contiguous(memory_format=torch.channels_last)
        return self.linear(self.convs(x)).reshape(*batch_shape, -1)


# The transformer, read like nanoGPT's model.py: a config, attention, MLP, block. Tokens are (batch,
# time, d_model).


@dataclass
class TransformerConfig:
    """What the network is built from. Once built, its sizes are read from its modules, so that an
    edit to a module holds; K stays here, the window of every mask and of the rollout's context."""

    d_model: int
    """the width of the tokens"""
    n_heads: int
    """the attention heads of each layer"""
    n_layers: int
    """the blocks"""
    context_len: int
    """K: each step attends to itself and the K - 1 steps before it in its episode"""


def rotary(positions: Tensor, head_size: int) -> tuple[Tensor, Tensor]:
    """RoPE's cosines and sines for the heads of a layer, at `positions` (B, T) in their episodes:
    rotated queries and keys let attention see how far apart two steps are, not where they are."""
    frequencies = 10_000.0 ** -(torch.arange(0, head_size, 2, device=positions.device) / head_size)
    # (B, 1, T, head_size / 2), shared by the heads
    angles = positions[:, None, :, None].float() * frequencies
    return angles.cos(), angles.sin()


def rotate(x: Tensor, rotation: tuple[Tensor, Tensor]) -> Tensor:
    cos, sin = rotation
    x1, x2 = x.chunk(2, -1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


KeysValues = tuple[Tensor, Tensor]
"""one layer's keys and values, each (B, nh, T, hs)"""
RotationFor = Callable[[int], tuple[Tensor, Tensor]]
"""RoPE's cosines and sines of a pass's steps, for heads of the width given (`rotary`)"""


class CausalSelfAttention(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.c_attn = nn.Linear(config.d_model, 3 * config.d_model)
        self.c_proj = nn.Linear(config.d_model, config.d_model)
        self.n_heads = config.n_heads

    def forward(
        self, x: Tensor, rotation_for: RotationFor, mask: Tensor, cached: KeysValues | None
    ) -> tuple[Tensor, KeysValues]:
        """Attention of `x` (B, T, C), rotated by `rotation_for` its heads' width, to the `cached`
        keys and values and to its own, where `mask` (B, 1, T, cached + T) allows; also the keys and
        values attended to."""
        B, T, C = x.size()  # batch size, sequence length, embedding dimensionality (d_model)
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)  # (B, nh, T, hs)
        # RoPE, not nanoGPT's position embedding: attention sees how far apart steps are
        rotation = rotation_for(C // self.n_heads)
        q = rotate(q, rotation)
        k = rotate(k, rotation)
        if cached is not None:
            k = torch.cat([cached[0], k], 2)  # (B, nh, cached + T, hs)
            v = torch.cat([cached[1], v], 2)  # (B, nh, cached + T, hs)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # the heads side by side
        return self.c_proj(y), (k, v)


class MLP(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.d_model, 4 * config.d_model)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.d_model, config.d_model)

    def forward(self, x: Tensor) -> Tensor:
        x = self.c_fc(x)
        x = self.gelu(x)
        x = self.c_proj(x)
        return x


class Block(nn.Module):
    """A pre-LayerNorm GPT block: attention, then an MLP, each added to the residual stream."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(
        self, x: Tensor, rotation_for: RotationFor, mask: Tensor, cached: KeysValues | None
    ) -> tuple[Tensor, KeysValues]:
        attended, keys_values = self.attn(self.ln_1(x), rotation_for, mask, cached)
        x = x + attended
        x = x + self.mlp(self.ln_2(x))
        return x, keys_values


def window_mask(episodes: Tensor, context_len: int) -> Tensor:
    """Who attends to whom: token i to token j of the same episode (`episodes`: (B, T) ids) with
    i - K < j <= i. (B, 1, T, T), for every layer."""
    index = torch.arange(episodes.shape[1], device=episodes.device)
    back = index[:, None] - index[None, :]  # (T, T): how far token i looks back to token j
    in_window = (back >= 0) & (back < context_len)
    same_episode = episodes[:, :, None] == episodes[:, None, :]  # (B, T, T)
    return (in_window & same_episode)[:, None]


class Agent(nn.Module):
    def __init__(self, observation_space: gym.Space, action_space: gym.Space, args: Args):
        super().__init__()
        self.action_space = action_space
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.action_size = (
            int(action_space.n) if self.discrete else int(np.prod(action_space.shape))
        )
        self.config = TransformerConfig(args.d_model, args.n_heads, args.n_layers, args.context_len)
        # An observation is a vector, an image, or both: the CNN's features of the image, or its
        # pixels with --encoder mlp, go in front of the vector (and the previous action and reward).
        image_space = None
        vector_space = observation_space
        if isinstance(observation_space, gym.spaces.Dict):
            image_space = observation_space["image"]
            vector_space = observation_space["vector"]
        elif cnn_layout(observation_space, "auto"):  # an image
            image_space = observation_space
            vector_space = None
        layout = cnn_layout(image_space or observation_space, args.encoder)
        self.image_rank = len(image_space.shape) if image_space else 0
        self.image_encoder = NatureCNN(image_space, layout) if layout else None
        vector_size = int(np.prod(vector_space.shape)) if vector_space else 0
        if image_space is not None and layout is None:
            vector_size += int(np.prod(image_space.shape))  # the flattened pixels, then the vector
        # The previous action goes in as it is, the reward divided by its running RMS: normalised,
        # a one-hot of an action taken a share p of the time grows as 1/sqrt(p) when taken
        # (docs/ppo_transformer.md).
        previous = self.action_size + 1 if args.prev_action_reward else 0
        action_part = slice(vector_size - previous, vector_size - 1) if previous else None
        reward_part = slice(vector_size - 1, vector_size) if previous else None
        self.obs_norm = None
        if args.norm_obs and vector_size > 0:
            self.obs_norm = RunningNorm(vector_size, as_is=action_part, scaled_only=reward_part)
        self.embed = layer_init(nn.Linear((512 if layout else 0) + vector_size, args.d_model))
        self.blocks = nn.ModuleList(Block(self.config) for _ in range(args.n_layers))
        self.ln_f = nn.LayerNorm(args.d_model)
        # logits or mean
        self.actor = layer_init(nn.Linear(args.d_model, self.action_size), std=0.01)
        self.critic = layer_init(nn.Linear(args.d_model, 1), std=1.0)
        if not self.discrete:
            self.actor_logstd = nn.Parameter(torch.zeros(1, self.action_size))
        # nanoGPT's initialisation, the projections into the residual stream scaled by depth
        for block in self.blocks:
            for layer in block.modules():
                if isinstance(layer, nn.Linear):
                    nn.init.normal_(layer.weight, 0.0, 0.02)
                    if layer.bias is not None:  # an edit's layer may have none
                        nn.init.zeros_(layer.bias)
            for layer in (block.attn.c_proj, block.mlp.c_proj):
                nn.init.normal_(layer.weight, 0.0, 0.02 / math.sqrt(2 * len(self.blocks)))

    @property
    def receptive_field(self) -> int:
        """How many steps back an output can depend on: L(K-1), each sequence's prefix."""
        return len(self.blocks) * (self.config.context_len - 1)

    def forward(
        self,
        obs: Tensor,
        positions: Tensor,
        mask: Tensor,
        cached: list[KeysValues] | None = None,
        outputs_from: int = 0,
    ) -> tuple[Tensor, Tensor, list[KeysValues]]:
        """The actor's output and the value at the steps `obs` (B, T, obs) at `positions` (B, T) in
        their episodes, from step `outputs_from` on, attending where `mask` (B, 1, T, cached + T)
        allows to themselves and each layer's `cached` keys and values; also each layer's keys and
        values."""
        x = self.embed(self.token_input(obs))
        # each layer's rotation for its own heads' width, computed once for the layers that share it
        rotation_for = functools.cache(partial(rotary, positions))
        keys_values = []
        for block, layer_cache in zip(
            self.blocks, cached or [None] * len(self.blocks), strict=True
        ):
            x, layer_keys_values = block(x, rotation_for, mask, layer_cache)
            keys_values.append(layer_keys_values)
        x = self.ln_f(x)
        actor_out, value = self.actor(x), self.critic(x).squeeze(-1)
        return actor_out[:, outputs_from:], value[:, outputs_from:], keys_values

    def token_input(self, obs: Tensor | dict[str, Tensor]) -> Tensor:
        """What each token is made from: the image's CNN features (the image comes as uint8), then
        the vector part, normalised with --norm-obs."""
        vector = self.vector_part(obs)
        if vector is not None and self.obs_norm is not None:
            vector = self.obs_norm(vector)
        if self.image_encoder is None:
            return vector
        image = self.image_encoder(obs["image"] if isinstance(obs, dict) else obs)
        return image if vector is None or vector.shape[-1] == 0 else torch.cat([image, vector], -1)

    def update_obs_norm(self, obs: Tensor | dict[str, Tensor]) -> None:
        """With --norm-obs, where there is a vector: the running statistics take in the rollout's
        observations `obs` (steps, envs, ...) of every rank."""
        if self.obs_norm is not None:
            vectors = self.vector_part(obs)
            self.obs_norm.update(vectors.reshape(-1, vectors.shape[-1]))

    def vector_part(self, obs: Tensor | dict[str, Tensor]) -> Tensor | None:
        """The observation but the CNN's part, as float (what --norm-obs normalises); with --encoder
        mlp an image's pixels come flattened in front; None for an image alone."""
        image, vector = None, obs
        if isinstance(obs, dict):
            image, vector = obs["image"], obs["vector"]
        elif self.image_rank:
            image, vector = obs, None
        if self.image_encoder is None and image is not None:
            pixels = image.flatten(-self.image_rank).float()
            return pixels if vector is None else torch.cat([pixels, vector.float()], -1)
        return None if vector is None else vector.float()

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

    def env_action(self, action: np.ndarray) -> np.ndarray:
        """The env's form of actions: offset by `start` (Discrete), or shaped and clipped to the
        bounds (Box; the log-probability stays the unclipped sample's, as CleanRL's ClipAction)."""
        space = self.action_space
        if self.discrete:
            return action + int(space.start) if space.start else action
        return np.clip(action.reshape(len(action), *space.shape), space.low, space.high)


class Context:
    """What each env's next step attends to: every layer's keys and values of its last K - 1 steps
    (fewer before K - 1 steps were taken), oldest first, and which of them belong to its current
    episode. The rollout steps through it (a key/value cache: one token per step through the
    network, not the window). Its shapes are the layers' own."""

    def __init__(self, agent: Agent, keys_values: list[KeysValues] | None, valid: Tensor):
        self.agent = agent
        self.keep_last(keys_values, valid)

    def keep_last(self, keys_values: list[KeysValues] | None, valid: Tensor) -> None:
        """Keep the last K - 1 of the steps whose keys and values are `keys_values` (None: no step)
        and of which `valid` (B, T) says whether they are of the current episode."""
        dropped = max(valid.shape[1] - (self.agent.config.context_len - 1), 0)
        if keys_values is not None:
            keys_values = [(k[:, :, dropped:], v[:, :, dropped:]) for k, v in keys_values]
        self.keys_values, self.valid = keys_values, valid[:, dropped:]

    @classmethod
    @torch.no_grad()
    def after(cls, agent: Agent, obs: Tensor, positions: Tensor, valid: Tensor) -> Context:
        """The context after the steps `obs` (B, T, obs) at `positions`, those `valid` (B, T) of the
        current episode. T must be L(K-1): a layer's step sees K - 1 steps back in the layer below,
        so the last layer's K - 1 keys and values depend on L(K-1) steps."""
        if positions.shape[1] == 0:  # K = 1: a step attends to itself only
            return cls.empty(agent, len(positions))
        episodes = first_of_each_run(valid).cumsum(1)
        _, _, keys_values = agent(obs, positions, window_mask(episodes, agent.config.context_len))
        return cls(agent, keys_values, valid)

    @classmethod
    def empty(cls, agent: Agent, batch_size: int) -> Context:
        """The context of `batch_size` envs before their first steps: nothing."""
        device = next(agent.parameters()).device
        return cls(agent, None, torch.zeros((batch_size, 0), dtype=torch.bool, device=device))

    @torch.no_grad()
    def step(self, obs: Any, positions: Any, starts: Any, envs: Any = None, keep: bool = True):
        """The actor's output and value of each env's (or `envs`') next step, `obs` (B, obs) at
        `positions` (B,), starting episodes where `starts` (B,), tensors or arrays; with `keep` it
        joins the context."""
        if envs is not None and keep:
            raise ValueError("a step of some envs only cannot join the context of all")
        as_tensor = partial(torch.as_tensor, device=self.valid.device)
        obs = observation_tensor(obs, self.valid.device)
        keys_values = self.keys_values
        valid = self.valid
        if envs is not None:
            envs = as_tensor(envs)
            if keys_values is not None:
                keys_values = [(k[envs], v[envs]) for k, v in keys_values]
            valid = valid[envs]
        valid = valid & ~as_tensor(starts)[:, None]
        # (B, 1, 1, K at most): the context's steps of the step's episode, and the step itself
        mask = torch.cat([valid, valid.new_ones(len(valid), 1)], 1)[:, None, None, :]
        actor_out, value, keys_values = self.agent(
            obs[:, None], as_tensor(positions)[:, None], mask, keys_values
        )
        if keep:
            self.keep_last(keys_values, mask[:, 0, 0])
        return actor_out[:, 0], value[:, 0]

    def value(self, obs: Any, positions: Any, starts: Any = None, envs: Any = None) -> np.ndarray:
        """The values of steps that do not join the context: each env's next one (`starts`: where
        it starts an episode), or the last observations of `envs`' truncated episodes."""
        starts = np.zeros(len(positions), dtype=bool) if starts is None else starts
        return self.step(obs, positions, starts, envs, keep=False)[1].cpu().numpy()


def first_of_each_run(valid: Tensor) -> Tensor:
    """Where each run of `valid` (B, T) steps begins: a context's first step of its episode."""
    return valid & ~torch.cat([torch.zeros_like(valid[:, :1]), valid[:, :-1]], 1)


def train(args: Args) -> TrainResult:
    # checks, torchrun, the checkpoint --resume continues (args become its settings), seeds, device
    run = Run(args, SCRIPT, make_env, check_args, env_kwargs=env_kwargs)
    args, device, world_size = run.args, run.device, run.world_size
    num_envs = args.num_envs
    global_batch_size = num_envs * args.num_steps * world_size  # over all processes
    num_iterations = args.total_timesteps // global_batch_size
    norm_adv = args.norm_adv and global_batch_size > args.num_minibatches  # one step has no std

    agent = build_agent(run)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    # what a checkpoint carries, by key: restored on --resume; rank 0's on every rank under torchrun
    next_obs = run.start({"model": agent, "optimizer": optimizer}, global_batch_size)
    global_step = run.global_step

    # Rollout storage (steps, envs, ...) in NumPy, as CleanRL's; images stay uint8.
    action_shape = () if agent.discrete else (agent.action_size,)
    action_dtype = np.int64 if agent.discrete else np.float32
    obs = observation_zeros(run.envs.single_observation_space, args.num_steps, num_envs)
    actions = np.zeros((args.num_steps, num_envs, *action_shape), dtype=action_dtype)
    rewards = np.zeros((args.num_steps, num_envs), dtype=np.float32)
    terminations = np.zeros((args.num_steps, num_envs), dtype=bool)
    truncations = np.zeros((args.num_steps, num_envs), dtype=bool)
    episode_starts = np.zeros((args.num_steps, num_envs), dtype=bool)
    positions = np.zeros((args.num_steps, num_envs), dtype=np.int64)  # each step's in its episode
    # where an episode was truncated: the value of its last observation
    final_values = np.zeros((args.num_steps, num_envs), dtype=np.float32)

    prefix = agent.receptive_field  # the steps before the rollout's in each sequence
    carried = Carried.start(run.carried, run.envs.single_observation_space, num_envs, prefix)
    max_reward = args.norm_reward_clip
    with run:  # after a Ctrl-C, the run stops at the end of this block with status 130
        for iteration in range(run.iterations_done + 1, num_iterations + 1):
            if args.anneal_lr:
                frac = (iteration - 1.0) / num_iterations
                lrnow = (1.0 - frac) * args.learning_rate + frac * args.end_learning_rate
                optimizer.param_groups[0]["lr"] = lrnow

            # The rollout acts through the key/value context, in eval mode.
            agent.eval()
            context = carried.context(agent)
            # what it acted on: the update's pass must give the same
            acted_outs, acted_values = [], []
            for step in range(args.num_steps):
                global_step += num_envs * world_size
                obs[step] = next_obs
                episode_starts[step] = carried.episode_starts
                positions[step] = carried.episode_positions
                actor_out, value = context.step(obs[step], positions[step], episode_starts[step])
                acted_outs.append(actor_out)
                acted_values.append(value)
                with torch.no_grad():
                    actions[step] = agent.distribution(actor_out).sample().cpu().numpy()
                sent_action = agent.env_action(actions[step])
                next_obs, reward, terminated, truncated, infos = run.envs.step(sent_action)
                terminations[step], truncations[step] = terminated, truncated
                # clipped here, not by a wrapper: the recorder scales the env's own reward back
                rewards[step] = reward.clip(-max_reward, max_reward) if args.norm_reward else reward
                run.step(sent_action, next_obs, reward, terminated, truncated, infos, global_step)
                # truncated episodes bootstrap from the value of their last observation
                truncated_only = truncated & ~terminated
                if args.bootstrap_truncation and truncated_only.any():
                    last_obs = infos["final_obs"][truncated_only]
                    final_values[step, truncated_only] = context.value(
                        last_obs, positions[step, truncated_only] + 1, envs=truncated_only
                    )
                carried.episode_starts = terminated | truncated
                carried.episode_positions = np.where(carried.episode_starts, 0, positions[step] + 1)
            run.combine_return_stats()  # all ranks go on from the return statistics of all envs
            next_value = context.value(next_obs, carried.episode_positions, carried.episode_starts)

            # The batch: each env's sequence (envs, steps, ...), its context, then its rollout.
            b_obs, b_positions, b_episodes = carried.batch(obs, positions, episode_starts, device)
            b_mask = window_mask(b_episodes, agent.config.context_len)
            b_actions = by_env(actions, device)
            with torch.no_grad():
                b_actor_outs, b_values, _ = agent(b_obs, b_positions, b_mask, outputs_from=prefix)
                acted_outs, acted_values = torch.stack(acted_outs, 1), torch.stack(acted_values, 1)
                acted = (acted_outs, acted_values)
                check_outputs(acted, (b_actor_outs, b_values), b_positions, CONTEXT_MISMATCH)
                b_logprobs = check_policy(b_actor_outs, b_actions, agent)
                values = b_values.T.cpu().numpy()
                advantages = compute_gae(
                    rewards, values, next_value, terminations, truncations, final_values,
                    args.gamma, args.gae_lambda,
                )  # fmt: skip
                b_advantages = by_env(advantages, device)
                b_returns = b_advantages + b_values
            carried.keep_context(b_obs, b_positions, b_episodes)  # the next rollout's
            sampled = {} if agent.discrete else {"actions": actions}  # the unclipped sample
            run.end_rollout(logprobs=b_logprobs.T, values=values, position=positions, **sampled)

            # batch norm's statistics as the rollout acted: the replay check's, after train mode's
            acted_buffers = {name: b.clone() for name, b in agent.named_buffers()}
            agent.train()
            ratios = []
            for epoch in range(args.update_epochs):  # minibatches of whole sequences
                minibatches = torch.randperm(num_envs, device=device).view(args.num_minibatches, -1)
                if norm_adv:  # every global minibatch's mean and std: the epoch's in one all-reduce
                    adv_means, adv_stds = run.mean_std_over_ranks(b_advantages[minibatches])
                for i, mb_envs in enumerate(minibatches):
                    mb_sequences = (b_obs[mb_envs], b_positions[mb_envs], b_mask[mb_envs])
                    actor_out, newvalue, _ = agent(*mb_sequences, outputs_from=prefix)
                    if epoch == 0 and i == 0:  # no step yet: this pass replays the rollout's
                        mb_acted = (acted_outs[mb_envs], acted_values[mb_envs])
                        replay = (agent, acted_buffers, mb_sequences, prefix)
                        check_replay(mb_acted, (actor_out, newvalue), b_positions[mb_envs], *replay)
                    newlogprob, entropy = agent.log_prob_and_entropy(actor_out, b_actions[mb_envs])
                    logratio = newlogprob - b_logprobs[mb_envs]
                    ratio = logratio.exp()
                    ratios.append(ratio.detach())

                    mb_advantages = b_advantages[mb_envs]
                    if norm_adv:
                        mb_advantages = (mb_advantages - adv_means[i]) / (adv_stds[i] + 1e-8)

                    pg_loss1 = -mb_advantages * ratio
                    pg_loss2 = -mb_advantages * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)
                    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                    if args.clip_vloss:
                        v_loss_unclipped = (newvalue - b_returns[mb_envs]) ** 2
                        v_clipped = b_values[mb_envs] + torch.clamp(
                            newvalue - b_values[mb_envs], -args.clip_coef, args.clip_coef
                        )
                        v_loss_clipped = (v_clipped - b_returns[mb_envs]) ** 2
                        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                    else:
                        v_loss = 0.5 * ((newvalue - b_returns[mb_envs]) ** 2).mean()

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
            # after the update, which used the statistics the rollout acted with
            agent.update_obs_norm(observation_tensor(obs, device))

            clipfrac = ((torch.cat(ratios) - 1.0).abs() > args.clip_coef).float().mean()
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
            if run.iteration_done(iteration, global_step, **vars(carried)):  # a checkpoint if due
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


# What train() calls, for a second reading: argument checks, the agent, what the loop carries, the
# checks of the rollout against the update, evaluation.


def check_args(args: Args) -> None:
    """Reject bad settings (ValueError) before anything is built or written."""
    positive = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs")
    positive += ("video_every", "sampling_k", "temperature", "learning_rate", "clip_coef")
    positive += ("max_grad_norm", "d_model", "n_heads", "n_layers", "context_len")
    non_negative = ("seed", "eval_episodes", "checkpoint_every", "torch_threads")
    non_negative += ("checkpoint_minutes", "end_learning_rate")
    cli.check_ranges(
        args, (*positive, "target_kl", "norm_reward_clip"), non_negative, ("gamma", "gae_lambda")
    )
    if args.d_model % args.n_heads or (args.d_model // args.n_heads) % 2:
        raise ValueError(
            f"--n-heads {args.n_heads} must divide --d-model {args.d_model} into an even width per "
            "head (RoPE rotates pairs)"
        )
    if args.num_envs % args.num_minibatches:
        raise ValueError(
            f"--num-minibatches {args.num_minibatches} must divide --num-envs {args.num_envs} "
            "(minibatches are whole env rollouts)"
        )
    batch_size = args.num_envs * args.num_steps * int(os.environ.get("WORLD_SIZE", 1))  # torchrun's
    if args.total_timesteps < batch_size:
        raise ValueError(
            f"--total-timesteps {args.total_timesteps} is less than one batch ({batch_size} steps)"
        )


def env_kwargs(args: Args) -> dict[str, Any]:
    """What `make_env` takes from the run's settings."""
    return {"prev_action_reward": args.prev_action_reward}


def build_agent(run: Run) -> Agent:
    """The agent for the run's env and settings, on its device (a checkpoint's weights come later)."""
    return Agent(run.observation_space, run.action_space, run.args).to(run.device)


@dataclass
class Carried:
    """What the loop carries from one rollout to the next, and a checkpoint with it (`Run.save`;
    back in `run.carried`): each env's next step's place in its episode, and its last L(K-1)
    steps (envs, L(K-1), ...), which give the rollout's context and begin the update's sequence."""

    episode_starts: np.ndarray
    episode_positions: np.ndarray
    context_obs: np.ndarray | dict
    context_positions: np.ndarray
    context_valid: np.ndarray  # of the episode that the next step continues

    @classmethod
    def start(cls, resumed: dict, space: gym.Space, num_envs: int, prefix: int) -> Carried:
        """A resumed run's, else a new run's: episodes to start, no context."""
        new = cls(
            np.ones(num_envs, dtype=bool),
            np.zeros(num_envs, dtype=np.int64),
            observation_zeros(space, num_envs, prefix),
            np.zeros((num_envs, prefix), dtype=np.int64),
            np.zeros((num_envs, prefix), dtype=bool),
        )
        return cls(**{name: resumed.get(name, value) for name, value in vars(new).items()})

    def context_tensors(self, device: torch.device) -> tuple[Tensor | dict, Tensor, Tensor]:
        """The carried steps (observations, positions, validity) as tensors on `device`."""
        as_tensor = partial(torch.as_tensor, device=device)
        obs = observation_tensor(self.context_obs, device)
        return obs, as_tensor(self.context_positions), as_tensor(self.context_valid)

    def context(self, agent: Agent) -> Context:
        """The rollout's key/value context after each env's carried steps."""
        return Context.after(agent, *self.context_tensors(next(agent.parameters()).device))

    def batch(
        self, obs: Any, positions: np.ndarray, starts: np.ndarray, device: torch.device
    ) -> tuple[Any, Tensor, Tensor]:
        """The update's sequences (envs, prefix + steps, ...): each env's carried steps, then the
        rollout's `obs`, `positions`, episode `starts` (steps, envs, ...). Their obs, positions and
        episode ids."""
        context_obs, context_positions, context_valid = self.context_tensors(device)
        join = lambda before, part: torch.cat([before, by_env(part, device)], 1)  # noqa: E731
        b_obs = observation_map(join, context_obs, obs)
        b_starts = join(first_of_each_run(context_valid), starts)
        return b_obs, join(context_positions, positions), b_starts.cumsum(1)

    def keep_context(self, b_obs: Any, b_positions: Tensor, b_episodes: Tensor) -> None:
        """After `batch`, with what it gave: each env's last L(K-1) steps are the next context
        (valid: of the episode its next step continues)."""
        device, prefix = b_positions.device, self.context_valid.shape[1]
        steps = b_positions.shape[1] - prefix
        rollout_valid = torch.ones_like(b_positions[:, prefix:], dtype=torch.bool)
        b_valid = torch.cat([torch.as_tensor(self.context_valid, device=device), rollout_valid], 1)
        next_starts = torch.as_tensor(self.episode_starts, device=device)
        current = (b_episodes == b_episodes[:, -1:]) & b_valid & ~next_starts[:, None]
        last_steps = lambda part: part[:, steps:].cpu().numpy()  # noqa: E731
        self.context_obs = observation_map(last_steps, b_obs)
        self.context_positions = last_steps(b_positions)
        self.context_valid = last_steps(current)


@torch.no_grad()
def eval_pass(
    agent: Agent, buffers: dict[str, Tensor], *inputs: Any, **options: Any
) -> tuple[Tensor, Tensor]:
    """The actor outputs and values of `agent` in eval mode, with the `buffers` (batch norm's
    statistics) it had then: as the rollout acted."""
    agent.eval()
    actor_out, value, _ = torch.func.functional_call(agent, buffers, inputs, options)
    agent.train()
    return actor_out, value


def by_env(rollout: np.ndarray, device: torch.device) -> Tensor:
    """A rollout's (steps, envs, ...) array as each env's sequence, (envs, steps, ...)."""
    return torch.as_tensor(rollout, device=device).transpose(0, 1)


CONTEXT_MISMATCH = (
    "the rollout's key/value context (Context.step, a step at a time) acted otherwise than "
    "Agent.forward along each env's sequence, both in eval mode: they attend to other steps (each "
    "step must see the K - 1 steps before it in its episode, as window_mask allows), or the "
    "network computes a step otherwise beside other steps (a layer that mixes steps outside "
    "attention) or at random in eval mode; Context.step and Agent.forward must compute the same "
    f'({PAGE}, "When a check stops a run")'
)
REPLAY_MISMATCH = (
    "before any gradient step, the update's pass along a minibatch of the envs' sequences differs "
    "from what the rollout acted on, which the pass along all of them gave: the network's outputs "
    "depend on which envs share its batch (as batch statistics do) or vary from call to call; "
    "each env's outputs must depend on its own sequence alone, in Agent.forward "
    f'({PAGE}, "When a check stops a run")'
)


def check_outputs(
    recorded: tuple[Tensor, Tensor], replayed: tuple[Tensor, Tensor], positions: Tensor, why: str,
    eval_replay: Callable[[], tuple[Tensor, Tensor]] | None = None,
) -> None:  # fmt: skip
    """Stop unless `replayed` actor outputs and values equal the `recorded` ones (B, T, ...) to
    1e-4 of their largest magnitude plus 1e-5 (`common.rollout_checks.check_replay`, with `eval_replay`);
    the message says at which step of an episode (`positions`: the whole sequences' (B, prefix + T))."""
    positions = positions[:, positions.shape[1] - recorded[1].shape[1] :]

    def where(index: int) -> str:
        return f"at step {int(positions.flatten()[index])} of an episode"

    rollout_checks.check_replay(recorded, replayed, why, where, eval_replay)


def check_replay(
    recorded: tuple[Tensor, Tensor], replayed: tuple[Tensor, Tensor], positions: Tensor,
    agent: Agent, buffers: dict[str, Tensor], sequences: tuple[Tensor, ...], prefix: int,
) -> None:  # fmt: skip
    """Before the first gradient step: stop unless the update's pass along a minibatch's
    `sequences` gave the `recorded` outputs the rollout acted on (`check_outputs`); where it did
    not, the same pass in eval mode, with the `buffers` (batch norm's statistics) the rollout acted
    with, decides, as the rollout acted (a network that trains otherwise, dropout say)."""
    in_eval = partial(eval_pass, agent, buffers, *sequences, outputs_from=prefix)
    check_outputs(recorded, replayed, positions, REPLAY_MISMATCH, in_eval)


def check_policy(actor_outs: Tensor, actions: Tensor, agent: Agent) -> Tensor:
    """The log-probabilities of the rollout's `actions` at the policy's `actor_outs`, after checking
    that the actions are plausibly its draws (common/rollout_checks.py)."""
    draws = (
        "the loop must store the action agent.distribution(actor_out).sample() drew; exploration, a "
        "temperature or a change of the action belongs in Agent.distribution"
    )
    policy = agent.distribution(actor_outs.flatten(0, 1))
    section = f'({PAGE}, "When a check stops a run")'
    rollout_checks.check_actions(actions.flatten(0, 1), policy, draws=draws, section=section)
    return agent.log_prob_and_entropy(actor_outs, actions)[0]


def evaluate(agent: Agent, run: Run, record_to: Path | None = None) -> list[float]:
    """Play --eval-episodes episodes, actions by --sampling-method, each recorded with its step's
    position in its episode; log them at the run's step and return their returns (`Run.evaluate`).
    """
    context = Context.empty(agent, 1)
    position = np.zeros(1, dtype=np.int64)

    @torch.inference_mode()
    def act(obs: np.ndarray, episode_starts: np.ndarray) -> tuple[np.ndarray, dict]:
        nonlocal position
        position = np.where(episode_starts, 0, position + 1)
        actor_out, _ = context.step(obs, position, episode_starts)
        action = run.select_action(agent.distribution(actor_out))
        recorded = {"policy": {"position": position.copy()}}
        return agent.env_action(action.cpu().numpy()), recorded

    return run.evaluate(agent, act, record_to=record_to)


def evaluate_checkpoint(args: Args) -> list[float]:
    """Rebuild the agent from a checkpoint alone, evaluate it, print mean and std of the return."""
    # the checkpoint's run
    run = Run(args, SCRIPT, make_env, check_args, env_kwargs=env_kwargs)
    agent = build_agent(run)
    return run.evaluate_checkpoint(agent, lambda record_to: evaluate(agent, run, record_to))


def main() -> int:
    """The command line: --eval-checkpoint evaluates, else `train`; the exit status."""
    return cli.main(Args, train, evaluate_checkpoint)


if __name__ == "__main__":
    sys.exit(main())
