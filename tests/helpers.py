"""What the scripts' tests share: reading a run's scalars or wandb files, running a script, reference computations,
probe walks."""

import json
import os
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from common.wandb_file import history_row, item_key, records

REPO = Path(__file__).resolve().parents[1]
CONTINUOUS = dict(
    num_envs=1,
    num_steps=2048,
    num_minibatches=32,
    update_epochs=10,
    learning_rate=3e-4,
    ent_coef=0.0,
    anneal_lr=False,
)
"""CleanRL's continuous-control settings."""


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of a run folder, read with tensorboard's own reader (no sampling: size 0 keeps all)."""
    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return {
        tag: [(e.step, e.value) for e in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


MEASURED = {"sps_mean", "sps_std", "peak_rss_mb", "wall_minutes_mean", "seconds_to_threshold"}
"""a benchmark row's numbers that are measured, not learnt: they differ between two runs of the same settings"""


def learnt(out: Path) -> tuple[list[dict], dict[str, list]]:
    """A benchmark's rows less what is measured, and every episode return of each of its runs."""
    record = json.loads((out / "results.json").read_text())
    rows = [{k: v for k, v in row.items() if k not in MEASURED} for row in record["rows"]]
    runs = {
        job["id"]: read_scalars(Path(job["run_dir"]))["charts/episodic_return"]
        for job in record["jobs"]
    }
    return rows, runs


@dataclass
class WandbRun:
    """One offline wandb run as its `run-<id>.wandb` file recorded it (config and summary include wandb's `_wandb`)."""

    id: str
    name: str
    project: str
    path: Path
    resumed: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)


def read_wandb_runs(folder: Path) -> list[WandbRun]:
    """Every offline run under `folder` (its `offline-run-*/run-*.wandb` files, oldest first), decoded with wandb's own
    protobuf classes: one history dict per `wandb.log` row (wandb adds `_step`, `_runtime`, `_timestamp`), config and
    summary updates merged in order, nested keys joined by '/'."""
    from wandb.proto.wandb_internal_pb2 import Record

    key = item_key

    def update(values: dict[str, Any], record: Any) -> None:
        values.update({key(item): json.loads(item.value_json) for item in record.update})
        for item in record.remove:
            values.pop(key(item), None)

    runs = []
    for path in sorted(
        Path(folder).rglob("offline-run-*/run-*.wandb"), key=lambda path: path.parent.name
    ):
        run = WandbRun(id="", name="", project="", path=path)
        for data, _ in records(path.read_bytes()):
            record = Record.FromString(data)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run.id, run.name, run.project = (
                    record.run.run_id,
                    record.run.display_name,
                    record.run.project,
                )
                run.resumed = record.run.resumed
                update(run.config, record.run.config)
            elif kind == "config":
                update(run.config, record.config)
            elif kind == "history":
                run.history.append(history_row(record))
            elif kind == "summary":
                update(run.summary, record.summary)
            elif kind == "files":
                run.files.extend(item.path for item in record.files.files)
        runs.append(run)
    return runs


def run_script(
    script: str, *flags: str, env: dict | None = None, timeout: int = 300
) -> subprocess.CompletedProcess:
    """Run `python SCRIPT FLAGS` from the repository's root and capture its output."""
    return subprocess.run(
        [sys.executable, script, *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def run_in_one_process(
    calls: list[list[str]], env: dict | None = None, timeout: int = 600
) -> list[subprocess.CompletedProcess]:
    """Each of `calls` (`[SCRIPT, FLAGS...]` or `["-m", MODULE, FLAGS...]`, as `python` takes them) run from the
    repository's root in turn in one fresh Python process (tests/one_process.py), each with its own exit status,
    stdout and stderr: one start of the interpreter, torch and gymnasium for all, where `run_script` pays one a call
    (about 3 seconds). For calls that end before a run starts: bad input, --help."""
    with tempfile.TemporaryDirectory() as folder:
        listed, results = Path(folder) / "calls.json", Path(folder) / "results.json"
        listed.write_text(json.dumps(calls))
        runner = [sys.executable, str(REPO / "tests" / "one_process.py"), str(listed), str(results)]
        done = subprocess.run(
            runner,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )
        assert done.returncode == 0 and results.exists(), done.stderr[-3000:]
        return [
            subprocess.CompletedProcess([sys.executable, *call], status, out, err)
            for call, (status, out, err) in zip(calls, json.loads(results.read_text()), strict=True)
        ]


def each_in_one_process(
    command: list[str], flag_lists: list[list[str]], folder: Path, folder_flag: str = "--run-dir"
) -> dict[tuple[str, ...], tuple[subprocess.CompletedProcess, Path]]:
    """`python COMMAND FLAGS FOLDER_FLAG FOLDER/i` for each of `flag_lists` (`run_in_one_process`), by the flags: the
    completed call, and the folder it was given to write in."""
    calls = [
        [*command, *flags, folder_flag, str(folder / str(i))] for i, flags in enumerate(flag_lists)
    ]
    done = run_in_one_process(calls)
    return {
        tuple(flags): (completed, folder / str(i))
        for i, (flags, completed) in enumerate(zip(flag_lists, done, strict=True))
    }


def assert_one_error_line(completed: subprocess.CompletedProcess, message: str) -> None:
    """Bad input's contract: exit status 2 and one line on stderr, `error: ...` holding `message`."""
    lines = completed.stderr.strip().splitlines()
    assert completed.returncode == 2, completed.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (
        completed.stderr
    )


def assert_checkpoints_refused(refused: list[tuple[str, Path, str]], run_dir: Path) -> None:
    """`python SCRIPT --eval-checkpoint PATH` and `--resume PATH` for each (script, path, message) of `refused`, in
    one process: each is one error line holding its message, and nothing is written in `run_dir`."""
    flags = ("--eval-checkpoint", "--resume")
    calls = [
        [script, flag, str(path), "--run-dir", str(run_dir)]
        for script, path, _ in refused
        for flag in flags
    ]
    messages = [message for _, _, message in refused for _ in flags]
    for completed, message in zip(run_in_one_process(calls), messages, strict=True):
        assert_one_error_line(completed, message)
    assert not run_dir.exists()


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


def sharp_agent(agent_class, seed: int = 0):
    """A subclass of `agent_class` whose policy is far from uniform (and whose value is far from zero): at
    initialisation the policy is nearly uniform, which hides most ways of acting with the wrong policy."""

    class SharpAgent(agent_class):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            generator = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for module in self.modules():
                    if isinstance(module, torch.nn.Linear):
                        module.weight.normal_(0, module.in_features**-0.5, generator=generator)
                        module.bias.normal_(0, 0.3, generator=generator)

    return SharpAgent


def visit_states(env_id: str, seeds=range(8)):
    """Yield (env, observation) for every state of episodes played with the optimal policy."""
    env = gym.make(env_id).unwrapped
    for seed in seeds:
        observation, _ = env.reset(seed=seed)
        terminated = False
        while not terminated:
            yield env, observation
            observation, _, terminated, _, _ = env.step(env.optimal_action())


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


class NoiseEnv(gym.Env):
    """uint8 observations of random noise (images, the worst case for a lossy codec, or a grid too small to be an
    image); episodes of 7 steps, 3 actions, each paying its own number."""

    def __init__(self, shape):
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), float(action), self.t == 7, False, {}


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


class GlobalRandomEnv(gym.Env):
    """Observations drawn from Python's global generator, which no seed of the env's reaches (an env that gymnasium's
    seeding does not make reproducible); episodes of 3 steps."""

    observation_space = gym.spaces.Box(0, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([random.random()], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([random.random()], np.float32), 0.0, self.t == 3, False, {}


gym.register("GlobalRandom-v0", entry_point=GlobalRandomEnv)


def play_optimally(agent: torch.nn.Module, env_id: str, seeds=range(8)):
    """A ppo_lstm agent's (env, value, policy) at every state of episodes played with the optimal policy, its state
    carried along each episode from zero."""
    for env, observation in visit_states(env_id, seeds):
        if env.t == 0:
            state, start = agent.initial_state(1), torch.ones(1, 1, dtype=torch.bool)
        with torch.no_grad():
            output = agent(
                torch.as_tensor(observation[None, None], dtype=torch.float32), state, start
            )
        state, start = output.state, torch.zeros(1, 1, dtype=torch.bool)
        yield env, output.value.item(), agent.distribution(output.actor_out[0])
