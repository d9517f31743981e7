"""dm_control's tasks by the ids Shimmy registers (`dm_control/cheetah-run-v0`), with the [dmc] extra: training in
ppo_fc.py and ddpg.py, headless rendering, and the errors for a misspelled id and for a missing extra."""

import ctypes.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common import envs
from common.envs import resolve_env_id
from common.errors import UsageError
from tests.helpers import REPO, read_scalars, run_script

# cheetah's model sets `settotalmass`, which MuJoCo warns is deprecated (through dm_control's absl logger) each time
# it is compiled; its 1000-step episodes are as fast to step as cartpole's
TASK = "dm_control/cheetah-run-v0"

# The environment of a machine without a display, where the user chose no rendering backend.
HEADLESS = {
    name: value
    for name, value in os.environ.items()
    if name not in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL", "PYOPENGL_PLATFORM")
}
CAN_RENDER_HEADLESS = any(ctypes.util.find_library(library) for library in ("EGL", "OSMesa"))

# What dm_control, absl, GLFW or MuJoCo printed in runs before they were quieted (`common.envs`).
NOISE = ("GLFWError", "DISPLAY environment variable", "absl", "WARNING", "deprecated", "Traceback")


# A script run with its env workers started by spawn (the default on macOS, and forkserver's fresh processes from
# Python 3.14 on Linux): each imports what registers the id, and sets up MuJoCo itself; a forked one inherits both.
SPAWNED_WORKERS = """
import multiprocessing, runpy, sys
multiprocessing.set_start_method("spawn")
sys.argv[0] = sys.argv[1]
del sys.argv[1]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_headless(
    script: str, *flags: str, spawn: bool = False, cwd: Path = REPO
) -> subprocess.CompletedProcess:
    command = ["-c", SPAWNED_WORKERS, script] if spawn else [script]
    return subprocess.run(
        [sys.executable, *command, *flags],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**HEADLESS, "PYTHONPATH": str(REPO)},
    )


def assert_quiet(stderr: str) -> None:
    noise = [line for line in stderr.splitlines() if any(word in line for word in NOISE)]
    if CAN_RENDER_HEADLESS:  # where nothing can render, GLFW still says why
        assert not noise, stderr[-3000:]


@pytest.mark.parametrize(
    "script, flags",
    [
        # two envs in spawned worker processes (SPAWNED_WORKERS)
        ("ppo_fc.py", ["--num-envs", "2", "--async-envs", "--num-steps", "256"]),
        ("ddpg.py", ["--num-envs", "1", "--learning-starts", "1000", "--batch-size", "64"]),
    ],
)
def test_a_dm_control_task_trains_quietly_by_its_shimmy_id(script, flags, tmp_path):
    runs = tmp_path / "runs"
    completed = run_headless(
        script,
        "--env-id",
        TASK,
        "--total-timesteps",
        "2048",
        "--eval-episodes",
        "1",
        "--save-model",
        "--no-progress",
        "--run-dir",
        str(runs),
        *flags,
        spawn="--async-envs" in flags,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    (run,) = runs.iterdir()
    assert run.name.startswith("dm_control-cheetah-run-v0__")
    returns = read_scalars(run)["charts/episodic_return"]
    assert len(returns) == 2  # each episode is 1000 steps
    assert (run / "checkpoints" / "latest.pt").is_file()
    assert_quiet(completed.stderr)


@pytest.mark.skipif(not CAN_RENDER_HEADLESS, reason="no EGL or OSMesa library to render with")
def test_mujoco_tasks_of_gymnasium_and_dm_control_render_without_a_display_and_print_nothing(
    tmp_path,
):
    # While MUJOCO_GL was unset, gymnasium's MuJoCo renderer failed headless (mujoco.FatalError) and dm_control
    # printed GLFW's warning; each compile of either cheetah warned that `settotalmass` is deprecated, on stderr and
    # into MUJOCO_LOG.TXT in the working folder (MuJoCo's own handler), or through absl's logger once dm_control is
    # imported (its handler): HalfCheetah-v5 is made before dm_control is imported, cheetah-run after.
    render = """
import gymnasium as gym
from common.envs import resolve_env_id
for env_id in ("HalfCheetah-v5", "dm_control/cheetah-run-v0"):
    env = gym.make(resolve_env_id(env_id), render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    env.close()
    assert frame.ndim == 3 and frame.std() > 0, (env_id, frame.shape)
print("rendered")
"""
    completed = run_headless("-c", render, cwd=tmp_path)
    assert completed.returncode == 0 and completed.stdout.strip() == "rendered", completed.stderr
    assert_quiet(completed.stderr)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "environ, libraries, chosen",
    [
        ({}, ("EGL", "OSMesa"), "egl"),
        ({}, ("OSMesa",), "osmesa"),
        ({}, (), None),  # nothing can render: dm_control's own choice
        ({"MUJOCO_GL": "glfw"}, ("EGL",), "glfw"),
        ({"DISPLAY": ":0"}, ("EGL",), None),
        ({"WAYLAND_DISPLAY": "wayland-0"}, ("EGL",), None),
        ({"PYOPENGL_PLATFORM": "osmesa"}, ("EGL",), None),  # MuJoCo's EGL refuses another platform
    ],
)
def test_the_rendering_backend_is_chosen_only_without_a_display_or_a_choice(
    environ, libraries, chosen, monkeypatch
):
    monkeypatch.setattr(
        ctypes.util, "find_library", lambda name: f"lib{name}.so" if name in libraries else None
    )
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL", "PYOPENGL_PLATFORM"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    envs._headless_rendering_backend()
    assert os.environ.get("MUJOCO_GL") == chosen


def test_a_misspelled_dm_control_id_is_one_error_line_with_gymnasiums_suggestion(tmp_path):
    runs = tmp_path / "runs"
    completed = run_script(
        "ppo_fc.py", "--env-id", "dm_control/cheetah-rum-v0", "--run-dir", str(runs)
    )
    assert completed.returncode == 2, completed.stderr[-3000:]
    assert completed.stderr.strip().splitlines() == [
        "error: unknown env id 'dm_control/cheetah-rum-v0' (Environment `cheetah-rum` doesn't exist in namespace "
        "dm_control. Did you mean: `cheetah-run`?)"
    ]
    assert not runs.exists()


def test_shimmy_is_the_module_of_dm_control_ids_and_nothing_else_is_scanned(monkeypatch):
    tried = []
    imports = envs._imports
    monkeypatch.setattr(envs, "_imports", lambda module: tried.append(module) or imports(module))
    monkeypatch.setattr(envs, "_registered_by", {})
    with pytest.raises(UsageError, match="Did you mean: `cheetah-run`"):
        resolve_env_id("dm_control/cheetah-rum-v0")
    assert tried == ["shimmy"]  # not every installed package, which took seconds
    for malformed in ("dm_control/cheetah/run-v0", "cheetah run"):
        with pytest.raises(UsageError, match="Malformed environment ID"):
            resolve_env_id(malformed)
    # registered already, by Shimmy imported elsewhere: a spawned worker still needs the module form
    monkeypatch.setattr(envs, "_registered_by", {})
    assert resolve_env_id(TASK) == f"shimmy:{TASK}"


@pytest.mark.parametrize("script, hidden", [("ppo_fc.py", "shimmy"), ("ddpg.py", "dm_control")])
def test_without_the_extra_a_dm_control_id_says_how_to_install_it(script, hidden, tmp_path):
    # None in sys.modules: the import fails as for a package that is not installed
    hide = f"import sys, runpy; sys.modules[{hidden!r}] = None; sys.argv[0] = {script!r}; "
    hide += f"runpy.run_path({script!r}, run_name='__main__')"
    runs = tmp_path / "runs"
    completed = run_script("-c", hide, "--env-id", TASK, "--run-dir", str(runs))
    assert completed.returncode == 2, completed.stderr[-3000:]
    (line,) = completed.stderr.strip().splitlines()
    assert line.startswith(f"error: env id '{TASK}' needs Shimmy and dm_control ("), line
    assert hidden in line and line.endswith('install them with pip install -e ".[dmc]"'), line
    assert not runs.exists()
