"""PPO with an MLP actor and critic, for discrete and continuous actions, after CleanRL's ppo.py.
Read top to bottom: arguments, environments, network, then ``train()``: rollout, GAE, minibatch
updates, Adam with a linear LR decay. Run plumbing is in ``common/``; the README's "Copy and modify"
says what an edit must touch."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from torch import Tensor
from torch.distributions import Categorical, Normal

import onefile_rl  # noqa: F401  (a copy kept outside the checkout finds common/ through it)
import probe_envs  # noqa: F401  (registers the probe ids with gymnasium)
from common import capture, cli, envs, rollout_checks
from common.envs import cnn_layout, observation_tensor, observation_zeros
from common.numpy_copy import numpy_copy
from common.run_start import Run, TrainResult
from common.running_norm import RunningNorm

SCRIPT = Path(__file__).stem
PAGE = "docs/ppo_fc.md"  # what a check's error points to, in a copy too


@dataclass
class Args:
    """PPO with an MLP actor and critic, for discrete and continuous actions, with CleanRL's flags."""

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
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 4
    """the number of parallel environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
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

    # Beyond CleanRL's flags: this script's own
    end_learning_rate: float = 0.0
    """with --anneal-lr, the learning rate falls linearly towards this value"""
    bootstrap_truncation: bool = True
    """if toggled, truncated episodes bootstrap from the value of their last observation"""
    norm_obs: bool = False
    """if toggled, normalise observations by running statistics (frozen in evaluation; no images)"""
    norm_reward: bool = False
    """if toggled, scale rewards by the running std of the discounted return (NormalizeReward)"""
    norm_reward_clip: float = 10.0
    """with --norm-reward, clip the scaled rewards to [-this, this] (CleanRL's 10)"""
    hidden_size: int = 64
    """width of the two hidden layers of the actor and of the critic"""
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
    numpy_rollout: bool = True
    """if toggled, the rollout acts through a NumPy copy of the policy, checked against it"""
    compile: bool = False
    """if toggled, torch.compile the action step and the minibatch step (no NumPy copy then)"""
    cuda_graphs: bool = False
    """if toggled, replay the action step and the minibatch step as CUDA graphs (one GPU)"""
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
        # (only for Atari games), observations as the network takes them
        video = video_folder if capture_video and idx == 0 else None
        return envs.make(env_id, frame_stack=4, video_folder=video, video_every=video_every)

    return thunk


def layer_init(
    layer: nn.Linear | nn.Conv2d, std: float = math.sqrt(2), bias_const: float = 0.0
) -> nn.Module:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class NatureCNN(nn.Module):
    """The Nature DQN's three convolutions and 512 units, as in CleanRL's ppo_atari.py, on images of
    `layout` ("hw", "chw" or "hwc"), uint8, scaled by 1/255; any leading batch axes. A vector of
    `vector_size` (a Dict observation's other parts) joins the convolutions' output, so that the 512
    units can combine the two."""

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


class Agent(nn.Module):
    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        hidden_size: int,
        norm_obs: bool,
        encoder: str = "auto",
    ):
        super().__init__()
        self.action_space = action_space
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.action_size = (
            int(action_space.n) if self.discrete else int(np.prod(action_space.shape))
        )
        # A Dict observation is an image and a vector (common.envs.image_and_vector): the vector
        # joins the image's CNN features (or, with --encoder mlp, its flattened pixels).
        self.parts = isinstance(observation_space, gym.spaces.Dict)
        image_space = observation_space["image"] if self.parts else observation_space
        vector_size = int(np.prod(observation_space["vector"].shape)) if self.parts else 0
        layout = cnn_layout(image_space, encoder)
        self.cnn = layout is not None
        if self.cnn:  # ppo_atari.py's agent: one CNN trunk, then a linear actor and critic
            self.network = NatureCNN(image_space, layout, vector_size)
            self.obs_norm = nn.Identity()  # never of the image
            if norm_obs and vector_size:
                self.obs_norm = RunningNorm(vector_size)
            self.critic = layer_init(nn.Linear(512, 1), std=1.0)
            self.actor = layer_init(nn.Linear(512, self.action_size), std=0.01)
        else:
            observation_size = int(np.prod(image_space.shape)) + vector_size
            # An image taken as a vector (--encoder mlp) is flattened; a vector stays as it is.
            self.network = nn.Flatten(start_dim=-len(image_space.shape))
            self.obs_norm = RunningNorm(observation_size) if norm_obs else nn.Identity()
            self.critic = nn.Sequential(
                layer_init(nn.Linear(observation_size, hidden_size)),
                nn.Tanh(),
                layer_init(nn.Linear(hidden_size, hidden_size)),
                nn.Tanh(),
                layer_init(nn.Linear(hidden_size, 1), std=1.0),
            )
            self.actor = nn.Sequential(  # logits (discrete) or the Gaussian mean (continuous)
                layer_init(nn.Linear(observation_size, hidden_size)),
                nn.Tanh(),
                layer_init(nn.Linear(hidden_size, hidden_size)),
                nn.Tanh(),
                layer_init(nn.Linear(hidden_size, self.action_size), std=0.01),
            )
        if not self.discrete:
            self.actor_logstd = nn.Parameter(torch.zeros(1, self.action_size))

    def forward(self, x: Tensor | dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """The actor's output (the logits, or the Gaussian mean) and the value at observations `x`
        (of any dtype). Both read one hidden vector: the CNN's features of an image (computed once;
        a Dict's normalised vector joins its 512 units), or the normalised observation."""
        if self.cnn and self.parts:
            hidden = self.network(x["image"].float(), self.obs_norm(x["vector"]))
        else:
            hidden = self.obs_norm(self.normalised_part(x))
        return self.actor(hidden), self.critic(hidden).squeeze(-1)

    def normalised_part(self, x: Tensor | dict[str, Tensor]) -> Tensor:
        """What `obs_norm` normalises: a Dict's vector with the CNN, else the observation as one
        vector (an image's pixels flattened with --encoder mlp, a Dict's vector after them)."""
        if not self.parts:
            return self.network(x.float())
        if self.cnn:
            return x["vector"]
        return torch.cat([self.network(x["image"].float()), x["vector"]], -1)

    def update_obs_norm(self, x: Tensor | dict[str, Tensor]) -> None:
        """With --norm-obs (never of an image through the CNN): the running statistics take in the
        batch of observations `x` of every rank."""
        if isinstance(self.obs_norm, RunningNorm):
            self.obs_norm.update(self.normalised_part(x))

    def get_value(self, x: Tensor) -> Tensor:
        return self(x)[1]

    def distribution(self, actor_out: Tensor) -> Categorical | Normal:
        """The policy given the actor's output: its one definition, used by the rollout, the update
        and evaluation."""
        if self.discrete:
            # validating costs more than the network
            return Categorical(logits=actor_out, validate_args=False)
        return Normal(actor_out, self.actor_logstd.expand_as(actor_out).exp(), validate_args=False)

    def get_action_and_value(
        self, x: Tensor, action: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Action (sampled when not given), its log-probability, the policy's entropy, and the value
        at `x`."""
        actor_out, value = self(x)
        policy = self.distribution(actor_out)
        if action is None:
            action = policy.sample()
        if self.discrete:
            return action, policy.log_prob(action), policy.entropy(), value
        # Independent action dimensions: log-probabilities and entropies add up.
        return action, policy.log_prob(action).sum(-1), policy.entropy().sum(-1), value

    def sampling_noise(self, batch_shape: tuple[int, ...]) -> Tensor:
        """The randomness of `sample` for a batch of observations. A rollout draws all of its steps'
        in one call."""
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
        """A draw from `policy` made from `sampling_noise`: the Gumbel-max trick for a categorical,
        mean + std * noise for a Gaussian (as `rsample` does). Fixing the noise lets a faster copy
        of the policy be checked exactly."""
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
    batch_size = args.num_envs * args.num_steps  # this process's share of the global batch
    minibatch_size = batch_size // args.num_minibatches  # and of each global minibatch
    global_batch_size = batch_size * world_size
    num_iterations = args.total_timesteps // global_batch_size
    norm_adv = args.norm_adv and minibatch_size * world_size > 1  # a minibatch of one has no std

    agent = build_agent(run)
    # fused: one kernel for every parameter, a fifth of the update time for a network this small
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    # what a checkpoint carries, by key: restored on --resume; rank 0's on every rank under torchrun
    next_obs = run.start({"model": agent, "optimizer": optimizer}, global_batch_size)
    # --compile, --cuda-graphs: the action step and the minibatch step below, made faster
    # (common.capture); the rollout's actions are checked against the torch policy all the same
    fast_policy = capture.StandIn(args.compile, args.cuda_graphs)
    fast_update = capture.StandIn(args.compile, args.cuda_graphs, keep=(agent, optimizer))
    global_step = run.global_step

    # Rollout storage in NumPy, filled without conversions; images stay uint8 until the network.
    action_shape = () if agent.discrete else (agent.action_size,)
    action_dtype = np.int64 if agent.discrete else np.float32
    obs = observation_zeros(run.envs.single_observation_space, args.num_steps, args.num_envs)
    # where an episode was truncated: its last observation
    final_obs = observation_zeros(run.envs.single_observation_space, args.num_steps, args.num_envs)
    actions = np.zeros((args.num_steps, args.num_envs, *action_shape), dtype=action_dtype)
    rewards = np.zeros((args.num_steps, args.num_envs), dtype=np.float32)
    terminations = np.zeros((args.num_steps, args.num_envs), dtype=bool)
    truncations = np.zeros((args.num_steps, args.num_envs), dtype=bool)

    max_reward = args.norm_reward_clip

    def minibatch_step(
        mb_obs: Tensor, mb_actions: Tensor, mb_logprobs: Tensor, mb_advantages: Tensor,
        mb_returns: Tensor, mb_values: Tensor,
    ) -> tuple[Tensor, ...]:  # fmt: skip
        """One gradient step on a minibatch; the log-ratio, ratio and losses, for the logs."""
        _, newlogprob, entropy, newvalue = agent.get_action_and_value(mb_obs, mb_actions)
        logratio = newlogprob - mb_logprobs
        ratio = logratio.exp()

        pg_loss1 = -mb_advantages * ratio
        pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
        pg_loss = torch.max(pg_loss1, pg_loss2).mean()

        if args.clip_vloss:
            v_loss_unclipped = (newvalue - mb_returns) ** 2
            v_clipped = mb_values + torch.clamp(
                newvalue - mb_values, -args.clip_coef, args.clip_coef
            )
            v_loss_clipped = (v_clipped - mb_returns) ** 2
            v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
        else:
            v_loss = 0.5 * ((newvalue - mb_returns) ** 2).mean()

        entropy_loss = entropy.mean()
        loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        run.average_gradients(agent.parameters())  # the global minibatch's
        nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm, foreach=True)
        optimizer.step()
        return tuple(x.detach() for x in (logratio, ratio, pg_loss, v_loss, entropy_loss))

    # dropout, batch norm: one notice that the update's ratios start away from 1
    forward = lambda net, obs: net(observation_tensor(obs, device))  # noqa: E731
    rollout_checks.acts_otherwise_in_training(agent, forward, next_obs)
    with run:  # after a Ctrl-C, the run stops at the end of this block with status 130
        for iteration in range(run.iterations_done + 1, num_iterations + 1):
            if args.anneal_lr:
                frac = (iteration - 1.0) / num_iterations
                lrnow = (1.0 - frac) * args.learning_rate + frac * args.end_learning_rate
                optimizer.param_groups[0]["lr"] = lrnow

            # The rollout acts in eval mode; log-probs and values come after it, in one torch pass.
            agent.eval()
            sampling_noise = agent.sampling_noise((args.num_steps, args.num_envs))
            noise = sampling_noise.cpu().numpy()
            first = (next_obs, noise[0])  # and where the loop keeps what it gives the policy:
            act = rollout_policy(agent, args.numpy_rollout, first, (obs, noise), fast_policy)
            for step in range(args.num_steps):
                global_step += args.num_envs * world_size
                obs[step] = next_obs
                actions[step] = act(obs[step], noise[step])
                sent_action = agent.env_action(actions[step])
                next_obs, reward, terminated, truncated, infos = run.envs.step(sent_action)
                terminations[step] = terminated
                truncations[step] = truncated
                # clipped here, not by a wrapper: the recorder scales the env's own reward back
                rewards[step] = reward.clip(-max_reward, max_reward) if args.norm_reward else reward
                run.step(sent_action, next_obs, reward, terminated, truncated, infos, global_step)
                if args.bootstrap_truncation and truncated.any():
                    for env_index in np.flatnonzero(truncated):
                        final_obs[step, env_index] = infos["final_obs"][env_index]
            run.combine_return_stats()  # all ranks go on from the return statistics of all envs

            with torch.no_grad():
                b_obs = observation_tensor(obs, device).flatten(0, 1)
                b_actions = torch.as_tensor(actions, device=device).reshape(-1, *action_shape)
                b_actor_outs, b_values = agent(b_obs)
                b_noise = sampling_noise.flatten(0, 1)
                b_logprobs = check_policy(b_actor_outs, b_noise, b_actions, agent, act)
                values = b_values.reshape(args.num_steps, args.num_envs).cpu().numpy()
                next_value = agent.get_value(observation_tensor(next_obs, device))
                # truncated (not terminated) episodes bootstrap from their last observation's value
                final_values = np.zeros_like(rewards)
                truncated_only = truncations & ~terminations
                if args.bootstrap_truncation and truncated_only.any():
                    last_obs = observation_tensor(final_obs[truncated_only], device)
                    final_values[truncated_only] = agent.get_value(last_obs).cpu().numpy()
                advantages = compute_gae(
                    rewards, values, next_value.cpu().numpy(), terminations, truncations, final_values,
                    args.gamma, args.gae_lambda,
                )  # fmt: skip
                b_advantages = torch.as_tensor(advantages, device=device).reshape(-1)
                b_returns = b_advantages + b_values
            sampled = {} if agent.discrete else {"actions": actions}  # the unclipped sample
            b_logprobs_by_step = b_logprobs.reshape(args.num_steps, -1)
            run.end_rollout(logprobs=b_logprobs_by_step, values=values, **sampled)

            agent.train()
            ratios = []
            for _epoch in range(args.update_epochs):
                b_inds = torch.randperm(batch_size, device=device)
                minibatches = b_inds.view(args.num_minibatches, minibatch_size)
                if norm_adv:  # every global minibatch's mean and std: the epoch's in one all-reduce
                    adv_means, adv_stds = run.mean_std_over_ranks(b_advantages[minibatches])
                for i, mb_inds in enumerate(minibatches):
                    mb_advantages = b_advantages[mb_inds]
                    if norm_adv:
                        mb_advantages = (mb_advantages - adv_means[i]) / (adv_stds[i] + 1e-8)
                    logratio, ratio, pg_loss, v_loss, entropy_loss = fast_update(
                        minibatch_step, b_obs[mb_inds], b_actions[mb_inds], b_logprobs[mb_inds],
                        mb_advantages, b_returns[mb_inds], b_values[mb_inds],
                    )  # fmt: skip
                    ratios.append(ratio)

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
            agent.update_obs_norm(b_obs)

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
            if run.iteration_done(iteration, global_step):  # a checkpoint if due; Ctrl-C
                break
        run.end()
    eval_returns = evaluate(agent, run)  # rank 0 alone
    return run.finish(agent, eval_returns)


def compute_gae(
    rewards: np.ndarray, values: np.ndarray, next_value: np.ndarray, terminations: np.ndarray,
    truncations: np.ndarray, final_values: np.ndarray, gamma: float, gae_lambda: float,
) -> np.ndarray:  # fmt: skip
    """GAE for a (num_steps, num_envs) rollout, in NumPy (cheaper than torch for the recursion's
    small steps). An episode end stops the recursion; a truncated step bootstraps from
    `final_values`, its last observation's value."""
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
# the policy, evaluation.


def check_args(args: Args) -> None:
    """Reject bad settings (ValueError) before anything is built or written."""
    positive = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs")
    positive += ("hidden_size", "video_every", "sampling_k", "temperature", "learning_rate")
    positive += ("clip_coef", "max_grad_norm")
    non_negative = ("seed", "eval_episodes", "checkpoint_every", "torch_threads")
    non_negative += ("checkpoint_minutes", "end_learning_rate")
    cli.check_ranges(
        args, (*positive, "target_kl", "norm_reward_clip"), non_negative, ("gamma", "gae_lambda")
    )
    capture.check(args.cuda_graphs, args.cuda)
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches:
        raise ValueError(
            f"--num-minibatches {args.num_minibatches} must divide --num-envs x --num-steps = {batch_size}"
        )
    batch_size *= int(os.environ.get("WORLD_SIZE", 1))  # every process's steps, under torchrun
    if args.total_timesteps < batch_size:
        raise ValueError(
            f"--total-timesteps {args.total_timesteps} is less than one batch ({batch_size} steps)"
        )


def build_agent(run: Run) -> Agent:
    """The agent for the run's env and settings, on its device (a checkpoint's weights come later)."""
    args = run.args
    return Agent(
        run.observation_space, run.action_space, args.hidden_size, args.norm_obs, args.encoder
    ).to(run.device)


def rollout_policy(
    agent: Agent,
    numpy_rollout: bool,
    first: tuple[np.ndarray, np.ndarray],
    stored: tuple[np.ndarray, np.ndarray],
    fast: capture.StandIn | None = None,
) -> rollout_checks.Acting:
    """`Agent.sample(Agent.distribution(agent(obs)[0]), noise)` on NumPy arrays, as the rollout
    calls it: a NumPy copy (with `numpy_rollout`: recorded from the torch policy and checked against
    it on the rollout's `first` observations and noise) or a torch call (`fast` with --compile or
    --cuda-graphs). It keeps what it was given and gave, for the check after the rollout against
    what the loop `stored` (its observations and noise, (steps, envs, ...))."""
    device = next(agent.parameters()).device
    fast = fast or capture.StandIn(compile=False, cuda_graph=False)

    @torch.no_grad()
    def policy(obs: Tensor, noise: Tensor) -> Tensor:
        return agent.sample(agent.distribution(agent(obs)[0]), noise)

    def torch_act(obs: np.ndarray, noise: np.ndarray, call: Callable = fast) -> np.ndarray:
        x = observation_tensor(obs, device)
        return call(policy, x, torch.as_tensor(noise, device=device)).cpu().numpy()

    def update_pass(obs: np.ndarray, noise: np.ndarray) -> Tensor:  # the update's, for one step
        return agent(observation_tensor(obs, device))[0]

    act = torch_act
    # Images act through the torch policy: a NumPy copy of a CNN would not be faster.
    if numpy_rollout and not agent.cnn and not agent.parts and not fast.enabled:
        act = numpy_copy(policy, first, agent) or torch_act
    plain = partial(torch_act, call=lambda function, *inputs: function(*inputs))
    names = ("obs[step]", "noise[step]")
    return rollout_checks.Acting(
        act, plain, act is not torch_act, agent, update_pass, names, stored, PAGE
    )


def check_policy(
    actor_outs: Tensor, noise: Tensor, actions: Tensor, agent: Agent, act: rollout_checks.Acting
) -> Tensor:
    """The log-probabilities of the rollout's `actions` under `Agent.distribution` at the torch
    policy's `actor_outs`, after checking that the loop acted through `act` as it stored and that
    the actions are the policy's draws with `noise`; where they are not, `act` says why."""
    act.check(agent, actions)
    policy = agent.distribution(actor_outs)
    explain = partial(act.explain, actor_outs)
    sampled = agent.sample(policy, noise)
    rollout_checks.check_actions(actions, policy, sampled, noise, explain, section=act.section)
    if agent.discrete:
        return policy.log_prob(actions)
    return policy.log_prob(actions).sum(-1)


def evaluate(agent: Agent, run: Run, record_to: Path | None = None) -> list[float]:
    """Play --eval-episodes episodes, actions by --sampling-method; log them at the run's step and
    return their returns (`Run.evaluate`)."""

    @torch.inference_mode()
    def act(obs: np.ndarray, episode_starts: np.ndarray) -> np.ndarray:
        policy = agent.distribution(agent(observation_tensor(obs, run.device))[0])
        return agent.env_action(run.select_action(policy).cpu().numpy())

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
