"""ppo_transformer.py: the window and its masks, the key/value context against the pass along sequences, replay,
learning on the probes, checkpoints, trajectories, the CLI."""

import json
import shutil
import subprocess
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import (
    NanRewardEnv,
    NoiseEnv,
    assert_checkpoints_refused,
    assert_one_error_line,
    each_in_one_process,
    on_policy_value,
    read_scalars,
    reference_gae,
    run_in_one_process,
    run_script,
    sharp_agent,
)

import ppo_lstm
import ppo_transformer
from benchmark.registry import script_agent, script_make_env
from common.envs import observation_map
from common.errors import PolicyMismatch, TrainingDiverged, UsageError
from common.trajectories import load_trajectories, split_episodes
from probe_envs.images import ImageVectorBandit


def run_cli(
    *flags: str, env: dict | None = None, timeout: int = 300
) -> subprocess.CompletedProcess:
    return run_script("ppo_transformer.py", *flags, env=env, timeout=timeout)


def quick_args(tmp_path, **overrides) -> ppo_transformer.Args:
    """The defaults, with raw rewards (the probes' values are in reward units) and 4 envs."""
    settings = dict(
        run_dir=str(tmp_path / "runs"), progress=False, eval_episodes=0, save_model=False
    )
    settings |= dict(num_envs=4, norm_reward=False)
    return ppo_transformer.Args(**{**settings, **overrides})


def sharp_transformer(
    seed: int = 0, observation_size: int = 4, **settings
) -> ppo_transformer.Agent:
    """An agent whose weights are far from their initial values, so that every attended step matters to its outputs;
    3 actions."""
    args = ppo_transformer.Args(**settings)
    observation_space = gym.spaces.Box(-np.inf, np.inf, (observation_size,), np.float32)
    return sharp_agent(ppo_transformer.Agent, seed)(observation_space, gym.spaces.Discrete(3), args)


def sequence_pass(agent, obs, starts):
    """`Agent.forward` along sequences (B, T) from scratch: episode ids from `starts`, positions within episodes."""
    starts = starts.clone()
    starts[:, 0] = True
    episodes = starts.cumsum(1)
    index = torch.arange(starts.shape[1]).expand_as(starts)
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(1).values
    positions = index - first
    with torch.no_grad():
        actor_out, value, _ = agent(
            obs, positions, ppo_transformer.window_mask(episodes, agent.config.context_len)
        )
    return actor_out, value, positions


# --- the window ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_gae_equals_the_reference_loop(seed):
    rng = np.random.default_rng(seed)
    rewards, values = rng.normal(size=(2, 13, 3))
    next_value, final_values = rng.normal(size=3), rng.normal(size=(13, 3))
    terminations, truncations = rng.random((2, 13, 3)) < 0.2
    args = (rewards, values, next_value, terminations, truncations, final_values, 0.97, 0.9)
    np.testing.assert_allclose(
        ppo_transformer.compute_gae(*args), reference_gae(*args), rtol=1e-10, atol=1e-10
    )


def test_a_step_sees_its_episode_back_to_the_receptive_field_and_nothing_else():
    agent = sharp_transformer(n_layers=2, context_len=4)  # receptive field L(K-1) = 6 steps back
    obs = torch.randn(1, 20, 4, generator=torch.Generator().manual_seed(0))

    def changed_at(step: int, episode_start: int) -> float:
        """How much step 18's outputs move when the observation at `step` does, the episode starting there."""
        starts = torch.zeros(1, 20, dtype=torch.bool)
        starts[0, episode_start] = True
        actor_out, value, _ = sequence_pass(agent, obs, starts)
        edited = obs.clone()
        edited[0, step] += 3.0
        edited_out, edited_value, _ = sequence_pass(agent, edited, starts)
        return max(
            (edited_out[0, 18] - actor_out[0, 18]).abs().max().item(),
            abs(edited_value[0, 18] - value[0, 18]),
        )

    for step in (13, 15):  # the previous episode, within the window and the receptive field
        assert changed_at(step, episode_start=16) == 0.0
    assert changed_at(16, episode_start=16) > 1e-3
    assert changed_at(11, episode_start=0) == 0.0  # 7 steps back: beyond L(K-1)
    # 6 steps back: the receptive field's edge, through both layers
    assert changed_at(12, episode_start=0) > 1e-3
    for step in (15, 16, 17, 18):  # within the last K - 1 steps, and the step itself
        assert changed_at(step, episode_start=0) > 1e-3


# K = 1: no step before is attended to
@pytest.mark.parametrize(("n_layers", "context_len"), [(2, 5), (1, 1)])
def test_the_context_steps_give_the_pass_along_the_sequence_across_episode_starts_and_a_carried_prefix(
    n_layers, context_len
):
    agent = sharp_transformer(seed=1, n_layers=n_layers, context_len=context_len)
    rng = np.random.default_rng(1)
    num_envs, length = 3, 40
    obs = torch.as_tensor(rng.normal(size=(num_envs, length, 4)), dtype=torch.float32)
    starts = torch.as_tensor(rng.random((num_envs, length)) < 0.1)
    actor_out, value, positions = sequence_pass(agent, obs, starts)
    starts[:, 0] = True
    # Stepped from an empty context, then (from step 20 on) from a context rebuilt from the last L(K-1) steps, as a
    # new rollout starts: the same outputs as the pass along the whole sequence.
    prefix, rebuilt_at = agent.receptive_field, 20
    episodes = starts.cumsum(1)
    with torch.no_grad():
        context = ppo_transformer.Context.empty(agent, num_envs)
        for t in range(length):
            if t == rebuilt_at:
                window = slice(t - prefix, t)
                current = (episodes[:, window] == episodes[:, t - 1 : t]) & ~starts[:, t : t + 1]
                context = ppo_transformer.Context.after(
                    agent, obs[:, window], positions[:, window], current
                )
            step_out, step_value = context.step(obs[:, t], positions[:, t], starts[:, t])
            torch.testing.assert_close(step_out, actor_out[:, t], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(step_value, value[:, t], rtol=1e-5, atol=1e-5)


def test_without_an_episode_start_the_context_would_see_the_previous_episode():
    # Guards the test above: a context step that ignores an episode start gives other outputs.
    agent = sharp_transformer(seed=2, n_layers=1, context_len=4)
    obs = torch.randn(1, 6, 4, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        context = ppo_transformer.Context.empty(agent, 1)
        for t in range(5):
            context.step(obs[:, t], torch.tensor([t]), torch.tensor([t == 0]))
        started, _ = context.step(obs[:, 5], torch.tensor([0]), torch.tensor([True]), keep=False)
        ignored, _ = context.step(obs[:, 5], torch.tensor([0]), torch.tensor([False]), keep=False)
        fresh, _ = ppo_transformer.Context.empty(agent, 1).step(
            obs[:, 5], torch.tensor([0]), torch.tensor([True])
        )
    torch.testing.assert_close(started, fresh, rtol=0, atol=0)
    assert (ignored - fresh).abs().max() > 1e-3


def test_the_previous_action_and_reward_are_appended_and_zero_at_an_episode_start():
    env = ppo_transformer.make_env("Probe2-v0")()  # reward = the observation, episodes of one step
    obs, _ = env.reset(seed=0)
    assert obs.shape == (1 + 1 + 1,) and not obs[1:].any()
    next_obs, reward, *_ = env.step(0)
    np.testing.assert_array_equal(next_obs[1:], [1.0, reward])
    continuous = ppo_transformer.make_env("Pendulum-v1")()
    obs, _ = continuous.reset(seed=0)
    assert obs.shape == (3 + 1 + 1,) and not obs[3:].any()
    obs, reward, *_ = continuous.step(np.array([0.5], np.float32))
    np.testing.assert_allclose(obs[3:], [0.5, reward], rtol=1e-6)
    assert ppo_transformer.make_env(
        "Pendulum-v1", prev_action_reward=False
    )().observation_space.shape == (3,)


def test_only_the_envs_observation_is_normalised_the_previous_action_as_it_is_and_the_reward_scaled(
    tmp_path,
):
    agent = script_agent(ppo_transformer, quick_args(tmp_path, env_id="CartPole-v1"))
    rng = np.random.default_rng(0)
    states = rng.normal(3.0, 2.0, (1000, 4))
    actions = np.eye(2)[(rng.random(1000) < 0.02).astype(int)]  # action 1 taken 2% of the time
    rewards = rng.choice([-0.5, 1.5], 1000)[:, None]  # mean 0.5, root mean square 1.118
    batch = torch.as_tensor(np.concatenate([states, actions, rewards], 1))
    agent.obs_norm.update(batch)
    rare_action_taken = torch.tensor([[3.0, 3.0, 3.0, 3.0, 0.0, 1.0, 1.5]])
    normalised = agent.obs_norm(rare_action_taken)[0].double()
    stats = agent.obs_norm
    np.testing.assert_allclose(
        normalised[:4], (3.0 - stats.mean[:4]) / (stats.var[:4] + stats.epsilon).sqrt(), atol=1e-6
    )
    # normalised, it would be about 7 (1 / sqrt(0.02))
    np.testing.assert_allclose(normalised[4:6], [0.0, 1.0])
    np.testing.assert_allclose(normalised[6], 1.5 / np.sqrt(np.mean(rewards**2)), rtol=1e-4)


def test_every_answer_is_given_on_repeat_previous_easy(tmp_path):
    # The smallest task known to show the 75% plateau (docs/ppo_transformer.md): with the previous action normalised
    # like the observation, one of the four answers was never given and evaluation stayed at 0.50 (seeds 1 and 2,
    # 300k and 600k steps). A 4-symbol repeat-back probe of 16 steps did not show it. At 150k steps (2026-11-28)
    # the defaults evaluate at 1.00, 1.00 and 0.99 on seeds 1-3 (at 100k seed 2 was at 0.32), and with the
    # previous action normalised again seed 1 stays at 0.50.
    # the defaults otherwise
    run = dict(run_dir=str(tmp_path / "runs"), progress=False, save_model=False)
    args = ppo_transformer.Args(
        env_id="popgym-RepeatPreviousEasy-v0", total_timesteps=150_000, eval_episodes=10, **run
    )
    result = ppo_transformer.train(args)
    assert np.mean(result.eval_returns) > 0.9


class TupleActionEnv(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Tuple([gym.spaces.Discrete(2)])


def test_an_action_space_the_script_cannot_take_is_refused_as_such_with_the_wrapper_on(tmp_path):
    if "TupleAction-v0" not in gym.registry:
        gym.register("TupleAction-v0", entry_point=TupleActionEnv)
    with pytest.raises(UsageError, match="has a Tuple action space; use Discrete or Box"):
        script_agent(ppo_transformer, quick_args(tmp_path, env_id="TupleAction-v0"))


# --- the rollout against the update --------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", ["CartPole-v1", "ContinuousProbe3-v0"])
def test_the_update_recomputes_the_rollouts_log_probs_and_values(tmp_path, monkeypatch, env_id):
    # CartPole under a fresh policy ends episodes after about 20 steps: inside 16-step rollouts and across them.
    comparisons = []

    def recording_check(recorded, replayed, positions, why, eval_replay=None):
        # the positions of whole sequences: the rollout's steps are their last
        comparisons.append((why, replayed, recorded, positions[:, -recorded[1].shape[1] :]))

    monkeypatch.setattr(ppo_transformer, "check_outputs", recording_check)
    args = quick_args(
        tmp_path, env_id=env_id, num_steps=16, num_minibatches=2, total_timesteps=12 * 64
    )
    agent = ppo_transformer.train(args).agent
    updates = [c for c in comparisons if c[0].startswith("before any gradient step")]
    assert len(updates) == 12 and len(comparisons) == 24
    starts_inside = continued_across = 0
    for _, (actor_out, value), (acted_out, acted_value), positions in updates:
        assert (value.detach() - acted_value).abs().max() < 1e-5
        if agent.discrete:  # every action's log-probability
            logprobs = torch.log_softmax(actor_out.detach(), -1)
            assert (logprobs - torch.log_softmax(acted_out, -1)).abs().max() < 1e-5
        else:
            # the mean; the std is a parameter
            assert (actor_out.detach() - acted_out).abs().max() < 1e-5
        starts_inside += int((positions[:, 1:] == 0).sum())
        continued_across += int((positions[:, 0] > 0).sum())
    assert starts_inside > 0 and (continued_across > 0 or env_id != "CartPole-v1")


def test_a_context_that_keeps_the_previous_episode_is_stopped_after_the_rollout(
    tmp_path, monkeypatch
):
    original = ppo_transformer.Context.step

    # an edit that ignores episode starts
    def forgetful(self, obs, positions, starts, envs=None, keep=True):
        return original(self, obs, positions, np.zeros_like(np.asarray(starts)), envs, keep)

    monkeypatch.setattr(ppo_transformer.Context, "step", forgetful)
    args = quick_args(
        tmp_path, env_id="CartPole-v1", num_steps=64, num_minibatches=2, total_timesteps=512
    )
    with pytest.raises(PolicyMismatch, match="key/value context"):
        ppo_transformer.train(args)


def test_an_update_pass_that_depends_on_the_batch_is_stopped_before_the_first_gradient_step(
    tmp_path, monkeypatch
):
    original = ppo_transformer.Agent.forward

    def batch_dependent(
        self, obs, positions, mask, cached=None, outputs_from=0
    ):  # as batch norm would
        actor_out, value, keys_values = original(self, obs, positions, mask, cached, outputs_from)
        return actor_out + 0.01 * obs.shape[0], value, keys_values

    monkeypatch.setattr(ppo_transformer.Agent, "forward", batch_dependent)
    args = quick_args(
        tmp_path, env_id="CartPole-v1", num_steps=32, num_minibatches=2, total_timesteps=256
    )
    # the rollout and its pass: both 4 envs
    with pytest.raises(PolicyMismatch, match="before any gradient step"):
        ppo_transformer.train(args)


# --- learning on the probes ----------------------------------------------------------------------------------------


def play_optimally(agent: ppo_transformer.Agent, args: ppo_transformer.Args, seeds=range(8)):
    """Yield (probe, value, policy) at every state of episodes played with the optimal policy, through the env stack
    the agent trained on (the previous action and reward appended) and a context carried along each episode."""
    env = script_make_env(ppo_transformer, args)(args.env_id)()
    probe = env.unwrapped
    for seed in seeds:
        observation, _ = env.reset(seed=seed)
        context, position, terminated = ppo_transformer.Context.empty(agent, 1), 0, False
        while not terminated:
            with torch.no_grad():
                # images stay uint8
                obs = observation_map(lambda part: torch.as_tensor(part[None]), observation)
                actor_out, value = context.step(
                    obs, torch.tensor([position]), torch.tensor([position == 0])
                )
            yield probe, value.item(), agent.distribution(actor_out)
            observation, _, terminated, _, _ = env.step(probe.optimal_action())
            position += 1


@pytest.mark.parametrize(
    ("env_id", "steps", "value_tolerance", "min_probability"),
    [
        ("Probe1-v0", 10_240, 0.05, None),
        # With lr 1e-3 (2026-11-26 on), seeds 1-3, 2026-11-28: Probe5's values within 0.023 and its action at 0.998
        # or more; Probe6's within 0.064 and 0.993; Probe7's within 0.024 (its budget was 81,920 at lr 3e-4). At half
        # the budgets or less (2026-12-06), seeds 1-2: Probe2's and Probe3's values within 0.001; Probe4's within 0.010
        # and its action at 0.996 or more; Probe5's within 0.014 and 0.995; Probe6's within 0.075 and 0.984; Probe7's
        # (seeds 1-3) within 0.010, its last action at 0.997 or more and the last 200 returns all 1.0.
        ("Probe2-v0", 6_144, 0.05, None),
        ("Probe3-v0", 6_144, 0.05, None),
        ("Probe4-v0", 6_144, 0.1, 0.95),
        ("Probe5-v0", 6_144, 0.1, 0.95),
        ("Probe6-v0", 10_240, 0.3, 0.9),
        ("Probe7-v0", 20_480, 0.1, 0.9),
    ],
)
def test_discrete_probes(tmp_path, env_id, steps, value_tolerance, min_probability):
    args = quick_args(tmp_path, env_id=env_id, total_timesteps=steps)
    result = ppo_transformer.train(args)
    for env, value, policy in play_optimally(result.agent, args):
        assert value == pytest.approx(env.optimal_value(args.gamma), abs=value_tolerance), (
            env.t,
            env.cue,
        )
        # Probe7: only the last action counts
        action_matters = env_id != "Probe7-v0" or env.t == env.horizon - 1
        if min_probability is not None and action_matters:
            assert policy.probs[0, env.optimal_action()].item() >= min_probability, (env.t, env.cue)
    if env_id == "Probe7-v0":  # memory: ppo_fc stays near 0.5 here (test_ppo_fc)
        assert np.mean(result.episode_returns[-200:]) >= 0.95


def test_with_norm_adv_on_probe4_still_learns_its_action(tmp_path):
    """--norm-adv is off by default here (docs/ppo_transformer.md), so the probes above no longer take its branch."""
    # at 6,144 steps (2026-12-06), seeds 1-2: the action at 0.998 or more
    args = quick_args(tmp_path, env_id="Probe4-v0", total_timesteps=6_144, norm_adv=True)
    for env, _, policy in play_optimally(ppo_transformer.train(args).agent, args):
        assert policy.probs[0, env.optimal_action()].item() >= 0.95, env.t


@pytest.mark.parametrize(
    ("env_id", "steps"),
    [
        # 4,096 steps (2026-12-06), seeds 1-2: the values within 0.007
        ("ContinuousProbe1-v0", 4_096),
        ("ContinuousProbe2-v0", 4_096),
        ("ContinuousProbe3-v0", 4_096),
        ("ContinuousProbe4-v0", 24_576),
        # 32,768 (2026-12-06), seeds 1-2: the values within 0.025 of the policy's and 0.186 of the optimum (at 40,960
        # seed 1: 0.022 and 0.161; at 24,576 seeds 1-3 up to 0.219 of the optimum)
        ("ContinuousProbe5-v0", 32_768),
    ],
)
def test_continuous_probes(tmp_path, env_id, steps):
    args = quick_args(tmp_path, env_id=env_id, total_timesteps=steps)
    agent = ppo_transformer.train(args).agent
    action_matters = env_id in ("ContinuousProbe4-v0", "ContinuousProbe5-v0")
    for env, value, policy in play_optimally(agent, args):
        if action_matters:
            assert value == pytest.approx(on_policy_value(env, policy), abs=0.1), env.cue
            assert value == pytest.approx(env.optimal_value(args.gamma), abs=0.25), env.cue
        else:
            assert value == pytest.approx(env.optimal_value(args.gamma), abs=0.1), (env.t, env.cue)


# channels first, channels last
@pytest.mark.parametrize("env_id", ["ImageMemory-v0", "ImageMemoryRGB-v0"])
def test_the_image_memory_probe_is_remembered_through_the_cnn(tmp_path, env_id):
    args = quick_args(tmp_path, env_id=env_id, total_timesteps=10_240)
    result = ppo_transformer.train(args)
    agent = result.agent
    assert isinstance(agent.image_encoder, ppo_transformer.NatureCNN)
    # The previous action (2) and reward (1) join the CNN's 512 features in the token, not the pixels.
    assert agent.embed.in_features == 512 + 3 and agent.obs_norm.mean.shape == (3,)
    for env, value, policy in play_optimally(agent, args):
        assert value == pytest.approx(env.optimal_value(args.gamma), abs=0.1), (env.t, env.cue)
        if env.t == env.horizon - 1:  # the cue was in the first frame only
            assert policy.probs[0, env.optimal_action()].item() >= 0.9, env.cue


class ImageVectorPairBandit(ImageVectorBandit):
    """ImageVectorBandit with 4 actions, one per (lit half, flip): the right one is lit half + 2 * flip. Either part
    alone earns at most half of it, yet (unlike the XOR) a linear read of the token can earn it all."""

    def __init__(self, render_mode: str | None = None):
        super().__init__(render_mode)
        self.action_space = gym.spaces.Discrete(4)

    def optimal_action(self):
        return self.cue + 2 * self.flip


def test_a_dict_of_an_image_and_a_vector_feeds_both_to_the_token(tmp_path):
    # Two contexts that differ in one part only want different actions, so one policy cannot be right in both unless
    # that part reaches the token. Not the XOR of ImageVectorBandit-v0: with the blocks near linear at their initial
    # weights and no entropy bonus, the policy there can settle on 3 of the 4 contexts (docs/ppo_transformer.md).
    gym.register("ImageVectorPairBandit-test-v0", entry_point=ImageVectorPairBandit)
    # At 16,384 steps (2026-12-06), seeds 1-2: the values within 0.056 and the action at 0.989 or more (at 20,480 seed
    # 1: 0.018 and 0.990; at 10,240 seed 1's values were 0.121 off).
    args = quick_args(tmp_path, env_id="ImageVectorPairBandit-test-v0", total_timesteps=16_384)
    result = ppo_transformer.train(args)
    # the one-hot flip, then the previous action and reward
    assert result.agent.embed.in_features == 512 + 2 + 5
    seen = set()
    for env, value, policy in play_optimally(result.agent, args, seeds=range(16)):
        seen.add((env.cue, env.flip))
        assert value == pytest.approx(1.0, abs=0.1), (env.cue, env.flip)
        assert policy.probs[0, env.optimal_action()].item() >= 0.9, (env.cue, env.flip)
    assert len(seen) == 4


def test_image_runs_of_every_encoder_and_context_build_the_token_from_the_right_parts(tmp_path):
    # A context of one step (nothing carried), and --encoder mlp: the pixels flattened before the previous action and
    # reward, normalised with them.
    result = ppo_transformer.train(
        quick_args(tmp_path, env_id="ImageMemory-v0", total_timesteps=512, context_len=1)
    )
    assert result.global_step == 512
    make_env = script_make_env(ppo_transformer, quick_args(tmp_path))
    space = make_env("ImageMemory-v0")().observation_space
    agent = ppo_transformer.Agent(
        space, gym.spaces.Discrete(2), quick_args(tmp_path, encoder="mlp")
    )
    assert agent.image_encoder is None and agent.obs_norm.mean.shape == (36 * 36 + 3,)
    assert agent.embed.in_features == 36 * 36 + 3


def test_a_uint8_vector_observation_reaches_the_network_as_floats(tmp_path):
    # Without the previous action and reward the env's own uint8 vector reaches the network, in the rollout, the
    # bootstrap and evaluation alike.
    # not an image: a grid
    gym.register("UInt8Grid-test-v0", entry_point=lambda: NoiseEnv((7, 7, 3)))
    for norm_obs in (False, True):
        args = quick_args(
            tmp_path, env_id="UInt8Grid-test-v0", total_timesteps=512, prev_action_reward=False, norm_obs=norm_obs,
            eval_episodes=2,
        )  # fmt: skip
        result = ppo_transformer.train(args)
        assert len(result.eval_returns) == 2
        if norm_obs:  # the statistics of the floats, not of a uint8 cast
            assert 100 < result.agent.obs_norm.mean.mean().item() < 155


# --- checkpoints ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("async_envs", [False, True])
def test_resume_continues_the_cut_episodes_with_their_context_as_an_uninterrupted_run(
    tmp_path, async_envs
):
    # CartPole's episodes start at random and outlast 16-step rollouts: the checkpoint after iteration 2 cuts them.
    settings = dict(
        env_id="CartPole-v1", num_envs=2, num_steps=16, num_minibatches=2, total_timesteps=6 * 32
    )
    settings.update(
        checkpoint_every=2, save_model=True, norm_obs=True, norm_reward=True, async_envs=async_envs
    )
    whole = ppo_transformer.train(quick_args(tmp_path / "whole", **settings))
    middle = whole.run_dir / "checkpoints" / "step_64.pt"
    carried = torch.load(middle, weights_only=True)["episodes"]
    # mid-episode
    assert not carried["episode_starts"].any() and carried["context_valid"][:, -1].all()
    copy = tmp_path / "copy" / whole.run_dir.name
    shutil.copytree(
        whole.run_dir,
        copy,
        ignore=shutil.ignore_patterns("step_128.pt", "step_192.pt", "latest.pt"),
    )
    time.sleep(1.1)  # event files are named by the second (see test_ppo_lstm)
    resumed = ppo_transformer.train(
        ppo_transformer.Args(resume=str(copy / "checkpoints" / "step_64.pt"), progress=False)
    )
    assert resumed.run_dir == copy and resumed.global_step == whole.global_step == 192
    for (name, expected), actual in zip(
        whole.agent.state_dict().items(), resumed.agent.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, msg=name)
    ended_after = [
        value for step, value in read_scalars(whole.run_dir)["charts/episodic_return"] if step > 64
    ]
    assert resumed.episode_returns == ended_after


def test_an_image_run_resumes_mid_episode_with_its_uint8_context_as_an_uninterrupted_run(tmp_path):
    # ImageMemory's episodes are 4 steps: rollouts of 5 cut them. The carried context holds frames and vectors.
    settings = dict(
        env_id="ImageMemory-v0", num_envs=2, num_steps=5, num_minibatches=2, total_timesteps=6 * 10
    )
    whole = ppo_transformer.train(
        quick_args(tmp_path / "whole", **settings, checkpoint_every=2, save_model=True)
    )
    carried = torch.load(whole.run_dir / "checkpoints" / "step_20.pt", weights_only=True)[
        "episodes"
    ]
    assert (
        carried["context_obs"]["image"].dtype == torch.uint8 and not carried["episode_starts"].all()
    )
    assert carried["observations"]["image"].dtype == torch.uint8
    copy = tmp_path / "copy" / whole.run_dir.name
    shutil.copytree(
        whole.run_dir, copy, ignore=shutil.ignore_patterns("step_40.pt", "step_60.pt", "latest.pt")
    )
    time.sleep(1.1)  # event files are named by the second (see test_ppo_lstm)
    resumed = ppo_transformer.train(
        ppo_transformer.Args(resume=str(copy / "checkpoints" / "step_20.pt"), progress=False)
    )
    for (name, expected), actual in zip(
        whole.agent.state_dict().items(), resumed.agent.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, msg=name)
    ended_after = [
        value for step, value in read_scalars(whole.run_dir)["charts/episodic_return"] if step > 20
    ]
    assert resumed.episode_returns == ended_after


def test_an_image_checkpoint_evaluates_in_a_fresh_process(tmp_path):
    # The frames and the previous action and reward reach the rebuilt agent as in training; TensorBoard's reader sees
    # the returns the command line prints.
    args = quick_args(
        tmp_path, env_id="ImageMemory-v0", total_timesteps=2048, save_model=True, eval_episodes=4
    )
    result = ppo_transformer.train(args)
    flags = (
        "--eval-checkpoint",
        str(result.checkpoint),
        "--eval-episodes",
        "4",
        "--run-dir",
        str(tmp_path / "eval"),
    )
    completed = run_cli(*flags, "--sampling-method", "greedy")
    assert completed.returncode == 0, completed.stderr
    (eval_run,) = (tmp_path / "eval").iterdir()
    returns = [value for _, value in read_scalars(eval_run)["eval/episodic_return"]]
    assert (
        len(returns) == 4
        and f"return {np.mean(returns):.2f} +- {np.std(returns):.2f}" in completed.stdout
    )


def test_checkpoints_of_another_script_are_refused(tmp_path):
    lstm_args = dict(
        run_dir=str(tmp_path / "lstm"), progress=False, eval_episodes=0, env_id="Probe1-v0"
    )
    lstm_checkpoint = ppo_lstm.train(ppo_lstm.Args(total_timesteps=1024, **lstm_args)).checkpoint
    own = ppo_transformer.train(
        quick_args(tmp_path, env_id="Probe1-v0", total_timesteps=512, save_model=True)
    )
    refused = [
        ("ppo_transformer.py", lstm_checkpoint, "ppo_lstm"),
        ("ppo_lstm.py", own.checkpoint, "ppo_transformer"),
    ]
    assert_checkpoints_refused(refused, tmp_path / "refused")


def test_a_checkpoint_of_other_module_names_is_refused_with_one_error_line_naming_them(tmp_path):
    # Before nanoGPT's names (2026-11-26) the MLP's layers were fc and proj: such a checkpoint is refused by its keys,
    # with no format number to compare. A "format" key, as checkpoints written until 2026-11-28 hold, is ignored.
    result = ppo_transformer.train(
        quick_args(tmp_path, env_id="Probe1-v0", total_timesteps=512, save_model=True)
    )
    checkpoint = torch.load(result.checkpoint, weights_only=True)
    renamed = {"mlp.c_fc": "mlp.fc", "mlp.c_proj": "mlp.proj"}
    checkpoint["model"] = {
        next((key.replace(a, b) for a, b in renamed.items() if a in key), key): value
        for key, value in checkpoint["model"].items()
    }
    checkpoint["format"] = 2
    older = result.checkpoint.parent / "older.pt"  # in its run's checkpoints/, as --resume takes it
    torch.save(checkpoint, older)
    expected = (
        "the checkpoint's 'model' (written by ppo_transformer.py) does not fit this run's: the checkpoint lacks "
        "blocks.0.mlp.c_fc.weight, blocks.0.mlp.c_fc.bias, blocks.0.mlp.c_proj.weight, blocks.0.mlp.c_proj.bias "
        "and 4 more; this run has no blocks.0.mlp.fc.weight"
    )
    before = sorted(tmp_path.rglob("*"))
    calls = [  # in one process: both are refused before a run starts
        ["ppo_transformer.py", "--eval-checkpoint", str(older), "--run-dir", str(tmp_path)],
        ["ppo_transformer.py", "--resume", str(older)],
    ]
    for completed in run_in_one_process(calls):
        assert completed.returncode == 2, completed.stderr
        lines = completed.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], (
            completed.stderr
        )
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


def test_eval_checkpoint_reproduces_the_evaluation_after_training_and_records_positions(tmp_path):
    args = quick_args(
        tmp_path, env_id="CartPole-v1", total_timesteps=2048, save_model=True, eval_episodes=3
    )
    result = ppo_transformer.train(args)
    path = tmp_path / "eval.npz"
    flags = (
        "--eval-checkpoint",
        str(result.checkpoint),
        "--eval-episodes",
        "3",
        "--run-dir",
        str(tmp_path),
    )
    completed = run_cli(*flags, "--save-trajectories", str(path))
    assert completed.returncode == 0, completed.stderr
    assert (
        f"return {np.mean(result.eval_returns):.2f} +- {np.std(result.eval_returns):.2f}"
        in completed.stdout
    )
    data = load_trajectories(path)
    episode_starts = np.concatenate([[True], data["/masks"][0, :-1] == 0])
    position = data["/agents/policy/position"][0]
    assert (position[episode_starts] == 0).all() and (
        np.diff(position)[~episode_starts[1:]] == 1
    ).all()
    for method in ("basic", "temperature", "topk"):
        returns = ppo_transformer.evaluate_checkpoint(
            quick_args(
                tmp_path,
                eval_checkpoint=str(result.checkpoint),
                eval_episodes=2,
                sampling_method=method,
            )
        )
        assert len(returns) == 2


def test_training_trajectories_hold_what_reproduces_each_action(tmp_path):
    path = tmp_path / "rollouts.npz"
    args = quick_args(tmp_path, total_timesteps=1024, num_steps=128, save_trajectories=str(path))
    result = ppo_transformer.train(args)
    data = load_trajectories(path)
    assert (
        data["/agents/policy/logprobs"].shape == data["/agents/policy/position"].shape == (4, 256)
    )
    # CartPole's, the previous action and reward
    assert data["/observations"].shape == (4, 256, 4 + 2 + 1)
    assert json.loads(str(data["/meta/args"]))["context_len"] == args.context_len
    finished = [episode for episode in split_episodes(data) if episode.finished]
    assert sorted(episode.total_reward for episode in finished) == sorted(result.episode_returns)
    starts = np.concatenate([np.ones((4, 1), bool), data["/masks"][:, :-1] == 0], axis=1)
    position = data["/agents/policy/position"]
    assert (position[starts] == 0).all() and (position[~starts] > 0).all()


# --- the command line ----------------------------------------------------------------------------------------------


def test_cli_run_writes_the_conventional_log_keys(tmp_path):
    completed = run_cli(
        "--env-id",
        "CartPole-v1",
        "--total-timesteps",
        "1024",
        "--run-dir",
        str(tmp_path),
        "--eval-episodes",
        "1",
    )
    assert completed.returncode == 0, completed.stderr
    (run,) = tmp_path.iterdir()
    assert run.name.startswith("CartPole-v1__ppo_transformer__1__")
    assert completed.stdout.startswith(f"{run}: 1024 steps, ") and "eval return" in completed.stdout
    scalars = read_scalars(run)
    expected = {
        "charts/episodic_return",
        "charts/episodic_length",
        "charts/learning_rate",
        "charts/SPS",
    }
    expected |= {
        f"losses/{key}"
        for key in ("value_loss", "policy_loss", "entropy", "old_approx_kl", "approx_kl")
    }
    expected |= {"losses/clipfrac", "losses/explained_variance", "perf/rollout_seconds"}
    expected |= {"perf/update_seconds", "system/rss_mb", "eval/episodic_return"}
    assert expected <= set(scalars)
    assert (run / "checkpoints" / "latest.pt").is_file() and (
        run / "checkpoints" / "step_1024.pt"
    ).is_file()


def test_help():
    completed = run_cli("--help")
    assert (
        completed.returncode == 0
        and "--context-len" in completed.stdout
        and "--prev-action-reward" in completed.stdout
    )


def test_track_with_wandb_offline_and_capture_video(tmp_path):
    completed = run_cli(
        "--env-id", "CartPole-v1", "--total-timesteps", "512", "--num-steps", "64", "--run-dir", str(tmp_path),
        "--track", "--capture-video",
        env={"WANDB_MODE": "offline", "WANDB_SILENT": "true", "SDL_VIDEODRIVER": "dummy"},
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    (run,) = tmp_path.iterdir()
    assert list(run.glob("wandb/offline-run-*"))
    assert [video for video in run.glob("videos/*.mp4") if video.stat().st_size > 0]


BAD_INPUT = [
    (["--env-id", "NoSuchEnv-v0"], "unknown env id 'NoSuchEnv-v0'"),
    (["--num-minibatches", "3"], "must divide --num-envs 8"),
    (["--n-heads", "3"], "--n-heads 3 must divide --d-model 64"),
    (["--d-model", "36", "--n-heads", "4"], "even width"),
    (["--d-model", "0"], "--d-model must be positive"),
    (["--context-len", "0"], "--context-len must be positive"),
    (["--n-layers", "-1"], "--n-layers must be positive"),
    (["--num-envs", "-2"], "must be positive"),
    (["--total-timesteps", "100"], "less than one batch"),
    (["--gamma", "1.5"], "[0, 1]"),
    (["--env-id", "Probe1-v0", "--capture-video"], "cannot render"),
    (["--env-id", "Pendulum-v1", "--sampling-method", "topk"], "needs a discrete action space"),
]


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    return each_in_one_process(
        ["ppo_transformer.py"], [flags for flags, _ in BAD_INPUT], tmp_path_factory.mktemp("bad")
    )


@pytest.mark.parametrize(("flags", "message"), BAD_INPUT)
def test_bad_input_gives_one_error_line_and_exit_status_2(refused, flags, message):
    completed, runs = refused[tuple(flags)]
    assert_one_error_line(completed, message)
    assert not runs.exists()


def test_nan_stops_training_and_keeps_the_last_good_checkpoint(tmp_path):
    if "NanReward-v0" not in gym.registry:
        gym.register("NanReward-v0", entry_point=NanRewardEnv)
    args = quick_args(
        tmp_path, env_id="NanReward-v0", total_timesteps=4 * 512, num_envs=1, num_minibatches=1
    )
    with pytest.raises(TrainingDiverged, match=r"NaN|nan"):
        ppo_transformer.train(ppo_transformer.Args(**{**vars(args), "checkpoint_every": 1}))
    (run,) = (tmp_path / "runs").iterdir()
    checkpoint = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)
    assert checkpoint["global_step"] == 512
    assert all(torch.isfinite(value).all() for value in checkpoint["model"].values())
