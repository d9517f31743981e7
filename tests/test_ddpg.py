"""ddpg.py: the replay buffer, the noise, the target update, learning on the probes, resume, and bad input."""

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import (
    NanRewardEnv,
    assert_one_error_line,
    each_in_one_process,
    read_scalars,
    visit_states,
)

import ddpg
import ppo_fc
from common.errors import TrainingDiverged, UsageError
from common.trajectories import load_trajectories, split_episodes


def quick_args(tmp_path, **overrides) -> ddpg.Args:
    settings = dict(
        run_dir=str(tmp_path / "runs"), progress=False, eval_episodes=0, save_model=False
    )
    settings |= dict(learning_starts=256, batch_size=64, hidden_size=64, buffer_size=10_000)
    return ddpg.Args(**{**settings, **overrides})


def test_the_replay_buffer_wraps_around_and_samples_only_what_it_holds():
    buffer = ddpg.ReplayBuffer(5, 1, 1)
    for step in range(3):  # two envs: 6 transitions, the first overwritten
        obs = np.array([[2 * step], [2 * step + 1]], np.float32)
        buffer.add(obs, obs + 100, obs, obs[:, 0], np.zeros(2, np.float32))
    assert len(buffer) == 5 and buffer.full and buffer.position == 1
    assert sorted(buffer.observations[:, 0].tolist()) == [1, 2, 3, 4, 5]
    np.testing.assert_array_equal(buffer.next_observations, buffer.observations + 100)
    partial = ddpg.ReplayBuffer(100, 1, 1)
    partial.add(
        np.ones((2, 1), np.float32),
        np.ones((2, 1), np.float32),
        np.ones((2, 1)),
        np.ones(2),
        np.zeros(2),
    )
    np.random.seed(0)
    sampled = partial.sample(1000, torch.device("cpu"))[0]
    assert (sampled == 1).all()  # never an empty slot
    restored = ddpg.ReplayBuffer(5, 1, 1)
    restored.restore(buffer.state())
    for name in ddpg.ReplayBuffer.FIELDS:
        np.testing.assert_array_equal(getattr(restored, name), getattr(buffer, name))
    assert (restored.position, restored.full) == (1, True)


def stored_buffer(result) -> dict[str, np.ndarray]:
    (path,) = (result.run_dir / "checkpoints").glob("buffer_step_*.npz")
    with np.load(path, allow_pickle=False) as stored:
        return dict(stored)


def test_truncation_stores_the_last_observation_and_no_termination(tmp_path):
    gym.register(
        "ShortPendulum-v0",
        entry_point="gymnasium.envs.classic_control:PendulumEnv",
        max_episode_steps=5,
    )
    args = quick_args(
        tmp_path, env_id="ShortPendulum-v0", total_timesteps=40, num_envs=2, save_model=True
    )
    args.save_buffer, args.learning_starts = True, 1000
    result = ddpg.train(args)
    assert result.episode_lengths == [5] * 8  # every episode of both envs is logged
    stored = stored_buffer(result)
    assert not stored["terminations"].any()  # truncations bootstrap
    # Rows are vector steps of 2 envs; each env's episode is 5 steps, then a reset.
    obs, next_obs = (
        stored["observations"].reshape(20, 2, 3),
        stored["next_observations"].reshape(20, 2, 3),
    )
    for t in range(19):
        if (t + 1) % 5:
            # within an episode: the next observation
            np.testing.assert_array_equal(next_obs[t], obs[t + 1])
        else:
            # at the end: the episode's last, not the reset one
            assert not np.allclose(next_obs[t], obs[t + 1])


def test_termination_is_stored(tmp_path):
    args = quick_args(
        tmp_path,
        env_id="ContinuousProbe1-v0",
        total_timesteps=20,
        save_model=True,
        learning_starts=100,
    )
    args.save_buffer = True
    # every one-step probe episode terminates
    assert stored_buffer(ddpg.train(args))["terminations"].all()


def test_the_target_update_moves_every_parameter_by_tau():
    torch.manual_seed(0)
    online, target = ddpg.QNetwork(3, 1, 8), ddpg.QNetwork(3, 1, 8)
    before = [p.clone() for p in target.parameters()]
    ddpg.polyak_update(target, online, 0.1)
    for old, new, source in zip(before, target.parameters(), online.parameters(), strict=True):
        torch.testing.assert_close(new, 0.9 * old + 0.1 * source)


def test_ou_noise_reverts_to_zero_and_restarts_with_each_episode():
    args = ddpg.Args(noise="ou", exploration_noise=0.2)
    state = np.zeros((2, 1), np.float32)
    np.random.seed(0)
    draws = np.stack([ddpg.next_noise(args, state, np.zeros(2, bool)) for _ in range(20_000)])
    # Stationary: mean 0, variance sigma^2 / (1 - (1 - theta)^2), and the lag-1 correlation is 1 - theta.
    assert abs(draws.mean()) < 0.02
    np.testing.assert_allclose(draws.var(), 0.2**2 / (1 - (1 - ddpg.OU_THETA) ** 2), rtol=0.05)
    x = draws[:-1, 0, 0]
    np.testing.assert_allclose(np.corrcoef(x, draws[1:, 0, 0])[0, 1], 1 - ddpg.OU_THETA, atol=0.02)
    state[:] = 5.0
    ddpg.next_noise(args, state, np.array([True, False]))
    # env 0's episode started again: its process too
    assert abs(state[0, 0]) < 1 and state[1, 0] > 3
    gaussian = ddpg.Args(noise="gaussian", exploration_noise=0.3)
    draws = np.stack([ddpg.next_noise(gaussian, state, np.zeros(2, bool)) for _ in range(20_000)])
    np.testing.assert_allclose(draws.std(), 0.3, rtol=0.03)


def test_the_actor_scales_each_dimension_to_its_own_bounds():
    space = gym.spaces.Box(np.array([-1, 0], np.float32), np.array([1, 10], np.float32))
    actor = ddpg.Actor(2, space, 8)
    with torch.no_grad():
        actor.net[-2].bias.copy_(torch.tensor([10.0, 10.0]))  # tanh at its top
        top = actor(torch.zeros(1, 2))
        actor.net[-2].bias.copy_(torch.tensor([-10.0, -10.0]))
        bottom = actor(torch.zeros(1, 2))
    torch.testing.assert_close(top[0], torch.tensor([1.0, 10.0]), atol=1e-3, rtol=0)
    torch.testing.assert_close(bottom[0], torch.tensor([-1.0, 0.0]), atol=1e-3, rtol=0)


@pytest.mark.parametrize(
    ("env_id", "steps"),
    [("ContinuousProbe1-v0", 1500), ("ContinuousProbe2-v0", 1500), ("ContinuousProbe3-v0", 2000),
     ("ContinuousProbe4-v0", 2000), ("ContinuousProbe5-v0", 3000)],
)  # fmt: skip
def test_continuous_probes(tmp_path, env_id, steps):
    args = quick_args(tmp_path, env_id=env_id, total_timesteps=steps, learning_rate=1e-3)
    agent = ddpg.train(args).agent
    action_matters = env_id in ("ContinuousProbe4-v0", "ContinuousProbe5-v0")
    for env, observation in visit_states(env_id):
        x = torch.as_tensor(observation, dtype=torch.float32)[None]
        with torch.no_grad():
            action = agent.actor(x)
            value = agent.qf1(x, action).item()
        # the actor's output at the optimum, and the critic knows what it earns there
        if action_matters:
            assert action[0, 0].item() == pytest.approx(env.optimal_action()[0], abs=0.1), (
                observation
            )
            assert value == pytest.approx(env.optimal_value(args.gamma), abs=0.1), observation
        else:
            assert value == pytest.approx(env.optimal_value(args.gamma), abs=0.1), observation


def test_resume_with_the_buffer_gives_the_uninterrupted_run(tmp_path, monkeypatch):
    settings = dict(
        env_id="Pendulum-v1",
        num_envs=2,
        total_timesteps=600,
        learning_starts=200,
        checkpoint_every=150,
    )
    settings |= dict(save_model=True, save_buffer=True, noise="ou")
    kept = ddpg.train(quick_args(tmp_path / "kept", **settings))
    assert [path.name for path in (kept.run_dir / "checkpoints").glob("*.npz")] == [
        "buffer_step_600.npz"
    ]
    # older buffers stay, to resume from step 300
    monkeypatch.setattr(Path, "unlink", lambda self: None)
    whole = ddpg.train(quick_args(tmp_path / "whole", **settings))
    middle = whole.run_dir / "checkpoints" / "step_300.pt"
    resumed = ddpg.train(ddpg.Args(resume=str(middle), progress=False))
    assert resumed.global_step == whole.global_step == 600
    for (name, a), b in zip(
        whole.agent.state_dict().items(), resumed.agent.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_a_larger_budget_trains_a_finished_run_on_as_a_run_started_with_it(tmp_path):
    settings = dict(env_id="Pendulum-v1", num_envs=2, learning_starts=200, noise="ou")
    settings |= dict(save_model=True, save_buffer=True)  # the buffer of the run's end: exact
    whole = ddpg.train(quick_args(tmp_path / "whole", total_timesteps=600, **settings))
    short = ddpg.train(quick_args(tmp_path / "short", total_timesteps=300, **settings))
    extended = ddpg.train(
        ddpg.Args(resume=str(short.checkpoint), total_timesteps=600, progress=False)
    )
    assert extended.global_step == whole.global_step == 600
    for (name, a), b in zip(
        whole.agent.state_dict().items(), extended.agent.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_resume_without_the_buffer_says_so_and_refills_a_batch_first(tmp_path, capsys):
    settings = dict(total_timesteps=300, learning_starts=100, checkpoint_every=100, save_model=True)
    whole = ddpg.train(quick_args(tmp_path, **settings))
    resumed = ddpg.train(
        ddpg.Args(resume=str(whole.run_dir / "checkpoints" / "step_100.pt"), progress=False)
    )
    assert "starts with an empty buffer" in capsys.readouterr().err
    # One update at step 100 before the checkpoint; after it, updates wait for a batch (64) of new transitions.
    assert torch.load(resumed.checkpoint, weights_only=True)["updates"] == 1 + (200 - 64 + 1)


def test_a_resume_whose_buffer_was_replaced_says_so(tmp_path, capsys):
    settings = dict(
        total_timesteps=300,
        learning_starts=100,
        checkpoint_every=100,
        save_model=True,
        save_buffer=True,
    )
    whole = ddpg.train(quick_args(tmp_path, **settings))
    assert [path.name for path in (whole.run_dir / "checkpoints").glob("*.npz")] == [
        "buffer_step_300.npz"
    ]
    ddpg.train(ddpg.Args(resume=str(whole.run_dir / "checkpoints" / "step_100.pt"), progress=False))
    assert "names buffer_step_100.npz, which is gone" in capsys.readouterr().err


def test_a_resume_without_its_buffer_logs_no_losses_before_its_own_first_update(tmp_path, capsys):
    settings = dict(total_timesteps=400, learning_starts=100, batch_size=150, checkpoint_every=200)
    first = ddpg.train(quick_args(tmp_path, save_model=True, **settings))
    resumed = ddpg.Args(resume=str(first.run_dir / "checkpoints" / "step_200.pt"), progress=False)
    ddpg.train(resumed)
    assert "holds no replay buffer" in capsys.readouterr().err
    # The resumed part refills 150 transitions: its first update is at step 350, after the log at 300.
    logged = dict(read_scalars(first.run_dir)["losses/qf1_loss"])
    assert 300 not in logged and logged[400] > 0


class GridActionEnv(gym.Env):
    """Actions of shape (2, 2) within bounds of their own; the reward is the action's sum. Episodes of 5 steps."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,))

    def __init__(self, high: float = 1.0):
        self.action_space = gym.spaces.Box(-high, high, (2, 2))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(3, dtype=np.float32), {}

    def step(self, action):
        assert action.shape == (2, 2) and np.all(np.abs(action) <= self.action_space.high)
        self.steps += 1
        return np.zeros(3, dtype=np.float32), float(action.sum()), self.steps == 5, False, {}


def test_shaped_actions_reach_the_env_in_their_shape_and_unbounded_ones_are_refused(tmp_path):
    gym.register("GridAction-v0", entry_point=GridActionEnv)
    result = ddpg.train(
        quick_args(
            tmp_path, env_id="GridAction-v0", total_timesteps=400, num_envs=2, eval_episodes=2
        )
    )
    # random, noisy and evaluation actions
    assert result.global_step == 400 and len(result.eval_returns) == 2
    gym.register("UnboundedAction-v0", entry_point=GridActionEnv, kwargs={"high": np.inf})
    with pytest.raises(UsageError, match="unbounded actions"):
        ddpg.train(quick_args(tmp_path, env_id="UnboundedAction-v0", total_timesteps=10))


class ImageObservationEnv(GridActionEnv):
    """GridActionEnv seen through a 36x36 RGB camera."""

    observation_space = gym.spaces.Box(0, 255, (36, 36, 3), np.uint8)

    def reset(self, *, seed=None, options=None):
        return np.zeros(self.observation_space.shape, np.uint8), super().reset(seed=seed)[1]

    def step(self, action):
        return np.zeros(self.observation_space.shape, np.uint8), *super().step(action)[1:]


def test_an_image_observation_is_refused(tmp_path):
    gym.register("ImageObservation-v0", entry_point=ImageObservationEnv)
    with pytest.raises(
        UsageError, match=r"its observation is an image .*ddpg.py takes vector observations only"
    ):
        ddpg.train(quick_args(tmp_path, env_id="ImageObservation-v0", total_timesteps=10))
    assert not any(tmp_path.iterdir())


def test_checkpoints_of_the_other_scripts_are_refused(tmp_path):
    ppo = ppo_fc.train(ppo_fc.Args(env_id="Pendulum-v1", total_timesteps=512, run_dir=str(tmp_path), progress=False,
                                   eval_episodes=0))  # fmt: skip
    with pytest.raises(
        UsageError, match=r"\(written by ppo_fc.py\) does not fit this script: its settings"
    ):
        ddpg.train(ddpg.Args(resume=str(ppo.checkpoint), progress=False))
    result = ddpg.train(quick_args(tmp_path, total_timesteps=50, save_model=True))
    with pytest.raises(
        UsageError, match=r"\(written by ddpg.py\) does not fit this script: its settings"
    ):
        ppo_fc.train(ppo_fc.Args(resume=str(result.checkpoint), progress=False))


BAD_INPUT = [
    (["--env-id", "CartPole-v1"], "Discrete action space"),
    (["--batch-size", "0"], "--batch-size"),
    (["--tau", "1.5"], "--tau"),
    (["--total-timesteps", "1", "--num-envs", "2"], "less than one vector step"),
    (["--eval-checkpoint", "missing.pt"], "does not exist"),
    (["--eval-every", "100", "--eval-episodes", "0"], "--eval-every needs"),
]


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    flag_lists = [[*flags, "--no-progress"] for flags, _ in BAD_INPUT]
    return each_in_one_process(["ddpg.py"], flag_lists, tmp_path_factory.mktemp("bad"))


@pytest.mark.parametrize(("flags", "message"), BAD_INPUT)
def test_bad_input_is_one_error_line(refused, flags, message):
    process, runs = refused[(*flags, "--no-progress")]
    assert_one_error_line(process, message)
    assert not runs.exists()


def test_eval_checkpoint_plays_the_deterministic_actor(tmp_path):
    result = ddpg.train(quick_args(tmp_path, total_timesteps=100, save_model=True))
    returns = [
        ddpg.evaluate_checkpoint(
            ddpg.Args(
                eval_checkpoint=str(result.checkpoint),
                eval_episodes=1,
                seed=3,
                run_dir=str(tmp_path),
            )
        )
        for _ in range(2)
    ]
    assert returns[0] == returns[1]  # no noise: the same seed plays the same episode


class NanRewardBox(NanRewardEnv):
    action_space = gym.spaces.Box(-1, 1, (1,), np.float32)


def test_nan_stops_training_and_keeps_the_last_good_checkpoint(tmp_path):
    gym.register("NanRewardBox-v0", entry_point=NanRewardBox)
    args = quick_args(
        tmp_path,
        env_id="NanRewardBox-v0",
        total_timesteps=1000,
        checkpoint_every=50,
        save_model=True,
    )
    with pytest.raises(TrainingDiverged, match=r"NaN|nan"):
        ddpg.train(args)
    (run,) = (tmp_path / "runs").iterdir()
    # NaN rewards from step 600 on reach the parameters once a batch samples one; no checkpoint after that holds them.
    checkpoint = torch.load(run / "checkpoints" / "latest.pt", weights_only=True)
    assert checkpoint["global_step"] >= 550
    assert all(torch.isfinite(value).all() for value in checkpoint["model"].values())


def test_eval_every_logs_noise_free_episodes_during_training(tmp_path):
    result = ddpg.train(quick_args(tmp_path, total_timesteps=600, eval_every=200, eval_episodes=1))
    scalars = read_scalars(result.run_dir)
    evaluated = [step for step, _ in scalars["eval/episodic_return"]]
    # during training; at its end, the evaluation after it (once)
    assert evaluated == [200, 400, 600]
    # from the first update on, as CleanRL
    for key in ("losses/qf1_loss", "losses/qf1_values", "losses/actor_loss"):
        assert scalars[key] and min(step for step, _ in scalars[key]) >= 256
    assert min(step for step, _ in scalars["charts/learning_rate"]) < 256


def test_the_same_seed_gives_the_same_run(tmp_path):
    settings = dict(total_timesteps=400, learning_starts=300)  # random actions, then learning
    first, second = (ddpg.train(quick_args(tmp_path / name, **settings)) for name in ("a", "b"))
    assert first.episode_returns == second.episode_returns
    for a, b in zip(
        first.agent.state_dict().values(), second.agent.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_nan_stops_training_without_checkpoints_too(tmp_path):
    gym.register("NanRewardBoxNoCheckpoints-v0", entry_point=NanRewardBox)
    # the losses are checked after every update
    with pytest.raises(TrainingDiverged, match=r"NaN|nan"):
        ddpg.train(
            quick_args(tmp_path, env_id="NanRewardBoxNoCheckpoints-v0", total_timesteps=1000)
        )


def test_recorded_training_steps_reload_and_their_returns_equal_the_logged_returns(tmp_path):
    recording = tmp_path / "steps"
    settings = dict(
        total_timesteps=1000, learning_starts=500, checkpoint_every=500, save_model=True
    )
    result = ddpg.train(quick_args(tmp_path, save_trajectories=str(recording), **settings))
    data = load_trajectories(recording)
    assert data["/observations"].shape == (1, 1000, 3) and data["/actions"].shape == (1, 1000, 1)
    assert not [key for key in data if key.startswith("/agents")]  # ddpg records no policy fields
    finished = [episode.total_reward for episode in split_episodes(data) if episode.finished]
    logged = [value for _, value in read_scalars(result.run_dir)["charts/episodic_return"]]
    assert len(finished) == len(logged) == 5
    np.testing.assert_allclose(finished, logged, rtol=1e-5)


def test_an_actor_edited_to_the_wrong_output_size_says_where_the_fix_goes(tmp_path, monkeypatch):
    original = ddpg.Actor.__init__

    def wider(self, observation_size, action_space, hidden_size):
        original(self, observation_size, action_space, hidden_size)
        self.net[-2] = ddpg.nn.Linear(hidden_size, self.net[-2].out_features + 1)

    monkeypatch.setattr(ddpg.Actor, "__init__", wider)
    args = ddpg.Args(
        env_id="Pendulum-v1", total_timesteps=200, run_dir=str(tmp_path), progress=False
    )
    with pytest.raises(
        UsageError, match=r"the last layer of Actor\.net in ddpg\.py must output one per action"
    ):
        ddpg.train(args)
    assert not any(tmp_path.iterdir())  # stopped before the run folder
