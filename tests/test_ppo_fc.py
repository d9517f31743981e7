"""ppo_fc.py: GAE, the learning-rate schedule, learning on the probes, checkpoints, trajectories and the CLI."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import ppo_fc
from common.trajectories import load_trajectories, split_episodes

REPO = Path(__file__).resolve().parents[1]
CONTINUOUS = dict(
    num_envs=1, num_steps=2048, num_minibatches=32, update_epochs=10, learning_rate=3e-4, ent_coef=0.0, anneal_lr=False
)
"""CleanRL's continuous-control settings."""


def quick_args(tmp_path, **overrides) -> ppo_fc.Args:
    settings = dict(run_dir=str(tmp_path / "runs"), progress=False, eval_episodes=0, save_model=False)
    return ppo_fc.Args(**{**settings, **overrides})


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of a run folder, read with tensorboard's own reader (no sampling: size 0 keeps all)."""
    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def run_cli(*flags: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "ppo_fc.py", *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


# --- GAE and the learning-rate schedule ----------------------------------------------------------------------------


def reference_gae(rewards, values, next_value, terminations, truncations, final_values, gamma, lam):
    """GAE one env and one step at a time, straight from the definition."""
    num_steps, num_envs = rewards.shape
    advantages = np.zeros_like(rewards)
    for env in range(num_envs):
        carry = 0.0
        for t in reversed(range(num_steps)):
            if terminations[t, env]:
                following_value, carry = 0.0, 0.0
            elif truncations[t, env]:
                following_value, carry = final_values[t, env], 0.0
            else:
                following_value = values[t + 1, env] if t + 1 < num_steps else next_value[env]
            delta = rewards[t, env] + gamma * following_value - values[t, env]
            carry = delta + gamma * lam * carry
            advantages[t, env] = carry
    return advantages


@pytest.mark.parametrize("seed", range(5))
def test_gae_equals_the_reference_loop(seed):
    rng = np.random.default_rng(seed)
    num_steps, num_envs = 17, 5
    rewards = rng.normal(size=(num_steps, num_envs))
    values = rng.normal(size=(num_steps, num_envs))
    next_value = rng.normal(size=num_envs)
    terminations = rng.random((num_steps, num_envs)) < 0.15
    truncations = rng.random((num_steps, num_envs)) < 0.15
    terminations[-1, 0], truncations[-1, 0] = True, False  # terminated on the rollout's last step
    terminations[-1, 1], truncations[-1, 1] = False, True  # truncated on the last step
    terminations[-1, 2], truncations[-1, 2] = True, True  # both: the termination wins
    terminations[0, 3], truncations[0, 3] = False, True  # truncated on the first step
    final_values = rng.normal(size=(num_steps, num_envs))
    gamma, lam = 0.97, 0.9
    computed = ppo_fc.compute_gae(rewards, values, next_value, terminations, truncations, final_values, gamma, lam)
    expected = reference_gae(rewards, values, next_value, terminations, truncations, final_values, gamma, lam)
    np.testing.assert_allclose(computed, expected, rtol=1e-10, atol=1e-10)


def test_learning_rate_falls_linearly_to_the_end_value(tmp_path):
    args = quick_args(tmp_path, env_id="Probe1-v0", total_timesteps=5 * 512, learning_rate=1e-3, end_learning_rate=1e-4)
    result = ppo_fc.train(args)
    logged = read_scalars(result.run_dir)["charts/learning_rate"]
    assert [step for step, _ in logged] == [512 * k for k in range(1, 6)]
    expected = [1e-3 + (1e-4 - 1e-3) * k / 5 for k in range(5)]  # reaches the end value when training ends
    np.testing.assert_allclose([value for _, value in logged], expected, rtol=1e-6)
    constant = ppo_fc.train(
        quick_args(tmp_path / "constant", env_id="Probe1-v0", total_timesteps=1024, anneal_lr=False)
    )
    np.testing.assert_allclose(
        [value for _, value in read_scalars(constant.run_dir)["charts/learning_rate"]], [2.5e-4] * 2
    )


@pytest.mark.parametrize("action_space", [gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,), np.float32)])
def test_written_out_policy_equals_torch_distributions(action_space):
    torch.manual_seed(0)
    agent = ppo_fc.Agent(4, action_space, 16, norm_obs=False)
    with torch.no_grad():
        for parameter in agent.actor.layers[-1].parameters():
            parameter.normal_()  # a policy far from uniform
        if not agent.discrete:
            agent.actor_logstd.normal_()
        observations = torch.randn(50_000, 4)
        actions, log_probs, entropies, values = agent.get_action_and_value(observations)
        policy = agent.distribution(observations)
        expected_log_probs, expected_entropies = policy.log_prob(actions), policy.entropy()
        if not agent.discrete:
            expected_log_probs, expected_entropies = expected_log_probs.sum(-1), expected_entropies.sum(-1)
        torch.testing.assert_close(log_probs, expected_log_probs)
        torch.testing.assert_close(entropies, expected_entropies)
        torch.testing.assert_close(values, agent.get_value(observations))
        # Samples follow the policy: action frequencies at one observation, or standardised Gaussian noise.
        if agent.discrete:
            one = observations[:1].expand(50_000, 4)
            frequencies = torch.bincount(agent.get_action_and_value(one)[0], minlength=3) / 50_000
            torch.testing.assert_close(frequencies, agent.distribution(one[:1]).probs[0], atol=0.01, rtol=0)
        else:
            noise = (actions - policy.mean) / policy.stddev
            assert noise.mean().abs() < 0.02 and (noise.std() - 1).abs() < 0.02


@pytest.mark.parametrize("action_space", [gym.spaces.Discrete(5), gym.spaces.Box(-1, 1, (3,), np.float32)])
def test_numpy_policy_equals_sample_and_is_a_snapshot(action_space):
    torch.manual_seed(0)
    agent = ppo_fc.Agent(4, action_space, 16, norm_obs=True)
    with torch.no_grad():
        for parameter in agent.parameters():
            parameter.normal_()  # a policy far from uniform
    agent.obs_norm.update(torch.randn(100, 4) * 3 + 1)
    observations = torch.randn(256, 4) * 3 + 1
    noise = agent.sampling_noise((256,))
    policy = agent.numpy_policy()
    with torch.no_grad():
        actor_out = agent.actor(agent.obs_norm(observations))
        expected = agent.sample(actor_out, noise)
        actions = torch.as_tensor(policy(observations.numpy(), noise.numpy()))
        if agent.discrete:
            # NumPy and torch round differently in the last bits: an action may differ only where two scores tie
            scores = actor_out + noise
            differ = actions != expected
            gaps = scores[differ, expected[differ]] - scores[differ, actions[differ]]
            assert differ.sum() <= 2 and (gaps.abs() < 1e-4).all()
            assert len(actions.unique()) > 2
        else:
            torch.testing.assert_close(actions, expected)
        for parameter in agent.parameters():
            parameter.zero_()
    after = policy(observations.numpy(), noise.numpy())
    np.testing.assert_array_equal(after, actions.numpy())  # later changes to the agent do not reach the snapshot


@pytest.mark.parametrize("env_id", ["CartPole-v1", "ContinuousProbe3-v0"])
def test_rollout_log_probs_and_values_belong_to_the_policy_that_acted(tmp_path, env_id):
    # The rollout samples actions only; log-probabilities and values come from one pass after it. One iteration,
    # recorded: they must be the initial agent's at the recorded observations and actions.
    path = tmp_path / "rollout.npz"
    args = quick_args(
        tmp_path, env_id=env_id, num_envs=2, num_steps=64, total_timesteps=128, save_trajectories=str(path)
    )
    ppo_fc.train(args)
    ppo_fc.seed_and_pick_device(args)
    agent, _ = ppo_fc.build_agent(args, None, torch.device("cpu"))
    data = load_trajectories(path)
    observations = torch.as_tensor(data["/observations"], dtype=torch.float32)
    actions = torch.as_tensor(data["/actions"] if agent.discrete else data["/agents/policy/actions"])
    with torch.no_grad():
        _, log_probs, _, values = agent.get_action_and_value(observations, actions)
    torch.testing.assert_close(torch.as_tensor(data["/agents/policy/logprobs"]), log_probs)
    torch.testing.assert_close(torch.as_tensor(data["/agents/policy/values"]), values)
    assert log_probs.std() > 0 and values.std() > 0


def test_env_action_offsets_discrete_start_and_clips_boxes():
    shifted = ppo_fc.env_action(np.array([0, 2]), gym.spaces.Discrete(3, start=-1))
    assert shifted.tolist() == [-1, 1]
    box = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 2.0], np.float32))
    clipped = ppo_fc.env_action(np.array([[-3.0, 1.0], [0.5, 9.0]]), box)
    np.testing.assert_array_equal(clipped, [[-1.0, 1.0], [0.5, 2.0]])
    square = gym.spaces.Box(-1, 1, (2, 2), np.float32)
    assert ppo_fc.env_action(np.zeros((3, 4)), square).shape == (3, 2, 2)


# --- learning on the probes ----------------------------------------------------------------------------------------


def visit_states(env_id: str, seeds=range(8)):
    """Yield (env, observation) for every state of episodes played with the optimal policy."""
    env = gym.make(env_id).unwrapped
    for seed in seeds:
        observation, _ = env.reset(seed=seed)
        terminated = False
        while not terminated:
            yield env, observation
            observation, _, terminated, _, _ = env.step(env.optimal_action())


def agent_at(agent: ppo_fc.Agent, observation: np.ndarray):
    """The agent's value and policy at one observation."""
    x = torch.as_tensor(observation[None], dtype=torch.float32)
    with torch.no_grad():
        return agent.get_value(x).item(), agent.distribution(x)


@pytest.mark.parametrize(
    ("env_id", "steps", "value_tolerance", "min_probability"),
    [
        ("Probe1-v0", 20_480, 0.05, None),
        ("Probe2-v0", 20_480, 0.05, None),
        ("Probe3-v0", 20_480, 0.05, None),
        ("Probe4-v0", 20_480, 0.1, 0.95),
        ("Probe5-v0", 20_480, 0.1, 0.95),
    ],
)
def test_discrete_probes(tmp_path, env_id, steps, value_tolerance, min_probability):
    args = quick_args(tmp_path, env_id=env_id, total_timesteps=steps)
    agent = ppo_fc.train(args).agent
    for env, observation in visit_states(env_id):
        value, policy = agent_at(agent, observation)
        assert value == pytest.approx(env.optimal_value(args.gamma), abs=value_tolerance), observation
        if min_probability is not None:
            assert policy.probs[0, env.optimal_action()].item() >= min_probability, observation


def test_probe6_follows_the_parity_at_every_step(tmp_path):
    agent = ppo_fc.train(quick_args(tmp_path, env_id="Probe6-v0", total_timesteps=61_440)).agent
    for env, observation in visit_states("Probe6-v0", seeds=[0]):
        _, policy = agent_at(agent, observation)
        assert policy.probs[0, env.optimal_action()].item() >= 0.9, observation


def test_probe7_memoryless_agent_cannot_beat_chance(tmp_path):
    result = ppo_fc.train(quick_args(tmp_path, env_id="Probe7-v0", total_timesteps=20_480))
    assert len(result.episode_returns) == 20_480 // 4
    assert np.mean(result.episode_returns[-500:]) < 0.65


def on_policy_value(env, policy, samples: int = 4000) -> float:
    """The true value of a one-step state under a Gaussian policy: the mean reward of sampled (then clipped) actions.

    Only ContinuousProbe4 and 5 need it; their value depends on the policy's spread, not only on its mean.
    """
    state = (env.t, env.cue)
    rewards = []
    for action in policy.sample((samples,))[:, 0].numpy():
        env.t, env.cue = state
        rewards.append(env._reward(np.clip(action, -1, 1)))
    env.t, env.cue = state
    return float(np.mean(rewards))


@pytest.mark.parametrize(
    ("env_id", "steps"),
    [
        ("ContinuousProbe1-v0", 8_192),
        ("ContinuousProbe2-v0", 8_192),
        ("ContinuousProbe3-v0", 8_192),
        ("ContinuousProbe4-v0", 24_576),
        ("ContinuousProbe5-v0", 24_576),
    ],
)
def test_continuous_probes(tmp_path, env_id, steps):
    args = quick_args(tmp_path, env_id=env_id, total_timesteps=steps, **CONTINUOUS)
    agent = ppo_fc.train(args).agent
    action_matters = env_id in ("ContinuousProbe4-v0", "ContinuousProbe5-v0")
    for env, observation in visit_states(env_id):
        value, policy = agent_at(agent, observation)
        if action_matters:
            # The critic must know what the policy earns; the policy's mean must sit at the optimum.
            assert value == pytest.approx(on_policy_value(env, policy), abs=0.1), observation
            assert policy.mean[0, 0].item() == pytest.approx(env.optimal_action()[0], abs=0.1), observation
            assert value == pytest.approx(env.optimal_value(args.gamma), abs=0.25), observation  # and is near-optimal
        else:
            assert value == pytest.approx(env.optimal_value(args.gamma), abs=0.1), observation


# --- checkpoints ---------------------------------------------------------------------------------------------------


def test_resume_gives_the_parameters_of_an_uninterrupted_run(tmp_path):
    # Probe4 has one-step episodes and a constant observation: every checkpoint falls on an episode boundary.
    settings = dict(env_id="Probe4-v0", total_timesteps=6 * 512, checkpoint_every=3, save_model=True, norm_obs=True)
    whole = ppo_fc.train(quick_args(tmp_path / "whole", **settings))
    middle = whole.run_dir / "checkpoints" / "step_1536.pt"
    assert middle.is_file() and whole.checkpoint == whole.run_dir / "checkpoints" / "latest.pt"

    copy = tmp_path / "copy" / whole.run_dir.name
    shutil.copytree(whole.run_dir, copy, ignore=shutil.ignore_patterns("events.*", "step_3072.pt", "latest.pt"))
    resumed = ppo_fc.train(quick_args(tmp_path, resume=str(copy / "checkpoints" / "step_1536.pt")))
    assert resumed.run_dir == copy and resumed.global_step == whole.global_step == 3072
    for (name, expected), actual in zip(
        whole.agent.state_dict().items(), resumed.agent.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, msg=name)
    logged = read_scalars(copy)["charts/learning_rate"]
    assert [step for step, _ in logged] == [2048, 2560, 3072]  # the schedule went on where it stopped


def test_checkpoints_hold_only_plain_values_and_load_with_weights_only(tmp_path):
    result = ppo_fc.train(quick_args(tmp_path, env_id="Probe1-v0", total_timesteps=1024, save_model=True))
    checkpoint = torch.load(result.checkpoint, weights_only=True)
    assert checkpoint["script"] == "ppo_fc" and checkpoint["global_step"] == 1024 and checkpoint["iteration"] == 2
    assert checkpoint["args"]["env_id"] == "Probe1-v0"
    assert not list(result.checkpoint.parent.glob(".*.tmp"))


def test_eval_checkpoint_reproduces_the_evaluation_after_training(tmp_path):
    args = quick_args(tmp_path, env_id="CartPole-v1", total_timesteps=4096, save_model=True, eval_episodes=3)
    result = ppo_fc.train(args)
    assert len(result.eval_returns) == 3
    completed = run_cli("--eval-checkpoint", str(result.checkpoint), "--eval-episodes", "3", "--run-dir", str(tmp_path))
    assert completed.returncode == 0, completed.stderr
    mean = np.mean(result.eval_returns)
    assert f"return {mean:.2f} +- {np.std(result.eval_returns):.2f}" in completed.stdout
    (eval_run,) = tmp_path.glob("*__eval")
    assert [value for _, value in read_scalars(eval_run)["eval/episodic_return"]] == result.eval_returns


def test_eval_statistics_are_frozen(tmp_path):
    args = quick_args(tmp_path, env_id="CartPole-v1", total_timesteps=2048, norm_obs=True, eval_episodes=2)
    result = ppo_fc.train(args)
    before = {k: v.clone() for k, v in result.agent.obs_norm.state_dict().items()}
    ppo_fc.evaluate(result.agent, args, ppo_fc.SummaryWriter(str(tmp_path / "e")), 0, torch.device("cpu"))
    for key, value in result.agent.obs_norm.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)
    assert before["count"].item() > 2048  # they were updated during training


def test_corrupt_and_foreign_checkpoints_are_refused(tmp_path):
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"this is not a checkpoint")
    foreign = tmp_path / "foreign.pt"
    torch.save({"script": "ddpg", "model": {}}, foreign)
    pickled = tmp_path / "pickled.pt"
    torch.save({"script": "ppo_fc", "payload": Path("x")}, pickled)  # needs unpickling of a Python class
    incomplete = tmp_path / "checkpoints" / "incomplete.pt"
    incomplete.parent.mkdir()
    torch.save({"script": "ppo_fc", "format": 1, "model": {}, "args": {}}, incomplete)
    for path, message in [
        (corrupt, "cannot read checkpoint"),
        (foreign, "not a ppo_fc checkpoint"),
        (pickled, "cannot read checkpoint"),
        (incomplete, "another format"),
        (tmp_path / "missing.pt", "does not exist"),
    ]:
        for flag in ("--eval-checkpoint", "--resume"):
            completed = run_cli(flag, str(path), "--run-dir", str(tmp_path / "runs"))
            assert completed.returncode == 2, completed.stderr
            assert completed.stderr.startswith("error: ") and message in completed.stderr
            assert len(completed.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()  # nothing was written


def test_checkpoint_of_another_shape_is_refused(tmp_path):
    result = ppo_fc.train(quick_args(tmp_path, env_id="Probe1-v0", total_timesteps=512, save_model=True))
    checkpoint = torch.load(result.checkpoint, weights_only=True)
    checkpoint["args"]["hidden_size"] = 32
    other = tmp_path / "other.pt"
    torch.save(checkpoint, other)
    with pytest.raises(ppo_fc.UsageError, match="does not fit"):
        ppo_fc.evaluate_checkpoint(quick_args(tmp_path, eval_checkpoint=str(other), eval_episodes=1))


# --- trajectories --------------------------------------------------------------------------------------------------


def test_recorded_trajectories_reload_and_their_returns_equal_the_logged_returns(tmp_path):
    path = tmp_path / "rollouts.npz"
    args = quick_args(tmp_path, env_id="CartPole-v1", total_timesteps=2048, save_trajectories=str(path))
    result = ppo_fc.train(args)
    data = load_trajectories(path)
    assert data["/observations"].shape == (4, 512, 4) and data["/agents/policy/logprobs"].shape == (4, 512)
    assert json.loads(str(data["/meta/args"]))["env_id"] == "CartPole-v1"
    finished = [episode for episode in split_episodes(data) if episode.finished]
    logged = [value for _, value in read_scalars(result.run_dir)["charts/episodic_return"]]
    assert len(finished) == len(logged) == len(result.episode_returns) > 10
    assert sorted(episode.total_reward for episode in finished) == sorted(logged)


def test_eval_checkpoint_records_trajectories_with_each_sampling_method(tmp_path):
    args = quick_args(tmp_path, env_id="Probe5-v0", total_timesteps=1024, save_model=True)
    checkpoint = ppo_fc.train(args).checkpoint
    for method in ("greedy", "basic", "temperature", "topk", "bottomk"):
        path = tmp_path / f"{method}.npz"
        returns = ppo_fc.evaluate_checkpoint(
            quick_args(
                tmp_path,
                eval_checkpoint=str(checkpoint),
                eval_episodes=40,
                sampling_method=method,
                sampling_k=1,
                save_trajectories=str(path),
            )
        )
        data = load_trajectories(path)
        assert sum(episode.finished for episode in split_episodes(data)) == 40
        assert [episode.total_reward for episode in split_episodes(data)] == returns
        if method == "topk":  # k = 1: always the most likely action
            greedy_returns = returns
        if method == "bottomk":  # always the least likely action: the opposite of topk
            assert all(a == -b for a, b in zip(returns, greedy_returns, strict=True))


# --- the command line ----------------------------------------------------------------------------------------------


def test_help():
    completed = run_cli("--help")
    assert completed.returncode == 0 and "--env-id" in completed.stdout and "--sampling-method" in completed.stdout


def test_cli_run_writes_the_conventional_log_keys(tmp_path):
    completed = run_cli(
        "--env-id", "CartPole-v1", "--total-timesteps", "1024", "--run-dir", str(tmp_path), "--eval-episodes", "1"
    )
    assert completed.returncode == 0, completed.stderr
    (run,) = tmp_path.iterdir()
    assert run.name.startswith("CartPole-v1__ppo_fc__1__")
    assert completed.stdout.startswith(f"{run}: 1024 steps, ") and "eval return" in completed.stdout
    scalars = read_scalars(run)
    expected = {
        "charts/episodic_return",
        "charts/episodic_length",
        "charts/learning_rate",
        "charts/SPS",
        "losses/value_loss",
        "losses/policy_loss",
        "losses/entropy",
        "losses/old_approx_kl",
        "losses/approx_kl",
        "losses/clipfrac",
        "losses/explained_variance",
        "perf/rollout_seconds",
        "perf/update_seconds",
        "system/rss_mb",
        "eval/episodic_return",
    }
    assert expected <= set(scalars)
    assert len(scalars["charts/SPS"]) == 2 and scalars["system/rss_mb"][0][1] > 10
    accumulator = EventAccumulator(str(run))
    accumulator.Reload()
    assert "hyperparameters/text_summary" in accumulator.Tags()["tensors"]
    assert (run / "checkpoints" / "latest.pt").is_file() and (run / "checkpoints" / "step_1024.pt").is_file()


def test_track_with_wandb_offline(tmp_path):
    completed = run_cli(
        "--env-id",
        "Probe1-v0",
        "--total-timesteps",
        "512",
        "--run-dir",
        str(tmp_path),
        "--track",
        env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"},
    )
    assert completed.returncode == 0, completed.stderr
    (run,) = tmp_path.iterdir()
    assert list(run.glob("wandb/offline-run-*")), list(run.rglob("*"))


def test_capture_video_writes_an_mp4(tmp_path):
    completed = run_cli(
        "--env-id",
        "CartPole-v1",
        "--total-timesteps",
        "512",
        "--run-dir",
        str(tmp_path),
        "--capture-video",
        env={"SDL_VIDEODRIVER": "dummy"},
    )
    assert completed.returncode == 0, completed.stderr
    (run,) = tmp_path.iterdir()
    videos = list(run.glob("videos/*.mp4"))
    assert videos and all(video.stat().st_size > 0 for video in videos)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--env-id", "NoSuchEnv-v0"], "cannot make env"),
        (["--num-minibatches", "3"], "does not divide"),
        (["--num-envs", "-2"], "must be positive"),
        (["--total-timesteps", "100"], "less than one batch"),
        (["--gamma", "1.5"], "[0, 1]"),
        (["--num-envs", "four"], "--num-envs"),
        (["--end-learning-rate", "-1"], "--end-learning-rate"),
        (["--env-id", "no_such_module:Env-v0"], "cannot make env"),
        (["--no-such-flag"], "no-such-flag"),
    ],
)
def test_bad_input_gives_one_error_line_and_exit_status_2(tmp_path, flags, message):
    completed = run_cli(*flags, "--run-dir", str(tmp_path / "runs"))
    assert completed.returncode == 2
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], completed.stderr
    assert not (tmp_path / "runs").exists()


class NanRewardEnv(gym.Env):
    """Rewards 1.0, then NaN from step 600 on: training must stop, keeping the last good checkpoint."""

    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.steps += 1
        return np.zeros(1, np.float32), 1.0 if self.steps < 600 else float("nan"), True, False, {}


def test_nan_stops_training_and_keeps_the_last_good_checkpoint(tmp_path):
    gym.register("NanReward-v0", entry_point=NanRewardEnv)
    args = quick_args(tmp_path, env_id="NanReward-v0", total_timesteps=4 * 512, num_envs=1, checkpoint_every=1)
    with pytest.raises(ppo_fc.TrainingDiverged, match=r"NaN|nan"):
        ppo_fc.train(args)
    (run,) = (tmp_path / "runs").iterdir()
    # NaN rewards start in the fifth iteration (steps 513-640): the checkpoint of the fourth is the last.
    names = {path.name for path in (run / "checkpoints").glob("*.pt")}
    assert names == {"latest.pt", "step_128.pt", "step_256.pt", "step_384.pt", "step_512.pt"}
    checkpoint = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)
    assert checkpoint["global_step"] == 512
    assert all(torch.isfinite(value).all() for value in checkpoint["model"].values())


def test_unsupported_action_space_is_refused(tmp_path):
    class MultiDiscreteActions(NanRewardEnv):
        action_space = gym.spaces.MultiDiscrete([2, 2])

    gym.register("MultiDiscreteActions-v0", entry_point=MultiDiscreteActions)
    with pytest.raises(ppo_fc.UsageError, match="MultiDiscrete action space"):
        ppo_fc.train(quick_args(tmp_path, env_id="MultiDiscreteActions-v0", total_timesteps=512))
    assert not (tmp_path / "runs").exists()


def test_dict_observations_are_flattened(tmp_path):
    class DictObservations(NanRewardEnv):
        observation_space = gym.spaces.Dict(
            {"position": gym.spaces.Box(-1, 1, (2,), np.float32), "room": gym.spaces.Discrete(3)}
        )

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return {"position": np.zeros(2, np.float32), "room": 1}, {}

        def step(self, action):
            return {"position": np.zeros(2, np.float32), "room": 2}, float(action), True, False, {}

    gym.register("DictObservations-v0", entry_point=DictObservations)
    result = ppo_fc.train(quick_args(tmp_path, env_id="DictObservations-v0", total_timesteps=512))
    assert result.agent.critic.layers[0].in_features == 2 + 3 and result.global_step == 512


def test_async_envs_train_exactly_like_sync_envs(tmp_path):
    settings = dict(env_id="CartPole-v1", total_timesteps=1024, num_envs=2, num_minibatches=2)
    sync = ppo_fc.train(quick_args(tmp_path / "sync", **settings))
    subprocesses = ppo_fc.train(quick_args(tmp_path / "async", async_envs=True, **settings))
    assert sync.episode_returns == subprocesses.episode_returns and len(sync.episode_returns) > 10
    for expected, actual in zip(sync.agent.parameters(), subprocesses.agent.parameters(), strict=True):
        torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def test_resume_needs_a_checkpoint_inside_a_run_folder(tmp_path):
    result = ppo_fc.train(quick_args(tmp_path, env_id="Probe1-v0", total_timesteps=512, save_model=True))
    loose = tmp_path / "loose.pt"
    shutil.copy(result.checkpoint, loose)
    with pytest.raises(ppo_fc.UsageError, match="checkpoints/ folder"):
        ppo_fc.train(quick_args(tmp_path, resume=str(loose)))


def test_observation_spaces_that_do_not_flatten_are_refused(tmp_path):
    class SequenceObservations(NanRewardEnv):
        observation_space = gym.spaces.Sequence(gym.spaces.Box(-1, 1, (2,), np.float32))

    gym.register("SequenceObservations-v0", entry_point=SequenceObservations)
    with pytest.raises(ppo_fc.UsageError, match="cannot flatten"):
        ppo_fc.train(quick_args(tmp_path, env_id="SequenceObservations-v0", total_timesteps=512))
    assert not (tmp_path / "runs").exists()


def test_ctrl_c_stops_after_the_iteration_with_a_consistent_checkpoint(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "ppo_fc.py", "--total-timesteps", "10000000", "--no-progress", "--run-dir", str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not list(tmp_path.glob("*/events.*")) and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # a few iterations
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "interrupted: checkpoint written" in stderr and "Traceback" not in stderr
    (run,) = tmp_path.iterdir()
    checkpoint = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)
    assert checkpoint["global_step"] == checkpoint["iteration"] * 512 > 0
    assert (run / "checkpoints" / f"step_{checkpoint['global_step']}.pt").is_file()
    logged = read_scalars(run)["charts/learning_rate"]
    assert logged[-1][0] == checkpoint["global_step"]  # the checkpoint is the state after the last logged iteration


def test_topk_sampling_of_a_continuous_agent_is_refused_before_anything_is_written(tmp_path):
    args = quick_args(tmp_path, env_id="ContinuousProbe1-v0", total_timesteps=512, save_model=True)
    checkpoint = ppo_fc.train(args).checkpoint
    evaluation = quick_args(tmp_path / "eval", eval_checkpoint=str(checkpoint), eval_episodes=1, sampling_method="topk")
    with pytest.raises(ppo_fc.UsageError, match="discrete action space"):
        ppo_fc.evaluate_checkpoint(evaluation)
    assert not (tmp_path / "eval").exists()
