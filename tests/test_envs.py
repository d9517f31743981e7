"""common/envs.py: env ids of packages that register gymnasium envs, and flat observations."""

import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.spaces import Box, Dict, Discrete, Sequence, Text, Tuple

import probe_envs  # noqa: F401  (registers the probe ids)
from common import cli, envs
from common.envs import flat_observations, resolve_env_id
from common.errors import UsageError

# Makes each id given on the command line in this fresh interpreter, where no env package was imported; a bare id of
# such a package must fail there, which is what a spawned AsyncVectorEnv worker sees.
FRESH_MAKE = """
import sys, gymnasium as gym
env_ids = sys.argv[1:]
for env_id in env_ids:
    module, _, bare = env_id.rpartition(":")
    assert module and module not in sys.modules, env_id
    try:
        gym.make(bare)
    except gym.error.Error:
        pass
    else:
        raise AssertionError(f"{bare} was registered without importing {module}")
for env_id in env_ids:
    env = gym.make(env_id)
    env.reset(seed=0)
    env.step(env.action_space.sample())
print("made", len(env_ids))
"""


def make_in_fresh_process(env_ids: list[str], pythonpath: Path | None = None) -> None:
    environ = (
        {**os.environ, "PYTHONPATH": str(pythonpath)}
        if pythonpath
        else {**os.environ, "PYTHONPATH": ""}
    )
    result = subprocess.run(
        [sys.executable, "-c", FRESH_MAKE, *env_ids],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"made {len(env_ids)}"


def test_registered_ids_come_back_unchanged_without_a_scan(monkeypatch):
    monkeypatch.setattr(
        envs, "_candidate_modules", lambda env_id: pytest.fail(f"scanned for {env_id}")
    )
    assert resolve_env_id("CartPole-v1") == "CartPole-v1"
    assert resolve_env_id("Probe1-v0") == "Probe1-v0"


def test_ids_named_for_their_package_resolve_and_make_in_a_fresh_process(monkeypatch):
    # The package the id's prefix names is the first candidate: no scan of the installed distributions is needed.
    candidates = envs._candidate_modules
    monkeypatch.setattr(
        envs, "_candidate_modules", lambda env_id: itertools.islice(candidates(env_id), 1)
    )
    expected = {
        "popgym-RepeatPreviousEasy-v0": "popgym",
        "MiniGrid-MemoryS7-v0": "minigrid",
        "MiniGrid-Empty-5x5-v0": "minigrid",
    }
    resolved = [resolve_env_id(env_id) for env_id in expected]
    assert resolved == [f"{module}:{env_id}" for env_id, module in expected.items()]
    # Once the package is imported its ids are registered here, but workers still need the module form.
    assert resolve_env_id("popgym-RepeatPreviousEasy-v0") == "popgym:popgym-RepeatPreviousEasy-v0"
    assert resolve_env_id("MiniGrid-MemoryS9-v0") == "minigrid:MiniGrid-MemoryS9-v0"
    make_in_fresh_process(resolved)


def test_atari_ids_of_both_forms_resolve_through_ale_py_and_make_in_a_fresh_process():
    # ale-py registers its ids only when imported; neither "ale" nor "breakoutnoframeskip" is a module, so the scan
    # of the installed packages finds it.
    resolved = [resolve_env_id(env_id) for env_id in ("ALE/Breakout-v5", "BreakoutNoFrameskip-v4")]
    assert resolved == ["ale_py:ALE/Breakout-v5", "ale_py:BreakoutNoFrameskip-v4"]
    make_in_fresh_process(resolved)


def write_distribution(folder: Path, module: str, requires: str, body: str) -> None:
    """A package `module` in `folder` with installed metadata (dist-info), as pip would leave it."""
    (folder / module).mkdir(parents=True)
    (folder / module / "__init__.py").write_text(textwrap.dedent(body))
    info = folder / f"{module}-0.1.dist-info"
    info.mkdir()
    name = module.replace("_", "-")
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\nRequires-Dist: {requires}\n"
    )
    (info / "top_level.txt").write_text(f"{module}\n")


REGISTERS_TINY = """
    import gymnasium as gym
    from gymnasium.envs.registration import register

    class TinyEnv(gym.Env):
        observation_space = gym.spaces.Box(0.0, 1.0, (2,))
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            return self.observation_space.low, {}

        def step(self, action):
            return self.observation_space.low, 0.0, True, False, {}

    register(id="TinyScanned-v0", entry_point=TinyEnv)
"""


@pytest.fixture
def scanned_packages(tmp_path, monkeypatch):
    """Three installed packages in front of sys.path: one that fails to import and one that does not require
    gymnasium (though it registers the id too) come first; the one to find comes last."""
    first, last = tmp_path / "first", tmp_path / "last"
    write_distribution(
        first, "broken_gym_pkg", "gymnasium>=1.0", "raise RuntimeError('broken on import')"
    )
    write_distribution(first, "robotics_only_pkg", "gymnasium-robotics>=1.0", REGISTERS_TINY)
    write_distribution(last, "tiny_gym_pkg", "gymnasium[classic-control]>=1.0", REGISTERS_TINY)
    monkeypatch.syspath_prepend(str(last))
    monkeypatch.syspath_prepend(str(first))
    monkeypatch.setattr(envs, "_registered_by", {})
    yield last
    gym.registry.pop("TinyScanned-v0", None)
    for module in ("broken_gym_pkg", "robotics_only_pkg", "tiny_gym_pkg"):
        sys.modules.pop(module, None)


def test_an_id_is_found_in_the_installed_packages_that_require_gymnasium(scanned_packages):
    assert resolve_env_id("TinyScanned-v0") == "tiny_gym_pkg:TinyScanned-v0"
    assert "robotics_only_pkg" not in sys.modules
    make_in_fresh_process(["tiny_gym_pkg:TinyScanned-v0"], pythonpath=scanned_packages)


def test_the_module_form_comes_back_unchanged_and_is_checked():
    assert (
        resolve_env_id("popgym:popgym-RepeatPreviousEasy-v0")
        == "popgym:popgym-RepeatPreviousEasy-v0"
    )
    assert gym.make("popgym:popgym-RepeatPreviousEasy-v0").reset(seed=0)
    with pytest.raises(UsageError, match="module 'no_such_module' cannot be imported"):
        resolve_env_id("no_such_module:X-v0")
    with pytest.raises(UsageError, match="unknown env id 'popgym:popgym-NoSuchGame-v0'"):
        resolve_env_id("popgym:popgym-NoSuchGame-v0")


@pytest.mark.parametrize(
    ("env_id", "suggestion"),
    [
        ("Qxzqxz-v0", None),
        ("CartPol-v1", "Did you mean: `CartPole`?"),
        ("CartPole-v9", "It provides versioned environments: [ `v0`, `v1` ]"),
        # found once minigrid is imported
        ("MiniGrid-MemoryS8-v0", "Did you mean: `MiniGrid-MemoryS9`?"),
    ],
)
def test_an_unknown_id_is_one_line_with_gymnasiums_suggestion_and_the_module_form(
    env_id, suggestion
):
    with pytest.raises(UsageError) as error:
        resolve_env_id(env_id)
    message = str(error.value)
    assert message.startswith(f"unknown env id '{env_id}'")
    assert message.endswith(f"if a package registers it, pass it as module:{env_id}")
    assert "\n" not in message
    if suggestion:
        assert suggestion in message
    else:
        assert "(" not in message  # gymnasium's "doesn't exist" alone adds nothing


def test_minigrid_loses_its_mission_text_and_steps_in_a_same_step_vector_env(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_printed_notices", set())
    env_id = resolve_env_id("MiniGrid-MemoryS7-v0")

    def make_env():
        return flat_observations(gym.make(env_id, max_episode_steps=3))

    vector = gym.vector.SyncVectorEnv(
        [make_env, make_env], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    # direction one-hot and the image
    assert vector.single_observation_space.shape == (4 + 7 * 7 * 3,)
    obs, _ = vector.reset(seed=0)
    assert obs.shape == (2, 151)
    for _ in range(3):
        obs, _, _, truncations, infos = vector.step(vector.action_space.sample())
    assert truncations.all() and obs.shape == (2, 151)
    assert np.stack(infos["final_obs"]).shape == (2, 151)
    notices = capsys.readouterr().err.splitlines()
    assert notices == [
        "notice: MiniGrid-MemoryS7-v0: observation part 'mission' (MissionSpace) is left out; the agent sees the rest"
    ]


class FixedEnv(gym.Env):
    """An env that always observes `obs` in `space`."""

    def __init__(self, space: gym.Space, obs: object) -> None:
        self.observation_space, self.action_space, self.obs = space, Discrete(2), obs

    def reset(self, *, seed=None, options=None):
        return self.obs, {}

    def step(self, action):
        return self.obs, 0.0, False, False, {}


@pytest.mark.parametrize(
    ("space", "obs", "flat", "dropped"),
    [
        (  # Dict keys are sorted: 'inner' (its count one-hot) comes before 'pos'
            Dict({"pos": Box(0, 1, (2,)), "inner": Dict({"note": Text(5), "count": Discrete(3)})}),
            {"pos": np.array([0.5, 0.25], np.float32), "inner": {"note": "hi", "count": 2}},
            [0, 0, 1, 0.5, 0.25],
            "'inner.note' (Text)",
        ),
        (
            Tuple((Text(5), Box(0, 1, (2,)), Discrete(2))),
            ("hi", np.array([0.5, 0.25], np.float32), 1),
            [0.5, 0.25, 0, 1],
            "'0' (Text)",
        ),
        (
            Tuple(
                (Discrete(2), Tuple((Text(3), Box(0, 1, (1,)))), Dict({"a": Text(2), "b": Text(2)}))
            ),
            (0, ("abc", np.array([0.75], np.float32)), {"a": "x", "b": "y"}),
            [1, 0, 0.75],
            "'1.0' (Text), '2.a' (Text), '2.b' (Text) are left out",
        ),
    ],
)
def test_text_parts_anywhere_are_left_out(space, obs, flat, dropped, monkeypatch, capsys):
    monkeypatch.setattr(cli, "_printed_notices", set())
    env = flat_observations(FixedEnv(space, obs))
    assert env.observation_space.shape == (len(flat),)
    np.testing.assert_allclose(env.reset()[0], flat)
    np.testing.assert_allclose(env.step(0)[0], flat)
    notice = capsys.readouterr().err
    assert notice.startswith("notice: FixedEnv: observation part") and dropped in notice


def test_spaces_without_text_are_flattened_and_a_1d_box_is_kept():
    box = FixedEnv(Box(0, 1, (3,)), np.zeros(3, np.float32))
    assert flat_observations(box) is box
    image = flat_observations(FixedEnv(Box(0, 1, (2, 3)), np.ones((2, 3), np.float32)))
    assert image.observation_space.shape == (6,) and image.reset()[0].shape == (6,)
    np.testing.assert_array_equal(flat_observations(FixedEnv(Discrete(3), 1)).reset()[0], [0, 1, 0])


@pytest.mark.parametrize(
    ("shape", "layout"),
    [
        ((84, 84), "hw"),
        ((4, 84, 84), "chw"),  # an Atari frame stack
        ((96, 96, 3), "hwc"),  # CarRacing
        ((3, 36, 36), "chw"),  # the smallest the Nature CNN takes
        ((36, 35, 3), None),
        ((7, 7, 3), None),  # MiniGrid's symbolic view stays a vector
        ((40, 40, 40), None),  # no end axis to take as channels
        ((3, 84, 4), None),
        ((84,), None),
    ],
)
def test_the_image_rule_takes_uint8_boxes_of_rank_2_or_3_large_enough_for_the_cnn(shape, layout):
    assert envs.image_layout(Box(0, 255, shape, np.uint8)) == layout
    # not uint8: features, not pixels
    assert envs.image_layout(Box(0, 1, shape, np.float32)) is None


def test_an_image_part_is_refused_by_name_where_a_script_takes_vectors_only():
    vector = FixedEnv(Box(0, 1, (3,)), np.zeros(3, np.float32))
    assert envs.vector_observations_only(vector, "ddpg.py") is vector
    mixed = Dict({"pixels": Box(0, 255, (36, 36, 3), np.uint8), "speed": Box(0, 1, (1,))})
    with pytest.raises(
        UsageError, match=r"observation part 'pixels' is an image \(uint8 \(36, 36, 3\)\); ddpg.py"
    ):
        envs.vector_observations_only(FixedEnv(mixed, None), "ddpg.py")
    small = FixedEnv(Box(0, 255, (7, 7, 3), np.uint8), None)
    assert envs.vector_observations_only(small, "ddpg.py") is small


def test_spaces_that_cannot_be_flattened_are_named():
    items = Dict({"pos": Box(0, 1, (2,)), "items": Sequence(Box(0, 1, (2,)))})
    with pytest.raises(
        UsageError, match=r"^observation part 'items' \(Sequence\(Box.*cannot be flattened"
    ):
        flat_observations(FixedEnv(items, None))
    with pytest.raises(
        UsageError, match=r"^observation space Sequence\(Discrete\(2\).*cannot be flattened"
    ):
        flat_observations(FixedEnv(Sequence(Discrete(2)), None))
    with pytest.raises(UsageError, match="only text parts"):
        flat_observations(FixedEnv(Dict({"mission": Text(5)}), None))


def test_images_are_kept_for_the_cnn_and_every_other_box_is_flattened_as_before():
    class Boxed(gym.Env):
        action_space = Discrete(2)

        def __init__(self, space):
            self.observation_space = space

    image, features = Box(0, 255, (3, 40, 40), np.uint8), Box(0.0, 1.0, (40, 40), np.float32)
    assert flat_observations(Boxed(image), keep_images=True).observation_space == image
    # the scripts without a CNN
    assert flat_observations(Boxed(image)).observation_space.shape == (4800,)
    # not pixels
    assert flat_observations(Boxed(features), keep_images=True).observation_space.shape == (1600,)


def test_a_dict_with_one_image_part_becomes_an_image_and_a_vector_or_the_image_alone():
    from common.envs import IMAGE, VECTOR, flat_observations

    class Parts(gym.Env):
        action_space = gym.spaces.Discrete(2)

        def __init__(self, space):
            self.observation_space = space

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.observation_space.seed(seed)
            return self.observation_space.sample(), {}

    image = gym.spaces.Box(0, 255, (40, 40, 3), np.uint8)
    both = gym.spaces.Dict(
        {"pixels": image, "direction": gym.spaces.Discrete(4), "mission": gym.spaces.Text(8)}
    )
    env = flat_observations(Parts(both), keep_images=True, image_parts=True)
    assert env.observation_space == gym.spaces.Dict(
        {IMAGE: image, VECTOR: gym.spaces.Box(0.0, 1.0, (4,), np.float32)}
    )  # the Text part left out, the Discrete one-hot
    observation, _ = env.reset(seed=0)
    assert observation[IMAGE].dtype == np.uint8 and observation[VECTOR].sum() == 1.0
    alone = flat_observations(
        Parts(gym.spaces.Dict({"pixels": image, "mission": gym.spaces.Text(8)})), True, True
    )
    assert alone.observation_space == image and alone.reset(seed=0)[0].shape == (40, 40, 3)
    # without image_parts: flattened whole, as before
    flattened = flat_observations(Parts(both), keep_images=True)
    assert flattened.observation_space.shape == (40 * 40 * 3 + 4,)


class FourSteps(gym.Env):
    """Episodes of four steps, each with reward 1."""

    observation_space = Box(-1, 1, (1,), np.float32)
    action_space = Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.steps += 1
        return np.zeros(1, np.float32), 1.0, self.steps == 4, False, {}


def test_gymnasium_s_vector_wrappers_count_every_step_under_same_step_autoreset():
    # The scripts' vector envs reset in the step that ends an episode (common.envs.vector_env). Gymnasium 1.1 to 1.3
    # reported every episode after an env's first one step short, and 1.3.0's NormalizeReward skipped the step after an
    # episode's end (Gymnasium #1624, #1668): pyproject.toml asks for 1.4.
    def four_step_envs():
        return gym.vector.SyncVectorEnv(
            [FourSteps] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )

    statistics = gym.wrappers.vector.RecordEpisodeStatistics(four_step_envs())
    statistics.reset(seed=0)
    normalized = gym.wrappers.vector.NormalizeReward(four_step_envs(), gamma=0.5)
    normalized.reset(seed=0)
    returns, accumulated = [], []
    for _ in range(12):
        *_, infos = statistics.step(np.zeros(2, dtype=np.int64))
        returns += list(infos["episode"]["r"][infos["_episode"]]) if "episode" in infos else []
        normalized.step(np.zeros(2, dtype=np.int64))
        accumulated.append(float(normalized.accumulated_reward[0]))
    assert returns == [4.0] * 6
    assert int(normalized.return_rms.count) == 24  # every step of both envs
    # the discounted return so far, started again after each episode's last step
    assert accumulated[4:7] == [1.0, 1.5, 1.75]
