"""The recipe that checks a replay-buffer edit in a copy of ddpg.py (docs/ddpg.md, "Checking a replay-buffer edit"):
the buffer's rows, rebuilt from a --save-trajectories recording by the rule the copy implements. The unedited
script's buffer is the recording's steps as they are; a copy with 3-step returns passes, and the same copy with an
aliasing bug (each step's rewards kept as a view that the next step overwrites) is caught."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from common.trajectories import load_trajectories, transitions

REPO = Path(__file__).resolve().parents[1]
FIELDS = ("observations", "next_observations", "actions", "rewards", "terminations")

ADD = "            rb.add(obs, real_next_obs, actions, rewards, terminations)\n"
N_STEP_FUNCTION = '''

N_STEP = 3


def add_n_step(rb: ReplayBuffer, recent: list, gamma: float) -> None:
    """The oldest of the `recent` vector steps with its N-step return, the observation N steps on (or where its
    episode ended), and whether it terminated on the way."""
    obs, actions = recent[0][0], recent[0][1]
    returns = np.zeros(len(obs), np.float32)
    next_obs, done, alive = recent[0][3].copy(), np.zeros(len(obs), bool), np.ones(len(obs), bool)
    for k, (_, _, rewards, real_next_obs, terminations, ended) in enumerate(recent):
        returns += alive * np.float32(gamma**k) * rewards
        next_obs[alive] = real_next_obs[alive]
        done |= alive & terminations
        alive &= ~ended
    rb.add(obs, next_obs, actions, returns, done)


def next_noise('''
N_STEP_LOOP = (
    "            recent.append((obs, actions, rewards.astype(np.float32), real_next_obs, terminations,\n"
    "                           episode_starts.copy()))\n"
    "            if len(recent) == N_STEP:\n"
    "                add_n_step(rb, recent, args.gamma)\n"
    "                recent.pop(0)\n"
)
WINDOW = (
    "    updates = np.zeros((), dtype=np.int64)\n",
    "    updates = np.zeros((), dtype=np.int64)\n    recent, step_rewards = [], np.zeros(args.num_envs, np.float32)\n",
)
BOOTSTRAP = (
    "not_done * args.gamma * qf1_next_target",
    "not_done * args.gamma**N_STEP * qf1_next_target",
)
THREE_STEP = ((ADD, N_STEP_LOOP), WINDOW, ("\n\ndef next_noise(", N_STEP_FUNCTION), BOOTSTRAP)
# the bug: the window holds one array, refilled in place, for every step's rewards
ALIASED = (
    (
        ADD,
        "            step_rewards[:] = rewards\n"
        + N_STEP_LOOP.replace("rewards.astype(np.float32)", "step_rewards"),
    ),
    WINDOW,
    ("\n\ndef next_noise(", N_STEP_FUNCTION),
    BOOTSTRAP,
)


def three_step_rows(
    steps: dict[str, np.ndarray], gamma: float, n: int = 3
) -> dict[str, np.ndarray]:
    """The rule the copy implements, written again from the recorded steps: each step's n-step return, the
    observation n steps on or where its episode ended, and whether it terminated on the way."""
    rewards = steps["rewards"].astype(np.float32)
    ended = steps["terminations"] | steps["truncations"]
    starts = len(rewards) - n + 1
    alive = np.ones(rewards[:starts].shape, bool)
    returns, done = (
        np.zeros(rewards[:starts].shape, np.float32),
        np.zeros(rewards[:starts].shape, bool),
    )
    next_obs = steps["next_observations"][:starts].copy()
    for k in range(n):
        returns += alive * np.float32(gamma**k) * rewards[k : k + starts]
        next_obs[alive] = steps["next_observations"][k : k + starts][alive]
        done |= alive & steps["terminations"][k : k + starts]
        alive &= ~ended[k : k + starts]
    rows = dict(observations=steps["observations"][:starts], next_observations=next_obs)
    return rows | dict(actions=steps["actions"][:starts], rewards=returns, terminations=done)


def run_copy(
    tmp_path: Path, name: str, edits
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Train the copy 600 steps in 2 envs of Pendulum-v1 (its episodes truncated at 200), recorded: the recorded
    steps as transitions, and the buffer its last checkpoint keeps."""
    source = (REPO / "ddpg.py").read_text()
    for old, new in edits:
        assert old in source, f"the edit no longer applies to ddpg.py: {old!r}"
        source = source.replace(old, new)
    (tmp_path / name).mkdir()
    path = tmp_path / name / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    copy = importlib.util.module_from_spec(spec)
    sys.modules[name] = copy
    spec.loader.exec_module(copy)
    recording = tmp_path / name / "recording"
    args = copy.Args(
        env_id="Pendulum-v1", total_timesteps=600, num_envs=2, learning_starts=100, batch_size=32, hidden_size=32,
        save_trajectories=str(recording), save_buffer=True, run_dir=str(tmp_path / name / "runs"), progress=False,
        eval_episodes=0,
    )  # fmt: skip
    result = copy.train(args)
    (buffer,) = (result.run_dir / "checkpoints").glob("buffer_step_*.npz")
    with np.load(buffer, allow_pickle=False) as stored:
        return transitions(load_trajectories(recording)), dict(stored)


def check_rows(buffer: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    """The recipe's comparison: the buffer's first rows, as many as the rule gives, equal the rule's."""
    for field in FIELDS:
        rows = expected[field].reshape(-1, *expected[field].shape[2:])
        np.testing.assert_allclose(
            buffer[field][: len(rows)], rows.astype(buffer[field].dtype), rtol=1e-6, err_msg=field
        )


def test_the_recipe_passes_the_script_and_a_three_step_copy_and_catches_the_aliasing_bug(tmp_path):
    steps, buffer = run_copy(tmp_path, "plain", ())
    check_rows(buffer, steps)  # the unedited script: each row one recorded step
    assert (
        len(steps["rewards"]) == 299 and steps["truncations"].any()
    )  # the episodes' ends are in it

    steps, buffer = run_copy(tmp_path, "three_step", THREE_STEP)
    check_rows(buffer, three_step_rows(steps, gamma=0.99))

    steps, buffer = run_copy(tmp_path, "aliased", ALIASED)
    with pytest.raises(AssertionError, match=r"rewards\nMismatched elements: 594 / 594"):
        check_rows(buffer, three_step_rows(steps, gamma=0.99))
