"""ddpg.py's speed against its floor, measured in one run: ``python -m benchmark.ddpg_speed [FLAGS
OF ddpg.py]``.

It times the floor (`benchmark.ddpg_floor`), trains ddpg.py with the flags (20k steps unless
--total-timesteps is given; no evaluation, no checkpoint), times the floor again, and reads the
run's SPS back from its events: over the whole run, and after --learning-starts, where each
transition brings its updates. The time per transition after it, less the floor, is then split into
what the run does besides the updates, each timed alone on the script's own objects: the env step,
the actor's action with its noise, adding to the replay buffer and sampling from it; what is left
over is logging and the rest of the loop. Run it on an otherwise idle machine."""

from __future__ import annotations

import subprocess
import sys
import tempfile

import numpy as np
import torch

from benchmark.ddpg_floor import update_floor_seconds
from benchmark.events import SPS_TAG, find_run_dirs, load_sessions, steps_per_second
from benchmark.recurrent_floor import floor_agent, median_seconds
from benchmark.registry import REPO, resolve_args
from common.cli import exit_status
from common.envs import training_envs

DEFAULT_STEPS = ("--total-timesteps", "20000")
SETTLE_STEPS = 1_000
"""steps after --learning-starts left out of its SPS (the first updates set up oneDNN's kernels)"""
REPEATS = 500


def sps_after(sessions: list, step: int) -> float:
    """SPS between the first charts/SPS record at or past `step` and the last record."""
    records = [
        record
        for session in sessions
        for record in session.scalars.get(SPS_TAG, [])
        if record.step >= step
    ]
    if len(records) < 2:
        raise ValueError(
            f"the run logged fewer than two SPS records after step {step}: give it more steps"
        )
    return (records[-1].step - records[0].step) / (records[-1].wall_time - records[0].wall_time)


def loop_seconds(flags: list[str]) -> dict[str, float]:
    """Seconds per transition of each part of the loop besides the updates, each the median of
    REPEATS calls with the script's own objects: its envs, actor, noise and replay buffer (filled
    with random transitions)."""
    script, args, agent = floor_agent("ddpg", flags)
    envs, _ = training_envs(script.make_env, args, "", None)
    observations, _ = envs.reset(seed=args.seed)
    space = envs.single_action_space
    actions = np.stack([space.sample() for _ in range(args.num_envs)]).astype(np.float32)
    observation_size, action_size = observations.shape[1], actions.shape[1]
    rb = script.ReplayBuffer(
        min(args.buffer_size, args.total_timesteps), observation_size, action_size
    )
    while not rb.full:
        rows = np.random.randn(1024, observation_size).astype(np.float32)
        rb.add(
            rows, rows, np.zeros((1024, action_size), np.float32), np.zeros(1024), np.zeros(1024)
        )
    noise_state = np.zeros_like(actions)
    starts = np.zeros(args.num_envs, dtype=bool)
    half_range = agent.actor.action_scale.numpy()

    def act() -> None:
        noise = script.next_noise(args, noise_state, starts)
        with torch.no_grad():
            chosen = agent.actor(torch.as_tensor(observations.astype(np.float32))).numpy()
        np.clip(chosen + noise * half_range, space.low, space.high)

    rewards = np.zeros(args.num_envs, np.float32)
    per_step = {
        "env step": median_seconds(lambda: envs.step(actions), REPEATS),
        "action and noise": median_seconds(act, REPEATS),
        "buffer add": median_seconds(
            lambda: rb.add(observations, observations, actions, rewards, starts), REPEATS
        ),
    }
    envs.close()
    seconds = {part: value / args.num_envs for part, value in per_step.items()}
    seconds["buffer sampling"] = args.updates_per_step * median_seconds(
        lambda: rb.sample(args.batch_size, torch.device("cpu")), REPEATS
    )
    return seconds


def floor_seconds(flags: list[str]) -> float:
    """The floor's seconds per transition (`benchmark.ddpg_floor`)."""
    args = resolve_args("ddpg", flags)
    critic, actor = update_floor_seconds(flags)
    return args.updates_per_step * (critic + actor / args.policy_frequency)


def train_sessions(flags: list[str]) -> list:
    """The sessions of a ddpg.py run with `flags`, no evaluation and no checkpoint, in a folder
    deleted after."""
    with tempfile.TemporaryDirectory() as run_dir:
        command = [
            sys.executable,
            str(REPO / "ddpg.py"),
            *flags,
            "--no-progress",
            "--eval-episodes",
            "0",
        ]
        subprocess.run(
            [*command, "--no-save-model", "--run-dir", run_dir],
            cwd=REPO,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        return load_sessions(find_run_dirs([run_dir])[0])


def main() -> int:
    def run() -> None:
        flags = sys.argv[1:] if "--total-timesteps" in sys.argv else [*DEFAULT_STEPS, *sys.argv[1:]]
        args = resolve_args("ddpg", flags)
        floors = [floor_seconds(flags)]
        sessions = train_sessions(flags)
        floors.append(floor_seconds(flags))
        floor = float(np.mean(floors))
        after = sps_after(sessions, args.learning_starts + SETTLE_STEPS)
        parts = loop_seconds(flags)
        print(f"ddpg.py {' '.join(flags)}")
        print(
            f"floor: {floors[0] * 1e3:.2f} ms per transition before the run, {floors[1] * 1e3:.2f} after"
        )
        print(f"SPS over the whole run: {steps_per_second(sessions):,.0f}")
        print(
            f"SPS after --learning-starts: {after:,.0f}, {after * floor:.0%} of the floor's {1 / floor:,.0f}"
        )
        print(
            f"per transition after it: {1e3 / after:.2f} ms, of which the floor {floor * 1e3:.2f} ms and"
        )
        for part, seconds in parts.items():
            print(f"  {part}: {seconds * 1e3:.3f} ms")
        rest = 1 / after - floor - sum(parts.values())
        print(f"  logging and the rest of the loop: {rest * 1e3:.3f} ms")

    return exit_status(run)


if __name__ == "__main__":
    sys.exit(main())
