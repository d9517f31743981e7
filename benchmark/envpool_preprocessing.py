"""How `--env-backend envpool` preprocesses Atari games beside the gymnasium path (docs/ppo_fc.md,
"EnvPool"): random actions in both, the same seeds, whole games.

Run: ``python -m benchmark.envpool_preprocessing [--games N] [--ids ID ...] [--out FILE]``.

For each id and backend it plays N games of uniformly random actions in 8 envs (SAME_STEP, as the
scripts step them) and reports each game's score (raw points), length (agent steps), and episodes
(lost lives + 1), and the frames' mean grey level. Then the frames themselves: both backends with
no no-op starts and no sticky actions, one fixed action sequence, the mean and largest absolute
difference between the two backends' frames at each of the first steps."""

from __future__ import annotations

import argparse
import json
import statistics

import gymnasium as gym
import numpy as np

from common import atari, envs
from common.envpool_atari import task_id

IDS = ("BreakoutNoFrameskip-v4", "PongNoFrameskip-v4", "SpaceInvadersNoFrameskip-v4")


def play_games(env_id: str, backend: str, games: int, seed: int = 1) -> dict[str, list[float]]:
    """`games` whole games of random actions in 8 envs of `backend`: each game's score, length and
    episodes, and the mean grey level of every 50th observation."""
    env_fns = [lambda: envs.make(env_id, frame_stack=4)] * 8
    vector = (
        envs.envpool_envs(env_fns, env_id)
        if backend == "envpool"
        else envs.episode_statistics(envs.vector_env(env_fns, async_envs=False))
    )
    vector.reset(seed=seed)
    rng = np.random.default_rng(seed)
    episodes = np.ones(8, dtype=int)
    result: dict[str, list[float]] = {"score": [], "length": [], "episodes": [], "grey": []}
    step = 0
    while len(result["score"]) < games:
        observations, _, terminations, truncations, infos = vector.step(
            rng.integers(vector.single_action_space.n, size=8)
        )
        if step % 50 == 0:
            result["grey"].append(float(observations[:, -1].mean()))
        step += 1
        game_over = infos.get("_episode", np.zeros(8, dtype=bool))
        episodes += (terminations | truncations) & ~game_over
        for i in np.flatnonzero(game_over):
            result["score"].append(float(infos["episode"]["r"][i]))
            result["length"].append(float(infos["episode"]["l"][i]))
            result["episodes"].append(float(episodes[i]))
            episodes[i] = 1
    vector.close()
    return result


def frame_differences(env_id: str, steps: int = 200, seed: int = 3) -> list[tuple[float, int]]:
    """The mean and largest absolute difference of the newest frame of the two backends at each of
    the first `steps` steps of one fixed action sequence, with no no-op starts, no sticky actions,
    and no lives (episodic life off), from the game's start."""
    import envpool

    gym_env = gym.make(env_id, **atari.make_kwargs(env_id))
    gym_env = gym.wrappers.AtariPreprocessing(gym_env, noop_max=0, frame_skip=atari.FRAME_SKIP)
    pool = envpool.make(
        task_id(env_id), env_type="gymnasium", num_envs=1, seed=seed,
        noop_max=1, stack_num=1, episodic_life=False, use_fire_reset=False, reward_clip=False,
        repeat_action_probability=0.0,
    )  # fmt: skip
    ours, _ = gym_env.reset(seed=seed)
    theirs, _ = pool.reset()
    actions = np.random.default_rng(seed).integers(gym_env.action_space.n, size=steps)
    differences = []
    for action in actions:
        difference = np.abs(ours.astype(int) - theirs[0, -1].astype(int))
        differences.append((float(difference.mean()), int(difference.max())))
        ours, *_ = gym_env.step(int(action))
        theirs, *_ = pool.step(np.array([action]))
    return differences


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", type=int, default=24)
    parser.add_argument("--ids", nargs="+", default=IDS)
    parser.add_argument("--out", default=None, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    results = {}
    for env_id in args.ids:
        env_id = envs.resolve_env_id(env_id)
        row = {b: play_games(env_id, b, args.games) for b in ("gymnasium", "envpool")}
        row["frames"] = frame_differences(env_id)
        results[env_id] = row
        for backend in ("gymnasium", "envpool"):
            summary = ", ".join(
                f"{key} {statistics.mean(values):.1f} +- {statistics.stdev(values):.1f}"
                for key, values in row[backend].items()
            )
            print(f"{env_id} {backend:9} ({args.games} games): {summary}", flush=True)
        first_different = next((t for t, (_, most) in enumerate(row["frames"]) if most > 0), None)
        means = [mean for mean, _ in row["frames"]]
        print(
            f"{env_id} frames, same actions, no no-ops: first step that differs {first_different}, "
            f"mean |difference| {statistics.mean(means):.2f} grey levels, largest "
            f"{max(most for _, most in row['frames'])}",
            flush=True,
        )
    if args.out:
        with open(args.out, "w") as file:
            json.dump(results, file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
