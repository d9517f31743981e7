"""How far gymnasium's AtariPreprocessing frames are from CleanRL's, on the same emulator steps.

gymnasium takes ALE's greyscale of each frame and the max of the last two; CleanRL (MaxAndSkipEnv,
then WarpFrame) takes the max of the last two RGB frames and converts it with OpenCV. Both resize to
84x84 with INTER_AREA. Run: ``python -m benchmark.atari_pixels`` (needs the ``[atari]`` extra)."""

from __future__ import annotations

import argparse

import ale_py
import cv2
import gymnasium as gym
import numpy as np


def differences(game: str, steps: int, seed: int = 1) -> np.ndarray:
    """Absolute differences of the two 84x84 frames at each of `steps` agent steps of random play
    (skip 4)."""
    env = gym.make(game)
    env.reset(seed=seed)
    ale, rng, found = env.unwrapped.ale, np.random.default_rng(seed), []
    for _ in range(steps):
        action, greys, rgbs = int(rng.integers(env.action_space.n)), [], []
        for _ in range(4):
            _, _, terminated, truncated, _ = env.step(action)
            greys.append(ale.getScreenGrayscale())
            rgbs.append(ale.getScreenRGB())
        if terminated or truncated:
            env.reset()
            continue
        ours = cv2.resize(np.maximum(greys[-2], greys[-1]), (84, 84), interpolation=cv2.INTER_AREA)
        grey = cv2.cvtColor(np.maximum(rgbs[-2], rgbs[-1]), cv2.COLOR_RGB2GRAY)
        cleanrl = cv2.resize(grey, (84, 84), interpolation=cv2.INTER_AREA)
        found.append(np.abs(ours.astype(int) - cleanrl.astype(int)))
    env.close()
    return np.stack(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--games", nargs="+", default=["BreakoutNoFrameskip-v4", "PongNoFrameskip-v4"]
    )
    parser.add_argument("--steps", type=int, default=300)
    options = parser.parse_args()
    gym.register_envs(ale_py)
    for game in options.games:
        diff = differences(game, options.steps)
        print(
            f"{game}: mean |diff| {diff.mean():.3f}, max {diff.max()}, pixels differing {(diff > 0).mean():.2%}"
        )


if __name__ == "__main__":
    main()
