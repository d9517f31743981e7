"""Probe environments: gymnasium's checker, the stated dynamics and rewards, seeding, values inside the spaces."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import probe_envs

ALL_IDS = [*probe_envs.PROBES, *probe_envs.PARTIALLY_OBSERVED]


def run_episode(env_id, actions, seed=0):
    """Play ``actions`` (cycled) until the episode ends; return observations, rewards, terminated, truncated."""
    env = gym.make(env_id)
    observation, _ = env.reset(seed=seed)
    observations, rewards = [observation], []
    for t in range(10_000):
        observation, reward, terminated, truncated, _ = env.step(actions[t % len(actions)])
        assert env.observation_space.contains(observation)
        observations.append(observation)
        rewards.append(reward)
        if terminated or truncated:
            return np.array(observations), np.array(rewards), terminated, truncated
    raise AssertionError("episode did not end")


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_passes_gymnasium_env_checker(env_id):
    env = gym.make(env_id)
    check_env(env.unwrapped, skip_render_check=True)


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_observations_inside_space_float32_or_uint8_images_and_seeding_reproduces(env_id):
    def rollout(seed):
        env = gym.make(env_id)
        env.action_space.seed(seed)
        observation, _ = env.reset(seed=seed)
        trace = [observation]
        for _ in range(60):
            observation, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            trace += [observation, reward]
            if terminated or truncated:
                observation, _ = env.reset()
                trace.append(observation)
        return trace

    trace = rollout(3)
    assert env_id in gym.registry
    space = gym.make(env_id).observation_space
    # ImageVectorBandit-v0: an image part and a Discrete part
    if isinstance(space, gym.spaces.Dict):
        assert space["pixels"].dtype == np.uint8 and isinstance(space["flip"], gym.spaces.Discrete)
    else:
        assert space.dtype == (np.uint8 if env_id.startswith("Image") else np.float32)
    for item in trace:
        if isinstance(item, np.ndarray | dict):
            assert space.contains(item) and (isinstance(item, dict) or item.dtype == space.dtype)
    again = rollout(3)

    def same(a, b):
        if isinstance(a, dict):
            return all(np.array_equal(a[k], b[k]) for k in a)
        return np.array_equal(a, b)

    assert all(same(a, b) for a, b in zip(trace, again, strict=True))


def test_probe1_one_step_reward_one():
    observations, rewards, terminated, truncated = run_episode("Probe1-v0", [0])
    np.testing.assert_array_equal(observations[0], [0.0])
    assert rewards.tolist() == [1.0] and terminated and not truncated


def test_probe2_reward_equals_observation_and_both_signs_occur():
    seen = set()
    for seed in range(20):
        observations, rewards, terminated, _ = run_episode("Probe2-v0", [0], seed=seed)
        assert (
            observations[0][0] in (-1.0, 1.0)
            and rewards.tolist() == [observations[0][0]]
            and terminated
        )
        seen.add(float(observations[0][0]))
    assert seen == {-1.0, 1.0}


def test_probe3_two_steps_reward_at_the_end():
    observations, rewards, terminated, truncated = run_episode("Probe3-v0", [0])
    assert observations[:2, 0].tolist() == [0.0, 1.0]
    assert rewards.tolist() == [0.0, 1.0] and terminated and not truncated


@pytest.mark.parametrize(("action", "reward"), [(0, -1.0), (1, 1.0)])
def test_probe4_reward_depends_on_action(action, reward):
    observations, rewards, terminated, _ = run_episode("Probe4-v0", [action])
    np.testing.assert_array_equal(observations[0], [0.0])
    assert rewards.tolist() == [reward] and terminated


def test_probe5_reward_plus_one_when_action_matches_observation():
    for seed in range(10):
        env = gym.make("Probe5-v0")
        observation, _ = env.reset(seed=seed)
        cue = int(observation[0])
        assert env.step(cue)[1] == 1.0
        env.reset(seed=seed)
        assert env.step(1 - cue)[1] == -1.0


def test_probe6_follows_parity_for_ten_steps():
    env = gym.make("Probe6-v0")
    observation, _ = env.reset(seed=0)
    total = 0.0
    for t in range(10):
        np.testing.assert_array_equal(observation, [t, t % 2])
        observation, reward, terminated, truncated, _ = env.step(t % 2)
        total += reward
        assert terminated == (t == 9) and not truncated
    assert total == 10.0
    _, rewards, _, _ = run_episode("Probe6-v0", [1])  # always 1: right on odd steps only
    assert rewards.tolist() == [0.0, 1.0] * 5


def test_repeat_cue_shows_its_cue_once_and_pays_for_repeating_it_at_every_one_of_128_steps():
    cues = set()
    for seed in range(12):
        env = gym.make("RepeatCue-v0")
        observation, _ = env.reset(seed=seed)
        cue = int(observation[0] > 0)
        cues.add(cue)
        remembered = 40  # an agent whose memory reaches 40 steps back, then a wrong guess
        rewards = []
        for t in range(128):
            observation, reward, terminated, _, _ = env.step(cue if t <= remembered else 1 - cue)
            np.testing.assert_array_equal(observation, [0.0])
            rewards.append(reward)
            assert terminated == (t == 127)
        assert rewards == [1 / 128] * (remembered + 1) + [-1 / 128] * (127 - remembered)
    assert cues == {0, 1}


def test_probe7_rewards_remembering_the_cue():
    cues = set()
    for seed in range(12):
        env = gym.make("Probe7-v0")
        observation, _ = env.reset(seed=seed)
        cue = int(observation[0])
        cues.add(cue)
        for t in range(4):
            action = cue if t == 3 else 1 - cue
            observation, reward, terminated, _, _ = env.step(action)
            if t < 3:
                np.testing.assert_array_equal(observation, [0.0])
            assert reward == (1.0 if t == 3 else 0.0) and terminated == (t == 3)
        env.reset(seed=seed)
        rewards = [env.step(1 - cue)[1] for _ in range(4)]
        assert rewards == [0.0, 0.0, 0.0, 0.0]
    assert cues == {0, 1}


def test_continuous_probes_one_to_three_match_the_discrete_ones():
    for index in (1, 2, 3):
        for seed in range(4):
            discrete = run_episode(f"Probe{index}-v0", [0], seed=seed)
            continuous = run_episode(
                f"ContinuousProbe{index}-v0", [np.array([0.3], dtype=np.float32)], seed=seed
            )
            for a, b in zip(discrete, continuous, strict=True):
                np.testing.assert_array_equal(a, b)
        assert gym.make(f"ContinuousProbe{index}-v0").action_space == gym.spaces.Box(
            -1, 1, (1,), np.float32
        )


@pytest.mark.parametrize("action", [-1.0, -0.2, 0.5, 0.9, 1.0])
def test_continuous_probe4_reward_is_negative_squared_distance_to_half(action):
    _, rewards, terminated, _ = run_episode(
        "ContinuousProbe4-v0", [np.array([action], dtype=np.float32)]
    )
    assert rewards[0] == pytest.approx(-((action - 0.5) ** 2)) and terminated


def test_continuous_probe4_clips_actions_to_the_space():
    _, rewards, _, _ = run_episode("ContinuousProbe4-v0", [np.array([3.0], dtype=np.float32)])
    assert rewards[0] == pytest.approx(-0.25)


def test_continuous_probe5_optimum_is_half_the_observation():
    for seed in range(10):
        env = gym.make("ContinuousProbe5-v0")
        observation, _ = env.reset(seed=seed)
        assert observation[0] in (-1.0, 1.0)
        assert env.step(np.array([0.5 * observation[0]], dtype=np.float32))[1] == pytest.approx(0.0)
        env.reset(seed=seed)
        assert env.step(np.array([0.0], dtype=np.float32))[1] == pytest.approx(-0.25)


@pytest.mark.parametrize(
    ("env_id", "full_id", "hidden"),
    [("CartPoleNoVel-v1", "CartPole-v1", [1, 3]), ("PendulumNoVel-v1", "Pendulum-v1", [2])],
)
def test_no_velocity_envs_hide_velocities_and_keep_everything_else(env_id, full_id, hidden):
    masked, full = gym.make(env_id), gym.make(full_id)
    assert masked.spec.max_episode_steps == full.spec.max_episode_steps
    assert masked.observation_space == full.observation_space
    masked_obs, _ = masked.reset(seed=5)
    full_obs, _ = full.reset(seed=5)
    kept = [i for i in range(full_obs.shape[0]) if i not in hidden]
    for _ in range(30):
        assert (masked_obs[hidden] == 0).all()
        np.testing.assert_array_equal(masked_obs[kept], full_obs[kept])
        action = full.action_space.sample()
        masked_obs, masked_reward, *_ = masked.step(action)
        full_obs, full_reward, terminated, truncated, _ = full.step(action)
        assert masked_reward == full_reward
        if terminated or truncated:
            break
    assert np.abs(full_obs[hidden]).sum() > 0  # the hidden entries really carried information


def test_probe_envs_work_in_a_same_step_vector_env():
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make("Probe3-v0")] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    observations, _ = envs.reset(seed=0)
    np.testing.assert_array_equal(observations, [[0.0], [0.0]])
    observations, rewards, terminations, _, infos = envs.step(np.zeros(2, dtype=np.int64))
    np.testing.assert_array_equal(observations, [[1.0], [1.0]])
    observations, rewards, terminations, _, infos = envs.step(np.zeros(2, dtype=np.int64))
    assert rewards.tolist() == [1.0, 1.0] and terminations.all()
    # already the next episode's first observation
    np.testing.assert_array_equal(observations, [[0.0], [0.0]])
    assert infos["_final_obs"].all()


@pytest.mark.parametrize("env_id", list(probe_envs.PROBES))
@pytest.mark.parametrize("gamma", [0.5, 0.9, 0.99, 1.0])
def test_optimal_value_is_the_discounted_return_of_the_optimal_action(env_id, gamma):
    """The closed forms of the docstrings agree with playing optimal_action() in every state an episode visits."""
    env = gym.make(env_id).unwrapped
    for seed in range(4):
        env.reset(seed=seed)
        claimed, rewards = [], []
        terminated = False
        while not terminated:
            claimed.append(env.optimal_value(gamma))
            _, reward, terminated, _, _ = env.step(env.optimal_action())
            rewards.append(reward)
        for t, value in enumerate(claimed):
            returned = sum(gamma**k * reward for k, reward in enumerate(rewards[t:]))
            assert value == pytest.approx(returned, abs=1e-9), (t, rewards)


def test_suboptimal_actions_do_worse_where_actions_matter():
    for env_id, bad_action in [
        ("Probe4-v0", 0),
        ("ContinuousProbe4-v0", np.array([-0.5], np.float32)),
    ]:
        env = gym.make(env_id).unwrapped
        env.reset(seed=0)
        assert env.step(bad_action)[1] < env.optimal_value(0.99)


@pytest.mark.parametrize(
    "env_id", ["ImageBandit-v0", "ImageBanditRGB-v0", "ImageMemory-v0", "ImageMemoryRGB-v0"]
)
def test_an_image_probe_shows_its_cue_as_the_lit_half_and_the_memory_probe_only_first(env_id):
    env = gym.make(env_id).unwrapped
    for seed in range(4):
        observation, _ = env.reset(seed=seed)
        image = observation[..., 0] if env_id.endswith("RGB-v0") else observation[0]
        lit = [image[:, :18].mean(), image[:, 18:].mean()]
        assert lit[env.cue] == 255 and lit[1 - env.cue] == 0
        if env_id.startswith("ImageMemory"):
            observation, *_ = env.step(0)
            assert not observation.any()
