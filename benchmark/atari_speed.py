"""SPS on an Atari game: ppo_fc.py and ppo_lstm.py beside Stable-Baselines3's PPO (CnnPolicy) and
sb3-contrib's RecurrentPPO (CnnLstmPolicy) on SB3's AtariWrapper, with CleanRL's Atari settings, and
beside CleanRL's own ppo_atari.py and ppo_atari_lstm.py where a folder with them is given
(``--cleanrl DIR``: DIR/run.py SCRIPT FLAGS in DIR/.venv, gymnasium 0.29 as CleanRL pins it; see the
docs page).

``--envpool``: our scripts with ``--env-backend envpool``, beside CleanRL's ppo_atari_envpool.py and,
for ppo_lstm, DIR/ppo_atari_lstm_envpool.py (CleanRL's ppo_atari_lstm.py with EnvPool's envs in place
of its gymnasium ones: CleanRL has no EnvPool LSTM script), both in DIR/.venv-envpool (envpool 0.8.4
and gym 0.23.1, whose old step API the scripts use) on EnvPool's Breakout-v5. SB3 stays on its
AtariWrapper.

Run: ``python -m benchmark.atari_speed [--steps N] [--repeats R]``, alone on the machine. Each run
is a process of its own, the runs alternate (ABC ABC ...), and the SPS leaves out each run's first
iteration (start-up)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmark.events import Session, find_run_dirs, load_sessions, merged_scalars, steps_per_second
from benchmark.registry import REPO

ENV_ID = "BreakoutNoFrameskip-v4"
CLEANRL_ATARI = (
    "--num-envs",
    "8",
    "--num-steps",
    "128",
    "--learning-rate",
    "2.5e-4",
    "--clip-coef",
    "0.1",
)
OURS = {
    "ppo_fc": ("ppo_fc.py", *CLEANRL_ATARI),
    "ppo_lstm": (
        "ppo_lstm.py", *CLEANRL_ATARI, "--num-minibatches", "4", "--update-epochs", "4", "--ent-coef", "0.01",
        "--clip-vloss", "--no-norm-reward",
    ),
}  # fmt: skip
SB3_OF = {"ppo_fc": "ppo", "ppo_lstm": "recurrent_ppo"}
CLEANRL_OF = {"ppo_fc": "ppo_atari.py", "ppo_lstm": "ppo_atari_lstm.py"}
CLEANRL_ENVPOOL_OF = {"ppo_fc": "ppo_atari_envpool.py", "ppo_lstm": "ppo_atari_lstm_envpool.py"}
ENVPOOL_ID = "Breakout-v5"  # EnvPool's id of ENV_ID: no sticky actions, 27,000 steps a game

SB3_RUN = """
import json, sys, time
import ale_py, gymnasium as gym
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.vec_env import VecFrameStack
from sb3_contrib import RecurrentPPO
gym.register_envs(ale_py)
algo, env_id, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
env = make_atari_env(env_id, n_envs=8, seed=1)
settings = dict(n_steps=128, n_epochs=4, batch_size=256, learning_rate=2.5e-4, clip_range=0.1, ent_coef=0.01,
                vf_coef=0.5, gae_lambda=0.95, gamma=0.99, max_grad_norm=0.5, seed=1, device="cpu")
if algo == "ppo":
    model = PPO("CnnPolicy", VecFrameStack(env, n_stack=4), **settings)
else:  # one frame, one LSTM shared by actor and critic, as ppo_atari_lstm.py has it
    kwargs = dict(lstm_hidden_size=128, shared_lstm=True, enable_critic_lstm=False)
    model = RecurrentPPO("CnnLstmPolicy", env, policy_kwargs=kwargs, **settings)
class Clock(BaseCallback):
    def __init__(self):
        super().__init__()
        self.marks = []
    def _on_rollout_start(self):
        self.marks.append((self.num_timesteps, time.perf_counter()))
    def _on_step(self):
        return True
clock = Clock()
model.learn(steps, callback=clock)
(first_steps, first_time), end = clock.marks[1], (model.num_timesteps, time.perf_counter())
print(json.dumps({"sps": (end[0] - first_steps) / (end[1] - first_time)}))
"""


def script_sessions(command: str, flags: list[str] | tuple[str, ...]) -> list[Session]:
    """The TensorBoard sessions of one quiet run of our script file `command` with `flags`, in a folder of its own."""
    with tempfile.TemporaryDirectory() as run_dir:
        quiet = ("--no-progress", "--eval-episodes", "0", "--no-save-model", "--run-dir", run_dir)
        subprocess.run(
            [sys.executable, command, *flags, *quiet], cwd=REPO, check=True, capture_output=True
        )
        (run,) = find_run_dirs([run_dir])
        return load_sessions(run)


def median_after_first(sessions: list[Session], tag: str) -> float:
    """The median of a per-iteration record (`perf/update_seconds`, say), its first iteration
    (start-up) left out."""
    return statistics.median(event.value for event in merged_scalars(sessions)[tag][1:])


def our_sps(script: str, steps: int, *flags: str) -> float:
    """SPS of one run of our `script` with CleanRL's Atari settings and `flags`."""
    command, *settings = OURS[script]
    return steps_per_second(
        script_sessions(
            command, ["--env-id", ENV_ID, "--total-timesteps", str(steps), *settings, *flags]
        )
    )


def sb3_sps(script: str, steps: int) -> float:
    done = subprocess.run(
        [sys.executable, "-c", SB3_RUN, SB3_OF[script], ENV_ID, str(steps)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])["sps"]


def cleanrl_sps(
    folder: Path,
    script: str,
    steps: int,
    python: str | None = None,
    pythonpath: str = "",
    cuda: bool = False,
    envpool: bool = False,
) -> float:
    """SPS of CleanRL's `script` in `folder` (its run.py launcher), under `python` (default: the
    folder's .venv, or .venv-envpool with `envpool`) with `pythonpath` first on its path."""
    with tempfile.TemporaryDirectory() as run_dir:
        venv = ".venv-envpool" if envpool else ".venv"
        launcher = [
            python or str(folder / venv / "bin/python"),
            str(folder / "run.py"),
            str(folder / (CLEANRL_ENVPOOL_OF if envpool else CLEANRL_OF)[script]),
        ]
        cuda_flag = "--cuda" if cuda else "--no-cuda"
        env_id = ENVPOOL_ID if envpool else ENV_ID
        flags = ["--env-id", env_id, "--total-timesteps", str(steps), "--num-envs", "8", cuda_flag]
        environment = {**os.environ, "PYTHONPATH": pythonpath}
        subprocess.run(
            [*launcher, *flags], cwd=run_dir, check=True, capture_output=True, env=environment
        )
        (run,) = find_run_dirs([run_dir])
        return steps_per_second(load_sessions(run))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--scripts", nargs="+", default=list(OURS), choices=list(OURS))
    parser.add_argument("--cleanrl", type=Path, default=None)
    parser.add_argument("--envpool", action="store_true")
    options = parser.parse_args()
    backend = ("--env-backend", "envpool") if options.envpool else ()
    print(
        f"| script | SPS | SB3 SPS | ratio |{' CleanRL SPS | ratio |' if options.cleanrl else ''}"
    )
    print(f"|---|---|---|---|{'---|---|' if options.cleanrl else ''}")
    for script in options.scripts:
        ours, sb3, cleanrl = [], [], []
        for _ in range(options.repeats):
            ours.append(our_sps(script, options.steps, *backend))
            sb3.append(sb3_sps(script, options.steps))
            if options.cleanrl:
                cleanrl.append(
                    cleanrl_sps(options.cleanrl, script, options.steps, envpool=options.envpool)
                )
        shown = lambda values: " ".join(f"{value:,.0f}" for value in values)  # noqa: E731
        row = f"| {script} | {shown(ours)} | {shown(sb3)} | {statistics.median(ours) / statistics.median(sb3):.2f}x |"
        if options.cleanrl:
            row += (
                f" {shown(cleanrl)} | {statistics.median(ours) / statistics.median(cleanrl):.2f}x |"
            )
        print(row, flush=True)


if __name__ == "__main__":
    main()
